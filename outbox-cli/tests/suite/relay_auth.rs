//! `outbox relay nats` against nats-servers that require credentials or TLS, with the server
//! configurations written here and the keys and certificates made for the run: user and
//! password, token, NKey user, TLS with a private CA, mutual TLS, and a user who may not
//! publish to the relay's subject. The right credentials relay an event; each wrong one
//! exits 1 with a message naming the cause, and no secret is ever printed.

use std::time::Duration;

use outbox_tests::consumer_kit::{cursor, eventually, write_event};
use outbox_tests::nats_kit::NatsServer;
use outbox_tests::nats_secure_kit::{Pki, nkey_user};
use outbox_tests::process_kit::OutboxProcess;
use outbox_tests::{TestDb, fresh_db};

/// Secrets used below; none may appear in anything the relay prints.
const SECRETS: [&str; 4] = ["s3cret-pw", "wr0ng-pw", "t0ken-abc", "t0ken-xyz"];

fn spawn(db: &TestDb, url: &str, extra: &[&str], env: &[(&str, &str)]) -> OutboxProcess {
    let mut args = vec![
        "nats",
        "--project",
        "p1",
        "--consumer-id",
        "relay-p1",
        "--nats-url",
        url,
        "--start-from",
        "earliest",
        "--poll-interval",
        "100ms",
        "--publish-timeout",
        "2s",
        "--nats-connect-timeout",
        "2s",
        "--shutdown-grace",
        "2s",
        "--no-prune",
    ];
    args.extend_from_slice(extra);
    OutboxProcess::spawn_with_env(&db.url, "relay", &args, env)
}

fn assert_no_secret(stderr: &str) {
    for secret in SECRETS {
        assert!(!stderr.contains(secret), "{secret} printed:\n{stderr}");
    }
}

/// The relay connects with these settings and JetStream confirms the project's next event.
async fn relays(db: &TestDb, url: &str, extra: &[&str], env: &[(&str, &str)]) {
    let before = cursor(db, "p1", "relay-p1").await.unwrap_or(0);
    write_event(db, "p1", &format!("T-{}", before + 1)).await;
    let mut relay = spawn(db, url, extra, env);
    eventually(
        Duration::from_secs(20),
        "the event relayed and acknowledged",
        || async { cursor(db, "p1", "relay-p1").await == Some(before + 1) },
    )
    .await;
    relay.signal("TERM");
    assert_eq!(relay.wait().await, 0, "{}", relay.stderr());
    assert_no_secret(&relay.stderr());
}

/// The relay exits 1 at start with a message containing `says`.
async fn refused(db: &TestDb, url: &str, extra: &[&str], env: &[(&str, &str)], says: &str) {
    let mut relay = spawn(db, url, extra, env);
    let code = tokio::time::timeout(Duration::from_secs(30), relay.wait())
        .await
        .unwrap_or_else(|_| panic!("the relay kept running with {extra:?}: {}", relay.stderr()));
    let stderr = relay.stderr();
    assert_eq!(code, 1, "{url} {extra:?}: {stderr}");
    assert!(
        stderr.contains(says),
        "{url} {extra:?}: expected {says:?} in\n{stderr}"
    );
    assert_no_secret(&stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_and_password() {
    let db = fresh_db().await;
    let nats =
        NatsServer::start_with_config("authorization { user: relayer, password: \"s3cret-pw\" }\n")
            .await;
    let port = nats.port;
    relays(
        &db,
        &format!("nats://relayer:s3cret-pw@127.0.0.1:{port}"),
        &[],
        &[],
    )
    .await;
    let url = format!("nats://127.0.0.1:{port}");
    relays(
        &db,
        &url,
        &["--nats-user", "relayer"],
        &[("NATS_PASSWORD", "s3cret-pw")],
    )
    .await;
    refused(
        &db,
        &url,
        &["--nats-user", "relayer", "--nats-password", "wr0ng-pw"],
        &[],
        "authorization violation: the server refused the relay's user and password",
    )
    .await;
    refused(
        &db,
        &url,
        &[],
        &[],
        "authorization violation: the server requires credentials",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token() {
    let db = fresh_db().await;
    let nats = NatsServer::start_with_config("authorization { token: \"t0ken-abc\" }\n").await;
    let url = nats.url();
    relays(&db, &url, &["--nats-token", "t0ken-abc"], &[]).await;
    relays(
        &db,
        &format!("nats://t0ken-abc@127.0.0.1:{}", nats.port),
        &[],
        &[],
    )
    .await;
    refused(
        &db,
        &url,
        &["--nats-token", "t0ken-xyz"],
        &[],
        "authorization violation: the server refused the relay's token",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nkey_user_seed() {
    let db = fresh_db().await;
    let pki = Pki::new();
    let (public, seed) = nkey_user(&pki.dir, "relayer");
    let (_, other_seed) = nkey_user(&pki.dir, "stranger");
    let nats = NatsServer::start_with_config(&format!(
        "authorization {{ users: [ {{ nkey: {public} }} ] }}\n"
    ))
    .await;
    let url = nats.url();
    relays(&db, &url, &["--nats-nkey", seed.to_str().unwrap()], &[]).await;
    refused(
        &db,
        &url,
        &["--nats-nkey", other_seed.to_str().unwrap()],
        &[],
        "authorization violation: the server refused the relay's NKey",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_private_ca() {
    let db = fresh_db().await;
    let pki = Pki::new();
    let nats = NatsServer::start_with_config(&pki.tls_block(&pki.server, false)).await;
    let tls_url = format!("tls://127.0.0.1:{}", nats.port);
    let ca = pki.ca.to_str().unwrap();
    relays(&db, &tls_url, &["--nats-tls-ca", ca], &[]).await;
    refused(
        &db,
        &tls_url,
        &["--nats-tls-ca", pki.other_ca.to_str().unwrap()],
        &[],
        "its certificate is not trusted: it is not signed by a CA in --nats-tls-ca",
    )
    .await;
    refused(
        &db,
        &nats.url(),
        &[],
        &[],
        "the server requires TLS, and its certificate is not trusted",
    )
    .await;

    let misnamed = NatsServer::start_with_config(&pki.tls_block(&pki.wrong_name, false)).await;
    refused(
        &db,
        &format!("tls://127.0.0.1:{}", misnamed.port),
        &["--nats-tls-ca", ca],
        &[],
        "host name mismatch: the server's certificate is not valid for 127.0.0.1",
    )
    .await;

    let plain = NatsServer::start().await;
    refused(
        &db,
        &plain.url(),
        &["--nats-tls-required"],
        &[],
        "is TLS enabled on the server?",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls() {
    let db = fresh_db().await;
    let pki = Pki::new();
    let nats = NatsServer::start_with_config(&pki.tls_block(&pki.server, true)).await;
    let url = format!("tls://127.0.0.1:{}", nats.port);
    let ca = pki.ca.to_str().unwrap();
    relays(
        &db,
        &url,
        &[
            "--nats-tls-ca",
            ca,
            "--nats-tls-cert",
            pki.client.0.to_str().unwrap(),
            "--nats-tls-key",
            pki.client.1.to_str().unwrap(),
        ],
        &[],
    )
    .await;
    refused(
        &db,
        &url,
        &["--nats-tls-ca", ca],
        &[],
        "the server requires a client certificate",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_who_may_not_publish_to_the_subject() {
    let db = fresh_db().await;
    let nats = NatsServer::start_with_config(
        "authorization { users: [ { user: relayer, password: \"s3cret-pw\", \
         permissions: { publish: { deny: [\"lifecycle.>\"] } } } ] }\n",
    )
    .await;
    refused(
        &db,
        &format!("nats://relayer:s3cret-pw@127.0.0.1:{}", nats.port),
        &[],
        &[],
        "authorization violation on publish: the NATS user may not publish to \
         lifecycle.p1.task_deleted",
    )
    .await;
}

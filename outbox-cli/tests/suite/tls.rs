//! TLS against a real TLS-only cluster started by the test kit (`ssl = on`, a CA and server
//! certificate generated for the run, `hostssl`-only `pg_hba.conf`): `require` and
//! `verify-full` work for migrate, consume (its LISTEN connection included) and status; a
//! wrong CA, a wrong host name, a missing root-certificate file and `sslmode=disable` each
//! fail naming the cause; a bad `sslmode` is a usage error.

use std::process::Stdio;
use std::time::Duration;

use chrono::Utc;
use outbox_core::connect::ConnectSettings;
use outbox_core::{Prior, ProjectId, Schema, TaskDeleted, TaskId, Writer, WriterProcessId};
use outbox_tests::TASKS_TABLE;
use outbox_tests::consumer_kit::eventually;
use outbox_tests::process_kit::{ConsumeProcess, outbox_binary, run_outbox};
use outbox_tests::tls_cluster::{CERT_USER, TlsCluster};

const WAIT: Duration = Duration::from_secs(30);

async fn write(settings: &ConnectSettings, project: &str, task: &str) {
    let mut client = settings.connect().await.expect("TLS connection");
    let tx = client.transaction().await.unwrap();
    let event = TaskDeleted::new(
        ProjectId::new(project).unwrap(),
        TaskId::new(task).unwrap(),
        Utc::now(),
        Prior::default(),
    )
    .unwrap();
    Writer::new(&Schema::default(), WriterProcessId::new("tls").unwrap())
        .record(&tx, &event)
        .await
        .unwrap();
    tx.commit().await.unwrap();
}

/// Whether the consumer's LISTEN connection is up, over TLS.
async fn listener_on_tls(settings: &ConnectSettings) -> bool {
    let client = settings.connect().await.unwrap();
    let rows = client
        .query(
            "SELECT s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
             WHERE a.application_name = 'outbox-listener' AND a.datname = 'app' \
             AND a.query ILIKE 'LISTEN%'",
            &[],
        )
        .await
        .unwrap();
    !rows.is_empty() && rows.iter().all(|r| r.get::<_, bool>(0))
}

async fn fails_with(url: &str, code: i32, needle: &str) {
    let (actual, out, err) = run_outbox(&["--database-url", url, "status"]).await;
    assert_eq!(actual, code, "expected exit {code}: {out}{err}");
    assert!(err.contains(needle), "expected {needle:?} in: {err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_modes_work_and_failures_name_their_cause() {
    let cluster = TlsCluster::start();
    let ca = cluster.ca.display().to_string();
    let verify_full = |db: &str| {
        cluster.url(
            "localhost",
            db,
            &format!("sslmode=verify-full&sslrootcert={ca}"),
        )
    };
    let admin = ConnectSettings::parse(&verify_full("postgres")).unwrap();
    let client = admin
        .connect()
        .await
        .unwrap_or_else(|e| panic!("verify-full with the right CA: {e}\n{}", cluster.log()));
    client.batch_execute("CREATE DATABASE app").await.unwrap();
    drop(client);
    let app = ConnectSettings::parse(&verify_full("app")).unwrap();
    app.connect()
        .await
        .unwrap()
        .batch_execute(TASKS_TABLE)
        .await
        .unwrap();

    let modes = [
        ("verify-full", verify_full("app")),
        (
            "require",
            cluster.url("localhost", "app", "sslmode=require"),
        ),
    ];
    for (index, (mode, url)) in modes.iter().enumerate() {
        let (code, out, err) = run_outbox(&["--database-url", url, "migrate"]).await;
        assert_eq!(code, 0, "migrate with sslmode={mode}: {err}");
        assert!(out.contains("schema outbox"), "{out}");
        let (code, out, err) =
            run_outbox(&["--database-url", url, "status", "--output", "json"]).await;
        assert_eq!(code, 0, "status with sslmode={mode}: {err}");
        assert!(out.contains("\"projects\""), "{out}");

        // consume: a poll interval far beyond the wait, so delivery proves the LISTEN
        // wake-up arrived over the TLS listener connection.
        let consumer_id = format!("c-{index}");
        let project = format!("p-{index}");
        let mut consumer = ConsumeProcess::spawn(
            url,
            &[
                "--project",
                &project,
                "--consumer-id",
                &consumer_id,
                "--start-from",
                "earliest",
                "--poll-interval",
                "5m",
            ],
        );
        eventually(WAIT, "the TLS listener connection", || async {
            listener_on_tls(&app).await
        })
        .await;
        // The first scan ran at start; these events can only arrive through LISTEN.
        tokio::time::sleep(Duration::from_millis(300)).await;
        for task in ["t1", "t2", "t3"] {
            write(&app, &project, task).await;
        }
        eventually(WAIT, "delivery woken by LISTEN over TLS", || async {
            consumer.sequences() == vec![1, 2, 3]
        })
        .await;
        consumer.signal("TERM");
        assert_eq!(consumer.wait().await, 0, "{}", consumer.stderr());
    }

    // verify-ca checks the chain but not the name: connecting by address works.
    let by_address = cluster.url(
        "127.0.0.1",
        "app",
        &format!("sslmode=verify-ca&sslrootcert={ca}"),
    );
    let (code, _, err) = run_outbox(&["--database-url", &by_address, "status"]).await;
    assert_eq!(code, 0, "verify-ca by address: {err}");

    // A client certificate (sslcert, sslkey) authenticates a `cert` role; without one it is
    // refused.
    admin
        .connect()
        .await
        .unwrap()
        .batch_execute(&format!("CREATE ROLE {CERT_USER} LOGIN SUPERUSER"))
        .await
        .unwrap();
    let cert_url = cluster
        .url(
            "localhost",
            "app",
            &format!("sslmode=verify-full&sslrootcert={ca}"),
        )
        .replacen("postgres@", &format!("{CERT_USER}@"), 1);
    let with_cert = format!(
        "{cert_url}&sslcert={}&sslkey={}",
        cluster.client_cert.display(),
        cluster.client_key.display()
    );
    let (code, _, err) = run_outbox(&["--database-url", &with_cert, "status"]).await;
    assert_eq!(code, 0, "client certificate: {err}");
    let (code, _, err) = run_outbox(&["--database-url", &cert_url, "status"]).await;
    assert_eq!(code, 1, "no client certificate must be refused");
    assert!(err.contains("certificate"), "{err}");

    // PGSSLMODE and PGSSLROOTCERT stand in for URL parameters.
    let output = tokio::process::Command::new(outbox_binary())
        .args([
            "--database-url",
            &cluster.url("localhost", "app", ""),
            "status",
        ])
        .env("PGSSLMODE", "verify-full")
        .env("PGSSLROOTCERT", &ca)
        .env("OUTBOX_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    // Each failure names its cause.
    let other = cluster.other_ca.display().to_string();
    fails_with(
        &cluster.url(
            "localhost",
            "app",
            &format!("sslmode=verify-full&sslrootcert={other}"),
        ),
        1,
        "certificate is not trusted",
    )
    .await;
    fails_with(
        &cluster.url(
            "127.0.0.1",
            "app",
            &format!("sslmode=verify-full&sslrootcert={ca}"),
        ),
        1,
        "host name mismatch",
    )
    .await;
    fails_with(
        &cluster.url(
            "localhost",
            "app",
            "sslmode=verify-full&sslrootcert=/nonexistent/root.crt",
        ),
        1,
        "cannot read sslrootcert file /nonexistent/root.crt",
    )
    .await;
    fails_with(
        &cluster.url("localhost", "app", "sslmode=disable"),
        1,
        "the server requires TLS",
    )
    .await;
    fails_with(
        &cluster.url("localhost", "app", "sslmode=verify"),
        2,
        "invalid sslmode \"verify\"",
    )
    .await;
    // The library names the cause too.
    let err = ConnectSettings::parse(&cluster.url(
        "localhost",
        "app",
        &format!("sslmode=verify-full&sslrootcert={other}"),
    ))
    .unwrap()
    .connect()
    .await
    .expect_err("an untrusted certificate is refused");
    assert!(err.to_string().contains("not trusted"), "{err}");
}

/// libpq ignores `sslmode` on a Unix socket (`PGSSLMODE=require psql` connects over the local
/// socket), and so does every command: `require`, `verify-ca` and `verify-full` (even with a
/// root-certificate file that does not exist, which libpq never reads there) through the
/// environment or the URL, for a one-shot command and for a consumer's pool and LISTEN
/// connection. The test cluster listens on a socket directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_modes_are_ignored_over_a_unix_socket_as_libpq_does() {
    let db = outbox_tests::fresh_db().await;
    assert!(db.url.contains("?host=/"), "a socket URL: {}", db.url);
    let first = outbox_tests::consumer_kit::write_event(&db, "p", "t1").await;
    for mode in ["require", "verify-ca", "verify-full"] {
        let output = tokio::process::Command::new(outbox_binary())
            .args(["--database-url", &db.url, "status", "--output", "json"])
            .env_remove("DATABASE_URL")
            .env("PGSSLMODE", mode)
            .env("PGSSLROOTCERT", "/nonexistent/root.crt")
            .stdin(Stdio::null())
            .output()
            .await
            .unwrap();
        assert!(
            output.status.success(),
            "PGSSLMODE={mode}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let url = format!(
            "{}&sslmode={mode}&sslrootcert=%2Fnonexistent%2Froot.crt",
            db.url
        );
        let (code, _, err) = run_outbox(&["--database-url", &url, "status"]).await;
        assert_eq!(code, 0, "{url}: {err}");
    }
    let mut consumer = ConsumeProcess::spawn_with_env(
        &db.url,
        "consume",
        &[
            "--project",
            "p",
            "--consumer-id",
            "socket",
            "--start-from",
            "earliest",
        ],
        &[("PGSSLMODE", "verify-full")],
    );
    let second = outbox_tests::consumer_kit::write_event(&db, "p", "t2").await;
    eventually(WAIT, "both events delivered", || async {
        let ids = consumer.event_ids();
        ids.contains(&first) && ids.contains(&second)
    })
    .await;
    let listening: i64 = db
        .connect()
        .await
        .query_one(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE application_name = 'outbox-listener' AND query ILIKE 'LISTEN%' \
             AND datname = $1",
            &[&db.name],
        )
        .await
        .unwrap()
        .get(0);
    assert!(listening >= 1, "the LISTEN connection is up");
    consumer.signal("TERM");
    assert_eq!(consumer.wait().await, 0, "{}", consumer.stderr());
}

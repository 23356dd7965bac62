//! Connection strings that name several hosts, in every form libpq accepts: the first host
//! that answers (and, with `target_session_attrs=read-write`, accepts writes) is used; and
//! libpq's `primary`, `standby` and `prefer-standby` against a real primary and standby.

use std::time::Duration;

use outbox_core::connect::ConnectSettings;
use outbox_tests::consumer_kit::{eventually, write_event};
use outbox_tests::process_kit::{OutboxProcess, run_outbox};
use outbox_tests::standby_kit::{PORT, Replication, StandbyPair};
use outbox_tests::{TestDb, fresh_db};
use tokio_postgres::Config;
use tokio_postgres::config::Host;

/// A socket directory no server listens in: connecting there fails at once.
const DOWN: &str = "/nonexistent-outbox-socket-dir";

/// `db`'s socket directory, port and user.
fn parts(db: &TestDb) -> (String, u16, String) {
    let Host::Unix(dir) = &db.config.get_hosts()[0] else {
        panic!("the test cluster listens on a socket directory");
    };
    (
        dir.display().to_string(),
        db.config.get_ports()[0],
        db.config.get_user().expect("a user").to_owned(),
    )
}

/// Each form of a string naming a host that is down first and `db`'s cluster second.
fn two_host_strings(db: &TestDb) -> Vec<String> {
    let (dir, port, user) = parts(db);
    let name = &db.name;
    vec![
        format!(
            "postgresql://{user}@/{name}?host={DOWN},{dir}&port=1,{port}&\
             target_session_attrs=read-write"
        ),
        format!("host={DOWN},{dir} port=1,{port} user={user} dbname={name}"),
        format!(
            "host={DOWN},{dir} port={port} user={user} dbname={name} \
             target_session_attrs=read-write"
        ),
    ]
}

#[tokio::test]
async fn every_multi_host_form_connects_through_the_host_that_is_up() {
    let db = fresh_db().await;
    write_event(&db, "p", "t1").await;
    for text in two_host_strings(&db) {
        let client = ConnectSettings::parse(&text)
            .unwrap_or_else(|e| panic!("{text}: {e}"))
            .connect()
            .await
            .unwrap_or_else(|e| panic!("{text}: {e}"));
        let database: String = client
            .query_one("SELECT current_database()", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(database, db.name, "{text}");

        let (code, out, err) =
            run_outbox(&["status", "--database-url", &text, "--output", "json"]).await;
        assert_eq!(code, 0, "{text}: {err}");
        let status: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(status["projects"][0]["project_id"], "p", "{text}");
    }
}

#[tokio::test]
async fn bad_multi_host_strings_exit_2_naming_the_problem() {
    for (url, expected) in [
        (
            "postgresql://u@/db?host=/a,/b&port=1,2,3",
            "2 host(s) but 3 ports",
        ),
        ("host=a,b,c port=1,2 user=u", "3 host(s) but 2 ports"),
        (
            "postgresql://u@h1,h2/db?target_session_attrs=bogus",
            "invalid target_session_attrs \"bogus\"",
        ),
    ] {
        let (code, _, stderr) = run_outbox(&["status", "--database-url", url]).await;
        assert_eq!(code, 2, "{url}: {stderr}");
        assert!(
            stderr.contains(expected),
            "{url}: {stderr:?} lacks {expected:?}"
        );
    }
}

/// During a failover's window no host accepts writes yet: with
/// `target_session_attrs=read-write` the driver refuses every read-only server. A process
/// started then waits for a primary (one log line, `/readyz` 503) instead of exiting, and
/// begins once a server accepts writes.
#[tokio::test]
async fn a_process_started_while_no_host_accepts_writes_waits_for_a_primary() {
    let db = fresh_db().await;
    let (dir, port, user) = parts(&db);
    let name = &db.name;
    let url = format!(
        "postgresql://{user}@/{name}?host={dir}&port={port}&target_session_attrs=read-write"
    );
    let admin = db.connect().await;
    admin
        .batch_execute(&format!(
            "ALTER DATABASE \"{name}\" SET default_transaction_read_only = on"
        ))
        .await
        .unwrap();
    let mut consumer = OutboxProcess::spawn(
        &url,
        &[
            "--project",
            "p",
            "--consumer-id",
            "waits",
            "--start-from",
            "earliest",
            "--poll-interval",
            "100ms",
        ],
    );
    eventually(
        Duration::from_secs(20),
        "the consumer to say the database is unavailable",
        || async { consumer.stderr().contains("the database is unavailable") },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(consumer.exited(), None, "{}", consumer.stderr());

    // The "promotion": the server accepts writes again.
    admin
        .batch_execute(&format!(
            "ALTER DATABASE \"{name}\" RESET default_transaction_read_only"
        ))
        .await
        .unwrap();
    let id = write_event(&db, "p", "t1").await;
    eventually(Duration::from_secs(30), "the event delivered", || async {
        consumer.event_ids().contains(&id)
    })
    .await;
    let stderr = consumer.stderr();
    assert_eq!(
        stderr.matches("the database is unavailable").count(),
        1,
        "{stderr}"
    );
    consumer.signal("TERM");
    assert_eq!(consumer.wait().await, 0, "{}", consumer.stderr());
}

/// Whether the server `settings` reach is in recovery, through a single connection and
/// through the pool (both must reach the same kind of server).
async fn reaches_standby(settings: &ConnectSettings) -> bool {
    let client = settings
        .connect()
        .await
        .unwrap_or_else(|e| panic!("{settings:?}: {e}"));
    let single: bool = client
        .query_one("SELECT pg_is_in_recovery()", &[])
        .await
        .unwrap()
        .get(0);
    let pool = settings.pool(1).unwrap();
    let pooled: bool = pool
        .get()
        .await
        .unwrap_or_else(|e| panic!("{settings:?}: pool: {e}"))
        .query_one("SELECT pg_is_in_recovery()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        single, pooled,
        "{settings:?}: the pool reached another server"
    );
    single
}

/// libpq's `target_session_attrs` values the driver cannot check (`primary`, `standby`,
/// `prefer-standby`), against a primary and its streaming standby, the hosts listed in
/// either order: each reaches the kind of server it names, for a single connection, the
/// pool and the CLI; `prefer-standby` falls back to the primary when no host is a standby;
/// `standby` with no standby fails naming why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_standby_and_prefer_standby_reach_the_server_they_name() {
    let pair = StandbyPair::start("failover-target-session", Replication::Asynchronous).await;
    let dir = |config: Config| match &config.get_hosts()[0] {
        Host::Unix(dir) => dir.display().to_string(),
        other => panic!("a socket directory, not {other:?}"),
    };
    let (primary, standby) = (dir(pair.primary_config()), dir(pair.standby_config()));
    let user = pair.primary_config().get_user().unwrap().to_owned();
    let url = |hosts: &[&str], target: &str| {
        let ports = vec![PORT.to_string(); hosts.len()].join(",");
        format!(
            "postgresql://{user}@/postgres?host={}&port={ports}&target_session_attrs={target}",
            hosts.join(",")
        )
    };
    for (hosts, target, wants_standby) in [
        ([&standby, &primary], "primary", false),
        ([&primary, &standby], "standby", true),
        ([&primary, &standby], "prefer-standby", true),
        ([&standby, &primary], "read-write", false),
        ([&standby, &primary], "any", true),
    ] {
        let text = url(&[hosts[0].as_str(), hosts[1].as_str()], target);
        let settings = ConnectSettings::parse(&text).unwrap();
        assert_eq!(reaches_standby(&settings).await, wants_standby, "{text}");
        let (code, _, err) = run_outbox(&["status", "--database-url", &text]).await;
        assert_eq!(code, 0, "{text}: {err}");
    }
    let only_primary = ConnectSettings::parse(&url(&[&primary], "prefer-standby")).unwrap();
    assert!(
        !reaches_standby(&only_primary).await,
        "prefer-standby falls back"
    );
    let text = url(&[&primary], "standby");
    let err = ConnectSettings::parse(&text)
        .unwrap()
        .connect()
        .await
        .expect_err("no standby to reach");
    assert!(
        err.to_string()
            .contains("target_session_attrs=standby asks for (server is not in hot standby mode)"),
        "{err}"
    );
    let (code, _, stderr) = run_outbox(&["status", "--database-url", &text]).await;
    assert_ne!(code, 0);
    assert!(
        stderr.contains("server is not in hot standby mode"),
        "{stderr}"
    );
}

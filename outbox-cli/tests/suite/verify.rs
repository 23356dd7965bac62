//! `outbox verify`: the gap-safety probe passes on a direct connection, through PgBouncer in
//! transaction mode and over TLS; it fails with exit 5 naming the check when the database
//! loses committed rows; it refuses a project in real use; and it leaves no lease held and no
//! event behind. Through a transaction pooler not declared with `--pooler transaction` it says
//! so at once; a missing privilege is named with the role; SIGTERM cleans up as the next run
//! would.

use std::time::Duration;

use outbox_core::connect::ConnectSettings;
use outbox_tests::consumer_kit::{eventually, write_event};
use outbox_tests::pgbouncer::PgBouncer;
use outbox_tests::process_kit::{OutboxProcess, outbox_binary, run_outbox};
use outbox_tests::tls_cluster::TlsCluster;
use outbox_tests::{connect, fresh_db};
use serde_json::Value;
use tokio_postgres::Client;

/// A short probe: still several writers, late commits and rollbacks.
const QUICK: &[&str] = &[
    "--transactions",
    "16",
    "--writers",
    "4",
    "--late-commit",
    "100ms",
    "--poll-interval",
    "50ms",
    "--timeout",
    "20s",
];

/// Runs `outbox --database-url URL [GLOBAL] verify QUICK --output json`; returns (exit code,
/// parsed report, stderr).
async fn verify(url: &str, global: &[&str], extra: &[&str]) -> (i32, Value, String) {
    let mut args = vec!["--database-url", url];
    args.extend_from_slice(global);
    args.push("verify");
    args.extend_from_slice(QUICK);
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--output", "json"]);
    let (code, out, err) = run_outbox(&args).await;
    let report = serde_json::from_str(&out).unwrap_or(Value::Null);
    (code, report, err)
}

/// Every check of `report` held.
fn assert_all_checks_hold(report: &Value, stderr: &str) {
    let checks = report["checks"]
        .as_array()
        .unwrap_or_else(|| panic!("{report}\n{stderr}"));
    let names: Vec<&str> = checks.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "dense_numbering",
            "commit_order",
            "nothing_missing",
            "nothing_duplicated",
            "nothing_rolled_back",
            "only_probe_events",
            "cleaned_up"
        ]
    );
    for check in checks {
        assert_eq!(check["ok"], true, "{check}\n{stderr}");
    }
    assert_eq!(report["ok"], true);
    let probe = &report["probe"];
    assert_eq!(probe["transactions"], 16);
    assert!(probe["late_transactions"].as_u64().unwrap() > 0, "{probe}");
    assert!(probe["rolled_back_events"].as_u64().unwrap() > 0, "{probe}");
    assert_eq!(probe["delivered"], probe["committed_events"], "{probe}");
    assert!(report["latency_ms"]["p50"].as_f64().is_some(), "{report}");
}

/// The probe project is empty and no probe consumer holds a lease; every probe consumer is
/// retired with an audit row.
async fn assert_nothing_left(client: &Client, project: &str) {
    let events: i64 = client
        .query_one(
            "SELECT count(*) FROM outbox.lifecycle_outbox WHERE project_id = $1",
            &[&project],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(events, 0, "probe events left behind");
    let rows = client
        .query(
            "SELECT c.consumer_id, c.state, c.lease_owner, \
                    (SELECT count(*) FROM outbox.lifecycle_audit a \
                     WHERE a.project_id = c.project_id AND a.consumer_id = c.consumer_id \
                       AND a.kind = 'lifecycle-observation:consumer-retired') AS audited \
             FROM outbox.lifecycle_consumer_cursors c WHERE c.project_id = $1",
            &[&project],
        )
        .await
        .unwrap();
    assert!(!rows.is_empty(), "the probe consumer was registered");
    for row in rows {
        let (id, state, owner, audited): (String, String, Option<String>, i64) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        assert_eq!(state, "retired", "{id}");
        assert_eq!(owner, None, "{id} still holds its lease");
        assert_eq!(audited, 1, "{id}'s retirement is audited once");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_on_a_direct_connection_with_listen_and_leaves_nothing_behind() {
    let db = fresh_db().await;
    let (code, report, err) = verify(&db.url, &[], &[]).await;
    assert_eq!(code, 0, "{report}\n{err}");
    assert_all_checks_hold(&report, &err);
    assert_eq!(report["topology"]["pooler"], "none");
    assert_eq!(
        report["topology"]["listen"]["state"], "available",
        "{report}"
    );
    assert_eq!(report["topology"]["tls"], "off");
    let client = db.connect().await;
    assert_nothing_left(&client, "outbox-verify").await;

    // A second run on the same project starts from the pruned head and passes again.
    let (code, again, err) = verify(&db.url, &[], &[]).await;
    assert_eq!(code, 0, "{again}\n{err}");
    assert_all_checks_hold(&again, &err);
    assert_nothing_left(&client, "outbox-verify").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_through_pgbouncer_in_transaction_mode() {
    let db = fresh_db().await;
    let bouncer = PgBouncer::start();
    let url = bouncer.url(&db.name);
    let (code, report, err) = verify(
        &url,
        &["--pooler", "transaction"],
        &["--project", "outbox-verify-pooled"],
    )
    .await;
    assert_eq!(code, 0, "{report}\n{err}\n{}", bouncer.log());
    assert_all_checks_hold(&report, &err);
    assert_eq!(report["topology"]["pooler"], "transaction");
    assert_eq!(report["topology"]["listen"]["state"], "not_used");
    assert_nothing_left(&db.connect().await, "outbox-verify-pooled").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_over_tls_with_certificate_verification() {
    let cluster = TlsCluster::start();
    let ca = cluster.ca.display().to_string();
    let url = |db: &str| {
        cluster.url(
            "localhost",
            db,
            &format!("sslmode=verify-full&sslrootcert={ca}"),
        )
    };
    let admin = ConnectSettings::parse(&url("postgres")).unwrap();
    admin
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect over TLS: {e}\n{}", cluster.log()))
        .batch_execute("CREATE DATABASE app")
        .await
        .unwrap();
    let (code, _, err) = run_outbox(&["--database-url", &url("app"), "migrate"]).await;
    assert_eq!(code, 0, "{err}");
    let (code, report, err) = verify(&url("app"), &[], &[]).await;
    assert_eq!(code, 0, "{report}\n{err}");
    assert_all_checks_hold(&report, &err);
    let tls = report["topology"]["tls"].as_str().unwrap();
    assert!(tls.starts_with("on (TLS"), "{tls}");
    let app = ConnectSettings::parse(&url("app")).unwrap();
    assert_nothing_left(&app.connect().await.unwrap(), "outbox-verify").await;
}

/// A trigger that silently discards some probe rows (the second event of every transaction
/// with several): the writer returns, the transaction commits, and the event never exists.
const LOSE_ROWS: &str = "
CREATE FUNCTION public.lose_some_probe_rows() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.project_id = 'outbox-verify' AND NEW.task_id LIKE '%-1' THEN
        RETURN NULL;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER lose_some_probe_rows BEFORE INSERT ON outbox.lifecycle_outbox
    FOR EACH ROW EXECUTE FUNCTION public.lose_some_probe_rows();";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_loses_committed_rows_fails_nothing_missing_with_exit_5() {
    let db = fresh_db().await;
    let client = db.connect().await;
    client.batch_execute(LOSE_ROWS).await.unwrap();
    let (code, report, err) = verify(&db.url, &[], &[]).await;
    assert_eq!(code, 5, "{report}\n{err}");
    assert!(
        err.contains("check(s) failed: nothing_missing"),
        "stderr names the check: {err}"
    );
    assert_eq!(report["ok"], false);
    assert_eq!(report["failed"], serde_json::json!(["nothing_missing"]));
    let missing = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "nothing_missing")
        .unwrap();
    assert!(
        missing["detail"]
            .as_str()
            .unwrap()
            .contains("committed events were never delivered"),
        "{missing}"
    );
    assert_nothing_left(&client, "outbox-verify").await;

    // The table form says the same.
    client
        .batch_execute("DROP TRIGGER lose_some_probe_rows ON outbox.lifecycle_outbox")
        .await
        .unwrap();
    let (code, out, err) = run_outbox(&["--database-url", &db.url, "verify"]).await;
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("nothing_missing      ok"), "{out}");
}

#[tokio::test]
async fn refuses_a_project_holding_other_events_with_exit_2_and_touches_nothing() {
    let db = fresh_db().await;
    write_event(&db, "orders", "o-1").await;
    // A user project is not even a probe project's name.
    let (code, out, err) =
        run_outbox(&["--database-url", &db.url, "verify", "--project", "orders"]).await;
    assert_eq!(code, 2, "{out}\n{err}");
    assert!(
        err.contains("orders is not a probe project: its ID must start with outbox-verify"),
        "{err}"
    );
    let project = "outbox-verify-orders";
    write_event(&db, project, "o-1").await;
    let (code, out, err) =
        run_outbox(&["--database-url", &db.url, "verify", "--project", project]).await;
    assert_eq!(code, 2, "{out}\n{err}");
    assert!(
        err.contains("project outbox-verify-orders holds 1 event(s) no probe wrote"),
        "{err}"
    );
    let client = connect(&db.config).await;
    let kept: i64 = client
        .query_one(
            "SELECT count(*) FROM outbox.lifecycle_outbox WHERE project_id = 'outbox-verify-orders'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(kept, 1);
    let consumers: i64 = client
        .query_one(
            "SELECT count(*) FROM outbox.lifecycle_consumer_cursors",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(consumers, 0, "no probe consumer was registered");
}

#[tokio::test]
async fn an_unreachable_database_is_exit_1() {
    let (code, _, err) = run_outbox(&[
        "--database-url",
        "postgresql://nobody@127.0.0.1:1/none?connect_timeout=2",
        "verify",
    ])
    .await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("cannot connect"), "{err}");
}

/// Events of `project` and probe consumers still holding a lease or not retired.
async fn left_behind(client: &Client, project: &str) -> (i64, i64) {
    let row = client
        .query_one(
            "SELECT (SELECT count(*) FROM outbox.lifecycle_outbox WHERE project_id = $1), \
                    (SELECT count(*) FROM outbox.lifecycle_consumer_cursors \
                     WHERE project_id = $1 AND (state <> 'retired' OR lease_owner IS NOT NULL))",
            &[&project],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// Through PgBouncer in transaction mode without `--pooler transaction`, verify says what is
/// wrong as soon as it can tell (one client connection's transactions on several server
/// sessions, or the probe consumer's prepared statements lost between them), exit 2, instead
/// of waiting out its whole `--timeout` in silence and printing a raw 42P05; and it leaves
/// nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undeclared_transaction_pooler_is_named_at_once() {
    let db = fresh_db().await;
    let bouncer = PgBouncer::start();
    let url = bouncer.url(&db.name);
    let run = tokio::process::Command::new(outbox_binary())
        .args([
            "--database-url",
            &url,
            "verify",
            "--project",
            "outbox-verify-undeclared",
        ])
        .args([
            "--transactions",
            "200",
            "--writers",
            "4",
            "--timeout",
            "900s",
        ])
        .env("OUTBOX_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("verify waited out its 900 s timeout instead of saying what is wrong")
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}\n{}", bouncer.log());
    assert!(
        stderr.contains(
            "error: a pooler in transaction mode was detected: pass --pooler transaction"
        ),
        "{stderr}"
    );
    assert_eq!(
        left_behind(&db.connect().await, "outbox-verify-undeclared").await,
        (0, 0),
        "nothing left behind"
    );
}

/// A role that may write and prune but not consume: the probe consumer is refused, and
/// verify says which role may not do what, at once, instead of "the probe consumer stopped".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_privilege_is_named_with_the_role() {
    let db = fresh_db().await;
    let role = format!("{}_noconsume", db.name);
    db.connect()
        .await
        .batch_execute(&format!(
            "CREATE ROLE \"{role}\" LOGIN IN ROLE outbox_writer, outbox_operator"
        ))
        .await
        .unwrap();
    let url = db.url.replacen("postgres@", &format!("{role}@"), 1);
    let (code, report, err) = verify(&url, &[], &["--project", "outbox-verify-denied"]).await;
    assert_eq!(code, 1, "{report}\n{err}");
    assert!(
        err.contains(&format!(
            "permission denied: role {role} may not verify gap safety"
        )),
        "{err}"
    );
}

/// SIGTERM in the middle of a probe: the probe stops, the probe consumer is retired (with its
/// audit row) and its events pruned, as the next run would do, and the exit says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_retires_the_probe_consumer_and_prunes_its_events() {
    let db = fresh_db().await;
    let mut probe = OutboxProcess::spawn_command(
        &db.url,
        "verify",
        &[
            "--project",
            "outbox-verify-stopped",
            "--transactions",
            "10000",
            "--writers",
            "1",
            "--late-commit",
            "500ms",
            "--timeout",
            "600s",
        ],
    );
    let client = db.connect().await;
    eventually(
        Duration::from_secs(30),
        "probe events written while the probe consumer holds its lease",
        || async {
            let row = client
                .query_one(
                    "SELECT (SELECT count(*) FROM outbox.lifecycle_outbox \
                             WHERE project_id = 'outbox-verify-stopped'), \
                            (SELECT count(*) FROM outbox.lifecycle_consumer_cursors \
                             WHERE project_id = 'outbox-verify-stopped' AND lease_owner IS NOT NULL)",
                    &[],
                )
                .await
                .unwrap();
            row.get::<_, i64>(0) > 0 && row.get::<_, i64>(1) == 1
        },
    )
    .await;
    probe.signal("TERM");
    let code = probe.wait().await;
    let stderr = probe.stderr();
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("error: verify interrupted by a signal; the probe consumer verify-"),
        "{stderr}"
    );
    assert!(
        stderr.contains("was retired and the probe events pruned"),
        "{stderr}"
    );
    assert_nothing_left(&client, "outbox-verify-stopped").await;
}

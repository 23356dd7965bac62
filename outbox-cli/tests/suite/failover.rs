//! Failover to a streaming standby (`tests/src/standby_kit.rs`): with asynchronous
//! replication and a lost tail, every consumer detects that the database's history is not the
//! one its position came from, audits it and reconciles, and then delivers everything the
//! promoted primary commits; with synchronous replication nothing acknowledged is lost and
//! nothing reconciles. Consumers reach the servers through one multi-host connection string
//! with `target_session_attrs=read-write`, so they follow the promotion.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use outbox_consumer::ConsumerConfig;
use outbox_consumer::handler::ReconcileReason;
use outbox_core::Schema;
use outbox_core::sequencer::Sequencer;
use outbox_tests::cluster_kit::try_write;
use outbox_tests::consumer_kit::{
    Recorder, cursor, eventually, fast_delivery, fast_duties, start, write_event,
};
use outbox_tests::nats_kit::{NatsServer, Relayed, read_stream, spawn_relay};
use outbox_tests::serve_kit::{ServeProcess, SseClient, get, sse_id};
use outbox_tests::set_kit::{Recorders, SetConfig, listed, start_set};
use outbox_tests::standby_kit::{Replication, StandbyPair};
use outbox_tests::{TestDb, sequenced};

/// How long a test waits for consumers to get past a failover.
const FAILOVER_WAIT: Duration = Duration::from_secs(60);

fn config(consumer: &str) -> ConsumerConfig {
    ConsumerConfig {
        project_id: "p".parse().unwrap(),
        consumer_id: consumer.parse().unwrap(),
        delivery: fast_delivery(),
        duties: fast_duties(),
    }
}

async fn write_many(db: &TestDb, prefix: &str, count: usize) {
    for i in 0..count {
        write_event(db, "p", &format!("{prefix}-{i}")).await;
    }
}

/// Waits until `consumers` all stand at `at` in `db`.
async fn all_at(db: &TestDb, consumers: &[&str], at: i64) {
    for consumer in consumers {
        let deadline = tokio::time::Instant::now() + FAILOVER_WAIT;
        loop {
            let now = cursor(db, "p", consumer).await;
            if now == Some(at) {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {consumer} at {at}: it stands at {now:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The `history-diverged` audit rows of `consumer` in `db`: (count = the process's
/// position, reason = what the database had).
async fn divergences(db: &TestDb, consumer: &str) -> Vec<(i64, String)> {
    db.connect()
        .await
        .query(
            "SELECT count, reason FROM outbox.lifecycle_audit \
             WHERE kind = 'lifecycle-observation:history-diverged' AND consumer_id = $1 \
             ORDER BY id",
            &[&consumer],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}

/// Every event of the promoted primary after `from` is delivered to `recorder` (with its
/// identity) or covered by a reconciliation after the divergence; that reconciliation has
/// reason `history_diverged`.
fn delivered_or_reconciled(
    recorder: &Recorder,
    history: &[(i64, String)],
    from: i64,
    who: &str,
) -> i64 {
    let reconciliations = recorder.reconciliations();
    let healed = reconciliations
        .iter()
        .find(|live| live.reason == ReconcileReason::HistoryDiverged)
        .unwrap_or_else(|| {
            panic!("{who}: no history_diverged reconciliation in {reconciliations:?}")
        });
    let head = healed.head_sequence;
    let delivered: BTreeMap<i64, String> = recorder
        .events()
        .into_iter()
        .map(|e| (e.sequence, e.event_id))
        .collect();
    for (sequence, event_id) in history.iter().filter(|(s, _)| *s > from.max(head)) {
        assert_eq!(
            delivered.get(sequence),
            Some(event_id),
            "{who}: event {sequence} of the promoted primary neither delivered nor reconciled \
             (reconciled at {head})"
        );
    }
    head
}

/// The table: 100 events on both, the standby stops receiving WAL, 100 more on the
/// primary only, the primary stopped at once, the standby promoted, 50 and then 60 new
/// events there. A lone consumer and a consumer set that live through it, and a consumer
/// that stopped before it and starts after, all end at the new head; the first two found the
/// divergence (audited) and reconciled, and every event of the new history after the
/// reconciliation reached them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_asynchronous_failover_with_a_lost_tail_is_detected_and_healed() {
    let pair = StandbyPair::start("failover-async", Replication::Asynchronous).await;
    let (a, b, either) = (pair.primary_db(), pair.standby_db(), pair.either_db());

    let living = Recorder::default();
    let (stop_living, run_living) = start(&either, config("living"), &living);
    let later = Recorder::default();
    let (stop_later, run_later) = start(&either, config("later"), &later);
    let recorders = Recorders::default();
    let set_config = SetConfig {
        delivery: fast_delivery(),
        duties: fast_duties(),
    };
    let (stop_set, run_set) = start_set(
        &either,
        set_config,
        listed(&["p"]),
        &["set"],
        4,
        true,
        &recorders,
    );
    let consumers = ["living", "later", "set"];

    write_many(&a, "both", 100).await;
    all_at(&a, &consumers, 100).await;
    pair.stop_wal_receipt().await;
    write_many(&a, "lost", 100).await;
    all_at(&a, &consumers, 200).await;
    stop_later.cancel();
    run_later.await.unwrap().unwrap();

    pair.stop_primary_immediately();
    pair.promote_standby().await;
    assert_eq!(
        cursor(&b, "p", "living").await,
        Some(100),
        "the tail is lost"
    );
    write_many(&b, "new", 50).await;
    let later_after = Recorder::default();
    let (stop_later, run_later) = start(&either, config("later"), &later_after);
    write_many(&b, "more", 60).await;
    all_at(&b, &consumers, 210).await;

    // The sequencer numbered densely on the promoted primary, from its own head.
    let history = sequenced(&b.connect().await, "p").await;
    let numbers: Vec<i64> = history.iter().map(|(s, _)| *s).collect();
    assert_eq!(numbers, (1..=210).collect::<Vec<_>>());

    let living_head = delivered_or_reconciled(&living, &history, 100, "living");
    let set_head = delivered_or_reconciled(&recorders.of("p", "set"), &history, 100, "set");
    for (consumer, head) in [("living", living_head), ("set", set_head)] {
        let rows = divergences(&b, consumer).await;
        assert_eq!(rows.len(), 1, "{consumer}: {rows:?}");
        assert_eq!(
            rows[0].0, 200,
            "{consumer}: the process's position is audited"
        );
        assert!(rows[0].1.contains("database cursor 100"), "{rows:?}");
        assert!(head >= 100, "{consumer} reconciled at {head}");
    }
    // Started after the failover, "later" reads the promoted primary's own cursor (100) and
    // its identity, which agree with that history: it delivers all of it, nothing skipped.
    let delivered: Vec<(i64, String)> = later_after
        .events()
        .into_iter()
        .map(|e| (e.sequence, e.event_id))
        .collect();
    assert_eq!(delivered, history[100..].to_vec());
    assert!(later_after.reconciliations().is_empty());
    assert!(divergences(&b, "later").await.is_empty());

    for stop in [stop_living, stop_later, stop_set] {
        stop.cancel();
    }
    run_living.await.unwrap().unwrap();
    run_later.await.unwrap().unwrap();
    run_set.await.unwrap().unwrap();
}

/// Writers commit through the multi-host string while the primary is stopped at once and
/// the synchronous standby promoted: every event acknowledged to a writer is on the promoted
/// primary, a lone consumer and a consumer set get every event, and nothing reconciles.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_synchronous_failover_under_live_writers_loses_nothing() {
    let pair = StandbyPair::start("failover-sync", Replication::Synchronous).await;
    let (b, either) = (pair.standby_db(), pair.either_db());

    let lone = Recorder::default();
    let (stop_lone, run_lone) = start(&either, config("lone"), &lone);
    let recorders = Recorders::default();
    let set_config = SetConfig {
        delivery: fast_delivery(),
        duties: fast_duties(),
    };
    let (stop_set, run_set) = start_set(
        &either,
        set_config,
        listed(&["p"]),
        &["set"],
        4,
        true,
        &recorders,
    );

    let stop_writers = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..3 {
        let (config, stop) = (either.config.clone(), stop_writers.clone());
        writers.push(tokio::spawn(async move {
            let mut acknowledged = Vec::new();
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                if let Ok(id) = try_write(&config, "p", &format!("w{w}-{i}")).await {
                    acknowledged.push(id);
                } else {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            acknowledged
        }));
    }
    let a = pair.primary_db();
    eventually(FAILOVER_WAIT, "events before the failover", || async {
        cursor(&a, "p", "lone").await.unwrap_or(0) > 100
    })
    .await;
    pair.stop_primary_immediately();
    pair.promote_standby().await;
    eventually(FAILOVER_WAIT, "events after the failover", || async {
        let client = b.connect().await;
        sequenced(&client, "p").await.len() > 300
    })
    .await;
    stop_writers.store(true, Ordering::Relaxed);
    let mut acknowledged = BTreeSet::new();
    for writer in writers {
        acknowledged.extend(writer.await.unwrap());
    }

    let client = b.connect().await;
    // Number whatever committed last, then wait for both consumers to reach the head.
    outbox_core::sequencer::Sequencer::new(&outbox_core::Schema::default())
        .drain(&mut b.connect().await)
        .await
        .unwrap();
    let history = sequenced(&client, "p").await;
    let head = history.last().unwrap().0;
    let numbers: Vec<i64> = history.iter().map(|(s, _)| *s).collect();
    assert_eq!(numbers, (1..=head).collect::<Vec<_>>(), "numbered densely");
    if std::env::var("FAILOVER_DEBUG").is_ok() {
        eprintln!("lone reconciliations: {:?}", lone.reconciliations());
        eprintln!("lone delivered: {}", lone.events().len());
    }
    all_at(&b, &["lone", "set"], head).await;
    let stored: BTreeSet<String> = history.iter().map(|(_, id)| id.clone()).collect();
    let lost: Vec<_> = acknowledged.difference(&stored).collect();
    assert!(
        lost.is_empty(),
        "acknowledged to a writer, then lost: {lost:?}"
    );
    for (who, recorder) in [("lone", lone.clone()), ("set", recorders.of("p", "set"))] {
        let delivered: BTreeSet<String> =
            recorder.events().into_iter().map(|e| e.event_id).collect();
        let missing: Vec<_> = stored.difference(&delivered).collect();
        let extra: Vec<_> = delivered.difference(&stored).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "{who}: missing {missing:?}, not in the promoted history {extra:?}, reconciled {:?}",
            recorder.reconciliations()
        );
        assert!(recorder.reconciliations().is_empty(), "{who} reconciled");
        assert!(divergences(&b, who).await.is_empty());
    }
    stop_lone.cancel();
    stop_set.cancel();
    run_lone.await.unwrap().unwrap();
    run_set.await.unwrap().unwrap();
}

/// Options of `outbox serve` and `outbox relay nats` tuned for tests.
const FAST: &[&str] = &[
    "--project",
    "p",
    "--lease-ttl",
    "2s",
    "--heartbeat-interval",
    "300ms",
    "--poll-interval",
    "100ms",
    "--shutdown-grace",
    "1s",
    "--start-from",
    "earliest",
    "--no-prune",
];

/// Waits until `/readyz` answers 200 (the served consumer holds its lease).
async fn ready(server: &ServeProcess) {
    let addr = server.addr;
    eventually(FAILOVER_WAIT, "/readyz answers 200", || async move {
        matches!(get(addr, "/readyz", &[]).await, Ok((200, _, _)))
    })
    .await;
}

/// The task events of an SSE stream, as (sequence, event ID).
fn sse_events(client: &SseClient) -> Vec<(i64, String)> {
    client
        .events()
        .iter()
        .filter(|m| m.event.as_deref() == Some("task:deleted"))
        .map(|m| {
            let data = m.json();
            (
                data["sequence"].as_i64().unwrap(),
                data["event_id"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// Events as (sequence, event ID).
type Seen = Vec<(i64, String)>;

/// The last `event: reconcile` of an SSE stream (reason, head) and the task events after it.
fn after_last_reconcile(client: &SseClient) -> Option<(String, i64, Seen)> {
    let messages = client.events();
    let at = messages
        .iter()
        .rposition(|m| m.event.as_deref() == Some("reconcile"))?;
    let data = messages[at].json();
    let events = messages[at + 1..]
        .iter()
        .filter(|m| m.event.as_deref() == Some("task:deleted"))
        .map(|m| {
            let data = m.json();
            (
                data["sequence"].as_i64().unwrap(),
                data["event_id"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    Some((
        data["reason"].as_str().unwrap().to_owned(),
        data["head_sequence"].as_i64().unwrap(),
        events,
    ))
}

/// `seen` (what arrived after a reconciliation at `head`) is the events of `history` after
/// `head`, in order.
fn covered_after(seen: &[(i64, String)], history: &[(i64, String)], head: i64, who: &str) {
    let want: Vec<(i64, String)> = history.iter().filter(|(s, _)| *s > head).cloned().collect();
    assert!(
        seen == want,
        "{who}: after the reconciliation at {head}, {} events arrived (first {:?}); the new \
         history has {} (first {:?})",
        seen.len(),
        seen.first(),
        want.len(),
        want.first()
    );
}

/// The same failover with `outbox serve` and `outbox relay nats` on the multi-host string:
/// an SSE client that stays connected and one that resumes with its last ID both get
/// `event: reconcile` and then every event of the new history after it; the relay publishes
/// its reconcile message (reason `history_diverged`) and then the new history's events.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn serve_and_the_relay_reconcile_after_an_asynchronous_failover() {
    let pair = StandbyPair::start("failover-live", Replication::Asynchronous).await;
    let (a, b) = (pair.primary_db(), pair.standby_db());
    let url = pair.multi_host_url();
    let nats = NatsServer::start().await;

    let mut serve_args = FAST.to_vec();
    serve_args.extend_from_slice(&["--consumer-id", "feed", "--keep-alive", "1s"]);
    let server = ServeProcess::start(&url, &serve_args).await;
    let path = "/v1/projects/p/events";
    ready(&server).await;
    let staying = SseClient::open(server.addr, path, &[]).await;
    let resuming = SseClient::open(server.addr, path, &[]).await;
    let nats_url = nats.url();
    let mut relay_args = FAST.to_vec();
    relay_args.extend_from_slice(&[
        "--consumer-id",
        "relay",
        "--nats-url",
        &nats_url,
        "--stream",
        "FAILOVER",
        "--retry-delays",
        "100ms,200ms,400ms",
        "--max-attempts",
        "1000",
        "--publish-timeout",
        "1s",
    ]);
    let _relay = spawn_relay(&url, &relay_args);

    write_many(&a, "both", 100).await;
    all_at(&a, &["feed", "relay"], 100).await;
    pair.stop_wal_receipt().await;
    write_many(&a, "lost", 100).await;
    all_at(&a, &["feed", "relay"], 200).await;
    eventually(FAILOVER_WAIT, "the resuming client at 200", || async {
        sse_events(&resuming).last().map(|(s, _)| *s) == Some(200)
    })
    .await;
    let last_id = resuming.events().last().unwrap().id.clone().unwrap();
    drop(resuming);

    pair.stop_primary_immediately();
    pair.promote_standby().await;
    write_many(&b, "new", 50).await;
    ready(&server).await;
    let resumed = SseClient::open(server.addr, path, &[("last-event-id", &last_id)]).await;
    write_many(&b, "more", 60).await;
    all_at(&b, &["feed", "relay"], 210).await;
    let history = sequenced(&b.connect().await, "p").await;
    assert_eq!(history.len(), 210);

    for (who, client) in [("staying", &staying), ("resumed", &resumed)] {
        eventually(FAILOVER_WAIT, &format!("{who} at 210"), || async {
            sse_events(client).last().map(|(s, _)| *s) == Some(210)
        })
        .await;
        let (reason, head, events) =
            after_last_reconcile(client).unwrap_or_else(|| panic!("{who}: no event: reconcile"));
        assert_eq!(reason, "history_diverged", "{who}");
        covered_after(&events, &history, head, who);
        // The reconciliation's id (the durable consumer's for "staying", the server's own
        // for "resumed") names its head and the event there, to resume from.
        let id = client
            .events()
            .iter()
            .rfind(|m| m.event.as_deref() == Some("reconcile"))
            .and_then(|m| m.id.clone());
        let at_head = &history[head as usize - 1];
        assert_eq!(id, Some(sse_id(head, &at_head.1)), "{who}");
    }
    assert_eq!(divergences(&b, "feed").await.len(), 1);
    assert_eq!(divergences(&b, "relay").await.len(), 1);

    let js = nats.jetstream().await;
    eventually(FAILOVER_WAIT, "the relay's messages", || async {
        read_stream(&js, "FAILOVER")
            .await
            .last()
            .is_some_and(|m| m.body["event_id"] == history[209].1.as_str())
    })
    .await;
    let messages = read_stream(&js, "FAILOVER").await;
    let reconcile = messages
        .iter()
        .find(|m| m.subject == "lifecycle.p.reconcile")
        .expect("the relay published its reconcile message");
    assert_eq!(reconcile.body["reason"], "history_diverged");
    let head = reconcile.body["head_sequence"].as_i64().unwrap();
    let after: Vec<(i64, String)> = messages
        .iter()
        .skip_while(|m| m.subject != "lifecycle.p.reconcile")
        .filter(|m| m.subject == "lifecycle.p.task_deleted")
        .map(|m| (m.outbox_sequence, m.msg_id.clone()))
        .collect();
    covered_after(&after, &history, head, "relay");
}

/// The relay stops (kill -9) in the lost tail, before the failover, and starts again after
/// it: the database's cursor never saw the lost tail, so only the stream tells the relay that
/// it published a history the database no longer has. Reading the stream back from its last
/// message (the relay's messages of events 101..200, none in the promoted database, after its
/// own event 100), the relay takes that for its divergence: one `history-diverged` audit row
/// and its reconciliation notice (`history_diverged`, head 210) after the lost messages,
/// where it used to retry `nats_sequence_conflict` until an operator acted. Started once more,
/// with the lost history's message still the stream's last event, it publishes the next
/// events after the notice, without a second audit or notice. (A message that is not the
/// relay's event line stays a stranger: `provenance::tests` in the relay, and `relay_order`'s foreign messages.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_started_after_an_asynchronous_failover_reconciles_past_the_lost_history() {
    let pair = StandbyPair::start("failover-relay", Replication::Asynchronous).await;
    let (a, b) = (pair.primary_db(), pair.standby_db());
    let url = pair.multi_host_url();
    let nats = NatsServer::start().await;
    let nats_url = nats.url();
    let mut relay_args = FAST.to_vec();
    relay_args.extend_from_slice(&[
        "--consumer-id",
        "relay",
        "--nats-url",
        &nats_url,
        "--stream",
        "RESTARTED",
        "--retry-delays",
        "100ms,200ms,400ms",
        "--max-attempts",
        "1000",
        "--publish-timeout",
        "1s",
    ]);
    let mut relay = spawn_relay(&url, &relay_args);
    write_many(&a, "both", 100).await;
    all_at(&a, &["relay"], 100).await;
    pair.stop_wal_receipt().await;
    write_many(&a, "lost", 100).await;
    all_at(&a, &["relay"], 200).await;
    let lost = sequenced(&a.connect().await, "p").await;
    relay.signal("KILL");
    relay.wait().await;

    pair.stop_primary_immediately();
    pair.promote_standby().await;
    // The new history, numbered before the relay starts: its reconciliation's head is 210,
    // so nothing follows the notice and the stream's last event is still the lost 200.
    write_many(&b, "new", 110).await;
    Sequencer::new(&Schema::default())
        .drain(&mut b.connect().await)
        .await
        .unwrap();
    let relay = spawn_relay(&url, &relay_args);
    all_at(&b, &["relay"], 210).await;
    assert_eq!(
        divergences(&b, "relay").await.len(),
        1,
        "{}",
        relay.stderr()
    );

    let js = nats.jetstream().await;
    // The notice (its head) and the events after it; before it, exactly the lost history.
    let relayed = || async {
        let messages = read_stream(&js, "RESTARTED").await;
        let notices: Vec<&Relayed> = messages
            .iter()
            .filter(|m| m.subject == "lifecycle.p.reconcile")
            .collect();
        assert_eq!(notices.len(), 1, "one reconciliation notice");
        assert_eq!(notices[0].body["reason"], "history_diverged");
        let events = |before: bool| -> Vec<(i64, String)> {
            messages
                .iter()
                .filter(|m| (m.stream_sequence < notices[0].stream_sequence) == before)
                .filter(|m| m.subject == "lifecycle.p.task_deleted")
                .map(|m| (m.outbox_sequence, m.msg_id.clone()))
                .collect()
        };
        assert_eq!(events(true), lost, "the lost history, then the notice");
        (
            notices[0].body["head_sequence"].as_i64().unwrap(),
            events(false),
        )
    };
    eventually(FAILOVER_WAIT, "the reconciliation notice", || async {
        read_stream(&js, "RESTARTED")
            .await
            .iter()
            .any(|m| m.subject == "lifecycle.p.reconcile")
    })
    .await;
    assert_eq!(relayed().await, (210, vec![]));

    // Started again: the stream's last event message is still the lost history's, and the
    // notice after it says it is reconciled; the next events follow the notice.
    drop(relay);
    let relay = spawn_relay(&url, &relay_args);
    write_many(&b, "after", 5).await;
    all_at(&b, &["relay"], 215).await;
    let history = sequenced(&b.connect().await, "p").await;
    eventually(FAILOVER_WAIT, "the last event relayed", || async {
        read_stream(&js, "RESTARTED")
            .await
            .last()
            .is_some_and(|m| m.body["event_id"] == history[214].1.as_str())
    })
    .await;
    let (head, after) = relayed().await;
    covered_after(&after, &history, head, "relay");
    assert_eq!(
        divergences(&b, "relay").await.len(),
        1,
        "no second divergence: {}",
        relay.stderr()
    );
}

/// The table with an SSE client that leaves at 200, in the lost tail, and comes back
/// with its last id only after the promoted primary has passed 200 with its own events, while
/// `serve` lived through the failover (its durable consumer has reconciled and handled the new
/// history, so its ring holds the new events 101..210). A bare sequence would be taken at its
/// word (200 is at or below the head, and this process handled it) and the client would miss
/// the new history's events up to 200. The id carries the identity of the event it names, so
/// the client gets `event: reconcile` (`history_diverged`) and then every later event.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_sse_client_resuming_from_the_lost_tail_after_the_new_history_passed_it_reconciles() {
    let pair = StandbyPair::start("failover-sse", Replication::Asynchronous).await;
    let (a, b) = (pair.primary_db(), pair.standby_db());
    let url = pair.multi_host_url();

    let mut serve_args = FAST.to_vec();
    serve_args.extend_from_slice(&["--consumer-id", "feed", "--keep-alive", "1s"]);
    let server = ServeProcess::start(&url, &serve_args).await;
    let path = "/v1/projects/p/events";
    ready(&server).await;
    let leaving = SseClient::open(server.addr, path, &[]).await;

    write_many(&a, "both", 100).await;
    all_at(&a, &["feed"], 100).await;
    pair.stop_wal_receipt().await;
    write_many(&a, "lost", 100).await;
    all_at(&a, &["feed"], 200).await;
    eventually(FAILOVER_WAIT, "the leaving client at 200", || async {
        sse_events(&leaving).last().map(|(s, _)| *s) == Some(200)
    })
    .await;
    let (_, lost_200) = sse_events(&leaving).last().cloned().unwrap();
    let last_id = leaving.events().last().unwrap().id.clone().unwrap();
    drop(leaving);

    pair.stop_primary_immediately();
    pair.promote_standby().await;
    write_many(&b, "new", 50).await;
    write_many(&b, "more", 60).await;
    all_at(&b, &["feed"], 210).await;
    let history = sequenced(&b.connect().await, "p").await;
    assert_eq!(history.len(), 210);
    assert_ne!(history[199].1, lost_200, "200 names another event now");

    ready(&server).await;
    let resumed = SseClient::open(server.addr, path, &[("last-event-id", &last_id)]).await;
    write_many(&b, "after", 20).await;
    all_at(&b, &["feed"], 230).await;
    let history = sequenced(&b.connect().await, "p").await;
    eventually(FAILOVER_WAIT, "the resumed client at 230", || async {
        sse_events(&resumed).last().map(|(s, _)| *s) == Some(230)
    })
    .await;
    let messages = resumed.events();
    assert_eq!(
        messages[0].event.as_deref(),
        Some("reconcile"),
        "the first message after the resume: {:?}",
        messages[0]
    );
    let (reason, head, events) = after_last_reconcile(&resumed).unwrap();
    assert_eq!(reason, "history_diverged");
    assert!(
        head >= 210,
        "reconciled at {head}, below what the history had"
    );
    covered_after(&events, &history, head, "resumed");
    assert!(
        last_id.starts_with("200:"),
        "the id carries an identity: {last_id}"
    );
    // One divergence, the durable consumer's: a client's is not audited.
    assert_eq!(divergences(&b, "feed").await.len(), 1);
}

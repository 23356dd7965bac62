//! Lanes: many events of one project handled at once, each task's events one at a time and in
//! sequence order, the cursor never ahead of an event not handled, a failing event holding
//! its task and the cursor but not the other tasks.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_consumer::handler::PartialAck;
use outbox_consumer::{
    ConsumerError, FailureClass, Handler, HandlerFailure, ObservedEvent, RetrySchedule,
};
use outbox_core::sequencer::Sequencer;
use outbox_tests::consumer_kit::{Recorder, WAIT, cursor, eventually, fast_config, start_with};
use outbox_tests::{TestDb, fresh_db};
use tokio::sync::Notify;

/// Inserts `events` events of project `p`, event `g` for task `t-(g % tasks)`, and numbers them.
async fn seed(db: &TestDb, events: i64, tasks: i64) {
    let client = db.connect().await;
    client
        .execute(
            "INSERT INTO outbox.lifecycle_outbox (project_id, event_type, event_id, task_id, \
             deleted_at, writer_process_id, payload_version, payload) \
             SELECT 'p', 'task:deleted', 'e-' || g, 't-' || (g % $2::bigint), now(), 'w', 1, \
             '{}'::jsonb FROM generate_series(1, $1::bigint) AS g",
            &[&events, &tasks],
        )
        .await
        .unwrap();
    let mut client = db.connect().await;
    Sequencer::new(&outbox_core::Schema::default())
        .drain(&mut client)
        .await
        .unwrap();
}

/// What a lanes handler saw: per task, the sequences it started and whether one runs; every
/// handled sequence; how many ran at once at most; anything that broke the rules.
#[derive(Default)]
struct Seen {
    /// Per task: the last sequence started, and whether its handler runs.
    tasks: BTreeMap<String, (i64, bool)>,
    /// Every sequence handled (the handler returned `Ok`), with how many times.
    handled: BTreeMap<i64, u32>,
    /// Broken rules, described.
    violations: Vec<String>,
    /// The most handlers running at once.
    most_at_once: usize,
    /// Acknowledgements checked.
    acks: usize,
}

/// Records start and end of every event, sleeping a random 0-20 ms between, and checks at
/// every acknowledgement (`before_ack_prefix`) that nothing at or before it is unhandled.
#[derive(Clone, Default)]
struct LaneRecorder {
    seen: Arc<Mutex<Seen>>,
    running: Arc<AtomicUsize>,
    /// Milliseconds of the longest random sleep (0: none).
    max_sleep_ms: u64,
}

impl Handler for LaneRecorder {
    async fn handle(&self, event: &ObservedEvent) -> Result<(), HandlerFailure> {
        {
            let mut seen = self.seen.lock().unwrap();
            let (last, busy) = seen
                .tasks
                .get(&event.task_id)
                .copied()
                .unwrap_or((0, false));
            if busy {
                seen.violations.push(format!(
                    "{} started while an event of {} runs",
                    event.sequence, event.task_id
                ));
            }
            if event.sequence <= last {
                seen.violations.push(format!(
                    "{} of {} started after {last}",
                    event.sequence, event.task_id
                ));
            }
            seen.tasks
                .insert(event.task_id.clone(), (event.sequence, true));
            let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
            seen.most_at_once = seen.most_at_once.max(now);
        }
        if self.max_sleep_ms > 0 {
            let ms = rand::random::<u64>() % (self.max_sleep_ms + 1);
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        let mut seen = self.seen.lock().unwrap();
        self.running.fetch_sub(1, Ordering::SeqCst);
        seen.tasks
            .insert(event.task_id.clone(), (event.sequence, false));
        *seen.handled.entry(event.sequence).or_default() += 1;
        Ok(())
    }

    async fn before_ack_prefix(&self, handled: &[ObservedEvent]) -> Result<(), PartialAck> {
        let mut seen = self.seen.lock().unwrap();
        seen.acks += 1;
        if !handled.is_sorted_by_key(|e| e.sequence) {
            seen.violations
                .push("an acknowledged prefix out of sequence order".into());
        }
        if let Some(last) = handled.last() {
            let missing: Vec<i64> = (1..=last.sequence)
                .filter(|s| !seen.handled.contains_key(s))
                .take(5)
                .collect();
            if !missing.is_empty() {
                seen.violations.push(format!(
                    "acknowledging through {} with {missing:?} not handled",
                    last.sequence
                ));
            }
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_lanes_keep_each_task_in_order_and_the_cursor_behind_every_unhandled_event() {
    let db = fresh_db().await;
    let events: i64 = 2_000;
    seed(&db, events, 97).await;
    let handler = LaneRecorder {
        max_sleep_ms: 20,
        ..LaneRecorder::default()
    };
    let mut config = fast_config("p", "c");
    config.delivery.lanes = 16;
    config.delivery.batch_size = 100;
    config.delivery.max_batch_size = 400;
    config.delivery.max_ahead = 400;
    let (stop, run) = start_with(&db, config, handler.clone(), Recorder::default());
    // The committed cursor, read over and over while the lanes run: never ahead of an event
    // not handled (the handler records an event before it returns, so before its ack).
    let mut cursors = 0;
    let mut highest = 0;
    loop {
        let at = cursor(&db, "p", "c").await.unwrap_or(0);
        {
            let seen = handler.seen.lock().unwrap();
            let missing: Vec<i64> = (1..=at)
                .filter(|s| !seen.handled.contains_key(s))
                .take(5)
                .collect();
            assert!(
                missing.is_empty(),
                "cursor {at} with {missing:?} not handled"
            );
        }
        assert!(at >= highest, "the cursor went back from {highest} to {at}");
        highest = at;
        cursors += 1;
        if at == events {
            break;
        }
        assert!(!run.is_finished(), "the consumer stopped: {:?}", run.await);
    }
    stop.cancel();
    let summary = run.await.unwrap().unwrap();
    let seen = handler.seen.lock().unwrap();
    assert!(seen.violations.is_empty(), "{:?}", seen.violations);
    assert_eq!(seen.handled.len() as i64, events, "every event handled");
    assert!(
        seen.handled.values().all(|&n| n == 1),
        "no event handled twice in one run"
    );
    assert_eq!(summary.delivered, events as u64);
    assert!(
        (2..=16).contains(&seen.most_at_once),
        "up to 16 at once, and more than one: {}",
        seen.most_at_once
    );
    assert!(
        seen.acks > 1 && cursors > 1,
        "acks {}, cursors read {cursors}",
        seen.acks
    );
}

/// Fails every attempt of one event; its second attempt waits at a gate first.
#[derive(Clone)]
struct Poison {
    inner: LaneRecorder,
    poison: i64,
    /// Opened by the test: the poison's second attempt then fails.
    gate: Arc<Notify>,
    /// Attempts of the poison event started.
    attempts: Arc<Mutex<Vec<u32>>>,
    /// Sequences handled, in the order their handlers ended.
    order: Arc<Mutex<Vec<i64>>>,
}

impl Handler for Poison {
    async fn handle(&self, event: &ObservedEvent) -> Result<(), HandlerFailure> {
        if event.sequence == self.poison {
            self.attempts.lock().unwrap().push(event.attempt);
            if event.attempt == 2 {
                self.gate.notified().await;
            }
            self.order.lock().unwrap().push(-event.sequence);
            return Err(FailureClass::new("poison").unwrap().into());
        }
        self.inner.handle(event).await?;
        self.order.lock().unwrap().push(event.sequence);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_event_holds_its_task_and_the_cursor_until_it_is_parked() {
    let db = fresh_db().await;
    // 26 tasks, 10 events each: event g is task t-(g % 26).
    let (events, tasks) = (260_i64, 26_i64);
    seed(&db, events, tasks).await;
    // The third event of task t-3: sequences 3, 29, 55, ...
    let poison = 55;
    let task_a = |s: i64| s % tasks == poison % tasks;
    let handler = Poison {
        inner: LaneRecorder::default(),
        poison,
        gate: Arc::default(),
        attempts: Arc::default(),
        order: Arc::default(),
    };
    let mut config = fast_config("p", "c");
    config.delivery.lanes = 8;
    config.delivery.batch_size = 20;
    config.delivery.max_batch_size = 20;
    config.delivery.max_ahead = 500;
    config.delivery.retry = RetrySchedule::new(vec![Duration::from_millis(20)], 3).unwrap();
    let (stop, run) = start_with(&db, config, handler.clone(), Recorder::default());

    // While the poison event's second attempt runs: every other task is done, the poison's
    // task waits, and the cursor stands right before it.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let others_left: Vec<i64> = {
            let seen = handler.inner.seen.lock().unwrap();
            (1..=events)
                .filter(|&s| !task_a(s) && !seen.handled.contains_key(&s))
                .collect()
        };
        let at = cursor(&db, "p", "c").await;
        if others_left.is_empty() && at == Some(poison - 1) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline && !run.is_finished(),
            "waiting for the other tasks handled and the cursor before the poison: cursor \
             {at:?}, other events left {others_left:?}, the poison's attempts {:?}, run \
             finished: {}",
            handler.attempts.lock().unwrap(),
            run.is_finished()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(*handler.attempts.lock().unwrap(), [1, 2]);
    {
        let seen = handler.inner.seen.lock().unwrap();
        let later: Vec<i64> = (poison + 1..=events)
            .filter(|&s| task_a(s) && seen.handled.contains_key(&s))
            .collect();
        assert!(later.is_empty(), "the poison's task went on: {later:?}");
    }
    let client = db.connect().await;
    let retrying: i64 = client
        .query_one(
            "SELECT count(*) FROM outbox.lifecycle_deliveries WHERE sequence = $1 AND state = 'retrying'",
            &[&poison],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(retrying, 1, "its first failure is saved for the retry");

    // Let it fail: after its third attempt it is parked, and the stream moves on.
    handler.gate.notify_one();
    eventually(WAIT, "the cursor at the end", || async {
        cursor(&db, "p", "c").await == Some(events)
    })
    .await;
    stop.cancel();
    run.await.unwrap().unwrap();
    assert_eq!(*handler.attempts.lock().unwrap(), [1, 2, 3]);
    let state: String = client
        .query_one(
            "SELECT state FROM outbox.lifecycle_deliveries WHERE sequence = $1",
            &[&poison],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(state, "dead");
    let poisoned: i64 = client
        .query_one(
            "SELECT count(*) FROM outbox.lifecycle_audit WHERE kind = 'lifecycle-observation:consumer-poisoned'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(poisoned, 1, "parking audited once");
    let order = handler.order.lock().unwrap();
    let parked_at = order
        .iter()
        .rposition(|&s| s == -poison)
        .expect("the poison's last attempt");
    let task_a_after: Vec<i64> = order[parked_at + 1..]
        .iter()
        .copied()
        .filter(|&s| task_a(s))
        .collect();
    let expected: Vec<i64> = (poison + 1..=events).filter(|&s| task_a(s)).collect();
    assert_eq!(
        task_a_after, expected,
        "the task's later events after, in order"
    );
    let seen = handler.inner.seen.lock().unwrap();
    assert!(seen.violations.is_empty(), "{:?}", seen.violations);
    assert_eq!(
        seen.handled.len() as i64,
        events - 1,
        "all but the poison handled"
    );
}

/// A handler that needs the stream's total order refuses lanes.
struct TotalOrder;

impl Handler for TotalOrder {
    fn needs_total_order(&self) -> bool {
        true
    }

    async fn handle(&self, _: &ObservedEvent) -> Result<(), HandlerFailure> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanes_are_refused_for_a_handler_that_needs_total_order() {
    let db = fresh_db().await;
    let mut config = fast_config("p", "c");
    config.delivery.lanes = 4;
    let (_stop, run) = start_with(&db, config.clone(), TotalOrder, Recorder::default());
    let error = run.await.unwrap().unwrap_err();
    assert!(matches!(error, ConsumerError::Config(_)), "{error:?}");
    assert!(
        error.to_string().contains("lanes 4 refused")
            && error.to_string().contains("needs_total_order"),
        "{error}"
    );
    // One lane is the stream's order: it runs.
    config.delivery.lanes = 1;
    config.delivery.exit_when_caught_up = true;
    let (_stop, run) = start_with(&db, config, TotalOrder, Recorder::default());
    run.await.unwrap().unwrap();
    let client = db.connect().await;
    let registered: i64 = client
        .query_one("SELECT count(*) FROM outbox.lifecycle_consumers", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(registered, 1, "the refused run registered nothing");
}

/// `outbox consume --lanes 16` killed -9 at random moments of a catch-up, then run to the end:
/// every event printed, each task's events in order within every run, and what a run prints
/// again is at most `--max-ahead` events per kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_with_lanes_loses_nothing_and_repeats_at_most_max_ahead_per_kill() {
    use outbox_tests::consumer_kit::PROCESS_WAIT;
    use outbox_tests::process_kit::ConsumeProcess;
    use rand::Rng;

    let db = fresh_db().await;
    let events: i64 = 40_000;
    seed(&db, events, 500).await;
    let max_ahead: usize = 600;
    let max_ahead_arg = max_ahead.to_string();
    let args = [
        "--project",
        "p",
        "--consumer-id",
        "c",
        "--start-from",
        "earliest",
        "--lanes",
        "16",
        "--max-ahead",
        &max_ahead_arg,
        "--batch-size",
        "200",
        "--lease-ttl",
        "3s",
        "--heartbeat-interval",
        "300ms",
        "--poll-interval",
        "100ms",
    ];
    let mut runs: Vec<Vec<(i64, String)>> = Vec::new();
    let kills = 5;
    for _ in 0..kills {
        let printed = cursor(&db, "p", "c").await.unwrap_or(0);
        let run = ConsumeProcess::spawn(&db.url, &args);
        // A random moment: after a random number of lines of this run.
        let lines = rand::rng().random_range(1..2_000);
        eventually(PROCESS_WAIT, "lines printed by this run", || async {
            run.sequences().len() >= lines || printed + lines as i64 > events
        })
        .await;
        run.signal("KILL");
        let mut run = run;
        run.wait().await;
        runs.push(task_lines(&run));
    }
    let mut last_args = args.to_vec();
    last_args.push("--exit-when-caught-up");
    let mut last = ConsumeProcess::spawn(&db.url, &last_args);
    assert_eq!(last.wait().await, 0, "{}", last.stderr());
    runs.push(task_lines(&last));
    assert_eq!(cursor(&db, "p", "c").await, Some(events));

    let mut times: BTreeMap<i64, usize> = BTreeMap::new();
    for (index, run) in runs.iter().enumerate() {
        let mut last_of_task: BTreeMap<&str, i64> = BTreeMap::new();
        for (sequence, task) in run {
            *times.entry(*sequence).or_default() += 1;
            let before = last_of_task.insert(task, *sequence).unwrap_or(0);
            assert!(
                before < *sequence,
                "run {index}: {sequence} of {task} after {before}"
            );
        }
    }
    let missing: Vec<i64> = (1..=events)
        .filter(|s| !times.contains_key(s))
        .take(10)
        .collect();
    assert!(missing.is_empty(), "never printed: {missing:?}");
    let repeated: usize = times.values().map(|n| n - 1).sum();
    assert!(
        repeated <= kills * max_ahead,
        "{repeated} events printed again after {kills} kills with --max-ahead {max_ahead}"
    );
}

/// The (sequence, task) of every event line of a run, in order.
fn task_lines(run: &outbox_tests::process_kit::ConsumeProcess) -> Vec<(i64, String)> {
    run.lines()
        .iter()
        .filter(|l| l.value["type"] == "event")
        .map(|l| {
            (
                l.value["sequence"].as_i64().expect("sequence"),
                l.value["task_id"].as_str().expect("task_id").to_owned(),
            )
        })
        .collect()
}

/// A child of `consume --lanes` that answers odd sequences at once and even ones 50 ms later
/// from a background shell: answers in any order. It logs what it receives and acknowledges.
const ANY_ORDER_CHILD: &str = r#"
while IFS= read -r line; do
  seq=$(printf '%s' "$line" | sed -n 's/.*"sequence":\([0-9]*\).*/\1/p')
  task=$(printf '%s' "$line" | sed -n 's/.*"task_id":"\([^"]*\)".*/\1/p')
  printf '%s %s\n' "$seq" "$task" >> "$LANES_DIR/received"
  if [ $((seq % 2)) -eq 0 ]; then
    ( sleep 0.05; printf '%s\n' "$seq" >> "$LANES_DIR/acked"; printf '{"ack": %s}\n' "$seq" ) &
  else
    printf '%s\n' "$seq" >> "$LANES_DIR/acked"
    printf '{"ack": %s}\n' "$seq"
  fi
done
wait
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_with_lanes_has_several_events_at_once_and_answers_in_any_order() {
    use outbox_tests::process_kit::ConsumeProcess;

    let db = fresh_db().await;
    let events: i64 = 120;
    seed(&db, events, 12).await;
    let dir = std::env::temp_dir().join(format!("outbox-lanes-child-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dir_arg = dir.to_str().unwrap().to_owned();
    let mut consumer = ConsumeProcess::spawn_with_env(
        &db.url,
        "consume",
        &[
            "--project",
            "p",
            "--consumer-id",
            "c",
            "--start-from",
            "earliest",
            "--lanes",
            "8",
            "--batch-size",
            "50",
            "--child",
            ANY_ORDER_CHILD,
            "--exit-when-caught-up",
        ],
        &[("LANES_DIR", &dir_arg)],
    );
    assert_eq!(consumer.wait().await, 0, "{}", consumer.stderr());
    assert_eq!(cursor(&db, "p", "c").await, Some(events));
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap();
    let received = read("received");
    let acked: Vec<i64> = read("acked").lines().map(|l| l.parse().unwrap()).collect();
    std::fs::remove_dir_all(&dir).unwrap();
    let mut last_of_task: BTreeMap<&str, i64> = BTreeMap::new();
    let mut count = 0;
    for line in received.lines() {
        let (sequence, task) = line.split_once(' ').unwrap();
        let sequence: i64 = sequence.parse().unwrap();
        let before = last_of_task.insert(task, sequence).unwrap_or(0);
        assert!(
            before < sequence,
            "{sequence} of {task} sent after {before}"
        );
        count += 1;
    }
    assert_eq!(count, events, "each event sent once");
    assert_eq!(acked.len() as i64, events);
    assert!(
        !acked.is_sorted(),
        "answers in sequence order only: the events went one at a time"
    );
}

#[tokio::test]
async fn bad_lanes_are_refused_with_the_option_named() {
    use outbox_tests::process_kit::outbox_on;

    let db = fresh_db().await;
    let consume = ["consume", "--project", "p", "--consumer-id", "c"];
    let cases: [(&[&str], &str); 5] = [
        (&["--lanes", "0"], "--lanes"),
        (&["--lanes", "257"], "1..=256"),
        (&["--lanes", "-3"], "--lanes"),
        (
            &["--lanes", "4", "--max-ahead", "100"],
            "--max-ahead 100 is smaller than --batch-size 500",
        ),
        (
            &["--lanes", "4", "--max-ahead", "100001"],
            "--max-ahead 100001 is above the ceiling of 100000",
        ),
    ];
    for (extra, expected) in cases {
        let mut args = consume.to_vec();
        args.extend_from_slice(extra);
        let (code, _, err) = outbox_on(&db, &args).await;
        assert_eq!(code, 2, "{extra:?}: {err}");
        assert!(err.contains(expected), "{extra:?}: {err}");
    }
    // The same for serve; relay nats keeps one lane and has no such option.
    let (code, _, err) = outbox_on(
        &db,
        &[
            "serve",
            "--project",
            "p",
            "--consumer-id",
            "c",
            "--lanes",
            "0",
        ],
    )
    .await;
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = outbox_on(
        &db,
        &[
            "relay",
            "nats",
            "--project",
            "p",
            "--consumer-id",
            "c",
            "--lanes",
            "4",
        ],
    )
    .await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--lanes"), "{err}");
    let client = db.connect().await;
    let registered: i64 = client
        .query_one("SELECT count(*) FROM outbox.lifecycle_consumers", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(registered, 0, "nothing registered");
}

/// A consumer set runs every pair with the lanes of its template: two projects, each caught up
/// in full, each task in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_set_runs_its_pairs_in_lanes() {
    use outbox_tests::process_kit::ConsumeProcess;

    let db = fresh_db().await;
    seed(&db, 3_000, 40).await;
    {
        let client = db.connect().await;
        client
            .execute(
                "INSERT INTO outbox.lifecycle_outbox (project_id, event_type, event_id, task_id, \
                 deleted_at, writer_process_id, payload_version, payload) \
                 SELECT 'q', 'task:deleted', 'e-' || g, 't-' || (g % 7), now(), 'w', 1, \
                 '{}'::jsonb FROM generate_series(1, 2000) AS g",
                &[],
            )
            .await
            .unwrap();
        let mut client = db.connect().await;
        Sequencer::new(&outbox_core::Schema::default())
            .drain(&mut client)
            .await
            .unwrap();
    }
    let mut set = ConsumeProcess::spawn(
        &db.url,
        &[
            "--project",
            "p",
            "--project",
            "q",
            "--consumer-id",
            "c",
            "--start-from",
            "earliest",
            "--lanes",
            "8",
            "--exit-when-caught-up",
        ],
    );
    assert_eq!(set.wait().await, 0, "{}", set.stderr());
    assert_eq!(cursor(&db, "p", "c").await, Some(3_000));
    assert_eq!(cursor(&db, "q", "c").await, Some(2_000));
    let mut last: BTreeMap<(String, String), i64> = BTreeMap::new();
    let mut count = 0;
    for line in set.lines() {
        if line.value["type"] != "event" {
            continue;
        }
        let project = line.value["project_id"].as_str().unwrap().to_owned();
        let task = line.value["task_id"].as_str().unwrap().to_owned();
        let sequence = line.value["sequence"].as_i64().unwrap();
        let before = last.insert((project, task), sequence).unwrap_or(0);
        assert!(before < sequence, "{sequence} after {before}");
        count += 1;
    }
    assert_eq!(count, 5_000, "each event printed once");
}

/// `outbox serve --lanes` with a child answering in any order: clients still receive the
/// project's events in sequence order, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_with_lanes_streams_events_in_sequence_order() {
    use outbox_tests::serve_kit::{ServeProcess, SseClient, get};

    let db = fresh_db().await;
    let dir = std::env::temp_dir().join(format!("outbox-lanes-serve-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dir_arg = dir.to_str().unwrap().to_owned();
    let server = ServeProcess::start_with_env(
        &db.url,
        &[
            "--project",
            "p",
            "--consumer-id",
            "feed",
            "--start-from",
            "earliest",
            "--lanes",
            "8",
            "--child",
            ANY_ORDER_CHILD,
        ],
        &[("LANES_DIR", &dir_arg)],
    )
    .await;
    let addr = server.addr;
    eventually(WAIT, "/readyz answers 200", || async move {
        matches!(get(addr, "/readyz", &[]).await, Ok((200, _, _)))
    })
    .await;
    let live = SseClient::open(server.addr, "/v1/projects/p/events", &[]).await;
    let events: i64 = 300;
    seed(&db, events, 30).await;
    // 300 events through a shell child take 4 s alone and 13 s beside two other runs and two
    // busy loops on this 2-core host: a minute, not `WAIT`.
    eventually(
        Duration::from_secs(60),
        "every event on the live client",
        || {
            let n = live.sequences().len() as i64;
            async move { n >= events }
        },
    )
    .await;
    assert_eq!(live.sequences(), (1..=events).collect::<Vec<_>>());
    // The lanes' gauges: nothing running and nothing ahead of the cursor once it is all done.
    let labels = [("project", "p"), ("consumer", "feed")];
    eventually(WAIT, "the lanes' gauges at rest", || {
        let server = &server;
        async move {
            let metrics = server.metrics().await;
            metrics.get("outbox_lanes_busy", &labels) == Some(0.0)
                && metrics.get("outbox_events_ahead_of_cursor", &labels) == Some(0.0)
        }
    })
    .await;
    let acked: Vec<i64> = std::fs::read_to_string(dir.join("acked"))
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        !acked.is_sorted(),
        "the child answered in sequence order only"
    );
}

//! The sequencer election with real processes (`outbox sequence --every`): kill -9 of the
//! leader under live writers, a paused leader, and two leaders racing after a lease expiry.
//! In each case: a follower takes over, and at the end every committed event is numbered
//! exactly once, each project's numbers are exactly 1..n, and the heads agree.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use outbox_core::Schema;
use outbox_core::sequencer::{ElectedSequencer, Sequencer};
use outbox_tests::consumer_kit::{PROCESS_WAIT as WAIT, Writers, eventually};
use outbox_tests::process_kit::OutboxProcess;
use outbox_tests::{TestDb, fresh_db, sequenced};
use rand::Rng;

const PROJECTS: &[&str] = &["red", "green", "blue"];

/// Starts one candidate: `outbox sequence --every 20ms --lease-ttl TTL`.
fn candidate(db: &TestDb, ttl: &str) -> OutboxProcess {
    OutboxProcess::spawn_command(
        &db.url,
        "sequence",
        &["--every", "20ms", "--lease-ttl", ttl, "--batch-size", "7"],
    )
}

/// The lease row: (owner, generation, whether it is unexpired).
async fn lease(db: &TestDb) -> (Option<String>, i64, bool) {
    let client = db.connect().await;
    let row = client
        .query_one(
            "SELECT owner, generation, COALESCE(expires_at > now(), false) \
             FROM outbox.lifecycle_sequencer_lease",
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1), row.get(2))
}

/// The PID in an owner token (`host:pid:suffix`).
fn owner_pid(owner: &str) -> u32 {
    owner.split(':').nth(1).unwrap().parse().unwrap()
}

/// Waits for an unexpired lease held by one of `processes` with a generation above `after`;
/// returns (index of the leader, generation).
/// On a timeout it shows the lease row and every candidate's log.
async fn leader(db: &TestDb, processes: &[OutboxProcess], after: i64) -> (usize, i64) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (owner, generation, live) = lease(db).await;
        if let Some(owner) = owner.as_deref().filter(|_| live && generation > after) {
            let pid = owner_pid(owner);
            if let Some(index) = processes.iter().position(|p| p.pid() == pid) {
                return (index, generation);
            }
        }
        if tokio::time::Instant::now() >= deadline {
            let logs: Vec<String> = processes.iter().map(|p| p.stderr()).collect();
            panic!(
                "timed out after {WAIT:?} waiting for a sequencer leader above generation \
                 {after}; the lease: owner {owner:?}, generation {generation}, live {live}; \
                 the candidates' logs:\n{}",
                logs.join("\n---\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until committed events are being numbered again (the count of numbered events grows
/// past `beyond`).
async fn numbering_resumes(db: &TestDb, beyond: i64) {
    eventually(WAIT, "numbering to resume", || async move {
        numbered(db).await > beyond
    })
    .await;
}

async fn numbered(db: &TestDb) -> i64 {
    db.connect()
        .await
        .query_one(
            "SELECT count(*) FROM outbox.lifecycle_outbox WHERE sequence IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// Waits until nothing is left unnumbered, then checks every project: numbers exactly 1..n,
/// every committed event numbered exactly once, nothing else numbered, heads equal to n.
async fn assert_numbered_exactly_once(db: &TestDb, committed: &[(String, String)]) {
    eventually(
        WAIT,
        "every committed event to be numbered",
        || async move {
            let client = db.connect().await;
            let left: i64 = client
                .query_one(
                    "SELECT count(*) FROM outbox.lifecycle_outbox WHERE sequence IS NULL",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            left == 0
        },
    )
    .await;
    let client = db.connect().await;
    for project in PROJECTS {
        let rows = sequenced(&client, project).await;
        let numbers: Vec<i64> = rows.iter().map(|(s, _)| *s).collect();
        let expected: Vec<i64> = (1..=rows.len() as i64).collect();
        assert_eq!(numbers, expected, "project {project}: not exactly 1..n");
        let ids: BTreeSet<&str> = rows.iter().map(|(_, id)| id.as_str()).collect();
        assert_eq!(
            ids.len(),
            rows.len(),
            "project {project}: an event numbered twice"
        );
        let wanted: BTreeSet<&str> = committed
            .iter()
            .filter(|(p, _)| p == project)
            .map(|(_, id)| id.as_str())
            .collect();
        assert_eq!(ids, wanted, "project {project}: numbered != committed");
        let head: i64 = client
            .query_one(
                "SELECT head_sequence FROM outbox.lifecycle_project_heads WHERE project_id = $1",
                &[&project],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(head, rows.len() as i64, "project {project}: head");
    }
    assert!(
        committed.len() > 50,
        "too few events to mean anything: {}",
        committed.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_of_the_leader_under_writers_loses_and_doubles_nothing() {
    let db = fresh_db().await;
    let mut processes: Vec<OutboxProcess> = (0..3).map(|_| candidate(&db, "1s")).collect();
    let writers = Writers::start(&db, 4, PROJECTS, 2..12);
    let mut generation = 0;
    for round in 0..2 {
        let (index, held) = leader(&db, &processes, generation).await;
        generation = held;
        // Let the leader number under load, then kill it mid-stream.
        let before = numbered(&db).await;
        numbering_resumes(&db, before).await;
        tokio::time::sleep(Duration::from_millis(rand::rng().random_range(50..300))).await;
        let mut dead = processes.remove(index);
        dead.signal("KILL");
        assert_eq!(dead.wait().await, -1, "round {round}: killed by a signal");
        // A follower takes over and numbering goes on.
        let (_, next) = leader(&db, &processes, generation).await;
        assert!(next > generation, "round {round}: a new generation");
        let stalled = numbered(&db).await;
        numbering_resumes(&db, stalled).await;
        processes.push(candidate(&db, "1s"));
    }
    let committed = writers.stop_after(51).await;
    assert_numbered_exactly_once(&db, &committed).await;
    assert!(
        !processes.iter().any(|p| p.stderr().contains("ERROR")),
        "a candidate logged an error"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_leader_is_replaced_and_resumes_without_harm() {
    let db = fresh_db().await;
    let processes: Vec<OutboxProcess> = (0..2).map(|_| candidate(&db, "1s")).collect();
    let writers = Writers::start(&db, 4, PROJECTS, 2..12);
    let (index, generation) = leader(&db, &processes, 0).await;
    let paused = &processes[index];
    paused.signal("STOP");
    // The lease runs out; the other candidate takes over and numbers while it sleeps.
    let (successor, next) = leader(&db, &processes, generation).await;
    assert_ne!(successor, index, "the paused process cannot have renewed");
    let stalled = numbered(&db).await;
    numbering_resumes(&db, stalled).await;
    let written = writers.count();
    paused.signal("CONT");
    // Writing goes on after the resumed process wakes up believing, for a moment, that it
    // may still lead.
    eventually(WAIT, "more writes after the resume", || async {
        writers.count() > written + 40
    })
    .await;
    let committed = writers.stop_after(51).await;
    assert_numbered_exactly_once(&db, &committed).await;
    let (owner, last, _) = lease(&db).await;
    assert!(last >= next, "generations never go back");
    assert!(owner.is_some(), "someone still leads");
    eventually(WAIT, "the resumed process to step down", || async {
        let log = processes[index].stderr();
        log.contains("stepping down") || log.contains("following")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn candidates_racing_for_an_expired_lease_elect_one_at_a_time() {
    let db = fresh_db().await;
    // A lease long enough that only the test's expiries make elections: with 1 s, a
    // candidate starved of CPU for 0.8 s on a loaded host lets its lease run out by itself,
    // and a second election in a round is the design working, not a double winner.
    let processes: Vec<OutboxProcess> = (0..3).map(|_| candidate(&db, "5s")).collect();
    let writers = Writers::start(&db, 4, PROJECTS, 2..12);
    let (_, mut generation) = leader(&db, &processes, 0).await;
    let client = db.connect().await;
    for _ in 0..3 {
        let before = numbered(&db).await;
        numbering_resumes(&db, before).await;
        // Expire the lease as if the leader had stalled for a TTL: every candidate races for
        // it at its next look, the old leader at its next renewal.
        client
            .execute(
                "UPDATE outbox.lifecycle_sequencer_lease SET expires_at = now()",
                &[],
            )
            .await
            .unwrap();
        let (_, next) = leader(&db, &processes, generation).await;
        assert_eq!(next, generation + 1, "one winner per expiry");
        generation = next;
    }
    let committed = writers.stop_after(51).await;
    assert_numbered_exactly_once(&db, &committed).await;
}

/// Two processes that both believe they lead (the old leader has not yet found out at a
/// renewal that its lease expired and was taken) tick side by side under writers: the
/// transaction-level sequencer lock still makes them number one at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_leaders_after_a_lease_expiry_number_one_at_a_time() {
    let db = fresh_db().await;
    let schema = Schema::default();
    // A long lease: the old leader's next renewal (at a quarter of it) comes after the race.
    let ttl = Duration::from_secs(40);
    let elect = |owner: &str| {
        ElectedSequencer::new(
            Sequencer::new(&schema).with_batch(3),
            &schema,
            owner.to_owned(),
            ttl,
            Duration::from_millis(5),
        )
    };
    let (mut old, mut follower) = (elect("old:1:a"), elect("follower:2:b"));
    let mut old_client = db.connect().await;
    old.step(&mut old_client).await.unwrap();
    follower.step(&mut db.connect().await).await.unwrap();
    assert_eq!(old.generation(), Some(1));
    assert_eq!(follower.generation(), None, "the lease is held");
    // The old leader's lease expires behind its back; another candidate takes it.
    let admin = db.connect().await;
    admin
        .execute(
            "UPDATE outbox.lifecycle_sequencer_lease SET expires_at = now()",
            &[],
        )
        .await
        .unwrap();
    let mut new = elect("new:3:c");
    let mut new_client = db.connect().await;
    new.step(&mut new_client).await.unwrap();
    assert_eq!(new.generation(), Some(2));
    assert_eq!(
        old.generation(),
        Some(1),
        "the old leader has not found out"
    );

    let writers = Writers::start(&db, 4, PROJECTS, 2..12);
    let stop = Arc::new(AtomicBool::new(false));
    let race = [(old, old_client), (new, new_client)].map(|(mut elected, mut client)| {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut steps = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let delay = elected.step(&mut client).await.unwrap();
                steps += 1;
                tokio::time::sleep(delay.min(Duration::from_millis(3))).await;
            }
            (elected, steps)
        })
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    let committed = writers.stop_after(51).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    let mut still_leading = 0;
    for task in race {
        let (elected, steps) = task.await.unwrap();
        assert!(steps > 20, "each leader ticked throughout: {steps}");
        still_leading += usize::from(elected.generation().is_some());
    }
    assert_eq!(
        still_leading, 2,
        "both believed they led for the whole race"
    );
    assert_numbered_exactly_once(&db, &committed).await;
}

/// A leader killed with -9 and a new candidate started at once, both with a lease of 120 s:
/// the new process takes the lease over at its first look, because the holder's PID no longer
/// exists on this host, instead of waiting out the dead leader's lease (and up to a quarter
/// of it more). The wait below is a sixth of the lease: without the take-over the lease could
/// not have changed hands in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_killed_on_this_host_is_replaced_at_once_not_after_its_lease() {
    let db = fresh_db().await;
    let mut dead = candidate(&db, "120s");
    let (_, generation) = leader(&db, std::slice::from_ref(&dead), 0).await;
    let dead_pid = dead.pid();
    dead.signal("KILL");
    // Reaped: its PID exists no more.
    assert_eq!(dead.wait().await, -1, "killed by a signal");
    let (owner, held, live) = lease(&db).await;
    assert_eq!(
        (owner.map(|o| owner_pid(&o)), held, live),
        (Some(dead_pid), generation, true),
        "the dead leader's lease is still unexpired"
    );
    let successor = [candidate(&db, "120s")];
    let writers = Writers::start(&db, 2, PROJECTS, 2..12);
    let (index, next) = leader(&db, &successor, generation).await;
    assert_eq!((index, next), (0, generation + 1), "taken over at once");
    let stalled = numbered(&db).await;
    numbering_resumes(&db, stalled).await;
    let committed = writers.stop_after(51).await;
    assert_numbered_exactly_once(&db, &committed).await;
    assert!(
        successor[0]
            .stderr()
            .contains("the sequencer lease holder no longer exists on this host"),
        "{}",
        successor[0].stderr()
    );
}

/// Writes `count` events to project `p`, one every `gap`, then waits until all are numbered;
/// returns how many ticks numbered them (each tick is one transaction, so its events share
/// one `sequenced_at`) and how long the writing took.
async fn ticks_for_a_steady_stream(db: &TestDb, count: usize, gap: Duration) -> (i64, Duration) {
    let client = db.connect().await;
    let started = tokio::time::Instant::now();
    for i in 0..count {
        client
            .execute(
                "SELECT outbox.write_task_deleted('p', 'steady-' || $1::text, now(), 'w')",
                &[&i.to_string()],
            )
            .await
            .unwrap();
        tokio::time::sleep(gap).await;
    }
    let writing = started.elapsed();
    eventually(WAIT, "every event to be numbered", || async {
        numbered(db).await == count as i64
    })
    .await;
    let ticks = client
        .query_one(
            "SELECT count(DISTINCT sequenced_at) FROM outbox.lifecycle_outbox",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    (ticks, writing)
}

/// `--min-tick-pause` holds between busy ticks, for `outbox sequence --every` and for the
/// sequencer a consumer process runs: a stream of one event every 10 ms or more (1.5 s, longer
/// on a loaded host) is numbered in about one tick per 100 ms of it with a 100 ms pause (one
/// tick per event without it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minimum_tick_pause_numbers_a_steady_stream_in_fewer_ticks() {
    let starts: [(&str, &[&str]); 2] = [
        (
            "sequence",
            &["--every", "200ms", "--min-tick-pause", "100ms"],
        ),
        (
            "consume",
            &[
                "--project",
                "p",
                "--consumer-id",
                "c",
                "--sequence-interval",
                "200ms",
                "--min-tick-pause",
                "100ms",
            ],
        ),
    ];
    for (command, args) in starts {
        let db = fresh_db().await;
        let process = OutboxProcess::spawn_command(&db.url, command, args);
        eventually(WAIT, "the process to lead the sequencer", || async {
            lease(&db).await.2
        })
        .await;
        let (ticks, writing) = ticks_for_a_steady_stream(&db, 150, Duration::from_millis(10)).await;
        let most = (writing.as_millis() / 100) as i64 + 5;
        assert!(
            ticks >= 2 && ticks <= most.min(75),
            "{command}: 150 events written over {writing:?} in {ticks} ticks with \
             --min-tick-pause 100ms (at most {most} expected); log:\n{}",
            process.stderr()
        );
        drop(process);
    }
}

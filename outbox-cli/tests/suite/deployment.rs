//! The deployment the README tells users to run, run end to end: every long-running command
//! (`consume` with stdout, with `--child` and with `--child --lanes`, `consume --all-projects`,
//! `serve`, `relay nats`, `sequence --every`) logs in as a role that holds only `outbox_consumer` (and `SELECT` on the
//! application's table, for the default live query); services write as an `outbox_writer`
//! role and operators act as an `outbox_operator` role. Each command goes through one shared
//! scenario: a reconciliation at its first start (a new consumer, or one whose cursor is
//! above the head: a divergence), writes, a dead letter parked and replayed, kill -9 and a
//! restart, SIGTERM. Every consumer declares `task:archived@1` beside `task:deleted@1`: the
//! operator registers its contract, the writer records archivals with `write_event` beside
//! its deletions, and every one of them is delivered (the relay's on its own subject). The
//! matrix: row security off and on (each role bound to its projects), over the Unix socket,
//! through PgBouncer in transaction mode, and over TLS.

use std::path::{Path, PathBuf};
use std::time::Duration;

use outbox_core::Schema;
use outbox_core::connect::ConnectSettings;
use outbox_core::internal::Unnamed as _;
use outbox_tests::consumer_kit::eventually;
use outbox_tests::nats_kit::{NatsServer, read_stream};
use outbox_tests::pgbouncer::PgBouncer;
use outbox_tests::process_kit::{OutboxProcess, run_outbox};
use outbox_tests::serve_kit::{SseClient, free_port};
use outbox_tests::tls_cluster::TlsCluster;
use outbox_tests::{TASKS_TABLE, fresh_db};
use tokio_postgres::Client;

const WAIT: Duration = Duration::from_secs(60);

/// Options every consumer process of the scenario shares: quick polls and retries, no
/// retention sweep (the consumer role may not prune; the README says `--no-prune`).
const CONSUMER_OPTIONS: &[&str] = &[
    "--lease-ttl",
    "5s",
    "--heartbeat-interval",
    "300ms",
    "--poll-interval",
    "200ms",
    "--shutdown-grace",
    "3s",
    "--retry-delays",
    "100ms",
    "--max-attempts",
    "2",
    "--no-prune",
    "--event-types",
    "task:deleted@1,task:archived@1",
];

/// The long-running commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Command {
    ConsumeStdout,
    ConsumeChild,
    ConsumeChildLanes,
    ConsumeAllProjects,
    Serve,
    RelayNats,
    SequenceEvery,
}

const COMMANDS: [Command; 7] = [
    Command::ConsumeStdout,
    Command::ConsumeChild,
    Command::ConsumeChildLanes,
    Command::ConsumeAllProjects,
    Command::Serve,
    Command::RelayNats,
    Command::SequenceEvery,
];

impl Command {
    fn tag(self) -> &'static str {
        match self {
            Command::ConsumeStdout => "stdout",
            Command::ConsumeChild => "child",
            Command::ConsumeChildLanes => "lanes",
            Command::ConsumeAllProjects => "all",
            Command::Serve => "serve",
            Command::RelayNats => "relay",
            Command::SequenceEvery => "seq",
        }
    }

    /// The projects its scenario writes to.
    fn projects(self) -> &'static [&'static str] {
        match self {
            Command::ConsumeAllProjects => &["pa", "pb"],
            _ => &["p1"],
        }
    }
}

/// One database of a deployment: migrated by its owner, with a writer, a consumer and an
/// operator login role holding only the documented roles.
struct Site {
    command: Command,
    row_security: bool,
    /// The owner's URL (the test's own view, always direct).
    owner: String,
    /// The processes' URL for `role`: replace `ROLE` with the login role.
    template: String,
    /// Environment of every `outbox` process (the pooler mode).
    env: Vec<(&'static str, &'static str)>,
    /// The login roles: writer, consumer, operator.
    roles: [String; 3],
}

impl Site {
    fn url(&self, role: &str) -> String {
        self.template.replacen("ROLE@", &format!("{role}@"), 1)
    }

    fn writer(&self) -> String {
        self.url(&self.roles[0])
    }

    fn consumer(&self) -> String {
        self.url(&self.roles[1])
    }

    fn operator(&self) -> String {
        self.url(&self.roles[2])
    }

    async fn owner(&self) -> Client {
        connect(&self.owner).await
    }

    fn what(&self) -> String {
        format!(
            "{:?} with row security {}",
            self.command,
            if self.row_security { "on" } else { "off" }
        )
    }
}

async fn connect(url: &str) -> Client {
    ConnectSettings::parse(url)
        .unwrap_or_else(|e| panic!("{url}: {e}"))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

/// Creates the login roles (cluster-wide, so named after the database), grants, row security
/// and bindings, on a migrated database with the application's `tasks` table.
async fn prepare(
    owner_url: &str,
    database: &str,
    command: Command,
    row_security: bool,
    template: String,
    env: Vec<(&'static str, &'static str)>,
) -> Site {
    let roles = ["w", "c", "o"].map(|kind| format!("{database}_{kind}"));
    let owner = connect(owner_url).await;
    owner
        .batch_execute(&format!(
            "CREATE ROLE \"{w}\" LOGIN IN ROLE outbox_writer;
             CREATE ROLE \"{c}\" LOGIN IN ROLE outbox_consumer;
             CREATE ROLE \"{o}\" LOGIN IN ROLE outbox_operator;
             GRANT SELECT ON public.tasks TO \"{c}\";",
            w = roles[0],
            c = roles[1],
            o = roles[2],
        ))
        .await
        .unwrap();
    if row_security {
        let (code, _, err) =
            run_outbox(&["--database-url", owner_url, "migrate", "--row-security"]).await;
        assert_eq!(code, 0, "migrate --row-security: {err}");
        for project in command.projects() {
            for role in &roles {
                owner
                    .execute(
                        "INSERT INTO outbox.lifecycle_role_projects (role_name, project_id) \
                         VALUES ($1, $2)",
                        &[role, project],
                    )
                    .await
                    .unwrap();
            }
        }
    }
    Site {
        command,
        row_security,
        owner: owner_url.to_owned(),
        template,
        env,
        roles,
    }
}

/// Records a deletion as the writer role, through the deployment's transport; returns the
/// event ID.
async fn write(site: &Site, project: &str, task: &str) -> String {
    // Unnamed: through a transaction pooler a prepared statement may not outlive its
    // transaction.
    connect(&site.writer())
        .await
        .query_one_unnamed(
            "SELECT outbox.write_task_deleted($1, $2, now(), 'api-1', '{\"status\": \"open\"}')",
            &[&project, &task],
        )
        .await
        .unwrap_or_else(|e| panic!("{}: write {task}: {e:?}", site.what()))
        .get(0)
}

/// Records an archival (`task:archived@1`, through the generic writer) as the writer role;
/// returns the event ID.
async fn write_archived(site: &Site, project: &str, task: &str) -> String {
    let payload = serde_json::json!({
        "archived_at": "2026-01-02T03:04:05Z",
        "prior": {"column": "done", "status": "closed"},
    });
    connect(&site.writer())
        .await
        .query_one_unnamed(
            "SELECT outbox.write_event($1, 'task:archived', 1, $2, $3, 'api-1')",
            &[&project, &task, &payload],
        )
        .await
        .unwrap_or_else(|e| panic!("{}: archive {task}: {e:?}", site.what()))
        .get(0)
}

/// The project's head once every event written so far is numbered, else `None`.
async fn head(site: &Site, project: &str) -> Option<i64> {
    let row = site
        .owner()
        .await
        .query_one(
            "SELECT coalesce(max(sequence), 0), count(*) FILTER (WHERE sequence IS NULL) \
             FROM outbox.lifecycle_outbox WHERE project_id = $1",
            &[&project],
        )
        .await
        .unwrap();
    (row.get::<_, i64>(1) == 0).then(|| row.get(0))
}

async fn cursor(site: &Site, project: &str, consumer: &str) -> Option<i64> {
    site.owner()
        .await
        .query_opt(
            "SELECT last_acked_sequence FROM outbox.lifecycle_consumer_cursors \
             WHERE project_id = $1 AND consumer_id = $2",
            &[&project, &consumer],
        )
        .await
        .unwrap()
        .and_then(|row| row.get(0))
}

/// The delivery state of `event_id` for `consumer`.
async fn delivery_state(site: &Site, consumer: &str, event_id: &str) -> Option<String> {
    site.owner()
        .await
        .query_opt(
            "SELECT state FROM outbox.lifecycle_deliveries \
             WHERE consumer_id = $1 AND event_id = $2",
            &[&consumer, &event_id],
        )
        .await
        .unwrap()
        .map(|row| row.get(0))
}

async fn audited(site: &Site, kind: &str, consumer: &str) -> i64 {
    site.owner()
        .await
        .query_one(
            "SELECT count(*) FROM outbox.lifecycle_audit WHERE kind = $1 AND consumer_id = $2",
            &[&kind, &consumer],
        )
        .await
        .unwrap()
        .get(0)
}

/// Waits until `consumer`'s cursor is at the head of every project of the scenario.
async fn caught_up(site: &Site, consumer: &str, process: &OutboxProcess) {
    for project in site.command.projects() {
        let what = format!(
            "{}: {consumer} of {project} at the head; stderr:\n{}",
            site.what(),
            process.stderr()
        );
        eventually(WAIT, &what, || async {
            let head = head(site, project).await;
            head > Some(0) && cursor(site, project, consumer).await == head
        })
        .await;
    }
}

/// A child that records every line, acknowledges reconciliations and events, and fails
/// every event of a task named `poison*` until the file `healed` exists in `dir`.
fn write_child(dir: &Path) -> String {
    let script = dir.join("child.sh");
    std::fs::write(
        &script,
        r#"#!/usr/bin/env bash
dir=$1
while IFS= read -r line; do
    printf '%s\n' "$line" >> "$dir/seen"
    if [[ $line == *'"type":"reconcile"'* ]]; then
        head=$(sed -n 's/.*"head_sequence":\([0-9]*\).*/\1/p' <<<"$line")
        echo "{\"ack\": $head}"
        continue
    fi
    seq=$(sed -n 's/.*"sequence":\([0-9]*\).*/\1/p' <<<"$line")
    if [[ $line == *'"task_id":"poison'* && ! -e $dir/healed ]]; then
        echo "{\"fail\": $seq, \"class\": \"poison\"}"
    else
        echo "{\"ack\": $seq}"
    fi
done
"#,
    )
    .unwrap();
    format!("bash {} {}", script.display(), dir.display())
}

/// The process of one scenario, restartable with the same arguments.
struct Running {
    command: &'static str,
    args: Vec<String>,
    url: String,
    env: Vec<(&'static str, &'static str)>,
    runs: Vec<OutboxProcess>,
}

impl Running {
    fn start(site: &Site, command: &'static str, args: Vec<String>) -> Self {
        let mut running = Self {
            command,
            args,
            url: site.consumer(),
            env: site.env.clone(),
            runs: Vec::new(),
        };
        running.spawn();
        running
    }

    fn spawn(&mut self) {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        self.runs.push(OutboxProcess::spawn_with_env(
            &self.url,
            self.command,
            &args,
            &self.env,
        ));
    }

    fn last(&mut self) -> &mut OutboxProcess {
        self.runs.last_mut().expect("started")
    }

    async fn kill_9_and_restart(&mut self) {
        let run = self.last();
        assert_eq!(run.exited(), None, "running until killed: {}", run.stderr());
        run.signal("KILL");
        run.wait().await;
        self.spawn();
    }

    async fn terminate(&mut self, what: &str) {
        let run = self.last();
        assert_eq!(
            run.exited(),
            None,
            "{what}: running until told: {}",
            run.stderr()
        );
        run.signal("TERM");
        let code = run.wait().await;
        let stderr = self.stderr();
        assert_eq!(code, 0, "{what}: SIGTERM exits 0; stderr:\n{stderr}");
        assert!(
            !stderr.contains("permission denied"),
            "{what}: a statement was refused; stderr:\n{stderr}"
        );
    }

    fn stderr(&self) -> String {
        self.runs
            .iter()
            .map(|r| r.stderr())
            .collect::<Vec<_>>()
            .join("\n--- restarted ---\n")
    }

    fn event_ids(&self) -> Vec<String> {
        self.runs.iter().flat_map(|r| r.event_ids()).collect()
    }
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| a.to_string()).collect()
}

/// Seeds `consumer` of `project` with a cursor far above the head: its first start finds
/// history that diverged from its cursor, audits it and reconciles.
async fn seed_diverged(site: &Site, project: &str, consumer: &str) {
    site.owner()
        .await
        .execute(
            "WITH c AS (INSERT INTO outbox.lifecycle_consumers (project_id, consumer_id) \
                        VALUES ($1, $2) RETURNING project_id, consumer_id) \
             INSERT INTO outbox.lifecycle_consumer_positions \
                 (project_id, consumer_id, last_acked_sequence) \
             SELECT project_id, consumer_id, 40 FROM c",
            &[&project, &consumer],
        )
        .await
        .unwrap();
}

/// Parks `event_id` for `consumer` as the runtime would have after its last attempt.
async fn seed_parked(site: &Site, project: &str, consumer: &str, event_id: &str) {
    let inserted = site
        .owner()
        .await
        .execute(
            "INSERT INTO outbox.lifecycle_deliveries \
                 (project_id, consumer_id, event_id, sequence, attempts, last_failure_class, \
                  state, parked_at, updated_at) \
             SELECT project_id, $2, event_id, sequence, 2, 'forced_failure', 'dead', now(), now() \
             FROM outbox.lifecycle_outbox WHERE project_id = $1 AND event_id = $3",
            &[&project, &consumer, &event_id],
        )
        .await
        .unwrap();
    assert_eq!(inserted, 1, "{}: parked {event_id}", site.what());
}

/// `outbox <args>` as the operator role, through the deployment's transport: (exit code,
/// stderr).
async fn run_as_operator(site: &Site, args: &[&str]) -> (i32, String) {
    let operator = site.operator();
    let mut all = vec!["--database-url", &operator];
    if site.env.contains(&("OUTBOX_POOLER", "transaction")) {
        all.extend(["--pooler", "transaction"]);
    }
    all.extend(args);
    let (code, _, err) = run_outbox(&all).await;
    (code, err)
}

/// `outbox <args>` as the operator role, through the deployment's transport; exits 0.
async fn as_operator(site: &Site, args: &[&str]) {
    let (code, err) = run_as_operator(site, args).await;
    assert_eq!(code, 0, "{}: {args:?}: {err}", site.what());
}

/// `outbox dead-letters replay` as the operator role, through the deployment's transport.
async fn replay(site: &Site, project: &str, consumer: &str, event_id: &str) {
    let args = [
        "dead-letters",
        "replay",
        "--project",
        project,
        "--consumer-id",
        consumer,
        "--event-id",
        event_id,
        "--by",
        "ops",
    ];
    as_operator(site, &args).await;
}

/// `outbox contracts add contracts/task-archived.json` as the operator role. Under row
/// security the operator, bound to the scenario's projects only, is refused (contracts are
/// every project's: only a role bound to `*` changes them) with that hint, and nothing is
/// registered; the owner registers it then.
async fn register_archived(site: &Site) {
    let path = format!(
        "{}/../contracts/task-archived.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let args = ["contracts", "add", &path, "--by", "ops"];
    if !site.row_security {
        as_operator(site, &args).await;
        return;
    }
    let (code, err) = run_as_operator(site, &args).await;
    assert_eq!(
        code,
        1,
        "{}: a bound operator is refused: {err}",
        site.what()
    );
    assert!(
        err.contains("event contracts are shared by every project")
            && err.contains(&format!("('{}', '*')", site.roles[2])),
        "{}: the refusal says to bind the role to '*': {err}",
        site.what()
    );
    let registered: i64 = site
        .owner()
        .await
        .query_one(
            "SELECT count(*) FROM outbox.lifecycle_event_contracts \
             WHERE event_type = 'task:archived'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(registered, 0, "{}: nothing registered", site.what());
    let (code, _, err) = run_outbox(&[&["--database-url", &site.owner], &args[..]].concat()).await;
    assert_eq!(code, 0, "{}: {err}", site.what());
}

async fn replayed(site: &Site, consumer: &str, event_id: &str, running: &Running) {
    let what = format!(
        "{}: {event_id} replayed to {consumer}; stderr:\n{}",
        site.what(),
        running.stderr()
    );
    eventually(WAIT, &what, || async {
        delivery_state(site, consumer, event_id).await.as_deref() == Some("replayed")
    })
    .await;
}

/// The shared scenario of every consumer command: `consumer` of the scenario's projects
/// reconciles at its first start (`diverged`: because its seeded cursor is above the head;
/// else because it is new), then follows writes; a dead letter (parked by the run itself
/// when `poison` is set, else seeded) is replayed by the operator; kill -9 and a restart
/// lose nothing; SIGTERM exits 0. Returns the process and the events written after the
/// reconciliation, in order, per project.
async fn consumer_scenario(
    site: &Site,
    command: &'static str,
    args: Vec<String>,
    consumer: &str,
    poison: Option<&Path>,
) -> (Running, Vec<(String, String)>) {
    let projects = site.command.projects();
    register_archived(site).await;
    let owner = site.owner().await;
    for project in projects {
        owner
            .execute(
                "INSERT INTO public.tasks (id, project_id) VALUES ($1, $2)",
                &[&format!("{project}-live"), project],
            )
            .await
            .unwrap();
        write(site, project, &format!("{project}-before")).await;
    }
    let diverged = poison.is_none();
    if diverged {
        // Numbered first, so that the head is known to be below the seeded cursor.
        let (code, _, err) = run_outbox(&["--database-url", &site.owner, "sequence"]).await;
        assert_eq!(code, 0, "{err}");
        for project in projects {
            seed_diverged(site, project, consumer).await;
        }
    }
    let mut running = Running::start(site, command, args);
    caught_up(site, consumer, running.last()).await;
    if diverged {
        assert_eq!(
            audited(site, "lifecycle-observation:history-diverged", consumer).await,
            projects.len() as i64,
            "{}: the divergence audited; stderr:\n{}",
            site.what(),
            running.stderr()
        );
    }

    let mut written = Vec::new();
    for project in projects {
        written.push((
            project.to_string(),
            write(site, project, &format!("{project}-a")).await,
        ));
        written.push((
            project.to_string(),
            write_archived(site, project, &format!("{project}-archived")).await,
        ));
    }
    let project = projects[0];
    let dead = match poison {
        Some(dir) => {
            let poison = write(site, project, "poison-1").await;
            written.push((project.to_string(), poison.clone()));
            written.push((
                project.to_string(),
                write(site, project, "after-poison").await,
            ));
            caught_up(site, consumer, running.last()).await;
            assert_eq!(
                delivery_state(site, consumer, &poison).await.as_deref(),
                Some("dead"),
                "{}: the poison event parked",
                site.what()
            );
            std::fs::write(dir.join("healed"), "").unwrap();
            poison
        }
        None => {
            caught_up(site, consumer, running.last()).await;
            let event = written[0].1.clone();
            seed_parked(site, project, consumer, &event).await;
            event
        }
    };
    replay(site, project, consumer, &dead).await;
    replayed(site, consumer, &dead, &running).await;

    running.kill_9_and_restart().await;
    for project in projects {
        written.push((
            project.to_string(),
            write(site, project, &format!("{project}-b")).await,
        ));
    }
    caught_up(site, consumer, running.last()).await;
    running.terminate(&site.what()).await;
    (running, written)
}

fn consumer_args(targets: &[&str], extra: &[&str]) -> Vec<String> {
    let mut args = strings(targets);
    args.extend(strings(CONSUMER_OPTIONS));
    args.extend(strings(extra));
    args
}

/// Every event written after the reconciliation was printed.
fn assert_printed(site: &Site, running: &Running, written: &[(String, String)]) {
    let printed = running.event_ids();
    for (_, event) in written {
        assert!(
            printed.contains(event),
            "{}: {event} printed; got {printed:?}",
            site.what()
        );
    }
}

async fn run(site: &Site, work: &Path) {
    match site.command {
        Command::ConsumeStdout => {
            let args = consumer_args(&["--project", "p1", "--consumer-id", "dash"], &[]);
            let (running, written) = consumer_scenario(site, "consume", args, "dash", None).await;
            assert_printed(site, &running, &written);
        }
        Command::ConsumeChild | Command::ConsumeChildLanes => {
            let child = write_child(work);
            // With lanes the child is handed several events at once (it answers them in
            // order, which is one of the orders lanes accept), and the poison event is parked
            // while the events of other tasks go on.
            let (consumer, lanes) = match site.command {
                Command::ConsumeChildLanes => ("lanes", &["--lanes", "4"][..]),
                _ => ("hook", &[][..]),
            };
            let mut extra = vec!["--child", child.as_str()];
            extra.extend(lanes);
            let args = consumer_args(&["--project", "p1", "--consumer-id", consumer], &extra);
            let (_, written) = consumer_scenario(site, "consume", args, consumer, Some(work)).await;
            let seen = std::fs::read_to_string(work.join("seen")).unwrap_or_default();
            assert!(
                seen.contains("\"reason\":\"missing_cursor\""),
                "{}: a new consumer reconciles first: {seen}",
                site.what()
            );
            for (_, event) in &written {
                assert!(
                    seen.contains(event.as_str()),
                    "{}: {event} seen",
                    site.what()
                );
            }
        }
        Command::ConsumeAllProjects => {
            let args = consumer_args(&["--all-projects", "--consumer-id", "every"], &[]);
            let (running, written) = consumer_scenario(site, "consume", args, "every", None).await;
            assert_printed(site, &running, &written);
        }
        Command::Serve => {
            let listen = format!("127.0.0.1:{}", free_port());
            let args = consumer_args(
                &[
                    "--listen",
                    &listen,
                    "--project",
                    "p1",
                    "--consumer-id",
                    "web",
                ],
                &[],
            );
            // A client following the stream from the start to the end of the scenario.
            let addr = listen.parse().unwrap();
            let follow = async {
                let started = tokio::time::Instant::now();
                loop {
                    if let Ok((200, _, _)) =
                        outbox_tests::serve_kit::get(addr, "/readyz", &[]).await
                    {
                        break;
                    }
                    assert!(started.elapsed() < WAIT, "{}: serve answers", site.what());
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                SseClient::open(addr, "/v1/projects/p1/events", &[]).await
            };
            let (scenario, client) =
                tokio::join!(consumer_scenario(site, "serve", args, "web", None), follow);
            let (_, written) = scenario;
            // Events before the kill -9 reached the first client, each named by its type.
            for (event, name) in [
                (&written[0].1, "task:deleted"),
                (&written[1].1, "task:archived"),
            ] {
                let got: Vec<String> = client
                    .events()
                    .iter()
                    .filter(|m| m.event.as_deref() == Some(name))
                    .filter_map(|m| m.json()["event_id"].as_str().map(String::from))
                    .collect();
                assert!(
                    got.contains(event),
                    "{}: the SSE client got {event} as {name}; got {got:?}",
                    site.what(),
                );
            }
        }
        Command::RelayNats => {
            let nats = NatsServer::start().await;
            let url = nats.url();
            let args = consumer_args(
                &[
                    "nats",
                    "--project",
                    "p1",
                    "--consumer-id",
                    "relay",
                    "--nats-url",
                    &url,
                    "--stream",
                    "DEPLOY",
                    "--publish-timeout",
                    "2s",
                ],
                &[],
            );
            let (_, written) = consumer_scenario(site, "relay", args, "relay", None).await;
            let js = nats.jetstream().await;
            let stream = read_stream(&js, "DEPLOY").await;
            // Reconciliations are published too (`reconcile:...`); the events, in order, each
            // on its type's subject:
            let events: Vec<_> = stream
                .iter()
                .filter(|m| !m.msg_id.starts_with("reconcile:"))
                .collect();
            for message in &events {
                let token = message.body["event_type"]
                    .as_str()
                    .unwrap()
                    .replace(':', "_");
                assert_eq!(message.subject, format!("lifecycle.p1.{token}"));
            }
            let ids: Vec<&str> = events.iter().map(|m| m.msg_id.as_str()).collect();
            let expected: Vec<&str> = written.iter().map(|(_, e)| e.as_str()).collect();
            assert_eq!(
                ids,
                expected,
                "{}: the stream holds each event once, in order",
                site.what()
            );
        }
        Command::SequenceEvery => {
            let mut running = Running::start(
                site,
                "sequence",
                strings(&["--every", "20ms", "--lease-ttl", "5s"]),
            );
            write(site, "p1", "s-1").await;
            numbered(site, 1, &running).await;
            running.kill_9_and_restart().await;
            write(site, "p1", "s-2").await;
            numbered(site, 2, &running).await;
            running.terminate(&site.what()).await;
        }
    }
}

async fn numbered(site: &Site, count: i64, running: &Running) {
    let what = format!(
        "{}: {count} events numbered; stderr:\n{}",
        site.what(),
        running.stderr()
    );
    eventually(WAIT, &what, || async {
        head(site, "p1").await == Some(count)
    })
    .await;
}

/// A work directory of one scenario (the child's script and its record).
fn work_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("outbox-deployment-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs every command's scenario on its own database of `sites`, at once.
async fn run_all(sites: &[Site]) {
    let dirs: Vec<PathBuf> = sites
        .iter()
        .map(|s| work_dir(&format!("{}-{}", std::process::id(), s.roles[0])))
        .collect();
    let scenarios = sites.iter().zip(&dirs).map(|(site, dir)| run(site, dir));
    futures_util::future::join_all(scenarios).await;
    for dir in dirs {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// The matrix's databases on the shared test cluster, one per command and row-security
/// mode: (name, command, row security, owner URL).
async fn databases_on_test_cluster() -> Vec<(String, Command, bool, String)> {
    let mut out = Vec::new();
    for row_security in [false, true] {
        for command in COMMANDS {
            let db = fresh_db().await;
            out.push((db.name, command, row_security, db.url));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn over_the_unix_socket() {
    let mut sites = Vec::new();
    for (name, command, row_security, url) in databases_on_test_cluster().await {
        let template = url.replacen("postgres@", "ROLE@", 1);
        sites.push(prepare(&url, &name, command, row_security, template, Vec::new()).await);
    }
    run_all(&sites).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn through_pgbouncer_in_transaction_mode() {
    let planned = databases_on_test_cluster().await;
    let users: Vec<String> = planned
        .iter()
        .flat_map(|(name, ..)| ["w", "c", "o"].map(|k| format!("{name}_{k}")))
        .collect();
    let bouncer = PgBouncer::start_for_users(&users);
    let mut sites = Vec::new();
    for (name, command, row_security, url) in planned {
        let template = bouncer.url(&name).replacen("postgres@", "ROLE@", 1);
        let env = vec![("OUTBOX_POOLER", "transaction")];
        sites.push(prepare(&url, &name, command, row_security, template, env).await);
    }
    run_all(&sites).await;
    drop(bouncer);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn over_tls() {
    let cluster = TlsCluster::start();
    let params = format!("sslmode=verify-full&sslrootcert={}", cluster.ca.display());
    let admin = connect(&cluster.url("localhost", "postgres", &params)).await;
    let mut sites = Vec::new();
    for row_security in [false, true] {
        for command in COMMANDS {
            let name = format!(
                "tls_{}_{}",
                command.tag(),
                if row_security { "rls" } else { "plain" }
            );
            admin
                .batch_execute(&format!("CREATE DATABASE {name}"))
                .await
                .unwrap();
            let url = cluster.url("localhost", &name, &params);
            let mut owner = connect(&url).await;
            outbox_core::migrate(&mut owner, &Schema::default())
                .await
                .unwrap();
            owner.batch_execute(TASKS_TABLE).await.unwrap();
            let template = url.replacen("postgres@", "ROLE@", 1);
            sites.push(prepare(&url, &name, command, row_security, template, Vec::new()).await);
        }
    }
    run_all(&sites).await;
    drop(cluster);
}

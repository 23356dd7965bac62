//! The operations kit in `deploy/`: the Prometheus rules pass promtool's checks and unit
//! tests, every alert names a runbook heading, and the live `/metrics` of `consume
//! --metrics-addr`, `serve` and `relay nats` pass `promtool check metrics` while events flow
//! and carry every metric name the rules and the dashboard use.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use outbox_tests::consumer_kit::{Writers, write_event};
use outbox_tests::nats_kit::{self, NatsServer};
use outbox_tests::process_kit::{ConsumeProcess, OutboxProcess};
use outbox_tests::serve_kit::{ServeProcess, free_port, get};
use outbox_tests::{TestDb, fresh_db};
use tokio::io::AsyncWriteExt;

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A file of the repository, read whole.
fn read(path: &str) -> String {
    let path = root().join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// promtool, from `OUTBOX_PROMTOOL` (set by `scripts/test.sh`, which installs Debian's
/// prometheus package when missing); a test that needs it and lacks it fails.
fn promtool() -> PathBuf {
    let path = std::env::var_os("OUTBOX_PROMTOOL")
        .map(PathBuf::from)
        .or_else(|| which("promtool"))
        .expect(
            "promtool not found: set OUTBOX_PROMTOOL or run `bash scripts/promtool.sh ensure` \
             (installs Debian's prometheus package)",
        );
    assert!(
        path.is_file(),
        "OUTBOX_PROMTOOL={} is no file",
        path.display()
    );
    path
}

/// A program on PATH.
fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|dir| Path::new(dir).join(name))
        .find(|path| path.is_file())
}

/// Runs promtool in `deploy/prometheus` with `args` and `stdin`; returns (exit code, output).
async fn run_promtool(args: &[&str], stdin: &str) -> (i32, String) {
    let mut child = tokio::process::Command::new(promtool())
        .args(args)
        .current_dir(root().join("deploy/prometheus"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start promtool");
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).await.unwrap();
    drop(input);
    let output = child.wait_with_output().await.unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code().unwrap_or(-1), text)
}

/// Every `outbox_...` metric name a text mentions (PromQL expressions, rule files, the
/// dashboard); recorded series (`outbox:...`) are not metric names of the binaries.
fn metric_names_in(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("outbox_") {
        let preceded = rest[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        if !preceded {
            names.insert(tail[..end].to_owned());
        }
        rest = &tail[end..];
    }
    names
}

/// The names of the samples of a Prometheus text exposition.
fn scraped_names(scrape: &str) -> BTreeSet<String> {
    scrape
        .lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .map(|line| line.split(['{', ' ']).next().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn the_rule_files_pass_promtool_check_rules() {
    let (code, output) = run_promtool(&["check", "rules", "recording.yml", "alerts.yml"], "").await;
    assert_eq!(code, 0, "{output}");
    assert!(output.contains("SUCCESS"), "{output}");
}

/// `alerts_test.yml` holds, per alert, a series that fires it and a neighbour that must not
/// (promtool compares the exact list of firing alerts, labels and annotations).
#[tokio::test]
async fn every_alert_passes_its_promtool_unit_test() {
    let (code, output) = run_promtool(&["test", "rules", "alerts_test.yml"], "").await;
    assert_eq!(code, 0, "{output}");
    let alerts = alert_names();
    let tests = read("deploy/prometheus/alerts_test.yml");
    for alert in &alerts {
        assert!(
            tests.contains(&format!("alertname: {alert}\n")),
            "alerts_test.yml has no test of {alert}"
        );
    }
}

/// The alert names of `alerts.yml`, in order.
fn alert_names() -> Vec<String> {
    read("deploy/prometheus/alerts.yml")
        .lines()
        .filter_map(|line| line.trim().strip_prefix("- alert: "))
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn every_alert_names_a_runbook_heading() {
    let runbooks = read("docs/runbooks.md");
    let headings: BTreeSet<&str> = runbooks
        .lines()
        .filter_map(|line| line.strip_prefix("### "))
        .collect();
    let rules = read("deploy/prometheus/alerts.yml");
    let mut alerts = 0;
    for block in rules.split("- alert: ").skip(1) {
        let name = block.lines().next().unwrap().trim();
        let runbook = block
            .lines()
            .find_map(|line| line.trim().strip_prefix("runbook: "))
            .unwrap_or_else(|| panic!("{name} has no runbook annotation"))
            .trim_matches('"');
        assert!(
            headings.contains(runbook),
            "{name}: runbook {runbook:?} is no heading of docs/runbooks.md"
        );
        alerts += 1;
    }
    assert_eq!(alerts, alert_names().len());
    assert!(alerts >= 8, "one alert per runbook symptom; found {alerts}");
}

/// Timings compressed so the processes report within a second or two.
const FAST: &[&str] = &[
    "--lease-ttl",
    "2s",
    "--heartbeat-interval",
    "300ms",
    "--poll-interval",
    "100ms",
    "--shutdown-grace",
    "1s",
];

/// A child that acknowledges every event but those of task `poison`, which it fails.
const CHILD: &str = r#"
while IFS= read -r line; do
  seq=$(printf '%s' "$line" | sed -n 's/.*"sequence":\([0-9]*\).*/\1/p')
  case "$line" in
    *'"task_id":"poison"'*) printf '{"fail": %s, "class": "poison_pill"}\n' "$seq" ;;
    *) printf '{"ack": %s}\n' "$seq" ;;
  esac
done
"#;

/// `/metrics` of `addr` once it shows every name in `wanted` (or the last one after 20 s:
/// the caller's assertions then name what is missing).
async fn scrape_showing(addr: std::net::SocketAddr, wanted: &[&str]) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut last = String::new();
    while tokio::time::Instant::now() < deadline {
        if let Ok((200, _, text)) = get(addr, "/metrics", &[]).await {
            let names = scraped_names(&text);
            last = text;
            if wanted.iter().all(|w| names.contains(*w)) {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    last
}

/// The three binaries' `/metrics`, each scraped while writers commit events.
async fn live_scrapes(db: &TestDb) -> Vec<(&'static str, String)> {
    let writers = Writers::start(db, 2, &["p1"], 5..30);
    for _ in 0..3 {
        write_event(db, "p1", "poison").await;
    }

    let consume_addr = format!("127.0.0.1:{}", free_port());
    let mut consume_args = FAST.to_vec();
    consume_args.extend_from_slice(&[
        "--project",
        "p1",
        "--consumer-id",
        "mailer",
        "--start-from",
        "earliest",
        "--child",
        CHILD,
        "--retry-delays",
        "50ms",
        "--max-attempts",
        "2",
        "--retention",
        "0s",
        "--prune-interval",
        "200ms",
        "--metrics-addr",
        &consume_addr,
    ]);
    let mut consume = ConsumeProcess::spawn(&db.url, &consume_args);
    let consume_scrape = scrape_showing(
        consume_addr.parse().unwrap(),
        &[
            "outbox_database_up",
            "outbox_history_divergences_total",
            "outbox_delivery_failures_total",
            "outbox_dead_letters_parked_total",
            "outbox_retention_floor",
            "outbox_commit_to_dispatch_seconds_bucket",
            // Set by the gauges' sampler once the consumer has a cursor: its first sample may
            // come before that, so the scrape waits for a later one.
            "outbox_consumer_lag_events",
        ],
    )
    .await;

    let mut serve_args = FAST.to_vec();
    serve_args.extend_from_slice(&["--project", "p1", "--consumer-id", "web", "--no-prune"]);
    let mut serve = ServeProcess::start(&db.url, &serve_args).await;
    let serve_scrape = scrape_showing(
        serve.addr,
        &[
            "outbox_sse_clients",
            "outbox_sse_dropped_total",
            "outbox_events_delivered_total",
        ],
    )
    .await;

    let nats = NatsServer::start().await;
    let relay_addr = format!("127.0.0.1:{}", free_port());
    let nats_url = nats.url();
    let mut relay_args = FAST.to_vec();
    relay_args.extend_from_slice(&[
        "--project",
        "p1",
        "--consumer-id",
        "jetstream",
        "--nats-url",
        &nats_url,
        "--stream",
        "OPS",
        "--start-from",
        "earliest",
        "--no-prune",
        "--metrics-addr",
        &relay_addr,
    ]);
    let mut relay: OutboxProcess = nats_kit::spawn_relay(&db.url, &relay_args);
    let relay_scrape = scrape_showing(
        relay_addr.parse().unwrap(),
        &[
            "outbox_events_delivered_total",
            "outbox_lease_held",
            "outbox_relay_out_of_order_total",
        ],
    )
    .await;

    writers.stop().await;
    for (name, process) in [("consume", &mut consume), ("relay nats", &mut relay)] {
        process.signal("TERM");
        assert_eq!(process.wait().await, 0, "{name}: {}", process.stderr());
    }
    serve.signal("TERM");
    assert_eq!(serve.wait().await, 0, "{}", serve.stderr());
    vec![
        ("consume --metrics-addr", consume_scrape),
        ("serve", serve_scrape),
        ("relay nats --metrics-addr", relay_scrape),
    ]
}

/// The text whose metric names must appear in a live scrape: a rule file whole, the
/// dashboard's queries (its panel descriptions are prose).
fn queries_of(file: &str) -> String {
    if !file.ends_with(".json") {
        return read(file);
    }
    let dashboard = dashboard();
    let panels = graph_panels(&dashboard);
    let exprs = panels
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap())
        .map(|t| t["expr"].as_str().unwrap().to_owned());
    let variables = dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["definition"].as_str().map(str::to_owned));
    exprs.chain(variables).collect::<Vec<_>>().join("\n")
}

/// The files whose metric names must each appear in a live scrape.
const USERS_OF_METRICS: &[&str] = &[
    "deploy/prometheus/alerts.yml",
    "deploy/prometheus/recording.yml",
    "deploy/grafana/outbox.json",
];

#[tokio::test]
async fn live_metrics_pass_promtool_and_carry_every_name_the_rules_use() {
    let db = fresh_db().await;
    let scrapes = live_scrapes(&db).await;
    let mut exported = BTreeSet::new();
    for (binary, scrape) in &scrapes {
        assert!(
            scraped_names(scrape).contains("outbox_events_delivered_total"),
            "{binary} delivered nothing while events flowed:\n{scrape}"
        );
        let (code, output) = run_promtool(&["check", "metrics"], scrape).await;
        assert_eq!(
            code, 0,
            "promtool check metrics on {binary}:\n{output}\n{scrape}"
        );
        exported.extend(scraped_names(scrape));
    }
    let (_, relay) = &scrapes[2];
    assert!(
        relay.contains("outbox_relay_out_of_order_total 0"),
        "the relay's counter is exported at 0 from its start:\n{relay}"
    );
    for file in USERS_OF_METRICS {
        let used = metric_names_in(&queries_of(file));
        assert!(!used.is_empty(), "{file} uses no metric");
        let missing: Vec<_> = used.difference(&exported).collect();
        assert!(
            missing.is_empty(),
            "{file} uses metrics no binary exported: {missing:?}; exported: {exported:?}"
        );
    }
}

/// Every series whose labels a process knows when it starts is exported at 0 from then on,
/// not only after its first change: a consumer of a project without events has its delivery,
/// parking and divergence counters, and (running the sweep for it) the project's pruning
/// counters and retention floor; the relay its out-of-order counter (checked in the live
/// scrapes above).
#[tokio::test]
async fn series_with_known_labels_start_at_zero() {
    let db = fresh_db().await;
    let addr = format!("127.0.0.1:{}", free_port());
    let mut args = FAST.to_vec();
    args.extend_from_slice(&[
        "--project",
        "p1",
        "--consumer-id",
        "c",
        "--metrics-addr",
        &addr,
    ]);
    let mut consume = ConsumeProcess::spawn(&db.url, &args);
    let wanted = [
        "outbox_events_delivered_total",
        "outbox_dead_letters_parked_total",
        "outbox_history_divergences_total",
        "outbox_pruned_events_total",
        "outbox_pruned_dead_letters_total",
        "outbox_retention_floor",
        "outbox_database_up",
    ];
    let scrape = scrape_showing(addr.parse().unwrap(), &wanted).await;
    consume.signal("TERM");
    assert_eq!(consume.wait().await, 0, "{}", consume.stderr());
    for name in wanted {
        let line = scrape
            .lines()
            .find(|l| l.starts_with(name) && !l.starts_with('#'))
            .unwrap_or_else(|| panic!("no {name}:\n{scrape}"));
        let value = line.rsplit(' ').next().unwrap();
        let expected = if name == "outbox_database_up" {
            "1"
        } else {
            "0"
        };
        assert_eq!(value, expected, "{line}");
        if name != "outbox_database_up" {
            assert!(line.contains(r#"project="p1""#), "{line}");
        }
    }
}

/// The dashboard, parsed.
fn dashboard() -> serde_json::Value {
    serde_json::from_str(&read("deploy/grafana/outbox.json"))
        .unwrap_or_else(|e| panic!("deploy/grafana/outbox.json is not valid JSON: {e}"))
}

/// The dashboard's graph panels (not its rows).
fn graph_panels(dashboard: &serde_json::Value) -> Vec<&serde_json::Value> {
    dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .filter(|p| p["type"] != "row")
        .collect()
}

#[test]
fn the_dashboard_has_a_panel_for_each_view_on_the_data_source_variable() {
    let dashboard = dashboard();
    assert_eq!(dashboard["uid"], "lifecycle-outbox");
    let panels = graph_panels(&dashboard);
    let titles: Vec<&str> = panels
        .iter()
        .map(|p| p["title"].as_str().unwrap())
        .collect();
    for wanted in [
        "Lag per consumer",
        "Delivery rate",
        "Failures by class",
        "Dead letters",
        "Commit → dispatch latency",
        "Unsequenced backlog",
        "SSE clients",
        "Relay throughput",
        "Database reachable",
        "History divergences",
    ] {
        assert!(titles.contains(&wanted), "no panel {wanted:?}: {titles:?}");
    }
    let mut ids = BTreeSet::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        let title = panel["title"].as_str().unwrap();
        assert!(
            ids.insert(panel["id"].as_u64().unwrap()),
            "{title}: id repeated"
        );
        let grid = &panel["gridPos"];
        let (x, w) = (grid["x"].as_u64().unwrap(), grid["w"].as_u64().unwrap());
        assert!(x + w <= 24, "{title} is wider than the grid");
    }
    let variables: Vec<&str> = dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert!(variables.contains(&"datasource"), "{variables:?}");
    for panel in panels {
        let title = panel["title"].as_str().unwrap();
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title}");
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title} has no query");
        for target in targets {
            let expr = target["expr"].as_str().unwrap_or("");
            assert!(!metric_names_in(expr).is_empty(), "{title}: {expr:?}");
        }
    }
}

/// Every dashboard query is valid PromQL: each becomes a recording rule (Grafana's variables
/// given plain values) for `promtool check rules`.
#[tokio::test]
async fn every_dashboard_query_is_valid_promql() {
    let dashboard = dashboard();
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (n, panel) in graph_panels(&dashboard).into_iter().enumerate() {
        for (m, target) in panel["targets"].as_array().unwrap().iter().enumerate() {
            let expr = target["expr"]
                .as_str()
                .unwrap()
                .replace("$__rate_interval", "5m")
                .replace("$project", ".*")
                .replace("$relay_consumer", ".*");
            let quoted = serde_json::to_string(&expr).unwrap();
            rules.push_str(&format!(
                "      - record: dashboard:panel{n}:query{m}\n        expr: {quoted}\n"
            ));
        }
    }
    let dir = std::env::temp_dir().join(format!("outbox-dashboard-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("dashboard_rules.yml");
    std::fs::write(&file, &rules).unwrap();
    let (code, output) = run_promtool(&["check", "rules", file.to_str().unwrap()], "").await;
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(code, 0, "{output}\n{rules}");
}

#[test]
fn metric_names_are_found_in_expressions() {
    let names = metric_names_in(
        "max by (p) (outbox_lease_held == 1) and outbox:consumer_lag_events:held \
         rate(outbox_commit_to_dispatch_seconds_bucket[5m])",
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        [
            "outbox_commit_to_dispatch_seconds_bucket",
            "outbox_lease_held"
        ]
    );
}

/// Log lines show durations as people read them (`outbox_core::internal::Readable`: `91.2ms`, `1.5s`),
/// never `Debug`'s `91.245485ms` or humantime's `91ms 245us 485ns`: no log field of the
/// libraries formats a duration either way.
#[test]
fn log_fields_show_durations_readably() {
    let mut offending = Vec::new();
    for krate in [
        "outbox-core",
        "outbox-consumer",
        "outbox-service",
        "outbox-serve",
        "outbox-relay",
    ] {
        let mut stack = vec![root().join(krate).join("src")];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                let text = std::fs::read_to_string(&path).unwrap();
                for (n, line) in text.lines().enumerate() {
                    let field = line.split_once(" = ").map(|(_, value)| value.trim_start());
                    let debug_duration = field.is_some_and(|value| {
                        value.starts_with('?')
                            && ["delay", "interval", "elapsed", "timeout", "wait", "ttl"]
                                .iter()
                                .any(|word| value.contains(word))
                    });
                    let spelled_out =
                        field.is_some_and(|value| value.starts_with("%humantime::format_duration"));
                    if debug_duration || spelled_out {
                        offending.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
                    }
                }
            }
        }
    }
    assert!(offending.is_empty(), "{offending:#?}");
}

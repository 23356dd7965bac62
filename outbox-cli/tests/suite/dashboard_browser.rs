//! The dashboard in a real browser: headless Chromium opens it, a task is deleted through the
//! SQL writer, and the event must appear in the page's live feed; checked in the DOM over the
//! DevTools protocol. A screenshot is saved as `target/dashboard.png`.
//!
//! Chromium comes from `scripts/chromium.sh` (run by `make test`), or `OUTBOX_CHROMIUM`. When
//! it is missing the test fails, loudly: it never passes without a browser.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use base64::Engine;
use futures_util::{SinkExt, StreamExt};
use outbox_tests::consumer_kit::eventually;
use outbox_tests::fresh_db;
use outbox_tests::serve_kit::{ServeProcess, free_port, get};
use serde_json::{Value, json};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;

fn chromium() -> PathBuf {
    if let Some(path) = std::env::var_os("OUTBOX_CHROMIUM") {
        return PathBuf::from(path);
    }
    for name in ["chromium", "chromium-browser"] {
        for dir in std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()) {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    panic!(
        "\n\n*** Chromium is not installed: the dashboard's browser test cannot run. ***\n\
         Run `bash scripts/chromium.sh` (make test does) or set OUTBOX_CHROMIUM.\n\n"
    );
}

/// A DevTools protocol session on one page.
struct DevTools {
    socket: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
    next_id: u64,
}

impl DevTools {
    async fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let request = json!({ "id": id, "method": method, "params": params });
        self.socket
            .send(Message::text(request.to_string()))
            .await
            .expect("send to DevTools");
        loop {
            let message = tokio::time::timeout(Duration::from_secs(20), self.socket.next())
                .await
                .unwrap_or_else(|_| panic!("DevTools did not answer {method}"))
                .expect("DevTools connection open")
                .expect("DevTools message");
            let Message::Text(text) = message else {
                continue;
            };
            let value: Value = serde_json::from_str(text.as_str()).expect("DevTools JSON");
            if value["id"] == id {
                assert!(value.get("error").is_none(), "{method}: {value}");
                return value["result"].clone();
            }
        }
    }

    /// Evaluates `expression` in the page and returns its value.
    async fn eval(&mut self, expression: &str) -> Value {
        let result = self
            .call(
                "Runtime.evaluate",
                json!({ "expression": expression, "returnByValue": true }),
            )
            .await;
        result["result"]["value"].clone()
    }
}

/// Headless Chromium showing `http://addr/`, its DevTools session on that page, and its
/// profile directory (removed by the caller).
async fn open_page(
    browser: &std::path::Path,
    addr: std::net::SocketAddr,
) -> (tokio::process::Child, DevTools, PathBuf) {
    let debug_port = free_port();
    // One profile per browser: two browsers cannot share one.
    let profile = std::env::temp_dir().join(format!(
        "outbox-chromium-{}-{debug_port}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&profile);
    let mut chrome = tokio::process::Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            "--window-size=1280,900",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--remote-debugging-port={debug_port}"))
        .arg(format!("http://{addr}/"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", browser.display()));

    // The page's DevTools endpoint.
    let devtools: std::net::SocketAddr = format!("127.0.0.1:{debug_port}").parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let page_url = format!("http://{addr}/");
    let ws_url = loop {
        if let Ok((200, _, body)) = get(devtools, "/json/list", &[]).await {
            let targets: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
            let found = targets.as_array().and_then(|all| {
                all.iter()
                    .find(|t| t["type"] == "page" && t["url"] == page_url.as_str())
                    .and_then(|t| t["webSocketDebuggerUrl"].as_str().map(str::to_owned))
            });
            if let Some(url) = found {
                break url;
            }
        }
        if let Ok(Some(status)) = chrome.try_wait() {
            panic!("chromium exited early: {status}");
        }
        assert!(
            Instant::now() < deadline,
            "chromium's DevTools endpoint never listed the page"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let (socket, _) = tokio_tungstenite::connect_async(ws_url.as_str())
        .await
        .expect("connect to DevTools");
    (chrome, DevTools { socket, next_id: 0 }, profile)
}

#[tokio::test]
async fn the_live_feed_shows_a_deletion_in_a_real_browser() {
    let browser = chromium();
    let db = fresh_db().await;
    let client = db.connect().await;
    client
        .batch_execute(
            "INSERT INTO public.tasks (id, project_id, column_name, status) VALUES
             ('FN-1', 'demo', 'todo', 'open'), ('FN-2', 'demo', 'doing', 'open'),
             ('FN-3', 'demo', 'done', 'closed')",
        )
        .await
        .unwrap();
    let server = ServeProcess::start(
        &db.url,
        &[
            "--project",
            "demo",
            "--consumer-id",
            "dashboard",
            "--poll-interval",
            "100ms",
            "--dashboard-refresh",
            "500ms",
            "--no-prune",
        ],
    )
    .await;
    let addr = server.addr;
    eventually(Duration::from_secs(15), "ready", || async move {
        matches!(get(addr, "/readyz", &[]).await, Ok((200, _, _)))
    })
    .await;

    let (mut chrome, mut page, profile) = open_page(&browser, addr).await;

    // The page is up: its status table names the consumer, and its feed is subscribed.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let live = page
            .eval("document.getElementById('conn') && document.getElementById('conn').textContent")
            .await;
        let metrics = server.metrics().await;
        let subscribed = metrics.get("outbox_sse_clients", &[("project", "demo")]) == Some(1.0);
        if live == "live" && subscribed {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the page never went live (conn = {live}, subscribed = {subscribed})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let status = page
        .eval("document.getElementById('status').innerText")
        .await;
    let status = status.as_str().unwrap_or_default();
    assert!(
        status.contains("dashboard") && status.contains("demo"),
        "{status}"
    );

    // Delete a task through the SQL writer, as an application would.
    let deleted = Instant::now();
    client
        .query_one(
            "WITH d AS (UPDATE public.tasks SET deleted_at = now() \
                        WHERE id = 'FN-2' AND deleted_at IS NULL \
                        RETURNING project_id, id, deleted_at, column_name, status) \
             SELECT outbox.write_task_deleted(project_id, id, deleted_at, 'api-1', \
                        jsonb_build_object('column', column_name, 'status', status)) FROM d",
            &[],
        )
        .await
        .unwrap();
    let deadline = deleted + Duration::from_secs(5);
    let feed = loop {
        let feed = page.eval("document.getElementById('feed').innerText").await;
        let text = feed.as_str().unwrap_or_default().to_owned();
        if text.contains("task FN-2 deleted") {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "the deletion did not appear in the live feed within 5 s; feed: {text:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    println!(
        "deletion visible in the browser after {:?}: {feed}",
        deleted.elapsed()
    );
    assert!(feed.contains("#1 demo task FN-2"), "{feed}");
    // Let the status section refresh with the new head before the picture is taken.
    tokio::time::sleep(Duration::from_millis(1200)).await;

    let shot = page
        .call("Page.captureScreenshot", json!({ "format": "png" }))
        .await;
    let png = base64::engine::general_purpose::STANDARD
        .decode(shot["data"].as_str().expect("screenshot data"))
        .expect("base64 screenshot");
    assert!(png.starts_with(b"\x89PNG"), "not a PNG");
    let target = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target"));
    std::fs::create_dir_all(&target).unwrap();
    let path = target.join("dashboard.png");
    std::fs::write(&path, &png).unwrap();
    println!("screenshot: {}", path.display());

    drop(page);
    let _ = chrome.kill().await;
    let _ = std::fs::remove_dir_all(&profile);
}

/// Eight served projects on one page: the page holds one stream for all of them (a browser
/// opens at most six connections per host), so every project's events reach the feed and an
/// admin action's request completes; a retired project is announced in the feed.
#[tokio::test]
async fn eight_projects_share_one_stream_and_admin_actions_complete() {
    let browser = chromium();
    let db = fresh_db().await;
    let client = db.connect().await;
    let projects: Vec<String> = (1..=8).map(|i| format!("p{i}")).collect();
    for project in &projects {
        client
            .execute(
                "INSERT INTO public.tasks (id, project_id, column_name, status) \
                 VALUES ($1, $2, 'todo', 'open')",
                &[&format!("T-{project}"), project],
            )
            .await
            .unwrap();
    }
    let mut args = vec![
        "--consumer-id",
        "dashboard",
        "--poll-interval",
        "100ms",
        "--dashboard-refresh",
        "500ms",
        "--no-prune",
        "--admin-operator",
        "alice",
    ];
    for project in &projects {
        args.extend(["--project", project.as_str()]);
    }
    let server =
        ServeProcess::start_with_env(&db.url, &args, &[("OUTBOX_ADMIN_TOKEN", "s3cret-token")])
            .await;
    let addr = server.addr;
    eventually(Duration::from_secs(20), "ready", || async move {
        matches!(get(addr, "/readyz", &[]).await, Ok((200, _, _)))
    })
    .await;
    let (mut chrome, mut page, profile) = open_page(&browser, addr).await;

    // Live, and the page's one stream follows every project.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let live = page
            .eval("document.getElementById('conn') && document.getElementById('conn').textContent")
            .await;
        let metrics = server.metrics().await;
        let followed = projects
            .iter()
            .filter(|p| metrics.get("outbox_sse_clients", &[("project", p.as_str())]) == Some(1.0))
            .count();
        if live == "live" && followed == projects.len() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the page never went live on every project (conn = {live}, {followed} followed)"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for project in &projects {
        client
            .query_one(
                "WITH d AS (UPDATE public.tasks SET deleted_at = now() \
                            WHERE id = $1 AND deleted_at IS NULL \
                            RETURNING project_id, id, deleted_at, column_name, status) \
                 SELECT outbox.write_task_deleted(project_id, id, deleted_at, 'api-1', \
                            jsonb_build_object('column', column_name, 'status', status)) FROM d",
                &[&format!("T-{project}")],
            )
            .await
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let feed = page.eval("document.getElementById('feed').innerText").await;
        let text = feed.as_str().unwrap_or_default().to_owned();
        let missing: Vec<&String> = projects
            .iter()
            .filter(|p| !text.contains(&format!("#1 {p} task T-{p} deleted")))
            .collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the feed never showed {missing:?}; feed: {text:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // An admin action from the page: its request completes, and the retirement it makes is
    // announced in the feed.
    page.eval(
        "document.getElementById('token').value = 's3cret-token';
         var f = document.getElementById('retire');
         f.project.value = 'p8'; f.consumer.value = 'dashboard'; f.reason.value = 'moved';
         f.requestSubmit(); true",
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let result = page
            .eval("document.getElementById('admin-result').textContent")
            .await;
        let result = result.as_str().unwrap_or_default().to_owned();
        if !result.is_empty() {
            assert!(result.starts_with("200 "), "{result}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the retire request never completed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // p8's consumer stops at its next look at the database (an event wakes it).
    client
        .execute(
            "INSERT INTO public.tasks (id, project_id) VALUES ('T-p8-2', 'p8')",
            &[],
        )
        .await
        .unwrap();
    client
        .query_one(
            "WITH d AS (UPDATE public.tasks SET deleted_at = now() WHERE id = 'T-p8-2' \
                        RETURNING project_id, id, deleted_at) \
             SELECT outbox.write_task_deleted(project_id, id, deleted_at, 'api-1', '{}') FROM d",
            &[],
        )
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let feed = page.eval("document.getElementById('feed').innerText").await;
        let text = feed.as_str().unwrap_or_default().to_owned();
        if text.contains("retired p8: consumer dashboard") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the retirement never reached the feed; feed: {text:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    drop(page);
    let _ = chrome.kill().await;
    let _ = std::fs::remove_dir_all(&profile);
}

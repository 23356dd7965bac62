//! Helpers for tests of `outbox serve`: the real binary on a free port, a small HTTP client
//! and an SSE client that records each message with the moment it arrived, and a parser for
//! the Prometheus text format.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::process_kit::OutboxProcess;

/// A free TCP port on 127.0.0.1 (bound and released; the kernel does not hand it out again
/// at once).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A running `outbox serve` (an [`OutboxProcess`] with the address it listens on).
pub struct ServeProcess {
    /// The process, its stdout and stderr.
    process: OutboxProcess,
    /// Where it listens.
    pub addr: SocketAddr,
}

impl ServeProcess {
    /// Starts `outbox --database-url URL serve --listen 127.0.0.1:PORT ARGS` and waits until
    /// `/healthz` answers.
    pub async fn start(url: &str, args: &[&str]) -> Self {
        Self::start_with_env(url, args, &[]).await
    }

    /// As [`ServeProcess::start`], with extra environment variables.
    pub async fn start_with_env(url: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::start_on("127.0.0.1", url, args, env).await
    }

    /// As [`ServeProcess::start_with_env`], listening on `host` (an IP address or a name)
    /// with a free port; `addr` is then the resolved address that answers.
    pub async fn start_on(host: &str, url: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        let listen = format!("{host}:{}", free_port());
        let candidates: Vec<SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(&listen)
            .expect("the listen address resolves")
            .collect();
        let mut all = vec!["--listen", listen.as_str()];
        all.extend_from_slice(args);
        let mut server = Self {
            process: OutboxProcess::spawn_with_env(url, "serve", &all, env),
            addr: candidates[0],
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            for addr in &candidates {
                // `{"status": "starting"}` while it waits for its database.
                if let Ok((200, _, body)) = get(*addr, "/healthz", &[]).await
                    && body.contains("\"ok\"")
                {
                    server.addr = *addr;
                    return server;
                }
            }
            assert!(
                Instant::now() < deadline,
                "outbox serve did not answer /healthz; stderr:\n{}",
                server.stderr()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stderr so far.
    pub fn stderr(&self) -> String {
        self.process.stderr()
    }

    /// Sends a signal by name.
    pub fn signal(&self, name: &str) {
        self.process.signal(name);
    }

    /// Waits up to 30 s for exit; returns the exit code (-1 for a signal).
    pub async fn wait(&mut self) -> i32 {
        tokio::time::timeout(Duration::from_secs(30), self.process.wait())
            .await
            .expect("outbox serve exits within 30 s")
    }

    /// The current metrics, parsed.
    pub async fn metrics(&self) -> Metrics {
        let (status, _, body) = get(self.addr, "/metrics", &[]).await.expect("GET /metrics");
        assert_eq!(status, 200, "{body}");
        Metrics::parse(&body)
    }
}

/// A response: status, headers (lower-case names), body.
pub type Reply = (u16, BTreeMap<String, String>, String);

async fn send(addr: SocketAddr, request: Request<Full<Bytes>>) -> Result<Reply, String> {
    let stream = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let headers = response
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
        .collect();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, headers, String::from_utf8_lossy(&body).into_owned()))
}

/// `Host: addr`, unless `headers` name a `Host` of their own.
fn with_host(
    request: hyper::http::request::Builder,
    addr: SocketAddr,
    headers: &[(&str, &str)],
) -> hyper::http::request::Builder {
    match headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        true => request,
        false => request.header("host", addr.to_string()),
    }
}

/// `GET path` with extra headers (a `host` among them replaces the default, `addr`).
pub async fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Result<Reply, String> {
    let mut request = with_host(Request::get(path), addr, headers);
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    send(addr, request.body(Full::new(Bytes::new())).unwrap()).await
}

/// `POST path` with a JSON body and extra headers (a `host` among them replaces the default).
pub async fn post(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: &serde_json::Value,
) -> Result<Reply, String> {
    let mut request =
        with_host(Request::post(path), addr, headers).header("content-type", "application/json");
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    send(
        addr,
        request
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap(),
    )
    .await
}

/// One SSE message (or comment) as received.
#[derive(Debug, Clone)]
pub struct Message {
    /// When it arrived.
    pub at: Instant,
    /// `id:`.
    pub id: Option<String>,
    /// `event:`.
    pub event: Option<String>,
    /// `data:` lines, joined with newlines.
    pub data: String,
    /// The text of a comment (a line starting with `:`), for comment-only blocks.
    pub comment: Option<String>,
}

impl Message {
    /// The sequence in `id:` (the part before `:`), if the message has an id.
    pub fn sequence(&self) -> Option<i64> {
        let id = self.id.as_deref()?;
        let sequence = id.split_once(':').map_or(id, |(sequence, _)| sequence);
        Some(
            sequence
                .parse()
                .unwrap_or_else(|e| panic!("id {id:?}: {e}")),
        )
    }

    /// `data` as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.data)
            .unwrap_or_else(|e| panic!("data is not JSON ({e}): {}", self.data))
    }
}

/// A connected SSE client that records everything it receives.
pub struct SseClient {
    /// Messages so far.
    messages: Arc<Mutex<Vec<Message>>>,
    /// Set when the server ended the stream or closed the connection.
    ended: Arc<AtomicBool>,
    /// The response status.
    pub status: u16,
    /// The reader task.
    task: tokio::task::JoinHandle<()>,
}

impl Drop for SseClient {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SseClient {
    /// Opens `path` with extra headers; panics unless the answer is 200 `text/event-stream`.
    pub async fn open(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Self {
        let stream = TcpStream::connect(addr).await.expect("connect");
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("handshake");
        tokio::spawn(connection);
        let mut request = Request::get(path).header("host", addr.to_string());
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        let response = sender
            .send_request(request.body(Full::new(Bytes::new())).unwrap())
            .await
            .expect("send");
        let status = response.status().as_u16();
        assert_eq!(status, 200, "GET {path}");
        assert_eq!(
            response.headers().get("content-type").unwrap(),
            "text/event-stream"
        );
        let messages = Arc::new(Mutex::new(Vec::new()));
        let ended = Arc::new(AtomicBool::new(false));
        let (sink, done) = (messages.clone(), ended.clone());
        let mut body = response.into_body();
        let task = tokio::spawn(async move {
            let mut buffer = String::new();
            while let Some(Ok(frame)) = body.frame().await {
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                buffer.push_str(&String::from_utf8_lossy(&data));
                while let Some(end) = buffer.find("\n\n") {
                    let block: String = buffer.drain(..end + 2).collect();
                    sink.lock().unwrap().push(parse_block(&block));
                }
            }
            done.store(true, Ordering::Release);
        });
        Self {
            messages,
            ended,
            status,
            task,
        }
    }

    /// Everything received so far.
    pub fn messages(&self) -> Vec<Message> {
        self.messages.lock().unwrap().clone()
    }

    /// Received messages with an `event:` field.
    pub fn events(&self) -> Vec<Message> {
        self.messages()
            .into_iter()
            .filter(|m| m.event.is_some())
            .collect()
    }

    /// The sequences in the `id:` of received `task:deleted` messages.
    pub fn sequences(&self) -> Vec<i64> {
        self.events()
            .iter()
            .filter(|m| m.event.as_deref() == Some("task:deleted"))
            .map(|m| m.sequence().expect("an event has an id"))
            .collect()
    }

    /// True once the server ended the stream.
    pub fn ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }
}

/// The `id:` the stream gives event `event_id` at `sequence`, computed here as the docs
/// describe it (`<sequence>:` and the first 16 hex digits of the SHA-256 of the event ID), not
/// with the server's code.
pub fn sse_id(sequence: i64, event_id: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(event_id.as_bytes());
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("{sequence}:{hex}")
}

fn parse_block(block: &str) -> Message {
    let mut message = Message {
        at: Instant::now(),
        id: None,
        event: None,
        data: String::new(),
        comment: None,
    };
    let mut data = Vec::new();
    for line in block.lines() {
        if let Some(comment) = line.strip_prefix(':') {
            message.comment = Some(comment.trim().to_owned());
        } else if let Some((field, value)) = line.split_once(':') {
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "id" => message.id = Some(value.to_owned()),
                "event" => message.event = Some(value.to_owned()),
                "data" => data.push(value.to_owned()),
                _ => {}
            }
        }
    }
    message.data = data.join("\n");
    message
}

/// Samples of the Prometheus text format: `name{labels}` -> value.
#[derive(Debug, Clone, Default)]
pub struct Metrics(pub BTreeMap<String, f64>);

impl Metrics {
    /// Parses the text format (comments skipped); panics on a malformed sample line.
    pub fn parse(text: &str) -> Self {
        let mut samples = BTreeMap::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (series, value) = line
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("malformed sample line {line:?}"));
            let value: f64 = value
                .parse()
                .unwrap_or_else(|e| panic!("malformed value in {line:?}: {e}"));
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => {
                    let rest = rest.strip_suffix('}').expect("labels end with }");
                    let mut pairs: Vec<String> = rest
                        .split(',')
                        .filter(|p| !p.is_empty())
                        .map(|p| p.to_owned())
                        .collect();
                    pairs.sort();
                    (name, pairs.join(","))
                }
                None => (series, String::new()),
            };
            samples.insert(format!("{name}{{{labels}}}"), value);
        }
        Self(samples)
    }

    /// The value of `name` with exactly these labels (any order), if present.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let mut pairs: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
        pairs.sort();
        self.0
            .get(&format!("{name}{{{}}}", pairs.join(",")))
            .copied()
    }
}

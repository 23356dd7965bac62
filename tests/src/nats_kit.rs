//! Test kit for the JetStream relay: a real `nats-server` with JetStream on a free port and a
//! temporary store directory, a relay process, and a reader that reads a stream back whole.
//!
//! Two servers: `OUTBOX_NATS_SERVER` (or `nats-server` on the PATH; `make test` installs
//! Debian's package, 2.9.10, through `scripts/nats.sh ensure` when it is missing) and
//! `OUTBOX_NATS_SERVER_CURRENT`, a current release (`scripts/nats.sh ensure-current` installs
//! it). A test written once runs on both through [`on_both_servers!`](crate::on_both_servers):
//! the servers it starts use the binary of the [`Server`] it runs under (Debian's by default).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_nats::jetstream::{self, Context};

use crate::process_kit::OutboxProcess;

/// Distinguishes store directories of servers started by one test binary.
static SERVERS: AtomicUsize = AtomicUsize::new(0);

/// Which nats-server a test's servers run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    /// Debian's package (`OUTBOX_NATS_SERVER`), 2.9.10 on bookworm.
    Debian,
    /// A current release (`OUTBOX_NATS_SERVER_CURRENT`).
    Current,
}

tokio::task_local! {
    /// The server of the test running in this task.
    static SERVER: Server;
}

/// Runs `test` with every nats-server it starts being `server`.
pub async fn with_server<F: std::future::Future>(server: Server, test: F) -> F::Output {
    SERVER.scope(server, test).await
}

/// The server the current test runs under.
pub fn server() -> Server {
    SERVER.try_with(|s| *s).unwrap_or(Server::Debian)
}

/// Generates, for each `async fn name()` named, a module `name` with two tests, `nats_2_9`
/// and `nats_current`, running it on each server (filter with `name::` for both).
#[macro_export]
macro_rules! on_both_servers {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn nats_2_9() {
                $crate::nats_kit::with_server($crate::nats_kit::Server::Debian, super::$name())
                    .await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn nats_current() {
                $crate::nats_kit::with_server($crate::nats_kit::Server::Current, super::$name())
                    .await
            }
        }
    )*};
}

/// The binary of the server the current test runs under.
pub fn nats_server_binary() -> PathBuf {
    match server() {
        Server::Debian => debian_binary(),
        Server::Current => match std::env::var_os("OUTBOX_NATS_SERVER_CURRENT") {
            Some(path) => PathBuf::from(path),
            None => panic!(
                "OUTBOX_NATS_SERVER_CURRENT is not set: run `bash scripts/nats.sh \
                 ensure-current` (make test does) and export its output"
            ),
        },
    }
}

/// Debian's nats-server, or a loud failure saying how to get one.
fn debian_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("OUTBOX_NATS_SERVER") {
        return PathBuf::from(path);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path).chain([PathBuf::from("/usr/sbin")]) {
        let candidate = dir.join("nats-server");
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!(
        "nats-server not found: run `bash scripts/nats.sh ensure` (make test does) or set \
         OUTBOX_NATS_SERVER"
    );
}

/// Ports this test process has handed out already.
static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// A free TCP port on 127.0.0.1 (the kernel's choice; released just before use), never one
/// this process handed out before: the kernel may offer a released port again, and two
/// servers of concurrent tests given the same one would leave one of them unable to bind.
pub fn free_port() -> u16 {
    let mut handed_out = HANDED_OUT.lock().expect("port registry");
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("bind an ephemeral port")
            .port();
        if handed_out.insert(port) {
            return port;
        }
    }
}

/// A running nats-server with JetStream, stopped and its store removed on drop.
pub struct NatsServer {
    /// The server process while running.
    child: Option<std::process::Child>,
    /// Client port on 127.0.0.1, kept across restarts.
    pub port: u16,
    /// JetStream store directory, kept across restarts.
    store: PathBuf,
    /// Extra command-line arguments (a configuration file, cluster options).
    extra: Vec<String>,
    /// The binary, chosen when the server is prepared (see [`Server`]).
    binary: PathBuf,
}

impl NatsServer {
    /// Starts a server and waits until it accepts connections.
    pub async fn start() -> Self {
        let mut server = Self::prepare(Vec::new());
        server.launch().await;
        server
    }

    /// Starts a server with `config` as its configuration file (authorization, TLS...); the
    /// address, port and JetStream store still come from the command line.
    pub async fn start_with_config(config: &str) -> Self {
        let mut server = Self::prepare(Vec::new());
        let file = server.store.join("server.conf");
        std::fs::write(&file, config).expect("write server.conf");
        server.extra = vec!["-c".into(), file.display().to_string()];
        server.launch().await;
        server
    }

    /// A server not started yet, on a free port, with `extra` command-line arguments.
    pub fn prepare(extra: Vec<String>) -> Self {
        let n = SERVERS.fetch_add(1, Ordering::Relaxed);
        let store = std::env::temp_dir().join(format!(
            "outbox-nats-{}-{n}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&store).expect("create store dir");
        Self {
            child: None,
            port: free_port(),
            store,
            extra,
            binary: nats_server_binary(),
        }
    }

    /// The store directory (configuration files written beside the data go here).
    pub fn dir(&self) -> &std::path::Path {
        &self.store
    }

    /// Replaces the extra command-line arguments (before `launch`).
    pub fn set_extra(&mut self, extra: Vec<String>) {
        self.extra = extra;
    }

    /// Starts the process and waits until it accepts connections.
    pub async fn launch(&mut self) {
        let log = std::fs::File::create(self.store.join("server.log")).expect("log file");
        let child = std::process::Command::new(&self.binary)
            .args([
                "-js",
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-sd",
            ])
            .arg(self.store.join("js"))
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .expect("start nats-server");
        self.child = Some(child);
        // Ready when this server says it listens on the port and a connection is accepted. A
        // connection alone proves nothing: the port is in the ephemeral range, so an attempt
        // made before the server listens can be given that same port as its source and
        // connect the socket to itself (TCP self-connect), and the test's own client is then
        // refused.
        let listening = format!(
            "Listening for client connections on 127.0.0.1:{}",
            self.port
        );
        for _ in 0..400 {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                panic!("nats-server exited ({status}); log:\n{}", self.log());
            }
            if self.log().contains(&listening)
                && tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                    .await
                    .is_ok()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("nats-server did not start; log:\n{}", self.log());
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.store.join("server.log")).unwrap_or_default()
    }

    /// Kills the server with SIGKILL (no flush, no goodbye to its peers) and reaps it.
    pub fn kill_9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Whether the process is running.
    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    /// Stops the server (SIGTERM: JetStream flushes its store) and waits for it to exit.
    pub async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = std::process::Command::new("kill")
                .arg("-TERM")
                .arg(child.id().to_string())
                .status();
            for _ in 0..400 {
                if child.try_wait().ok().flatten().is_some() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server and starts it again on the same port and store.
    pub async fn restart(&mut self, down_for: Duration) {
        self.stop().await;
        tokio::time::sleep(down_for).await;
        self.launch().await;
    }

    /// A JetStream context on a new client made with `options`, to `SCHEME://127.0.0.1:PORT`.
    pub async fn jetstream_with(
        &self,
        options: async_nats::ConnectOptions,
        scheme: &str,
    ) -> Context {
        let client = options
            .connect(format!("{scheme}://127.0.0.1:{}", self.port))
            .await
            .expect("connect to nats-server");
        jetstream::new(client)
    }

    /// A JetStream context on a new client.
    pub async fn jetstream(&self) -> Context {
        let client = async_nats::connect(format!("127.0.0.1:{}", self.port))
            .await
            .expect("connect to nats-server");
        jetstream::new(client)
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.store);
    }
}

/// One message read back from a stream.
#[derive(Debug, Clone)]
pub struct Relayed {
    /// Stream sequence.
    pub stream_sequence: u64,
    /// Subject.
    pub subject: String,
    /// `Nats-Msg-Id`.
    pub msg_id: String,
    /// `Outbox-Sequence`.
    pub outbox_sequence: i64,
    /// `Outbox-Project`.
    pub project: String,
    /// The body.
    pub body: serde_json::Value,
    /// Every header, by name (the ones the client parses into its own variants included).
    pub headers: std::collections::BTreeMap<String, String>,
}

/// Every message of `stream`, in stream order.
pub async fn read_stream(js: &Context, stream: &str) -> Vec<Relayed> {
    let mut handle = js.get_stream(stream).await.expect("get stream");
    let state = handle.info().await.expect("stream info").state.clone();
    let mut out = Vec::new();
    for seq in state.first_sequence.max(1)..=state.last_sequence {
        // Nothing deletes from these streams, so every sequence up to the last holds a
        // message; a failed read is the cluster electing leaders again after a node came
        // back, and is asked again (skipping it would report the message as never relayed).
        let message = retry_for(
            &format!("read message {seq}"),
            Duration::from_secs(30),
            Duration::from_millis(200),
            || handle.get_raw_message(seq),
        )
        .await;
        let header = |name: &str| {
            // The client parses standard names into their own variant, which a lookup by
            // text does not find.
            let value = if name == "Nats-Msg-Id" {
                message.headers.get(async_nats::header::NATS_MESSAGE_ID)
            } else {
                message.headers.get(name)
            };
            value.map(|v| v.as_str().to_owned()).unwrap_or_else(|| {
                panic!("message {seq} lacks header {name}: {:?}", message.headers)
            })
        };
        out.push(Relayed {
            stream_sequence: seq,
            subject: message.subject.to_string(),
            msg_id: header("Nats-Msg-Id"),
            outbox_sequence: header("Outbox-Sequence").parse().expect("numeric sequence"),
            project: header("Outbox-Project"),
            body: serde_json::from_slice(&message.payload).expect("JSON body"),
            headers: message
                .headers
                .iter()
                .map(|(name, values)| {
                    let value = values
                        .first()
                        .map(|v| v.as_str().to_owned())
                        .unwrap_or_default();
                    (name.to_string(), value)
                })
                .collect(),
        });
    }
    out
}

/// Asserts that `stream` holds every event of `expected` ((sequence, event_id) of one project,
/// in sequence order) exactly once, in that order, with matching headers and body, and
/// nothing else on the project's event subject.
pub fn assert_exactly_once_in_order(
    messages: &[Relayed],
    prefix: &str,
    project: &str,
    expected: &[(i64, String)],
) {
    let subject = format!("{prefix}.{project}.task_deleted");
    let got: Vec<&Relayed> = messages.iter().filter(|m| m.subject == subject).collect();
    let got_seqs: Vec<i64> = got.iter().map(|m| m.outbox_sequence).collect();
    let want_seqs: Vec<i64> = expected.iter().map(|(s, _)| *s).collect();
    if got_seqs != want_seqs {
        let mut seen = std::collections::BTreeMap::new();
        for s in &got_seqs {
            *seen.entry(*s).or_insert(0) += 1;
        }
        let dups: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
        let missing: Vec<_> = want_seqs.iter().filter(|s| !seen.contains_key(s)).collect();
        let out_of_order = got_seqs.windows(2).filter(|w| w[1] <= w[0]).count();
        panic!(
            "project {project}: {} messages for {} events; duplicates {dups:?}, missing \
             {missing:?}, {out_of_order} out of order",
            got_seqs.len(),
            want_seqs.len()
        );
    }
    for (message, (sequence, event_id)) in got.iter().zip(expected) {
        assert_eq!(&message.msg_id, event_id, "Nats-Msg-Id of {sequence}");
        assert_eq!(message.project, project, "Outbox-Project of {sequence}");
        assert_eq!(
            message.body["event_id"],
            event_id.as_str(),
            "body of {sequence}"
        );
        assert_eq!(message.body["sequence"], *sequence, "body of {sequence}");
        assert_eq!(message.body["type"], "event", "body of {sequence}");
    }
}

/// Starts `outbox --database-url URL relay nats ARGS` (the relay prints nothing on stdout;
/// its log is collected from stderr).
pub fn spawn_relay(url: &str, args: &[&str]) -> OutboxProcess {
    let mut command = vec!["nats"];
    command.extend_from_slice(args);
    OutboxProcess::spawn_command(url, "relay", &command)
}

/// Reads `count` messages of `filter` through a durable pull consumer with explicit
/// acknowledgement, the way the README tells downstream services to consume; returns
/// (subject, `Nats-Msg-Id`, `Outbox-Sequence`) in delivery order.
pub async fn consume_durable(
    js: &Context,
    stream: &str,
    durable: &str,
    filter: &str,
    count: usize,
) -> Vec<(String, String, i64)> {
    use async_nats::jetstream::consumer::{AckPolicy, pull};
    use futures_util::StreamExt;

    // After a cluster lost nodes, its JetStream API may time out until the stream and
    // consumer leaders are elected again; a downstream service retries, and so does this.
    let consumer = retry_for(
        "create the durable consumer",
        Duration::from_secs(60),
        Duration::from_millis(500),
        || async {
            js.get_stream(stream)
                .await
                .map_err(|e| format!("get stream: {e}"))?
                .get_or_create_consumer(
                    durable,
                    pull::Config {
                        durable_name: Some(durable.into()),
                        filter_subject: filter.into(),
                        ack_policy: AckPolicy::Explicit,
                        ..Default::default()
                    },
                )
                .await
                .map_err(|e| format!("create: {e}"))
        },
    )
    .await;
    let mut messages = consumer.messages().await.expect("consume");
    let mut out = Vec::with_capacity(count);
    while out.len() < count {
        let message = match tokio::time::timeout(Duration::from_secs(10), messages.next())
            .await
            .unwrap_or_else(|_| panic!("only {} of {count} messages delivered", out.len()))
            .expect("message stream ended")
        {
            Ok(message) => message,
            // A pull request while the consumer's leader moves (an R3 cluster after a node
            // loss) finds no responder; the next one is answered. Missing messages still
            // end in the timeout above.
            Err(e)
                if e.kind()
                    == async_nats::jetstream::consumer::pull::MessagesErrorKind::NoResponders =>
            {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            Err(e) => panic!("message: {e:?}"),
        };
        let headers = message.headers.as_ref().expect("headers");
        let msg_id = headers
            .get(async_nats::header::NATS_MESSAGE_ID)
            .expect("Nats-Msg-Id")
            .as_str()
            .to_owned();
        let sequence = headers
            .get("Outbox-Sequence")
            .expect("Outbox-Sequence")
            .as_str()
            .parse()
            .expect("numeric sequence");
        out.push((message.subject.to_string(), msg_id, sequence));
        message.ack().await.expect("ack");
    }
    out
}

/// Runs `attempt` until it succeeds, pausing `pause` after each failure, which it prints; fails
/// the test once `limit` has passed. A cluster that lost nodes answers with timeouts until its
/// leaders are elected again, and a downstream service asks again, as the tests do.
async fn retry_for<T, E, F, Fut>(what: &str, limit: Duration, pause: Duration, mut attempt: F) -> T
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match attempt().await {
            Ok(value) => return value,
            Err(e) if tokio::time::Instant::now() < deadline => {
                eprintln!("{what}: {e}; trying again");
                tokio::time::sleep(pause).await;
            }
            Err(e) => panic!("{what}: {e} (for {limit:?})"),
        }
    }
}

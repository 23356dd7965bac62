//! `outbox serve` fan-out benchmark: many SSE clients on one server while writers commit
//! events at a fixed rate; commit-to-client latency, the server's RSS and CPU, and whether
//! every client received every event. Optionally some deliberately slow clients (which read
//! nothing) ride along, to show that dropping them does not move the others' latency.
//!
//! Writers and clients run in this process and share its monotonic clock: writer tasks
//! commit event k (task `B-k`) on an open-loop schedule (`t0 + k / rate`) and store the
//! moment its `COMMIT` returned; a client that receives task `B-k` measures from there. Clients
//! find the task ID and the `id:` field by a plain text scan, not a JSON parse, so that the
//! measuring side stays cheap next to the server on a small machine.

#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::process::Stdio;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use outbox_bench::{BoxResult, procfs, stats};

/// Benchmark `outbox serve`'s SSE fan-out.
#[derive(Debug, Parser)]
struct Args {
    /// Migrated database (with a `tasks` table) to write to and serve from.
    #[arg(long)]
    database_url: String,
    /// The `outbox` binary (release build).
    #[arg(long)]
    outbox: String,
    /// SSE clients that read everything.
    #[arg(long, default_value_t = 1000)]
    clients: usize,
    /// Clients that connect and then read nothing.
    #[arg(long, default_value_t = 0)]
    slow_clients: usize,
    /// Events committed per second.
    #[arg(long, default_value_t = 2000)]
    rate: u32,
    /// Seconds of writing.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Writer tasks, each with its own connection.
    #[arg(long, default_value_t = 8)]
    writers: usize,
    /// Also print commit-to-client percentiles per second of the run (by commit time) to
    /// stderr: where in the run the tail is.
    #[arg(long)]
    timeline: bool,
    /// An argument more for `outbox serve` (repeat for several), e.g.
    /// `--serve-arg=--min-tick-pause --serve-arg=5ms`.
    #[arg(long, allow_hyphen_values = true)]
    serve_arg: Vec<String>,
    /// A label for the report.
    #[arg(long, default_value = "")]
    label: String,
}

/// What one client saw.
#[derive(Default)]
struct Seen {
    /// Commit-to-client latencies, microseconds.
    latencies_us: Vec<u32>,
    /// The second of the run each of those events committed in (for `--timeline`).
    committed_in: Vec<u16>,
    /// Events received.
    events: u64,
    /// `id:` values that did not follow the previous one.
    gaps: u64,
    /// Last `id:` seen.
    last_id: Option<i64>,
    /// Whether the stream ended before the run did.
    ended_early: bool,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    match runtime.block_on(run(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::from(1)
        }
    }
}

fn free_port() -> BoxResult<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

async fn get(addr: SocketAddr, path: &str) -> BoxResult<(u16, String)> {
    let stream = TcpStream::connect(addr).await?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    let request = hyper::Request::get(path)
        .header("host", addr.to_string())
        .body(Empty::<Bytes>::new())?;
    let response = sender.send_request(request).await?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// The value of one sample of the Prometheus text format.
fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit_once(' '))
        .and_then(|(_, v)| v.parse().ok())
}

/// Parses the decimal number at the start of `bytes`.
fn number(bytes: &[u8]) -> Option<u64> {
    let digits = bytes.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 {
        return None;
    }
    std::str::from_utf8(&bytes[..digits]).ok()?.parse().ok()
}

/// Finds one SSE message's `id:` and `B-<k>` task number with SIMD substring searches, so
/// that a thousand clients in one process cost little next to the server.
struct Scanner {
    /// `"task_id":"B-`.
    task: memchr::memmem::Finder<'static>,
}

impl Scanner {
    fn new() -> Self {
        Self {
            task: memchr::memmem::Finder::new(b"\"task_id\":\"B-"),
        }
    }

    fn scan(&self, message: &[u8]) -> (Option<i64>, Option<usize>) {
        let id = message
            .strip_prefix(b"id: ")
            .and_then(number)
            .map(|n| n as i64);
        let task = self
            .task
            .find(message)
            .and_then(|at| number(&message[at + 13..]))
            .map(|n| n as usize);
        (id, task)
    }
}

async fn client(
    addr: SocketAddr,
    t0: Instant,
    commits: Arc<Vec<AtomicU64>>,
    connected: Arc<AtomicUsize>,
    stop: tokio_util::sync::CancellationToken,
) -> BoxResult<Seen> {
    let stream = TcpStream::connect(addr).await?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    let request = hyper::Request::get("/v1/projects/bench/events")
        .header("host", addr.to_string())
        .body(Empty::<Bytes>::new())?;
    let response = sender.send_request(request).await?;
    if response.status() != 200 {
        return Err(format!("status {}", response.status()).into());
    }
    connected.fetch_add(1, Ordering::AcqRel);
    let mut body = response.into_body();
    let mut seen = Seen::default();
    let scanner = Scanner::new();
    let end_of_message = memchr::memmem::Finder::new(b"\n\n");
    // The incomplete tail of the last frame.
    let mut carry: Vec<u8> = Vec::new();
    loop {
        let frame = tokio::select! {
            _ = stop.cancelled() => break,
            frame = body.frame() => frame,
        };
        let Some(Ok(frame)) = frame else {
            seen.ended_early = !stop.is_cancelled();
            break;
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let now = t0.elapsed().as_micros() as u64;
        let joined;
        let bytes: &[u8] = if carry.is_empty() {
            &data
        } else {
            carry.extend_from_slice(&data);
            joined = std::mem::take(&mut carry);
            &joined
        };
        let mut start = 0;
        while let Some(end) = end_of_message.find(&bytes[start..]) {
            let message = &bytes[start..start + end];
            start += end + 2;
            let (Some(id), task) = scanner.scan(message) else {
                continue;
            };
            seen.events += 1;
            if seen.last_id.is_some_and(|last| id != last + 1) {
                seen.gaps += 1;
            }
            seen.last_id = Some(id);
            if let Some(k) = task {
                let committed = commits
                    .get(k)
                    .map(|c| c.load(Ordering::Acquire))
                    .unwrap_or(0);
                if committed > 0 {
                    seen.latencies_us
                        .push(now.saturating_sub(committed).min(u32::MAX as u64) as u32);
                    seen.committed_in
                        .push((committed / 1_000_000).min(u16::MAX as u64) as u16);
                }
            }
        }
        carry.extend_from_slice(&bytes[start..]);
    }
    Ok(seen)
}

async fn run(args: Args) -> BoxResult<()> {
    let port = free_port()?;
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let mut server = tokio::process::Command::new(&args.outbox)
        .args([
            "--database-url",
            &args.database_url,
            "serve",
            "--project",
            "bench",
            "--consumer-id",
            "sse-bench",
            "--listen",
            &addr.to_string(),
            "--max-clients",
            &(args.clients + args.slow_clients + 10).to_string(),
            "--no-prune",
        ])
        .args(&args.serve_arg)
        .env("OUTBOX_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let pid = server.id().ok_or("server exited")?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok((200, _)) = get(addr, "/readyz").await {
            break;
        }
        if Instant::now() > deadline {
            return Err("outbox serve did not become ready".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let total = (args.rate as f64 * args.seconds).round() as usize;
    let commits: Arc<Vec<AtomicU64>> =
        Arc::new((0..total + 1).map(|_| AtomicU64::new(0)).collect());
    let t0 = Instant::now();
    let stop = tokio_util::sync::CancellationToken::new();
    let connected = Arc::new(AtomicUsize::new(0));
    let mut clients = Vec::with_capacity(args.clients);
    for _ in 0..args.clients {
        clients.push(tokio::spawn(client(
            addr,
            t0,
            commits.clone(),
            connected.clone(),
            stop.clone(),
        )));
    }
    let mut slow = Vec::new();
    for _ in 0..args.slow_clients {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.set_recv_buffer_size(4096)?;
        let mut stream = socket.connect(addr).await?;
        stream
            .write_all(
                format!("GET /v1/projects/bench/events HTTP/1.1\r\nhost: {addr}\r\n\r\n")
                    .as_bytes(),
            )
            .await?;
        slow.push(stream);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, text) = get(addr, "/metrics").await?;
        let subscribed = metric(&text, "outbox_sse_clients{project=\"bench\"}").unwrap_or(0.0);
        if connected.load(Ordering::Acquire) == args.clients
            && subscribed as usize == args.clients + args.slow_clients
        {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "only {} of {} clients connected",
                subscribed,
                args.clients + args.slow_clients
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "sse-bench: {} clients connected; writing {total} events at {}/s",
        args.clients, args.rate
    );

    let cpu_before = procfs::cpu_seconds(pid)?;
    let harness_before = procfs::cpu_seconds(std::process::id())?;
    let config = tokio_postgres::Config::from_str(&args.database_url)?;
    let start = Instant::now();
    // The writers get a thread and runtime of their own, so that the clients' work never
    // delays the schedule.
    let writer_config = config.clone();
    let writer_commits = commits.clone();
    let (rate, n_writers) = (args.rate as f64, args.writers);
    let writing = std::thread::spawn(move || -> BoxResult<()> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async move {
            let mut writers = Vec::new();
            for step in 0..n_writers {
                let db = outbox_bench::db::connect(&writer_config).await?;
                let commits = writer_commits.clone();
                writers.push(tokio::spawn(async move {
                    let statement = db
                        .prepare(
                            "SELECT outbox.write_task_deleted('bench', $1, now(), 'sse-bench', NULL)",
                        )
                        .await?;
                    let mut k = step + 1;
                    while k <= total {
                        let due = start + Duration::from_secs_f64(k as f64 / rate);
                        tokio::time::sleep_until(due.into()).await;
                        db.query_one(&statement, &[&format!("B-{k}")]).await?;
                        commits[k].store(t0.elapsed().as_micros() as u64, Ordering::Release);
                        k += n_writers;
                    }
                    Ok::<_, tokio_postgres::Error>(())
                }));
            }
            for writer in writers {
                writer.await??;
            }
            Ok(())
        })
    });
    tokio::task::spawn_blocking(move || writing.join())
        .await?
        .map_err(|_| "the writer thread panicked")??;
    let wrote = start.elapsed();
    // Let the stream drain: wait until every client has everything, or 30 s.
    let drain_deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, text) = get(addr, "/metrics").await?;
        let delivered = metric(
            &text,
            "outbox_events_delivered_total{project=\"bench\",consumer=\"sse-bench\"}",
        )
        .unwrap_or(0.0);
        if delivered as usize >= total || Instant::now() > drain_deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let cpu = procfs::cpu_seconds(pid)? - cpu_before;
    let harness = procfs::cpu_seconds(std::process::id())? - harness_before;
    let elapsed = start.elapsed();
    let memory = procfs::memory(pid)?;
    let (_, text) = get(addr, "/metrics").await?;
    let dropped = metric(&text, "outbox_sse_dropped_total{project=\"bench\"}").unwrap_or(0.0);
    // The durable side alone: the share of events the consumer dispatched within 50 ms of
    // their writer's transaction start, from the server's own histogram.
    let within_50ms = metric(
        &text,
        "outbox_commit_to_dispatch_seconds_bucket{le=\"0.05\"}",
    )
    .unwrap_or(0.0)
        / metric(&text, "outbox_commit_to_dispatch_seconds_count").unwrap_or(f64::NAN);
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_default();
    stop.cancel();

    let mut all = Vec::new();
    let mut by_second: Vec<Vec<Duration>> = Vec::new();
    let (mut complete, mut gaps, mut ended) = (0usize, 0u64, 0usize);
    for handle in clients {
        let seen = handle.await??;
        if seen.events as usize == total && seen.gaps == 0 {
            complete += 1;
        }
        gaps += seen.gaps;
        ended += seen.ended_early as usize;
        if args.timeline {
            for (&us, &second) in seen.latencies_us.iter().zip(&seen.committed_in) {
                let second = usize::from(second);
                if by_second.len() <= second {
                    by_second.resize_with(second + 1, Vec::new);
                }
                by_second[second].push(Duration::from_micros(us as u64));
            }
        }
        all.extend(
            seen.latencies_us
                .into_iter()
                .map(|us| Duration::from_micros(us as u64)),
        );
    }
    drop(slow);
    let _ = server.kill().await;
    let p = stats::percentiles(&mut all).ok_or("no samples")?;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    for (second, latencies) in by_second.iter_mut().enumerate() {
        if let Some(p) = stats::percentiles(latencies) {
            eprintln!(
                "sse-bench: committed in second {second}: {} samples, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
                latencies.len(),
                ms(p.p50),
                ms(p.p99),
                ms(p.max)
            );
        }
    }
    println!(
        "| {} | {} | {} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1}% | {} of {} | {} | {} | {:.1} | {:.2} | {:.2} | {} |",
        args.label,
        args.clients,
        args.slow_clients,
        total as f64 / wrote.as_secs_f64(),
        ms(p.p50),
        ms(p.p99),
        ms(p.max),
        within_50ms * 100.0,
        complete,
        args.clients,
        dropped,
        gaps + ended as u64,
        memory.peak_kib as f64 / 1024.0,
        cpu / elapsed.as_secs_f64(),
        harness / elapsed.as_secs_f64(),
        load,
    );
    Ok(())
}

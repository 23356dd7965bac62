//! A three-node NATS cluster for the relay's tests: three `nats-server -js` processes on free
//! loopback ports, named `n0`..`n2`, joined by cluster routes, each with its own store, so a
//! stream with three replicas survives the loss of any one node.

use std::time::Duration;

use async_nats::jetstream::context::GetStreamErrorKind;
use async_nats::jetstream::{Context, ErrorCode};

use crate::nats_kit::{NatsServer, free_port};

/// The cluster; every node is killed and its store removed on drop.
pub struct NatsCluster {
    /// The nodes; node `i` has server name `n{i}`.
    pub nodes: Vec<NatsServer>,
}

impl NatsCluster {
    /// Starts three nodes and waits until JetStream answers on each (a meta leader elected).
    pub async fn start() -> Self {
        let routes: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let mut nodes = Vec::new();
        for (i, port) in routes.iter().enumerate() {
            let others: Vec<String> = routes
                .iter()
                .filter(|p| *p != port)
                .map(|p| format!("nats://127.0.0.1:{p}"))
                .collect();
            nodes.push(NatsServer::prepare(vec![
                "--server_name".into(),
                format!("n{i}"),
                "--cluster_name".into(),
                "outbox".into(),
                "--cluster".into(),
                format!("nats://127.0.0.1:{port}"),
                "--routes".into(),
                others.join(","),
            ]));
        }
        for node in &mut nodes {
            node.launch().await;
        }
        let cluster = Self { nodes };
        for i in 0..3 {
            cluster.wait_for_jetstream(i).await;
        }
        cluster
    }

    /// Waits until JetStream answers API requests through node `i`.
    pub async fn wait_for_jetstream(&self, i: usize) {
        let js = self.nodes[i].jetstream().await;
        for _ in 0..300 {
            // A stream that does not exist: "not found" is JetStream answering.
            match js.get_stream("READINESS_PROBE").await {
                Err(e)
                    if matches!(
                        e.kind(),
                        GetStreamErrorKind::JetStream(ref j)
                            if j.error_code() == ErrorCode::STREAM_NOT_FOUND
                    ) =>
                {
                    return;
                }
                _ => {}
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "JetStream on n{i} never became ready; log:\n{}",
            self.nodes[i].log()
        );
    }

    /// Every node's client URL, comma-separated (the relay's `--nats-url`).
    pub fn urls(&self) -> String {
        self.nodes
            .iter()
            .map(NatsServer::url)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A JetStream context through a node that is running.
    pub async fn jetstream(&self) -> Context {
        let node = self
            .nodes
            .iter()
            .find(|n| n.running())
            .expect("a running node");
        node.jetstream().await
    }

    /// The index of `stream`'s current leader, once it has one.
    pub async fn stream_leader(&self, stream: &str) -> usize {
        for _ in 0..300 {
            let js = self.jetstream().await;
            if let Ok(mut handle) = js.get_stream(stream).await {
                if let Ok(info) = handle.info().await {
                    let leader = info.cluster.as_ref().and_then(|c| c.leader.clone());
                    if let Some(i) = leader.and_then(|name| name.strip_prefix('n')?.parse().ok()) {
                        return i;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("stream {stream} has no leader");
    }

    /// Waits until `stream` has a leader and every replica is current with no lag: each node
    /// holds the whole stream.
    pub async fn wait_replicas_current(&self, stream: &str) {
        for _ in 0..600 {
            let js = self.jetstream().await;
            if let Ok(mut handle) = js.get_stream(stream).await {
                if let Ok(info) = handle.info().await {
                    if let Some(cluster) = &info.cluster {
                        if cluster.leader.is_some()
                            && cluster.replicas.len() == 2
                            && cluster
                                .replicas
                                .iter()
                                .all(|p| p.current && !p.offline && p.lag.unwrap_or(0) == 0)
                        {
                            return;
                        }
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the replicas of {stream} never caught up");
    }
}

//! `GET /v1/dashboard/stream`: the page's one stream. A browser opens at most six
//! connections to one host, so a page with one stream per served project could not follow
//! more than four or five of them (and its admin actions' requests then waited for a free
//! connection): this one stream carries, multiplexed, the page's section snapshots and the
//! events of every served project, each naming its project in its data.
//!
//! The feed is for watching: it starts at the next event and does not resume (its messages
//! have no `id:`). A project whose feed falls behind is announced (`event: lagged`) and
//! followed again from its next event; a project whose consumer is retired is announced
//! (`event: retired`) and no longer followed; the stream itself goes on.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::Poll;

use bytes::Bytes;
use serde_json::json;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::sections;
use crate::fan_out::{Batch, FanOut, Subscription};
use crate::sse;
use crate::state::{AppState, release};
use crate::stream::retired;

/// One served project as the feed follows it.
struct Followed {
    fan_out: Arc<FanOut>,
    /// `None` once its consumer is retired.
    subscription: Option<Subscription>,
}

/// What woke a feed.
enum Next {
    Shutdown,
    Published(usize, Option<Arc<Batch>>),
    Retired,
    Snapshot,
}

/// One dashboard client's stream.
pub(super) struct Feed {
    state: Arc<AppState>,
    projects: Vec<Followed>,
    /// Changes when an operator retires a served consumer.
    retirements: watch::Receiver<usize>,
    /// When the next snapshot of the sections is due.
    next_snapshot: Instant,
    /// Where the next look for a published batch starts, so no project starves the others.
    turn: usize,
    /// Set after the last chunk.
    done: bool,
}

impl Drop for Feed {
    fn drop(&mut self) {
        release(&self.state);
    }
}

impl Feed {
    /// A feed of every served project, holding one `--max-clients` slot (taken by the
    /// caller, given back when the feed is dropped).
    pub(super) fn new(state: Arc<AppState>) -> Self {
        let projects = state
            .fan_outs
            .values()
            .map(|fan_out| Followed {
                subscription: Some(subscribe(fan_out)),
                fan_out: fan_out.clone(),
            })
            .collect();
        let mut retirements = state.probes.retirements();
        // Consumers retired before this feed started are announced at once.
        retirements.mark_changed();
        Self {
            state,
            projects,
            retirements,
            next_snapshot: Instant::now(),
            turn: 0,
            done: false,
        }
    }

    /// The next chunk to write, or `None` when the stream ends (at shutdown).
    pub(super) async fn next_chunk(&mut self) -> Option<Bytes> {
        loop {
            let chunk = self.next_message().await?;
            if !chunk.is_empty() {
                return Some(chunk);
            }
        }
    }

    /// What to write after the next wake-up (maybe nothing: a retirement of no project
    /// followed here), or `None` when the stream ends.
    async fn next_message(&mut self) -> Option<Bytes> {
        if self.done {
            return None;
        }
        let next = {
            let Self {
                state,
                projects,
                retirements,
                next_snapshot,
                turn,
                ..
            } = self;
            tokio::select! {
                biased;
                _ = state.shutdown.cancelled() => Next::Shutdown,
                (index, batch) = next_batch(projects, *turn) => Next::Published(index, batch),
                // The sender lives as long as the state: an error never comes.
                Ok(()) = retirements.changed() => Next::Retired,
                _ = tokio::time::sleep_until(*next_snapshot) => Next::Snapshot,
            }
        };
        Some(match next {
            Next::Shutdown => {
                self.done = true;
                sse::comment("server shutting down")
            }
            Next::Published(index, batch) => {
                self.turn = index + 1;
                self.published(index, batch)
            }
            Next::Retired => self.retired(),
            Next::Snapshot => {
                self.next_snapshot = Instant::now() + self.state.dashboard_refresh;
                snapshot(&self.state).await
            }
        })
    }

    /// A batch published to project `index`, without ids; `None` when the fan-out dropped
    /// the feed for falling behind: said, and followed again from the next event.
    fn published(&mut self, index: usize, batch: Option<Arc<Batch>>) -> Bytes {
        let followed = &mut self.projects[index];
        let Some(subscription) = &mut followed.subscription else {
            return Bytes::new();
        };
        let Some(batch) = batch else {
            followed.subscription = Some(subscribe(&followed.fan_out));
            let data = json!({
                "type": "lagged",
                "project_id": followed.fan_out.project,
                "reason": "the dashboard fell too far behind; its feed of this project \
                           continues from the next event",
            });
            return sse::message(None, "lagged", &data);
        };
        subscription
            .queued
            .fetch_sub(batch.frames.len(), Ordering::AcqRel);
        let mut chunk = Vec::with_capacity(batch.bytes.len());
        for frame in &batch.frames {
            // The feed does not resume: its messages carry no id.
            chunk.extend_from_slice(sse::without_id(&frame.bytes));
        }
        Bytes::from(chunk)
    }

    /// The retirements not announced yet; their projects are no longer followed.
    fn retired(&mut self) -> Bytes {
        let mut chunk = Vec::new();
        for followed in &mut self.projects {
            if followed.subscription.is_none() {
                continue;
            }
            if let Some(message) = retired(&self.state, &followed.fan_out) {
                followed.subscription = None;
                chunk.extend_from_slice(&message);
            }
        }
        Bytes::from(chunk)
    }
}

/// A subscription from the next event on. Its own cancellation token: the fan-out cancels a
/// dropped client's token to close its connection, and this connection serves other projects.
fn subscribe(fan_out: &Arc<FanOut>) -> Subscription {
    fan_out.subscribe(None, CancellationToken::new())
}

/// The next batch published to any followed project, looking from `turn` on: the project's
/// index and the batch (`None`: the fan-out dropped this subscription).
async fn next_batch(projects: &mut [Followed], turn: usize) -> (usize, Option<Arc<Batch>>) {
    std::future::poll_fn(|cx| {
        let count = projects.len();
        for step in 0..count {
            let index = (turn + step) % count;
            if let Some(subscription) = &mut projects[index].subscription
                && let Poll::Ready(batch) = subscription.queue.poll_recv(cx)
            {
                return Poll::Ready((index, batch));
            }
        }
        Poll::Pending
    })
    .await
}

/// The sections, rendered now, as an `event: snapshot` (or `snapshot-error`).
async fn snapshot(state: &AppState) -> Bytes {
    match sections(state).await {
        Ok(s) => {
            let data = json!({
                "status": s.status.into_string(),
                "dead_letters": s.dead_letters.into_string(),
                "audit": s.audit.into_string(),
            });
            sse::message(None, "snapshot", &data)
        }
        Err(e) => sse::message(None, "snapshot-error", &json!({ "error": e })),
    }
}

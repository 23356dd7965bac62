//! `GET /v1/projects/{P}/events`: Server-Sent Events for ephemeral clients, which own no
//! cursor. A client resumes after `Last-Event-ID` (or `?after=`; with both, `Last-Event-ID`,
//! which is what an `EventSource` opened with `?after=` sends when it reconnects to that same
//! URL) from the ring, then from
//! retained history in PostgreSQL (read-only), or, below the retention floor, from a
//! reconciliation; then it follows what the durable consumer handles. A resume id that names
//! an event this history does not have (`sse_id.rs`: the id carries the event's identity) is
//! a divergence of history, and the client is sent a reconciliation instead of waiting.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use bytes::Bytes;
use outbox_consumer::handler::ReconcileReason;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};

use crate::fan_out::{FanOut, Frame, Subscription};
use crate::sse;
use crate::sse_id::{MalformedId, StreamId, Tag};
use outbox_service::http::ConnectionToken;

use crate::state::{AppState, busy, error, event_stream, quoted, release, reserve};

/// Events read from PostgreSQL per query while a client catches up.
const HISTORY_PAGE: i64 = 500;

/// `?after=ID`, for clients that cannot set `Last-Event-ID` (ignored when the request has one).
#[derive(Debug, Deserialize)]
pub struct After {
    /// The id of the last message the client has (or a bare sequence).
    after: Option<String>,
}

/// The 400 for a malformed resume position, naming where it came from (`Last-Event-ID` or
/// `after=`) and what is wrong with it.
fn malformed(source: &str, text: &str, problem: MalformedId) -> Response {
    error(
        StatusCode::BAD_REQUEST,
        format!("malformed {source}{}: {problem}", quoted(text)),
        json!({}),
    )
}

/// The handler.
pub async fn events(
    State(state): State<Arc<AppState>>,
    Path(project): Path<String>,
    query: Result<Query<After>, QueryRejection>,
    headers: HeaderMap,
    connection: Option<axum::Extension<ConnectionToken>>,
) -> Response {
    let Some(fan_out) = state.fan_outs.get(&project).cloned() else {
        return error(
            StatusCode::NOT_FOUND,
            format!("project {} is not served here", quoted(&project)),
            json!({ "projects": state.fan_outs.keys().collect::<Vec<_>>() }),
        );
    };
    // A repeated or malformed key (`?after=1&after=2`) is a JSON error like every other.
    let query = match query {
        Ok(Query(query)) => query,
        Err(rejection) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("malformed query: {}", rejection.body_text()),
                json!({}),
            );
        }
    };
    let after = match (headers.get("last-event-id"), &query.after) {
        (Some(value), _) => {
            let text = String::from_utf8_lossy(value.as_bytes());
            match StreamId::parse(&text) {
                Ok(id) => Some(id),
                Err(problem) => return malformed("Last-Event-ID ", &text, problem),
            }
        }
        (None, Some(text)) => match StreamId::parse(text) {
            Ok(id) => Some(id),
            Err(problem) => return malformed("after=", text, problem),
        },
        (None, None) => None,
    };
    if state.shutdown.is_cancelled() {
        return busy(&state, "the server is shutting down");
    }
    if let Err(refusal) = serving(&state, &fan_out) {
        return refusal;
    }
    if let Err(refusal) = reserve(&state) {
        return refusal;
    }
    let connection = connection.map(|c| (*c.0.0).clone()).unwrap_or_default();
    let subscription = fan_out.subscribe(after.map(|id| id.sequence), connection);
    let client = Client::new(state.clone(), fan_out, subscription, after);
    let stream = futures_util::stream::unfold(client, |mut client| async move {
        client
            .next_chunk()
            .await
            .map(|chunk| (Ok::<_, std::convert::Infallible>(chunk), client))
    });
    let mut response = event_stream(stream);
    let h = response.headers_mut();
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    // An event stream is never followed by another request on its connection; closing it
    // when the stream ends (after `lagged`, say) frees the socket at once.
    h.insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// Refuses a client of a project this process does not serve now: on standby (another
/// process holds the consumer's lease, or the claim is pending) a stream would carry only
/// keep-alives, so the client is asked to come back (or to go to the ready process); a
/// project whose consumer an operator retired is gone.
#[allow(clippy::result_large_err)]
fn serving(state: &AppState, fan_out: &FanOut) -> Result<(), Response> {
    let (project, consumer) = (&fan_out.project, &state.consumer_id);
    if state.probes.retired(project, consumer) {
        return Err(error(
            StatusCode::GONE,
            format!(
                "project {project} is no longer served here: its consumer {consumer} was retired"
            ),
            json!({}),
        ));
    }
    let held = state
        .probes
        .get(project, consumer)
        .is_some_and(|probe| probe.lease_held());
    if held {
        return Ok(());
    }
    Err(busy(
        state,
        &format!(
            "this process is on standby for project {project}: it does not hold the lease of \
             consumer {consumer} (another process holds it, or the claim is pending)"
        ),
    ))
}

/// The `event: retired` message of `fan_out`'s project when an operator retired its
/// consumer (the stream then ends, and a new request is answered 410); `None` while it is not.
pub(crate) fn retired(state: &AppState, fan_out: &FanOut) -> Option<Bytes> {
    let (project, consumer) = (&fan_out.project, &state.consumer_id);
    if !state.probes.retired(project, consumer) {
        return None;
    }
    let data = json!({
        "type": "retired",
        "project_id": project,
        "consumer_id": consumer,
        "reason": format!(
            "consumer {consumer} of project {project} was retired: the project is no longer \
             served here"
        ),
    });
    Some(sse::message(None, "retired", &data))
}

/// One client's stream.
struct Client {
    /// Server-wide state: history reads, shutdown, keep-alive.
    state: Arc<AppState>,
    /// The project's fan-out.
    fan_out: Arc<FanOut>,
    /// The client's queue and its starting point.
    subscription: Subscription,
    /// The id of the last message sent (an event, or a reconciliation), or of the client's
    /// resume position.
    last_sent: Option<StreamId>,
    /// The catch-up still to do before following the queue, when the client resumed.
    resume: Option<StreamId>,
    /// Chunks ready to go out.
    out: VecDeque<Bytes>,
    /// When the next keep-alive comment is due.
    keep_alive: tokio::time::Interval,
    /// Changes when an operator retires a served consumer: this project's ends the stream.
    retirements: watch::Receiver<usize>,
    /// Set after the last chunk.
    done: bool,
    /// Nothing more is written before this instant: the last write plus the server's client
    /// write interval (see `next_chunk`).
    quiet_until: Instant,
}

impl Drop for Client {
    fn drop(&mut self) {
        release(&self.state);
    }
}

impl Client {
    fn new(
        state: Arc<AppState>,
        fan_out: Arc<FanOut>,
        subscription: Subscription,
        after: Option<StreamId>,
    ) -> Self {
        let period = state.keep_alive;
        let mut keep_alive = tokio::time::interval_at(Instant::now() + period, period);
        keep_alive.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let last_sent = after.or(subscription.handled_through);
        let mut retirements = state.probes.retirements();
        // Checked once at once: the consumer may have been retired since the request's check.
        retirements.mark_changed();
        Self {
            state,
            fan_out,
            subscription,
            last_sent,
            resume: after,
            // An SSE comment first, so the client sees the stream open at once.
            out: VecDeque::from([sse::comment("connected")]),
            keep_alive,
            retirements,
            done: false,
            quiet_until: Instant::now(),
        }
    }

    /// The next chunk to write, or `None` when the stream ends. A client that fell behind gets
    /// everything already queued for it in one chunk: one write instead of one per batch,
    /// which is what lets a starved client catch up instead of falling further behind.
    ///
    /// After a write the client waits out the write interval before it takes its queue again,
    /// so that under a steady stream each client costs at most one write (a wake-up, a system
    /// call, a TCP segment for each side) per interval, however often the consumer publishes:
    /// with a thousand clients the writes, not the bytes, were most of the server's and the
    /// clients' CPU. The first event after a quiet spell goes out at once, and so does a queue
    /// that passed half its limit (a burst must not cost the client its place).
    async fn next_chunk(&mut self) -> Option<Bytes> {
        loop {
            if !self.out.is_empty() {
                self.quiet_until = Instant::now() + self.state.client_write_interval;
                return Some(self.drain_out());
            }
            if self.done {
                return None;
            }
            if let Some(after) = self.resume.take() {
                if let Err(message) = self.catch_up(after).await {
                    return self.fail(message);
                }
                continue;
            }
            if Instant::now() < self.quiet_until {
                tokio::select! {
                    _ = self.state.shutdown.cancelled() => {}
                    _ = self.subscription.filling.notified() => {}
                    _ = tokio::time::sleep_until(self.quiet_until) => {}
                }
            }
            tokio::select! {
                biased;
                _ = self.state.shutdown.cancelled() => {
                    self.done = true;
                    return Some(sse::comment("server shutting down"));
                }
                batch = self.subscription.queue.recv() => match batch {
                    Some(batch) => {
                        if let Err(message) = self.take_queued(batch).await {
                            return self.fail(message);
                        }
                    }
                    None => {
                        self.done = true;
                        if self.subscription.lagged.load(Ordering::Acquire) {
                            return Some(self.lagged());
                        }
                        return None;
                    }
                },
                // The sender lives as long as the state: an error never comes.
                Ok(()) = self.retirements.changed() => {
                    if let Some(retired) = retired(&self.state, &self.fan_out) {
                        self.done = true;
                        return Some(retired);
                    }
                }
                _ = self.keep_alive.tick() => return Some(sse::comment("keep-alive")),
            }
        }
    }

    fn fail(&mut self, message: String) -> Option<Bytes> {
        tracing::warn!(project = %self.fan_out.project, error = %message, "SSE client stream ended");
        self.done = true;
        Some(sse::comment(&message))
    }

    fn lagged(&self) -> Bytes {
        let data = json!({
            "type": "lagged",
            "project_id": self.fan_out.project,
            // The sequence (an integer, as it always was) and the whole id to resume with.
            "last_event_id": self.last_sent.map(|id| id.sequence),
            "last_id": self.last_sent.map(|id| id.to_string()),
            "reason": "the client fell too far behind; reconnect with Last-Event-ID",
        });
        sse::message(None, "lagged", &data)
    }

    /// The resume of a client that named a position: a reconciliation first when the
    /// position is not in this history (see [`Client::diverged`]) or below the retention
    /// floor (even when the ring still holds the events: the stream's contract is by floor,
    /// not by what this process happens to remember), then history up to the ring, then the
    /// ring.
    async fn catch_up(&mut self, position: StreamId) -> Result<(), String> {
        let backlog = std::mem::take(&mut self.subscription.backlog);
        if let Some(reason) = self.diverged(position).await? {
            let mut client = self.read_client().await?;
            // The ring's frames after the position are dropped: those of this history are at or
            // below the head the reconciliation reads, and later events arrive on the queue.
            return self.reconcile(&mut client, reason).await.map(drop);
        }
        let after = position.sequence;
        let through = match (
            self.subscription.ring_first,
            self.subscription.handled_through,
        ) {
            // The ring covers everything after the position: only the floor is checked.
            (Some(first), _) if first <= after + 1 => after,
            (Some(first), _) => first - 1,
            (None, Some(handled)) => handled.sequence,
            // Nothing handled by this process yet: what the consumer acknowledged.
            (None, None) => self.acknowledged().await?.unwrap_or(after),
        };
        let behind = match backlog.last() {
            Some(last) => last.sequence() > after,
            None => through > after,
        };
        if behind {
            self.history(after, through).await?;
        }
        for frame in backlog {
            self.send(frame);
        }
        Ok(())
    }

    /// Why a client resuming at `position` must reconcile first, if it must: waiting after a
    /// position this history does not have would silently skip every event of this history
    /// up to it.
    ///
    /// - An id with an identity (what the stream sends) is checked against the event at its
    ///   sequence: in the ring when this process handled it, else in the database. Another
    ///   identity there, or a sequence beyond the head, means the id came from another
    ///   history (a failover lost the tail it came from, or the database was restored):
    ///   `history_diverged`. No retained event there (pruned: the floor check follows) passes.
    /// - A bare sequence (older clients) can only be checked against the head: beyond it,
    ///   `above_head`. A sequence this process has handled is at or below the head.
    ///
    /// A client whose id still matches the ring while the database's history changed under
    /// this process is not lost either: the durable consumer finds the divergence and
    /// reconciles, and that reconciliation reaches every client.
    async fn diverged(&self, position: StreamId) -> Result<Option<ReconcileReason>, String> {
        let after = position.sequence;
        let Some(tag) = position.tag else {
            let handled = self.subscription.handled_through.map(|id| id.sequence);
            if handled.is_none_or(|handled| after > handled) && after > self.head().await? {
                return Ok(Some(ReconcileReason::AboveHead));
            }
            return Ok(None);
        };
        let differs = if let Some(ring) = self.subscription.at_position {
            ring.tag != Some(tag)
        } else {
            let client = self.read_client().await?;
            let point = self
                .state
                .history
                .resume_point(&**client, &self.fan_out.project, after)
                .await
                .map_err(|e| format!("cannot check the resume position {position}: {e}"))?;
            after > point.head || point.event_id.is_some_and(|id| Tag::of(&id) != tag)
        };
        if !differs {
            return Ok(None);
        }
        tracing::info!(
            project = %self.fan_out.project,
            position = %position,
            "an SSE client resumed from a position this history does not have; reconciling it"
        );
        Ok(Some(ReconcileReason::HistoryDiverged))
    }

    /// The durable consumer's acknowledged cursor.
    async fn acknowledged(&self) -> Result<Option<i64>, String> {
        let client = self
            .state
            .read_pool
            .get()
            .await
            .map_err(|e| e.to_string())?;
        self.state
            .history
            .cursor(&**client, &self.fan_out.project, &self.state.consumer_id)
            .await
            .map_err(|e| format!("cannot read the cursor: {e}"))
    }

    /// A connection of the read pool.
    async fn read_client(&self) -> Result<deadpool_postgres::Object, String> {
        self.state.read_pool.get().await.map_err(|e| e.to_string())
    }

    /// The project's head.
    async fn head(&self) -> Result<i64, String> {
        let client = self.read_client().await?;
        let (head, _) = self
            .state
            .history
            .bounds(&**client, &self.fan_out.project)
            .await
            .map_err(|e| format!("cannot read the project's bounds: {e}"))?;
        Ok(head)
    }

    /// Sends a reconciliation (the live set and its head) for `reason`; returns the head,
    /// after which the client continues.
    async fn reconcile(
        &mut self,
        client: &mut deadpool_postgres::Object,
        reason: ReconcileReason,
    ) -> Result<i64, String> {
        let live = self
            .state
            .history
            .live_set(
                client,
                &self.fan_out.project,
                &self.state.live_query,
                reason,
            )
            .await
            .map_err(|e| format!("cannot read the live task set: {e}"))?;
        let head = live.head_sequence;
        let frame = Frame::reconcile(&live, &self.fan_out.consumer);
        self.out.push_back(frame.bytes);
        self.last_sent = Some(frame.id);
        Ok(head)
    }

    /// Sends retained events `after < sequence <= through` from PostgreSQL, or, when some of
    /// them were pruned, a reconciliation first.
    async fn history(&mut self, after: i64, through: i64) -> Result<(), String> {
        let fan_out = self.fan_out.clone();
        let project = &fan_out.project;
        let mut client = self
            .state
            .read_pool
            .get()
            .await
            .map_err(|e| e.to_string())?;
        let (_, floor) = self
            .state
            .history
            .bounds(&**client, project)
            .await
            .map_err(|e| format!("cannot read the project's bounds: {e}"))?;
        let mut from = after;
        if after < floor {
            from = self
                .reconcile(&mut client, ReconcileReason::BelowRetentionFloor)
                .await?;
        }
        while from < through {
            let events = self
                .state
                .history
                .read(
                    &**client,
                    project,
                    &self.state.consumer_id,
                    from,
                    through,
                    HISTORY_PAGE,
                )
                .await
                .map_err(|e| format!("cannot read history: {e}"))?;
            let Some(last) = events.last() else { break };
            from = last.sequence;
            let mut chunk = Vec::new();
            for event in &events {
                let frame = Frame::event(event);
                chunk.extend_from_slice(&frame.bytes);
                self.last_sent = Some(frame.id);
            }
            self.out.push_back(Bytes::from(chunk));
            if (events.len() as i64) < HISTORY_PAGE {
                break;
            }
        }
        Ok(())
    }

    /// Takes `first` and every batch already waiting behind it.
    async fn take_queued(&mut self, first: Arc<crate::fan_out::Batch>) -> Result<(), String> {
        let mut next = Some(first);
        while let Some(batch) = next {
            self.subscription
                .queued
                .fetch_sub(batch.frames.len(), Ordering::AcqRel);
            self.take(&batch).await?;
            next = self.subscription.queue.try_recv().ok();
        }
        Ok(())
    }

    /// Everything queued for output, as one chunk.
    fn drain_out(&mut self) -> Bytes {
        if self.out.len() == 1 {
            return self.out.pop_front().expect("one chunk");
        }
        let mut chunk = Vec::with_capacity(self.out.iter().map(Bytes::len).sum());
        for part in self.out.drain(..) {
            chunk.extend_from_slice(&part);
        }
        Bytes::from(chunk)
    }

    /// Queues `frame` unless the client already has it.
    fn send(&mut self, frame: Frame) {
        if self
            .last_sent
            .is_some_and(|last| frame.sequence() <= last.sequence)
        {
            return;
        }
        self.last_sent = Some(frame.id);
        self.out.push_back(frame.bytes);
    }

    /// Takes a published batch: whole when it follows on, filtered when the client already
    /// has part of it, after a history read when something lies between.
    async fn take(&mut self, batch: &crate::fan_out::Batch) -> Result<(), String> {
        let (Some(first), Some(last)) = (batch.frames.first(), batch.frames.last()) else {
            return Ok(());
        };
        if batch.reconcile {
            // Sent unless the client has this very reconciliation already (from its own
            // resume: the same head and identity). A head below what the client was sent is
            // no repeat, nor is one at the same number with another identity: the durable
            // consumer found the database's history diverged from the one those events came
            // from (a failover lost a tail), and the client must not wait for numbers the new
            // history has used for other events.
            if self.last_sent != Some(first.id) {
                self.last_sent = Some(first.id);
                self.out.push_back(first.bytes.clone());
            }
            return Ok(());
        }
        match self.last_sent.map(|id| id.sequence) {
            Some(sent) if last.sequence() <= sent => Ok(()),
            Some(sent) if first.sequence() > sent + 1 => {
                self.history(sent, first.sequence() - 1).await?;
                for frame in &batch.frames {
                    self.send(frame.clone());
                }
                Ok(())
            }
            Some(sent) if first.sequence() <= sent => {
                for frame in &batch.frames {
                    self.send(frame.clone());
                }
                Ok(())
            }
            _ => {
                self.last_sent = Some(last.id);
                self.out.push_back(batch.bytes.clone());
                Ok(())
            }
        }
    }
}

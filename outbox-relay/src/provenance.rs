//! Whether the last message of a subject (or, with the stream fence, of the project's subjects
//! together: `<prefix>.<project>.>`), as read from the stream, is one this relay stored: the
//! message the relay's next publish may name as the one before it.
//!
//! While the relay runs it follows each subject's end from its own PubAcks, and JetStream
//! refuses a publish after a message someone else stored (`Nats-Expected-Last-Subject-Sequence`
//! no longer matches). But whenever the relay learns the end from the stream instead (at
//! start, after a new connection, after a publish of unknown outcome), the stream's last
//! message becomes the expectation: a message published by another writer while the relay
//! was stopped would be adopted and every later event stored after it. So a learned last
//! message is adopted only when it is the relay's own: it names this project
//! (`Outbox-Project`), carries a numeric `Outbox-Sequence`, and its `Nats-Msg-Id` is the ID
//! of the event the database holds at that sequence, whose type is the one of the message's
//! subject (for the reconciliation subject, a reconciliation notice of this project). Anything
//! else is a conflict, handled as one found
//! while running: the event fails (`nats_sequence_conflict`), is retried on the retry
//! schedule and parked after the last attempt, replayable once the stranger is gone; each
//! attempt reads the stream again.
//!
//! One kind of mismatch is not a stranger: the relay's own event line (its `ce-id` is its
//! `Nats-Msg-Id`, its `ce-source` this project's) of an event the database does not know at
//! all, at a sequence the database numbers otherwise or not yet. That is a history the
//! database lost: the relay published it from a primary whose last transactions a failover
//! to an asynchronous standby did not carry over, and the relay was stopped through the
//! failover, so its own position never saw that tail. Waiting for an operator would wedge the
//! relay for good (the message is truly the stream's history); the relay instead reports the
//! divergence as the consumer would for its own position (`Lost`): a `history-diverged`
//! audit row and a reconciliation notice after the lost messages, then the new history after
//! the notice. Once this consumer's notice follows the lost message in the stream, the lost
//! message is history the notice superseded, and the relay publishes after it.

use deadpool_postgres::Pool;
use outbox_consumer::HandlerFailure;
use outbox_core::Schema;
use outbox_core::internal::Unnamed as _;

use outbox_core::contract::subject_token;

use crate::publisher::{Pipeline, Publisher, class};
use crate::subjects::{is_reconcile_subject, reconcile_subject};
use crate::tail::{self, LastMessage, TailError};

/// The event at a sequence of a project (its ID and type), whether the project has an event
/// with ID `$3` anywhere (a lost history's message has none), and the project's retention
/// floor, to tell a pruned event from one that never existed.
const EVENT_AT: &str = "
SELECT o.event_id, o.event_type,
       EXISTS (SELECT 1 FROM {{schema}}.lifecycle_outbox AS k
                WHERE k.project_id = $1 AND k.event_id = $3) AS known,
       COALESCE((SELECT h.pruned_through FROM {{schema}}.lifecycle_project_heads AS h
                  WHERE h.project_id = $1), 0) AS floor
  FROM (SELECT 1) AS one
  LEFT JOIN {{schema}}.lifecycle_outbox AS o ON o.project_id = $1 AND o.sequence = $2";

/// The database the relay's events come from, to recognise its own messages by their IDs.
#[derive(Clone)]
pub struct Ledger {
    pool: Pool,
    event_at: String,
}

impl Ledger {
    /// Events read through `pool` in `schema`.
    pub fn new(pool: Pool, schema: &Schema) -> Self {
        Self {
            pool,
            event_at: schema.render(EVENT_AT),
        }
    }
}

/// What the last message of a subject is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Provenance {
    /// The subject is empty, or its last message is the relay's own.
    Own,
    /// Another writer's message, or one that does not match the database: why.
    Stranger(String),
    /// The relay's own event line of an event the database does not have (a history lost in
    /// a failover, see the module docs): its `Outbox-Sequence` and `Nats-Msg-Id`, and why.
    Lost {
        /// The message's `Outbox-Sequence`.
        sequence: i64,
        /// The message's `Nats-Msg-Id` (the lost event's ID).
        msg_id: String,
        /// What the database holds instead.
        why: String,
    },
}

/// The `ce-source` of the relay's event lines of `project`.
pub fn event_source(project: &str) -> String {
    format!("urn:lifecycle-outbox:project:{project}")
}

/// Whether `message` is shaped as the relay's event line of `project`: its CloudEvents ID is
/// its `Nats-Msg-Id` and its source is the project's.
fn is_event_line(message: &LastMessage, project: &str) -> bool {
    message.msg_id.is_some()
        && message.ce_id == message.msg_id
        && message.ce_source.as_deref() == Some(event_source(project).as_str())
}

/// Whether `notice`, the reconciliation subject's last message, is `consumer`'s notice of
/// `project` stored after `event`, the event subject's last message: the relay reconciled
/// past whatever `event` is.
pub fn notice_follows(
    notice: &LastMessage,
    event: &LastMessage,
    project: &str,
    consumer: &str,
) -> bool {
    notice.tail.stream_sequence > event.tail.stream_sequence
        && by_headers(notice, project) == Some(Provenance::Own)
        && notice
            .msg_id
            .as_deref()
            .is_some_and(|id| id.starts_with(&format!("reconcile:{project}:{consumer}:")))
}

/// Which kind of subject a message was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubjectKind {
    /// `<prefix>.<project>.<type token>`, one per event type.
    Events,
    /// `<prefix>.<project>.reconcile`.
    Reconcile,
}

impl SubjectKind {
    /// The kind of one of a project's subjects.
    pub fn of(subject: &str) -> Self {
        if is_reconcile_subject(subject) {
            Self::Reconcile
        } else {
            Self::Events
        }
    }
}

/// The checks that need no database: the headers every message of the relay carries. `None`
/// when they pass (and, for events, the database has the last word).
pub fn by_headers(last: &LastMessage, project: &str) -> Option<Provenance> {
    if last.tail.stream_sequence == 0 {
        return Some(Provenance::Own);
    }
    let kind = SubjectKind::of(&last.subject);
    if last.project.as_deref() != Some(project) {
        return Some(Provenance::Stranger(match &last.project {
            Some(other) => format!("its Outbox-Project header is {other:?}, not {project:?}"),
            None => "it has no Outbox-Project header".to_owned(),
        }));
    }
    let Some(sequence) = last.tail.outbox_sequence else {
        return Some(Provenance::Stranger(
            "it has no numeric Outbox-Sequence header".to_owned(),
        ));
    };
    let Some(msg_id) = last.msg_id.as_deref() else {
        return Some(Provenance::Stranger(
            "it has no Nats-Msg-Id header".to_owned(),
        ));
    };
    match kind {
        SubjectKind::Reconcile => Some(
            if msg_id.starts_with(&format!("reconcile:{project}:"))
                && msg_id.ends_with(&format!(":{sequence}"))
            {
                Provenance::Own
            } else {
                Provenance::Stranger(format!(
                    "its Nats-Msg-Id {msg_id:?} is not a reconciliation notice of {project:?} \
                     at {sequence}"
                ))
            },
        ),
        SubjectKind::Events => None,
    }
}

/// Decides whether `last` is the relay's own message of `project`; `Err` when the database
/// could not be asked (the caller fails the event as unavailable and asks again later).
pub async fn check(
    ledger: Option<&Ledger>,
    last: &LastMessage,
    project: &str,
) -> Result<Provenance, String> {
    if let Some(decided) = by_headers(last, project) {
        return Ok(decided);
    }
    let (Some(ledger), Some(sequence), Some(msg_id)) =
        (ledger, last.tail.outbox_sequence, last.msg_id.as_deref())
    else {
        return Ok(Provenance::Own);
    };
    let client = ledger
        .pool
        .get()
        .await
        .map_err(|e| format!("cannot reach the database: {e}"))?;
    let row = client
        .query_one_unnamed(&ledger.event_at, &[&project, &sequence, &msg_id])
        .await
        .map_err(|e| format!("cannot read event {sequence} of {project}: {e}"))?;
    let event_id: Option<String> = row.try_get("event_id").map_err(|e| e.to_string())?;
    let event_type: Option<String> = row.try_get("event_type").map_err(|e| e.to_string())?;
    let known: bool = row.try_get("known").map_err(|e| e.to_string())?;
    let floor: i64 = row.try_get("floor").map_err(|e| e.to_string())?;
    let event = event_id.as_deref().zip(event_type.as_deref());
    let decided = by_ledger(event, floor, sequence, &last.subject, msg_id, project);
    Ok(match decided {
        Provenance::Stranger(why) if !known && is_event_line(last, project) => Provenance::Lost {
            sequence,
            msg_id: msg_id.to_owned(),
            why,
        },
        decided => decided,
    })
}

/// The database's word: the event at `sequence` (if retained) must have `msg_id` as its ID,
/// and its type must be the one `subject` carries (a message of another type's subject, or of
/// a subject no type has, is not the relay's); one pruned (at or below `floor`) cannot be
/// checked and is taken as the relay's own.
fn by_ledger(
    event: Option<(&str, &str)>,
    floor: i64,
    sequence: i64,
    subject: &str,
    msg_id: &str,
    project: &str,
) -> Provenance {
    match event {
        Some((id, _)) if id != msg_id => Provenance::Stranger(format!(
            "its Outbox-Sequence {sequence} is event {id} of {project:?}, but its Nats-Msg-Id \
             is {msg_id:?}"
        )),
        Some((_, event_type))
            if subject.rsplit('.').next() != Some(subject_token(event_type).as_str()) =>
        {
            Provenance::Stranger(format!(
                "it is on {subject}, but event {sequence} of {project:?} is a {event_type} event"
            ))
        }
        Some(_) => Provenance::Own,
        None if sequence <= floor => Provenance::Own,
        None => Provenance::Stranger(format!(
            "{project:?} has no event numbered {sequence} (its Outbox-Sequence)"
        )),
    }
}

impl Publisher {
    /// The subject's last message read from the stream, adopted only when it is the relay's
    /// own (see the module docs); `subject` may be a wildcard (the stream fence reads the last
    /// message of the project's subjects together). `for_notice`: the relay is about to
    /// publish its reconciliation notice after it, which is what a lost history asks for.
    pub(crate) async fn learn_tail(
        &self,
        state: &mut Pipeline,
        subject: &str,
        for_notice: bool,
    ) -> Result<LastMessage, HandlerFailure> {
        let js = Self::js(state);
        let mut learned = tail::learn(&js, &self.settings.stream, subject).await;
        if let Err(TailError::StreamMissing(detail)) = &learned {
            // The stream is gone (an operator deleted it, or the cluster lost it): the relay
            // checks it again as at start, which creates it when missing, and reads again.
            tracing::warn!(error = %detail, "the stream is missing; checking it again");
            self.ensure_stream(&js).await?;
            learned = tail::learn(&js, &self.settings.stream, subject).await;
        }
        let mut last = match learned {
            Ok(last) => last,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the stream's last message");
                return Err(class("nats_unavailable"));
            }
        };
        let project = &self.settings.project;
        match check(self.ledger.as_ref(), &last, project).await {
            Ok(Provenance::Own) => {}
            Ok(Provenance::Lost { .. }) if for_notice => {
                // The notice about to follow it supersedes the lost history.
                last.tail.outbox_sequence = None;
            }
            Ok(Provenance::Lost {
                sequence,
                msg_id,
                why,
            }) => {
                let notice = reconcile_subject(&self.settings.prefix, project);
                let reconciled = tail::learn(&js, &self.settings.stream, &notice)
                    .await
                    .map(|notice| notice_follows(&notice, &last, project, &self.settings.consumer))
                    .map_err(|e| {
                        tracing::warn!(error = %e, "cannot read the stream's last notice");
                        class("nats_unavailable")
                    })?;
                if !reconciled {
                    tracing::error!(
                        subject = %last.subject,
                        stream_sequence = last.tail.stream_sequence,
                        "the subject's last message in the stream is this relay's event from \
                         a history the database no longer has ({why}; a failover lost the old \
                         primary's last events while the relay was stopped); reconciling \
                         after it"
                    );
                    return Err(HandlerFailure::history_diverged(sequence, msg_id));
                }
                // Superseded by this consumer's notice: no event of the database's history is
                // in the stream after it.
                last.tail.outbox_sequence = None;
            }
            Ok(Provenance::Stranger(why)) => {
                tracing::error!(
                    subject = %last.subject,
                    stream_sequence = last.tail.stream_sequence,
                    "the subject's last message in the stream is not one this relay stored \
                     ({why}); not publishing after it: the event fails and is retried on the \
                     retry schedule, never skipped (remove the message from the stream, then \
                     replay what was parked)"
                );
                return Err(class("nats_sequence_conflict"));
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot check the stream's last message");
                return Err(class("database_unavailable"));
            }
        }
        tracing::info!(
            subject = %last.subject,
            stream_sequence = last.tail.stream_sequence,
            outbox_sequence = last
                .tail
                .outbox_sequence
                .map_or_else(|| "none".to_owned(), |s| s.to_string()),
            "read the subject's last message in the stream"
        );
        Ok(last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tail::Tail;

    fn message(project: Option<&str>, sequence: Option<i64>, msg_id: Option<&str>) -> LastMessage {
        LastMessage {
            subject: "lifecycle.p1.task_deleted".into(),
            tail: Tail {
                stream_sequence: 7,
                outbox_sequence: sequence,
            },
            project: project.map(str::to_owned),
            msg_id: msg_id.map(str::to_owned),
            ce_id: None,
            ce_source: None,
        }
    }

    #[test]
    fn headers_tell_a_stranger() {
        let empty = LastMessage {
            subject: "lifecycle.p1.>".into(),
            tail: Tail {
                stream_sequence: 0,
                outbox_sequence: None,
            },
            project: None,
            msg_id: None,
            ce_id: None,
            ce_source: None,
        };
        assert_eq!(by_headers(&empty, "p1"), Some(Provenance::Own));
        for foreign in [
            message(None, Some(3), Some("e3")),
            message(Some("p2"), Some(3), Some("e3")),
            message(Some("p1"), None, Some("e3")),
            message(Some("p1"), Some(3), None),
        ] {
            assert!(
                matches!(by_headers(&foreign, "p1"), Some(Provenance::Stranger(_))),
                "{foreign:?}"
            );
        }
        let ours = message(Some("p1"), Some(3), Some("e3"));
        assert_eq!(by_headers(&ours, "p1"), None);
        let on_reconcile = |m: LastMessage| LastMessage {
            subject: "lifecycle.p1.reconcile".into(),
            ..m
        };
        let notice = on_reconcile(message(Some("p1"), Some(3), Some("reconcile:p1:relay:3")));
        assert_eq!(by_headers(&notice, "p1"), Some(Provenance::Own));
        assert!(matches!(
            by_headers(&on_reconcile(ours), "p1"),
            Some(Provenance::Stranger(_))
        ));
    }

    #[test]
    fn only_the_relays_event_line_can_be_a_lost_history() {
        let mut lost = message(Some("p1"), Some(3), Some("a3"));
        assert!(!is_event_line(&lost, "p1"), "no CloudEvents headers");
        lost.ce_id = Some("a3".into());
        lost.ce_source = Some(event_source("p1"));
        assert!(is_event_line(&lost, "p1"));
        assert!(!is_event_line(&lost, "p2"), "another project's source");
        lost.ce_id = Some("other".into());
        assert!(!is_event_line(&lost, "p1"), "ce-id is not the message ID");
    }

    #[test]
    fn a_notice_of_this_consumer_after_the_message_supersedes_it() {
        let event = message(Some("p1"), Some(200), Some("a200"));
        let mut notice = message(Some("p1"), Some(210), Some("reconcile:p1:relay:210"));
        notice.subject = "lifecycle.p1.reconcile".into();
        notice.tail.stream_sequence = 8;
        assert!(notice_follows(&notice, &event, "p1", "relay"));
        assert!(
            !notice_follows(&notice, &event, "p1", "other"),
            "another consumer's"
        );
        notice.tail.stream_sequence = 6;
        assert!(
            !notice_follows(&notice, &event, "p1", "relay"),
            "stored before it"
        );
        let empty = LastMessage {
            tail: Tail {
                stream_sequence: 0,
                outbox_sequence: None,
            },
            ..event.clone()
        };
        assert!(!notice_follows(&empty, &event, "p1", "relay"));
    }

    #[test]
    fn the_database_has_the_last_word_on_events() {
        const DELETES: &str = "lifecycle.p1.task_deleted";
        let deleted = Some(("e3", "task:deleted"));
        assert_eq!(
            by_ledger(deleted, 0, 3, DELETES, "e3", "p1"),
            Provenance::Own
        );
        assert!(matches!(
            by_ledger(deleted, 0, 3, DELETES, "intruder", "p1"),
            Provenance::Stranger(_)
        ));
        assert_eq!(
            by_ledger(None, 5, 3, DELETES, "e3", "p1"),
            Provenance::Own,
            "pruned: cannot be checked"
        );
        assert!(matches!(
            by_ledger(None, 5, 99, DELETES, "intruder", "p1"),
            Provenance::Stranger(_)
        ));
        // The right ID on another type's subject is a copy, not the relay's message.
        let archived = Some(("e4", "task:archived"));
        assert_eq!(
            by_ledger(archived, 0, 4, "lifecycle.p1.task_archived", "e4", "p1"),
            Provenance::Own
        );
        assert_eq!(
            by_ledger(archived, 0, 4, DELETES, "e4", "p1"),
            Provenance::Stranger(
                "it is on lifecycle.p1.task_deleted, but event 4 of \"p1\" is a task:archived \
                 event"
                    .into()
            )
        );
    }
}

//! The probe project before and after a run: refused when something other than the probe
//! uses it, cleared of an interrupted run's leftovers, and left empty afterwards (the probe
//! consumer retired with an audit row, its events pruned).

use std::time::Duration;

use outbox_core::admin::{Admin, Reason};
use outbox_core::internal::Unnamed;
use outbox_core::retention::{PruneOptions, Pruner};
use outbox_core::{ConsumerId, OperatorName, ProjectId, Schema};
use tokio_postgres::Client;

use super::checks::Check;
use super::probe::PROBE_WRITER;
use super::sql;
use crate::failure::Failure;

/// Refuses (exit 2) a project holding events a probe did not write, or consumers that are no
/// probe's: the probe would prune them.
pub async fn refuse_real_use(
    client: &Client,
    schema: &Schema,
    project: &ProjectId,
) -> Result<(), Failure> {
    let row = client
        .query_one_unnamed(
            &schema.render(sql::PROJECT_CONTENTS),
            &[&project.as_str(), &PROBE_WRITER],
        )
        .await?;
    let foreign: i64 = row.get("foreign");
    if foreign > 0 {
        let example: String = row.get("example");
        return Err(Failure::usage(format!(
            "project {project} holds {foreign} event(s) no probe wrote (e.g. {example}); \
             outbox verify needs a project of its own: pass --project with an unused name"
        )));
    }
    for row in client
        .query_unnamed(&schema.render(sql::PROJECT_CONSUMERS), &[&project.as_str()])
        .await?
    {
        let consumer: String = row.get("consumer_id");
        if !consumer.starts_with("verify-") {
            return Err(Failure::usage(format!(
                "project {project} has consumer {consumer}, which is no probe's; outbox verify \
                 needs a project of its own: pass --project with an unused name"
            )));
        }
    }
    Ok(())
}

/// Retires the probe consumers an interrupted run left active and prunes its events, so this
/// run starts on an empty stream. A probe consumer whose lease is live means another `outbox
/// verify` runs on the project now: that cannot run alongside (exit 1).
pub async fn clear_leftovers(
    client: &mut Client,
    schema: &Schema,
    project: &ProjectId,
) -> Result<(), Failure> {
    let admin = Admin::new(schema);
    let rows = client
        .query_unnamed(&schema.render(sql::PROJECT_CONSUMERS), &[&project.as_str()])
        .await?;
    for row in rows {
        let consumer: String = row.get("consumer_id");
        let (state, leased): (String, bool) = (row.get("state"), row.get("leased"));
        if leased {
            return Err(Failure::runtime(format!(
                "probe consumer {consumer} of project {project} holds its lease: another outbox \
                 verify runs on this project; wait for it or pass another --project"
            )));
        }
        if state != "retired" {
            let id = ConsumerId::new(consumer).map_err(|e| Failure::runtime(e.to_string()))?;
            admin
                .retire(
                    client,
                    project,
                    &id,
                    &actor(),
                    &reason("left by an interrupted run"),
                )
                .await?;
        }
    }
    prune(client, schema, project).await
}

/// Retires the probe consumer (an audit row says so) and prunes the probe events; the check
/// `cleaned_up` confirms that no lease is held and no event is left.
pub async fn retire_and_prune(
    client: &mut Client,
    schema: &Schema,
    project: &ProjectId,
    consumer: &ConsumerId,
) -> Check {
    let outcome = async {
        Admin::new(schema)
            .retire(
                client,
                project,
                consumer,
                &actor(),
                &reason("probe finished"),
            )
            .await?;
        prune(client, schema, project).await?;
        let state = client
            .query_one_unnamed(
                &schema.render(sql::PROBE_CONSUMER_STATE),
                &[&project.as_str(), &consumer.as_str()],
            )
            .await?;
        let left = client
            .query_one_unnamed(
                &schema.render(sql::PROJECT_CONTENTS),
                &[&project.as_str(), &PROBE_WRITER],
            )
            .await?
            .get::<_, i64>("events");
        let (leased, audited): (bool, bool) =
            (state.get("leased"), state.get("retirement_audited"));
        Ok::<_, Failure>(match (leased, audited, left) {
            (false, true, 0) => None,
            _ => Some(format!(
                "after cleanup: lease held {leased}, retirement audited {audited}, {left} \
                 event(s) left in {project}"
            )),
        })
    };
    let (name, fine) = (
        "cleaned_up",
        format!("consumer {consumer} retired (audited), lease released, probe events pruned"),
    );
    match outcome.await {
        Ok(None) => Check {
            name,
            ok: true,
            detail: fine,
        },
        Ok(Some(detail)) => Check {
            name,
            ok: false,
            detail,
        },
        Err(failure) => Check {
            name,
            ok: false,
            detail: format!("cleanup failed: {failure}"),
        },
    }
}

/// Prunes every probe event of the project (retention zero: nothing non-retired holds them).
async fn prune(client: &mut Client, schema: &Schema, project: &ProjectId) -> Result<(), Failure> {
    let options = PruneOptions {
        retention: Duration::ZERO,
        project: Some(project.clone()),
        actor: PROBE_WRITER.to_owned(),
        ..PruneOptions::default()
    };
    let pruner = Pruner::new(schema, options).map_err(|e| Failure::runtime(e.to_string()))?;
    let mut sweep = pruner.sweep();
    while sweep.step(client).await? {}
    Ok(())
}

fn actor() -> OperatorName {
    OperatorName::new(PROBE_WRITER).expect("a valid operator name")
}

fn reason(why: &str) -> Reason {
    Reason::new(format!("outbox verify: {why}")).expect("a valid reason")
}

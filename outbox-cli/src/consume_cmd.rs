//! `outbox consume`: run one durable consumer, or a set of them in one process, with a
//! built-in sink.

use outbox_consumer::{
    ConsumerConfig, ConsumerError, DeliverySettings, Duties, Projects, RetrySchedule, StartFrom,
};
use outbox_core::{ConsumerId, ProjectId};

use crate::args::ConsumerRef;
use crate::child::ChildSink;
use crate::cli::{ConsumeArgs, ConsumerOptions, Global, StartFromArg};
use crate::failure::{ExitCode, Failure};
use crate::sink::StdoutSink;
use crate::start::Started;

pub async fn run(global: &Global, args: ConsumeArgs) -> Result<(), Failure> {
    args.check().map_err(Failure::usage)?;
    let Some((project, consumer)) = args.targets.single() else {
        return run_set(global, args).await;
    };
    let options = &args.options;
    let consumer = ConsumerRef {
        project: project.clone(),
        consumer_id: consumer.clone(),
    };
    let mut config = build_config(global, &consumer, options)?;
    args.lanes
        .apply(&mut config.delivery)
        .map_err(Failure::usage)?;
    if args.child.child.is_none() {
        crate::sink::refuse_closed_stdout()?;
    }
    let Some(started) = Started::open(global, options, &config.duties.availability).await? else {
        return Ok(());
    };
    let connections = &started.connections;

    let consumer_id = consumer.consumer_id.to_string();
    let args_live_query = options.live_query.is_some();
    let token = started.shutdown.token();
    let result = match args.child.child.clone() {
        Some(command) => {
            let sink = ChildSink::new(
                command,
                consumer_id,
                args.child.child_timeout,
                args.child.child_stop_grace,
                token.clone(),
                args.lanes.lanes > 1,
            );
            let force = sink.clone();
            started.shutdown.on_force(move || force.kill_now());
            let result = connections.consumer(config, sink.clone()).run(token).await;
            sink.close().await;
            result
        }
        None => {
            let sink = StdoutSink::new(consumer_id);
            let out = sink.for_consumer(String::new());
            let result = connections.consumer(config, sink).run(token).await;
            out.close().await;
            result
        }
    };
    started.close().await;
    finish(result, "consumer", args_live_query, "outbox consume")
}

/// Several projects, every project, or several consumer IDs: one [`outbox_consumer::ConsumerSet`] on one pool
/// and one LISTEN connection, printing the same lines as a lone consumer (each names its
/// project and consumer). A pair that fails is logged and stops alone; the process ends with
/// the first such failure's exit code once it stops.
async fn run_set(global: &Global, args: ConsumeArgs) -> Result<(), Failure> {
    let options = &args.options;
    if args.child.child.is_some() {
        return Err(Failure::usage(
            "--child drives one consumer; with several projects, --all-projects or several \
             consumer IDs, run one `outbox consume --child` per consumer instead",
        ));
    }
    let targets = &args.targets;
    let mut template = delivery_settings(options)?;
    args.lanes.apply(&mut template).map_err(Failure::usage)?;
    let duties = duties(global, options)?;
    crate::sink::refuse_closed_stdout()?;
    let projects = match targets.all_projects {
        true => Projects::All,
        false => Projects::Listed(targets.projects.clone()),
    };
    let Some(started) = Started::open(global, options, &duties.availability).await? else {
        return Ok(());
    };
    let sink = std::sync::Arc::new(StdoutSink::new(String::new()));
    let out = sink.for_consumer(String::new());
    let factory = move |_: &ProjectId, consumer: &ConsumerId| {
        let sink = std::sync::Arc::new(sink.for_consumer(consumer.to_string()));
        (sink.clone(), sink)
    };
    let set = started.connections.set(
        template,
        duties,
        projects,
        targets.consumer_ids.clone(),
        factory,
    );
    let custom_live_query = options.live_query.is_some();
    let outcomes = set.run(started.shutdown.token()).await;
    out.close().await;
    started.close().await;
    let outcomes = outcomes.map_err(|e| classify(e, custom_live_query, "outbox consume"))?;
    let total = outcomes.len();
    let mut failures = outcomes.into_iter().filter_map(|o| o.result.err());
    match failures.next() {
        None => {
            tracing::info!(consumers = total, "consumer set stopped");
            Ok(())
        }
        Some(first) => {
            let mut failure = classify(first, custom_live_query, "outbox consume");
            let others = failures.count();
            if others > 0 {
                failure.message = format!(
                    "{} (and {others} more of the {total} consumers failed; see the log)",
                    failure.message
                );
            }
            Err(failure)
        }
    }
}

/// Logs how a run of `what` (consumer, relay) ended, or turns its error into the command's
/// failure (see [`classify`]).
pub(crate) fn finish(
    result: Result<outbox_consumer::RunSummary, ConsumerError>,
    what: &str,
    custom_live_query: bool,
    command: &str,
) -> Result<(), Failure> {
    match result {
        Ok(summary) => {
            tracing::info!(
                delivered = summary.delivered,
                cursor = %outbox_consumer::internal::ShownCursor(summary.cursor),
                generation = summary.generation,
                "{what} stopped"
            );
            Ok(())
        }
        Err(e) => Err(classify(e, custom_live_query, command)),
    }
}

/// Maps a consumer error to the command's failure; `custom_live_query` says whether the
/// live query came from --live-query (else it is the default, which the message then shows);
/// `command` is what a retired consumer is told to run again with --reactivate.
pub(crate) fn classify(e: ConsumerError, custom_live_query: bool, command: &str) -> Failure {
    if let Some(denied) = crate::failure::permission_denied(&e) {
        return denied;
    }
    let code = match &e {
        ConsumerError::LiveQueryInvalid(problem) if custom_live_query => {
            return Failure::usage(format!("invalid --live-query: {problem}"));
        }
        ConsumerError::LiveQueryInvalid(problem) => {
            return Failure::usage(format!(
                "the default live query ({}) does not fit this database: {problem}; give the \
                 query of your schema with --live-query",
                outbox_consumer::config::DEFAULT_LIVE_QUERY
            ));
        }
        ConsumerError::Config(_) => ExitCode::Usage,
        ConsumerError::Retired {
            project,
            consumer,
            by,
            reason,
        } => {
            return Failure {
                code: ExitCode::Conflict,
                message: format!(
                    "consumer {consumer} of project {project} is retired (by {by}: {reason}); to \
                     resume it (it reconciles first), run: {command} --project {project} \
                     --consumer-id {consumer} --reactivate"
                ),
            };
        }
        ConsumerError::LeaseHeld { .. } => ExitCode::Conflict,
        ConsumerError::UnknownConsumer { .. } => ExitCode::NotFound,
        _ => ExitCode::Runtime,
    };
    Failure {
        code,
        message: e.to_string(),
    }
}

/// The configuration of `consumer` running with `args`, checked.
pub fn build_config(
    global: &Global,
    consumer: &ConsumerRef,
    args: &ConsumerOptions,
) -> Result<ConsumerConfig, Failure> {
    Ok(ConsumerConfig {
        project_id: consumer.project.clone(),
        consumer_id: consumer.consumer_id.clone(),
        delivery: delivery_settings(args)?,
        duties: duties(global, args)?,
    })
}

/// How every consumer running with `args` delivers, checked.
pub fn delivery_settings(args: &ConsumerOptions) -> Result<DeliverySettings, Failure> {
    args.check_relations().map_err(Failure::usage)?;
    let max_batch_size = match args.max_batch_size {
        Some(max) if max < args.batch_size => {
            return Err(Failure::usage(format!(
                "--max-batch-size {max} is smaller than --batch-size {}: reads start at \
                 --batch-size and grow up to --max-batch-size",
                args.batch_size
            )));
        }
        Some(max) => max,
        None => outbox_consumer::config::DEFAULT_MAX_BATCH_SIZE.max(args.batch_size),
    };
    let mut delivery = DeliverySettings {
        batch_size: args.batch_size,
        max_batch_size,
        lease_ttl: args.lease_ttl,
        heartbeat_interval: args.heartbeat_interval,
        poll_interval: args.poll_interval,
        retry: RetrySchedule::new(args.retry_delays.clone(), args.max_attempts)
            .map_err(|e| Failure::usage(e.to_string()))?,
        start_from: match args.start_from {
            StartFromArg::Reconcile => StartFrom::Reconcile,
            StartFromArg::Earliest => StartFrom::Earliest,
        },
        wait_for_lease: !args.no_wait,
        reactivate: args.reactivate,
        existing_only: args.existing_only,
        exit_when_caught_up: args.exit_when_caught_up,
        shutdown_grace: args.shutdown_grace,
        event_types: args.event_types.clone(),
        ..DeliverySettings::default()
    };
    if let Some(query) = &args.live_query {
        let live_query = outbox_consumer::config::LiveQuery::Custom(query.clone());
        if let Some(problem) = live_query.problem() {
            return Err(Failure::usage(format!("invalid --live-query: {problem}")));
        }
        delivery.live_query = live_query;
    }
    delivery
        .validate()
        .map_err(|e| Failure::usage(e.to_string()))?;
    Ok(delivery)
}

/// What a process running consumers with `args` does beside delivering, checked, with the
/// process's one [`Availability`](outbox_consumer::outage::Availability) (`--give-up-after`).
pub fn duties(global: &Global, args: &ConsumerOptions) -> Result<Duties, Failure> {
    if !args.no_sequencer {
        crate::cli::check_min_tick_pause(
            args.min_tick_pause,
            "sequence_interval",
            args.sequence_interval,
        )
        .map_err(Failure::usage)?;
    }
    let availability = outbox_consumer::outage::Availability::new();
    availability.set_give_up_after(args.give_up_after);
    let duties = Duties {
        schema: global.schema.clone(),
        // The runtime polls only behind `--pooler transaction`, whatever this says.
        listen: !args.no_listen,
        pooler: global.pooler.into(),
        // Gauges cost a statement per sample: only for a process that exports them.
        gauge_interval: args.metrics_addr.map(|_| args.poll_interval),
        sequence_interval: (!args.no_sequencer).then_some(args.sequence_interval),
        sequencer_lease_ttl: args.sequencer_lease_ttl,
        min_tick_pause: args.min_tick_pause,
        prune_interval: (!args.no_prune).then_some(args.prune_interval),
        retention: args.retention,
        availability,
    };
    duties
        .validate()
        .map_err(|e| Failure::usage(e.to_string()))?;
    Ok(duties)
}

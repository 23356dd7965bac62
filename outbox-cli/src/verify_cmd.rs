//! `outbox verify`: runs the gap-safety probe (see `verify/`) and reports it; exit 0 when
//! every check holds, 5 naming each that failed, 1 when it cannot run, 2 for a project in
//! real use.

use std::time::Duration;

use clap::Args;
use outbox_core::ProjectId;

use crate::cli::{Global, Output, parse_duration};
use crate::failure::{ExitCode, Failure};
use crate::output::{Render, print};
use crate::verify::{self, Report};

/// `outbox verify`.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The dedicated probe project, named `outbox-verify` or `outbox-verify<anything>` (the
    /// probe projects, which `--all-projects` consumers never follow): it must hold nothing but
    /// probe events (refused with exit 2 otherwise); it is left empty.
    #[arg(long, default_value = outbox_core::ids::PROBE_PROJECT_PREFIX, value_parser = probe_project)]
    pub project: ProjectId,
    /// Probe transactions in all (committed, committed with several events, rolled back,
    /// committed late, in turn): 4 to 10000.
    #[arg(long, default_value_t = 40, allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(4..=10_000))]
    pub transactions: u32,
    /// Concurrent probe writers (each a connection of its own): 1 to 64.
    #[arg(long, default_value_t = 4, allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub writers: u32,
    /// How long a late transaction stays open after its write while the others commit.
    #[arg(long, allow_hyphen_values = true, value_parser = parse_duration, default_value = "200ms")]
    pub late_commit: Duration,
    /// The probe consumer's fallback poll interval (its only wake-up without LISTEN).
    #[arg(long, allow_hyphen_values = true, value_parser = parse_duration, default_value = "100ms")]
    pub poll_interval: Duration,
    /// How long to wait for every committed probe event to be numbered and delivered.
    #[arg(long, allow_hyphen_values = true, value_parser = parse_duration, default_value = "60s")]
    pub timeout: Duration,
    /// How long the LISTEN check waits for its notification.
    #[arg(long, allow_hyphen_values = true, value_parser = parse_duration, default_value = "5s")]
    pub listen_timeout: Duration,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// `--project`: a valid project ID that names a probe project.
fn probe_project(value: &str) -> Result<ProjectId, String> {
    let project = ProjectId::new(value).map_err(|e| e.to_string())?;
    match project.is_probe() {
        true => Ok(project),
        false => Err(format!(
            "{value} is not a probe project: its ID must start with {prefix} (e.g. \
             {prefix}-{value}), so that consumers following every project leave it alone",
            prefix = outbox_core::ids::PROBE_PROJECT_PREFIX
        )),
    }
}

pub async fn run(global: &Global, args: VerifyArgs) -> Result<(), Failure> {
    // Installed first: a signal at any moment stops the probe and cleans up after it.
    let shutdown = crate::shutdown::Shutdown::install()?;
    let database = global.database()?;
    let options = verify::Options {
        project: args.project,
        transactions: args.transactions as usize,
        writers: args.writers as usize,
        late_commit: args.late_commit,
        poll_interval: args.poll_interval,
        timeout: args.timeout,
        listen_timeout: args.listen_timeout,
    };
    let report = verify::run(&database, &global.schema, &options, &shutdown.token()).await?;
    print(args.output, &report)?;
    let failed = report.failed();
    if failed.is_empty() {
        return Ok(());
    }
    Err(Failure {
        code: ExitCode::Unhealthy,
        message: format!("verify: check(s) failed: {}", failed.join(", ")),
    })
}

impl Render for Report {
    fn table(&self) -> String {
        let t = &self.topology;
        let ms = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1} ms"));
        let mut out = format!(
            "project      {}\nconsumer     {} (retired)\nrole         {}\nserver       \
             PostgreSQL {}\ntls          {}\npooler       {} ({} backend(s) over 4 \
             transactions of one connection)\nlisten       {}\nprobe        {} transactions: {} \
             events committed ({} transactions late), {} rolled back; {} delivered\nlatency      \
             commit -> delivery p50 {}, p99 {}, max {}\n\n",
            self.project,
            self.consumer,
            t.role,
            t.server_version,
            t.tls,
            t.pooler,
            t.backends_per_connection,
            t.listen.describe(),
            self.probe.transactions,
            self.probe.committed_events,
            self.probe.late_transactions,
            self.probe.rolled_back_events,
            self.probe.delivered,
            ms(self.latency_ms.p50),
            ms(self.latency_ms.p99),
            ms(self.latency_ms.max),
        );
        let width = self.checks.iter().map(|c| c.name.len()).max().unwrap_or(5);
        out.push_str(&format!("{:<width$}  RESULT  DETAIL\n", "CHECK"));
        for check in &self.checks {
            let result = if check.ok { "ok" } else { "FAILED" };
            out.push_str(&format!(
                "{:<width$}  {result:<6}  {}\n",
                check.name, check.detail
            ));
        }
        out
    }

    fn json(&self) -> impl serde::Serialize + '_ {
        #[derive(serde::Serialize)]
        struct Json<'a> {
            ok: bool,
            failed: Vec<&'static str>,
            #[serde(flatten)]
            report: &'a Report,
        }
        Json {
            ok: self.failed().is_empty(),
            failed: self.failed(),
            report: self,
        }
    }
}

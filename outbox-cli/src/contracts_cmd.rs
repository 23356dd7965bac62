//! `outbox contracts add|list|show|deprecate|retire|export`: the event contract registry.

use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};
use outbox_core::OperatorName;
use outbox_core::admin::Admin;
use outbox_core::admin::{RegisteredContract, Registration};
use outbox_core::contract::{Contract, ContractRef};
use serde::Serialize;

use crate::args::Operator;
use crate::cli::{Global, Output};
use crate::failure::Failure;
use crate::output::{Render, Table, opt, print, time};

/// Largest contract file read, in bytes.
const MAX_CONTRACT_FILE: u64 = 256 * 1024;

/// `outbox contracts ...`.
#[derive(Debug, Subcommand)]
pub enum ContractsCommand {
    /// Register a contract file (JSON; see the book's "Event contracts"): a new type, a new
    /// major beside the old one, or a new minor of an active major that only adds optional
    /// fields (anything else is refused, naming the field). Audited `contract-added`.
    Add(AddArgs),
    /// List every registered type and major: minor, status, who registered it.
    List(ListArgs),
    /// Show one contract (`task:archived@1`) with its fields.
    Show(ShowArgs),
    /// Deprecate a major: writes are still accepted; consumers should move to its successor.
    /// Audited `contract-deprecated`.
    Deprecate(ChangeArgs),
    /// Retire a major: writes of it are refused from now on. Refused while a consumer still
    /// has events of it to handle. Audited `contract-retired`.
    Retire(ChangeArgs),
    /// Print the registered contracts as an AsyncAPI 3 document (the relay's subjects and the
    /// SSE stream) or as JSON Schemas.
    Export(ExportArgs),
}

/// `contracts add`.
#[derive(Debug, Args)]
pub struct AddArgs {
    /// The contract file (JSON).
    pub file: PathBuf,
    /// Who registers it (recorded in the audit trail): A-Z a-z 0-9 . _ : @ -, at most 64.
    #[arg(long, value_name = "OPERATOR")]
    pub by: OperatorName,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// `contracts list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Output format.
    #[arg(long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// `contracts show`.
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The type and major: `task:archived@1`.
    pub contract: ContractRef,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// `contracts deprecate` and `retire`.
#[derive(Debug, Args)]
pub struct ChangeArgs {
    /// The type and major: `task:archived@1`.
    pub contract: ContractRef,
    /// Who acts and why.
    #[command(flatten)]
    pub operator: Operator,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// `contracts export --format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ExportFormat {
    /// An AsyncAPI 3.0 document (JSON).
    Asyncapi,
    /// `{"schemas": [...]}`: one JSON Schema (draft 2020-12) per type and major.
    JsonSchema,
}

/// `contracts export`.
#[derive(Debug, Args)]
pub struct ExportArgs {
    /// What to print.
    #[arg(long, value_enum)]
    pub format: ExportFormat,
    /// The relay's subject prefix, for the AsyncAPI channels (as `relay nats --subject-prefix`).
    #[arg(long, default_value = "lifecycle")]
    pub subject_prefix: String,
}

pub async fn run(global: &Global, command: ContractsCommand) -> Result<(), Failure> {
    // The file is read and checked before any connection is made.
    let added = match &command {
        ContractsCommand::Add(args) => Some(read_contract(&args.file)?),
        _ => None,
    };
    let mut client = global.database()?.connect().await?;
    let admin = Admin::new(&global.schema);
    match command {
        ContractsCommand::Add(args) => {
            let contract = added.expect("read above");
            let registration = admin.add_contract(&mut client, &contract, &args.by).await?;
            print(
                args.output,
                &Added {
                    contract: contract.reference(),
                    minor: contract.minor,
                    registration,
                },
            )
        }
        ContractsCommand::List(args) => print(
            args.output,
            &ContractList(admin.contracts(&mut client).await?),
        ),
        ContractsCommand::Show(args) => print(
            args.output,
            &Shown(admin.contract(&mut client, &args.contract).await?),
        ),
        ContractsCommand::Deprecate(args) => {
            let (o, c) = (&args.operator, &args.contract);
            let changed = admin
                .deprecate_contract(&mut client, c, &o.by, &o.reason)
                .await?;
            print(args.output, &Changed(changed))
        }
        ContractsCommand::Retire(args) => {
            let (o, c) = (&args.operator, &args.contract);
            let changed = admin
                .retire_contract(&mut client, c, &o.by, &o.reason)
                .await?;
            print(args.output, &Changed(changed))
        }
        ContractsCommand::Export(args) => {
            let contracts: Vec<Contract> = admin
                .contracts(&mut client)
                .await?
                .into_iter()
                .map(|c| c.contract)
                .collect();
            let document = match args.format {
                ExportFormat::Asyncapi => {
                    outbox_core::contract::asyncapi(&contracts, &args.subject_prefix)
                }
                ExportFormat::JsonSchema => serde_json::json!({
                    "schemas": contracts.iter().map(outbox_core::contract::json_schema)
                        .collect::<Vec<_>>()
                }),
            };
            let text = serde_json::to_string_pretty(&document)
                .map_err(|e| Failure::runtime(format!("cannot encode the document: {e}")))?;
            println!("{text}");
            Ok(())
        }
    }
}

/// Reads and checks a contract file, naming the file in every refusal.
fn read_contract(path: &PathBuf) -> Result<Contract, Failure> {
    let shown = path.display();
    let size = std::fs::metadata(path)
        .map_err(|e| Failure::usage(format!("cannot read contract file {shown}: {e}")))?
        .len();
    if size > MAX_CONTRACT_FILE {
        return Err(Failure::usage(format!(
            "contract file {shown} is {size} bytes, over the limit of {MAX_CONTRACT_FILE}"
        )));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| Failure::usage(format!("cannot read contract file {shown}: {e}")))?;
    Contract::from_json(&text).map_err(|e| Failure::usage(format!("contract file {shown}: {e}")))
}

/// `contracts add`'s result.
#[derive(Serialize)]
struct Added {
    contract: ContractRef,
    minor: u32,
    registration: Registration,
}

impl Render for Added {
    fn table(&self) -> String {
        match self.registration {
            Registration::Added => format!("registered {} (minor {})\n", self.contract, self.minor),
            Registration::NewMinor { from } => format!(
                "registered {} minor {} (was minor {from})\n",
                self.contract, self.minor
            ),
            Registration::AlreadyRegistered => format!(
                "{} minor {} is already registered as this file describes it; nothing changed\n",
                self.contract, self.minor
            ),
        }
    }

    fn json(&self) -> impl Serialize + '_ {
        self
    }
}

/// `contracts list`: `{"contracts": [...]}`.
struct ContractList(Vec<RegisteredContract>);

#[derive(Serialize)]
struct ContractListJson<'a> {
    contracts: &'a [RegisteredContract],
}

impl Render for ContractList {
    fn table(&self) -> String {
        let mut table = Table::new(&[
            "CONTRACT",
            "MINOR",
            "STATUS",
            "IDENTITY",
            "FIELDS",
            "REGISTERED",
            "REGISTERED_BY",
            "CHANGED_BY",
        ]);
        for c in &self.0 {
            table.row(vec![
                c.contract.reference().to_string(),
                c.contract.minor.to_string(),
                c.status.to_string(),
                c.contract.identity.join(","),
                c.contract.fields.len().to_string(),
                time(Some(c.registered_at)),
                c.registered_by.clone(),
                opt(c.changed_by.as_deref()),
            ]);
        }
        table.render()
    }

    fn json(&self) -> impl Serialize + '_ {
        ContractListJson { contracts: &self.0 }
    }
}

/// `contracts show`.
struct Shown(RegisteredContract);

impl Render for Shown {
    fn table(&self) -> String {
        let c = &self.0;
        let mut out = format!(
            "{} minor {} ({})\n{}\nidentity: {}\nregistered {} by {}\n",
            c.contract.reference(),
            c.contract.minor,
            c.status,
            c.contract.description,
            if c.contract.identity.is_empty() {
                "(the subject alone)".to_owned()
            } else {
                c.contract.identity.join(", ")
            },
            time(Some(c.registered_at)),
            c.registered_by,
        );
        if let (Some(by), Some(at)) = (&c.changed_by, c.changed_at) {
            out.push_str(&format!("changed {} by {by}\n", time(Some(at))));
        }
        let mut table = Table::new(&["FIELD", "TYPE", "REQUIRED", "RULE"]);
        field_rows(&mut table, "", &c.contract.fields);
        out.push_str(&table.render());
        out
    }

    fn json(&self) -> impl Serialize + '_ {
        &self.0
    }
}

fn field_rows(table: &mut Table, prefix: &str, fields: &outbox_core::contract::Fields) {
    use outbox_core::contract::FieldType;
    for (name, spec) in fields {
        let rule = match &spec.field_type {
            FieldType::Identifier { max_length } => format!("at most {max_length} characters"),
            FieldType::Integer { minimum, maximum } => format!(
                "{}..{}",
                minimum.map(|m| m.to_string()).unwrap_or_default(),
                maximum.map(|m| m.to_string()).unwrap_or_default()
            ),
            FieldType::Enum { values } => values.join("|"),
            _ => String::new(),
        };
        table.row(vec![
            format!("{prefix}{name}"),
            spec.field_type.name().into(),
            if spec.required { "yes" } else { "no" }.into(),
            rule,
        ]);
        if let FieldType::Object { fields } = &spec.field_type {
            field_rows(table, &format!("{prefix}{name}."), fields);
        }
    }
}

/// `contracts deprecate` and `retire`.
struct Changed(RegisteredContract);

impl Render for Changed {
    fn table(&self) -> String {
        format!(
            "{} is now {} (by {})\n",
            self.0.contract.reference(),
            self.0.status,
            opt(self.0.changed_by.as_deref())
        )
    }

    fn json(&self) -> impl Serialize + '_ {
        &self.0
    }
}

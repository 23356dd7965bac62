//! One connection factory for every process: the CLI, the consumer's pool and its LISTEN
//! connection, the benches and the test kit.
//!
//! It reads the TLS settings libpq users know (`sslmode`, `sslrootcert`, `sslcert`, `sslkey`,
//! in the URL or through `PGSSLMODE` / `PGSSLROOTCERT`), builds a rustls connector for them,
//! and carries the [`Pooler`] mode, which decides how statements are sent.
//!
//! TLS is rustls with the `ring` provider, so nothing links OpenSSL. The modes follow libpq:
//!
//! | sslmode       | TLS                    | server certificate checked against the roots | host name |
//! |---------------|------------------------|----------------------------------------------|-----------|
//! | `disable`     | never                  | -                                            | -         |
//! | `prefer`      | if the server offers it| no                                           | no        |
//! | `require`     | always                 | only when `sslrootcert` is given (as libpq)  | no        |
//! | `verify-ca`   | always                 | yes                                          | no        |
//! | `verify-full` | always                 | yes                                          | yes       |
//!
//! Over a Unix socket there is no TLS whatever the mode says, as with libpq (which ignores
//! `sslmode` there).
//!
//! ## Modules
//! - `settings`: [`ConnectSettings`], [`SslMode`], [`RootCert`], [`Pooler`], and parsing.
//! - `tls`: the rustls client configuration and the certificate files it reads.
//! - `verifiers`: the certificate verifiers of `require` and `verify-ca`.
//! - `error`: [`ConnectError`].
//! - `explain`: connection failures named by their cause.
//! - `hosts`: the hosts tried one by one as libpq tries them (TLS per host, none on a Unix
//!   socket; [`TargetSession`], libpq's `target_session_attrs`).
//! - `factory`: [`Connector`], single connections and the deadpool pool.
//! - `outage`: [`is_outage`], the failures a long-running process waits out.
//! - [`libpq_env`]: the libpq environment (`PGHOST`, ..., the password file), which
//!   tokio-postgres does not read.

mod error;
mod explain;
mod factory;
mod hosts;
mod outage;
mod settings;
mod tls;
mod verifiers;

pub use error::ConnectError;
pub use explain::explain;
pub use factory::Connector;
pub use hosts::{TargetSession, TlsConnection, WrongServer};
pub use outage::is_outage;
pub use settings::{ConnectSettings, Pooler, RootCert, SslMode};

/// The libpq environment: `PGHOST`, `PGPORT`, `PGUSER`, `PGDATABASE`, `PGPASSWORD`,
/// `PGAPPNAME`, `PGCONNECT_TIMEOUT`, and the password file (`PGPASSFILE`, or `~/.pgpass`),
/// which tokio-postgres does not read. The code is the crate's `libpq_env` module, re-exported
/// here so its log lines keep their target (`outbox_core::libpq_env`).
pub mod libpq_env {
    pub use crate::libpq_env::{
        CONNECTION_VARIABLES, EnvConnection, EnvError, apply_passfile, config_from_env,
        passfile_path,
    };
}

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

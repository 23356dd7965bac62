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
//! ## Modules
//! - `settings`: [`ConnectSettings`], [`SslMode`], [`RootCert`], [`Pooler`], and parsing.
//! - `tls`: the rustls client configuration and the certificate files it reads.
//! - `verifiers`: the certificate verifiers of `require` and `verify-ca`.
//! - `error`: [`ConnectError`].
//! - `explain`: connection failures named by their cause.
//! - `factory`: [`Connector`], single connections and the deadpool pool.
//! - `outage`: [`is_outage`], the failures a long-running process waits out.

mod error;
mod explain;
mod factory;
mod outage;
mod settings;
mod tls;
mod verifiers;

pub use error::ConnectError;
pub use explain::explain;
pub use factory::Connector;
pub use outage::is_outage;
pub use settings::{ConnectSettings, Pooler, RootCert, SslMode};

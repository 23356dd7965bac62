//! Who the relay is to NATS and how it checks who NATS is: the credentials and TLS settings
//! the connection is opened with, already read and checked (the CLI resolves them from the
//! URL and its flags). Secrets never reach a `Debug` print.

use std::path::PathBuf;

use async_nats::ConnectOptions;

/// Who the relay is to NATS.
#[derive(Clone, PartialEq, Eq)]
pub enum Credentials {
    /// No authentication.
    None,
    /// A user and a password.
    UserPassword {
        /// User name.
        user: String,
        /// Password.
        password: String,
    },
    /// A token.
    Token(String),
    /// An NKey user seed.
    NKey(String),
    /// The contents of a `.creds` file.
    Creds(String),
}

impl Credentials {
    /// What kind of credentials these are, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::None => "no credentials",
            Self::UserPassword { .. } => "user and password",
            Self::Token(_) => "token",
            Self::NKey(_) => "NKey",
            Self::Creds(_) => "credentials file",
        }
    }
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::UserPassword { user, .. } => write!(f, "UserPassword({user}, ***)"),
            other => write!(f, "{}(***)", other.kind()),
        }
    }
}

/// The TLS side of a connection.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tls {
    /// TLS is required (a plain connection is refused).
    pub required: bool,
    /// CA certificates trusted for the servers' certificates (the system's roots otherwise).
    pub ca: Option<PathBuf>,
    /// Client certificate and key, for mutual TLS.
    pub client: Option<(PathBuf, PathBuf)>,
}

/// Credentials and TLS, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Security {
    /// Who the relay is.
    pub credentials: Credentials,
    /// How the connection is encrypted and the server checked.
    pub tls: Tls,
}

impl Security {
    /// The client options that carry these settings.
    pub fn apply(&self, mut options: ConnectOptions) -> ConnectOptions {
        options = match &self.credentials {
            Credentials::None => options,
            Credentials::UserPassword { user, password } => {
                options.user_and_password(user.clone(), password.clone())
            }
            Credentials::Token(token) => options.token(token.clone()),
            Credentials::NKey(seed) => options.nkey(seed.clone()),
            Credentials::Creds(contents) => options
                .credentials(contents)
                .expect("a credentials file is parsed when the settings are resolved"),
        };
        if let Some(ca) = &self.tls.ca {
            options = options.add_root_certificates(ca.clone());
        }
        if let Some((cert, key)) = &self.tls.client {
            options = options.add_client_certificate(cert.clone(), key.clone());
        }
        options.require_tls(self.tls.required)
    }
}

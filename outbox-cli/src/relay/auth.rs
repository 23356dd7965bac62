//! How the relay proves who it is to NATS and checks who NATS is, following the conventions
//! of the `nats` CLI and the official clients: a user and password or a token (in the URL or
//! as flags), an NKey seed file, or a JWT `.creds` file; TLS by the `tls://` scheme or the
//! `--nats-tls-*` flags, with a private CA and a client certificate for mutual TLS.
//!
//! Everything is read and checked before anything connects, so a missing file, a seed that is
//! not a seed or two conflicting ways to authenticate exit 2 naming the problem; a refusal by
//! the server exits 1 naming the cause (see `diagnose.rs`). Secrets never reach a
//! message or a `Debug` print.

use std::path::{Path, PathBuf};

use async_nats::ConnectOptions;
use clap::Args;

use outbox_relay::settings::{NatsUrls, UserInfo};
use outbox_relay::{Credentials, Security, Tls};

/// The relay's NATS authentication and TLS flags.
#[derive(Args)]
pub struct NatsAuthArgs {
    /// NATS user name (with --nats-password or NATS_PASSWORD).
    #[arg(long, value_name = "USER")]
    pub nats_user: Option<String>,
    /// Password of --nats-user (or of the user in --nats-url); prefer the NATS_PASSWORD
    /// environment variable, which other processes cannot read from the command line.
    #[arg(
        long,
        value_name = "PASSWORD",
        env = "NATS_PASSWORD",
        hide_env_values = true
    )]
    pub nats_password: Option<String>,
    /// NATS authentication token.
    #[arg(long, value_name = "TOKEN")]
    pub nats_token: Option<String>,
    /// File holding an NKey user seed (SU...), to sign the server's challenge.
    #[arg(long, value_name = "FILE")]
    pub nats_nkey: Option<PathBuf>,
    /// JWT credentials file (.creds: the user JWT and its NKey seed).
    #[arg(long, value_name = "FILE")]
    pub nats_creds: Option<PathBuf>,
    /// PEM file of the CA certificates that sign the servers' certificates (implies TLS).
    #[arg(long, value_name = "FILE")]
    pub nats_tls_ca: Option<PathBuf>,
    /// PEM client certificate for mutual TLS (with --nats-tls-key; implies TLS).
    #[arg(long, value_name = "FILE", requires = "nats_tls_key")]
    pub nats_tls_cert: Option<PathBuf>,
    /// PEM private key of --nats-tls-cert.
    #[arg(long, value_name = "FILE", requires = "nats_tls_cert")]
    pub nats_tls_key: Option<PathBuf>,
    /// Refuse a connection that is not TLS (tls:// and the --nats-tls-* files imply it).
    #[arg(long)]
    pub nats_tls_required: bool,
}

impl std::fmt::Debug for NatsAuthArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secret = |given: bool| if given { "***" } else { "none" };
        f.debug_struct("NatsAuthArgs")
            .field("nats_user", &self.nats_user)
            .field("nats_password", &secret(self.nats_password.is_some()))
            .field("nats_token", &secret(self.nats_token.is_some()))
            .field("nats_nkey", &self.nats_nkey)
            .field("nats_creds", &self.nats_creds)
            .field("nats_tls_ca", &self.nats_tls_ca)
            .field("nats_tls_cert", &self.nats_tls_cert)
            .field("nats_tls_key", &self.nats_tls_key)
            .field("nats_tls_required", &self.nats_tls_required)
            .finish()
    }
}

/// Combines the URLs' user info and the flags into one way to authenticate, reading and
/// checking every file; each refusal names the problem (exit 2).
pub fn resolve_security(urls: &NatsUrls, args: &NatsAuthArgs) -> Result<Security, String> {
    let credentials = credentials(urls.user_info.as_ref(), args)?;
    for (flag, file) in [
        ("--nats-tls-ca", &args.nats_tls_ca),
        ("--nats-tls-cert", &args.nats_tls_cert),
    ] {
        if let Some(file) = file {
            check_pem(flag, file, "CERTIFICATE")?;
        }
    }
    if let Some(file) = &args.nats_tls_key {
        check_pem("--nats-tls-key", file, "PRIVATE KEY")?;
    }
    let client = args.nats_tls_cert.clone().zip(args.nats_tls_key.clone());
    let tls = Tls {
        required: args.nats_tls_required
            || urls.servers.iter().any(|s| s.tls)
            || args.nats_tls_ca.is_some()
            || client.is_some(),
        ca: args.nats_tls_ca.clone(),
        client,
    };
    Ok(Security { credentials, tls })
}

/// The one way to authenticate that the URL and the flags give.
fn credentials(url: Option<&UserInfo>, args: &NatsAuthArgs) -> Result<Credentials, String> {
    if url.is_some_and(|u| u.password.is_some()) && args.nats_password.is_some() {
        return Err(
            "--nats-url has a password and --nats-password (or NATS_PASSWORD) gives another: \
             give the password once"
                .into(),
        );
    }
    if url.is_some() && (args.nats_user.is_some() || args.nats_token.is_some()) {
        return Err(
            "--nats-url has credentials and --nats-user or --nats-token gives others: give \
             them once"
                .into(),
        );
    }
    let mut found = Vec::new();
    match (url, &args.nats_user, &args.nats_password) {
        (Some(UserInfo { name, password }), None, flag) => {
            match password.as_ref().or(flag.as_ref()) {
                Some(password) => found.push(Credentials::UserPassword {
                    user: name.clone(),
                    password: password.clone(),
                }),
                None => found.push(Credentials::Token(name.clone())),
            }
        }
        (_, Some(user), Some(password)) => found.push(Credentials::UserPassword {
            user: user.clone(),
            password: password.clone(),
        }),
        (_, Some(_), None) => {
            return Err("--nats-user needs a password: --nats-password or NATS_PASSWORD".into());
        }
        (None, None, Some(_)) => {
            return Err(
                "--nats-password (or NATS_PASSWORD) needs a user: --nats-user, or \
                 nats://USER@HOST in --nats-url"
                    .into(),
            );
        }
        (None, None, None) => {}
    }
    if let Some(token) = &args.nats_token {
        if token.is_empty() {
            return Err("--nats-token must not be empty".into());
        }
        found.push(Credentials::Token(token.clone()));
    }
    if let Some(file) = &args.nats_nkey {
        found.push(Credentials::NKey(read_seed(file)?));
    }
    if let Some(file) = &args.nats_creds {
        let contents = read("--nats-creds", file)?;
        if ConnectOptions::with_credentials(&contents).is_err() {
            return Err(format!(
                "--nats-creds {}: not a NATS credentials file (expected a user JWT and an NKey \
                 seed, as `nsc generate creds` writes)",
                file.display()
            ));
        }
        found.push(Credentials::Creds(contents));
    }
    match found.len() {
        0 => Ok(Credentials::None),
        1 => Ok(found.pop().expect("one")),
        _ => Err(format!(
            "choose one way to authenticate to NATS; given: {}",
            found
                .iter()
                .map(Credentials::kind)
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

fn read(flag: &str, file: &Path) -> Result<String, String> {
    std::fs::read_to_string(file).map_err(|e| format!("cannot read {flag} {}: {e}", file.display()))
}

/// Reads an NKey user seed: the file's one non-empty line that is a seed (`nsc` and `nk`
/// write comment lines around it in some layouts).
fn read_seed(file: &Path) -> Result<String, String> {
    let text = read("--nats-nkey", file)?;
    let not_a_seed = || {
        format!(
            "--nats-nkey {}: not an NKey user seed (expected one line starting with SU, as \
             `nk -gen user` writes)",
            file.display()
        )
    };
    let seed = text
        .lines()
        .map(str::trim)
        .find(|line| line.starts_with('S'))
        .ok_or_else(not_a_seed)?;
    let pair = nkeys::KeyPair::from_seed(seed).map_err(|_| not_a_seed())?;
    if !pair.public_key().starts_with('U') {
        return Err(not_a_seed());
    }
    Ok(seed.to_owned())
}

/// Checks that `file` is readable and holds a PEM block of `label` (`CERTIFICATE`, `PRIVATE
/// KEY`, which `RSA PRIVATE KEY` and `EC PRIVATE KEY` also end with).
fn check_pem(flag: &str, file: &Path, label: &str) -> Result<(), String> {
    let text = read(flag, file)?;
    let found = text.lines().any(|line| {
        line.strip_prefix("-----BEGIN ")
            .and_then(|rest| rest.strip_suffix("-----"))
            .is_some_and(|name| name.ends_with(label))
    });
    if found {
        Ok(())
    } else {
        Err(format!(
            "{flag} {}: no PEM {label} in the file",
            file.display()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_relay::parse_nats_urls;

    fn none() -> NatsAuthArgs {
        NatsAuthArgs {
            nats_user: None,
            nats_password: None,
            nats_token: None,
            nats_nkey: None,
            nats_creds: None,
            nats_tls_ca: None,
            nats_tls_cert: None,
            nats_tls_key: None,
            nats_tls_required: false,
        }
    }

    fn resolve(url: &str, args: &NatsAuthArgs) -> Result<Security, String> {
        resolve_security(&parse_nats_urls(url).unwrap(), args)
    }

    #[test]
    fn credentials_from_the_url_and_the_flags() {
        let plain = resolve("nats://h:1", &none()).unwrap();
        assert_eq!(plain.credentials, Credentials::None);
        assert!(!plain.tls.required);
        let user = resolve("nats://u:p@h:1", &none()).unwrap();
        assert_eq!(
            user.credentials,
            Credentials::UserPassword {
                user: "u".into(),
                password: "p".into()
            }
        );
        let token = resolve("nats://t@h:1", &none()).unwrap();
        assert_eq!(token.credentials, Credentials::Token("t".into()));
        let env_password = NatsAuthArgs {
            nats_password: Some("p".into()),
            ..none()
        };
        assert_eq!(
            resolve("nats://u@h:1", &env_password).unwrap().credentials,
            Credentials::UserPassword {
                user: "u".into(),
                password: "p".into()
            },
            "the URL's user with NATS_PASSWORD"
        );
        let flags = NatsAuthArgs {
            nats_user: Some("u".into()),
            ..env_password
        };
        assert!(matches!(
            resolve("tls://h:1", &flags).unwrap(),
            Security { credentials: Credentials::UserPassword { .. }, tls } if tls.required
        ));
    }

    #[test]
    fn conflicts_are_refused() {
        let password = NatsAuthArgs {
            nats_password: Some("p2".into()),
            ..none()
        };
        let err = resolve("nats://u:p@h:1", &password).unwrap_err();
        assert!(err.contains("give the password once"), "{err}");
        let err = resolve("nats://h:1", &password).unwrap_err();
        assert!(err.contains("needs a user"), "{err}");
        let user = NatsAuthArgs {
            nats_user: Some("u".into()),
            ..none()
        };
        let err = resolve("nats://h:1", &user).unwrap_err();
        assert!(err.contains("needs a password"), "{err}");
        let both = NatsAuthArgs {
            nats_token: Some("t".into()),
            nats_user: Some("u".into()),
            nats_password: Some("p".into()),
            ..none()
        };
        let err = resolve("nats://h:1", &both).unwrap_err();
        assert!(
            err.contains("choose one way to authenticate to NATS; given: user and password, token"),
            "{err}"
        );
        assert!(
            !format!("{both:?}").contains("\"p\""),
            "Debug hides the password"
        );
    }

    #[test]
    fn files_are_checked_before_connecting() {
        let dir = std::env::temp_dir().join(format!("outbox-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = NatsAuthArgs {
            nats_nkey: Some(dir.join("missing.nk")),
            ..none()
        };
        let err = resolve("nats://h:1", &missing).unwrap_err();
        assert!(err.contains("cannot read --nats-nkey"), "{err}");
        let garbage = dir.join("garbage.nk");
        std::fs::write(&garbage, "SUnot-a-seed\n").unwrap();
        let err = resolve(
            "nats://h:1",
            &NatsAuthArgs {
                nats_nkey: Some(garbage.clone()),
                ..none()
            },
        )
        .unwrap_err();
        assert!(err.contains("not an NKey user seed"), "{err}");
        assert!(
            !err.contains("SUnot"),
            "the file's contents are not shown: {err}"
        );
        let seed = dir.join("user.nk");
        let pair = nkeys::KeyPair::new_user();
        std::fs::write(&seed, format!("{}\n", pair.seed().unwrap())).unwrap();
        let ok = resolve(
            "nats://h:1",
            &NatsAuthArgs {
                nats_nkey: Some(seed),
                ..none()
            },
        )
        .unwrap();
        assert!(matches!(ok.credentials, Credentials::NKey(_)));
        let account = dir.join("account.nk");
        std::fs::write(&account, nkeys::KeyPair::new_account().seed().unwrap()).unwrap();
        let err = resolve(
            "nats://h:1",
            &NatsAuthArgs {
                nats_nkey: Some(account),
                ..none()
            },
        )
        .unwrap_err();
        assert!(err.contains("not an NKey user seed"), "{err}");
        let err = resolve(
            "nats://h:1",
            &NatsAuthArgs {
                nats_creds: Some(garbage.clone()),
                ..none()
            },
        )
        .unwrap_err();
        assert!(err.contains("not a NATS credentials file"), "{err}");
        let err = resolve(
            "nats://h:1",
            &NatsAuthArgs {
                nats_tls_ca: Some(garbage),
                ..none()
            },
        )
        .unwrap_err();
        assert!(err.contains("no PEM CERTIFICATE"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    proptest::proptest! {
        /// A password or token given as a flag, in the URL, or both, appears neither in a
        /// refusal nor in the `Debug` of the flags or of the settings they resolve to.
        #[test]
        fn no_secret_of_the_flags_is_ever_printed(
            core in "[!-~]{1,24}",
            form in 0..5u8,
        ) {
            // The "#9" tail keeps the secret from being a piece of the fixed words around it.
            let secret = format!("{core}#9");
            proptest::prop_assume!(!secret.contains(['@', ',', ':', '/']));
            let (url, args) = match form {
                0 => ("nats://h:1".to_owned(), NatsAuthArgs { nats_user: Some("u".into()), nats_password: Some(secret.clone()), ..none() }),
                1 => ("nats://h:1".to_owned(), NatsAuthArgs { nats_token: Some(secret.clone()), ..none() }),
                2 => (format!("nats://u:{secret}@h:1"), NatsAuthArgs { nats_password: Some(secret.clone()), ..none() }),
                3 => (format!("nats://{secret}@h:1"), NatsAuthArgs { nats_token: Some(secret.clone()), ..none() }),
                _ => ("nats://h:1".to_owned(), NatsAuthArgs { nats_password: Some(secret.clone()), ..none() }),
            };
            let Ok(urls) = parse_nats_urls(&url) else {
                return Ok(());
            };
            let shown = format!("{args:?}");
            proptest::prop_assert!(!shown.contains(&secret), "{shown}");
            let outcome = match resolve_security(&urls, &args) {
                Ok(security) => format!("{security:?}"),
                Err(message) => message,
            };
            proptest::prop_assert!(!outcome.contains(&secret), "{outcome}");
        }
    }
}

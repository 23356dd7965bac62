//! A PostgreSQL cluster that accepts TLS connections only, with a certificate authority and a
//! server certificate generated for the run.
//!
//! The server listens on 127.0.0.1 on a port picked free at start; `pg_hba.conf` has
//! `hostssl` lines only, so a plain connection is refused. Its certificate names `localhost`
//! (and not `127.0.0.1`), so connecting by address exercises host-name verification. A second,
//! unrelated CA is written beside the real one, for the untrusted-certificate case.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::process_kit::is_root;

/// The role that must authenticate with a client certificate (`cert` in `pg_hba.conf`).
pub const CERT_USER: &str = "certuser";

/// A running TLS-only cluster; stopped and removed when dropped.
pub struct TlsCluster {
    /// Working directory: data, certificates, log.
    pub dir: PathBuf,
    /// TCP port on 127.0.0.1.
    pub port: u16,
    /// The CA that signed the server certificate (PEM file).
    pub ca: PathBuf,
    /// A CA that signed nothing here (PEM file).
    pub other_ca: PathBuf,
    /// A client certificate for role [`CERT_USER`], signed by the CA (PEM file).
    pub client_cert: PathBuf,
    /// Its private key (PEM file).
    pub client_key: PathBuf,
    bindir: PathBuf,
    root: bool,
}

fn find_bindir() -> PathBuf {
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if dir.join("initdb").exists() {
            return dir;
        }
    }
    let mut candidates: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| e.path().join("bin"))
                .filter(|p| p.join("initdb").exists())
                .collect()
        })
        .unwrap_or_default();
    candidates.sort();
    candidates
        .pop()
        .expect("PostgreSQL server binaries not found (scripts/pg.sh installs them; run make test)")
}

fn new_ca(name: &str) -> (String, Issuer<'static, KeyPair>) {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
    ];
    let key = KeyPair::generate().expect("CA key");
    let cert = params.self_signed(&key).expect("self-signed CA");
    (cert.pem(), Issuer::new(params, key))
}

impl TlsCluster {
    /// Generates the certificates, initialises the cluster and starts it.
    pub fn start() -> Self {
        let bindir = find_bindir();
        let root = is_root();
        // The process and a counter: the test binary starts several at the same time.
        static STARTED: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "outbox-tls-{}-{}",
            std::process::id(),
            STARTED.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create TLS cluster directory");

        let (ca_pem, issuer) = new_ca("outbox test CA");
        let (other_pem, _) = new_ca("some other CA");
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
        params
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let server_key = KeyPair::generate().expect("server key");
        let server = params
            .signed_by(&server_key, &issuer)
            .expect("sign server certificate");

        let mut client = CertificateParams::new(Vec::<String>::new()).expect("params");
        client
            .distinguished_name
            .push(DnType::CommonName, CERT_USER);
        client.use_authority_key_identifier_extension = true;
        client.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let client_key = KeyPair::generate().expect("client key");
        let client_cert = client
            .signed_by(&client_key, &issuer)
            .expect("sign client certificate");
        std::fs::write(dir.join("client.crt"), client_cert.pem()).unwrap();
        std::fs::write(dir.join("client.key"), client_key.serialize_pem()).unwrap();

        let ca = dir.join("ca.pem");
        let other_ca = dir.join("other-ca.pem");
        std::fs::write(&ca, ca_pem).unwrap();
        std::fs::write(&other_ca, other_pem).unwrap();
        std::fs::write(dir.join("server.crt"), server.pem()).unwrap();
        std::fs::write(dir.join("server.key"), server_key.serialize_pem()).unwrap();

        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("free port");
        let cluster = Self {
            client_cert: dir.join("client.crt"),
            client_key: dir.join("client.key"),
            dir,
            port,
            ca,
            other_ca,
            bindir,
            root,
        };
        if root {
            cluster.run(
                "chown",
                &["-R", "postgres:", &cluster.dir.display().to_string()],
            );
        }
        cluster.run_owner(
            "chmod",
            &[
                "0600",
                &cluster.dir.join("server.key").display().to_string(),
            ],
        );
        let data = cluster.dir.join("data");
        let initdb = cluster.bindir.join("initdb").display().to_string();
        cluster.run_owner(
            &initdb,
            &[
                "-D",
                &data.display().to_string(),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C.UTF-8",
                "--no-sync",
            ],
        );
        let conf = format!(
            "\nlisten_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = ''\n\
             ssl = on\nssl_cert_file = '{d}/server.crt'\nssl_key_file = '{d}/server.key'\n\
             ssl_ca_file = '{d}/ca.pem'\n\
             fsync = off\nmax_connections = 200\nlog_min_messages = warning\n",
            d = cluster.dir.display()
        );
        append(&data.join("postgresql.conf"), &conf);
        // TLS connections only: no `host` or `local` lines. CERT_USER must present a client
        // certificate signed by the CA.
        std::fs::write(
            data.join("pg_hba.conf"),
            format!(
                "hostssl all {CERT_USER} 127.0.0.1/32 cert\nhostssl all all 127.0.0.1/32 trust\n"
            ),
        )
        .unwrap();
        let pg_ctl = cluster.bindir.join("pg_ctl").display().to_string();
        cluster.run_owner(
            &pg_ctl,
            &[
                "-D",
                &data.display().to_string(),
                "-l",
                &cluster.dir.join("server.log").display().to_string(),
                "-w",
                "-t",
                "60",
                "start",
            ],
        );
        cluster
    }

    fn run(&self, program: &str, args: &[&str]) {
        let output = Command::new(program)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("run {program}: {e}"));
        assert!(
            output.status.success(),
            "{program} {args:?} failed: {}{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
            std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
        );
    }

    /// Runs a command as the cluster's owner (`postgres` under root).
    fn run_owner(&self, program: &str, args: &[&str]) {
        if self.root {
            let mut all = vec!["-u", "postgres", "--", program];
            all.extend_from_slice(args);
            self.run("runuser", &all);
        } else {
            self.run(program, args);
        }
    }

    /// A URL of database `db` by host `host` (resolved as `127.0.0.1`), with extra query
    /// parameters `params` (e.g. `sslmode=verify-full&sslrootcert=...`).
    pub fn url(&self, host: &str, db: &str, params: &str) -> String {
        format!(
            "postgresql://postgres@{host}:{}/{db}?hostaddr=127.0.0.1&connect_timeout=10&{params}",
            self.port
        )
    }

    /// The server's log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }
}

fn append(path: &Path, text: &str) {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .expect("open postgresql.conf");
    file.write_all(text.as_bytes()).expect("append");
}

impl Drop for TlsCluster {
    fn drop(&mut self) {
        let pg_ctl = self.bindir.join("pg_ctl").display().to_string();
        let data = self.dir.join("data").display().to_string();
        let args = ["-D", data.as_str(), "-m", "immediate", "-w", "stop"];
        let mut command = if self.root {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--", &pg_ctl]).args(args);
            c
        } else {
            let mut c = Command::new(&pg_ctl);
            c.args(args);
            c
        };
        let _ = command.output();
        std::thread::sleep(Duration::from_millis(50));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

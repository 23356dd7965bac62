//! Certificates and keys for the relay's authentication tests, made fresh for each run: a CA
//! (rcgen) with a server certificate for 127.0.0.1, one for another host name, and a client
//! certificate; an unrelated CA that signed nothing here; NKey user seeds (nkeys). The
//! server configurations that use them are written by the tests themselves.

use std::path::PathBuf;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// PEM files in a temporary directory, removed on drop.
pub struct Pki {
    /// The directory.
    pub dir: PathBuf,
    /// The CA that signed the certificates below.
    pub ca: PathBuf,
    /// A CA that signed nothing here.
    pub other_ca: PathBuf,
    /// Server certificate for the IP address 127.0.0.1, and its key.
    pub server: (PathBuf, PathBuf),
    /// Server certificate for `nats.other.example` only, and its key.
    pub wrong_name: (PathBuf, PathBuf),
    /// Client certificate (CN `relayer`), and its key.
    pub client: (PathBuf, PathBuf),
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

impl Pki {
    /// Generates everything.
    pub fn new() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "outbox-nats-pki-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).expect("create PKI directory");
        let (ca_pem, issuer) = new_ca("outbox NATS test CA");
        let (other_pem, _) = new_ca("some other CA");
        let write = |name: &str, pem: String| {
            let path = dir.join(name);
            std::fs::write(&path, pem).expect("write PEM");
            path
        };
        let leaf = |name: &str, sans: Vec<String>, purpose: ExtendedKeyUsagePurpose| {
            let mut params = CertificateParams::new(sans).expect("params");
            params.distinguished_name.push(DnType::CommonName, name);
            params.use_authority_key_identifier_extension = true;
            params.key_usages = vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyEncipherment,
            ];
            params.extended_key_usages = vec![purpose];
            let key = KeyPair::generate().expect("key");
            let cert = params.signed_by(&key, &issuer).expect("sign");
            (
                write(&format!("{name}.crt"), cert.pem()),
                write(&format!("{name}.key"), key.serialize_pem()),
            )
        };
        let server = leaf(
            "server",
            vec!["127.0.0.1".into()],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let wrong_name = leaf(
            "wrong-name",
            vec!["nats.other.example".into()],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let client = leaf("relayer", Vec::new(), ExtendedKeyUsagePurpose::ClientAuth);
        Self {
            ca: write("ca.pem", ca_pem),
            other_ca: write("other-ca.pem", other_pem),
            server,
            wrong_name,
            client,
            dir,
        }
    }

    /// A nats-server `tls { }` block with `cert` and, when `verify`, client certificates
    /// required and checked against the CA.
    pub fn tls_block(&self, cert: &(PathBuf, PathBuf), verify: bool) -> String {
        let verify = if verify {
            format!("  ca_file: \"{}\"\n  verify: true\n", self.ca.display())
        } else {
            String::new()
        };
        format!(
            "tls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n{verify}}}\n",
            cert.0.display(),
            cert.1.display()
        )
    }
}

impl Default for Pki {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A new NKey user: (public key for the server's configuration, seed file for the relay).
pub fn nkey_user(dir: &std::path::Path, name: &str) -> (String, PathBuf) {
    let pair = nkeys::KeyPair::new_user();
    let file = dir.join(format!("{name}.nk"));
    std::fs::write(&file, format!("{}\n", pair.seed().expect("seed"))).expect("write seed");
    (pair.public_key(), file)
}

//! Test PKI: an admin's CA for `--peer-ca`, and node certificates and keys
//! signed by it (rcgen), as PEM files.

use std::path::{Path, PathBuf};

/// An admin's CA for `--peer-ca`.
pub struct TestCa {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    pub pem: String,
}

/// The three PEM files of one node: `--peer-ca`, `--peer-cert`, `--peer-key`.
pub struct PemFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TestCa {
    pub fn new(name: &str) -> TestCa {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let pem = params.self_signed(&key).unwrap().pem();
        TestCa {
            issuer: rcgen::Issuer::new(params, key),
            pem,
        }
    }

    /// Writes this CA and a new certificate for `dns` (usable as server and
    /// client) with its key into `dir`, as files named after `name`.
    pub fn node_files(&self, dir: &Path, name: &str, dns: &str) -> PemFiles {
        use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyPair};
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec![dns.to_owned()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, dns);
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        std::fs::create_dir_all(dir).unwrap();
        let files = PemFiles {
            ca: dir.join(format!("{name}-ca.pem")),
            cert: dir.join(format!("{name}.pem")),
            key: dir.join(format!("{name}.key")),
        };
        std::fs::write(&files.ca, &self.pem).unwrap();
        std::fs::write(&files.cert, cert.pem()).unwrap();
        super::data::write_private(&files.key, key.serialize_pem());
        files
    }
}

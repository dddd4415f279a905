//! Certificates made in the test (rcgen), and the PEM files a server reads
//! them from; needs no server of the tests' own, so other test binaries
//! share it.

use std::path::PathBuf;

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};

/// A CA and a certificate it signed, as PEM.
pub struct Pki {
    pub ca: String,
    pub cert: String,
    pub key: String,
}

/// A fresh CA and a certificate for `names` that it signed.
pub fn pki(names: &[&str]) -> Pki {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    let cert = CertificateParams::new(names)
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    Pki {
        ca: ca.pem(),
        cert: cert.pem(),
        key: key.serialize_pem(),
    }
}

/// PEM files in the directory it holds, removed on drop.
pub struct PemFiles(pub PathBuf);

impl Default for PemFiles {
    fn default() -> Self {
        Self::new()
    }
}

impl PemFiles {
    /// A fresh directory of its own.
    pub fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("idem-pem-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        PemFiles(dir)
    }

    /// Writes (or replaces) `name`; returns its path.
    pub fn write(&self, name: &str, pem: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, pem).unwrap();
        path
    }
}

impl Drop for PemFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

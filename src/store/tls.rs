//! TLS to PostgreSQL as libpq's `sslmode` and `sslrootcert` ask for it.
//!
//! tokio-postgres reads `sslmode` as `disable`, `prefer` or `require`
//! only, and not `sslrootcert` at all, so both are taken out of the
//! database URL here ([`TlsOptions::take`]) before the rest is handed to
//! it; `verify-ca` and `verify-full` become `require`, and what to verify
//! goes into the rustls configuration ([`TlsOptions::client_config`]):
//!
//! | sslmode | TLS | the server's certificate |
//! |---|---|---|
//! | `disable` | never | - |
//! | `prefer` (the default) | when the server offers it | not checked; with `sslrootcert`, its chain |
//! | `require` | always | not checked; with `sslrootcert`, its chain (libpq's rule) |
//! | `verify-ca` | always | its chain, to `sslrootcert` |
//! | `verify-full` | always | its chain, and that it names the URL's host |
//!
//! `sslrootcert` is a PEM file of CA certificates, or `system` for the
//! machine's own (with `verify-full` only, as libpq). `verify-ca` and
//! `verify-full` without it read `~/.postgresql/root.crt`, as libpq does,
//! and are refused when that is missing. One connector serves every
//! connection: the pool, the shared connections, the listener and the
//! Citus nodes' connections.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use percent_encoding::percent_decode_str;
use tokio_rustls::rustls::client::WebPkiServerVerifier;
use tokio_rustls::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use tokio_rustls::rustls::crypto::{WebPkiSupportedAlgorithms, ring};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio_rustls::rustls::{
    self, CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

/// What the server's certificate is checked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verify {
    /// Nothing: the connection is encrypted, and whoever answers is trusted
    /// (`prefer` and `require` without a root certificate).
    Nothing,
    /// That it chains to a trusted CA (`verify-ca`, and `prefer` or
    /// `require` with a root certificate).
    Chain,
    /// That it chains to a trusted CA and names the host connected to
    /// (`verify-full`).
    Full,
}

/// Where the trusted CAs come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootCerts {
    /// A PEM file of CA certificates.
    File(PathBuf),
    /// The machine's certificate store (`sslrootcert=system`).
    System,
}

/// The TLS settings a database URL asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsOptions {
    /// `sslmode` as tokio-postgres takes it (`verify-*` as `require`).
    pub mode: tokio_postgres::config::SslMode,
    /// What the server's certificate is checked for.
    pub verify: Verify,
    /// The trusted CAs, when anything is verified.
    pub roots: Option<RootCerts>,
}

/// A database URL's TLS settings that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsOptionsError {
    #[error(
        "sslmode={0} checks the server's certificate and needs the CA that signed it: give \
         sslrootcert=/path/to/ca.pem (or put it in ~/.postgresql/root.crt)"
    )]
    NoRootCert(&'static str),
    #[error("sslrootcert=system is taken with sslmode=verify-full only (as libpq does)")]
    SystemNeedsVerifyFull,
    #[error("cannot read sslrootcert {path}: {reason}")]
    RootCert {
        /// The file named.
        path: PathBuf,
        /// Why it is no use.
        reason: String,
    },
    #[error("no usable CA certificate found in the machine's store for sslrootcert=system")]
    NoSystemRoots,
    #[error(
        "sslmode={0} needs the server's host name (host=, which the certificate is checked \
         against) besides hostaddr="
    )]
    NoHostName(&'static str),
}

/// One `key=value` of a database URL: where it is in the text, and what
/// it says.
struct Setting {
    /// Byte range of the whole setting, to cut it out.
    span: std::ops::Range<usize>,
    key: String,
    value: String,
}

impl TlsOptions {
    /// Takes `sslmode` (when `verify-ca` or `verify-full`) and `sslrootcert`
    /// out of `url`, a URL or `key=value` string, and returns what is left
    /// for tokio-postgres with the TLS settings they asked for.
    pub fn take(url: &str) -> Result<(String, TlsOptions), TlsOptionsError> {
        let form = Form::of(url);
        let settings = form.settings(url);
        let mut mode_word = None;
        let mut rootcert = None;
        let mut cut = Vec::new();
        for setting in settings {
            match (setting.key.as_str(), setting.value.as_str()) {
                ("sslmode", "verify-ca") => mode_word = Some("verify-ca"),
                ("sslmode", "verify-full") => mode_word = Some("verify-full"),
                ("sslmode", _) => {
                    mode_word = None;
                    continue;
                }
                ("sslrootcert", value) => rootcert = Some(value.to_owned()),
                _ => continue,
            }
            cut.push(setting.span);
        }
        let mut rest = url.to_owned();
        for span in cut.iter().rev() {
            rest.replace_range(span.clone(), "");
        }
        let rest = form.tidy(&rest);
        let rest = match mode_word {
            Some(_) => form.with_setting(&rest, "sslmode", "require"),
            None => rest,
        };
        let mode = match mode_word {
            Some(_) => tokio_postgres::config::SslMode::Require,
            // What tokio-postgres reads from the rest; `prefer` if it fails
            // (the caller reports its parse error).
            None => rest
                .parse::<tokio_postgres::Config>()
                .map_or(tokio_postgres::config::SslMode::Prefer, |c| {
                    c.get_ssl_mode()
                }),
        };
        let options = TlsOptions::decide(mode, mode_word, rootcert)?;
        Ok((rest, options))
    }

    /// What `mode` (`word`, when `verify-ca` or `verify-full`) with
    /// `rootcert` verifies, against which CAs.
    fn decide(
        mode: tokio_postgres::config::SslMode,
        word: Option<&'static str>,
        rootcert: Option<String>,
    ) -> Result<TlsOptions, TlsOptionsError> {
        let roots = match rootcert.as_deref() {
            Some("system") => Some(RootCerts::System),
            Some(path) => Some(RootCerts::File(PathBuf::from(path))),
            None => None,
        };
        let verify = match (word, &roots) {
            (Some("verify-full"), _) => Verify::Full,
            (Some(_), Some(RootCerts::System)) | (None, Some(RootCerts::System)) => {
                return Err(TlsOptionsError::SystemNeedsVerifyFull);
            }
            (Some(_), _) | (None, Some(_)) => Verify::Chain,
            (None, None) => Verify::Nothing,
        };
        let roots = match (verify, roots, word) {
            (Verify::Nothing, _, _) => None,
            (_, Some(roots), _) => Some(roots),
            (_, None, word) => Some(RootCerts::File(
                default_root_cert()
                    .ok_or(TlsOptionsError::NoRootCert(word.unwrap_or("require")))?,
            )),
        };
        Ok(TlsOptions {
            mode,
            verify,
            roots,
        })
    }

    /// Whether TLS is never used.
    pub fn disabled(&self) -> bool {
        self.mode == tokio_postgres::config::SslMode::Disable
    }

    /// The `sslmode` word these options came from, for messages.
    pub fn mode_word(&self) -> &'static str {
        match (self.mode, self.verify) {
            (tokio_postgres::config::SslMode::Disable, _) => "disable",
            (_, Verify::Full) => "verify-full",
            (tokio_postgres::config::SslMode::Require, Verify::Chain) => "verify-ca",
            (tokio_postgres::config::SslMode::Require, Verify::Nothing) => "require",
            _ => "prefer",
        }
    }

    /// The rustls configuration that checks what these options ask for,
    /// with ring as the crypto provider, as everywhere in this process.
    pub fn client_config(&self) -> Result<ClientConfig, TlsOptionsError> {
        let provider = Arc::new(ring::default_provider());
        let algorithms = provider.signature_verification_algorithms;
        let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions");
        let verifier: Arc<dyn ServerCertVerifier> = match (&self.roots, self.verify) {
            (None, _) | (_, Verify::Nothing) => Arc::new(Unchecked { algorithms }),
            (Some(roots), verify) => {
                let roots = Arc::new(load_roots(roots)?);
                let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider)
                    .build()
                    .map_err(|e| TlsOptionsError::RootCert {
                        path: PathBuf::from("sslrootcert"),
                        reason: e.to_string(),
                    })?;
                match verify {
                    Verify::Full => webpki,
                    _ => Arc::new(ChainOnly { webpki }),
                }
            }
        };
        let mut config = builder
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        // What PostgreSQL 17 and later expect of a TLS client; earlier
        // servers ignore it.
        config.alpn_protocols = vec![b"postgresql".to_vec()];
        Ok(config)
    }
}

/// libpq's default root certificate, `~/.postgresql/root.crt`, if present.
fn default_root_cert() -> Option<PathBuf> {
    let home = std::env::var_os("HOME")?;
    let path = Path::new(&home).join(".postgresql/root.crt");
    path.exists().then_some(path)
}

/// The CA certificates `roots` names.
fn load_roots(roots: &RootCerts) -> Result<RootCertStore, TlsOptionsError> {
    let mut store = RootCertStore::empty();
    match roots {
        RootCerts::File(path) => {
            let unusable = |reason: String| TlsOptionsError::RootCert {
                path: path.clone(),
                reason,
            };
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| unusable(e.to_string()))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| unusable(e.to_string()))?;
            if certs.is_empty() {
                return Err(unusable("it holds no PEM certificate".to_owned()));
            }
            for cert in certs {
                store
                    .add(cert)
                    .map_err(|e| unusable(format!("a certificate in it is not usable: {e}")))?;
            }
        }
        RootCerts::System => {
            let found = rustls_native_certs::load_native_certs();
            store.add_parsable_certificates(found.certs);
            if store.is_empty() {
                return Err(TlsOptionsError::NoSystemRoots);
            }
        }
    }
    Ok(store)
}

/// The two ways a database URL is written, read as tokio-postgres reads
/// them: one scanner for both, which differ only in where the settings
/// start, what separates them, and how a value is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    /// `postgres://…?key=value&…`: the settings are the query's, values
    /// percent-encoded; a part without `=` is skipped.
    Url,
    /// `key=value key = 'a \'quoted\' value'`: apart by whitespace, values
    /// in single quotes may hold spaces, `\'` and `\\`; reading stops at a
    /// key without `=`.
    Keywords,
}

impl Form {
    fn of(text: &str) -> Form {
        if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            Form::Url
        } else {
            Form::Keywords
        }
    }

    fn separates(self, byte: u8) -> bool {
        match self {
            Form::Url => byte == b'&',
            Form::Keywords => byte.is_ascii_whitespace(),
        }
    }

    /// Every `key=value` of `text`, where it is and what it says.
    fn settings(self, text: &str) -> Vec<Setting> {
        let bytes = text.as_bytes();
        let first = match self {
            Form::Url => match text.find('?') {
                Some(query_at) => query_at + 1,
                None => return Vec::new(),
            },
            Form::Keywords => 0,
        };
        let blank = |i: usize| self == Form::Keywords && bytes[i].is_ascii_whitespace();
        let mut settings = Vec::new();
        let mut i = first;
        loop {
            while i < bytes.len() && self.separates(bytes[i]) {
                i += 1;
            }
            if i >= bytes.len() {
                return settings;
            }
            let start = i;
            while i < bytes.len() && bytes[i] != b'=' && !self.separates(bytes[i]) {
                i += 1;
            }
            let key = text[start..i].to_owned();
            while i < bytes.len() && blank(i) {
                i += 1;
            }
            if i >= bytes.len() || bytes[i] != b'=' {
                match self {
                    Form::Url => continue,
                    Form::Keywords => return settings,
                }
            }
            i += 1;
            while i < bytes.len() && blank(i) {
                i += 1;
            }
            let (value, end) = self.value(text, i);
            i = end;
            let (key, span) = match self {
                // The `&` before it goes too (the `?` stays: `tidy`).
                Form::Url => (
                    decoded(&key),
                    if start > first { start - 1 } else { start }..i,
                ),
                Form::Keywords => (key, start..i),
            };
            settings.push(Setting { span, key, value });
        }
    }

    /// The value written at `text[from..]`, and where it ends.
    fn value(self, text: &str, from: usize) -> (String, usize) {
        let bytes = text.as_bytes();
        let mut i = from;
        if self == Form::Keywords && bytes.get(i) == Some(&b'\'') {
            let mut value = String::new();
            i += 1;
            while i < bytes.len() && bytes[i] != b'\'' {
                if bytes[i] == b'\\' && i + 1 < bytes.len() {
                    i += 1;
                }
                let c = text[i..].chars().next().unwrap_or_default();
                value.push(c);
                i += c.len_utf8();
            }
            return (value, (i + 1).min(bytes.len()));
        }
        while i < bytes.len() && !self.separates(bytes[i]) {
            i += 1;
        }
        let written = &text[from..i];
        match self {
            Form::Url => (decoded(written), i),
            Form::Keywords => (written.to_owned(), i),
        }
    }

    /// `text` without a `?` or `&` (or whitespace) left dangling by a cut
    /// setting.
    fn tidy(self, text: &str) -> String {
        match self {
            Form::Url => {
                let text = text.replace("?&", "?");
                text.strip_suffix('?').unwrap_or(&text).to_owned()
            }
            Form::Keywords => text.split_whitespace().collect::<Vec<_>>().join(" "),
        }
    }

    /// `text` with `key=value` added.
    fn with_setting(self, text: &str, key: &str, value: &str) -> String {
        match self {
            Form::Url => {
                let joint = if text.contains('?') { '&' } else { '?' };
                format!("{text}{joint}{key}={value}")
            }
            Form::Keywords => format!("{text} {key}={value}"),
        }
    }
}

/// A URL's percent-encoded text, decoded.
fn decoded(text: &str) -> String {
    percent_decode_str(text).decode_utf8_lossy().into_owned()
}

/// Accepts any certificate, and checks only that the handshake is signed
/// by its key: `prefer` and `require` without a root certificate, which
/// libpq does not verify either.
#[derive(Debug)]
struct Unchecked {
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// Checks the certificate's chain (to the root certificates, valid now)
/// and not the name in it: `verify-ca`.
#[derive(Debug)]
struct ChainOnly {
    webpki: Arc<WebPkiServerVerifier>,
}

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        // webpki checks the name only once the chain is good.
        match self.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_postgres::config::SslMode;

    fn take(url: &str) -> (String, TlsOptions) {
        TlsOptions::take(url).unwrap()
    }

    #[test]
    fn verify_modes_become_require_and_the_root_cert_is_taken_out() {
        let (rest, options) =
            take("postgres://app@db/orders?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem");
        assert_eq!(rest, "postgres://app@db/orders?sslmode=require");
        assert_eq!(options.mode, SslMode::Require);
        assert_eq!(options.verify, Verify::Full);
        assert_eq!(options.roots, Some(RootCerts::File("/etc/ca.pem".into())));
        let (rest, options) = take(
            "postgres://app@db/orders?application_name=x&sslrootcert=/ca.pem&sslmode=verify-ca&port=1",
        );
        assert_eq!(
            rest,
            "postgres://app@db/orders?application_name=x&port=1&sslmode=require"
        );
        assert_eq!(options.verify, Verify::Chain);
        assert_eq!(options.mode_word(), "verify-ca");
        let (rest, options) =
            take("host=db sslmode = verify-full sslrootcert='/my ca/ca.pem' dbname=orders");
        assert_eq!(rest, "host=db dbname=orders sslmode=require");
        assert_eq!(options.roots, Some(RootCerts::File("/my ca/ca.pem".into())));
    }

    #[test]
    fn require_verifies_only_with_a_root_cert_and_prefer_stays_the_default() {
        let (rest, options) = take("postgres://app@db/orders?sslmode=require");
        assert_eq!(rest, "postgres://app@db/orders?sslmode=require");
        assert_eq!(options.verify, Verify::Nothing);
        let (_, options) = take("postgres://app@db/orders?sslmode=require&sslrootcert=/ca.pem");
        assert_eq!(options.verify, Verify::Chain);
        let (rest, options) = take("postgres://app@db/orders");
        assert_eq!(rest, "postgres://app@db/orders");
        assert_eq!(options.mode, SslMode::Prefer);
        assert_eq!(options.verify, Verify::Nothing);
        let (_, options) = take("host=db sslmode=disable");
        assert!(options.disabled());
    }

    #[test]
    fn both_forms_are_read_by_one_scanner_as_tokio_postgres_reads_them() {
        let read = |text: &str| {
            Form::of(text)
                .settings(text)
                .into_iter()
                .map(|s| (s.key, s.value, text[s.span].to_owned()))
                .collect::<Vec<_>>()
        };
        let pair = |k: &str, v: &str, span: &str| (k.to_owned(), v.to_owned(), span.to_owned());
        assert_eq!(
            read("postgres://db/x?a=1&&flag&b%20c=%2Fd=e"),
            [pair("a", "1", "a=1"), pair("b c", "/d=e", "&b%20c=%2Fd=e")]
        );
        assert_eq!(read("postgres://db/x"), []);
        assert_eq!(
            read(r"  a = 'it\'s \\ here'  b=2 c d=4"),
            [
                pair("a", r"it's \ here", r"a = 'it\'s \\ here'"),
                pair("b", "2", "b=2")
            ]
        );
    }

    #[test]
    fn settings_that_cannot_work_are_refused() {
        assert_eq!(
            TlsOptions::take("postgres://db/x?sslmode=verify-ca&sslrootcert=system").unwrap_err(),
            TlsOptionsError::SystemNeedsVerifyFull
        );
        let missing =
            TlsOptions::take("postgres://db/x?sslmode=verify-full&sslrootcert=/nonexistent")
                .unwrap()
                .1
                .client_config()
                .unwrap_err();
        assert!(missing.to_string().contains("/nonexistent"), "{missing}");
    }
}

//! Who is calling: bearer tokens (gRPC metadata `authorization: Bearer
//! <token>`) mapped to a tenant, and whether that caller may run maintenance.
//!
//! The credentials file has one credential a line — `<token> <tenant>
//! [admin]`, where the token may be given as `sha256:<64 hex>` of the token
//! (recommended: the file then holds no secret) — and `#` comments. Only
//! SHA-256 digests are kept in memory, and a presented token's digest is
//! compared with every entry in constant time, so timing reveals nothing of
//! the tokens. The file is read again on SIGHUP; a file that does not parse
//! leaves the credentials in force as they were, and so does an empty file
//! (unless empty is allowed) or one that does not end with a newline (read
//! while being written: replace the file by renaming a new one over it).
//! A reload that removes a credential (or gives its token to another
//! tenant or role) ends what it holds open: each long-lived stream waits on
//! a [`Revocation`] of the credential it was opened with.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::sync::watch;
use tonic::metadata::MetadataMap;

use crate::domain::{Scope, Tenant};

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// Whose records the caller sees; the only source of the tenant.
    pub tenant: Tenant,
    /// May run Sweep.
    pub admin: bool,
}

/// Why a caller was not let in. The messages never contain the token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("missing credentials: send `authorization: Bearer <token>`")]
    Missing,
    #[error("unknown credentials")]
    Unknown,
}

/// Why a credentials file was refused.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error("cannot read {path}")]
    Read {
        /// The credentials file.
        path: PathBuf,
        /// Why it could not be read.
        #[source]
        source: std::io::Error,
    },
    #[error("line {line}: {why}")]
    Line { line: usize, why: String },
    #[error(
        "{0} holds no credential, which would refuse every caller; pass --allow-empty-credentials if that is meant"
    )]
    Empty(PathBuf),
    #[error(
        "{0} does not end with a newline: it may have been read while being written; write the new file beside it and rename it into place"
    )]
    Unterminated(PathBuf),
}

struct Entry {
    digest: [u8; 32],
    caller: Caller,
}

/// The parsed credentials file.
pub struct Credentials {
    entries: Vec<Entry>,
}

fn digest_of(token: &str) -> Result<[u8; 32], String> {
    if let Some(hex_digest) = token.strip_prefix("sha256:") {
        let bytes = hex::decode(hex_digest)
            .map_err(|_| "the sha256: digest is not hexadecimal".to_owned())?;
        return bytes
            .try_into()
            .map_err(|_| "the sha256: digest must be 64 hex digits".to_owned());
    }
    if token.len() < 16 {
        return Err("tokens must be at least 16 characters".to_owned());
    }
    Ok(Sha256::digest(token.as_bytes()).into())
}

impl Credentials {
    pub fn parse(text: &str) -> Result<Self, CredentialsError> {
        let mut entries: Vec<Entry> = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line_no = n + 1;
            let fail = |why: String| CredentialsError::Line { line: line_no, why };
            let content = line.split('#').next().unwrap_or_default().trim();
            if content.is_empty() {
                continue;
            }
            let fields: Vec<&str> = content.split_whitespace().collect();
            let (token, tenant, admin) = match fields.as_slice() {
                [token, tenant] => (*token, *tenant, false),
                [token, tenant, "admin"] => (*token, *tenant, true),
                _ => return Err(fail("expected `<token> <tenant> [admin]`".to_owned())),
            };
            let digest = digest_of(token).map_err(fail)?;
            // Tenants follow the scope's rules: they travel in notification
            // payloads and logs.
            Scope::try_from(tenant.to_owned()).map_err(|e| fail(format!("tenant name {e}")))?;
            if entries.iter().any(|e| bool::from(e.digest.ct_eq(&digest))) {
                return Err(fail("the same token appears twice".to_owned()));
            }
            entries.push(Entry {
                digest,
                caller: Caller {
                    tenant: Tenant::new(tenant),
                    admin,
                },
            });
        }
        Ok(Credentials { entries })
    }

    /// Reads a credentials file. A file cut short (no newline at its end)
    /// is refused, and so is one without credentials unless `allow_empty`.
    pub fn load(path: &Path, allow_empty: bool) -> Result<Self, CredentialsError> {
        let text = std::fs::read_to_string(path).map_err(|source| CredentialsError::Read {
            path: path.to_owned(),
            source,
        })?;
        if !text.is_empty() && !text.ends_with('\n') {
            return Err(CredentialsError::Unterminated(path.to_owned()));
        }
        let credentials = Self::parse(&text)?;
        if credentials.is_empty() && !allow_empty {
            return Err(CredentialsError::Empty(path.to_owned()));
        }
        Ok(credentials)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The caller a token belongs to. Every entry is compared, in constant
    /// time, whether or not an earlier one matched.
    fn find(&self, token: &str) -> Option<&Caller> {
        self.find_digest(&Sha256::digest(token.as_bytes()).into())
    }

    /// The caller a token's digest belongs to, compared as in [`Self::find`].
    fn find_digest(&self, digest: &[u8; 32]) -> Option<&Caller> {
        let mut found = None;
        for entry in &self.entries {
            if bool::from(entry.digest.ct_eq(digest)) {
                found = Some(&entry.caller);
            }
        }
        found
    }
}

/// Authentication as configured: off (one default tenant, every caller an
/// admin) or by the tokens of a file.
pub enum Authenticator {
    Off,
    Tokens {
        path: PathBuf,
        /// A file without credentials is accepted (everyone is refused).
        allow_empty: bool,
        current: RwLock<Arc<Credentials>>,
        /// Counts the reloads that took effect, so that what a credential
        /// holds open can look again whether it still stands.
        reloads: watch::Sender<u64>,
    },
}

/// What ends a stream when its credential is revoked: a reload after
/// which the token no longer names the caller it named when the stream
/// opened.
pub struct Revocation {
    /// The authenticator, reloaded on SIGHUP.
    auth: Arc<Authenticator>,
    /// The token's SHA-256 (never the token); `None` with authentication off.
    digest: Option<[u8; 32]>,
    /// Who the token named when the stream opened.
    caller: Caller,
    /// Tells of each reload; `None` with authentication off (nothing to
    /// revoke).
    reloads: Option<watch::Receiver<u64>>,
}

impl Revocation {
    /// Returns once the credential is revoked; never with authentication
    /// off. Cancel-safe: a `select!` may drop it and call it again.
    pub async fn revoked(&mut self) {
        loop {
            let Some(reloads) = self.reloads.as_mut() else {
                return std::future::pending().await;
            };
            if reloads.changed().await.is_err() {
                return std::future::pending().await;
            }
            if !self.stands() {
                return;
            }
        }
    }

    /// Whether the token still names the caller it named.
    pub fn stands(&self) -> bool {
        let Authenticator::Tokens { current, .. } = self.auth.as_ref() else {
            return true;
        };
        let Some(digest) = &self.digest else {
            return false;
        };
        let credentials = Arc::clone(&current.read().unwrap_or_else(|e| e.into_inner()));
        credentials.find_digest(digest) == Some(&self.caller)
    }
}

/// The bearer token of a call's headers.
fn bearer_token(headers: &http::HeaderMap) -> Option<&str> {
    headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())?
        .split_once(' ')
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
        .filter(|token| !token.is_empty())
}

impl Authenticator {
    /// Reads the credentials file, if there is one.
    pub fn new(path: Option<PathBuf>, allow_empty: bool) -> Result<Self, CredentialsError> {
        Ok(match path {
            None => Authenticator::Off,
            Some(path) => {
                let credentials = Credentials::load(&path, allow_empty)?;
                Authenticator::Tokens {
                    current: RwLock::new(Arc::new(credentials)),
                    allow_empty,
                    path,
                    reloads: watch::Sender::new(0),
                }
            }
        })
    }

    pub fn is_on(&self) -> bool {
        matches!(self, Authenticator::Tokens { .. })
    }

    /// The caller the request's credentials name.
    pub fn caller(&self, metadata: &MetadataMap) -> Result<Caller, AuthError> {
        self.caller_from_headers(metadata.as_ref())
    }

    /// The caller a call's HTTP/2 headers name.
    pub fn caller_from_headers(&self, headers: &http::HeaderMap) -> Result<Caller, AuthError> {
        let Authenticator::Tokens { current, .. } = self else {
            return Ok(Caller {
                tenant: Tenant::default_tenant(),
                admin: true,
            });
        };
        let token = bearer_token(headers).ok_or(AuthError::Missing)?;
        let credentials = Arc::clone(&current.read().unwrap_or_else(|e| e.into_inner()));
        credentials.find(token).cloned().ok_or(AuthError::Unknown)
    }

    /// Reads the credentials file again; on failure the old credentials stay
    /// in force and the error is returned for the log.
    pub fn reload(&self) -> Result<usize, CredentialsError> {
        let Authenticator::Tokens {
            path,
            allow_empty,
            current,
            reloads,
        } = self
        else {
            return Ok(0);
        };
        let fresh = Credentials::load(path, *allow_empty)?;
        let n = fresh.len();
        *current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(fresh);
        reloads.send_modify(|count| *count += 1);
        Ok(n)
    }

    /// What ends a stream opened with `headers`' credential, which named
    /// `caller`, when a reload revokes it.
    pub fn revocation(self: &Arc<Self>, headers: &http::HeaderMap, caller: &Caller) -> Revocation {
        let (digest, reloads) = match self.as_ref() {
            Authenticator::Off => (None, None),
            Authenticator::Tokens { reloads, .. } => (
                bearer_token(headers).map(|t| Sha256::digest(t.as_bytes()).into()),
                Some(reloads.subscribe()),
            ),
        };
        Revocation {
            auth: Arc::clone(self),
            digest,
            caller: caller.clone(),
            reloads,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "
        # ops
        plain-token-0123456789 team-a
        sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad team-b admin
    ";

    #[test]
    fn plain_and_hashed_tokens_name_their_tenant() {
        let c = Credentials::parse(FILE).unwrap();
        assert_eq!(c.len(), 2);
        let a = c.find("plain-token-0123456789").unwrap();
        assert_eq!((a.tenant.as_str(), a.admin), ("team-a", false));
        let b = c.find("abc").unwrap();
        assert_eq!((b.tenant.as_str(), b.admin), ("team-b", true));
        assert!(c.find("plain-token-012345678").is_none());
    }

    #[test]
    fn bad_lines_are_refused_with_their_number() {
        for (text, line) in [
            ("short t", 1),
            ("\nplain-token-0123456789 team a b", 2),
            ("sha256:zz team", 1),
            ("plain-token-0123456789 bad*tenant", 1),
            ("plain-token-0123456789 a\nplain-token-0123456789 b", 2),
        ] {
            match Credentials::parse(text) {
                Err(CredentialsError::Line { line: l, .. }) => assert_eq!(l, line, "{text}"),
                other => panic!("{text:?} gave {:?}", other.map(|c| c.len())),
            }
        }
    }

    struct TempFile(PathBuf);

    impl TempFile {
        fn new(text: &str) -> Self {
            let path = std::env::temp_dir().join(format!("idem-creds-{}", uuid::Uuid::new_v4()));
            std::fs::write(&path, text).unwrap();
            TempFile(path)
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    #[test]
    fn a_file_without_credentials_is_refused_unless_allowed() {
        let file = TempFile::new("# nobody yet\n");
        assert!(matches!(
            Authenticator::new(Some(file.0.clone()), false),
            Err(CredentialsError::Empty(_))
        ));
        let auth = Authenticator::new(Some(file.0.clone()), true).unwrap();
        assert!(auth.is_on());
    }

    #[test]
    fn a_reload_of_an_empty_or_cut_short_file_keeps_the_credentials() {
        let file = TempFile::new("plain-token-0123456789 team-a\n");
        let auth = Authenticator::new(Some(file.0.clone()), false).unwrap();
        let mut headers = http::HeaderMap::new();
        headers.insert(
            http::header::AUTHORIZATION,
            "Bearer plain-token-0123456789".parse().unwrap(),
        );
        for (text, refused) in [
            ("", "holds no credential"),
            (
                "plain-token-0123456789 team-a\nother-token-0123456789 te",
                "newline",
            ),
        ] {
            std::fs::write(&file.0, text).unwrap();
            let err = auth.reload().unwrap_err();
            assert!(err.to_string().contains(refused), "{err}");
            let caller = auth.caller_from_headers(&headers).unwrap();
            assert_eq!(caller.tenant.as_str(), "team-a");
        }
    }

    #[test]
    fn errors_never_show_the_token() {
        let Err(err) = Credentials::parse("secret-token-value-1 bad*tenant") else {
            panic!("a bad tenant name is refused");
        };
        assert!(!err.to_string().contains("secret-token-value-1"));
    }
}

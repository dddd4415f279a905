//! The `Idempotency-Key` header and the `Prefer: wait` preference, read
//! once at the edge: this is where a key is accepted or refused (400), and
//! where the key the coordinator sees is made from it and the tenant.

use http::HeaderMap;
use sha2::{Digest, Sha256};

/// The longest key the coordinator accepts.
const COORDINATOR_MAX_KEY: usize = 255;

/// Why an `Idempotency-Key` header was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// The header is absent on a route that requires it.
    #[error("the route requires an Idempotency-Key header")]
    Missing,
    /// The header appears more than once.
    #[error("Idempotency-Key appears more than once")]
    Repeated,
    /// The key is empty.
    #[error("the Idempotency-Key is empty")]
    Empty,
    /// The key is longer than the sidecar accepts.
    #[error("the Idempotency-Key is longer than {max} characters")]
    TooLong {
        /// The longest key accepted.
        max: usize,
    },
    /// Neither an sf-string nor a bare token.
    #[error("the Idempotency-Key is neither an sf-string (\"...\") nor a token: {0}")]
    Invalid(&'static str),
}

/// The client's key, as it sent it (unquoted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// The key, unquoted.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key the coordinator stores: the client's key under the tenant's
    /// namespace (a hash of the tenant header's value) when one is
    /// configured. A key the coordinator could not take as it is (spaces,
    /// or too long once namespaced) is replaced by its SHA-256.
    pub fn coordinator_key(&self, tenant: Option<&[u8]>) -> String {
        let base = if self.0.bytes().all(|b| b.is_ascii_graphic()) {
            self.0.clone()
        } else {
            format!("sha256:{}", hex::encode(Sha256::digest(self.0.as_bytes())))
        };
        let key = match tenant {
            Some(tenant) => {
                let digest = Sha256::digest(tenant);
                format!("t{}/{base}", hex::encode(&digest[..12]))
            }
            None => base,
        };
        if key.len() <= COORDINATOR_MAX_KEY {
            key
        } else {
            format!("sha256:{}", hex::encode(Sha256::digest(key.as_bytes())))
        }
    }
}

/// The key in `headers`, if any: `Ok(None)` when absent.
pub fn from_headers(
    headers: &HeaderMap,
    max_len: usize,
) -> Result<Option<IdempotencyKey>, KeyError> {
    let mut values = headers.get_all("idempotency-key").iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(KeyError::Repeated);
    }
    parse(value.as_bytes(), max_len).map(Some)
}

/// An RFC 8941 sf-string (`"..."`, with `\"` and `\\` escapes) or a bare
/// token (tchar, `:` and `/`, which is what most clients send for UUIDs);
/// parameters are not accepted.
pub fn parse(raw: &[u8], max_len: usize) -> Result<IdempotencyKey, KeyError> {
    let raw = trim(raw);
    if raw.is_empty() {
        return Err(KeyError::Empty);
    }
    // Refuse before scanning a hostile, huge value any further.
    if raw.len() > max_len.saturating_mul(2).saturating_add(2) {
        return Err(KeyError::TooLong { max: max_len });
    }
    let key = if raw[0] == b'"' {
        sf_string(raw)?
    } else {
        token(raw)?
    };
    if key.is_empty() {
        return Err(KeyError::Empty);
    }
    if key.len() > max_len {
        return Err(KeyError::TooLong { max: max_len });
    }
    Ok(IdempotencyKey(key))
}

fn trim(raw: &[u8]) -> &[u8] {
    let start = raw.iter().position(|b| *b != b' ' && *b != b'\t');
    let end = raw.iter().rposition(|b| *b != b' ' && *b != b'\t');
    match (start, end) {
        (Some(s), Some(e)) => &raw[s..=e],
        _ => &[],
    }
}

fn sf_string(raw: &[u8]) -> Result<String, KeyError> {
    let mut out = String::new();
    let mut bytes = raw[1..].iter();
    loop {
        match bytes.next() {
            None => return Err(KeyError::Invalid("an sf-string must end with '\"'")),
            Some(b'"') => break,
            Some(b'\\') => match bytes.next() {
                Some(&c @ (b'"' | b'\\')) => out.push(char::from(c)),
                _ => return Err(KeyError::Invalid("only \\\" and \\\\ may be escaped")),
            },
            Some(&c) if (0x20..0x7f).contains(&c) => out.push(char::from(c)),
            Some(_) => {
                return Err(KeyError::Invalid("an sf-string holds printable ASCII only"));
            }
        }
    }
    if bytes.next().is_some() {
        return Err(KeyError::Invalid(
            "nothing may follow the sf-string (parameters are not accepted)",
        ));
    }
    Ok(out)
}

fn token(raw: &[u8]) -> Result<String, KeyError> {
    let tchar = |c: u8| c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(&c);
    if !raw.iter().copied().all(tchar) {
        return Err(KeyError::Invalid(
            "a bare key holds token characters only; quote anything else",
        ));
    }
    Ok(String::from_utf8_lossy(raw).into_owned())
}

/// The `wait` preference of RFC 7240 (`Prefer: wait=10`), in seconds.
pub fn prefer_wait(headers: &HeaderMap) -> Option<u64> {
    headers
        .get_all(http::header::HeaderName::from_static("prefer"))
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|preference| {
            let first = preference.split(';').next()?;
            let (name, value) = first.split_once('=')?;
            if !name.trim().eq_ignore_ascii_case("wait") {
                return None;
            }
            value.trim().trim_matches('"').parse::<u64>().ok()
        })
        .next()
}

/// A `Retry-After` given in seconds (an HTTP date is not read).
pub fn retry_after_seconds(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sf_strings_and_bare_tokens_are_keys() {
        assert_eq!(parse(b"\"8e03-a\"", 255).unwrap().as_str(), "8e03-a");
        assert_eq!(
            parse(b" \"a \\\"b\\\\\" ", 255).unwrap().as_str(),
            "a \"b\\"
        );
        let uuid = "8e03978e-40d5-43e8-bc93-6894a57f9324";
        assert_eq!(parse(uuid.as_bytes(), 255).unwrap().as_str(), uuid);
    }

    #[test]
    fn hostile_keys_are_refused() {
        assert_eq!(parse(b"", 255), Err(KeyError::Empty));
        assert_eq!(parse(b"\"\"", 255), Err(KeyError::Empty));
        assert!(matches!(parse(b"\"abc", 255), Err(KeyError::Invalid(_))));
        assert!(matches!(parse(b"\"a\"b", 255), Err(KeyError::Invalid(_))));
        assert!(matches!(parse(b"\"a\\n\"", 255), Err(KeyError::Invalid(_))));
        assert!(matches!(
            parse(b"\"a\x01\"", 255),
            Err(KeyError::Invalid(_))
        ));
        assert!(matches!(parse(b"a b", 255), Err(KeyError::Invalid(_))));
        assert!(matches!(parse(b"a;p=1", 255), Err(KeyError::Invalid(_))));
        let long = vec![b'k'; 10 * 1024];
        assert_eq!(parse(&long, 255), Err(KeyError::TooLong { max: 255 }));
        assert_eq!(
            parse(&[b'k'; 256], 255),
            Err(KeyError::TooLong { max: 255 })
        );
    }

    #[test]
    fn tenants_never_share_a_key() {
        let key = parse(b"k1", 255).unwrap();
        assert_eq!(key.coordinator_key(None), "k1");
        let a = key.coordinator_key(Some(b"client-a"));
        let b = key.coordinator_key(Some(b"client-b"));
        assert_ne!(a, b);
        assert!(a.ends_with("/k1"));
        let spaced = parse(b"\"a b\"", 255).unwrap().coordinator_key(None);
        assert!(spaced.starts_with("sha256:") && spaced.len() <= 255);
        let long = parse(&[b'k'; 255], 255).unwrap();
        assert!(long.coordinator_key(Some(b"t")).len() <= 255);
    }

    #[test]
    fn prefer_wait_is_read() {
        let mut headers = HeaderMap::new();
        assert_eq!(prefer_wait(&headers), None);
        headers.insert("prefer", "respond-async, wait=5".parse().unwrap());
        assert_eq!(prefer_wait(&headers), Some(5));
        headers.insert("prefer", "WAIT=\"7\"; x".parse().unwrap());
        assert_eq!(prefer_wait(&headers), Some(7));
    }
}

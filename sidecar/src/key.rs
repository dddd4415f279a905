//! The `Idempotency-Key` header and the `Prefer: wait` preference, read
//! once at the edge: this is where a key is accepted or refused (400), and
//! where the key the coordinator sees is made from it and the tenant.

use http::{HeaderMap, HeaderName};
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

    /// The key the coordinator stores: the client's key under its
    /// caller's namespace (a hash of the tenant header's value and the
    /// caller's credentials, when configured). A key the coordinator could
    /// not take as it is (spaces, or too long once namespaced) is replaced
    /// by its SHA-256.
    pub fn coordinator_key(&self, namespace: &Namespace) -> String {
        let base = if self.0.bytes().all(|b| b.is_ascii_graphic()) {
            self.0.clone()
        } else {
            format!("sha256:{}", hex::encode(Sha256::digest(self.0.as_bytes())))
        };
        let key = match namespace {
            Namespace::Global => base,
            Namespace::Tenant(tenant) => {
                let digest = Sha256::digest(tenant);
                format!("t{}/{base}", hex::encode(&digest[..12]))
            }
            Namespace::Caller(caller) => {
                let digest = Sha256::digest(caller);
                format!("c{}/{base}", hex::encode(&digest[..16]))
            }
        };
        if key.len() <= COORDINATOR_MAX_KEY {
            key
        } else {
            format!("sha256:{}", hex::encode(Sha256::digest(key.as_bytes())))
        }
    }
}

/// Whose keys a key is among: two callers in different namespaces never
/// share an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Namespace {
    /// One namespace for every caller: no tenant header and no credentials
    /// are configured (keys are globally unique by the operator's word).
    Global,
    /// The tenant header's value, when no credentials are configured.
    Tenant(Vec<u8>),
    /// The tenant header's value and the caller's credentials, encoded
    /// without ambiguity (absent ones count as absent).
    Caller(Vec<u8>),
}

/// What identifies a request's caller, for keys.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    /// Request headers whose values identify the caller (`authorization`
    /// and `cookie` by default).
    pub headers: Vec<HeaderName>,
    /// When not empty, a `Cookie` header counts by these cookies' values
    /// alone, so that other cookies may change between retries.
    pub cookies: Vec<String>,
}

impl Credentials {
    /// Whether any credential is configured.
    pub fn is_empty(&self) -> bool {
        self.headers.is_empty()
    }
}

/// The namespace of a request with `headers`: the `tenant` header's value
/// and the `credentials`' (see [`Namespace`]).
pub fn namespace(
    headers: &HeaderMap,
    tenant: Option<&HeaderName>,
    credentials: &Credentials,
) -> Namespace {
    let value = |name: &HeaderName| -> Vec<u8> {
        let values: Vec<&[u8]> = headers.get_all(name).iter().map(|v| v.as_bytes()).collect();
        values.join(&b"\n"[..])
    };
    if credentials.is_empty() {
        return tenant.map_or(Namespace::Global, |t| Namespace::Tenant(value(t)));
    }
    let mut encoded = Vec::new();
    let mut part = |bytes: &[u8]| {
        encoded.extend((bytes.len() as u64).to_be_bytes());
        encoded.extend(bytes);
    };
    if let Some(tenant) = tenant {
        part(b"tenant");
        part(&value(tenant));
    }
    for name in &credentials.headers {
        part(name.as_str().as_bytes());
        if name == http::header::COOKIE && !credentials.cookies.is_empty() {
            for cookie in &credentials.cookies {
                part(cookie.as_bytes());
                part(&cookie_values(headers, cookie).join(&b"\n"[..]));
            }
        } else {
            part(&value(name));
        }
    }
    Namespace::Caller(encoded)
}

/// The values of cookie `name` in the request's `Cookie` headers (RFC
/// 6265: `name=value` pairs separated by `;`).
fn cookie_values<'a>(headers: &'a HeaderMap, name: &str) -> Vec<&'a [u8]> {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b';'))
        .filter_map(|pair| {
            let pair = trim(pair);
            let at = pair.iter().position(|b| *b == b'=')?;
            (trim(&pair[..at]) == name.as_bytes()).then(|| trim(&pair[at + 1..]))
        })
        .collect()
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
        assert_eq!(key.coordinator_key(&Namespace::Global), "k1");
        let a = key.coordinator_key(&Namespace::Tenant(b"client-a".to_vec()));
        let b = key.coordinator_key(&Namespace::Tenant(b"client-b".to_vec()));
        assert_ne!(a, b);
        assert!(a.ends_with("/k1"));
        let spaced = parse(b"\"a b\"", 255)
            .unwrap()
            .coordinator_key(&Namespace::Global);
        assert!(spaced.starts_with("sha256:") && spaced.len() <= 255);
        let long = parse(&[b'k'; 255], 255).unwrap();
        assert!(long.coordinator_key(&Namespace::Caller(vec![1])).len() <= 255);
    }

    #[test]
    fn callers_with_other_credentials_never_share_a_key() {
        let credentials = Credentials {
            headers: vec![http::header::AUTHORIZATION, http::header::COOKIE],
            cookies: vec!["session".into()],
        };
        let of = |pairs: &[(&str, &str)]| {
            let mut headers = HeaderMap::new();
            for (name, value) in pairs {
                headers.append(
                    HeaderName::from_bytes(name.as_bytes()).unwrap(),
                    value.parse().unwrap(),
                );
            }
            namespace(&headers, None, &credentials)
        };
        let alice = of(&[
            ("authorization", "Bearer alice"),
            ("cookie", "session=a; t=1"),
        ]);
        // Another cookie changing between retries does not matter.
        let retry = of(&[
            ("cookie", "t=2;session=a"),
            ("authorization", "Bearer alice"),
        ]);
        assert_eq!(alice, retry);
        assert_ne!(alice, of(&[]));
        assert_ne!(alice, of(&[("authorization", "Bearer alice")]));
        assert_ne!(
            alice,
            of(&[("authorization", "Bearer bob"), ("cookie", "session=a")])
        );
        // A value cannot pass for a name: every part is length-prefixed.
        assert_ne!(
            of(&[("authorization", "ab")]),
            of(&[("authorization", "a"), ("cookie", "session=b")])
        );
        let none = Credentials::default();
        assert_eq!(namespace(&HeaderMap::new(), None, &none), Namespace::Global);
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

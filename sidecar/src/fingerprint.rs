//! What makes two requests with one key "the same request": the method,
//! the path and query, the headers the route names, and the body (in
//! canonical form for JSON when the route asks). Decided here; the
//! coordinator compares the result exactly and answers CONFLICT (422) when
//! it differs.

use http::{HeaderMap, HeaderName, Method};
use idempotency_client::Fingerprint;
use sha2::{Digest, Sha256};

/// The parts of a request the fingerprint covers.
pub struct Request<'a> {
    /// The method.
    pub method: &'a Method,
    /// The path and query, as sent.
    pub path_and_query: &'a str,
    /// The request's headers.
    pub headers: &'a HeaderMap,
    /// The headers that count.
    pub named: &'a [HeaderName],
    /// The whole body.
    pub body: &'a [u8],
    /// Whether a JSON body counts in canonical form.
    pub canonical_json: bool,
}

/// The SHA-256 of the request's parts, each length-prefixed so that no
/// two different requests share an encoding.
pub fn of(request: &Request<'_>) -> Fingerprint {
    let mut hash = Sha256::new();
    let mut part = |bytes: &[u8]| {
        hash.update((bytes.len() as u64).to_be_bytes());
        hash.update(bytes);
    };
    part(request.method.as_str().as_bytes());
    part(request.path_and_query.as_bytes());
    for name in request.named {
        part(name.as_str().as_bytes());
        let values: Vec<&[u8]> = request
            .headers
            .get_all(name)
            .iter()
            .map(http::HeaderValue::as_bytes)
            .collect();
        part(&values.join(&b"\n"[..]));
    }
    let canonical = if request.canonical_json && is_json(request.headers) {
        canonical_json(request.body)
    } else {
        None
    };
    part(canonical.as_deref().unwrap_or(request.body));
    Fingerprint::Exact(hex::encode(hash.finalize()))
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase())
        .is_some_and(|v| v == "application/json" || v.ends_with("+json"))
}

/// The body as canonical JSON (the coordinator's form:
/// [`idempotency_client::canonical_json`]), or `None` when it is not JSON
/// (then the raw bytes count).
fn canonical_json(body: &[u8]) -> Option<Vec<u8>> {
    idempotency_client::canonical_json(body).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(body: &[u8], canonical: bool, path: &str) -> Fingerprint {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", "application/json".parse().unwrap());
        of(&Request {
            method: &Method::POST,
            path_and_query: path,
            headers: &headers,
            named: &[http::header::CONTENT_TYPE],
            body,
            canonical_json: canonical,
        })
    }

    #[test]
    fn canonical_json_ignores_order_and_space() {
        let a = br#"{"b": 1, "a": [1, {"y":2,"x":1}]}"#;
        let b = br#"{"a":[1,{"x":1,"y":2}],"b":1}"#;
        assert_eq!(fp(a, true, "/p"), fp(b, true, "/p"));
        assert_ne!(fp(a, false, "/p"), fp(b, false, "/p"));
        assert_ne!(fp(a, true, "/p"), fp(a, true, "/p?x=1"));
        assert_ne!(fp(b"{", true, "/p"), fp(b"{ ", true, "/p"));
        // Numbers as written, whatever else this crate is built with.
        assert_ne!(
            fp(b"{\"a\":1.10}", true, "/p"),
            fp(b"{\"a\":1.1}", true, "/p")
        );
    }

    #[test]
    fn a_named_header_counts() {
        let named = [HeaderName::from_static("x-account")];
        let mut one = HeaderMap::new();
        one.insert("x-account", "1".parse().unwrap());
        let mut two = HeaderMap::new();
        two.insert("x-account", "2".parse().unwrap());
        let request = |headers| Request {
            method: &Method::POST,
            path_and_query: "/",
            headers,
            named: &named,
            body: b"",
            canonical_json: false,
        };
        assert_ne!(of(&request(&one)), of(&request(&two)));
    }
}

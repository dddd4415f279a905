//! The request as the upstream will read it, decided before its route is:
//! a standard method in any letter case is that method, and the path has
//! the percent-escapes of unreserved characters decoded and its dot
//! segments removed (RFC 3986, section 6.2.2). The normalised request is
//! what is matched, fingerprinted and forwarded, so the route the sidecar
//! picks is the resource the upstream serves. A path that cannot be
//! normalised (an encoded `/` or `\`, a NUL, a malformed escape, a dot
//! segment with parameters) is refused here.

use http::Method;

/// Why a path cannot be normalised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// `%2F` or `%5C`: upstreams disagree on whether it separates segments.
    #[error("the path encodes a segment separator ({0}); send it unencoded")]
    EncodedSeparator(&'static str),
    /// A `%` not followed by two hex digits.
    #[error("the path holds a malformed percent-escape")]
    BadEscape,
    /// A backslash, an encoded NUL, or a dot segment with parameters
    /// (`..;x`), which upstreams read in different ways.
    #[error("the path holds {0}, which upstreams read in different ways")]
    Ambiguous(&'static str),
}

const STANDARD: [Method; 9] = [
    Method::GET,
    Method::HEAD,
    Method::POST,
    Method::PUT,
    Method::DELETE,
    Method::CONNECT,
    Method::OPTIONS,
    Method::TRACE,
    Method::PATCH,
];

/// The method as the upstream reads it: `post` is POST.
pub fn method(method: &Method) -> Method {
    STANDARD
        .iter()
        .find(|m| m.as_str().eq_ignore_ascii_case(method.as_str()))
        .cloned()
        .unwrap_or_else(|| method.clone())
}

/// The normalised form of an origin-form `path` (one that does not start
/// with `/`, such as `*`, is kept as it is).
pub fn path(raw: &str) -> Result<String, PathError> {
    if !raw.starts_with('/') {
        return Ok(raw.to_owned());
    }
    let decoded = decode_unreserved(raw)?;
    Ok(remove_dot_segments(&decoded))
}

fn decode_unreserved(raw: &str) -> Result<String, PathError> {
    let bytes = raw.as_bytes();
    let mut out = String::with_capacity(raw.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes.get(i + 1..i + 3).ok_or(PathError::BadEscape)?;
                let text = std::str::from_utf8(hex).map_err(|_| PathError::BadEscape)?;
                let byte = u8::from_str_radix(text, 16).map_err(|_| PathError::BadEscape)?;
                match byte {
                    b'/' => return Err(PathError::EncodedSeparator("%2F")),
                    b'\\' => return Err(PathError::EncodedSeparator("%5C")),
                    0 => return Err(PathError::Ambiguous("an encoded NUL")),
                    b if b.is_ascii_alphanumeric() || b"-._~".contains(&b) => {
                        out.push(char::from(b));
                    }
                    b => out.push_str(&format!("%{b:02X}")),
                }
                i += 3;
            }
            b'\\' => return Err(PathError::Ambiguous("a backslash")),
            b => {
                out.push(char::from(b));
                i += 1;
            }
        }
    }
    // Only ASCII was pushed: a URI's path is ASCII.
    if out.split('/').any(is_dot_with_parameters) {
        return Err(PathError::Ambiguous("a dot segment with parameters"));
    }
    Ok(out)
}

fn is_dot_with_parameters(segment: &str) -> bool {
    segment
        .split_once(';')
        .is_some_and(|(name, _)| name == "." || name == "..")
}

/// RFC 3986, section 5.2.4, on a path that starts with `/`.
fn remove_dot_segments(path: &str) -> String {
    let mut kept: Vec<&str> = Vec::new();
    let segments: Vec<&str> = path[1..].split('/').collect();
    let last = segments.len() - 1;
    for (i, segment) in segments.iter().enumerate() {
        match *segment {
            "." | ".." => {
                if *segment == ".." {
                    kept.pop();
                }
                // A trailing dot segment leaves the path ending in `/`.
                if i == last {
                    kept.push("");
                }
            }
            s => kept.push(s),
        }
    }
    format!("/{}", kept.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_read_as_the_upstream_reads_them() {
        assert_eq!(path("/%70ayments").unwrap(), "/payments");
        assert_eq!(path("/x/../payments").unwrap(), "/payments");
        assert_eq!(path("/./x/./y/..").unwrap(), "/x/");
        assert_eq!(path("/../../payments").unwrap(), "/payments");
        assert_eq!(path("/x/%2e%2E/payments").unwrap(), "/payments");
        assert_eq!(path("/caf%c3%a9").unwrap(), "/caf%C3%A9");
        assert_eq!(path("/a;b/c").unwrap(), "/a;b/c");
        assert_eq!(path("*").unwrap(), "*");
    }

    #[test]
    fn ambiguous_paths_are_refused() {
        assert_eq!(
            path("/payments%2Fx"),
            Err(PathError::EncodedSeparator("%2F"))
        );
        assert_eq!(path("/x%5c"), Err(PathError::EncodedSeparator("%5C")));
        assert_eq!(path("/x%2"), Err(PathError::BadEscape));
        assert_eq!(path("/x%zz"), Err(PathError::BadEscape));
        assert!(matches!(path("/x%00"), Err(PathError::Ambiguous(_))));
        assert!(matches!(
            path("/x/..;/payments"),
            Err(PathError::Ambiguous(_))
        ));
        assert!(matches!(
            path("/x\\..\\payments"),
            Err(PathError::Ambiguous(_))
        ));
    }

    #[test]
    fn a_standard_method_in_any_case_is_that_method() {
        let lower = Method::from_bytes(b"post").unwrap();
        assert_eq!(method(&lower), Method::POST);
        let other = Method::from_bytes(b"purge").unwrap();
        assert_eq!(method(&other).as_str(), "purge");
    }
}

//! Which requests are coordinated: a route table of method and path
//! patterns, each saying whether the `Idempotency-Key` header is required,
//! accepted or ignored, under which scope, what the fingerprint covers and
//! which response headers are stored. This is where a request's route is
//! decided; requests no route names get the defaults (GET, HEAD, OPTIONS,
//! PUT, DELETE pass; POST and PATCH accept).
//!
//! A route is one line, in a route file or a `--route` flag:
//!
//! ```text
//! POST /payments/** require scope=payments fingerprint-headers=content-type,x-account json=canonical max-body=65536
//! ```

use http::{HeaderName, Method};

use crate::key::Credentials;

/// What the sidecar does with a route's requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A request without the header is refused (400).
    Require,
    /// A request with the header is coordinated; without, passed through.
    Accept,
    /// Passed through untouched, header or not.
    Pass,
}

/// Which response headers a route stores for replays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreHeaders {
    /// Every end-to-end header but the per-caller ones ([`PER_CALLER`]).
    All,
    /// These (a per-caller one only when a route names it).
    Named(Vec<HeaderName>),
}

/// Response headers that belong to one caller's session: stored and
/// replayed only when a route's own `store-headers=` names them.
pub const PER_CALLER: [&str; 3] = ["set-cookie", "authentication-info", "clear-site-data"];

fn is_per_caller(name: &HeaderName) -> bool {
    PER_CALLER.contains(&name.as_str())
}

impl StoreHeaders {
    /// Whether `name` is stored (hop-by-hop headers never are; the caller
    /// drops them first).
    pub fn allows(&self, name: &HeaderName) -> bool {
        match self {
            StoreHeaders::All => !is_per_caller(name),
            StoreHeaders::Named(names) => names.contains(name),
        }
    }

    /// The per-caller header this list names, if any: the default list
    /// (`--store-headers`) may not name one.
    pub fn per_caller(&self) -> Option<&HeaderName> {
        match self {
            StoreHeaders::All => None,
            StoreHeaders::Named(names) => names.iter().find(|n| is_per_caller(n)),
        }
    }
}

/// The headers stored by default: what describes the body and where the
/// created thing is.
pub const DEFAULT_STORED_HEADERS: &str =
    "content-type,content-language,content-encoding,location,etag,last-modified,cache-control";

/// The request headers that identify the caller by default.
pub const DEFAULT_CREDENTIAL_HEADERS: &str = "authorization,cookie";

/// One route.
#[derive(Debug, Clone)]
pub struct Route {
    /// The line as written (`POST /payments/**`): the metrics label.
    pub name: String,
    /// `None` matches every method (`*`).
    method: Option<Method>,
    pattern: Vec<Segment>,
    /// Require, accept or pass.
    pub mode: Mode,
    /// The coordinator scope the route's keys live in.
    pub scope: String,
    /// The request headers the fingerprint covers.
    pub fingerprint_headers: Vec<HeaderName>,
    /// Whether a JSON body is fingerprinted in canonical form (key order
    /// and white space do not matter).
    pub canonical_json: bool,
    /// Which response headers are stored and replayed.
    pub store_headers: StoreHeaders,
    /// The largest request body with a key (`None`: the sidecar's limit).
    pub max_body: Option<usize>,
    /// What identifies the caller: keys are namespaced by it, so that no
    /// caller is answered with another's stored answer.
    pub credentials: Credentials,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    /// `*` or `{name}`: one segment.
    One,
    /// `**` at the end: the rest, maybe nothing.
    Rest,
}

/// Why a route line was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// Fewer than method, pattern and mode.
    #[error("route {0:?}: expected METHOD PATTERN MODE [option=value...]")]
    Shape(String),
    /// Not an HTTP method.
    #[error("route {0:?}: invalid method")]
    Method(String),
    /// Not `/...`, or `**` not at the end.
    #[error("route {0:?}: a pattern starts with '/' and has '**' only at its end")]
    Pattern(String),
    /// Not require, accept or pass.
    #[error("route {0:?}: the mode is require, accept or pass")]
    Mode(String),
    /// An option the sidecar does not know, or a bad value.
    #[error("route {line:?}: bad option {option:?}")]
    Option {
        /// The route line.
        line: String,
        /// The option.
        option: String,
    },
}

/// The defaults a route starts from.
#[derive(Debug, Clone)]
pub struct RouteDefaults {
    /// The scope of routes that name none.
    pub scope: String,
    /// The headers fingerprinted when a route names none.
    pub fingerprint_headers: Vec<HeaderName>,
    /// Which headers are stored when a route names none.
    pub store_headers: StoreHeaders,
    /// What identifies the caller when a route says nothing.
    pub credentials: Credentials,
}

impl Route {
    /// Parses one route line.
    pub fn parse(line: &str, defaults: &RouteDefaults) -> Result<Route, RouteError> {
        let mut words = line.split_whitespace();
        let (Some(method), Some(pattern), Some(mode)) = (words.next(), words.next(), words.next())
        else {
            return Err(RouteError::Shape(line.to_owned()));
        };
        let method = match method {
            "*" => None,
            m => Some(
                Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                    .map_err(|_| RouteError::Method(line.to_owned()))?,
            ),
        };
        let pattern = parse_pattern(pattern).ok_or_else(|| RouteError::Pattern(line.to_owned()))?;
        let mode = match mode {
            "require" => Mode::Require,
            "accept" => Mode::Accept,
            "pass" => Mode::Pass,
            _ => return Err(RouteError::Mode(line.to_owned())),
        };
        let mut route = Route {
            name: format!(
                "{} {}",
                method.as_ref().map_or("*", Method::as_str),
                line.split_whitespace().nth(1).unwrap_or_default()
            ),
            method,
            pattern,
            mode,
            scope: defaults.scope.clone(),
            fingerprint_headers: defaults.fingerprint_headers.clone(),
            canonical_json: false,
            store_headers: defaults.store_headers.clone(),
            max_body: None,
            credentials: defaults.credentials.clone(),
        };
        for option in words {
            route.set(option).ok_or_else(|| RouteError::Option {
                line: line.to_owned(),
                option: option.to_owned(),
            })?;
        }
        Ok(route)
    }

    fn set(&mut self, option: &str) -> Option<()> {
        let (name, value) = option.split_once('=')?;
        match name {
            "scope" => self.scope = valid_scope(value)?,
            "fingerprint-headers" => self.fingerprint_headers = header_list(value)?,
            "json" => {
                self.canonical_json = match value {
                    "canonical" => true,
                    "raw" => false,
                    _ => return None,
                }
            }
            "store-headers" => self.store_headers = store_headers(value)?,
            "max-body" => self.max_body = Some(value.parse().ok()?),
            "credential-headers" => self.credentials.headers = header_list(value)?,
            "credential-cookies" => self.credentials.cookies = cookie_list(value)?,
            _ => return None,
        }
        Some(())
    }

    fn matches(&self, method: &Method, path: &str) -> bool {
        if self.method.as_ref().is_some_and(|m| m != method) {
            return false;
        }
        // As lenient as upstreams are: empty segments, a segment's
        // parameters (`;x`) and letter case do not count, so that no
        // spelling of a route's path escapes it.
        let mut segments = path
            .split('/')
            .map(|s| s.split(';').next().unwrap_or_default())
            .filter(|s| !s.is_empty());
        for (i, segment) in self.pattern.iter().enumerate() {
            match segment {
                Segment::Rest => return i + 1 == self.pattern.len(),
                Segment::One => {
                    if segments.next().is_none() {
                        return false;
                    }
                }
                Segment::Literal(literal) => {
                    if !segments
                        .next()
                        .is_some_and(|s| s.eq_ignore_ascii_case(literal))
                    {
                        return false;
                    }
                }
            }
        }
        segments.next().is_none()
    }
}

fn parse_pattern(pattern: &str) -> Option<Vec<Segment>> {
    let rest = pattern.strip_prefix('/')?;
    let segments: Vec<Segment> = rest
        .split('/')
        .map(|s| match s {
            "**" => Segment::Rest,
            "*" => Segment::One,
            s if s.starts_with('{') && s.ends_with('}') => Segment::One,
            s => Segment::Literal(s.to_owned()),
        })
        .collect();
    let rest_at = segments.iter().position(|s| *s == Segment::Rest);
    match rest_at {
        Some(i) if i + 1 != segments.len() => None,
        _ => Some(segments),
    }
}

/// A scope the coordinator accepts: 1 to 128 of `[A-Za-z0-9._:/-]`.
pub fn valid_scope(scope: &str) -> Option<String> {
    let ok = !scope.is_empty()
        && scope.len() <= 128
        && scope
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:/-".contains(&b));
    ok.then(|| scope.to_owned())
}

/// A comma-separated list of header names (`-` or empty for none).
pub fn header_list(value: &str) -> Option<Vec<HeaderName>> {
    if value == "-" {
        return Some(Vec::new());
    }
    value
        .split(',')
        .filter(|n| !n.is_empty())
        .map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect()
}

/// A comma-separated list of cookie names (`-` or empty for none).
pub fn cookie_list(value: &str) -> Option<Vec<String>> {
    let token = |c: u8| c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c);
    if value == "-" {
        return Some(Vec::new());
    }
    value
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(|n| n.bytes().all(token).then(|| n.to_owned()))
        .collect()
}

/// `*` for every end-to-end header but the per-caller ones, or a list.
pub fn store_headers(value: &str) -> Option<StoreHeaders> {
    if value == "*" {
        return Some(StoreHeaders::All);
    }
    header_list(value).map(StoreHeaders::Named)
}

/// The route table: the configured routes in order, then the defaults.
#[derive(Debug, Clone)]
pub struct Routes {
    routes: Vec<Route>,
    defaults: RouteDefaults,
}

impl Routes {
    /// The routes of `lines` (a route file's lines and `--route` flags;
    /// blank lines and `#` comments are skipped).
    pub fn parse<'a>(
        lines: impl IntoIterator<Item = &'a str>,
        defaults: RouteDefaults,
    ) -> Result<Routes, RouteError> {
        let routes = lines
            .into_iter()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|l| Route::parse(l, &defaults))
            .collect::<Result<_, _>>()?;
        Ok(Routes { routes, defaults })
    }

    /// Whether a request with `method` may be coordinated: some route that
    /// is not `pass` takes it, or the default does (POST, PATCH).
    pub fn may_coordinate(&self, method: &Method) -> bool {
        *method == Method::POST
            || *method == Method::PATCH
            || self
                .routes
                .iter()
                .any(|r| r.mode != Mode::Pass && r.method.as_ref().is_none_or(|m| m == method))
    }

    /// The first route that matches `method` and `path` (both normalised,
    /// [`crate::normalise`]), else the default for the method.
    pub fn route(&self, method: &Method, path: &str) -> Route {
        if let Some(route) = self.routes.iter().find(|r| r.matches(method, path)) {
            return route.clone();
        }
        let mode = if *method == Method::POST || *method == Method::PATCH {
            Mode::Accept
        } else {
            Mode::Pass
        };
        Route {
            name: "default".to_owned(),
            method: None,
            pattern: vec![Segment::Rest],
            mode,
            scope: self.defaults.scope.clone(),
            fingerprint_headers: self.defaults.fingerprint_headers.clone(),
            canonical_json: false,
            store_headers: self.defaults.store_headers.clone(),
            max_body: None,
            credentials: self.defaults.credentials.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> RouteDefaults {
        RouteDefaults {
            scope: "http".into(),
            fingerprint_headers: header_list("content-type").unwrap(),
            store_headers: store_headers(DEFAULT_STORED_HEADERS).unwrap(),
            credentials: Credentials {
                headers: header_list(DEFAULT_CREDENTIAL_HEADERS).unwrap(),
                cookies: Vec::new(),
            },
        }
    }

    #[test]
    fn routes_match_in_order_then_defaults_apply() {
        let routes = Routes::parse(
            [
                "# payments",
                "POST /payments/** require scope=payments json=canonical max-body=10",
                "* /orders/{id}/cancel accept scope=orders",
                "POST /health pass",
            ],
            defaults(),
        )
        .unwrap();
        let r = routes.route(&Method::POST, "/payments/a/b");
        assert_eq!(
            (r.mode, r.scope.as_str(), r.canonical_json),
            (Mode::Require, "payments", true)
        );
        assert_eq!(routes.route(&Method::POST, "/payments").mode, Mode::Require);
        assert_eq!(
            routes.route(&Method::PUT, "/orders/7/cancel").scope,
            "orders"
        );
        assert_eq!(
            routes.route(&Method::PUT, "/orders//cancel").mode,
            Mode::Pass
        );
        assert_eq!(routes.route(&Method::POST, "/health").mode, Mode::Pass);
        assert_eq!(routes.route(&Method::POST, "/other").mode, Mode::Accept);
        assert_eq!(routes.route(&Method::PATCH, "/other").mode, Mode::Accept);
        assert_eq!(routes.route(&Method::GET, "/payments/x").mode, Mode::Pass);
        assert_eq!(routes.route(&Method::DELETE, "/x").mode, Mode::Pass);
        // No spelling of a route's path escapes it.
        for path in ["/Payments", "/payments;x", "//payments/", "/PAYMENTS/a;b/c"] {
            assert_eq!(
                routes.route(&Method::POST, path).mode,
                Mode::Require,
                "{path}"
            );
        }
        assert!(routes.may_coordinate(&Method::PUT), "* /orders/... accept");
        let plain = Routes::parse(["GET /x pass"], defaults()).unwrap();
        assert!(!plain.may_coordinate(&Method::GET));
        assert!(plain.may_coordinate(&Method::POST));
    }

    #[test]
    fn bad_routes_are_refused() {
        let d = defaults();
        assert!(matches!(
            Route::parse("POST", &d),
            Err(RouteError::Shape(_))
        ));
        assert!(matches!(
            Route::parse("POST x require", &d),
            Err(RouteError::Pattern(_))
        ));
        assert!(matches!(
            Route::parse("POST /**/x require", &d),
            Err(RouteError::Pattern(_))
        ));
        assert!(matches!(
            Route::parse("POST /x maybe", &d),
            Err(RouteError::Mode(_))
        ));
        assert!(matches!(
            Route::parse("POST /x require scope=a b", &d),
            Err(RouteError::Option { .. })
        ));
        assert!(matches!(
            Route::parse("POST /x require scope=", &d),
            Err(RouteError::Option { .. })
        ));
    }

    #[test]
    fn set_cookie_is_stored_only_when_named() {
        let cookie = http::header::SET_COOKIE;
        assert!(!StoreHeaders::All.allows(&cookie));
        assert!(store_headers("set-cookie").unwrap().allows(&cookie));
        assert!(
            !store_headers(DEFAULT_STORED_HEADERS)
                .unwrap()
                .allows(&cookie)
        );
    }
}

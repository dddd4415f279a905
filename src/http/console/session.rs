//! Who is using the console: a server-side session (`sessions`) named by a
//! random id in an HttpOnly, SameSite=Strict cookie (`Secure` when the
//! port serves TLS), opened at `/console/login` and checked on every
//! request: its token must still name an admin. The login form carries a
//! CSRF token of its own (a cookie and a form field that must match), and
//! each session's forms carry the session's. Without `--auth-tokens`
//! everyone is the default tenant's admin, and every page says so.

use std::sync::OnceLock;

use http::{HeaderMap, HeaderValue, Response, header};
use subtle::ConstantTimeEq as _;

use super::answer::see_other;
use crate::auth::{AuthError, Caller};
use crate::http::Door;
use crate::transport::HttpBody;

/// The cookie that holds the session's id.
pub(super) const SESSION_COOKIE: &str = "idempotency_console";
/// The cookie that holds the login form's CSRF token.
pub(super) const LOGIN_COOKIE: &str = "idempotency_console_login";
/// How long a login form may be sent after it was shown.
const LOGIN_FORM_SECONDS: u64 = 60 * 60;

/// A console user, authenticated.
pub(super) struct Session {
    /// The caller the credential names: an admin.
    pub caller: Caller,
    /// The credential as the console's Coordinator calls carry it.
    pub headers: HeaderMap,
    /// What the forms must carry back.
    pub csrf: String,
    /// The operator's own name, if given at login.
    pub operator: String,
    /// The server checks credentials; when not, the pages warn.
    pub auth_on: bool,
    /// The session's id, to end it at logout; `None` without one (no
    /// credentials, and no login).
    pub id: Option<String>,
}

/// The CSRF token of the console's forms when the server runs without
/// credentials and the user has not logged in (with no session to keep
/// one): the process's own.
fn local_csrf() -> &'static str {
    static SECRET: OnceLock<String> = OnceLock::new();
    SECRET.get_or_init(super::sessions::random_secret)
}

/// Whether `sent` is `expected`, in constant time; never when empty.
pub(super) fn same_secret(sent: &str, expected: &str) -> bool {
    !expected.is_empty()
        && sent.len() == expected.len()
        && bool::from(sent.as_bytes().ct_eq(expected.as_bytes()))
}

/// The `authorization` header for `token`.
pub(super) fn bearer(token: &str) -> Option<HeaderMap> {
    let mut headers = HeaderMap::new();
    let value = HeaderValue::from_str(&format!("Bearer {token}")).ok()?;
    headers.insert(header::AUTHORIZATION, value);
    Some(headers)
}

/// A console cookie: HttpOnly, SameSite=Strict, `Secure` under TLS.
fn cookie(door: &Door, name: &str, value: &str, max_age: Option<u64>) -> String {
    let mut cookie = format!("{name}={value}; Path=/console/; HttpOnly; SameSite=Strict");
    if door.tls {
        cookie.push_str("; Secure");
    }
    if let Some(seconds) = max_age {
        cookie.push_str(&format!("; Max-Age={seconds}"));
    }
    cookie
}

/// The cookie that names session `id`.
pub(super) fn session_cookie(door: &Door, id: &str) -> String {
    cookie(door, SESSION_COOKIE, id, None)
}

/// The cookie that holds a login form's CSRF token.
pub(super) fn login_cookie(door: &Door, csrf: &str) -> String {
    cookie(door, LOGIN_COOKIE, csrf, Some(LOGIN_FORM_SECONDS))
}

/// Cookies that log out.
pub(super) fn cleared_cookies(door: &Door) -> [String; 2] {
    [SESSION_COOKIE, LOGIN_COOKIE].map(|name| cookie(door, name, "", Some(0)))
}

/// The cookies of a request, as (name, value) pairs.
fn cookies(headers: &HeaderMap) -> impl Iterator<Item = (&str, &str)> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
}

/// The value of cookie `name`.
pub(super) fn cookie_value<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    cookies(headers).find(|(n, _)| *n == name).map(|(_, v)| v)
}

impl Session {
    /// The session of a request; otherwise the answer to give: the login
    /// page for a missing, ended or revoked session, a refusal for a
    /// credential that is no longer an admin's.
    pub(super) fn of(door: &Door, headers: &HeaderMap) -> Result<Session, Response<HttpBody>> {
        let auth_on = door.auth.is_on();
        let id = cookie_value(headers, SESSION_COOKIE).filter(|id| !id.is_empty());
        let kept = match (door.console.as_ref(), id) {
            (Some(console), Some(id)) => console.sessions.find(id),
            _ => None,
        };
        let (call_headers, csrf, operator) = match (auth_on, kept) {
            (false, None) => (HeaderMap::new(), local_csrf().to_owned(), String::new()),
            (false, Some(kept)) => (HeaderMap::new(), kept.csrf, kept.operator),
            (true, None) => return Err(see_other("/console/login")),
            (true, Some(kept)) => match kept.token.as_deref().and_then(bearer) {
                Some(headers) => (headers, kept.csrf, kept.operator),
                None => return Err(see_other("/console/login")),
            },
        };
        let end = || {
            if let (Some(console), Some(id)) = (door.console.as_ref(), id) {
                console.sessions.close(id);
            }
        };
        let caller = match door.auth.caller_from_headers(&call_headers) {
            Ok(caller) => caller,
            Err(AuthError::Missing | AuthError::Unknown) => {
                end();
                return Err(see_other("/console/login"));
            }
        };
        if !caller.admin {
            // Demoted by a reload since the login.
            end();
            return Err(see_other("/console/login"));
        }
        Ok(Session {
            caller,
            headers: call_headers,
            csrf,
            operator,
            auth_on,
            id: id.map(str::to_owned),
        })
    }

    /// Whether a form's CSRF token is this session's.
    pub(super) fn csrf_matches(&self, sent: &str) -> bool {
        same_secret(sent, &self.csrf)
    }
}

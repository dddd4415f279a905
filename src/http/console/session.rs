//! Who is using the console: the admin token kept in an HttpOnly,
//! SameSite=Strict cookie (entered once at `/console/login`), checked by the
//! server's authenticator on every request, and the CSRF token the forms
//! carry. Without `--auth-tokens` everyone is the default tenant's admin, and
//! every page says so.

use std::sync::OnceLock;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq as _;

use super::{Door, HttpBody, pages, see_other};
use crate::auth::{AuthError, Caller};

/// The cookie that holds the token (base64url, as tokens may hold
/// characters a cookie may not).
pub(super) const TOKEN_COOKIE: &str = "idempotency_console";
/// The cookie that holds the operator's own name, recorded with actions.
pub(super) const OPERATOR_COOKIE: &str = "idempotency_console_operator";

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
}

/// The process's secret for CSRF tokens when there are no credentials to
/// derive them from.
fn local_secret() -> &'static str {
    static SECRET: OnceLock<String> = OnceLock::new();
    SECRET.get_or_init(|| uuid::Uuid::new_v4().to_string())
}

/// The CSRF token of a credential: the same on every replica, and useless
/// without the credential's cookie (SameSite=Strict keeps other sites from
/// sending it).
fn csrf_of(secret: &str) -> String {
    let digest = Sha256::digest(format!("idempotency console csrf\n{secret}").as_bytes());
    hex::encode(&digest[..16])
}

/// The `authorization` header for `token`.
pub(super) fn bearer(token: &str) -> Option<HeaderMap> {
    let mut headers = HeaderMap::new();
    let value = HeaderValue::from_str(&format!("Bearer {token}")).ok()?;
    headers.insert(header::AUTHORIZATION, value);
    Some(headers)
}

/// The cookie that logs `token` in.
pub(super) fn token_cookie(token: &str) -> String {
    format!(
        "{TOKEN_COOKIE}={}; Path=/console/; HttpOnly; SameSite=Strict",
        URL_SAFE_NO_PAD.encode(token)
    )
}

/// The operator's name as a cookie.
pub(super) fn operator_cookie(name: &str) -> String {
    let value: String = form_urlencoded::byte_serialize(name.as_bytes()).collect();
    format!("{OPERATOR_COOKIE}={value}; Path=/console/; HttpOnly; SameSite=Strict")
}

/// Cookies that log out.
pub(super) fn cleared_cookies() -> [String; 2] {
    [TOKEN_COOKIE, OPERATOR_COOKIE]
        .map(|name| format!("{name}=; Path=/console/; HttpOnly; SameSite=Strict; Max-Age=0"))
}

impl Session {
    /// The session of a request; otherwise the answer to give: the login
    /// page for a missing or unknown token, a refusal for a non-admin one.
    #[expect(
        clippy::result_large_err,
        reason = "the error is the answer itself, built once per refused request"
    )]
    pub(super) fn of(door: &Door, headers: &HeaderMap) -> Result<Session, Response<HttpBody>> {
        let auth_on = door.auth.is_on();
        let mut token = None;
        let mut operator = String::new();
        for (name, value) in super::cookies(headers) {
            if name == TOKEN_COOKIE {
                token = URL_SAFE_NO_PAD
                    .decode(value)
                    .ok()
                    .and_then(|t| String::from_utf8(t).ok());
            } else if name == OPERATOR_COOKIE {
                operator = form_urlencoded::parse(format!("n={value}").as_bytes())
                    .next()
                    .map(|(_, v)| v.into_owned())
                    .unwrap_or_default();
            }
        }
        let (headers, secret) = match (auth_on, token) {
            (false, _) => (HeaderMap::new(), local_secret().to_owned()),
            (true, None) => return Err(see_other("/console/login")),
            (true, Some(token)) => match bearer(&token) {
                Some(headers) => (headers, token),
                None => return Err(see_other("/console/login")),
            },
        };
        let caller = match door.auth.caller_from_headers(&headers) {
            Ok(caller) => caller,
            Err(AuthError::Missing | AuthError::Unknown) => {
                return Err(see_other("/console/login"));
            }
        };
        if !caller.admin {
            return Err(super::html(
                StatusCode::FORBIDDEN,
                pages::login(auth_on, Some("This credential is not an admin credential.")),
            ));
        }
        Ok(Session {
            caller,
            headers,
            csrf: csrf_of(&secret),
            operator,
            auth_on,
        })
    }

    /// Whether a form's CSRF token is this session's.
    pub(super) fn csrf_matches(&self, sent: &str) -> bool {
        sent.len() == self.csrf.len() && bool::from(sent.as_bytes().ct_eq(self.csrf.as_bytes()))
    }
}

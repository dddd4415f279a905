//! The operator console (`--console`): HTML pages at `/console/` on the
//! HTTP port for an admin credential: a key's record, a scope's keys, the
//! tenant's counts per scope, and the admin actions.
//!
//! Every page is rendered here, with every value from a record escaped by
//! the templates (`pages`, maud); it works without JavaScript, and one small
//! script (`console.js`, embedded like the style sheet) follows a
//! PROCESSING record live. Each page's data comes from Coordinator calls
//! made in process through admission (as the door's other routes), with
//! the credential the operator logged in with: the console decides nothing
//! about callers or records itself.
//!
//! Access (`session`, `sessions`): the admin token, entered once, opens a
//! server-side session named by a random id in an HttpOnly,
//! SameSite=Strict cookie scoped to `/console/` (`Secure` under TLS); the
//! token never leaves the login request. A non-admin token is refused at
//! login, and a session whose token a reload revoked ends on its next
//! request (its live stream at once). Failed logins are counted per client
//! address and, past a limit, refused for a while (`logins`). Every
//! state-changing request is a POST carrying a CSRF token (the login
//! form's own, then the session's), and each action first shows a
//! confirmation page. Every answer carries a Content-Security-Policy
//! without inline script or style, `X-Frame-Options: DENY`,
//! `Cache-Control: no-store`, and under TLS `Strict-Transport-Security`.

mod actions;
mod logins;
mod pages;
mod session;
mod sessions;

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use maud::Markup;
use tonic::Status;

use super::inprocess::Unary;
use super::{Asks, Door};
use crate::proto;
use crate::transport::{HttpBody, OpenCall};
use session::Session;

/// Where the console lives on the HTTP port.
pub const PREFIX: &str = "/console/";

/// How long one of the console's Coordinator calls may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The console's one script and style sheet, embedded.
const SCRIPT: &str = include_str!("console.js");
const STYLE: &str = include_str!("console.css");

/// No inline script or style, nothing from elsewhere, no framing.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
     connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// What the console keeps: the sessions, and the failed logins.
#[derive(Default)]
pub(super) struct Console {
    /// The open sessions.
    sessions: sessions::Sessions,
    /// Failed logins per client address.
    logins: logins::FailedLogins,
}

/// The decoded query string of a request.
pub(super) struct Query(Vec<(String, String)>);

impl Query {
    fn parse(text: &[u8]) -> Query {
        Query(form_urlencoded::parse(text).into_owned().collect())
    }

    /// The value of `name`, empty when absent.
    fn get(&self, name: &str) -> &str {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map_or("", |(_, v)| v.as_str())
    }
}

/// HSTS under TLS: a year, as browsers' preload lists ask.
const HSTS: &str = "max-age=31536000";

/// Answers a request under [`PREFIX`].
pub(super) async fn serve(
    door: &Door,
    request: Request<Incoming>,
    call: OpenCall,
) -> Response<HttpBody> {
    let mut response = route(door, request, call).await;
    if door.tls {
        response.headers_mut().insert(
            header::STRICT_TRANSPORT_SECURITY,
            HeaderValue::from_static(HSTS),
        );
    }
    response
}

async fn route(door: &Door, request: Request<Incoming>, call: OpenCall) -> Response<HttpBody> {
    let path = request.uri().path().to_owned();
    let query = Query::parse(request.uri().query().unwrap_or("").as_bytes());
    let page = &path[PREFIX.len()..];
    match (request.method().clone(), page) {
        (Method::GET, "console.js") => asset(SCRIPT, "text/javascript; charset=utf-8"),
        (Method::GET, "console.css") => asset(STYLE, "text/css; charset=utf-8"),
        (Method::GET, "login") => actions::login_page(door, StatusCode::OK, None),
        (Method::POST, "login") => actions::login(door, request).await,
        (Method::POST, "logout") => actions::logout(door, request).await,
        (Method::GET | Method::POST, _) => {
            let session = match Session::of(door, request.headers()) {
                Ok(session) => session,
                Err(response) => return response,
            };
            match (request.method().clone(), page) {
                (Method::GET, "") => actions::home(door, &session, &query, call).await,
                (Method::GET, "records") => actions::records(door, &session, &query, call).await,
                (Method::GET, "record") => actions::record(door, &session, &query, call).await,
                (Method::GET, "result") => actions::result(door, &session, &query, call).await,
                (Method::GET, "watch") => actions::watch(door, &session, &query, call).await,
                (Method::GET, "confirm") => html(StatusCode::OK, pages::confirm(&session, &query)),
                (Method::POST, "act") => actions::act(door, &session, request, call).await,
                _ => not_found(&session),
            }
        }
        _ => {
            let mut response = plain(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
            response
                .headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("GET, POST"));
            response
        }
    }
}

fn not_found(session: &Session) -> Response<HttpBody> {
    html(
        StatusCode::NOT_FOUND,
        pages::message(session, "Not found", "There is no such page."),
    )
}

/// The headers every console answer carries.
fn guarded(mut response: Response<HttpBody>) -> Response<HttpBody> {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

fn body(bytes: impl Into<Bytes>) -> HttpBody {
    Full::new(bytes.into()).boxed_unsync()
}

/// A page.
fn html(status: StatusCode, markup: Markup) -> Response<HttpBody> {
    let mut response = Response::new(body(markup.into_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    guarded(response)
}

fn plain(status: StatusCode, text: &'static str) -> Response<HttpBody> {
    let mut response = Response::new(body(text));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    guarded(response)
}

fn asset(text: &'static str, content_type: &'static str) -> Response<HttpBody> {
    let mut response = Response::new(body(text));
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    guarded(response)
}

/// A redirect after a form (303: the browser GETs `location`).
fn see_other(location: &str) -> Response<HttpBody> {
    let mut response = Response::new(body(Bytes::new()));
    *response.status_mut() = StatusCode::SEE_OTHER;
    if let Ok(value) = HeaderValue::from_str(location) {
        response.headers_mut().insert(header::LOCATION, value);
    }
    guarded(response)
}

/// `path?name=value&...`, the values encoded.
fn link(path: &str, pairs: &[(&str, &str)]) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    for (name, value) in pairs {
        query.append_pair(name, value);
    }
    format!("{PREFIX}{path}?{}", query.finish())
}

impl Door {
    /// One unary Coordinator call from the console, as `session`'s caller.
    async fn console_call<Q: Unary + Clone>(
        &self,
        session: &Session,
        request: &Q,
        call: &OpenCall,
    ) -> Result<Q::Answer, Status> {
        let answer = self
            .unary(
                request.clone(),
                &session.headers,
                Asks::caller(&session.caller),
                Some(CALL_TIMEOUT),
                call.another(),
            )
            .await?;
        Ok(answer.into_inner())
    }
}

/// A Coordinator call's refusal as a page.
fn refused(session: &Session, status: &Status) -> Response<HttpBody> {
    let code = super::http_status(status.code());
    html(
        code,
        pages::message(session, "The coordinator refused", status.message()),
    )
}

/// The headers of a request, for the session.
pub(super) fn cookies(headers: &HeaderMap) -> impl Iterator<Item = (&str, &str)> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
}

/// A Watch for the record page's live updates.
fn watch_request(scope: &str, key: &str) -> proto::WatchRequest {
    proto::WatchRequest {
        scope: scope.to_owned(),
        key: key.to_owned(),
        timeout: Some(prost_types::Duration {
            seconds: 60,
            nanos: 0,
        }),
    }
}

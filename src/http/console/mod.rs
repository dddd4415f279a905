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
mod answer;
mod logins;
mod pages;
mod query;
mod session;
mod sessions;

use std::time::Duration;

use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use tonic::Status;

use super::inprocess::Unary;
use super::{Asks, Door};
use crate::proto;
use crate::transport::{HttpBody, OpenCall};
use answer::{asset, html, plain};
pub use query::PREFIX;
use query::Query;
use session::Session;

/// How long one of the console's Coordinator calls may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The console's one script and style sheet, embedded.
const SCRIPT: &str = include_str!("console.js");
const STYLE: &str = include_str!("console.css");

/// What the console keeps: the sessions, and the failed logins.
#[derive(Default)]
pub(super) struct Console {
    /// The open sessions.
    sessions: sessions::Sessions,
    /// Failed logins per client address.
    logins: logins::FailedLogins,
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

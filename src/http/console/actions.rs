//! What each console request does: log in and out, read the pages' data
//! through Coordinator calls, follow a record, and run the admin actions
//! (POST, with the session's CSRF token, after the confirmation page).

use futures_util::StreamExt as _;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt as _, BodyStream, Limited, StreamBody};
use hyper::body::Incoming;

use super::answer::{body, guarded, html, see_other};
use super::query::{Query, link};
use super::session::{self, Session};
use super::{CALL_TIMEOUT, logins, pages, refused, sessions, watch_request};
use crate::domain::operator_name;
use crate::http::inprocess::SERVICE_PREFIX;
use crate::http::{Asks, Door};
use crate::metrics;
use crate::proto;
use crate::transport::{HttpBody, OpenCall, Peer};

/// The longest form the console reads.
const MAX_FORM_BYTES: usize = 16 * 1024;

/// A form's fields; `None` for a form too long, too slow, sent from another
/// site, or not a form.
async fn form(door: &Door, request: Request<Incoming>) -> Option<Query> {
    let cross_site = request
        .headers()
        .get("sec-fetch-site")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"cross-site"));
    let is_form = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
    if cross_site || !is_form {
        return None;
    }
    let read = Limited::new(request.into_body(), MAX_FORM_BYTES).collect();
    let bytes = tokio::time::timeout(door.body_timeout, read)
        .await
        .ok()?
        .ok()?
        .to_bytes();
    Some(Query::parse(&bytes))
}

fn with_cookies(mut response: Response<HttpBody>, cookies: &[String]) -> Response<HttpBody> {
    for cookie in cookies {
        if let Ok(value) = HeaderValue::from_str(cookie) {
            response.headers_mut().append(header::SET_COOKIE, value);
        }
    }
    response
}

/// The login page, with a fresh login CSRF token in its form and cookie.
pub(super) fn login_page(
    door: &Door,
    status: StatusCode,
    error: Option<&str>,
) -> Response<HttpBody> {
    let csrf = sessions::random_secret();
    let page = html(status, pages::login(door.auth.is_on(), error, &csrf));
    with_cookies(page, &[session::login_cookie(door, &csrf)])
}

/// Too many failed logins from the client's address: refused for `wait`.
fn too_many(door: &Door, wait: std::time::Duration) -> Response<HttpBody> {
    let seconds = wait.as_secs().max(1);
    let text = format!("Too many failed logins from your address: try again in {seconds} s.");
    let mut response = login_page(door, StatusCode::TOO_MANY_REQUESTS, Some(&text));
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    response
}

/// Checks the form's CSRF token and the admin token, and opens a session
/// that keeps the token; a failure counts against the client's address,
/// and an address with too many is refused without a look at the token.
pub(super) async fn login(door: &Door, request: Request<Incoming>) -> Response<HttpBody> {
    let Some(console) = door.console.as_ref() else {
        return see_other("/console/login");
    };
    let peer = request.extensions().get::<Peer>().map(|p| p.0.ip());
    if let Some(wait) = peer.and_then(|ip| console.logins.refused(ip)) {
        door.admission
            .metrics()
            .request_refused(metrics::Port::Http, "console_login_limited");
        console.logins.log(peer, logins::MAX_FAILURES, true);
        return too_many(door, wait);
    }
    let expected = session::cookie_value(request.headers(), session::LOGIN_COOKIE)
        .unwrap_or_default()
        .to_owned();
    let Some(fields) = form(door, request).await else {
        return login_page(
            door,
            StatusCode::BAD_REQUEST,
            Some("Send the login form from this page."),
        );
    };
    if !session::same_secret(fields.get("csrf"), &expected) {
        return login_page(
            door,
            StatusCode::FORBIDDEN,
            Some("The login form expired: log in again."),
        );
    }
    let operator = fields.get("operator").trim();
    if let Err(e) = operator_name(operator) {
        return login_page(
            door,
            StatusCode::BAD_REQUEST,
            Some(&format!("Your name {e}.")),
        );
    }
    let token = fields.get("token").trim();
    let caller = session::bearer(token).map(|h| door.auth.caller_from_headers(&h));
    let refusal = match caller {
        Some(Ok(caller)) if caller.admin => {
            tracing::info!(tenant = caller.tenant.as_str(), operator, "console login");
            let token = door.auth.is_on().then(|| token.to_owned());
            let id = console.sessions.open(token, operator.to_owned());
            let [_, no_login_form] = session::cleared_cookies(door);
            return with_cookies(
                see_other("/console/"),
                &[session::session_cookie(door, &id), no_login_form],
            );
        }
        Some(Ok(_)) => (
            StatusCode::FORBIDDEN,
            "This credential is not an admin credential.",
        ),
        _ => (StatusCode::UNAUTHORIZED, "Unknown credential."),
    };
    door.admission
        .metrics()
        .request_refused(metrics::Port::Http, "console_login_failed");
    let failures = peer.map_or(0, |ip| console.logins.failed(ip));
    console.logins.log(peer, failures, false);
    login_page(door, refusal.0, Some(refusal.1))
}

/// Ends the session (when the form carries its CSRF token) and forgets the
/// cookie.
pub(super) async fn logout(door: &Door, request: Request<Incoming>) -> Response<HttpBody> {
    let session = Session::of(door, request.headers()).ok();
    let fields = form(door, request).await;
    if let (Some(session), Some(fields), Some(console)) = (session, fields, door.console.as_ref())
        && let (true, Some(id)) = (session.csrf_matches(fields.get("csrf")), &session.id)
    {
        console.sessions.close(id);
    }
    with_cookies(see_other("/console/login"), &session::cleared_cookies(door))
}

/// The home page: lookups and a page of the counts per scope.
pub(super) async fn home(
    door: &Door,
    session: &Session,
    query: &Query,
    call: OpenCall,
) -> Response<HttpBody> {
    let request = proto::SummarizeRequest {
        page_token: query.get("after").to_owned(),
        page_size: pages::SCOPES_PER_PAGE,
    };
    let answer: Result<proto::SummarizeResponse, _> =
        door.console_call(session, &request, &call).await;
    match answer {
        Ok(summary) => html(StatusCode::OK, pages::home(session, &summary)),
        Err(status) => refused(session, &status),
    }
}

/// A page of a scope's keys.
pub(super) async fn records(
    door: &Door,
    session: &Session,
    query: &Query,
    call: OpenCall,
) -> Response<HttpBody> {
    let status = match query.get("status") {
        "" => proto::Status::Unspecified,
        name => proto::Status::from_str_name(&format!("STATUS_{name}"))
            .unwrap_or(proto::Status::Unspecified),
    };
    let request = proto::ListRecordsRequest {
        scope: query.get("scope").to_owned(),
        key_prefix: query.get("prefix").to_owned(),
        page_token: query.get("after").to_owned(),
        page_size: 50,
        status: status.into(),
    };
    let answer: Result<proto::ListRecordsResponse, _> =
        door.console_call(session, &request, &call).await;
    match answer {
        Ok(page) => html(StatusCode::OK, pages::records(session, query, &page)),
        Err(status) => refused(session, &status),
    }
}

async fn get(
    door: &Door,
    session: &Session,
    query: &Query,
    call: &OpenCall,
) -> Result<proto::Record, Response<HttpBody>> {
    let request = proto::GetRequest {
        scope: query.get("scope").to_owned(),
        key: query.get("key").to_owned(),
    };
    let answer: Result<proto::GetResponse, _> = door.console_call(session, &request, call).await;
    match answer {
        Ok(proto::GetResponse {
            record: Some(record),
        }) => Ok(record),
        Ok(_) => Err(refused(
            session,
            &tonic::Status::internal("the answer has no record"),
        )),
        Err(status) => Err(refused(session, &status)),
    }
}

/// A record's page.
pub(super) async fn record(
    door: &Door,
    session: &Session,
    query: &Query,
    call: OpenCall,
) -> Response<HttpBody> {
    match get(door, session, query, &call).await {
        Ok(record) => html(StatusCode::OK, pages::record(session, &record)),
        Err(response) => response,
    }
}

/// A record's stored result, as a download (never rendered: it is the
/// callers' data, whatever its content type says).
pub(super) async fn result(
    door: &Door,
    session: &Session,
    query: &Query,
    call: OpenCall,
) -> Response<HttpBody> {
    let record = match get(door, session, query, &call).await {
        Ok(record) => record,
        Err(response) => return response,
    };
    let bytes = record.result.map(|r| r.result).unwrap_or_default();
    let mut response = Response::new(body(bytes));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    headers.insert(
        header::CONTENT_DISPOSITION,
        HeaderValue::from_static("attachment; filename=\"result.bin\""),
    );
    guarded(response)
}

/// Follows a record: the Watch feed as Server-Sent Events, for the record
/// page's script, until a reload of the credentials revokes the session's.
pub(super) async fn watch(
    door: &Door,
    session: &Session,
    query: &Query,
    call: OpenCall,
) -> Response<HttpBody> {
    let request = watch_request(query.get("scope"), query.get("key"));
    let Some(output) = door.schema.message("idempotency.v1.WatchEvent") else {
        return refused(
            session,
            &tonic::Status::internal("no WatchEvent descriptor"),
        );
    };
    let opened = door
        .open_call(
            &format!("{SERVICE_PREFIX}Watch"),
            &prost::Message::encode_to_vec(&request),
            &session.headers,
            Asks::caller(&session.caller),
            Some(CALL_TIMEOUT.saturating_mul(7)),
            call,
        )
        .await;
    match opened {
        Ok((_, stream)) => {
            let events = crate::http::events::event_stream(door, stream, output);
            let mut revocation = door.auth.revocation(&session.headers, &session.caller);
            guarded(events.map(|body| {
                let revoked = Box::pin(async move { revocation.revoked().await });
                StreamBody::new(BodyStream::new(body).take_until(revoked)).boxed_unsync()
            }))
        }
        Err(status) => refused(session, &status),
    }
}

/// Runs a confirmed action.
pub(super) async fn act(
    door: &Door,
    session: &Session,
    request: Request<Incoming>,
    call: OpenCall,
) -> Response<HttpBody> {
    let Some(fields) = form(door, request).await else {
        return html(
            StatusCode::BAD_REQUEST,
            pages::message(
                session,
                "Refused",
                "Send the form from the console's pages.",
            ),
        );
    };
    if !session.csrf_matches(fields.get("csrf")) {
        return html(
            StatusCode::FORBIDDEN,
            pages::message(
                session,
                "Refused",
                "The form's CSRF token is missing or wrong: reload the page and try again.",
            ),
        );
    }
    let (scope, key) = (fields.get("scope"), fields.get("key"));
    let target = Some(proto::AdminTarget {
        scope: scope.to_owned(),
        key: key.to_owned(),
        reason: fields.get("reason").to_owned(),
        operator: session.operator.clone(),
    });
    let back = link("record", &[("scope", scope), ("key", key)]);
    let done: Result<(), tonic::Status> = match fields.get("action") {
        "release" => door
            .console_call(session, &proto::ReleaseLeaseRequest { target }, &call)
            .await
            .map(drop),
        "retry" => door
            .console_call(session, &proto::RetryNowRequest { target }, &call)
            .await
            .map(drop),
        "fail" => door
            .console_call(session, &proto::FailPermanentlyRequest { target }, &call)
            .await
            .map(drop),
        "delete" => {
            return match door
                .console_call(session, &proto::DeleteRecordRequest { target }, &call)
                .await
            {
                Ok(_) => see_other(&link("records", &[("scope", scope)])),
                Err(status) => refused(session, &status),
            };
        }
        _ => Err(tonic::Status::invalid_argument("action: unknown")),
    };
    match done {
        Ok(()) => see_other(&back),
        Err(status) => refused(session, &status),
    }
}

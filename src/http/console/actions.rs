//! What each console request does: log in and out, read the pages' data
//! through Coordinator calls, follow a record, and run the admin actions
//! (POST, with the session's CSRF token, after the confirmation page).

use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt as _, Limited};
use hyper::body::Incoming;

use super::session::{self, Session};
use super::{
    CALL_TIMEOUT, HttpBody, Query, body, guarded, html, link, pages, refused, see_other,
    watch_request,
};
use crate::http::connect::SERVICE_PREFIX;
use crate::http::{Asks, Door};
use crate::proto;
use crate::transport::OpenCall;

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

/// Checks the token and keeps it in the cookie.
pub(super) async fn login(door: &Door, request: Request<Incoming>) -> Response<HttpBody> {
    let auth_on = door.auth.is_on();
    let Some(fields) = form(door, request).await else {
        return html(
            StatusCode::BAD_REQUEST,
            pages::login(auth_on, Some("Send the login form from this page.")),
        );
    };
    let token = fields.get("token").trim();
    let operator: String = fields.get("operator").trim().chars().take(128).collect();
    let caller = session::bearer(token).map(|h| door.auth.caller_from_headers(&h));
    match caller {
        Some(Ok(caller)) if caller.admin => {
            tracing::info!(tenant = caller.tenant.as_str(), operator, "console login");
            let mut cookies = vec![session::operator_cookie(&operator)];
            if auth_on {
                cookies.push(session::token_cookie(token));
            }
            with_cookies(see_other("/console/"), &cookies)
        }
        Some(Ok(_)) => html(
            StatusCode::FORBIDDEN,
            pages::login(auth_on, Some("This credential is not an admin credential.")),
        ),
        _ => html(
            StatusCode::UNAUTHORIZED,
            pages::login(auth_on, Some("Unknown credential.")),
        ),
    }
}

/// Forgets the cookie.
pub(super) async fn logout(door: &Door, request: Request<Incoming>) -> Response<HttpBody> {
    drop(form(door, request).await);
    with_cookies(see_other("/console/login"), &session::cleared_cookies())
}

/// The home page: lookups and the counts per scope.
pub(super) async fn home(door: &Door, session: &Session, call: OpenCall) -> Response<HttpBody> {
    let answer: Result<proto::SummarizeResponse, _> = door
        .console_call(session, "Summarize", &proto::SummarizeRequest {}, &call)
        .await;
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
    let answer: Result<proto::ListRecordsResponse, _> = door
        .console_call(session, "ListRecords", &request, &call)
        .await;
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
    let answer: Result<proto::GetResponse, _> =
        door.console_call(session, "Get", &request, call).await;
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
/// page's script.
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
        Ok((_, stream)) => guarded(crate::http::events::event_stream(door, stream, output)),
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
            .console_call::<_, proto::ReleaseLeaseResponse>(
                session,
                "ReleaseLease",
                &proto::ReleaseLeaseRequest { target },
                &call,
            )
            .await
            .map(drop),
        "retry" => door
            .console_call::<_, proto::RetryNowResponse>(
                session,
                "RetryNow",
                &proto::RetryNowRequest { target },
                &call,
            )
            .await
            .map(drop),
        "fail" => door
            .console_call::<_, proto::FailPermanentlyResponse>(
                session,
                "FailPermanently",
                &proto::FailPermanentlyRequest { target },
                &call,
            )
            .await
            .map(drop),
        "delete" => {
            return match door
                .console_call::<_, proto::DeleteRecordResponse>(
                    session,
                    "DeleteRecord",
                    &proto::DeleteRecordRequest { target },
                    &call,
                )
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

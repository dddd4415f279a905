//! Why the door refused a request, before or after the Coordinator saw it:
//! the one error type of the door, its gRPC code and HTTP status, its
//! reason, the refusal's log line and metric, and the JSON answers.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::{BodyExt as _, Full};
use tonic::{Code, Status};

use super::json;
use crate::auth::AuthError;
use crate::metrics;
use crate::telemetry::cause_chain;
use crate::transport::{Full as BudgetFull, HttpBody, printable};

/// Why the door refused a request, before or after the Coordinator saw it.
#[derive(Debug, thiserror::Error)]
pub enum DoorError {
    #[error("the body is not valid JSON: {0}")]
    Syntax(String),
    /// A field with the wrong type, an unknown field, or a bad value.
    #[error("{field}: {message}")]
    Field { field: String, message: String },
    #[error("{0}")]
    Shape(String),
    #[error("the request body is larger than {0} bytes (twice --max-request-bytes)")]
    TooLarge(usize),
    #[error("the request body did not arrive within {0:?} (--request-body-timeout)")]
    TooSlow(Duration),
    #[error("the request body could not be read")]
    BodyUnreadable,
    #[error("{}", overloaded(*.0))]
    Overloaded(BudgetFull),
    /// The media types the route reads.
    #[error("send Content-Type: {0}")]
    MediaType(&'static str),
    /// Credentials missing or unknown (when they are required).
    #[error("{0}")]
    Unauthenticated(AuthError),
    /// A browser's request from another site (`Sec-Fetch-Site: cross-site`).
    #[error(
        "cross-site requests are refused: call this API from a server, not from another site's page"
    )]
    CrossSite,
    #[error("the body holds more than {0} JSON values")]
    TooManyValues(usize),
    /// An HTTP/1.1 request RFC 9112 says to refuse.
    #[error("malformed request: {0}")]
    Malformed(&'static str),
    #[error("transfer codings other than chunked are not implemented")]
    TransferCoding,
    #[error("no such route")]
    NoRoute,
    #[error("method not allowed on this route")]
    MethodNotAllowed,
    /// The Coordinator's answer.
    #[error("{}", .0.message())]
    Coordinator(Status),
}

impl From<Status> for DoorError {
    fn from(status: Status) -> Self {
        DoorError::Coordinator(status)
    }
}

impl From<json::JsonError> for DoorError {
    fn from(error: json::JsonError) -> Self {
        match error {
            json::JsonError::Syntax(m) => DoorError::Syntax(m),
            json::JsonError::Shape(m) => DoorError::Shape(m),
        }
    }
}

/// What a refusal for want of room in the budget says.
pub(super) fn overloaded(full: BudgetFull) -> &'static str {
    match full {
        BudgetFull::Server => {
            "the server is receiving too many requests at once; try again shortly"
        }
        BudgetFull::Tenant => {
            "this tenant's requests arriving now hold its whole share of the server; try again shortly"
        }
        BudgetFull::Connection => {
            "this connection's requests arriving now hold its whole share; send fewer at once"
        }
    }
}

impl DoorError {
    /// The reason label of the refusal metric for the door's own refusals;
    /// `None` for the Coordinator's answers, which admission and the
    /// service count.
    fn metric_reason(&self) -> Option<&'static str> {
        Some(match self {
            DoorError::Syntax(_)
            | DoorError::Field { .. }
            | DoorError::Shape(_)
            | DoorError::BodyUnreadable => "invalid",
            DoorError::TooLarge(_) => "too_large",
            DoorError::TooSlow(_) => "too_slow",
            DoorError::Overloaded(full) => full.reason(),
            DoorError::MediaType(_) => "media_type",
            DoorError::Unauthenticated(_) => "unauthenticated",
            DoorError::CrossSite => "cross_site",
            DoorError::TooManyValues(_) => "too_many_values",
            DoorError::Malformed(_) | DoorError::TransferCoding => "malformed",
            DoorError::NoRoute => "not_found",
            DoorError::MethodNotAllowed => "method",
            DoorError::Coordinator(_) => return None,
        })
    }

    /// The gRPC code that says the same, and the HTTP status it is
    /// answered with: the Connect protocol's mapping of codes to statuses,
    /// in this one place.
    pub fn code_and_status(&self) -> (Code, StatusCode) {
        let code = match self {
            DoorError::Syntax(_)
            | DoorError::Field { .. }
            | DoorError::Shape(_)
            | DoorError::TooManyValues(_)
            | DoorError::Malformed(_)
            | DoorError::BodyUnreadable => Code::InvalidArgument,
            DoorError::Unauthenticated(_) => Code::Unauthenticated,
            DoorError::CrossSite => Code::PermissionDenied,
            DoorError::TransferCoding => Code::Unimplemented,
            DoorError::MediaType(_) => {
                return (Code::InvalidArgument, StatusCode::UNSUPPORTED_MEDIA_TYPE);
            }
            DoorError::TooLarge(_) => {
                return (Code::ResourceExhausted, StatusCode::PAYLOAD_TOO_LARGE);
            }
            DoorError::TooSlow(_) => {
                return (Code::DeadlineExceeded, StatusCode::REQUEST_TIMEOUT);
            }
            DoorError::Overloaded(_) => Code::ResourceExhausted,
            DoorError::NoRoute => return (Code::NotFound, StatusCode::NOT_FOUND),
            DoorError::MethodNotAllowed => {
                return (Code::Unimplemented, StatusCode::METHOD_NOT_ALLOWED);
            }
            DoorError::Coordinator(status) => status.code(),
        };
        (code, http_status(code))
    }

    /// The stable reason: the ErrorInfo reason of a Coordinator answer, or
    /// the door's own.
    pub fn reason(&self) -> String {
        match self {
            DoorError::Syntax(_) => "INVALID_JSON".into(),
            DoorError::Field { .. } | DoorError::Shape(_) | DoorError::BodyUnreadable => {
                "INVALID_ARGUMENT".into()
            }
            DoorError::TooLarge(_) => "REQUEST_TOO_LARGE".into(),
            DoorError::TooSlow(_) => "REQUEST_TOO_SLOW".into(),
            DoorError::Overloaded(_) => "OVERLOADED".into(),
            DoorError::MediaType(_) => "UNSUPPORTED_MEDIA_TYPE".into(),
            DoorError::Unauthenticated(_) => "UNAUTHENTICATED".into(),
            DoorError::CrossSite => "CROSS_SITE_REQUEST".into(),
            DoorError::TooManyValues(_) => "TOO_MANY_JSON_VALUES".into(),
            DoorError::Malformed(_) => "MALFORMED_REQUEST".into(),
            DoorError::TransferCoding => "UNSUPPORTED_TRANSFER_CODING".into(),
            DoorError::NoRoute => "NOT_FOUND".into(),
            DoorError::MethodNotAllowed => "METHOD_NOT_ALLOWED".into(),
            DoorError::Coordinator(status) => error_info(status)
                .map(|info| info.reason)
                .unwrap_or_else(|| format!("{:?}", status.code()).to_uppercase()),
        }
    }
}

/// Counts a refusal of the door's own, and says why a request was refused
/// in the log (debug: callers' mistakes are theirs; the Coordinator logged
/// its own failures with their causes), every client-controlled character
/// escaped (a field name may hold a newline).
pub(super) fn log_refusal(door: &super::Door, error: &DoorError) {
    if let Some(reason) = error.metric_reason() {
        crate::transport::refused(door.admission.metrics(), metrics::Port::Http, reason);
    }
    let (message, reason) = refusal_log_fields(error);
    tracing::debug!(error = %message, %reason, "HTTP request refused");
}

/// The error and reason of the refusal's log line, escaped.
fn refusal_log_fields(error: &DoorError) -> (String, String) {
    (
        printable(&cause_chain(error)).into_owned(),
        printable(&error.reason()).into_owned(),
    )
}

/// The Connect protocol's HTTP status for each code.
pub fn http_status(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::Cancelled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
        Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
            StatusCode::BAD_REQUEST
        }
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
    }
}

/// The `google.rpc.ErrorInfo` of a status, if it carries one.
pub(super) fn error_info(status: &Status) -> Option<tonic_types::ErrorInfo> {
    use tonic_types::StatusExt as _;
    status.get_details_error_info()
}

/// The `google.rpc.BadRequest` field violations of a status.
pub(super) fn violations(status: &Status) -> Vec<(String, String)> {
    use tonic_types::StatusExt as _;
    status
        .get_details_bad_request()
        .map(|bad| {
            bad.field_violations
                .into_iter()
                .map(|v| (v.field, v.description))
                .collect()
        })
        .unwrap_or_default()
}

/// A JSON answer, ending in a newline (so that a shell prompt after `curl`
/// starts on a line of its own).
pub(super) fn json_response(status: StatusCode, body: &serde_json::Value) -> Response<HttpBody> {
    let mut bytes = serde_json::to_vec(body).unwrap_or_else(|_| b"{}".to_vec());
    bytes.push(b'\n');
    let mut response = Response::new(Full::new(Bytes::from(bytes)).boxed_unsync());
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusals_log_fields_escape_what_the_client_wrote() {
        let error = DoorError::Field {
            field: "a\nINJECTED fake\u{1b}[2J".to_owned(),
            message: "is not a field of this request".to_owned(),
        };
        let (message, reason) = refusal_log_fields(&error);
        assert!(!message.chars().any(char::is_control), "{message:?}");
        assert_eq!(
            message,
            "a\\nINJECTED fake\\u{1b}[2J: is not a field of this request"
        );
        assert_eq!(reason, "INVALID_ARGUMENT");
    }
}

//! The console's answers: a page, plain text, an embedded asset or a
//! redirect, each with the headers every console answer carries.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::{BodyExt as _, Full};
use maud::Markup;

use crate::transport::HttpBody;

/// No inline script or style, nothing from elsewhere, no framing.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
     connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// The headers every console answer carries.
pub(super) fn guarded(mut response: Response<HttpBody>) -> Response<HttpBody> {
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

pub(super) fn body(bytes: impl Into<Bytes>) -> HttpBody {
    Full::new(bytes.into()).boxed_unsync()
}

/// A page.
pub(super) fn html(status: StatusCode, markup: Markup) -> Response<HttpBody> {
    let mut response = Response::new(body(markup.into_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    guarded(response)
}

pub(super) fn plain(status: StatusCode, text: &'static str) -> Response<HttpBody> {
    let mut response = Response::new(body(text));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    guarded(response)
}

pub(super) fn asset(text: &'static str, content_type: &'static str) -> Response<HttpBody> {
    let mut response = Response::new(body(text));
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    guarded(response)
}

/// A redirect after a form (303: the browser GETs `location`).
pub(super) fn see_other(location: &str) -> Response<HttpBody> {
    let mut response = Response::new(body(Bytes::new()));
    *response.status_mut() = StatusCode::SEE_OTHER;
    if let Ok(value) = HeaderValue::from_str(location) {
        response.headers_mut().insert(header::LOCATION, value);
    }
    guarded(response)
}

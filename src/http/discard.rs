//! A refused request's body, read and dropped before the answer: an
//! HTTP/1.1 client still sending its body would otherwise meet a closed
//! connection (EPIPE, "socket hang up") instead of the refusal.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt as _;
use hyper::body::Incoming;

/// The most of a refused request's body read (and dropped) before the
/// answer, and for how long: a request refused from its headers is
/// answered at once after that, whatever it still sends.
const DISCARDED_BYTES: usize = 64 * 1024;
const DISCARD_TIME: Duration = Duration::from_secs(1);

/// Reads and drops up to [`DISCARDED_BYTES`] of `body` within
/// [`DISCARD_TIME`]; nothing is kept nor charged to the budget.
pub(super) async fn discard(mut body: Incoming) {
    let read = async {
        let mut seen = 0;
        while let Some(Ok(frame)) = body.frame().await {
            seen += frame.data_ref().map_or(0, Bytes::len);
            if seen > DISCARDED_BYTES {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(DISCARD_TIME, read).await;
}

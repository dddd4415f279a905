//! Bodies: the one boxed type every response and upstream request has, and
//! reading a body whole up to a limit. What the sidecar holds in memory is
//! bounded here.

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt as _, Full};

/// Any error a body can end with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of every response the sidecar sends and every request it
/// forwards: streamed or whole.
pub type ProxyBody = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

/// A whole body.
pub fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// A streamed body.
pub fn stream<B>(body: B) -> ProxyBody
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed_unsync()
}

/// What reading a body up to a limit found.
pub enum Read<B> {
    /// The whole body, within the limit.
    Whole(Bytes),
    /// Over the limit: what was read, and the rest still to stream.
    Over(Bytes, B),
}

/// Reads `body` until it ends or passes `limit` bytes.
pub async fn read_limited<B>(mut body: B, limit: usize) -> Result<Read<B>, BoxError>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    if body.size_hint().lower() > limit as u64 {
        return Ok(Read::Over(Bytes::new(), body));
    }
    let mut buffer = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(Into::<BoxError>::into)?;
        if let Ok(data) = frame.into_data() {
            buffer.extend_from_slice(&data);
            if buffer.len() > limit {
                return Ok(Read::Over(buffer.freeze(), body));
            }
        }
    }
    Ok(Read::Whole(buffer.freeze()))
}

/// `prefix` then the rest of `body`, streamed.
pub fn chain<B>(prefix: Bytes, body: B) -> ProxyBody
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    use futures_util::StreamExt as _;
    let first = futures_util::stream::once(async move { Ok(http_body::Frame::data(prefix)) });
    let rest = http_body_util::BodyStream::new(body.map_err(Into::into));
    http_body_util::StreamBody::new(first.chain(rest)).boxed_unsync()
}

/// Why a body read against the budget was given up.
#[derive(Debug)]
pub enum Refused {
    /// It is over the limit.
    TooLarge,
    /// The budget, or the client's share, has no room for it.
    Busy,
    /// No chunk arrived for this long.
    Idle(std::time::Duration),
    /// It did not arrive whole within this.
    Late(std::time::Duration),
    /// It broke off.
    Broke(BoxError),
}

/// Reads `body` whole, up to `limit` bytes, charging for what is buffered
/// as it arrives (never for a declared length): `charge(bytes)` holds room
/// for `bytes` in all, `false` when there is none. At most `idle` between
/// two chunks.
pub async fn read_charged<B>(
    mut body: B,
    limit: usize,
    mut charge: impl FnMut(usize) -> bool,
    idle: std::time::Duration,
) -> Result<Bytes, Refused>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    if body.size_hint().lower() > limit as u64 {
        return Err(Refused::TooLarge);
    }
    let mut buffer = BytesMut::new();
    loop {
        let frame = match tokio::time::timeout(idle, body.frame()).await {
            Err(_) => return Err(Refused::Idle(idle)),
            Ok(None) => return Ok(buffer.freeze()),
            Ok(Some(Err(error))) => return Err(Refused::Broke(error.into())),
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if buffer.len() + data.len() > limit {
            return Err(Refused::TooLarge);
        }
        if !charge(buffer.len() + data.len()) {
            return Err(Refused::Busy);
        }
        buffer.extend_from_slice(&data);
        // What the buffer took, not only what it holds.
        if !charge(buffer.capacity()) {
            return Err(Refused::Busy);
        }
    }
}

//! The response as the coordinator stores it (the record's result) and as
//! replays send it back: status, the headers the route allows, and the
//! body, in a small length-prefixed binary form so that a replay is
//! byte-identical to the answer stored.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use idempotency_client::{Codec, CodecError};

/// The media type of a stored response.
pub const CONTENT_TYPE: &str = "application/vnd.idempotency-sidecar.response.v1";

const VERSION: u8 = 1;

/// A response kept for replays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    /// The upstream's status.
    pub status: StatusCode,
    /// The headers the route stores, in the upstream's order.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The whole body.
    pub body: Bytes,
}

impl StoredResponse {
    /// The encoded size, without encoding.
    pub fn encoded_len(status_headers: &[(HeaderName, HeaderValue)], body: usize) -> usize {
        let headers: usize = status_headers
            .iter()
            .map(|(n, v)| 8 + n.as_str().len() + v.len())
            .sum();
        1 + 2 + 4 + headers + 4 + body
    }

    /// The headers as a map.
    pub fn header_map(&self) -> HeaderMap {
        let mut map = HeaderMap::with_capacity(self.headers.len());
        for (name, value) in &self.headers {
            map.append(name.clone(), value.clone());
        }
        map
    }
}

/// Why a stored result could not be read.
#[derive(Debug, thiserror::Error)]
#[error("a stored response is malformed: {0}")]
struct Malformed(&'static str);

/// [`StoredResponse`] in and out of the record's result.
#[derive(Debug, Clone, Copy, Default)]
pub struct ResponseCodec;

impl Codec<StoredResponse> for ResponseCodec {
    fn content_type(&self) -> &str {
        CONTENT_TYPE
    }

    fn encode(&self, value: &StoredResponse) -> Result<Vec<u8>, CodecError> {
        let mut out = Vec::with_capacity(StoredResponse::encoded_len(
            &value.headers,
            value.body.len(),
        ));
        out.push(VERSION);
        out.extend(value.status.as_u16().to_be_bytes());
        out.extend(len32(value.headers.len())?);
        for (name, header) in &value.headers {
            out.extend(len32(name.as_str().len())?);
            out.extend(name.as_str().as_bytes());
            out.extend(len32(header.len())?);
            out.extend(header.as_bytes());
        }
        out.extend(len32(value.body.len())?);
        out.extend(&value.body);
        Ok(out)
    }

    fn decode(&self, bytes: &[u8], content_type: &str) -> Result<StoredResponse, CodecError> {
        if content_type != CONTENT_TYPE {
            return Err(malformed("the record holds another kind of result"));
        }
        let mut reader = Reader(bytes);
        if reader.take(1)? != [VERSION] {
            return Err(malformed("unknown version"));
        }
        let status = reader.take(2)?;
        let status = StatusCode::from_u16(u16::from_be_bytes([status[0], status[1]]))
            .map_err(|_| malformed("bad status"))?;
        let count = reader.len()?;
        let mut headers = Vec::with_capacity(count.min(256));
        for _ in 0..count {
            let n = reader.len()?;
            let name = HeaderName::from_bytes(reader.take(n)?)
                .map_err(|_| malformed("bad header name"))?;
            let n = reader.len()?;
            let value =
                HeaderValue::from_bytes(reader.take(n)?).map_err(|_| malformed("bad header"))?;
            headers.push((name, value));
        }
        let n = reader.len()?;
        let body = Bytes::copy_from_slice(reader.take(n)?);
        if !reader.0.is_empty() {
            return Err(malformed("trailing bytes"));
        }
        Ok(StoredResponse {
            status,
            headers,
            body,
        })
    }
}

fn malformed(what: &'static str) -> CodecError {
    CodecError(Box::new(Malformed(what)))
}

fn len32(n: usize) -> Result<[u8; 4], CodecError> {
    u32::try_from(n)
        .map(u32::to_be_bytes)
        .map_err(|_| malformed("too long"))
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], CodecError> {
        if self.0.len() < n {
            return Err(malformed("truncated"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn len(&mut self) -> Result<usize, CodecError> {
        let b = self.take(4)?;
        usize::try_from(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
            .map_err(|_| malformed("too long"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_round_trips_byte_for_byte() {
        let response = StoredResponse {
            status: StatusCode::CREATED,
            headers: vec![
                (
                    http::header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                ),
                (http::header::LOCATION, HeaderValue::from_static("/p/1")),
            ],
            body: Bytes::from_static(b"{\"id\":1}\0\xff"),
        };
        let bytes = ResponseCodec.encode(&response).unwrap();
        assert_eq!(
            bytes.len(),
            StoredResponse::encoded_len(&response.headers, response.body.len())
        );
        assert_eq!(
            ResponseCodec.decode(&bytes, CONTENT_TYPE).unwrap(),
            response
        );
        assert!(
            ResponseCodec
                .decode(&bytes[..bytes.len() - 1], CONTENT_TYPE)
                .is_err()
        );
        assert!(ResponseCodec.decode(&bytes, "application/json").is_err());
    }
}

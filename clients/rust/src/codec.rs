//! How a work's value is stored as the record's result and read back on a
//! replay: JSON by default, or raw bytes.

use std::marker::PhantomData;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// A value that could not be encoded, or a stored result that could not be
/// decoded.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct CodecError(#[source] pub Box<dyn std::error::Error + Send + Sync>);

/// Turns the work's value into the bytes Complete stores, with their media
/// type, and stored bytes back into a value for a replay.
pub trait Codec<T>: Send + Sync {
    /// The media type stored with the result, e.g. `application/json`.
    fn content_type(&self) -> &str;
    /// The bytes to store.
    fn encode(&self, value: &T) -> Result<Vec<u8>, CodecError>;
    /// A stored result, with the media type it was stored with.
    fn decode(&self, bytes: &[u8], content_type: &str) -> Result<T, CodecError>;
}

/// JSON through serde: the default codec.
#[derive(Debug, Clone, Copy, Default)]
pub struct Json;

impl<T: Serialize + DeserializeOwned> Codec<T> for Json {
    fn content_type(&self) -> &str {
        "application/json"
    }

    fn encode(&self, value: &T) -> Result<Vec<u8>, CodecError> {
        serde_json::to_vec(value).map_err(|e| CodecError(e.into()))
    }

    fn decode(&self, bytes: &[u8], _content_type: &str) -> Result<T, CodecError> {
        serde_json::from_slice(bytes).map_err(|e| CodecError(e.into()))
    }
}

/// The value is the result's bytes, stored as they are
/// (`application/octet-stream` unless another media type is given).
#[derive(Debug, Clone)]
pub struct Raw<T = Vec<u8>> {
    content_type: String,
    _value: PhantomData<fn() -> T>,
}

impl<T> Raw<T> {
    /// Bytes stored with this media type.
    pub fn with_content_type(content_type: impl Into<String>) -> Self {
        Raw {
            content_type: content_type.into(),
            _value: PhantomData,
        }
    }
}

impl<T> Default for Raw<T> {
    fn default() -> Self {
        Raw::with_content_type("application/octet-stream")
    }
}

impl<T> Codec<T> for Raw<T>
where
    T: AsRef<[u8]> + From<Vec<u8>>,
{
    fn content_type(&self) -> &str {
        &self.content_type
    }

    fn encode(&self, value: &T) -> Result<Vec<u8>, CodecError> {
        Ok(value.as_ref().to_vec())
    }

    fn decode(&self, bytes: &[u8], _content_type: &str) -> Result<T, CodecError> {
        Ok(T::from(bytes.to_vec()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_round_trips() {
        let bytes = Codec::<Vec<u32>>::encode(&Json, &vec![1, 2, 3]).unwrap();
        assert_eq!(bytes, b"[1,2,3]");
        let back: Vec<u32> = Json.decode(&bytes, "application/json").unwrap();
        assert_eq!(back, vec![1, 2, 3]);
        assert!(Codec::<Vec<u32>>::decode(&Json, b"{", "application/json").is_err());
    }

    #[test]
    fn raw_keeps_bytes() {
        let codec = Raw::<Vec<u8>>::default();
        assert_eq!(codec.content_type(), "application/octet-stream");
        assert_eq!(codec.encode(&b"abc".to_vec()).unwrap(), b"abc");
        let text = Raw::<bytes::Bytes>::with_content_type("text/plain");
        assert_eq!(text.decode(b"hi", "text/plain").unwrap(), "hi");
    }
}

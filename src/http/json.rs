//! Proto3 canonical JSON for the contract's messages, by reflection over
//! the embedded descriptors (the generated prost types stay as they are):
//! the same names and forms grpcurl shows (lowerCamelCase, enum names,
//! 64-bit integers as strings, `"1.5s"` durations, RFC 3339 timestamps,
//! base64 bytes; fields at their default left out).

use bytes::Bytes;
use prost::Message as _;
use prost_reflect::{
    DescriptorError, DescriptorPool, DeserializeOptions, DynamicMessage, MessageDescriptor,
    SerializeOptions,
};
use serde::Deserializer;
use serde::de::value::{MapDeserializer, SeqDeserializer};
use serde::de::{IntoDeserializer, Visitor};
use serde_json::Value;

/// The descriptors of the contract, its well-known types and the
/// `google.rpc` error details.
#[derive(Clone)]
pub struct Schema {
    pool: DescriptorPool,
}

/// Why a JSON document is not the message it should be.
#[derive(Debug, thiserror::Error)]
pub enum JsonError {
    #[error("the body is not valid JSON: {0}")]
    Syntax(String),
    #[error("{0}")]
    Shape(String),
}

impl Schema {
    pub fn load() -> Result<Self, DescriptorError> {
        let mut pool = DescriptorPool::decode(crate::proto::FILE_DESCRIPTOR_SET)?;
        pool.decode_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)?;
        Ok(Schema { pool })
    }

    /// The message type named `name` (`idempotency.v1.AcquireRequest`).
    pub fn message(&self, name: &str) -> Option<MessageDescriptor> {
        self.pool.get_message_by_name(name)
    }

    /// JSON text into the protobuf encoding of `desc`; unknown fields are
    /// refused, as proto3 JSON parsers do by default.
    pub fn json_to_proto(
        &self,
        desc: MessageDescriptor,
        text: &[u8],
    ) -> Result<Vec<u8>, JsonError> {
        let value: Value =
            serde_json::from_slice(text).map_err(|e| JsonError::Syntax(e.to_string()))?;
        let options = DeserializeOptions::new().deny_unknown_fields(true);
        let message = DynamicMessage::deserialize_with_options(desc, Plain(value), &options)
            .map_err(|e| JsonError::Shape(e.to_string()))?;
        Ok(message.encode_to_vec())
    }

    /// The protobuf encoding of `desc` into JSON.
    pub fn proto_to_json(&self, desc: MessageDescriptor, bytes: Bytes) -> Result<Value, String> {
        let message = DynamicMessage::decode(desc, bytes).map_err(|e| e.to_string())?;
        to_json(&message)
    }

    /// The `google.protobuf.Any` type URL's message as JSON, when known.
    pub fn any_to_json(&self, type_url: &str, value: &[u8]) -> Option<Value> {
        let name = type_url.rsplit('/').next()?;
        let desc = self.message(name)?;
        let message = DynamicMessage::decode(desc, value).ok()?;
        to_json(&message).ok()
    }
}

fn to_json(message: &DynamicMessage) -> Result<Value, String> {
    let options = SerializeOptions::new()
        .stringify_64_bit_integers(true)
        .skip_default_fields(true);
    message
        .serialize_with_options(serde_json::value::Serializer, &options)
        .map_err(|e| e.to_string())
}

/// A parsed JSON value handed to a deserializer with numbers as numbers:
/// this crate's `serde_json` keeps numbers exactly (`arbitrary_precision`),
/// which hands them to `deserialize_any` as a map that reflection does not
/// expect.
struct Plain(Value);

impl<'de> IntoDeserializer<'de, serde::de::value::Error> for Plain {
    type Deserializer = Plain;
    fn into_deserializer(self) -> Plain {
        self
    }
}

impl<'de> Deserializer<'de> for Plain {
    type Error = serde::de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.0 {
            Value::Null => visitor.visit_unit(),
            Value::Bool(b) => visitor.visit_bool(b),
            Value::Number(n) => {
                if let Some(u) = n.as_u64() {
                    visitor.visit_u64(u)
                } else if let Some(i) = n.as_i64() {
                    visitor.visit_i64(i)
                } else if let Some(f) = n.as_f64() {
                    visitor.visit_f64(f)
                } else {
                    Err(serde::de::Error::custom(format!("{n} is not a number")))
                }
            }
            Value::String(s) => visitor.visit_string(s),
            Value::Array(items) => {
                let mut seq = SeqDeserializer::new(items.into_iter().map(Plain));
                let value = visitor.visit_seq(&mut seq)?;
                seq.end()?;
                Ok(value)
            }
            Value::Object(fields) => {
                let mut map = MapDeserializer::new(fields.into_iter().map(|(k, v)| (k, Plain(v))));
                let value = visitor.visit_map(&mut map)?;
                map.end()?;
                Ok(value)
            }
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.0 {
            Value::Null => visitor.visit_none(),
            other => visitor.visit_some(Plain(other)),
        }
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct newtype_struct seq tuple
        tuple_struct map struct enum identifier ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{AcquireRequest, acquire_request::RequestFingerprint};

    #[test]
    fn the_schema_loads_with_the_error_details() {
        let schema = Schema::load().unwrap();
        assert!(schema.message("idempotency.v1.AcquireRequest").is_some());
        assert!(schema.message("google.rpc.ErrorInfo").is_some());
    }

    #[test]
    fn canonical_json_reads_as_grpcurl_writes_it() {
        let schema = Schema::load().unwrap();
        let desc = schema.message("idempotency.v1.AcquireRequest").unwrap();
        let text =
            br#"{"scope":"s","key":"k","fingerprint":"f","leaseTtl":"1.5s","max_attempts":3}"#;
        let bytes = schema.json_to_proto(desc.clone(), text).unwrap();
        let request = AcquireRequest::decode(bytes.as_slice()).unwrap();
        assert_eq!(request.scope, "s");
        assert_eq!(request.max_attempts, 3);
        assert_eq!(request.lease_ttl.unwrap().nanos, 500_000_000);
        assert_eq!(
            request.request_fingerprint,
            Some(RequestFingerprint::Fingerprint("f".into()))
        );
        let back = schema.proto_to_json(desc, Bytes::from(bytes)).unwrap();
        assert_eq!(back["leaseTtl"], "1.500s");
        assert_eq!(back["maxAttempts"], 3);
    }

    #[test]
    fn unknown_fields_and_wrong_types_are_refused() {
        let schema = Schema::load().unwrap();
        let desc = schema.message("idempotency.v1.AcquireRequest").unwrap();
        assert!(
            schema
                .json_to_proto(desc.clone(), br#"{"nope":1}"#)
                .is_err()
        );
        assert!(
            schema
                .json_to_proto(desc.clone(), br#"{"scope":1}"#)
                .is_err()
        );
        assert!(matches!(
            schema.json_to_proto(desc, b"{"),
            Err(JsonError::Syntax(_))
        ));
    }
}

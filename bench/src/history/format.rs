//! How a history is written: JSON lines, one [`Entry`] a line, result bytes
//! in hex and decisions by their names in the contract.

use super::model::Entry;

/// Bytes as lowercase hex in JSON.
pub(super) mod hex_bytes {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match bytes {
            Some(b) => s.serialize_str(&hex::encode(b)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|text| hex::decode(text).map_err(serde::de::Error::custom))
            .transpose()
    }
}

/// A decision by its name ([`Decision::name`]: `PROCEED`, `ALREADY_DONE`,
/// …), as the contract spells it.
pub(super) mod decision_name {
    use idempotency_coordinator::store::names;
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::history::model::Decision;

    pub fn serialize<S: Serializer>(decision: &Option<Decision>, s: S) -> Result<S::Ok, S::Error> {
        match decision {
            Some(d) => s.serialize_str(d.name()),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Decision>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|name| {
                names::decision(&name)
                    .ok_or_else(|| serde::de::Error::custom(format!("unknown decision {name:?}")))
            })
            .transpose()
    }
}

/// A line that is not an [`Entry`].
#[derive(Debug, thiserror::Error)]
#[error("history line {line}: {source}")]
pub struct ParseError {
    /// The line that did not parse, from 1.
    pub line: usize,
    /// Why it did not parse.
    #[source]
    pub source: serde_json::Error,
}

/// Reads a history from JSON lines (blank lines are skipped).
pub fn parse(text: &str) -> Result<Vec<Entry>, ParseError> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(n, l)| {
            serde_json::from_str(l).map_err(|source| ParseError {
                line: n + 1,
                source,
            })
        })
        .collect()
}

/// One entry as a JSON line (without the newline).
pub fn to_line(entry: &Entry) -> String {
    serde_json::to_string(entry).expect("history entries always serialize")
}

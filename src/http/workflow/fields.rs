//! The workflow API's request bodies, read as n8n renders its expressions:
//! a number may arrive as a string of digits, an empty string (or null)
//! stands for an absent field, a flag may be `true` or `"true"`, and fields
//! a route does not read are ignored.

use serde_json::{Map, Value};

use crate::http::DoorError;

/// A request body's fields, read leniently.
pub(super) struct Fields(Map<String, Value>);

impl Fields {
    /// Reads `body`'s object. Fields other than `known` are ignored, as
    /// the service these routes replace ignored them (a workflow may send
    /// more than it must), and named in the debug log.
    pub(super) fn parse(body: &[u8], known: &[&str]) -> Result<Self, DoorError> {
        let value: Value =
            serde_json::from_slice(body).map_err(|e| DoorError::Syntax(e.to_string()))?;
        let Value::Object(mut map) = value else {
            return Err(DoorError::Shape("the body must be a JSON object".into()));
        };
        let unknown: Vec<String> = map
            .keys()
            .filter(|k| !known.contains(&k.as_str()))
            .cloned()
            .collect();
        if !unknown.is_empty() {
            let names: Vec<_> = unknown
                .iter()
                .map(|name| crate::transport::printable(name))
                .collect();
            tracing::debug!(ignored = %names.join(", "), "fields this route does not read");
            for name in &unknown {
                map.remove(name);
            }
        }
        Ok(Fields(map))
    }

    /// The value, unless absent, null or "".
    fn present(&self, name: &str) -> Option<&Value> {
        match self.0.get(name) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s.is_empty() => None,
            Some(v) => Some(v),
        }
    }

    /// A string, or a number as its text: a workflow tool renders an ID
    /// from a numeric field (`{"idempotency_key": 424242}`) as a number.
    pub(super) fn string(&self, name: &str) -> Result<Option<String>, DoorError> {
        match self.present(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(Value::Number(n)) => Ok(Some(n.to_string())),
            Some(_) => Err(field(name, "must be a string (or a number)")),
        }
    }

    pub(super) fn required(&self, name: &str) -> Result<String, DoorError> {
        self.string(name)?.ok_or_else(|| field(name, "is required"))
    }

    /// A whole number, or a string of one.
    pub(super) fn number(&self, name: &str) -> Result<Option<u64>, DoorError> {
        let refuse = || {
            field(
                name,
                "must be a whole number of at least 0, or a string of one",
            )
        };
        match self.present(name) {
            None => Ok(None),
            Some(Value::Number(n)) => n.as_u64().map(Some).ok_or_else(refuse),
            Some(Value::String(s)) => s.trim().parse::<u64>().map(Some).map_err(|_| refuse()),
            Some(_) => Err(refuse()),
        }
    }

    pub(super) fn flag(&self, name: &str) -> Result<bool, DoorError> {
        match self.present(name) {
            None => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(Value::String(s)) if s == "true" => Ok(true),
            Some(Value::String(s)) if s == "false" => Ok(false),
            Some(_) => Err(field(name, "must be true or false")),
        }
    }
}

pub(super) fn field(name: &str, message: &str) -> DoorError {
    DoorError::Field {
        field: name.to_owned(),
        message: message.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_accept_what_n8n_renders_and_ignore_the_rest() {
        let f = Fields::parse(
            br#"{"a":"3","b":4,"c":"","d":null,"e":"x","g":true,"h":"true"}"#,
            &["a", "b", "c", "d", "e", "g", "h"],
        )
        .unwrap();
        assert_eq!(f.number("a").unwrap(), Some(3));
        assert_eq!(f.number("b").unwrap(), Some(4));
        assert_eq!(f.number("c").unwrap(), None);
        assert_eq!(f.number("d").unwrap(), None);
        assert!(f.number("e").is_err());
        assert!(f.number("g").is_err());
        // A number where text is read: its text (n8n renders numeric IDs so).
        assert_eq!(f.string("b").unwrap().as_deref(), Some("4"));
        assert!(f.string("g").is_err());
        assert!(f.flag("g").unwrap() && f.flag("h").unwrap());
        // Fields the route does not read are ignored.
        let extra = Fields::parse(br#"{"zz":1,"a":"x"}"#, &["a"]).unwrap();
        assert_eq!(extra.string("a").unwrap().as_deref(), Some("x"));
        assert_eq!(extra.string("zz").unwrap(), None);
        assert!(Fields::parse(b"[1]", &["a"]).is_err());
        assert!(
            Fields::parse(br#"{"a":-1}"#, &["a"])
                .unwrap()
                .number("a")
                .is_err()
        );
        assert!(
            Fields::parse(br#"{"a":1.5}"#, &["a"])
                .unwrap()
                .number("a")
                .is_err()
        );
    }
}

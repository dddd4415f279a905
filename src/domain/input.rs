//! Request fields, validated once at the edge into types; code past the edge
//! never checks them again.

use std::fmt;

use sha2::{Digest, Sha256};

/// Why a field was refused, in words meant for the caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidInput(pub String);

fn refuse<T>(why: impl Into<String>) -> Result<T, InvalidInput> {
    Err(InvalidInput(why.into()))
}

fn is_visible_ascii(c: char) -> bool {
    ('\x21'..='\x7e').contains(&c)
}

/// The owner of a record: the authenticated caller. Never read from a
/// request field, so no request can name another tenant's records.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Tenant(String);

impl Tenant {
    /// The one tenant every caller belongs to while authentication is off.
    pub fn default_tenant() -> Self {
        Tenant("default".to_owned())
    }

    pub fn new(name: impl Into<String>) -> Self {
        Tenant(name.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The operation: 1 to 128 characters of `[A-Za-z0-9._:/-]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Scope(String);

impl Scope {
    pub const MAX_CHARS: usize = 128;

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for Scope {
    type Error = InvalidInput;

    fn try_from(value: String) -> Result<Self, InvalidInput> {
        if value.is_empty() {
            return refuse("must not be empty");
        }
        // The characters first: past this check a character is a byte.
        if let Some(bad) = value
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || "._:/-".contains(*c)))
        {
            return refuse(format!(
                "may only contain A-Z, a-z, 0-9 and . _ : / -, found {bad:?}"
            ));
        }
        if value.len() > Self::MAX_CHARS {
            return refuse(format!(
                "must be at most {} characters, got {}",
                Self::MAX_CHARS,
                value.len()
            ));
        }
        Ok(Scope(value))
    }
}

/// The idempotency key: 1 to 255 visible ASCII characters (0x21 to 0x7E).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Key(String);

impl Key {
    pub const MAX_CHARS: usize = 255;

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for Key {
    type Error = InvalidInput;

    fn try_from(value: String) -> Result<Self, InvalidInput> {
        if value.is_empty() {
            return refuse("must not be empty");
        }
        visible_ascii(&value, Self::MAX_CHARS)?;
        Ok(Key(value))
    }
}

/// Checks that `value` is at most `max` visible ASCII characters.
fn visible_ascii(value: &str, max: usize) -> Result<(), InvalidInput> {
    if let Some(bad) = value.chars().find(|c| !is_visible_ascii(*c)) {
        return refuse(format!(
            "may only contain visible ASCII characters (0x21 to 0x7E), found {bad:?}"
        ));
    }
    if value.len() > max {
        return refuse(format!(
            "must be at most {max} characters, got {}",
            value.len()
        ));
    }
    Ok(())
}

/// What the request is about. Empty means "none given".
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Fingerprint(String);

impl Fingerprint {
    pub const MAX_CHARS: usize = 128;
    /// The most values (objects, arrays and scalars) a `json_payload` may
    /// hold: canonicalising costs time and memory by the value.
    pub const MAX_JSON_VALUES: usize = 100_000;

    /// A fingerprint the client computed: at most 128 visible ASCII
    /// characters.
    pub fn from_client(value: String) -> Result<Self, InvalidInput> {
        visible_ascii(&value, Self::MAX_CHARS)?;
        Ok(Fingerprint(value))
    }

    /// The SHA-256 of the raw request, as lowercase hex.
    pub fn of_payload(payload: &[u8]) -> Self {
        Fingerprint(hex::encode(Sha256::digest(payload)))
    }

    /// The SHA-256 of the request's canonical JSON
    /// ([`idempotency_client::canonical_json`]): object keys sorted, no
    /// insignificant white space, arrays in order, numbers kept as written,
    /// so two different large numbers never canonicalise to the same text.
    pub fn of_json(text: &str) -> Result<Self, InvalidInput> {
        if json_values_at_least(text, Self::MAX_JSON_VALUES + 1) {
            return refuse(format!(
                "holds more than {} JSON values; send a fingerprint or the raw payload instead",
                Self::MAX_JSON_VALUES
            ));
        }
        // The sidecar's canonical form too: one canonicaliser.
        let canonical = idempotency_client::canonical_json(text.as_bytes())
            .map_err(|e| InvalidInput(format!("is not valid JSON: {e}")))?;
        Ok(Self::of_payload(&canonical))
    }

    /// Rebuilds a fingerprint read back from storage.
    pub fn stored(value: String) -> Self {
        Fingerprint(value)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Whether `text` holds at least `n` JSON values ([`JsonValues`]).
pub fn json_values_at_least(text: impl AsRef<[u8]>, n: usize) -> bool {
    let mut values = JsonValues::default();
    values.feed(text.as_ref(), n)
}

/// Counts the JSON values of a document as its bytes arrive, in pieces of
/// any size, without parsing it: one more than its `[`, `{` and `,` outside
/// strings, since every value but the first follows one of them (an empty
/// array or object counts one value too many). Reads each byte once and
/// allocates nothing, so that a document can be refused for its size
/// before it is parsed, or before it has all arrived.
#[derive(Debug, Clone, Copy)]
pub struct JsonValues {
    count: usize,
    in_string: bool,
    escaped: bool,
}

impl Default for JsonValues {
    fn default() -> Self {
        JsonValues {
            count: 1,
            in_string: false,
            escaped: false,
        }
    }
}

impl JsonValues {
    /// Reads the next bytes; whether the document so far holds at least
    /// `n` values.
    pub fn feed(&mut self, bytes: &[u8], n: usize) -> bool {
        for &b in bytes {
            if self.in_string {
                match (self.escaped, b) {
                    (true, _) => self.escaped = false,
                    (false, b'\\') => self.escaped = true,
                    (false, b'"') => self.in_string = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => self.in_string = true,
                b'[' | b'{' | b',' => {
                    self.count += 1;
                    if self.count >= n {
                        return true;
                    }
                }
                _ => {}
            }
        }
        self.count >= n
    }
}

/// The caller's id for one logical attempt; empty means none.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RequestId(String);

impl RequestId {
    pub const MAX_CHARS: usize = 128;

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for RequestId {
    type Error = InvalidInput;

    fn try_from(value: String) -> Result<Self, InvalidInput> {
        visible_ascii(&value, Self::MAX_CHARS)?;
        Ok(RequestId(value))
    }
}

/// A lease's token: 122 random bits drawn by the database, shown to callers
/// as the usual hyphenated hex form.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseToken(uuid::Uuid);

impl LeaseToken {
    pub fn from_uuid(uuid: uuid::Uuid) -> Self {
        LeaseToken(uuid)
    }

    pub fn as_uuid(&self) -> uuid::Uuid {
        self.0
    }
}

impl TryFrom<String> for LeaseToken {
    type Error = InvalidInput;

    fn try_from(value: String) -> Result<Self, InvalidInput> {
        if value.is_empty() {
            return refuse("must not be empty: pass the lease.token that Acquire returned");
        }
        uuid::Uuid::try_parse(&value)
            .map(LeaseToken)
            .map_err(|_| InvalidInput("is not a lease token issued by this service".to_owned()))
    }
}

impl fmt::Display for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.hyphenated().fmt(f)
    }
}

/// Tokens are secrets: never printed in logs or errors.
impl fmt::Debug for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LeaseToken(..)")
    }
}

/// How many characters of a failure's error text are kept. SQL keeps as
/// many of the texts it writes itself (`left(…, 4000)` in
/// `idempotency_acquire`); `conformance::sql_cuts_error_texts_where_the_server_does`
/// holds the two together.
pub const MAX_ERROR_CHARS: usize = 4000;

/// A failure's error text, cut to [`MAX_ERROR_CHARS`] characters (never in
/// the middle of a character).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ErrorText(String);

impl ErrorText {
    pub fn new(mut text: String) -> Self {
        if let Some((cut, _)) = text.char_indices().nth(MAX_ERROR_CHARS) {
            text.truncate(cut);
        }
        ErrorText(text)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scope_allows_its_punctuation_and_refuses_the_rest() {
        assert!(Scope::try_from("payments.charge:v2/eu-1_a".to_owned()).is_ok());
        assert!(Scope::try_from("a*b".to_owned()).is_err());
        assert!(Scope::try_from(String::new()).is_err());
        assert!(Scope::try_from("s".repeat(128)).is_ok());
        assert!(Scope::try_from("s".repeat(129)).is_err());
        assert!(Scope::try_from("é".to_owned()).is_err());
    }

    #[test]
    fn a_key_is_visible_ascii_up_to_255_characters() {
        assert!(Key::try_from("k".repeat(255)).is_ok());
        assert!(Key::try_from("k".repeat(256)).is_err());
        assert!(Key::try_from("a b".to_owned()).is_err());
        assert!(Key::try_from("a\nb".to_owned()).is_err());
        assert!(Key::try_from("ключ".to_owned()).is_err());
        assert!(Key::try_from("~!{}".to_owned()).is_ok());
    }

    #[test]
    fn a_scope_of_non_ascii_letters_is_refused_for_its_characters_not_its_bytes() {
        let err = Scope::try_from("é".repeat(100)).unwrap_err();
        assert!(err.0.contains("found 'é'"), "{}", err.0);
        let err = Scope::try_from("a".repeat(129)).unwrap_err();
        assert!(err.0.contains("got 129"), "{}", err.0);
    }

    #[test]
    fn json_values_are_counted_outside_strings_only() {
        assert!(json_values_at_least(r#"{"a":[1,2]}"#, 4));
        assert!(!json_values_at_least(r#"{"a":[1,2]}"#, 5));
        assert!(json_values_at_least(r#"["[,{", "\",", 1]"#, 4));
        assert!(!json_values_at_least(r#"["[,{", "\",", 1]"#, 5));
        // In pieces split anywhere, even inside a string's escape.
        let text = br#"["[,{", "\",", 1, {"a": [2]}]"#;
        for split in 0..text.len() {
            let mut values = JsonValues::default();
            let reached = values.feed(&text[..split], 7) | values.feed(&text[split..], 7);
            assert!(reached, "split at {split}");
            let mut values = JsonValues::default();
            values.feed(&text[..split], 8);
            assert!(!values.feed(&text[split..], 8), "split at {split}");
        }
    }

    #[test]
    fn a_json_payload_of_too_many_values_is_refused_naming_the_limit() {
        let many = format!("[{}]", vec!["[]"; Fingerprint::MAX_JSON_VALUES].join(","));
        let err = Fingerprint::of_json(&many).unwrap_err();
        assert!(err.0.contains("100000"), "{}", err.0);
        let fits = format!(
            "[{}]",
            vec!["0"; Fingerprint::MAX_JSON_VALUES - 1].join(",")
        );
        assert!(Fingerprint::of_json(&fits).is_ok());
    }

    #[test]
    fn json_fingerprints_ignore_key_order_and_white_space_but_not_array_order() {
        let a = Fingerprint::of_json(r#"{"a":1,"b":2}"#).unwrap();
        let b = Fingerprint::of_json("{ \"b\": 2,\n \"a\": 1 }").unwrap();
        assert_eq!(a, b);
        let nested_a = Fingerprint::of_json(r#"{"x":{"b":[1,2],"a":null}}"#).unwrap();
        let nested_b = Fingerprint::of_json(r#"{"x":{"a":null,"b":[1,2]}}"#).unwrap();
        assert_eq!(nested_a, nested_b);
        let swapped = Fingerprint::of_json(r#"{"x":{"a":null,"b":[2,1]}}"#).unwrap();
        assert_ne!(nested_a, swapped);
    }

    #[test]
    fn json_fingerprints_keep_large_numbers_apart() {
        let a = Fingerprint::of_json("12345678901234567890123").unwrap();
        let b = Fingerprint::of_json("12345678901234567890124").unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn invalid_json_is_refused_with_a_reason() {
        let err = Fingerprint::of_json("{\"a\":").unwrap_err();
        assert!(err.0.contains("not valid JSON"), "{err}");
    }

    #[test]
    fn payload_fingerprints_are_sha256_hex() {
        assert_eq!(
            Fingerprint::of_payload(b"abc").as_str(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn error_text_is_cut_at_a_character_boundary() {
        let long = "é".repeat(MAX_ERROR_CHARS + 10);
        let cut = ErrorText::new(long);
        assert_eq!(cut.as_str().chars().count(), MAX_ERROR_CHARS);
        assert_eq!(ErrorText::new("short".into()).as_str(), "short");
    }

    #[test]
    fn lease_tokens_never_show_in_debug_output() {
        let token = LeaseToken::from_uuid(uuid::Uuid::from_u128(7));
        assert!(!format!("{token:?}").contains('7'));
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;

    fn scope_rule(s: &str) -> bool {
        !s.is_empty()
            && s.len() <= 128
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "._:/-".contains(c))
    }

    fn visible(s: &str, max: usize) -> bool {
        s.len() <= max && s.chars().all(|c| ('\x21'..='\x7e').contains(&c))
    }

    /// Any JSON value, nested a few levels.
    fn json() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            ".{0,8}".prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
                prop::collection::btree_map(".{0,6}", inner, 0..4)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// `value` written as JSON with its object keys in reverse order and
    /// white space between every token.
    fn scrambled(value: &serde_json::Value) -> String {
        match value {
            serde_json::Value::Object(map) => {
                let fields: Vec<String> = map
                    .iter()
                    .rev()
                    .map(|(k, v)| {
                        format!(
                            " {} :\n {} ",
                            serde_json::to_string(k).unwrap(),
                            scrambled(v)
                        )
                    })
                    .collect();
                format!("{{ {} }}", fields.join(" ,\t"))
            }
            serde_json::Value::Array(items) => {
                let items: Vec<String> = items.iter().map(scrambled).collect();
                format!("[ {} ]", items.join(" , "))
            }
            other => other.to_string(),
        }
    }

    proptest! {
        #[test]
        fn scopes_are_accepted_exactly_when_they_follow_the_rule(s in ".{0,140}|[A-Za-z0-9._:/*-]{0,140}") {
            prop_assert_eq!(Scope::try_from(s.clone()).is_ok(), scope_rule(&s));
        }

        #[test]
        fn keys_are_accepted_exactly_when_visible_ascii_up_to_255(s in ".{0,300}|[!-~ ]{0,300}") {
            prop_assert_eq!(Key::try_from(s.clone()).is_ok(), !s.is_empty() && visible(&s, 255));
        }

        #[test]
        fn fingerprints_and_request_ids_follow_their_rules(s in ".{0,140}|[!-~]{0,140}") {
            prop_assert_eq!(Fingerprint::from_client(s.clone()).is_ok(), visible(&s, 128));
            prop_assert_eq!(RequestId::try_from(s.clone()).is_ok(), visible(&s, 128));
        }

        #[test]
        fn lease_tokens_never_panic_and_round_trip(s in ".{0,64}") {
            if let Ok(token) = LeaseToken::try_from(s) {
                prop_assert_eq!(LeaseToken::try_from(token.to_string()).unwrap(), token);
            }
        }

        #[test]
        fn any_text_is_either_json_or_refused_never_a_panic(s in ".{0,64}") {
            let _ = Fingerprint::of_json(&s);
        }

        #[test]
        fn json_layout_and_key_order_never_change_the_fingerprint(value in json()) {
            let compact = serde_json::to_string(&value).unwrap();
            let a = Fingerprint::of_json(&compact).unwrap();
            let b = Fingerprint::of_json(&scrambled(&value)).unwrap();
            prop_assert_eq!(a, b);
        }

        #[test]
        fn different_json_values_get_different_fingerprints(a in json(), b in json()) {
            prop_assume!(a != b);
            let fa = Fingerprint::of_json(&serde_json::to_string(&a).unwrap()).unwrap();
            let fb = Fingerprint::of_json(&serde_json::to_string(&b).unwrap()).unwrap();
            prop_assert_ne!(fa, fb);
        }

        #[test]
        fn error_text_keeps_at_most_4000_characters_of_a_prefix(s in ".{0,4100}") {
            let cut = ErrorText::new(s.clone());
            prop_assert!(cut.as_str().chars().count() <= MAX_ERROR_CHARS);
            prop_assert!(s.starts_with(cut.as_str()));
        }
    }
}

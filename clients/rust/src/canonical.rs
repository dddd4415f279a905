//! Canonical JSON, the one form the coordinator fingerprints a
//! `json_payload` by and the sidecar fingerprints a `json=canonical` body
//! by: object keys sorted (by their UTF-8 bytes), no insignificant white
//! space, arrays in order, strings escaped as serde_json escapes them, and
//! numbers kept exactly as written (`1.10` is not `1.1`, and integers past
//! 2^64 do not collide). Keeping numbers as written needs serde_json's
//! `arbitrary_precision`, which the `canonical-json` feature that builds
//! this module turns on, so every program that canonicalises gets it
//! however it is built.

use serde_json::Value;

/// `text` in canonical form, or why it is not JSON.
pub fn canonical_json(text: &[u8]) -> Result<Vec<u8>, serde_json::Error> {
    let value: Value = serde_json::from_slice(text)?;
    let mut out = Vec::with_capacity(text.len());
    write(&value, &mut out)?;
    Ok(out)
}

fn write(value: &Value, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
    match value {
        Value::Object(map) => {
            // Sorted here, not by the map: a map that keeps insertion
            // order (serde_json's `preserve_order`, which any crate in a
            // build may turn on) must not change the form.
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                serde_json::to_writer(&mut *out, key)?;
                out.push(b':');
                write(item, out)?;
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(item, out)?;
            }
            out.push(b']');
        }
        scalar => serde_json::to_writer(&mut *out, scalar)?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canonical(text: &str) -> String {
        String::from_utf8(canonical_json(text.as_bytes()).unwrap()).unwrap()
    }

    #[test]
    fn key_order_and_white_space_do_not_count() {
        assert_eq!(
            canonical("{ \"b\": [1, {\"y\":2, \"x\":\"\\u00e9\"}], \"a\": null }"),
            "{\"a\":null,\"b\":[1,{\"x\":\"é\",\"y\":2}]}"
        );
    }

    #[test]
    fn numbers_are_kept_as_written() {
        assert_eq!(canonical("{\"amount\":1.10}"), "{\"amount\":1.10}");
        assert_ne!(canonical("1.10"), canonical("1.1"));
        assert_eq!(canonical("18446744073709551617"), "18446744073709551617");
        assert_ne!(
            canonical("18446744073709551617"),
            canonical("18446744073709551616")
        );
    }

    #[test]
    fn what_is_not_json_is_an_error() {
        assert!(canonical_json(b"{").is_err());
        assert!(canonical_json(b"1 2").is_err());
    }
}

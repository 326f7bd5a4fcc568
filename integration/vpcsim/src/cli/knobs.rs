//! `key=value` knob settings turned into the JSON patch the control API's `PUT /knobs` merges.
//! Pure; must not know the knob names (the world validates them).

use serde_json::{Map, Value};

/// A setting that is not `key=value`.
#[derive(Debug, thiserror::Error)]
#[error("bad setting {0:?}: want key=value")]
pub struct KnobError(pub String);

/// `["a.b=1", "c=x"]` -> `{"a":{"b":1},"c":"x"}`. Values parse as JSON, else are strings.
pub fn patch(settings: &[String]) -> Result<Value, KnobError> {
    let mut root = Value::Object(Map::new());
    for s in settings {
        let (key, raw) = s.split_once('=').ok_or_else(|| KnobError(s.clone()))?;
        if key.is_empty() || key.split('.').any(str::is_empty) {
            return Err(KnobError(s.clone()));
        }
        let value = serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_owned()));
        let mut slot = &mut root;
        for part in key.split('.') {
            if !slot.is_object() {
                *slot = Value::Object(Map::new());
            }
            slot = slot
                .as_object_mut()
                .map(|m| m.entry(part.to_owned()).or_insert(Value::Null))
                .unwrap_or_else(|| unreachable!("made an object above"));
        }
        *slot = value;
    }
    Ok(root)
}

/// Pretty-print a JSON body (or return it unchanged if it is not JSON).
pub fn pretty(body: &str) -> String {
    serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or_else(|| body.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn dotted_keys_nest_and_values_parse() {
        let p = patch(&[
            "attach_delay_ms=500".into(),
            "throttle.enabled=true".into(),
            "throttle.describe.rate=2.5".into(),
            "imds_partial_prefixes=null".into(),
            "name=text".into(),
        ])
        .unwrap();
        assert_eq!(
            p,
            json!({"attach_delay_ms":500,"throttle":{"enabled":true,"describe":{"rate":2.5}},
                   "imds_partial_prefixes":null,"name":"text"})
        );
    }

    #[test]
    fn malformed_settings_are_refused() {
        assert!(patch(&["novalue".into()]).is_err());
        assert!(patch(&["=1".into()]).is_err());
        assert!(patch(&["a..b=1".into()]).is_err());
    }
}

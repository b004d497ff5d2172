//! The units the configuration files write: sizes as bytes or Kubernetes quantities (`64Mi`),
//! durations as a number with its unit (`10s`), each greater than zero. Below both the
//! configuration and the content sources, whose providers' files use them too.

use serde::{Deserialize, Deserializer};

/// `64Mi`, `512Ki`, `1Gi` or a plain number of bytes.
pub fn quantity<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Bytes(u64),
        Text(String),
    }
    let text = match Raw::deserialize(deserializer)? {
        Raw::Bytes(bytes) => return nonzero(bytes),
        Raw::Text(text) => text,
    };
    nonzero(size_of(&text).map_err(serde::de::Error::custom)?)
}

/// The bytes `text` says: a number of bytes, or a `Ki`, `Mi` or `Gi` quantity (`64Mi`), as the
/// configuration and the shipped manifests write sizes.
pub fn size_of(text: &str) -> Result<u64, String> {
    let (number, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len()));
    let multiplier: u64 = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        _ => return Err(format!("invalid size {text:?}: use bytes or a Ki, Mi or Gi quantity")),
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(multiplier))
        .ok_or_else(|| format!("invalid size {text:?}: use bytes or a Ki, Mi or Gi quantity"))
}

/// A duration: `500ms`, `10s`, `2m`, `1h`, or a plain number of seconds; greater than zero.
pub fn duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<std::time::Duration, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Seconds(u64),
        Text(String),
    }
    let invalid = |text: &str| {
        serde::de::Error::custom(format!(
            "invalid duration {}: use a number with ms, s, m or h (500ms, 10s, 2m, 1h)",
            crate::quote::quote(text)
        ))
    };
    let millis = match Raw::deserialize(deserializer)? {
        Raw::Seconds(seconds) => seconds.checked_mul(1000),
        Raw::Text(text) => {
            let split = text.find(|c: char| !c.is_ascii_digit()).ok_or_else(|| invalid(&text))?;
            let (number, unit) = text.split_at(split);
            let per_unit = match unit {
                "ms" => 1,
                "s" => 1000,
                "m" => 60_000,
                "h" => 3_600_000,
                _ => return Err(invalid(&text)),
            };
            Some(number.parse::<u64>().ok().and_then(|n| n.checked_mul(per_unit)).ok_or_else(|| invalid(&text))?)
        }
    };
    let millis = millis.ok_or_else(|| serde::de::Error::custom("duration too large"))?;
    Ok(std::time::Duration::from_millis(nonzero(millis)?))
}

/// `value`, refused when it is zero.
pub fn nonzero<E: serde::de::Error>(value: u64) -> Result<u64, E> {
    if value == 0 { Err(E::custom("must be greater than zero")) } else { Ok(value) }
}

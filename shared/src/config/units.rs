//! Durations and sizes as operators write them: `"500ms"`, `"15s"`, `"16KiB"`, `1024`.
//!
//! Parsing happens inside deserialization so that a bad value is reported by ron at
//! the exact line and column where it was written.

use serde::de::{self, Deserialize, Deserializer, Visitor};
use std::fmt;
use std::time::Duration;

/// A duration written as a string with a unit: `ms`, `s`, `m`, `h`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConfDuration(pub Duration);

/// A size in bytes, written as an integer or a string with a unit: `B`, `KiB`, `MiB`, `GiB`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConfSize(pub u64);

/// Parses `"500ms"`, `"15s"`, `"2m"`, `"1h"` (also `"1.5s"`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("duration `{text}` needs a unit: ms, s, m or h (e.g. \"15s\")"))?;
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("duration `{text}` does not start with a number"))?;
    let millis_per_unit = match unit.trim() {
        "ms" => 1.0,
        "s" => 1_000.0,
        "m" | "min" => 60_000.0,
        "h" => 3_600_000.0,
        other => {
            return Err(format!(
                "duration `{text}` has unknown unit `{other}`: use ms, s, m or h"
            ))
        }
    };
    let millis = value * millis_per_unit;
    if !millis.is_finite() || millis > 1e12 {
        return Err(format!("duration `{text}` is too large"));
    }
    Ok(Duration::from_micros((millis * 1000.0).round() as u64))
}

/// Parses `"16KiB"`, `"1MiB"`, `"512B"`, `"4096"`; `k`/`m`/`g` are read as KiB/MiB/GiB
/// as nginx reads them.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: u64 = number
        .parse()
        .map_err(|_| format!("size `{text}` does not start with a whole number"))?;
    let multiplier: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" | "k" | "K" => 1 << 10,
        "MiB" | "m" | "M" => 1 << 20,
        "GiB" | "g" | "G" => 1 << 30,
        "KB" | "MB" | "GB" | "kB" => {
            return Err(format!(
                "size `{text}`: write binary units (KiB, MiB, GiB) so there is no doubt about 1000 vs 1024"
            ))
        }
        other => {
            return Err(format!(
                "size `{text}` has unknown unit `{other}`: use B, KiB, MiB or GiB"
            ))
        }
    };
    value
        .checked_mul(multiplier)
        .ok_or_else(|| format!("size `{text}` is too large"))
}

impl<'de> Deserialize<'de> for ConfDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct DurationVisitor;
        impl Visitor<'_> for DurationVisitor {
            type Value = ConfDuration;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a duration string with a unit, such as \"500ms\" or \"15s\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ConfDuration, E> {
                parse_duration(v).map(ConfDuration).map_err(E::custom)
            }
        }
        deserializer.deserialize_str(DurationVisitor)
    }
}

impl<'de> Deserialize<'de> for ConfSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SizeVisitor;
        impl Visitor<'_> for SizeVisitor {
            type Value = ConfSize;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a size: bytes as an integer, or a string such as \"16KiB\"")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ConfSize, E> {
                Ok(ConfSize(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ConfSize, E> {
                u64::try_from(v)
                    .map(ConfSize)
                    .map_err(|_| E::custom(format!("size {v} is negative")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ConfSize, E> {
                parse_size(v).map(ConfSize).map_err(E::custom)
            }
        }
        deserializer.deserialize_any(SizeVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_with_units() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn durations_without_or_with_bad_units_are_rejected() {
        assert!(parse_duration("15").unwrap_err().contains("needs a unit"));
        assert!(parse_duration("15 parsecs")
            .unwrap_err()
            .contains("unknown unit"));
        assert!(parse_duration("s").is_err());
    }

    #[test]
    fn sizes_with_units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("512B"), Ok(512));
        assert_eq!(parse_size("16KiB"), Ok(16 * 1024));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("8k"), Ok(8192));
    }

    #[test]
    fn ambiguous_or_bad_sizes_are_rejected() {
        assert!(parse_size("16KB").unwrap_err().contains("KiB"));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("99999999999999GiB")
            .unwrap_err()
            .contains("too large"));
    }
}

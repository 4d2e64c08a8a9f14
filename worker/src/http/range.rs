//! A single byte range (`Range: bytes=...`, RFC 9110 §14).
//!
//! Only one range is served; a request for several gets the whole file (200), which
//! the RFC allows and which avoids multipart responses nobody asks a static server for.

/// What to send for a `Range` header against a representation of `size` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeSpec {
    /// Ignore the header: send the whole representation (200).
    Full,
    /// Send bytes `start..=end` (206).
    Partial { start: u64, end: u64 },
    /// No byte of the range exists (416).
    Unsatisfiable,
}

/// Interprets a `Range` header value.
pub fn parse(value: &[u8], size: u64) -> RangeSpec {
    let Ok(value) = std::str::from_utf8(value) else {
        return RangeSpec::Full;
    };
    let Some((unit, spec)) = value.trim().split_once('=') else {
        return RangeSpec::Full;
    };
    // RFC 9110 §14.1: range units are compared case-insensitively.
    if !unit.eq_ignore_ascii_case("bytes") {
        return RangeSpec::Full; // unknown unit: ignore
    }
    if spec.contains(',') {
        return RangeSpec::Full;
    }
    let Some((first, last)) = spec.trim().split_once('-') else {
        return RangeSpec::Full;
    };
    let (first, last) = (first.trim(), last.trim());
    let is_number = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    match (first, last) {
        ("", suffix) if is_number(suffix) => match saturating_number(suffix) {
            0 => RangeSpec::Unsatisfiable,
            _ if size == 0 => RangeSpec::Unsatisfiable,
            n => RangeSpec::Partial {
                start: size.saturating_sub(n),
                end: size - 1,
            },
        },
        (start, "") if is_number(start) => match saturating_number(start) {
            s if s >= size => RangeSpec::Unsatisfiable,
            s => RangeSpec::Partial {
                start: s,
                end: size - 1,
            },
        },
        (start, end) if is_number(start) && is_number(end) && !decimal_less(end, start) => {
            let (s, e) = (saturating_number(start), saturating_number(end));
            if s >= size {
                RangeSpec::Unsatisfiable
            } else {
                RangeSpec::Partial {
                    start: s,
                    end: e.min(size - 1),
                }
            }
        }
        _ => RangeSpec::Full, // syntactically invalid: ignore
    }
}

/// The value of a string of digits, or `u64::MAX` for one larger: `1*DIGIT` has no
/// upper bound, and past any file's size every larger value means the same.
fn saturating_number(digits: &str) -> u64 {
    digits.bytes().fold(0u64, |acc, d| {
        acc.saturating_mul(10).saturating_add(u64::from(d - b'0'))
    })
}

/// `a < b` for strings of digits of any length.
fn decimal_less(a: &str, b: &str) -> bool {
    let a = a.trim_start_matches('0');
    let b = b.trim_start_matches('0');
    (a.len(), a) < (b.len(), b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_of_a_single_range() {
        assert_eq!(
            parse(b"bytes=0-99", 1000),
            RangeSpec::Partial { start: 0, end: 99 }
        );
        assert_eq!(
            parse(b"bytes=900-", 1000),
            RangeSpec::Partial {
                start: 900,
                end: 999
            }
        );
        assert_eq!(
            parse(b"bytes=-100", 1000),
            RangeSpec::Partial {
                start: 900,
                end: 999
            }
        );
        assert_eq!(
            parse(b"bytes=-5000", 1000),
            RangeSpec::Partial { start: 0, end: 999 }
        );
        assert_eq!(
            parse(b"bytes=990-2000", 1000),
            RangeSpec::Partial {
                start: 990,
                end: 999
            }
        );
    }

    #[test]
    fn unsatisfiable_ranges() {
        assert_eq!(parse(b"bytes=1000-", 1000), RangeSpec::Unsatisfiable);
        assert_eq!(parse(b"bytes=1000-1001", 1000), RangeSpec::Unsatisfiable);
        assert_eq!(parse(b"bytes=-0", 1000), RangeSpec::Unsatisfiable);
        assert_eq!(parse(b"bytes=0-", 0), RangeSpec::Unsatisfiable);
    }

    #[test]
    fn invalid_or_multiple_ranges_are_ignored() {
        assert_eq!(parse(b"bytes=5-1", 1000), RangeSpec::Full);
        assert_eq!(parse(b"bytes=0-1,5-6", 1000), RangeSpec::Full);
        assert_eq!(parse(b"items=0-1", 1000), RangeSpec::Full);
        assert_eq!(parse(b"bytes=a-b", 1000), RangeSpec::Full);
        assert_eq!(parse(b"bytes=+1-2", 1000), RangeSpec::Full);
        assert_eq!(
            parse(
                b"bytes=99999999999999999999999-9999999999999999999999",
                1000
            ),
            RangeSpec::Full
        );
    }

    #[test]
    fn the_unit_is_case_insensitive() {
        // Found by fuzz_parsers::range: `Bytes=` was ignored (RFC 9110 §14.1).
        assert_eq!(parse(b"Bytes=-0", 0), RangeSpec::Unsatisfiable);
        assert_eq!(
            parse(b"BYTES=0-1", 1000),
            RangeSpec::Partial { start: 0, end: 1 }
        );
    }

    #[test]
    fn numbers_beyond_u64_are_valid_and_saturate() {
        // Found by fuzz_parsers::range: a position over u64::MAX is still `1*DIGIT`;
        // it was ignored (200) instead of meaning "past the end" / "all of it".
        assert_eq!(
            parse(b"bytes=99999999999999999999999-", 1000),
            RangeSpec::Unsatisfiable
        );
        assert_eq!(
            parse(b"bytes=10-99999999999999999999999", 1000),
            RangeSpec::Partial {
                start: 10,
                end: 999
            }
        );
        assert_eq!(
            parse(b"bytes=-99999999999999999999999", 1000),
            RangeSpec::Partial { start: 0, end: 999 }
        );
        assert_eq!(
            parse(b"bytes=0005-0010", 1000),
            RangeSpec::Partial { start: 5, end: 10 }
        );
    }
}

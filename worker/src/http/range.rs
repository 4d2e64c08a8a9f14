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
    let Some(spec) = value.trim().strip_prefix("bytes=") else {
        return RangeSpec::Full; // unknown unit: ignore
    };
    if spec.contains(',') {
        return RangeSpec::Full;
    }
    let Some((first, last)) = spec.trim().split_once('-') else {
        return RangeSpec::Full;
    };
    let number = |s: &str| -> Option<u64> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            None
        } else {
            s.parse().ok()
        }
    };
    match (first.trim(), last.trim()) {
        ("", suffix) => match number(suffix) {
            None => RangeSpec::Full,
            Some(0) => RangeSpec::Unsatisfiable,
            Some(_) if size == 0 => RangeSpec::Unsatisfiable,
            Some(n) => RangeSpec::Partial {
                start: size.saturating_sub(n),
                end: size - 1,
            },
        },
        (start, "") => match number(start) {
            None => RangeSpec::Full,
            Some(s) if s >= size => RangeSpec::Unsatisfiable,
            Some(s) => RangeSpec::Partial {
                start: s,
                end: size - 1,
            },
        },
        (start, end) => match (number(start), number(end)) {
            (Some(s), Some(e)) if s <= e => {
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
        },
    }
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
    }
}

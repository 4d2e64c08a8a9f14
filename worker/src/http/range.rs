//! Byte ranges (`Range: bytes=...`, RFC 9110 §14).
//!
//! [`parse`] reads a single range; [`parse_set`] a list of them, for a
//! `multipart/byteranges` response (§14.6). A list is sorted and its overlapping and
//! adjacent ranges are coalesced, so the parts never hold more bytes than the
//! representation (no range amplification). A list of more than `max_ranges` ranges is
//! ignored (200 with the whole representation, as nginx's `max_ranges` does; §14.2
//! lets a server ignore a Range it finds excessive).

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
    one(spec, size)
}

/// What to send for a `Range` header that may list several ranges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RangeSet {
    /// Ignore the header (invalid, not bytes, or more than `max_ranges` ranges): 200.
    Full,
    /// Sorted, disjoint, non-adjacent `(start, end)` inclusive ranges: 206, one part
    /// or `multipart/byteranges`.
    Parts(Vec<(u64, u64)>),
    /// No listed range overlaps the representation: 416.
    Unsatisfiable,
}

/// Interprets a `Range` header value listing one or more ranges.
pub fn parse_set(value: &[u8], size: u64, max_ranges: usize) -> RangeSet {
    let Ok(value) = std::str::from_utf8(value) else {
        return RangeSet::Full;
    };
    let Some((unit, spec)) = value.trim().split_once('=') else {
        return RangeSet::Full;
    };
    if !unit.eq_ignore_ascii_case("bytes") || max_ranges == 0 {
        return RangeSet::Full;
    }
    let mut parts = Vec::new();
    let mut listed = 0usize;
    // RFC 9110 §5.6.1: empty list elements are allowed and ignored.
    for element in spec.split(',').filter(|e| !e.trim().is_empty()) {
        listed += 1;
        if listed > max_ranges {
            return RangeSet::Full;
        }
        match one(element, size) {
            RangeSpec::Full => return RangeSet::Full, // one invalid range: ignore all
            RangeSpec::Unsatisfiable => {}
            RangeSpec::Partial { start, end } => parts.push((start, end)),
        }
    }
    if listed == 0 {
        return RangeSet::Full;
    }
    if parts.is_empty() {
        return RangeSet::Unsatisfiable;
    }
    parts.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(parts.len());
    for (start, end) in parts {
        match merged.last_mut() {
            Some(last) if start <= last.1.saturating_add(1) => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    RangeSet::Parts(merged)
}

/// One `first-last`, `first-` or `-suffix` range.
fn one(spec: &str, size: u64) -> RangeSpec {
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
    fn range_sets_are_sorted_coalesced_and_bounded() {
        let parts = |v: &[u8]| parse_set(v, 1000, 4);
        assert_eq!(
            parts(b"bytes=500-599, 0-99"),
            RangeSet::Parts(vec![(0, 99), (500, 599)])
        );
        // Overlapping and adjacent ranges become one: never more bytes than the file.
        assert_eq!(
            parts(b"bytes=0-499,100-200,500-999"),
            RangeSet::Parts(vec![(0, 999)])
        );
        assert_eq!(
            parts(b"bytes=-1,0-0,,"),
            RangeSet::Parts(vec![(0, 0), (999, 999)])
        );
        assert_eq!(parts(b"bytes=2000-,5000-6000"), RangeSet::Unsatisfiable);
        assert_eq!(parts(b"bytes=2000-,0-1"), RangeSet::Parts(vec![(0, 1)]));
        assert_eq!(
            parts(b"bytes=0-1,2-1"),
            RangeSet::Full,
            "one invalid: all ignored"
        );
        assert_eq!(
            parts(b"bytes=0-0,2-2,4-4,6-6,8-8"),
            RangeSet::Full,
            "more than 4"
        );
        assert_eq!(parts(b"bytes=,"), RangeSet::Full);
        assert_eq!(parse_set(b"bytes=0-1", 1000, 0), RangeSet::Full);
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

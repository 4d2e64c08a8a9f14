//! The `Range` parser against the RFC 9110 §14.1.2 arithmetic, on any spelling.

use forkd_worker::http::range::{self, RangeSpec};
use proptest::prelude::*;

/// A decimal number as a client may write it: leading zeros, or more digits than a
/// u64 holds (a valid `1*DIGIT` all the same).
fn number() -> impl Strategy<Value = (String, u128)> {
    prop_oneof![
        3 => (0..3000u64).prop_map(|n| (n.to_string(), u128::from(n))),
        1 => any::<u64>().prop_map(|n| (n.to_string(), u128::from(n))),
        1 => (0..4usize, 0..3000u64).prop_map(|(z, n)| (format!("{}{n}", "0".repeat(z)), u128::from(n))),
        1 => (1..30usize).prop_map(|d| ("9".repeat(d), "9".repeat(d.min(38)).parse().unwrap())),
    ]
}

fn size() -> impl Strategy<Value = u64> {
    prop_oneof![3 => 0..3000u64, 1 => any::<u64>()]
}

/// The answer RFC 9110 §14.1.2 gives for one byte-range-spec on `size` bytes.
fn expected(first: Option<u128>, last: Option<u128>, size: u64) -> RangeSpec {
    let size = u128::from(size);
    let partial = |start: u128, end: u128| RangeSpec::Partial {
        start: start as u64,
        end: end as u64,
    };
    match (first, last) {
        (Some(f), _) if last.is_some_and(|l| l < f) => RangeSpec::Full, // invalid: ignored
        (Some(f), _) if f >= size => RangeSpec::Unsatisfiable,
        (Some(f), Some(l)) => partial(f, l.min(size - 1)),
        (Some(f), None) => partial(f, size - 1),
        (None, Some(0)) => RangeSpec::Unsatisfiable,
        (None, Some(_)) if size == 0 => RangeSpec::Unsatisfiable,
        (None, Some(n)) => partial(size.saturating_sub(n), size - 1),
        (None, None) => RangeSpec::Full,
    }
}

proptest! {
    #![proptest_config(crate::config(2000))]

    #[test]
    fn a_single_range_follows_the_rfc(
        first in prop::option::of(number()),
        last in prop::option::of(number()),
        size in size(),
        unit in prop::sample::select(vec!["bytes", "Bytes", "BYTES"]),
        ows in prop::sample::select(vec!["", " ", "\t"]),
    ) {
        let text = format!(
            "{ows}{unit}={}-{}{ows}",
            first.as_ref().map_or("", |f| f.0.as_str()),
            last.as_ref().map_or("", |l| l.0.as_str()),
        );
        let want = expected(first.map(|f| f.1), last.map(|l| l.1), size);
        prop_assert_eq!(range::parse(text.as_bytes(), size), want, "{:?} on {} bytes", text, size);
    }

    #[test]
    fn any_value_gives_a_range_inside_the_representation(
        value in prop::collection::vec(prop_oneof![
            3 => prop::sample::select(b"bytes=-0123456789, \t".to_vec()),
            1 => any::<u8>(),
        ], 0..40),
        size in size(),
    ) {
        match range::parse(&value, size) {
            RangeSpec::Partial { start, end } => {
                prop_assert!(start <= end && end < size, "{}..={} of {}", start, end, size);
            }
            RangeSpec::Unsatisfiable | RangeSpec::Full => {}
        }
    }
}

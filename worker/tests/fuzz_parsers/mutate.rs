//! Byte-level mutations of a well-formed input, and split points to feed it by.

use proptest::prelude::*;

/// One edit at a relative position (a fraction of the input's length, in 1/65536).
#[derive(Debug, Clone)]
pub enum Edit {
    Insert(u16, Vec<u8>),
    Delete(u16, u8),
    Replace(u16, u8),
    /// Repeat a slice in place: what makes duplicated fields and over-long lines.
    Repeat(u16, u8, u8),
}

/// Bytes that matter to HTTP framing, more likely than the rest.
pub fn interesting_byte() -> impl Strategy<Value = u8> {
    prop_oneof![
        3 => prop::sample::select(b"\r\n \t:;,=/?%.0aAfF9-\"\\\x00\x7f\xff".to_vec()),
        1 => any::<u8>(),
    ]
}

pub fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (
            any::<u16>(),
            prop::collection::vec(interesting_byte(), 1..4)
        )
            .prop_map(|(p, b)| Edit::Insert(p, b)),
        (any::<u16>(), 1..8u8).prop_map(|(p, n)| Edit::Delete(p, n)),
        (any::<u16>(), interesting_byte()).prop_map(|(p, b)| Edit::Replace(p, b)),
        (any::<u16>(), 1..16u8, 1..4u8).prop_map(|(p, n, times)| Edit::Repeat(p, n, times)),
    ]
}

/// Up to `max` edits; none at all in a third of the cases, so well-formed inputs stay
/// common.
pub fn edits(max: usize) -> impl Strategy<Value = Vec<Edit>> {
    prop_oneof![
        1 => Just(Vec::new()),
        2 => prop::collection::vec(edit(), 1..=max),
    ]
}

fn at(len: usize, p: u16) -> usize {
    (len * usize::from(p)) / 65536
}

pub fn apply(input: &mut Vec<u8>, edits: &[Edit]) {
    for e in edits {
        let len = input.len();
        match e {
            Edit::Insert(p, bytes) => {
                let i = at(len + 1, *p);
                input.splice(i..i, bytes.iter().copied());
            }
            Edit::Delete(p, n) if len > 0 => {
                let i = at(len, *p);
                let end = (i + usize::from(*n)).min(len);
                input.drain(i..end);
            }
            Edit::Replace(p, b) if len > 0 => {
                let i = at(len, *p);
                input[i] = *b;
            }
            Edit::Repeat(p, n, times) if len > 0 => {
                let i = at(len, *p);
                let end = (i + usize::from(*n)).min(len);
                let slice = input[i..end].to_vec();
                for _ in 0..*times {
                    input.splice(end..end, slice.iter().copied());
                }
            }
            _ => {}
        }
    }
}

/// Where to cut an input of any length: relative positions, sorted when applied.
pub fn cuts() -> impl Strategy<Value = Vec<u16>> {
    prop_oneof![
        1 => Just(Vec::new()),
        3 => prop::collection::vec(any::<u16>(), 1..12),
    ]
}

/// The lengths of the growing prefixes a reader would see, ending with `len`.
pub fn prefix_lengths(len: usize, cuts: &[u16]) -> Vec<usize> {
    let mut out: Vec<usize> = cuts.iter().map(|&c| at(len, c)).collect();
    out.push(len);
    out.sort_unstable();
    out.dedup();
    out
}
/// Consecutive pieces of `input` cut at `cuts`.
pub fn pieces<'a>(input: &'a [u8], cuts: &[u16]) -> Vec<&'a [u8]> {
    let mut start = 0;
    let mut out = Vec::new();
    for end in prefix_lengths(input.len(), cuts) {
        out.push(&input[start..end]);
        start = end;
    }
    out
}

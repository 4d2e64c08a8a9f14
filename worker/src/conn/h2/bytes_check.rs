//! Checks over every byte of a field value, eight bytes at a time (SWAR: a few
//! integer operations per 64-bit word instead of a compare and branch per byte).
//! Field values are checked on every request and response, and most are short
//! runs of plain text, so the common answer ("nothing wrong") comes fast.

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// Whether any byte of `w` is zero (the classic `haszero`: exact, no false hits).
fn has_zero(w: u64) -> bool {
    (w.wrapping_sub(ONES) & !w & HIGHS) != 0
}

/// Whether any byte of `w` equals `b`.
fn has_byte(w: u64, b: u8) -> bool {
    has_zero(w ^ (ONES * u64::from(b)))
}

/// Whether any byte of `w` is below `n` (`n` ≤ 128; exact).
fn has_below(w: u64, n: u8) -> bool {
    (w.wrapping_sub(ONES * u64::from(n)) & !w & HIGHS) != 0
}

/// Whether `v` holds NUL, CR or LF (RFC 9113 §8.2.1: a malformed field value).
pub fn has_nul_cr_lf(v: &[u8]) -> bool {
    let mut words = v.chunks_exact(8);
    for c in &mut words {
        let w = u64::from_le_bytes(c.try_into().expect("8 bytes"));
        if has_zero(w) || has_byte(w, b'\r') || has_byte(w, b'\n') {
            return true;
        }
    }
    words
        .remainder()
        .iter()
        .any(|&b| matches!(b, 0 | b'\r' | b'\n'))
}

/// Whether `v` is a field value HTTP/2 can carry: no control bytes but tab, no
/// DEL (RFC 9110 §5.5).
pub fn is_value(v: &[u8]) -> bool {
    let byte_ok = |b: u8| (b >= 0x20 && b != 0x7f) || b == b'\t';
    let mut words = v.chunks_exact(8);
    for c in &mut words {
        let w = u64::from_le_bytes(c.try_into().expect("8 bytes"));
        if has_below(w, 0x20) || has_byte(w, 0x7f) {
            // A tab, or a byte that is wrong: looked at one by one.
            if !c.iter().all(|&b| byte_ok(b)) {
                return false;
            }
        }
    }
    words.remainder().iter().all(|&b| byte_ok(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_at_every_place_is_judged_as_one_by_one() {
        for len in 0..20 {
            for at in 0..len {
                for b in 0..=255u8 {
                    let mut v = vec![b'a'; len];
                    v[at] = b;
                    assert_eq!(
                        has_nul_cr_lf(&v),
                        v.iter().any(|&b| matches!(b, 0 | b'\r' | b'\n')),
                        "{v:?}"
                    );
                    assert_eq!(
                        is_value(&v),
                        v.iter().all(|&b| (b >= 0x20 && b != 0x7f) || b == b'\t'),
                        "{v:?}"
                    );
                }
            }
        }
        // High bytes (obs-text) next to low ones: no false answers from borrows.
        assert!(is_value(&[
            0xff, 0x80, 0x20, 0xa0, 0xff, 0x21, 0x7e, 0x80, 0x09
        ]));
        assert!(!is_value(&[0xff, 0x80, 0x20, 0xa0, 0xff, 0x1f, 0x7e, 0x80]));
        assert!(!has_nul_cr_lf(&[
            0xff, 0x01, 0x0e, 0x0b, 0x0c, 0xff, 0xff, 0xff, 0x0e
        ]));
    }
}

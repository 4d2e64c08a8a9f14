//! HPACK's Huffman code (RFC 7541 §5.2, Appendix B), decoding only (forkd writes
//! strings as they are).
//!
//! The code is canonical: codes of one length are consecutive, and each length's
//! first code follows the last of the shorter ones. So the 257 code lengths of
//! Appendix B are the whole code, and decoding needs, per length, where its codes
//! start and which symbols they are: [`Table`], built once. A symbol is found by
//! left-aligning the next 30 bits and comparing them with each length's limit, the
//! short (common) lengths first.

use std::sync::OnceLock;

/// Bits of the code of each symbol 0..=255 and of EOS (256), RFC 7541 Appendix B.
const LENGTHS: [u8; 257] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, //
    28, 28, 28, 28, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 28, //
    6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, //
    5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10, //
    13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, //
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, //
    15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6, 6, 5, //
    6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, //
    20, 22, 20, 20, 22, 22, 22, 23, 22, 23, 23, 23, 23, 23, 24, 23, //
    24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, //
    22, 21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, //
    21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23, //
    26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, //
    19, 21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, //
    20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23, //
    26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26, //
    30,
];

const SHORTEST: usize = 5;
const LONGEST: usize = 30;
const EOS: u16 = 256;

/// Why a Huffman-coded string does not decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bad {
    /// The EOS symbol inside the string (RFC 7541 §5.2: an error).
    Eos,
    /// Padding longer than 7 bits, or not the most significant bits of EOS.
    Padding,
}

/// The canonical code's decoding table.
struct Table {
    /// Symbols by (length, symbol): the order of their codes.
    symbols: [u16; 257],
    /// Per length: the first code of that length, and the index in `symbols` of
    /// its symbol.
    first_code: [u32; LONGEST + 1],
    first_index: [u16; LONGEST + 1],
    /// Per length: the codes of that length and shorter, left-aligned to 30 bits,
    /// are below this.
    limit: [u32; LONGEST + 1],
    /// By the next 8 bits: the symbol and length of a code of 8 bits or fewer
    /// starting with them (length 0: a longer code, found by `limit`). The common
    /// characters of header values have such codes.
    fast: [(u8, u8); 256],
}

fn table() -> &'static Table {
    static TABLE: OnceLock<Table> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = Table {
            symbols: [0; 257],
            first_code: [0; LONGEST + 1],
            first_index: [0; LONGEST + 1],
            limit: [0; LONGEST + 1],
            fast: [(0, 0); 256],
        };
        let mut at = 0;
        let mut code: u32 = 0;
        for len in SHORTEST..=LONGEST {
            t.first_code[len] = code;
            t.first_index[len] = at as u16;
            for (sym, &l) in LENGTHS.iter().enumerate() {
                if usize::from(l) == len {
                    t.symbols[at] = sym as u16;
                    if len <= 8 {
                        let from = (code as usize) << (8 - len);
                        for v in from..from + (1 << (8 - len)) {
                            t.fast[v] = (sym as u8, len as u8);
                        }
                    }
                    at += 1;
                    code += 1;
                }
            }
            t.limit[len] = code << (LONGEST - len);
            code <<= 1;
        }
        t
    })
}

/// Appends the decoding of `coded` to `out`.
pub fn decode(coded: &[u8], out: &mut Vec<u8>) -> Result<(), Bad> {
    let t = table();
    // Bits not yet decoded, the oldest in the high end of `bits`' low `have` bits.
    let mut bits: u64 = 0;
    let mut have: usize = 0;
    let mut input = coded.iter();
    loop {
        while have < LONGEST {
            match input.next() {
                Some(&b) => {
                    bits = bits << 8 | u64::from(b);
                    have += 8;
                }
                None => break,
            }
        }
        if have == 0 {
            return Ok(());
        }
        // The next 30 bits, left-aligned (missing ones as 1s: what padding is).
        let window = if have >= LONGEST {
            (bits >> (have - LONGEST)) as u32 & ((1 << LONGEST) - 1)
        } else {
            let pad = LONGEST - have;
            ((bits << pad) as u32 | ((1 << pad) - 1)) & ((1 << LONGEST) - 1)
        };
        let (sym, len) = t.fast[(window >> (LONGEST - 8)) as usize];
        if len != 0 && usize::from(len) <= have {
            out.push(sym);
            have -= usize::from(len);
            bits &= (1u64 << have) - 1;
            continue;
        }
        let Some(len) = (SHORTEST..=LONGEST).find(|&l| window < t.limit[l]) else {
            return Err(Bad::Padding);
        };
        if len > have {
            // What is left is shorter than any code: padding, at most 7 bits of
            // 1s (the start of EOS).
            let rest = bits & ((1 << have) - 1);
            return match have <= 7 && rest == (1 << have) - 1 {
                true => Ok(()),
                false => Err(Bad::Padding),
            };
        }
        let code = window >> (LONGEST - len);
        let sym = t.symbols[usize::from(t.first_index[len]) + (code - t.first_code[len]) as usize];
        if sym == EOS {
            return Err(Bad::Eos);
        }
        out.push(sym as u8);
        have -= len;
        bits &= (1u64 << have) - 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::super::fuzz::hex;

    fn decoded(s: &str) -> Result<Vec<u8>, Bad> {
        let mut out = Vec::new();
        decode(&hex(s), &mut out).map(|()| out)
    }

    #[test]
    fn the_code_is_complete_and_canonical() {
        // Kraft's sum of a complete prefix code is exactly 1.
        let sum: u64 = LENGTHS
            .iter()
            .map(|&l| 1u64 << (LONGEST - usize::from(l)))
            .sum();
        assert_eq!(sum, 1 << LONGEST);
        let t = table();
        assert_eq!(t.limit[LONGEST], 1 << LONGEST);
    }

    #[test]
    fn the_rfc_7541_appendix_c_strings_decode() {
        // C.4.1, C.4.2, C.4.3, C.6.1.
        assert_eq!(
            decoded("f1e3c2e5f23a6ba0ab90f4ff").unwrap(),
            b"www.example.com"
        );
        assert_eq!(decoded("a8eb10649cbf").unwrap(), b"no-cache");
        assert_eq!(decoded("25a849e95ba97d7f").unwrap(), b"custom-key");
        assert_eq!(decoded("25a849e95bb8e8b4bf").unwrap(), b"custom-value");
        assert_eq!(decoded("6402").unwrap(), b"302");
        assert_eq!(decoded("aec3771a4b").unwrap(), b"private");
        assert_eq!(
            decoded("d07abe941054d444a8200595040b8166e082a62d1bff").unwrap(),
            b"Mon, 21 Oct 2013 20:13:21 GMT"
        );
        assert_eq!(
            decoded("9d29ad171863c78f0b97c8e9ae82ae43d3").unwrap(),
            b"https://www.example.com"
        );
        assert_eq!(decoded("").unwrap(), b"");
    }

    #[test]
    fn every_symbol_decodes_by_the_fast_table_and_the_slow_way_alike() {
        // Each byte value alone, then all 256 in a row: what a canonical encoder
        // of the same lengths writes (codes assigned as `table` assigns them).
        let t = table();
        let code_of = |sym: u16| {
            let len = usize::from(LENGTHS[usize::from(sym)]);
            let index = t.symbols.iter().position(|&s| s == sym).unwrap();
            (
                t.first_code[len] + (index - usize::from(t.first_index[len])) as u32,
                len,
            )
        };
        let encode = |syms: &[u8]| {
            let mut bits: u128 = 0;
            let mut n = 0;
            let mut out = Vec::new();
            for &s in syms {
                let (code, len) = code_of(u16::from(s));
                bits = bits << len | u128::from(code);
                n += len;
                while n >= 8 {
                    out.push((bits >> (n - 8)) as u8);
                    n -= 8;
                }
            }
            if n > 0 {
                out.push(((bits << (8 - n)) as u8) | ((1u8 << (8 - n)) - 1));
            }
            out
        };
        let all: Vec<u8> = (0..=255).collect();
        for text in [
            all.clone(),
            b"www.example.com".to_vec(),
            b"/index.html?q=1".to_vec(),
        ] {
            let mut out = Vec::new();
            decode(&encode(&text), &mut out).unwrap();
            assert_eq!(out, text);
        }
        for b in all {
            let mut out = Vec::new();
            decode(&encode(&[b]), &mut out).unwrap();
            assert_eq!(out, [b]);
        }
    }

    #[test]
    fn bad_padding_and_eos_are_errors() {
        // "0" is 00000 (5 bits): padded with 0s instead of 1s.
        assert_eq!(decoded("00"), Err(Bad::Padding));
        // Eight bits of 1s: padding longer than 7 bits.
        assert_eq!(decoded("ff"), Err(Bad::Padding));
        // EOS itself (30 bits of 1s), padded.
        assert_eq!(decoded("ffffffff"), Err(Bad::Eos));
        // "0" then 3 bits of 1s: fine.
        assert_eq!(decoded("07").unwrap(), b"0");
    }
}

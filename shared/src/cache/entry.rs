//! A body file's format: a fixed header, the key, the response's header fields as
//! they are sent on a hit, its validators, the fields it varies by, then the body.
//!
//! ```text
//!  0  "FKDCENT1"         8  header_len u32 (where the body starts)
//!  12 key_len u32        16 head_len u32       20 status u16   22 flags u16
//!  24 body_len u64       32 stored u64         40 ttl u64      48 age_at_store u64
//!  56 swr u64            64 sie u64            72 epoch u64
//!  80 etag_len u16       82 last_modified_len u16   84 vary_len u16   86 0u16
//!  88 key, head, etag, last-modified, vary names (each followed by NUL) — then the body
//! ```
//!
//! A file is only ever read through [`Meta::decode`] and [`Meta::check_size`]: a
//! file of another format, cut short (a disk that filled, a crash before the
//! rename could not leave one, but a copy might), or whose lengths disagree with its
//! size is corrupt, and a corrupt file is a miss.

use std::fmt;

pub const MAGIC: [u8; 8] = *b"FKDCENT1";
pub const FIXED: usize = 88;
/// The largest header (key, fields, validators) a body file may have.
pub const MAX_HEADER: usize = 128 * 1024;

/// The entry is a `Vary` record: no body; `vary` names the fields, `epoch` is the
/// record's own.
pub const FLAG_VARY_RECORD: u16 = 1;
/// A stale entry is never served without revalidating.
pub const FLAG_MUST_REVALIDATE: u16 = 2;

/// Everything of a body file but its body.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Meta {
    pub status: u16,
    pub flags: u16,
    pub body_len: u64,
    /// Unix seconds the response was stored (or last revalidated).
    pub stored: u64,
    /// Seconds it is fresh for from `stored`.
    pub ttl: u64,
    /// The age it already had when stored (from `Age` and `Date`).
    pub age_at_store: u64,
    /// Seconds a stale entry may be served while it is revalidated (the response's
    /// or the route's, the larger), and while the application fails.
    pub swr: u64,
    pub sie: u64,
    pub epoch: u64,
    pub key: Vec<u8>,
    /// Header field lines (`Name: value\r\n` each), without framing fields, `Date`
    /// and `Age`, which a hit writes itself.
    pub head: Vec<u8>,
    pub etag: Vec<u8>,
    pub last_modified: Vec<u8>,
    /// Field names the response varies by (lowercase).
    pub vary: Vec<Vec<u8>>,
}

/// Why a body file cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Corrupt {
    Magic,
    Short {
        need: usize,
        have: usize,
    },
    Lengths,
    /// The file's size is not its header plus its body.
    Size {
        expected: u64,
        found: u64,
    },
    /// It is the file of another key (a hash collision, or a replaced file).
    OtherKey,
}

impl fmt::Display for Corrupt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Corrupt::Magic => f.write_str("not a forkd cache file"),
            Corrupt::Short { need, have } => write!(f, "header cut short ({have} of {need} bytes)"),
            Corrupt::Lengths => f.write_str("header lengths out of bounds"),
            Corrupt::Size { expected, found } => {
                write!(f, "{found} bytes where the header says {expected}")
            }
            Corrupt::OtherKey => f.write_str("the file of another key"),
        }
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl Meta {
    /// Where the body starts.
    pub fn header_len(&self) -> usize {
        FIXED
            + self.key.len()
            + self.head.len()
            + self.etag.len()
            + self.last_modified.len()
            + self.vary_len()
    }

    fn vary_len(&self) -> usize {
        self.vary.iter().map(|v| v.len() + 1).sum()
    }

    pub fn is_vary_record(&self) -> bool {
        self.flags & FLAG_VARY_RECORD != 0
    }

    pub fn must_revalidate(&self) -> bool {
        self.flags & FLAG_MUST_REVALIDATE != 0
    }

    /// The header bytes; `None` when a part is too long for its length field.
    pub fn encode(&self) -> Option<Vec<u8>> {
        let len = self.header_len();
        if len > MAX_HEADER
            || self.etag.len() > usize::from(u16::MAX)
            || self.last_modified.len() > usize::from(u16::MAX)
            || self.vary_len() > usize::from(u16::MAX)
        {
            return None;
        }
        let mut b = Vec::with_capacity(len);
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&(len as u32).to_le_bytes());
        b.extend_from_slice(&(self.key.len() as u32).to_le_bytes());
        b.extend_from_slice(&(self.head.len() as u32).to_le_bytes());
        b.extend_from_slice(&self.status.to_le_bytes());
        b.extend_from_slice(&self.flags.to_le_bytes());
        for v in [
            self.body_len,
            self.stored,
            self.ttl,
            self.age_at_store,
            self.swr,
            self.sie,
            self.epoch,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&(self.etag.len() as u16).to_le_bytes());
        b.extend_from_slice(&(self.last_modified.len() as u16).to_le_bytes());
        b.extend_from_slice(&(self.vary_len() as u16).to_le_bytes());
        b.extend_from_slice(&0u16.to_le_bytes());
        debug_assert_eq!(b.len(), FIXED);
        b.extend_from_slice(&self.key);
        b.extend_from_slice(&self.head);
        b.extend_from_slice(&self.etag);
        b.extend_from_slice(&self.last_modified);
        for v in &self.vary {
            b.extend_from_slice(v);
            b.push(0);
        }
        debug_assert_eq!(b.len(), len);
        Some(b)
    }

    /// How many bytes the header at the start of `fixed` (at least [`FIXED`]) takes.
    pub fn header_len_of(fixed: &[u8]) -> Result<usize, Corrupt> {
        if fixed.len() < FIXED {
            return Err(Corrupt::Short {
                need: FIXED,
                have: fixed.len(),
            });
        }
        if fixed[..8] != MAGIC {
            return Err(Corrupt::Magic);
        }
        let len = u32_at(fixed, 8) as usize;
        if !(FIXED..=MAX_HEADER).contains(&len) {
            return Err(Corrupt::Lengths);
        }
        Ok(len)
    }

    /// Reads a header (all of [`Meta::header_len_of`] bytes).
    pub fn decode(b: &[u8]) -> Result<Meta, Corrupt> {
        let len = Meta::header_len_of(b)?;
        if b.len() < len {
            return Err(Corrupt::Short {
                need: len,
                have: b.len(),
            });
        }
        let key_len = u32_at(b, 12) as usize;
        let head_len = u32_at(b, 16) as usize;
        let etag_len = usize::from(u16_at(b, 80));
        let lm_len = usize::from(u16_at(b, 82));
        let vary_len = usize::from(u16_at(b, 84));
        let parts = [key_len, head_len, etag_len, lm_len, vary_len];
        let total = parts
            .iter()
            .try_fold(FIXED, |a, &n| a.checked_add(n))
            .ok_or(Corrupt::Lengths)?;
        if total != len {
            return Err(Corrupt::Lengths);
        }
        let mut at = FIXED;
        let mut take = |n: usize| {
            let part = b[at..at + n].to_vec();
            at += n;
            part
        };
        let key = take(key_len);
        let head = take(head_len);
        let etag = take(etag_len);
        let last_modified = take(lm_len);
        let vary_bytes = take(vary_len);
        if vary_bytes.last().is_some_and(|&l| l != 0) {
            return Err(Corrupt::Lengths);
        }
        let vary = vary_bytes
            .split(|&c| c == 0)
            .filter(|v| !v.is_empty())
            .map(<[u8]>::to_vec)
            .collect();
        Ok(Meta {
            status: u16_at(b, 20),
            flags: u16_at(b, 22),
            body_len: u64_at(b, 24),
            stored: u64_at(b, 32),
            ttl: u64_at(b, 40),
            age_at_store: u64_at(b, 48),
            swr: u64_at(b, 56),
            sie: u64_at(b, 64),
            epoch: u64_at(b, 72),
            key,
            head,
            etag,
            last_modified,
            vary,
        })
    }

    /// The file must be exactly its header and its body.
    pub fn check_size(&self, file_size: u64) -> Result<(), Corrupt> {
        let expected = self.header_len() as u64 + self.body_len;
        if expected != file_size {
            return Err(Corrupt::Size {
                expected,
                found: file_size,
            });
        }
        Ok(())
    }

    /// The fixed part's bytes 24..56 (`body_len`, `stored`, `ttl`, `age_at_store`),
    /// rewritten in place when a body is complete or an entry revalidated.
    pub fn lengths_and_times(&self) -> [u8; 32] {
        let mut b = [0u8; 32];
        b[..8].copy_from_slice(&self.body_len.to_le_bytes());
        b[8..16].copy_from_slice(&self.stored.to_le_bytes());
        b[16..24].copy_from_slice(&self.ttl.to_le_bytes());
        b[24..].copy_from_slice(&self.age_at_store.to_le_bytes());
        b
    }
}

/// Where [`Meta::lengths_and_times`] goes in the file.
pub const LENGTHS_AT: u64 = 24;

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Meta {
        Meta {
            status: 200,
            flags: FLAG_MUST_REVALIDATE,
            body_len: 5,
            stored: 1000,
            ttl: 60,
            age_at_store: 3,
            swr: 30,
            sie: 3600,
            epoch: 9,
            key: b"httplocalhost/a?b".to_vec(),
            head: b"Content-Type: text/plain\r\nETag: \"x\"\r\n".to_vec(),
            etag: b"\"x\"".to_vec(),
            last_modified: b"Mon, 07 Dec 2026 00:00:00 GMT".to_vec(),
            vary: vec![b"accept-encoding".to_vec(), b"origin".to_vec()],
        }
    }

    #[test]
    fn a_header_reads_back_as_written() {
        let m = sample();
        let b = m.encode().unwrap();
        assert_eq!(b.len(), m.header_len());
        assert_eq!(Meta::header_len_of(&b), Ok(b.len()));
        assert_eq!(Meta::decode(&b), Ok(m.clone()));
        assert!(m.must_revalidate() && !m.is_vary_record());
        assert_eq!(m.check_size(b.len() as u64 + 5), Ok(()));
        assert!(matches!(
            m.check_size(b.len() as u64 + 4),
            Err(Corrupt::Size { .. })
        ));
        let mut patched = b.clone();
        let mut n = m.clone();
        n.body_len = 77;
        n.ttl = 1;
        n.age_at_store = 0;
        patched[LENGTHS_AT as usize..LENGTHS_AT as usize + 32]
            .copy_from_slice(&n.lengths_and_times());
        assert_eq!(Meta::decode(&patched), Ok(n));
    }

    #[test]
    fn damaged_headers_are_refused_never_misread() {
        let b = sample().encode().unwrap();
        assert_eq!(
            Meta::decode(&b[..40]),
            Err(Corrupt::Short {
                need: FIXED,
                have: 40
            })
        );
        assert!(matches!(
            Meta::decode(&b[..b.len() - 1]),
            Err(Corrupt::Short { .. })
        ));
        let mut other = b.clone();
        other[0] = b'X';
        assert_eq!(Meta::decode(&other), Err(Corrupt::Magic));
        let mut lens = b.clone();
        lens[12] = lens[12].wrapping_add(1); // key longer than the header has room for
        assert_eq!(Meta::decode(&lens), Err(Corrupt::Lengths));
        let mut huge = b.clone();
        huge[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(Meta::decode(&huge), Err(Corrupt::Lengths));
        // Every truncation of a valid header is refused.
        for cut in 0..b.len() {
            assert!(Meta::decode(&b[..cut]).is_err(), "cut at {cut}");
        }
    }
}

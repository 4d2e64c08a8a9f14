//! The shared proxy cache's storage, for every process of the daemon: the index all
//! workers read and write without a lock (`index`, mapped by `map`), the body files
//! (`entry`: their format, checked on every read; `files`: where they live, written
//! without a name and linked into place whole), and the passes off the request path
//! (`upkeep`: the loader that rebuilds an index from the files, the manager that
//! evicts, purge).
//!
//! ```text
//!  <zone path>/index          the index: a header, then `index_entries` 64-byte slots
//!  <zone path>/<hh>/<32 hex>  one body file per entry: header, key, head fields, body
//! ```
//!
//! A slot says an entry exists, until when it is fresh, how large its body is, when
//! it was last used and who is fetching it (the lock that lets one request of all
//! workers go upstream for a key). Everything else (the key itself, the response
//! head, the validators) is in the body file, which a hit opens anyway: a slot whose
//! file is missing, truncated or names another key is a miss, never an answer.

pub mod entry;
pub mod files;
pub mod index;
mod map;
pub mod prepare;
pub mod report;
pub mod upkeep;

pub use index::{Index, Lookup, SlotView};
pub use map::{current_id, index_path, IndexFile, MapError};

/// A key's 128-bit hash (FNV-1a): stable across builds and processes, since it names
/// body files on disk that a restarted or upgraded daemon reads again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyHash(pub u128);

impl KeyHash {
    const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
    const PRIME: u128 = 0x0000000001000000000000000000013B;

    pub fn of(parts: &[&[u8]]) -> KeyHash {
        let mut h = Self::OFFSET;
        for p in parts {
            for &b in *p {
                h ^= u128::from(b);
                h = h.wrapping_mul(Self::PRIME);
            }
        }
        // 0 marks an empty slot.
        KeyHash(h.max(1))
    }

    pub fn hi(self) -> u64 {
        (self.0 >> 64) as u64
    }

    pub fn lo(self) -> u64 {
        self.0 as u64
    }

    pub fn from_parts(hi: u64, lo: u64) -> KeyHash {
        KeyHash(u128::from(hi) << 64 | u128::from(lo))
    }

    /// The body file's name: 32 lowercase hex digits.
    pub fn hex(self) -> String {
        format!("{:032x}", self.0)
    }

    pub fn parse_hex(name: &str) -> Option<KeyHash> {
        if name.len() != 32 || !name.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u128::from_str_radix(name, 16).ok().map(KeyHash)
    }
}

/// The key of one variant of a response that `Vary`s: the primary key, the epoch of
/// the primary's vary record (a purge makes a new one, so variants stored before it
/// are never found again), and the request's values of the varying fields.
pub fn variant_hash(key: &[u8], epoch: u64, vary_values: &[u8]) -> KeyHash {
    KeyHash::of(&[key, b"\0vary\0", &epoch.to_le_bytes(), vary_values])
}

/// The current time in unix seconds.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_is_stable_and_names_files_both_ways() {
        // Pinned: body files on disk are named by it, a change would orphan them.
        let h = KeyHash::of(&[b"httplocalhost/a"]);
        assert_eq!(h, KeyHash::of(&[b"http", b"localhost", b"/a"]));
        assert_ne!(h, KeyHash::of(&[b"httplocalhost/b"]));
        assert_eq!(KeyHash::parse_hex(&h.hex()), Some(h));
        assert_eq!(KeyHash::from_parts(h.hi(), h.lo()), h);
        assert_eq!(
            KeyHash::of(&[b""]).hex(),
            "6c62272e07bb014262b821756295c58d"
        );
        assert_eq!(KeyHash::parse_hex("xyz"), None);
        assert_ne!(
            variant_hash(b"k", 1, b"gzip"),
            variant_hash(b"k", 2, b"gzip")
        );
    }
}

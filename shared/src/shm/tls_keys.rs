//! The TLS session-ticket keys, in an area appended to the region: written by the
//! master, read by every worker, so a ticket one worker issued opens on any other,
//! after a reload (same region) and after a binary upgrade (the new master attaches
//! to the region, keys and all).
//!
//! The master makes a key when there is none and rotates every [`ROTATION`]: the
//! key in force becomes `previous` (still opened, for one period) and a new random
//! `current` seals new tickets. Writers (two masters share the region during an
//! upgrade) take `seq` from even to odd with a compare-and-swap, so one rotates and
//! the other sees it done; readers retry while `seq` is odd or moved.
//!
//! The keys are secrets: the region file is mode 0640 and belongs to the master's
//! user; keep `shm_file` on a tmpfs (`/run`) so they never reach a disk.

use std::io::Read;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};
use std::time::Duration;

/// How often the master replaces the sealing key.
pub const ROTATION: Duration = Duration::from_secs(12 * 3600);

#[repr(C)]
pub struct TlsKeysArea {
    /// Odd while a master writes.
    pub seq: AtomicU64,
    /// Wall-clock ms when `current` was made (0: no key yet).
    pub rotated_ms: AtomicU64,
    /// Key ids (0: none); a new key's id is the last one's plus one.
    pub current_id: AtomicU32,
    pub previous_id: AtomicU32,
    pub current: [AtomicU64; 4],
    pub previous: [AtomicU64; 4],
}

/// One key as read out of the area.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key {
    pub id: u32,
    pub secret: [u8; 32],
}

/// The keys in force: `current` seals, both open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Keys {
    pub current: Option<Key>,
    pub previous: Option<Key>,
}

fn load(words: &[AtomicU64; 4]) -> [u8; 32] {
    let mut out = [0u8; 32];
    for (chunk, w) in out.chunks_exact_mut(8).zip(words) {
        chunk.copy_from_slice(&w.load(Relaxed).to_le_bytes());
    }
    out
}

fn store(words: &[AtomicU64; 4], secret: &[u8; 32]) {
    for (chunk, w) in secret.chunks_exact(8).zip(words) {
        w.store(
            u64::from_le_bytes(chunk.try_into().expect("8 bytes")),
            Relaxed,
        );
    }
}

/// 32 random bytes from the kernel.
fn random_secret() -> std::io::Result<[u8; 32]> {
    let mut secret = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut secret)?;
    Ok(secret)
}

/// The keys in force, or `None` if a writer kept the area busy for every try.
pub fn read(area: &TlsKeysArea) -> Option<Keys> {
    for _ in 0..64 {
        let before = area.seq.load(Acquire);
        if before % 2 == 1 {
            std::hint::spin_loop();
            continue;
        }
        let key = |id: u32, words: &[AtomicU64; 4]| {
            (id != 0).then(|| Key {
                id,
                secret: load(words),
            })
        };
        let keys = Keys {
            current: key(area.current_id.load(Relaxed), &area.current),
            previous: key(area.previous_id.load(Relaxed), &area.previous),
        };
        std::sync::atomic::fence(Acquire);
        if area.seq.load(Relaxed) == before {
            return Some(keys);
        }
    }
    None
}

/// Makes the first key, or rotates when `current` is older than `period` at `now_ms`.
/// Returns whether it changed the keys. A failure to get random bytes leaves the
/// keys as they are (and is returned, for the log).
pub fn rotate_if_due(area: &TlsKeysArea, now_ms: u64, period: Duration) -> std::io::Result<bool> {
    let rotated = area.rotated_ms.load(Acquire);
    let due = area.current_id.load(Relaxed) == 0
        || now_ms.saturating_sub(rotated) >= period.as_millis() as u64;
    if !due {
        return Ok(false);
    }
    let secret = random_secret()?;
    let seq = area.seq.load(Relaxed);
    if seq % 2 == 1
        || area
            .seq
            .compare_exchange(seq, seq + 1, Acquire, Relaxed)
            .is_err()
    {
        return Ok(false); // another master is rotating
    }
    // Under the write lock: check again (the other master may have just rotated).
    let changed = area.rotated_ms.load(Relaxed) == rotated;
    if changed {
        let current = area.current_id.load(Relaxed);
        if current != 0 {
            let words: [u64; 4] = std::array::from_fn(|i| area.current[i].load(Relaxed));
            for (w, v) in area.previous.iter().zip(words) {
                w.store(v, Relaxed);
            }
        }
        area.previous_id.store(current, Relaxed);
        store(&area.current, &secret);
        area.current_id
            .store(current.wrapping_add(1).max(1), Relaxed);
        area.rotated_ms.store(now_ms.max(1), Relaxed);
    }
    area.seq.store(seq + 2, Release);
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn area() -> Box<TlsKeysArea> {
        Box::new(TlsKeysArea {
            seq: AtomicU64::new(0),
            rotated_ms: AtomicU64::new(0),
            current_id: AtomicU32::new(0),
            previous_id: AtomicU32::new(0),
            current: Default::default(),
            previous: Default::default(),
        })
    }

    #[test]
    fn the_first_key_is_made_then_rotated_each_period_keeping_the_previous() {
        let a = area();
        assert_eq!(read(&a), Some(Keys::default()));
        let period = Duration::from_secs(60);
        assert!(rotate_if_due(&a, 1_000, period).unwrap());
        let first = read(&a).unwrap();
        let k1 = first.current.unwrap();
        assert_eq!((k1.id, first.previous), (1, None));
        assert_ne!(k1.secret, [0; 32]);
        // Not due yet: nothing changes.
        assert!(!rotate_if_due(&a, 30_000, period).unwrap());
        assert_eq!(read(&a).unwrap(), first);
        // Due: the current key moves to previous.
        assert!(rotate_if_due(&a, 61_000, period).unwrap());
        let second = read(&a).unwrap();
        assert_eq!(second.previous, Some(k1));
        let k2 = second.current.unwrap();
        assert_eq!(k2.id, 2);
        assert_ne!(k2.secret, k1.secret);
    }
}

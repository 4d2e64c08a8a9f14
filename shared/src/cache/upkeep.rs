//! The work on a zone that no request waits for: the loader (an index made anew is
//! filled from the body files on disk, so a restart or an upgrade keeps the cache),
//! the manager (entries unused for `inactive` removed, the least recently used
//! evicted while the zone is over `max_size`) and purge. One process of the daemon
//! does the loader's and the manager's work at a time: the holder of the index's
//! lease ([`take_lease`]), a worker's cache thread.

use super::entry::Meta;
use super::files::{self, OpenError, TEMP_SUFFIX};
use super::index::{counters, Index, Kind, SlotView};
use super::KeyHash;
use std::path::Path;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

/// A lease not renewed for this long is taken over (seconds).
pub const LEASE_FOR: u64 = 5;

fn monotonic_secs() -> u64 {
    crate::shm::monotonic_ms() / 1000
}

/// Takes or renews the zone's lease for `pid`: true if this process is the one to
/// do the loader's and manager's work now.
pub fn take_lease(index: &Index, pid: u32) -> bool {
    let now = monotonic_secs();
    let cell = &index.header.lease;
    let held = cell.load(Acquire);
    let holder = (held >> 32) as u32;
    let beat = held as u32;
    let mine = u64::from(pid) << 32 | u64::from(now as u32);
    let stale = (now as u32).wrapping_sub(beat) as u64 > LEASE_FOR;
    let free = held == 0 || holder == pid || stale || !crate::shm::process_alive(holder as i32);
    free && cell.compare_exchange(held, mine, Release, Relaxed).is_ok()
}

/// Gives the lease up (a worker that drains).
pub fn give_lease(index: &Index, pid: u32) {
    let held = index.header.lease.load(Acquire);
    if (held >> 32) as u32 == pid {
        let _ = index
            .header
            .lease
            .compare_exchange(held, 0, Release, Relaxed);
    }
}

/// What a loader pass found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Loaded {
    pub entries: u64,
    pub bytes: u64,
    /// Corrupt or foreign files removed, and files a writer left half way.
    pub removed: u64,
}

/// Fills `index` from the body files under `dir` (an index made anew). A file that
/// cannot be read as an entry is removed. Entries stored meanwhile by requests are
/// kept (a slot that holds a key already is left as it is).
pub fn load(dir: &Path, index: &Index) -> Loaded {
    let mut loaded = Loaded::default();
    for_each_file(dir, |path, hash| {
        let Some(hash) = hash else {
            let _ = std::fs::remove_file(path);
            loaded.removed += 1;
            return;
        };
        let meta = match std::fs::File::open(path)
            .map_err(OpenError::Io)
            .and_then(|f| files::open_file(f, None))
        {
            Ok(o) => o.meta,
            Err(OpenError::Corrupt(_)) => {
                let _ = std::fs::remove_file(path);
                loaded.removed += 1;
                return;
            }
            Err(_) => return,
        };
        if index.find(hash).is_some() {
            return;
        }
        let Some(r) = index.reserve(hash, meta.stored, 0) else {
            return;
        };
        if let Some(e) = r.evicted {
            files::remove(dir, e.hash);
        }
        let size = meta.header_len() as u64 + meta.body_len;
        if index.publish(r.slot, view_of(hash, &meta, size)).is_ok() {
            loaded.entries += 1;
            loaded.bytes += size;
        }
    });
    index.header.loaded.store(1, Release);
    loaded
}

/// The slot of an entry stored with `meta` (its file `size` bytes). A vary record's
/// `expires` holds its epoch instead (a record does not expire; a lookup learns the
/// epoch from the slot and reads the record's field names once per epoch).
pub fn view_of(hash: KeyHash, meta: &Meta, size: u64) -> SlotView {
    let vary = meta.is_vary_record();
    SlotView {
        kind: if vary { Kind::Vary } else { Kind::Entry },
        hash,
        stored: meta.stored,
        expires: if vary {
            meta.epoch
        } else {
            meta.stored.saturating_add(meta.ttl)
        },
        size,
        accessed: meta.stored,
    }
}

/// Calls `f` with each file under the zone's 256 folders and the hash its name
/// gives (`None`: a temporary or foreign name).
fn for_each_file(dir: &Path, mut f: impl FnMut(&Path, Option<KeyHash>)) {
    for sub in 0..=255u32 {
        let folder = dir.join(format!("{sub:02x}"));
        let Ok(entries) = std::fs::read_dir(&folder) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            let hash = if name.ends_with(TEMP_SUFFIX) {
                None
            } else {
                KeyHash::parse_hex(&name).filter(|h| h.0 & 0xff == u128::from(sub))
            };
            f(&e.path(), hash);
        }
    }
}

/// What a manager pass removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Managed {
    pub inactive: u64,
    pub evicted: u64,
}

/// One manager pass: entries unused for `inactive` seconds are removed, then the
/// least recently used while the zone holds more than `max_size` bytes.
pub fn manage(dir: &Path, index: &Index, max_size: u64, inactive: u64, now: u64) -> Managed {
    let mut done = Managed::default();
    let mut live: Vec<(u64, usize, KeyHash)> = Vec::new();
    let now_ms = crate::shm::monotonic_ms();
    for i in 0..index.slots.len() {
        let Some((_, v)) = index.read(i) else {
            continue;
        };
        if !matches!(v.kind, Kind::Entry | Kind::Vary) {
            continue;
        }
        if v.accessed.saturating_add(inactive) < now && index.lock_free(i, now_ms) {
            if index.remove(i, v.hash).is_some() {
                files::remove(dir, v.hash);
                done.inactive += 1;
            }
            continue;
        }
        live.push((v.accessed, i, v.hash));
    }
    if index.header.bytes.load(Relaxed) > max_size {
        live.sort_unstable();
        for (_, i, hash) in live {
            if index.header.bytes.load(Relaxed) <= max_size {
                break;
            }
            if index.lock_free(i, now_ms) && index.remove(i, hash).is_some() {
                files::remove(dir, hash);
                done.evicted += 1;
            }
        }
    }
    index.bump(counters::EXPIRED_REMOVED, done.inactive);
    index.bump(counters::EVICTIONS, done.evicted);
    done
}

/// What to purge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Purge<'a> {
    /// One key (and the variants of a response that varies).
    Key(&'a [u8]),
    /// Every key that starts so.
    Prefix(&'a [u8]),
}

/// Removes what `what` names from the index and the disk: every body file is read
/// (its key is only there). Returns how many entries went.
pub fn purge(dir: &Path, index: &Index, what: &Purge) -> u64 {
    let mut n = 0;
    for_each_file(dir, |path, hash| {
        let Some(hash) = hash else {
            return;
        };
        let Ok(o) = std::fs::File::open(path)
            .map_err(OpenError::Io)
            .and_then(|f| files::open_file(f, None))
        else {
            return;
        };
        let key = o.meta.key.as_slice();
        let hit = match what {
            Purge::Key(k) => key == *k,
            Purge::Prefix(p) => key.starts_with(p),
        };
        if !hit {
            return;
        }
        if let Some(found) = index.find(hash) {
            index.remove(found.slot, hash);
        }
        let _ = std::fs::remove_file(path);
        n += 1;
    });
    index.bump(counters::PURGED, n);
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::files::Writer;
    use crate::cache::index::tests::Owned;

    fn store(dir: &Path, index: &Index, key: &[u8], body: &[u8], stored: u64) -> KeyHash {
        let h = KeyHash::of(&[key]);
        let meta = Meta {
            status: 200,
            stored,
            ttl: 60,
            key: key.to_vec(),
            ..Meta::default()
        };
        let mut w = Writer::create(dir, h, meta.clone()).unwrap();
        w.write(body).unwrap();
        let size = w.finish().unwrap();
        let r = index.reserve(h, stored, 0).unwrap();
        let mut m = meta;
        m.body_len = body.len() as u64;
        index.publish(r.slot, view_of(h, &m, size)).unwrap();
        h
    }

    fn temp(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("forkd-upkeep-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_new_index_is_filled_from_the_files_and_damaged_ones_are_removed() {
        let dir = temp("load");
        let first = Owned::new(256);
        let a = store(&dir, &first.index(), b"a", b"aaaa", 100);
        let b = store(&dir, &first.index(), b"b", b"bb", 100);
        // A file cut short, and a writer's leftover.
        let bpath = files::body_path(&dir, b);
        let len = std::fs::metadata(&bpath).unwrap().len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&bpath)
            .unwrap()
            .set_len(len - 1)
            .unwrap();
        let left = files::folder(&dir, a).join(format!("{}.1.1{TEMP_SUFFIX}", a.hex()));
        std::fs::write(&left, b"half").unwrap();
        let fresh = Owned::new(256);
        let ix = fresh.index();
        let l = load(&dir, &ix);
        assert_eq!((l.entries, l.removed), (1, 2));
        assert_eq!(ix.find(a).unwrap().view.expires, 160);
        assert!(ix.find(b).is_none());
        assert!(!bpath.exists() && !left.exists());
        assert_eq!(ix.header.loaded.load(Relaxed), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_manager_removes_inactive_entries_then_evicts_the_least_recently_used() {
        let dir = temp("manage");
        let o = Owned::new(256);
        let ix = o.index();
        let old = store(&dir, &ix, b"old", b"x", 10);
        let keys: Vec<KeyHash> = (0..4u8)
            .map(|i| store(&dir, &ix, &[b'k', i], &[0u8; 1000], 1000 + u64::from(i)))
            .collect();
        let total = ix.header.bytes.load(Relaxed);
        let each = (total - ix.find(old).unwrap().view.size) / 4;
        // inactive 600 s at now 1005: `old` (used at 10) goes; then two evicted.
        let m = manage(&dir, &ix, each * 2, 600, 1005);
        assert_eq!(
            m,
            Managed {
                inactive: 1,
                evicted: 2
            }
        );
        assert!(ix.find(old).is_none() && !files::body_path(&dir, old).exists());
        assert!(ix.find(keys[0]).is_none() && ix.find(keys[1]).is_none());
        assert!(ix.find(keys[2]).is_some() && ix.find(keys[3]).is_some());
        assert!(ix.header.bytes.load(Relaxed) <= each * 2);
        assert_eq!(ix.counter(counters::EVICTIONS), 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn purge_by_key_and_by_prefix_removes_entries_and_their_files() {
        let dir = temp("purge");
        let o = Owned::new(256);
        let ix = o.index();
        let a = store(&dir, &ix, b"http/a/1", b"1", 1);
        let b = store(&dir, &ix, b"http/a/2", b"2", 1);
        let c = store(&dir, &ix, b"http/b/1", b"3", 1);
        assert_eq!(purge(&dir, &ix, &Purge::Key(b"http/a/1")), 1);
        assert!(ix.find(a).is_none() && ix.find(b).is_some());
        assert_eq!(purge(&dir, &ix, &Purge::Prefix(b"http/")), 2);
        assert!(ix.find(b).is_none() && ix.find(c).is_none());
        assert!(!files::body_path(&dir, c).exists());
        assert_eq!(ix.counter(counters::PURGED), 3);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn one_process_holds_the_lease_until_it_gives_it_up() {
        let o = Owned::new(64);
        let ix = o.index();
        let me = std::process::id();
        assert!(take_lease(&ix, me));
        assert!(take_lease(&ix, me), "renewed");
        assert!(
            !take_lease(&ix, 1),
            "pid 1 runs, but the lease is fresh and mine"
        );
        give_lease(&ix, me);
        assert!(take_lease(&ix, 1));
    }
}

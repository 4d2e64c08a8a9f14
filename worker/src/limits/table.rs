//! The per-client table in the region ([`LimitsArea`]): finding a client's entry,
//! taking a token from its bucket, counting its connections. Every worker updates the
//! same entries, so every update is a compare-and-swap on one atomic.
//!
//! Why compare-and-swap here when the stats keep to one writer per cell: the stats can
//! be split per worker and summed when read; a limit cannot (a client on four workers
//! would get four limits). The cost is bounded: one CAS per rule per request, one
//! `fetch_add`/`fetch_sub` per connection, contended only when one client's requests
//! reach several workers at the same instant, and retried a bounded number of times
//! before the request is admitted (a limit fails open, never blocks). No lock is taken,
//! so a worker killed mid-update cannot wedge the others.
//!
//! Bounded memory: a key probes [`PROBE`] entries from its hash. When all are taken, the
//! least recently used one without connections is evicted: its client starts again
//! with a full bucket. Approximate under pressure, by design.

use super::bucket::{self, Take};
use forkd_shared::shm::limits::{LimitEntry, LimitsArea};
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed};

/// Entries a key may live in, from its hash onwards.
pub const PROBE: usize = 8;
/// Attempts at a contended compare-and-swap before giving up (and admitting).
const CAS_TRIES: usize = 32;

/// The table over the region's entries (or a test's).
pub struct Table<'a> {
    entries: &'a [LimitEntry],
    seed: u64,
}

/// Where a connection was counted, to be uncounted when it closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub index: u32,
}

/// Over `conn_per_ip`: the connections already open under the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooMany(pub u32);

impl<'a> Table<'a> {
    /// The region's table; picks its hash seed if no worker has yet.
    pub fn of(area: &'a LimitsArea) -> Table<'a> {
        let mut seed = area.seed.load(Acquire);
        if seed == 0 {
            use std::hash::BuildHasher;
            let mine =
                std::collections::hash_map::RandomState::new().hash_one(std::process::id()) | 1;
            seed = match area.seed.compare_exchange(0, mine, AcqRel, Acquire) {
                Ok(_) => mine,
                Err(theirs) => theirs,
            };
        }
        Table {
            entries: &area.entries,
            seed,
        }
    }

    pub fn new(entries: &'a [LimitEntry], seed: u64) -> Table<'a> {
        Table { entries, seed }
    }

    /// The key of `value` under rule `rule` (which names the server, route and rule,
    /// so two rules never share a bucket). Never 0.
    pub fn key(&self, rule: u64, value: &[u8]) -> u64 {
        // FNV-1a over the seed, the rule and the value, then a splitmix finaliser.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ self.seed;
        for b in rule.to_le_bytes().iter().chain(value) {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h ^= h >> 30;
        h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h ^= h >> 27;
        h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
        h ^= h >> 31;
        h.max(1)
    }

    /// The entry of `key`: found, claimed free, or taken from the least recently
    /// used entry without connections. None when every entry in reach holds
    /// connections (the caller admits).
    fn entry(&self, key: u64, now_s: u32) -> Option<usize> {
        let n = self.entries.len();
        let start = (key as usize) % n;
        for _ in 0..2 {
            let mut victim: Option<(usize, u64, u32)> = None;
            for i in 0..PROBE.min(n) {
                let index = (start + i) % n;
                let e = &self.entries[index];
                let k = e.key.load(Acquire);
                if k == key {
                    e.seen_s.store(now_s, Relaxed);
                    return Some(index);
                }
                if k == 0 {
                    if e.key.compare_exchange(0, key, AcqRel, Acquire).is_ok() {
                        e.seen_s.store(now_s, Relaxed);
                        return Some(index);
                    }
                    continue;
                }
                let seen = e.seen_s.load(Relaxed);
                if e.conns.load(Relaxed) == 0 && victim.is_none_or(|(_, _, s)| seen < s) {
                    victim = Some((index, k, seen));
                }
            }
            if let Some((index, old, _)) = victim {
                let e = &self.entries[index];
                if e.key.compare_exchange(old, key, AcqRel, Acquire).is_ok() {
                    e.tat.store(0, Relaxed);
                    e.seen_s.store(now_s, Relaxed);
                    return Some(index);
                }
            }
            // Lost a race for the victim: look again once.
        }
        None
    }

    /// One token for `key` at `now_us` (CLOCK_MONOTONIC µs).
    pub fn take(&self, key: u64, now_us: u64, interval_us: u64, burst: u32) -> Take {
        let Some(index) = self.entry(key, (now_us / 1_000_000) as u32) else {
            return Take::Admit { tat: 0 };
        };
        let tat = &self.entries[index].tat;
        let mut current = tat.load(Acquire);
        for _ in 0..CAS_TRIES {
            match bucket::take(current, now_us, interval_us, burst) {
                over @ Take::Over { .. } => return over,
                admit @ Take::Admit { tat: next } => {
                    match tat.compare_exchange_weak(current, next, AcqRel, Acquire) {
                        Ok(_) => return admit,
                        Err(seen) => current = seen,
                    }
                }
            }
        }
        Take::Admit { tat: current }
    }

    /// Counts a connection under `key` unless `limit` are open already.
    pub fn hold(&self, key: u64, limit: u32, now_s: u32) -> Result<Option<Held>, TooMany> {
        let Some(index) = self.entry(key, now_s) else {
            return Ok(None);
        };
        let e = &self.entries[index];
        let before = e.conns.fetch_add(1, AcqRel);
        if e.key.load(Acquire) != key {
            // Evicted between finding it and counting: not ours to count in.
            e.conns.fetch_sub(1, AcqRel);
            return Ok(None);
        }
        if before >= limit {
            e.conns.fetch_sub(1, AcqRel);
            return Err(TooMany(before));
        }
        Ok(Some(Held {
            index: index as u32,
        }))
    }

    /// Uncounts a connection `hold` counted.
    pub fn release(&self, held: Held) {
        let e = &self.entries[held.index as usize];
        // An entry holding connections is never evicted, so it is still the key's.
        let _ = e.conns.fetch_update(AcqRel, Acquire, |n| n.checked_sub(1));
    }

    /// Connections counted under `key` (for tests and stats).
    pub fn conns(&self, key: u64) -> u32 {
        self.entries
            .iter()
            .find(|e| e.key.load(Relaxed) == key)
            .map_or(0, |e| e.conns.load(Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, AtomicU64};

    fn entries(n: usize) -> Vec<LimitEntry> {
        (0..n)
            .map(|_| LimitEntry {
                key: AtomicU64::new(0),
                tat: AtomicU64::new(0),
                conns: AtomicU32::new(0),
                seen_s: AtomicU32::new(0),
            })
            .collect()
    }

    const T0: u64 = 100_000_000;

    #[test]
    fn one_key_one_bucket_whoever_asks() {
        let e = entries(64);
        // Two "workers" with their own view of the same memory.
        let (a, b) = (Table::new(&e, 7), Table::new(&e, 7));
        let key = a.key(1, b"192.0.2.1");
        assert_eq!(key, b.key(1, b"192.0.2.1"));
        let mut admitted = 0;
        for i in 0..100 {
            let t = if i % 2 == 0 { &a } else { &b };
            if matches!(t.take(key, T0 + i, 1_000_000, 10), Take::Admit { .. }) {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 10);
    }

    #[test]
    fn keys_differ_by_rule_and_value_and_seed() {
        let e = entries(8);
        let t = Table::new(&e, 7);
        assert_ne!(t.key(1, b"a"), t.key(2, b"a"));
        assert_ne!(t.key(1, b"a"), t.key(1, b"b"));
        assert_ne!(t.key(1, b"a"), Table::new(&e, 8).key(1, b"a"));
    }

    #[test]
    fn connections_are_counted_up_to_the_limit_and_released() {
        let e = entries(64);
        let t = Table::new(&e, 1);
        let key = t.key(0, b"198.51.100.7");
        let a = t.hold(key, 2, 1).unwrap().unwrap();
        let b = t.hold(key, 2, 1).unwrap().unwrap();
        assert_eq!(t.hold(key, 2, 1), Err(TooMany(2)));
        t.release(a);
        let c = t.hold(key, 2, 1).unwrap().unwrap();
        t.release(b);
        t.release(c);
        assert_eq!(t.conns(key), 0);
    }

    #[test]
    fn a_full_table_evicts_the_least_recently_used_idle_entry() {
        let e = entries(PROBE);
        let t = Table::new(&e, 3);
        let keys: Vec<u64> = (0..PROBE as u64)
            .map(|i| t.key(9, &i.to_le_bytes()))
            .collect();
        for (i, &k) in keys.iter().enumerate() {
            // Each drains its bucket, at time i (seconds).
            let now = T0 + i as u64 * 1_000_000;
            assert!(matches!(
                t.take(k, now, 3_600_000_000, 1),
                Take::Admit { .. }
            ));
        }
        // The first holds a connection: never evicted.
        let held = t.hold(keys[0], 10, 50).unwrap().unwrap();
        let newcomer = t.key(9, b"new");
        assert!(matches!(
            t.take(newcomer, T0 + 60_000_000, 3_600_000_000, 1),
            Take::Admit { .. }
        ));
        // keys[1] was the least recently used without connections: it was evicted and
        // starts again with a full bucket; the others still have theirs drained.
        assert!(matches!(
            t.take(keys[0], T0 + 61_000_000, 3_600_000_000, 1),
            Take::Over { .. }
        ));
        assert!(matches!(
            t.take(keys[2], T0 + 61_000_000, 3_600_000_000, 1),
            Take::Over { .. }
        ));
        assert!(e.iter().all(|x| x.key.load(Relaxed) != keys[1]));
        t.release(held);
    }

    #[test]
    fn when_every_entry_in_reach_holds_connections_the_client_is_admitted() {
        let e = entries(PROBE);
        let t = Table::new(&e, 3);
        for i in 0..PROBE as u64 {
            t.hold(t.key(0, &i.to_le_bytes()), 10, 1).unwrap().unwrap();
        }
        let k = t.key(0, b"late");
        assert_eq!(t.hold(k, 1, 2), Ok(None));
        assert!(matches!(t.take(k, T0, 1_000_000, 1), Take::Admit { .. }));
    }

    #[test]
    fn concurrent_takers_never_admit_more_than_the_burst() {
        let e: &'static [LimitEntry] = Box::leak(entries(64).into_boxed_slice());
        let key = Table::new(e, 5).key(1, b"x");
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(move || {
                    let t = Table::new(e, 5);
                    (0..1000)
                        .filter(|_| {
                            matches!(t.take(key, T0, 1_000_000_000, 25), Take::Admit { .. })
                        })
                        .count()
                })
            })
            .collect();
        let total: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(total, 25);
    }
}

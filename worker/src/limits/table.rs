//! The per-client table in the region ([`LimitsArea`]): finding a client's entry,
//! taking a token from its bucket, counting its connections. Every worker updates the
//! same entries, so every update is a compare-and-swap on one atomic.
//!
//! Why compare-and-swap here when the stats keep to one writer per cell: the stats can
//! be split per worker and summed when read; a limit cannot (a client on four workers
//! would get four limits). The cost is bounded: one CAS per rule per request, one
//! `fetch_add`/`fetch_sub` per connection (and a plain store in this worker's own
//! journal row), contended only when one client's requests reach several workers at
//! the same instant. A bucket's CAS is retried a bounded number of times before the
//! request is admitted (a rate limit fails open, never blocks). No lock is taken, so a
//! worker killed mid-update cannot wedge the others.
//!
//! **Whose connections.** Each connection counted in an entry is also counted in this
//! worker's row of the journal (`shm::limits::HeldArea`), so the connections of a
//! worker that dies without uncounting them (a crash, `SIGKILL`, the exit at
//! `drain_timeout`) are released when its row is retired (`shm::limits::release_row`:
//! by the master's fold, or by the next worker given the row, [`adopt_row`]). The
//! order of the two counts is chosen so a kill between them costs at worst one
//! connection over the limit for a while, never one counted for ever: the journal is
//! counted before the entry and uncounted after it.
//!
//! Bounded memory: a key probes [`PROBE`] entries from its hash. When all are taken, the
//! least recently used one without connections is evicted: its client starts again
//! with a full bucket (approximate under pressure, by design). When every entry in
//! reach holds connections, a new connection under `conn_per_ip` is refused
//! ([`Refused::TableFull`]: fail closed, as nginx's `limit_conn` does when its zone is
//! full), never admitted uncounted: an entry with live connections cannot be evicted
//! without its client's limit silently ending, and their uncounting then landing on
//! another client's entry. [`PROBE`] is wide enough that this takes a table nearly
//! full of clients holding connections: with a share `f` of the entries live, a new
//! client finds none free in its reach with probability `f^32` (0.1% at 80%, 3% at
//! 90%). A rate rule with no entry in reach (every one holding connections) is not
//! applied to that request. (Builds before the journal probed 8: while one serves
//! beside this one during a binary upgrade, a key it cannot find past its 8 may get a
//! second entry, and its client twice its limit until the old workers leave.)

use super::bucket::{self, Take};
use forkd_shared::shm::layout::Layout;
use forkd_shared::shm::limits::{release_row, LimitEntry, LimitsArea};
use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};

/// Entries a key may live in, from its hash onwards. Every entry is scanned only for a
/// key the table does not have yet (a new client); a known one stops at its entry.
pub const PROBE: usize = 32;
/// Attempts at a contended compare-and-swap before giving up (and admitting).
const CAS_TRIES: usize = 32;
/// Attempts at counting a connection whose entry another client's takes meanwhile.
const HOLD_TRIES: usize = 4;

/// The table over the region's entries (or a test's), as one worker row sees it.
pub struct Table<'a> {
    entries: &'a [LimitEntry],
    /// This worker's row of the journal: its share of each entry's connections.
    mine: &'a [AtomicU32],
    seed: u64,
}

/// Where a connection was counted, to be uncounted when it closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub index: u32,
}

/// Why a connection is not counted (and so not admitted, in `Enforce` mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Over `conn_per_ip`: the connections already open under the key.
    TooMany(u32),
    /// Every entry the key may use holds other clients' connections.
    TableFull,
}

/// At a worker's start: connections the row's previous worker left counted (its row
/// is released when the master folds it, unless another master held the fold lock)
/// are released. Returns how many there were.
pub fn adopt_row(layout: &Layout, row: usize) -> u64 {
    release_row(&layout.limits, &layout.limits_held, row)
}

impl<'a> Table<'a> {
    /// The region's table as worker row `row` uses it; picks the hash seed if no
    /// worker has yet.
    pub fn of(layout: &'a Layout, row: usize) -> Table<'a> {
        let area: &LimitsArea = &layout.limits;
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
        Table::new(&area.entries, &layout.limits_held.rows[row].0, seed)
    }

    /// `mine`: the journal row, as long as `entries`.
    pub fn new(entries: &'a [LimitEntry], mine: &'a [AtomicU32], seed: u64) -> Table<'a> {
        debug_assert_eq!(entries.len(), mine.len());
        Table {
            entries,
            mine,
            seed,
        }
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
    pub fn hold(&self, key: u64, limit: u32, now_s: u32) -> Result<Held, Refused> {
        for _ in 0..HOLD_TRIES {
            let index = self.entry(key, now_s).ok_or(Refused::TableFull)?;
            let (e, mine) = (&self.entries[index], &self.mine[index]);
            // The journal first: killed before the entry's count, the row's release
            // takes one the entry never got (saturating), rather than leaving one.
            mine.store(mine.load(Relaxed) + 1, Release);
            let before = e.conns.fetch_add(1, AcqRel);
            if e.key.load(Acquire) != key {
                // Evicted between finding it and counting: not ours to count in.
                self.uncount(index);
                continue;
            }
            if before >= limit {
                self.uncount(index);
                return Err(Refused::TooMany(before));
            }
            return Ok(Held {
                index: index as u32,
            });
        }
        Err(Refused::TableFull)
    }

    /// Uncounts a connection `hold` counted.
    pub fn release(&self, held: Held) {
        // An entry holding connections is never evicted, so it is still the key's.
        self.uncount(held.index as usize);
    }

    /// The entry's count, then the journal's (the reverse of `hold`'s order).
    fn uncount(&self, index: usize) {
        let _ = self.entries[index]
            .conns
            .fetch_update(AcqRel, Acquire, |n| n.checked_sub(1));
        let mine = &self.mine[index];
        mine.store(mine.load(Relaxed).saturating_sub(1), Release);
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
    use std::sync::atomic::AtomicU64;

    /// A test's table memory: `n` entries and one journal row per "worker".
    struct Mem {
        entries: Vec<LimitEntry>,
        rows: Vec<Vec<AtomicU32>>,
    }

    fn mem(n: usize, workers: usize) -> Mem {
        Mem {
            entries: (0..n)
                .map(|_| LimitEntry {
                    key: AtomicU64::new(0),
                    tat: AtomicU64::new(0),
                    conns: AtomicU32::new(0),
                    seen_s: AtomicU32::new(0),
                })
                .collect(),
            rows: (0..workers)
                .map(|_| (0..n).map(|_| AtomicU32::new(0)).collect())
                .collect(),
        }
    }

    impl Mem {
        fn table(&self, worker: usize, seed: u64) -> Table<'_> {
            Table::new(&self.entries, &self.rows[worker], seed)
        }
    }

    const T0: u64 = 100_000_000;

    #[test]
    fn one_key_one_bucket_whoever_asks() {
        let m = mem(64, 2);
        // Two "workers" with their own view of the same memory.
        let (a, b) = (m.table(0, 7), m.table(1, 7));
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
        let m = mem(8, 1);
        let t = m.table(0, 7);
        assert_ne!(t.key(1, b"a"), t.key(2, b"a"));
        assert_ne!(t.key(1, b"a"), t.key(1, b"b"));
        assert_ne!(t.key(1, b"a"), m.table(0, 8).key(1, b"a"));
    }

    #[test]
    fn connections_are_counted_up_to_the_limit_and_released() {
        let m = mem(64, 1);
        let t = m.table(0, 1);
        let key = t.key(0, b"198.51.100.7");
        let a = t.hold(key, 2, 1).unwrap();
        let b = t.hold(key, 2, 1).unwrap();
        assert_eq!(t.hold(key, 2, 1), Err(Refused::TooMany(2)));
        t.release(a);
        let c = t.hold(key, 2, 1).unwrap();
        t.release(b);
        t.release(c);
        assert_eq!(t.conns(key), 0);
        assert!(m.rows[0].iter().all(|w| w.load(Relaxed) == 0));
    }

    #[test]
    fn each_worker_journals_its_own_share_of_a_clients_connections() {
        let m = mem(64, 3);
        let (a, b) = (m.table(0, 1), m.table(2, 1));
        let key = a.key(0, b"203.0.113.5");
        let held_a = [a.hold(key, 5, 1).unwrap(), a.hold(key, 5, 1).unwrap()];
        let held_b = b.hold(key, 5, 1).unwrap();
        assert_eq!(a.conns(key), 3);
        let i = held_a[0].index as usize;
        assert_eq!(held_b.index as usize, i, "one entry for the client");
        let share = |w: usize| m.rows[w][i].load(Relaxed);
        assert_eq!((share(0), share(1), share(2)), (2, 0, 1));
        // A refused connection leaves no share behind.
        let c = m.table(1, 1);
        assert_eq!(
            (c.hold(key, 3, 1), share(1), c.conns(key)),
            (Err(Refused::TooMany(3)), 0, 3)
        );
        a.release(held_a[1]);
        assert_eq!((share(0), a.conns(key)), (1, 2));
    }

    #[test]
    fn a_full_table_evicts_the_least_recently_used_idle_entry() {
        let m = mem(PROBE, 1);
        let t = m.table(0, 3);
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
        let held = t.hold(keys[0], 10, 500).unwrap();
        let newcomer = t.key(9, b"new");
        assert!(matches!(
            t.take(newcomer, T0 + 600_000_000, 3_600_000_000, 1),
            Take::Admit { .. }
        ));
        // keys[1] was the least recently used without connections: it was evicted and
        // starts again with a full bucket; the others still have theirs drained.
        assert!(matches!(
            t.take(keys[0], T0 + 601_000_000, 3_600_000_000, 1),
            Take::Over { .. }
        ));
        assert!(matches!(
            t.take(keys[2], T0 + 601_000_000, 3_600_000_000, 1),
            Take::Over { .. }
        ));
        assert!(m.entries.iter().all(|x| x.key.load(Relaxed) != keys[1]));
        t.release(held);
    }

    #[test]
    fn when_every_entry_in_reach_holds_connections_a_new_client_is_refused() {
        let m = mem(PROBE, 1);
        let t = m.table(0, 3);
        let held: Vec<Held> = (0..PROBE as u64)
            .map(|i| t.hold(t.key(0, &i.to_le_bytes()), 10, 1).unwrap())
            .collect();
        let k = t.key(0, b"late");
        // Fail closed: not admitted uncounted (that was an unlimited client).
        assert_eq!(t.hold(k, 1, 2), Err(Refused::TableFull));
        // A rate rule cannot keep a bucket for it: not applied.
        assert!(matches!(t.take(k, T0, 1_000_000, 1), Take::Admit { .. }));
        // One connection closes: its entry is idle, evictable, and the newcomer's.
        t.release(held[5]);
        let h = t.hold(k, 1, 3).unwrap();
        assert_eq!(t.conns(k), 1);
        assert_eq!(t.hold(k, 1, 3), Err(Refused::TooMany(1)));
        t.release(h);
    }

    #[test]
    fn the_row_of_a_dead_worker_is_released_and_only_its_share() {
        let (_tmp, region) = crate::test_region::region("limits-adopt");
        let l = region.layout();
        let (dead, alive) = (Table::of(l, 3), Table::of(l, 4));
        let client = dead.key(0, b"127.0.0.1");
        let other = dead.key(0, b"192.0.2.9");
        // The dead worker held two of the client's connections and one of another's
        // (its process ended without releasing them); a live worker holds one.
        for _ in 0..2 {
            dead.hold(client, 3, 1).unwrap();
        }
        dead.hold(other, 3, 1).unwrap();
        let live = alive.hold(client, 3, 1).unwrap();
        assert_eq!(alive.hold(client, 3, 1), Err(Refused::TooMany(3)));
        // The master folds row 3 (or the next worker of the row adopts it).
        assert_eq!(adopt_row(l, 3), 3);
        assert_eq!((alive.conns(client), alive.conns(other)), (1, 0));
        assert_eq!(adopt_row(l, 3), 0, "released once");
        let again = alive.hold(client, 3, 1).unwrap();
        alive.release(live);
        alive.release(again);
        assert_eq!(alive.conns(client), 0);
    }

    #[test]
    fn concurrent_takers_never_admit_more_than_the_burst() {
        let m: &'static Mem = Box::leak(Box::new(mem(64, 4)));
        let key = m.table(0, 5).key(1, b"x");
        let threads: Vec<_> = (0..4)
            .map(|w| {
                std::thread::spawn(move || {
                    let t = m.table(w, 5);
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

    #[test]
    fn concurrent_holders_never_exceed_the_limit_and_journal_exactly() {
        let m: &'static Mem = Box::leak(Box::new(mem(64, 4)));
        let key = m.table(0, 5).key(1, b"x");
        let threads: Vec<_> = (0..4)
            .map(|w| {
                std::thread::spawn(move || {
                    let t = m.table(w, 5);
                    let mut mine = Vec::new();
                    for i in 0..2000 {
                        if let Ok(h) = t.hold(key, 10, 1) {
                            mine.push(h);
                        }
                        if i % 3 == 0 {
                            if let Some(h) = mine.pop() {
                                t.release(h);
                            }
                        }
                    }
                    mine.len() as u32
                })
            })
            .collect();
        let kept: Vec<u32> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert!(kept.iter().sum::<u32>() <= 10, "{kept:?} over the limit");
        let index = m
            .entries
            .iter()
            .position(|e| e.key.load(Relaxed) == key)
            .unwrap();
        assert_eq!(
            m.entries[index].conns.load(Relaxed),
            kept.iter().sum::<u32>()
        );
        for (w, k) in kept.iter().enumerate() {
            assert_eq!(m.rows[w][index].load(Relaxed), *k, "worker {w}'s share");
        }
    }
}

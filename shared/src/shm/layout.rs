//! The shared-memory layout, version [`LAYOUT_VERSION`]. Every field is an atomic, so
//! an all-zero file is a valid empty region and any process may read any field at any
//! time without undefined behaviour.
//!
//! ```text
//! Layout
//!  ├── Header         magic, version, master pid, start time, config generation,
//!  │                  fold_seq (odd while the master folds an exited worker)
//!  ├── MasterStats    respawns, last respawn reason, reloads ok / failed, last error
//!  ├── SystemStats    ListenOverflows, per-listener accept-queue depth
//!  ├── retired        counters of exited workers, so totals never go backwards
//!  ├── SnapshotArea   the published configuration (reload)
//!  ├── slots[256]     one cache-line aligned WorkerSlot per live worker,
//!  │                  written only by that worker (the master resets it)
//!  ├── limits         per-client limit entries, shared by the workers (see `limits`:
//!  │                  the one area with many writers, updated by compare-and-swap)
//!  ├── upstreams      appended area (`upstream`): per upstream server, per worker
//!  ├── health         appended area (`health`): the checks' lease, per upstream
//!  │                  server its verdict and its resolved addresses
//!  ├── overload       appended area (`overload`): per upstream group (limit, in
//!  │                  flight over all workers), per worker row (latency samples)
//!  ├── upstream_state appended area (`upstream_state`): per upstream server, shared
//!  │                  by the workers (in flight, passive health)
//!  ├── tls_keys       appended area (`tls_keys`): session-ticket keys, master-written
//!  ├── tls_certs      appended area (`tls_certs`): certificates in force, their expiry
//!  └── limits_held    appended area (`limits`): per worker row, the connections it
//!                     counted under each limits entry (released when the row retires)
//! ```
//!
//! Growing: an area is appended at the end, never inserted, so every offset of an
//! older build stays where it was. A region written by a build without the last area
//! is shorter than [`Layout`] (`header.region_size` says how long); a master of this
//! build attaching to it extends the file (zero-filled: the new area starts empty)
//! before mapping it, and the older build never looks past its own end. [`LEGACY_SIZE`]:
//! the size of a version-2 region without the upstream area.
//!
//! Writers use relaxed loads and stores: each counter has exactly one writer (its worker,
//! or the master for the master's and retired fields), so a read-modify-write needs no
//! locked instruction.

use super::counters::{Counter, COUNTER_CELLS, NAME_BYTES};
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, AtomicU8, Ordering::Relaxed};

pub const MAGIC: u64 = u64::from_le_bytes(*b"FORKDSHM");
pub const LAYOUT_VERSION: u32 = 2;
pub use crate::capacity::MAX_SLOTS;
pub const MAX_LISTENERS: usize = 32;
/// Bytes of configuration text the snapshot area holds.
pub const SNAPSHOT_BYTES: usize = 256 * 1024;

/// Histogram buckets: exact below 16 µs, then 16 per power of two up to 2^36 µs, so a
/// bucket's midpoint is within 1/32 (3.1%) of any value in it.
pub const BUCKETS: usize = 16 + 32 * 16;

/// Adds `n` to a counter this process alone writes.
#[inline]
pub fn bump(counter: &AtomicU64, n: u64) {
    counter.store(counter.load(Relaxed).wrapping_add(n), Relaxed);
}

/// The bucket a latency of `us` microseconds falls in.
#[inline]
pub fn bucket_of(us: u64) -> usize {
    if us < 16 {
        return us as usize;
    }
    let e = 63 - us.leading_zeros() as usize; // >= 4
    if e > 35 {
        return BUCKETS - 1;
    }
    let sub = ((us >> (e - 4)) & 15) as usize;
    16 + (e - 4) * 16 + sub
}

/// `[low, high)` microseconds of bucket `i`.
pub fn bucket_bounds(i: usize) -> (u64, u64) {
    if i < 16 {
        return (i as u64, i as u64 + 1);
    }
    let e = (i - 16) / 16 + 4;
    let sub = ((i - 16) % 16) as u64;
    ((16 + sub) << (e - 4), (17 + sub) << (e - 4))
}

#[repr(C)]
pub struct Histogram {
    pub buckets: [AtomicU64; BUCKETS],
    pub sum_us: AtomicU64,
    pub count: AtomicU64,
}

impl Histogram {
    #[inline]
    pub fn record(&self, us: u64) {
        bump(&self.buckets[bucket_of(us)], 1);
        bump(&self.sum_us, us);
        bump(&self.count, 1);
    }
}

/// Counters that only grow (per worker, and retired): one cell per counter of the
/// table in `counters` (its id is the cell number), spare cells for counters later
/// builds add, and the latency histogram.
#[repr(C)]
pub struct Counters {
    pub cells: [AtomicU64; COUNTER_CELLS],
    pub latency: Histogram,
}

/// Every 64-bit word of a [`Counters`] block, numbered `0..WORDS` in a fixed order:
/// the cells, the histogram's buckets, its sum and its count. Folding and zeroing go
/// word by word in this order (the fold's journal records a word number).
pub const WORDS: usize = COUNTER_CELLS + BUCKETS + 2;

impl Counters {
    #[inline]
    pub fn get(&self, c: Counter) -> &AtomicU64 {
        &self.cells[c.cell()]
    }

    /// Adds `n` to counter `c` (this process being the row's only writer).
    #[inline]
    pub fn bump(&self, c: Counter, n: u64) {
        bump(self.get(c), n);
    }

    /// Word `i` of the block (see [`WORDS`]).
    pub fn word(&self, i: usize) -> &AtomicU64 {
        if i < COUNTER_CELLS {
            &self.cells[i]
        } else if i < COUNTER_CELLS + BUCKETS {
            &self.latency.buckets[i - COUNTER_CELLS]
        } else if i == COUNTER_CELLS + BUCKETS {
            &self.latency.sum_us
        } else {
            &self.latency.count
        }
    }

    /// Every word, in [`WORDS`] order.
    pub fn words(&self) -> impl Iterator<Item = &AtomicU64> {
        (0..WORDS).map(|i| self.word(i))
    }
}

/// Worker states in a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerState {
    Empty = 0,
    Starting = 1,
    Serving = 2,
    Draining = 3,
    Exited = 4,
}

impl WorkerState {
    pub fn from_u32(v: u32) -> WorkerState {
        match v {
            1 => WorkerState::Starting,
            2 => WorkerState::Serving,
            3 => WorkerState::Draining,
            4 => WorkerState::Exited,
            _ => WorkerState::Empty,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            WorkerState::Empty => "empty",
            WorkerState::Starting => "starting",
            WorkerState::Serving => "serving",
            WorkerState::Draining => "draining",
            WorkerState::Exited => "exited",
        }
    }
}

#[repr(C, align(64))]
pub struct WorkerSlot {
    pub pid: AtomicI32,
    /// The worker's slot number (CPU, reuseport queue), not this slot's index.
    pub worker: AtomicU32,
    pub state: AtomicU32,
    /// Upgraded connections (WebSocket tunnels) open now, sampled once a second. Was
    /// padding: builds without tunnels left it 0, so the layout version stays.
    pub tunnels_open: AtomicU32,
    /// Configuration generation this worker serves.
    pub generation: AtomicU64,
    /// Wall-clock start, ms since the epoch.
    pub started_ms: AtomicU64,
    /// CLOCK_MONOTONIC ms of the worker's last loop turn.
    pub heartbeat_ms: AtomicU64,
    pub connections_active: AtomicU64,
    pub connections_reading: AtomicU64,
    pub connections_writing: AtomicU64,
    pub connections_idle: AtomicU64,
    pub open_fds: AtomicU64,
    pub rss_bytes: AtomicU64,
    pub counters: Counters,
}

/// A short text (reasons, errors, addresses) written by one writer under a sequence
/// count, so readers never take a torn one.
#[repr(C)]
pub struct Text<const N: usize> {
    seq: AtomicU64,
    len: AtomicU32,
    bytes: [AtomicU8; N],
}

impl<const N: usize> Text<N> {
    /// Writes `text`, cut to the capacity at a character boundary.
    pub fn set(&self, text: &str) {
        let mut end = text.len().min(N);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        // Odd while writing; already odd only if a writer died mid-write.
        let seq = self.seq.load(Relaxed) | 1;
        self.seq.store(seq, Relaxed);
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        for (slot, b) in self.bytes.iter().zip(&text.as_bytes()[..end]) {
            slot.store(*b, Relaxed);
        }
        self.len.store(end as u32, Relaxed);
        self.seq
            .store(seq + 1, std::sync::atomic::Ordering::Release);
    }

    /// The text; empty if it stayed mid-write for a bounded number of readings.
    pub fn get(&self) -> String {
        for _ in 0..1000 {
            let before = self.seq.load(std::sync::atomic::Ordering::Acquire);
            if before % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let len = (self.len.load(Relaxed) as usize).min(N);
            let bytes: Vec<u8> = self.bytes[..len].iter().map(|b| b.load(Relaxed)).collect();
            std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
            if self.seq.load(Relaxed) == before {
                return String::from_utf8_lossy(&bytes).into_owned();
            }
        }
        String::new()
    }
}

#[repr(C, align(64))]
pub struct Header {
    pub magic: AtomicU64,
    pub layout_version: AtomicU32,
    pub slot_count: AtomicU32,
    pub region_size: AtomicU64,
    pub master_pid: AtomicI32,
    /// Cells of `counter_names` that carry a name: the highest named id plus one.
    pub counter_count: AtomicU32,
    /// Wall-clock start of the master, ms since the epoch.
    pub start_time_ms: AtomicU64,
    pub config_generation: AtomicU64,
    /// Odd while a master moves an exited worker's counters into `retired`.
    pub fold_seq: AtomicU64,
    /// The pid of the master folding, or 0: during a binary upgrade two masters share
    /// the region. A master that finds it held by a dead process takes it over.
    pub fold_lock: AtomicU32,
    /// The fold's journal, so a fold cut short by a dying master is finished exactly
    /// (see `master::fold_slot`): the row being folded plus one (0: none),
    pub fold_row: AtomicU32,
    /// the word of the row being moved ([`NO_WORD`] before the first),
    pub fold_word: AtomicU64,
    /// and the retired value of that word before it was added to.
    pub fold_base: AtomicU64,
    /// The name of the counter in each cell, as the builds that used the region
    /// declared it: a build checks that its ids mean the same counters before sharing
    /// the region, and adds the names of its new ones.
    pub counter_names: [CounterName; COUNTER_CELLS],
}

/// `fold_word` before the first word of a fold is moved.
pub const NO_WORD: u64 = u64::MAX;

/// A counter's name in the region's name table, NUL-padded. Written by a master before
/// it forks workers, read when a master attaches.
#[repr(C)]
pub struct CounterName([AtomicU8; NAME_BYTES]);

impl CounterName {
    pub fn get(&self) -> String {
        let bytes: Vec<u8> = self
            .0
            .iter()
            .map(|b| b.load(Relaxed))
            .take_while(|&b| b != 0)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Writes `name` (the table checks names fit when compiling).
    pub fn set(&self, name: &str) {
        let bytes = name.as_bytes();
        for (i, cell) in self.0.iter().enumerate() {
            cell.store(bytes.get(i).copied().unwrap_or(0), Relaxed);
        }
    }
}

#[repr(C, align(64))]
pub struct MasterStats {
    pub respawns: AtomicU64,
    /// The configuration generation every worker of the master serves, once they all
    /// do (after start-up, a reload in place, or a new generation replacing the old):
    /// `forkd -s reload` waits for the master's verdict rather than judging the rows.
    pub generation_in_force: AtomicU64,
    pub reloads_ok: AtomicU64,
    pub reloads_failed: AtomicU64,
    pub upgrades_ok: AtomicU64,
    pub upgrades_failed: AtomicU64,
    pub last_respawn_reason: Text<256>,
    pub last_reload_error: Text<1024>,
    pub last_upgrade_error: Text<1024>,
}

#[repr(C)]
pub struct ListenerStat {
    pub addr: Text<64>,
    /// Connections waiting in the accept queue.
    pub queue_depth: AtomicU32,
    /// The queue's limit (the effective backlog).
    pub queue_max: AtomicU32,
}

#[repr(C, align(64))]
pub struct SystemStats {
    /// `TcpExt: ListenOverflows` from /proc/net/netstat: SYNs dropped on a full queue.
    pub listen_overflows: AtomicU64,
    pub listener_count: AtomicU32,
    _pad: AtomicU32,
    pub listeners: [ListenerStat; MAX_LISTENERS],
}

#[repr(C, align(64))]
pub struct Retired {
    pub counters: Counters,
}

/// The published configuration: the text of the file the master validated.
#[repr(C, align(64))]
pub struct SnapshotArea {
    /// Odd while the master writes a new snapshot.
    pub seq: AtomicU64,
    pub generation: AtomicU64,
    /// The master that published it: workers adopt only their own master's snapshots
    /// (during a binary upgrade two masters share the region).
    pub publisher: AtomicI32,
    _pad: AtomicU32,
    pub len: AtomicU64,
    pub path: Text<4096>,
    pub data: [AtomicU8; SNAPSHOT_BYTES],
}

#[repr(C, align(4096))]
pub struct Layout {
    pub header: Header,
    pub master: MasterStats,
    pub system: SystemStats,
    pub retired: Retired,
    pub snapshot: SnapshotArea,
    pub slots: [WorkerSlot; MAX_SLOTS],
    pub limits: super::limits::LimitsArea,
    /// Appended after the first builds of version 2 (see "Growing" above).
    pub upstreams: super::upstream::UpstreamArea,
    /// Appended after the upstream area: the active checks' lease and results, and
    /// the addresses of servers given by name (`health`).
    pub health: super::health::HealthArea,
    /// Appended after the health area: the adaptive concurrency limits.
    pub overload: super::overload::OverloadArea,
    /// Appended after the overload area: per upstream server, what every worker sees
    /// the same (in flight, passive health; see `upstream_state`).
    pub upstream_state: super::upstream_state::UpstreamStateArea,
    /// Appended after the upstream area: TLS session-ticket keys (`tls_keys`).
    pub tls_keys: super::tls_keys::TlsKeysArea,
    /// The certificates in force and their expiry (`tls_certs`).
    pub tls_certs: super::tls_certs::TlsCertsArea,
    /// Per worker row, the connections it counted under each `limits` entry, so a
    /// dead worker's are released (`limits`).
    pub limits_held: super::limits::HeldArea,
}

/// Bytes of a version-2 region of a build before the upstream area: where that area
/// starts.
pub const LEGACY_SIZE: usize = std::mem::offset_of!(Layout, upstreams);

/// Where the upstream area ends (the next appended area starts): a region at least
/// this long has the upstream area.
pub const UPSTREAM_AREA_END: usize = std::mem::offset_of!(Layout, health);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_values_in_order() {
        let mut last = 0;
        for us in [
            0u64,
            1,
            15,
            16,
            17,
            31,
            32,
            33,
            100,
            1000,
            65_535,
            1 << 30,
            u64::MAX,
        ] {
            let b = bucket_of(us);
            assert!(b >= last, "{us}");
            last = b;
            let (lo, hi) = bucket_bounds(b);
            if us < 1 << 36 {
                assert!(lo <= us && us < hi, "{us} not in [{lo}, {hi})");
            }
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn bucket_midpoints_are_within_five_percent() {
        for b in 16..BUCKETS {
            let (lo, hi) = bucket_bounds(b);
            let mid = (lo + hi) as f64 / 2.0;
            assert!((mid - lo as f64) / (lo as f64) < 0.05);
            assert_eq!(bucket_of(lo), b);
            assert_eq!(bucket_of(hi - 1), b);
        }
    }

    #[test]
    fn words_cover_the_counters_block() {
        assert_eq!(std::mem::size_of::<Counters>(), WORDS * 8);
    }

    #[test]
    fn slots_are_cache_line_aligned() {
        assert_eq!(std::mem::align_of::<WorkerSlot>(), 64);
        assert_eq!(std::mem::size_of::<WorkerSlot>() % 64, 0);
    }

    #[test]
    fn text_round_trips_and_truncates_at_char_boundary() {
        let t: Text<8> = unsafe_free_zeroed();
        t.set("héllo wörld");
        assert_eq!(t.get(), "héllo w");
    }

    #[test]
    fn a_text_left_mid_write_reads_empty_and_the_next_set_repairs_it() {
        let t: Text<8> = unsafe_free_zeroed();
        t.set("first");
        // A writer killed mid-write leaves the count odd.
        t.seq.store(t.seq.load(Relaxed) + 1, Relaxed);
        assert_eq!(t.get(), "");
        t.set("second");
        assert_eq!(t.seq.load(Relaxed) % 2, 0);
        assert_eq!(t.get(), "second");
    }

    /// A zeroed Text built from atomics' constructors (no unsafe needed).
    fn unsafe_free_zeroed() -> Text<8> {
        Text {
            seq: AtomicU64::new(0),
            len: AtomicU32::new(0),
            bytes: std::array::from_fn(|_| AtomicU8::new(0)),
        }
    }
}

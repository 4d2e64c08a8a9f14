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

pub use super::cells::{
    bucket_bounds, bucket_of, bump, CounterName, Counters, Histogram, Text, BUCKETS, WORDS,
};
use super::counters::COUNTER_CELLS;
use super::health::HealthArea;
use super::limits::{HeldArea, LimitsArea};
use super::overload::OverloadArea;
use super::tls_certs::TlsCertsArea;
use super::tls_keys::TlsKeysArea;
use super::upstream::UpstreamArea;
use super::upstream_state::UpstreamStateArea;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, AtomicU8};

pub const MAGIC: u64 = u64::from_le_bytes(*b"FORKDSHM");
pub const LAYOUT_VERSION: u32 = 2;
pub use crate::capacity::MAX_SLOTS;
pub const MAX_LISTENERS: usize = 32;
/// Bytes of configuration text the snapshot area holds.
pub const SNAPSHOT_BYTES: usize = 256 * 1024;

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

/// Declares [`Layout`] from its list of areas, in region order, and [`AREAS`], the
/// same list as data (name, offset, size): an area is one line here and knows nothing
/// of the others.
macro_rules! layout {
    ($($(#[$doc:meta])* $name:ident: $area:ty,)*) => {
        #[repr(C, align(4096))]
        pub struct Layout {
            $($(#[$doc])* pub $name: $area,)*
        }

        /// Every area of [`Layout`], in region order.
        pub const AREAS: &[Area] = &[$(Area {
            name: stringify!($name),
            offset: std::mem::offset_of!(Layout, $name),
            size: std::mem::size_of::<$area>(),
        },)*];
    };
}

/// Where one area of the region lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Area {
    pub name: &'static str,
    pub offset: usize,
    pub size: usize,
}

layout! {
    header: Header,
    master: MasterStats,
    system: SystemStats,
    retired: Retired,
    snapshot: SnapshotArea,
    slots: [WorkerSlot; MAX_SLOTS],
    limits: LimitsArea,
    /// Appended after the first builds of version 2 (see "Growing" above).
    upstreams: UpstreamArea,
    /// Appended after the upstream area: the active checks' lease and results, and
    /// the addresses of servers given by name (`health`).
    health: HealthArea,
    /// Appended after the health area: the adaptive concurrency limits.
    overload: OverloadArea,
    /// Appended after the overload area: per upstream server, what every worker sees
    /// the same (in flight, passive health; see `upstream_state`).
    upstream_state: UpstreamStateArea,
    /// Appended after the upstream area: TLS session-ticket keys (`tls_keys`).
    tls_keys: TlsKeysArea,
    /// The certificates in force and their expiry (`tls_certs`).
    tls_certs: TlsCertsArea,
    /// Per worker row, the connections it counted under each `limits` entry, so a
    /// dead worker's are released (`limits`).
    limits_held: HeldArea,
}

impl Layout {
    /// Whether the region holds every area of this build: an older build's region is
    /// shorter, and the areas it lacks read as absent (`header.region_size`).
    pub fn complete(&self) -> bool {
        self.header
            .region_size
            .load(std::sync::atomic::Ordering::Acquire) as usize
            >= std::mem::size_of::<Layout>()
    }
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

    /// The region is shared with older and newer builds during a binary upgrade:
    /// every area stays where it was, at the size it was.
    #[test]
    fn every_area_keeps_its_offset_and_size() {
        let expected = [
            ("header", 0, 2176),
            ("master", 2176, 2432),
            ("system", 4608, 2880),
            ("retired", 7488, 4800),
            ("snapshot", 12288, 266304),
            ("slots", 278592, 1245184),
            ("limits", 1523776, 98368),
            ("upstreams", 1626112, 6336512),
            ("health", 7962624, 24576),
            ("overload", 7987200, 2187328),
            ("upstream_state", 10178560, 77824),
            ("tls_keys", 10256384, 88),
            ("tls_certs", 10256472, 13576),
            ("limits_held", 10272768, 4194304),
        ];
        let areas: Vec<_> = AREAS.iter().map(|a| (a.name, a.offset, a.size)).collect();
        assert_eq!(areas, expected);
        assert_eq!(std::mem::size_of::<Layout>(), 14467072);
        assert_eq!(std::mem::align_of::<Layout>(), 4096);
        assert_eq!(std::mem::size_of::<WorkerSlot>(), 4864);
        assert_eq!(std::mem::size_of::<Counters>(), 4752);
        assert_eq!((LEGACY_SIZE, UPSTREAM_AREA_END), (1626112, 7962624));
    }

    #[test]
    fn slots_are_cache_line_aligned() {
        assert_eq!(std::mem::align_of::<WorkerSlot>(), 64);
        assert_eq!(std::mem::size_of::<WorkerSlot>() % 64, 0);
    }
}

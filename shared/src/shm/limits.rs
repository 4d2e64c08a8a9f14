//! The per-client limits area of the region: a fixed-size table of client entries
//! (token-bucket state and a connection count), shared by every worker so a client
//! spread over workers meets one limit. The workers' table logic (probing, eviction,
//! the compare-and-swap updates) is `forkd_worker::limits::table`; this is only the
//! memory.
//!
//! Unlike the stats rows, entries have many writers (every worker a client reaches):
//! they are updated with compare-and-swap, never with a lock, so a worker that dies
//! mid-update leaves at worst one stale count and never a held lock.

use std::sync::atomic::{AtomicU32, AtomicU64};

/// Entries in the table: bounded memory (24 bytes each, 96 KiB), approximate under pressure.
/// Below 2^13: a connection keeps its entry's index in 13 bits.
pub const LIMIT_ENTRIES: usize = 4096;
const _: () = assert!(LIMIT_ENTRIES < 1 << 13);

#[repr(C)]
pub struct LimitEntry {
    /// The keyed hash of (rule, client key); 0: free.
    pub key: AtomicU64,
    /// GCRA theoretical arrival time, CLOCK_MONOTONIC µs (0: a full bucket).
    pub tat: AtomicU64,
    /// Connections open under this key (conn_per_ip entries).
    pub conns: AtomicU32,
    /// CLOCK_MONOTONIC seconds of the last use: the least recently used is evicted.
    pub seen_s: AtomicU32,
}

#[repr(C, align(64))]
pub struct LimitsArea {
    /// The hash seed, chosen by the first worker that uses the table (0: not yet), so
    /// clients cannot choose keys that collide.
    pub seed: AtomicU64,
    pub entries: [LimitEntry; LIMIT_ENTRIES],
}

//! The per-client limits area of the region: a fixed-size table of client entries
//! (token-bucket state and a connection count), shared by every worker so a client
//! spread over workers meets one limit, and, appended at the region's end, each
//! worker row's journal of the connections it counted. The workers' table logic
//! (probing, eviction, the compare-and-swap updates) is `forkd_worker::limits::table`;
//! this is the memory and the repair of a dead worker's counts.
//!
//! Unlike the stats rows, entries have many writers (every worker a client reaches):
//! they are updated with compare-and-swap, never with a lock, so a worker that dies
//! mid-update leaves at worst one stale count and never a held lock.
//!
//! **Connections held by a worker that dies.** An entry's `conns` is the sum over the
//! workers, and a worker killed (or ending at `drain_timeout`) with connections open
//! never uncounts them; the sum alone cannot say whose they were. So each worker row
//! also counts, per entry, the connections *it* holds ([`HeldArea`], one word per row
//! and entry, written only by that row's worker), and whoever retires the row — the
//! master folding it, or the next worker given the row if the fold could not run —
//! takes each word and subtracts it from the entry ([`release_row`]), as the upstream
//! in-flight words are zeroed. An entry with connections is never evicted, so the
//! entry a word names is still the key the worker counted under.

use crate::capacity::MAX_SLOTS;
use std::sync::atomic::Ordering::{AcqRel, Acquire};
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
    /// Connections open under this key (conn_per_ip entries), every worker's.
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

/// One worker row's share of each entry's `conns`: connections that row's worker
/// counted and has not uncounted. 16 KiB a row; the pages of rows never used are
/// never touched (the file is sparse).
#[repr(C, align(4096))]
pub struct HeldRow(pub [AtomicU32; LIMIT_ENTRIES]);

/// The journal of every row, appended after the TLS certificates area.
#[repr(C, align(4096))]
pub struct HeldArea {
    pub rows: [HeldRow; MAX_SLOTS],
}

/// Row `row`'s worker is gone: the connections it counted are uncounted. Each word is
/// taken with a swap, so two that repair the same row (a master folding it, the next
/// worker given it) never subtract it twice, and repeating is harmless. Returns the
/// connections released.
pub fn release_row(area: &LimitsArea, held: &HeldArea, row: usize) -> u64 {
    let mut released = 0;
    for (entry, word) in area.entries.iter().zip(&held.rows[row].0) {
        if word.load(Acquire) == 0 {
            continue;
        }
        let n = word.swap(0, AcqRel);
        // Saturating: a worker killed between counting its share and the entry (see
        // the table's order) must not wrap the entry's count.
        let _ = entry
            .conns
            .fetch_update(AcqRel, Acquire, |c| Some(c.saturating_sub(n)));
        released += u64::from(n);
    }
    released
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::testing::TempRegion;
    use crate::shm::Region;
    use std::sync::atomic::Ordering::Relaxed;

    #[test]
    fn a_rows_share_is_released_once_and_the_others_stay() {
        let tmp = TempRegion::new("limits-held");
        let region = Region::create(&tmp.0, 1, None).unwrap();
        let l = region.layout();
        let e = &l.limits.entries[17];
        // Rows 2 and 5 hold 3 and 1 connections under entry 17.
        e.conns.store(4, Relaxed);
        l.limits_held.rows[2].0[17].store(3, Relaxed);
        l.limits_held.rows[5].0[17].store(1, Relaxed);
        assert_eq!(release_row(&l.limits, &l.limits_held, 2), 3);
        assert_eq!(e.conns.load(Relaxed), 1);
        assert_eq!(release_row(&l.limits, &l.limits_held, 2), 0, "once");
        assert_eq!(e.conns.load(Relaxed), 1);
        // A share larger than the entry (a kill between the two counts) stops at 0.
        l.limits_held.rows[5].0[17].store(4, Relaxed);
        release_row(&l.limits, &l.limits_held, 5);
        assert_eq!(e.conns.load(Relaxed), 0);
    }
}

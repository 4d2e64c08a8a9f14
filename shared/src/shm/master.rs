//! The master's writes to the region.

use super::layout::{bump, Counters, Layout, WorkerState};
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};

/// Claims a free row (empty, or left by an exited worker whose counters were folded)
/// for a worker about to be forked. A compare-and-swap on the row's state, so two
/// masters sharing the region during a binary upgrade never claim the same row.
pub fn claim_free_slot(layout: &Layout, worker: usize, generation: u64) -> Option<usize> {
    for (index, slot) in layout.slots.iter().enumerate() {
        for free in [WorkerState::Empty, WorkerState::Exited] {
            if slot
                .state
                .compare_exchange(free as u32, WorkerState::Starting as u32, AcqRel, Relaxed)
                .is_ok()
            {
                claim_slot(layout, index, worker, generation);
                return Some(index);
            }
        }
    }
    None
}

/// Prepares slot `index` for a worker about to be forked.
pub fn claim_slot(layout: &Layout, index: usize, worker: usize, generation: u64) {
    let s = &layout.slots[index];
    s.pid.store(0, Relaxed);
    s.worker.store(worker as u32, Relaxed);
    s.generation.store(generation, Relaxed);
    s.started_ms.store(super::now_ms(), Relaxed);
    s.heartbeat_ms.store(super::monotonic_ms(), Relaxed);
    s.state.store(WorkerState::Starting as u32, Release);
    // (For `claim_free_slot` the state is already Starting; storing it again is harmless.)
}

/// Moves the counters of the exited worker in slot `index` into the retired totals and
/// clears the slot, under `fold_seq` so readers never count them twice or not at all.
pub fn fold_slot(layout: &Layout, index: usize) {
    let h = &layout.header;
    let me = std::process::id().max(1);
    while h
        .fold_lock
        .compare_exchange(0, me, Acquire, Relaxed)
        .is_err()
    {
        std::thread::yield_now(); // another master is folding, for microseconds
    }
    h.fold_seq.fetch_add(1, Release); // odd: folding
    std::sync::atomic::fence(Release);
    let slot = &layout.slots[index];
    add_counters(&layout.retired.counters, &slot.counters);
    zero_counters(&slot.counters);
    for gauge in [
        &slot.connections_active,
        &slot.connections_reading,
        &slot.connections_writing,
        &slot.connections_idle,
        &slot.open_fds,
        &slot.rss_bytes,
    ] {
        gauge.store(0, Relaxed);
    }
    slot.state.store(WorkerState::Exited as u32, Release);
    h.fold_seq.fetch_add(1, Release); // even: done
    h.fold_lock.store(0, Release);
}

/// Marks a slot unused (its worker's counters must have been folded).
pub fn release_slot(layout: &Layout, index: usize) {
    layout.slots[index]
        .state
        .store(WorkerState::Empty as u32, Release);
    layout.slots[index].pid.store(0, Relaxed);
}

fn add_counters(into: &Counters, from: &Counters) {
    for (a, b) in into.words().zip(from.words()) {
        bump(a, b.load(Relaxed));
    }
}

fn zero_counters(c: &Counters) {
    for a in c.words() {
        a.store(0, Relaxed);
    }
}

/// Reads `TcpExt: ListenOverflows` from /proc/net/netstat.
pub fn read_listen_overflows() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/net/netstat").ok()?;
    let mut lines = text.lines();
    while let Some(names) = lines.next() {
        let values = lines.next()?;
        if !names.starts_with("TcpExt:") {
            continue;
        }
        let i = names
            .split_whitespace()
            .position(|n| n == "ListenOverflows")?;
        return values.split_whitespace().nth(i)?.parse().ok();
    }
    None
}

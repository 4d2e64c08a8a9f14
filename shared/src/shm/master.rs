//! The master's writes to the region.

use super::layout::{bump, Counters, Layout, WorkerState, MAX_SLOTS};
use std::sync::atomic::Ordering::{Relaxed, Release};

/// Region slots not in use by a live worker.
pub struct SlotAllocator {
    free: Vec<usize>,
}

impl Default for SlotAllocator {
    fn default() -> Self {
        // Hand out low indexes first, so a region's rows read in start order.
        SlotAllocator {
            free: (0..MAX_SLOTS).rev().collect(),
        }
    }
}

impl SlotAllocator {
    pub fn take(&mut self) -> Option<usize> {
        self.free.pop()
    }
    pub fn give(&mut self, index: usize) {
        self.free.push(index);
    }
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
}

/// Moves the counters of the exited worker in slot `index` into the retired totals and
/// clears the slot, under `fold_seq` so readers never count them twice or not at all.
pub fn fold_slot(layout: &Layout, index: usize) {
    let h = &layout.header;
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
    slot.state.store(WorkerState::Exited as u32, Relaxed);
    h.fold_seq.fetch_add(1, Release); // even: done
}

/// Marks a slot unused (its worker's counters must have been folded).
pub fn release_slot(layout: &Layout, index: usize) {
    layout.slots[index]
        .state
        .store(WorkerState::Empty as u32, Release);
    layout.slots[index].pid.store(0, Relaxed);
}

fn add_counters(into: &Counters, from: &Counters) {
    let pairs = [
        (&into.connections_accepted, &from.connections_accepted),
        (&into.connections_handled, &from.connections_handled),
        (&into.requests, &from.requests),
        (&into.responses_499, &from.responses_499),
        (&into.bytes_in, &from.bytes_in),
        (&into.bytes_out, &from.bytes_out),
        (&into.accept_empty_wakeups, &from.accept_empty_wakeups),
        (&into.connection_limit_hits, &from.connection_limit_hits),
        (&into.latency.sum_us, &from.latency.sum_us),
        (&into.latency.count, &from.latency.count),
    ];
    for (a, b) in pairs {
        bump(a, b.load(Relaxed));
    }
    for (a, b) in into.responses.iter().zip(&from.responses) {
        bump(a, b.load(Relaxed));
    }
    for (a, b) in into.latency.buckets.iter().zip(&from.latency.buckets) {
        bump(a, b.load(Relaxed));
    }
}

fn zero_counters(c: &Counters) {
    for a in [
        &c.connections_accepted,
        &c.connections_handled,
        &c.requests,
        &c.responses_499,
        &c.bytes_in,
        &c.bytes_out,
        &c.accept_empty_wakeups,
        &c.connection_limit_hits,
        &c.latency.sum_us,
        &c.latency.count,
    ] {
        a.store(0, Relaxed);
    }
    for a in c.responses.iter().chain(c.latency.buckets.iter()) {
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

//! This worker's slot in the shared-memory stats region: what it records, and when.
//!
//! Counters are bumped where the events happen (plain loads and stores: this worker is
//! the slot's only writer, so no locked instruction is needed). Gauges that would cost
//! work per event — connections by state, open fds, RSS — are sampled once a second.

use forkd_shared::shm::layout::{bump, WorkerSlot, WorkerState};
use forkd_shared::shm::Region;
use std::rc::Rc;
use std::sync::atomic::Ordering::{Relaxed, Release};
use std::time::Instant;

pub struct Stats {
    region: Rc<Region>,
    index: usize,
    /// A monotonic reading in both forms, to turn `Instant`s into CLOCK_MONOTONIC ms.
    origin: (Instant, u64),
}

impl Stats {
    pub fn new(region: Rc<Region>, index: usize) -> Stats {
        Stats {
            region,
            index,
            origin: (Instant::now(), forkd_shared::shm::monotonic_ms()),
        }
    }

    #[inline]
    pub fn slot(&self) -> &WorkerSlot {
        &self.region.layout().slots[self.index]
    }

    pub fn region(&self) -> &Region {
        &self.region
    }

    pub fn set_state(&self, state: WorkerState) {
        self.slot().state.store(state as u32, Release);
    }

    /// Marks the slot as this process's and serving.
    pub fn serving(&self) {
        self.slot().pid.store(std::process::id() as i32, Relaxed);
        self.set_state(WorkerState::Serving);
    }

    /// Once per loop turn: the heartbeat a reader ages to find a stuck worker.
    #[inline]
    pub fn heartbeat(&self, now: Instant) {
        let ms = self.origin.1 + now.saturating_duration_since(self.origin.0).as_millis() as u64;
        self.slot().heartbeat_ms.store(ms, Relaxed);
    }

    /// A response was queued: `status`, after `latency_us` since its request began.
    /// Interim (1xx) responses count by class but not as requests.
    #[inline]
    pub fn response(&self, status: u16, latency_us: Option<u64>) {
        let c = &self.slot().counters;
        let class = (status / 100).clamp(1, 5) as usize - 1;
        bump(&c.responses[class], 1);
        if status >= 200 {
            bump(&c.requests, 1);
        }
        if let Some(us) = latency_us {
            c.latency.record(us);
        }
    }

    #[inline]
    pub fn bytes_in(&self, n: u64) {
        bump(&self.slot().counters.bytes_in, n);
    }

    #[inline]
    pub fn bytes_out(&self, n: u64) {
        bump(&self.slot().counters.bytes_out, n);
    }

    pub fn accepted(&self) {
        bump(&self.slot().counters.connections_accepted, 1);
    }

    /// A connection closed; `abandoned`: its client left while a request was under way.
    pub fn closed(&self, abandoned: bool) {
        let c = &self.slot().counters;
        bump(&c.connections_handled, 1);
        if abandoned {
            bump(&c.responses_499, 1);
        }
    }

    pub fn empty_wakeup(&self) {
        bump(&self.slot().counters.accept_empty_wakeups, 1);
    }

    /// A connection was closed for a transfer below its server's minimum rate.
    pub fn slow_client(&self) {
        bump(&self.slot().counters.slow_clients_closed, 1);
    }

    pub fn limit_hit(&self) {
        bump(&self.slot().counters.connection_limit_hits, 1);
    }

    /// Once a second: connection gauges, open fds and RSS.
    pub fn sample(&self, active: u64, reading: u64, writing: u64, idle: u64) {
        let s = self.slot();
        s.connections_active.store(active, Relaxed);
        s.connections_reading.store(reading, Relaxed);
        s.connections_writing.store(writing, Relaxed);
        s.connections_idle.store(idle, Relaxed);
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            // The directory handle itself is one of the entries.
            s.open_fds
                .store(dir.count().saturating_sub(1) as u64, Relaxed);
        }
        if let Some(rss) = read_rss() {
            s.rss_bytes.store(rss, Relaxed);
        }
    }
}

fn read_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

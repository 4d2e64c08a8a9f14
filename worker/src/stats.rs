//! This worker's slot in the shared-memory stats region: what it records, and when.
//!
//! Counters are bumped where the events happen (plain loads and stores: this worker is
//! the slot's only writer, so no locked instruction is needed). Gauges that would cost
//! work per event — connections by state, open fds, RSS — are sampled once a second.

use forkd_shared::shm::counters::{self, Counter};
use forkd_shared::shm::layout::{WorkerSlot, WorkerState};
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

    /// Adds `n` to counter `c` of this worker's row: the increment of a counter
    /// declared in `forkd_shared::shm::counters` (the named methods below are these).
    #[inline]
    pub fn bump(&self, c: Counter, n: u64) {
        self.slot().counters.bump(c, n);
    }

    /// A response was queued: `status`, after `latency_us` since its request began.
    /// Interim (1xx) responses count by class but not as requests.
    #[inline]
    pub fn response(&self, status: u16, latency_us: Option<u64>) {
        self.bump(counters::response_class(status / 100), 1);
        if status >= 200 {
            self.bump(counters::REQUESTS, 1);
        }
        if let Some(us) = latency_us {
            self.slot().counters.latency.record(us);
        }
    }

    #[inline]
    pub fn bytes_in(&self, n: u64) {
        self.bump(counters::BYTES_IN, n);
    }

    #[inline]
    pub fn bytes_out(&self, n: u64) {
        self.bump(counters::BYTES_OUT, n);
    }

    pub fn accepted(&self) {
        self.bump(counters::CONNECTIONS_ACCEPTED, 1);
    }

    /// A connection closed; `abandoned`: its client left while a request was under way.
    pub fn closed(&self, abandoned: bool) {
        self.bump(counters::CONNECTIONS_HANDLED, 1);
        if abandoned {
            self.bump(counters::RESPONSES_499, 1);
        }
    }

    pub fn empty_wakeup(&self) {
        self.bump(counters::ACCEPT_EMPTY_WAKEUPS, 1);
    }

    /// A connection was closed for a transfer below its server's minimum rate.
    pub fn slow_client(&self) {
        self.bump(counters::SLOW_CLIENTS_CLOSED, 1);
    }

    pub fn limit_hit(&self) {
        self.bump(counters::CONNECTION_LIMIT_HITS, 1);
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

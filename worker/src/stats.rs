//! This worker's slot in the shared-memory stats region: what it records, and when.
//!
//! Counters are bumped where the events happen (plain loads and stores: this worker is
//! the slot's only writer, so no locked instruction is needed). Gauges that would cost
//! work per event — connections by state, open fds, RSS — are sampled once a second.
//!
//! Upstream servers: the master gives each configured `(upstream, server)` a cell of
//! the region's upstream area; [`Stats::map_upstreams`] looks them up when the worker
//! adopts a configuration, and the proxy counts through [`Stats::upstream_cell`] and
//! the `upstream_*` methods, on this worker's own row (plain loads and stores).

use forkd_shared::config::Config;
use forkd_shared::shm::counters::{self, Counter};
use forkd_shared::shm::layout::{WorkerSlot, WorkerState};
use forkd_shared::shm::upstream::{self, UpstreamCell};
use forkd_shared::shm::upstream_counters;
use forkd_shared::shm::Region;
use std::rc::Rc;
use std::sync::atomic::Ordering::{Relaxed, Release};
use std::time::Instant;

pub struct Stats {
    region: Rc<Region>,
    index: usize,
    /// A monotonic reading in both forms, to turn `Instant`s into CLOCK_MONOTONIC ms.
    origin: (Instant, u64),
    /// `cells[upstream][server]`: the region cell of each server of the configuration
    /// in force (None: not counted, see `shm::upstream` on capacity).
    cells: Vec<Vec<Option<CellId>>>,
}

/// An upstream server's cell in the region's upstream area, from
/// [`Stats::upstream_cell`]: what the proxy keeps beside a server to count its events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CellId(u16);

impl Stats {
    pub fn new(region: Rc<Region>, index: usize) -> Stats {
        Stats {
            region,
            index,
            origin: (Instant::now(), forkd_shared::shm::monotonic_ms()),
            cells: Vec::new(),
        }
    }

    /// Maps `config`'s upstream servers to the cells the master gave them when it
    /// published the configuration (at start and before every reload's snapshot), so
    /// call it when adopting a configuration.
    pub fn map_upstreams(&mut self, config: &Config) {
        let area = &self.region.layout().upstreams;
        self.cells = upstream::config_labels(config)
            .iter()
            .map(|(name, servers)| {
                servers
                    .iter()
                    .map(|server| upstream::lookup(area, name, server).map(|c| CellId(c as u16)))
                    .collect()
            })
            .collect();
    }

    /// The cell of server `server` of `Config::upstreams[upstream]`; None if it is not
    /// counted (beyond the region's capacity) or the indices are not the configuration's.
    #[inline]
    pub fn upstream_cell(&self, upstream: usize, server: usize) -> Option<CellId> {
        *self.cells.get(upstream)?.get(server)?
    }

    #[inline]
    fn cell(&self, cell: CellId) -> &UpstreamCell {
        &self.region.layout().upstreams.rows[self.index][cell.0 as usize]
    }

    /// Adds `n` to upstream counter `c` (declared in `shm::upstream_counters`) of
    /// `cell`: the named methods below are these.
    #[inline]
    pub fn upstream_bump(&self, cell: CellId, c: Counter, n: u64) {
        self.cell(cell).bump(c, n);
    }

    /// A request (an attempt: a retry counts again) was sent to the server.
    #[inline]
    pub fn upstream_request(&self, cell: CellId) {
        self.upstream_bump(cell, upstream_counters::REQUESTS, 1);
    }

    /// A response head arrived: `status`, `head_latency_us` after the request was sent.
    /// Interim (1xx) heads count by class; pass their time only for the final head.
    #[inline]
    pub fn upstream_response(&self, cell: CellId, status: u16, head_latency_us: Option<u64>) {
        let c = self.cell(cell);
        c.bump(upstream_counters::response_class(status / 100), 1);
        if let Some(us) = head_latency_us {
            c.record_time(us);
        }
    }

    /// Connecting to the server failed (refused, reset, unreachable).
    #[inline]
    pub fn upstream_connect_error(&self, cell: CellId) {
        self.upstream_bump(cell, upstream_counters::CONNECT_ERRORS, 1);
    }

    /// A connect, send or read timeout with the server.
    #[inline]
    pub fn upstream_timeout(&self, cell: CellId) {
        self.upstream_bump(cell, upstream_counters::TIMEOUTS, 1);
    }

    /// A request that failed on this server is being retried (count it on the server
    /// that failed).
    #[inline]
    pub fn upstream_retry(&self, cell: CellId) {
        self.upstream_bump(cell, upstream_counters::RETRIES, 1);
    }

    /// A connection to the server carries a request: `reused` from the pool, or new.
    #[inline]
    pub fn upstream_connection(&self, cell: CellId, reused: bool) {
        let c = if reused {
            upstream_counters::CONNECTIONS_REUSED
        } else {
            upstream_counters::CONNECTIONS_NEW
        };
        self.upstream_bump(cell, c, 1);
    }

    /// This worker's gauges for the server: open connections, and how many of them
    /// are idle in its pool (two stores: call it when they change, or once a second).
    #[inline]
    pub fn upstream_gauges(&self, cell: CellId, open: u64, idle: u64) {
        let c = self.cell(cell);
        c.open.store(open, Relaxed);
        c.idle.store(idle, Relaxed);
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

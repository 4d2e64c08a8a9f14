//! Per-worker state every connection uses: the configuration and its routing tables,
//! the file cache, the buffer pool, access logs, clock, timers, stats and the
//! upstream side (pools and upstream tokens).
//!
//! Owned by the event loop and lent to a connection while it runs; it knows nothing
//! of connections, so `conn` and `event_loop` both depend on it and not on each other
//! in a circle.

use crate::access_log::AccessLogs;
use crate::busy::{Busy, BusyPool};
use crate::clock::Clock;
use crate::file_cache::FileCache;
use crate::stats::Stats;
use crate::timers::Timers;
use crate::upstreams::Upstreams;
use forkd_shared::config::{Config, Server};

pub use crate::routing::{routing, Routing};

/// The input buffer size: room for the largest head any server accepts.
pub fn max_header_bytes(config: &Config) -> usize {
    config
        .servers
        .iter()
        .map(|s| s.max_header_bytes)
        .max()
        .unwrap_or(16384)
}

pub struct Services {
    pub config: Config,
    pub routing: Vec<Routing>,
    pub cache: FileCache,
    /// The file pool (`file_threads`): static files opened off the event loop.
    pub files: crate::file_pool::Files,
    /// Connection buffers not in use (see `busy`).
    pub pool: BusyPool,
    pub logs: AccessLogs,
    pub clock: Clock,
    pub timers: Timers,
    pub stats: Stats,
    /// Upstream connection pools and tokens (the reverse proxy).
    pub upstreams: Upstreams,
    /// The shared proxy cache's zones (their indexes mapped).
    pub caches: crate::cache::zones::Zones,
    /// The cache thread: loader, manager, background refreshes.
    pub cache_upkeep: crate::cache::upkeep::Upkeep,
    /// Where proxied bodies spill to temporary files, and the worker's budget for them.
    pub temp: std::rc::Rc<crate::spool::TempFiles>,
    /// Active checks' verdicts and names' addresses (shared by every worker).
    pub checks: crate::checks::Checks,
    /// Readiness answers 503 (a stop was requested).
    pub not_ready: bool,
    /// Responses carry `Connection: close`; idle connections are closed.
    pub draining: bool,
    /// When limits may log next (see `limits::admit`).
    pub limit_log: crate::limits::log::LimitLog,
    /// Likewise for connections refused for their PROXY protocol header, or at accept
    /// for coming from a peer not in `proxy_protocol_from`.
    pub proxy_log: crate::limits::log::LimitLog,
    /// The adaptive concurrency limits of upstream groups (see `overload`).
    pub overload: crate::overload::Overload,
    /// The TLS configuration of each listener (rebuilt when a configuration is adopted).
    pub tls: crate::tls::Acceptors,
    /// The session ticketer (keys from the region) and session cache every TLS
    /// listener shares, kept across configurations.
    pub resumption: crate::tls::acceptor::Resumption,
}

impl Services {
    /// Buffers for a connection that has work.
    pub fn take_busy(&mut self) -> Box<Busy> {
        self.pool.take()
    }

    /// Buffers back from a connection that is idle or closed.
    pub fn give_busy(&mut self, busy: Box<Busy>) {
        self.pool.give(busy);
    }

    /// Server `index`, or the first one if a configuration change removed it.
    pub fn server(&self, index: usize) -> &Server {
        self.config
            .servers
            .get(index)
            .unwrap_or(&self.config.servers[0])
    }

    /// The server a listener's connections use until a `Host` selects another.
    pub fn default_server(&self, listener: usize) -> usize {
        self.routing[listener].default
    }
}

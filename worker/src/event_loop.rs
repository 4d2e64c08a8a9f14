//! The worker's mio loop: accept connections, dispatch readiness to them, drive again
//! those that stopped on their per-turn budget (the ready list), expire deadlines,
//! react to signals, and drain when told to stop.

use crate::access_log::AccessLogs;
use crate::busy::BusyPool;
use crate::checks::Checks;
use crate::clock::Clock;
use crate::conn::{Activity, Conn, Registration, Verdict};
use crate::file_cache::FileCache;
use crate::init::WorkerInit;
use crate::limits::admit;
use crate::limits::rotation::{self, AtLimit};
use crate::services::{max_header_bytes, routing, Services};
use crate::setup::InitError;
use crate::stats::Stats;
use crate::timers::Micros;
use crate::timers::Timers;
use crate::upstreams::{upstream_key, Owner, Upstreams};
use forkd_shared::config::{Config, ProxyHeader};
use forkd_shared::exit;
use forkd_shared::shm::counters;
use forkd_shared::shm::layout::WorkerState;
use forkd_shared::sys::epoll;
use mio::net::TcpListener;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use nix::sys::signal::Signal;
use nix::sys::signalfd::SignalFd;
use slab::Slab;
use std::collections::VecDeque;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

const SIGNALS: Token = Token(usize::MAX);
/// The file pool's threads wake the loop with this token (see `file_pool`): below
/// the listeners' and the upstreams' (`UPSTREAM_BIT`), above any slab key.
const FILES: Token = Token(1 << 61);
/// Listener `i` reports `Token(LISTENER_BASE - i)`; connections use their slab key.
const LISTENER_BASE: usize = usize::MAX - 1;
/// With a shared queue, re-add the listener after this many accepts: the kernel wakes
/// exclusive waiters LIFO, and re-adding moves this worker to the back of the queue,
/// which spreads connections over the workers.
const REARM_EVERY: u32 = 16;
/// How long a connection waiting only for its upstream's answer stays unregistered
/// (see `EventLoop::register_deferred`), and the longest a poll waits while any do.
const DEFERRED_FOR: Duration = Duration::from_millis(10);
/// After EMFILE/ENFILE, wait this long before accepting again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

struct ListenerSlot {
    sock: TcpListener,
    accepts_since_rearm: u32,
    /// The last accept loop stopped at `multi_accept`: more may be queued, and with an
    /// edge-triggered registration no new event will say so.
    more: bool,
}

/// Where the worker is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Run {
    Serving,
    /// Stop requested: still serving until `drain_at` (`shutdown_delay`).
    Stopping {
        drain_at: Instant,
    },
    /// Taking no new work: accepting only what is already queued on the listeners
    /// (until they are empty or `queue_until`), finishing connections until none are
    /// left or `deadline`.
    Draining {
        deadline: Instant,
        queue_until: Instant,
    },
}

/// How long a draining worker keeps accepting connections already queued for it.
const QUEUE_DRAIN_MAX: Duration = Duration::from_secs(1);

pub struct EventLoop {
    poll: Poll,
    events: Events,
    signals: SignalFd,
    listeners: Vec<ListenerSlot>,
    /// Listeners are registered with the poll.
    accepting: bool,
    /// Accepting was paused (EMFILE) until then.
    accept_retry_at: Option<Instant>,
    exclusive: bool,
    conns: Slab<Conn>,
    svc: Services,
    run: Run,
    expired: Vec<usize>,
    /// Connections that stopped on their per-turn budget with work left (see
    /// `Conn::yielded`): driven again next turn, without waiting for an event, which
    /// edge-triggered readiness would never send.
    ready: Vec<usize>,
    /// The list being worked through this turn (kept to reuse its allocation).
    ready_now: Vec<usize>,
    /// Connections whose registration waits (`Conn::waits_on_upstream_only`), with
    /// when they began to, oldest first: registered once they have waited
    /// `DEFERRED_FOR`.
    deferred: VecDeque<(usize, Micros)>,
    /// The configuration generation this worker serves.
    generation: u64,
    /// A generation this worker must not adopt (it needs new workers; ours retire).
    declined: u64,
    /// Our master: only its snapshots are ours to adopt.
    master: i32,
    /// Time at `worker_connections`, and when the accept queues were last looked at.
    at_limit: AtLimit,
    /// Connections whose file-pool job came back (kept to reuse its allocation).
    file_wake: Vec<usize>,
}

impl EventLoop {
    pub fn new(init: WorkerInit, signals: SignalFd) -> Result<EventLoop, InitError> {
        let config = init.config;
        let poll = Poll::new().map_err(InitError::Poll)?;
        poll.registry()
            .register(
                &mut SourceFd(&signals.as_raw_fd()),
                SIGNALS,
                Interest::READABLE,
            )
            .map_err(|source| InitError::Register {
                what: "signalfd",
                source,
            })?;
        let routing = routing(&config);
        let resumption = crate::tls::acceptor::Resumption::new();
        let tls =
            crate::tls::Acceptors::new(&config, &routing, &resumption).map_err(InitError::Tls)?;
        let listeners = init
            .listeners
            .into_iter()
            .map(|sock| {
                // Accepted sockets must be non-blocking; the listener itself too, so
                // `accept` reports WouldBlock when the queue is empty.
                let _ = sock.set_nonblocking(true);
                ListenerSlot {
                    sock: TcpListener::from_std(sock),
                    accepts_since_rearm: 0,
                    more: false,
                }
            })
            .collect();
        let max_header = max_header_bytes(&config);
        let logs = AccessLogs::open(&config.servers).map_err(InitError::AccessLog)?;
        let capacity = config.worker_connections.get();
        let registry = poll.registry().try_clone().map_err(InitError::Poll)?;
        let upstreams = Upstreams::new(registry, &config.upstreams);
        // The worker keeps its mapping for its whole life; a `'static` view of the
        // health area lets the checks threads read and write it.
        let region: &'static std::rc::Rc<forkd_shared::shm::Region> =
            Box::leak(Box::new(init.region.clone()));
        let checks = Checks::new(&region.layout().health, &region.layout().upstream_state);
        let overload =
            crate::overload::Overload::new(init.region.clone(), init.region_slot, &config);
        let mut event_loop = EventLoop {
            poll,
            events: Events::with_capacity(1024),
            signals,
            listeners,
            accepting: false,
            accept_retry_at: None,
            exclusive: init.exclusive,
            conns: Slab::with_capacity(capacity.min(1024)),
            svc: Services {
                temp: crate::spool::TempFiles::new(&config),
                caches: crate::cache::zones::Zones::new(&config),
                cache_upkeep: crate::cache::upkeep::Upkeep::off(),
                config,
                routing,
                cache: FileCache::default(),
                files: crate::file_pool::Files::off(),
                pool: BusyPool::new(max_header),
                logs,
                clock: Clock::new(),
                timers: Timers::default(),
                overload,
                stats: Stats::new(init.region, init.region_slot),
                upstreams,
                checks,
                not_ready: false,
                draining: false,
                limit_log: Default::default(),
                proxy_log: Default::default(),
                tls,
                resumption,
            },
            run: Run::Serving,
            expired: Vec::new(),
            ready: Vec::new(),
            ready_now: Vec::new(),
            deferred: VecDeque::new(),
            generation: 0,
            declined: 0,
            master: init.master.as_raw(),
            at_limit: AtLimit::default(),
            file_wake: Vec::new(),
        };
        let config = &event_loop.svc.config;
        event_loop.svc.stats.map_upstreams(config);
        crate::limits::admit::adopt_row(&event_loop.svc);
        event_loop
            .resume_accepting()
            .map_err(|source| InitError::Register {
                what: "listener",
                source,
            })?;
        Ok(event_loop)
    }

    /// Runs until stopped; returns the exit code.
    pub fn run(&mut self) -> i32 {
        forkd_shared::debug!("worker serving");
        self.generation = self.svc.stats.slot().generation.load(Relaxed);
        // Here rather than in `new`: the threads start after privileges are dropped.
        self.svc.checks.adopt(&self.svc.config, &self.svc.stats);
        let registry = self.poll.registry();
        self.svc.files = crate::file_pool::Files::start(self.svc.config.file_threads, || {
            mio::Waker::new(registry, FILES)
        });
        self.start_cache_thread();
        self.install_ticket_keys();
        self.svc.stats.serving();
        self.sample_stats();
        let code = self.serve();
        self.svc.overload.stop();
        self.svc.logs.flush();
        self.svc.stats.set_state(WorkerState::Exited);
        code
    }

    /// The cache thread, once the configuration has zones (after privileges are
    /// dropped); then it follows the zones of each configuration adopted.
    fn start_cache_thread(&mut self) {
        let zones: Vec<_> = self.svc.caches.all().cloned().collect();
        if self.svc.cache_upkeep.running() {
            self.svc.cache_upkeep.set_zones(zones);
        } else if !zones.is_empty() {
            self.svc.cache_upkeep = crate::cache::upkeep::Upkeep::start(zones);
        }
    }

    fn serve(&mut self) -> i32 {
        loop {
            let timeout = self.poll_timeout();
            if let Err(e) = self.poll.poll(&mut self.events, Some(timeout)) {
                if e.kind() != io::ErrorKind::Interrupted {
                    // A run-time failure, not an init failure: exit so the master
                    // respawns the slot (FATAL_INIT would leave it empty).
                    forkd_shared::alert!("epoll_wait failed: {e}");
                    return exit::CRASH;
                }
            }
            if self.svc.clock.tick() {
                self.install_ticket_keys();
                self.svc.logs.flush();
                self.sample_stats();
                self.sample_upstreams();
                self.svc.files.sweep(self.svc.clock.now_us);
            }
            self.svc.stats.heartbeat(self.svc.clock.now);
            self.svc.overload.tick(self.svc.clock.now_us);
            self.check_generation();
            let mut fast_exit = false;
            let events = std::mem::replace(&mut self.events, Events::with_capacity(0));
            for event in events.iter() {
                match event.token() {
                    SIGNALS => fast_exit |= self.on_signals(),
                    FILES => self.files_done(),
                    Token(t) if t > LISTENER_BASE - self.listeners.len() && t <= LISTENER_BASE => {
                        self.accept_on(LISTENER_BASE - t);
                    }
                    Token(t) if upstream_key(t).is_some() => {
                        let key = t & !crate::upstreams::UPSTREAM_BIT;
                        match self.svc.upstreams.owner(key) {
                            Some(Owner::Client(owner)) => {
                                // An HTTP/2 stream's upstream names the stream too.
                                let (client, stream) = crate::conn::split_key(owner);
                                let Some(conn) = self.conns.get_mut(client) else {
                                    continue;
                                };
                                let hung_up = event.is_read_closed() || event.is_error();
                                if event.is_readable() || hung_up {
                                    conn.upstream_readable(stream, hung_up);
                                }
                                let verdict = conn.drive(client, &mut self.svc);
                                self.settle(client, verdict);
                            }
                            Some(Owner::Pooled)
                                if event.is_readable()
                                    || event.is_read_closed()
                                    || event.is_error() =>
                            {
                                self.svc.upstreams.evict(key, self.svc.clock.now_us);
                            }
                            _ => {}
                        }
                    }
                    Token(key) => {
                        let Some(conn) = self.conns.get_mut(key) else {
                            continue;
                        };
                        if event.is_readable() || event.is_read_closed() || event.is_error() {
                            conn.readable = true;
                        }
                        if event.is_read_closed() || event.is_error() {
                            conn.client_hung_up();
                        }
                        let verdict = conn.drive(key, &mut self.svc);
                        self.settle(key, verdict);
                    }
                }
            }
            self.events = events;
            self.drive_ready();
            self.accept_more();
            self.make_room();
            if fast_exit {
                return exit::OK;
            }
            self.expire_deadlines();
            self.register_deferred();
            self.advance_run();
            if let Run::Draining {
                deadline,
                queue_until,
            } = self.run
            {
                if !self.listeners.is_empty() && self.queues_drained(queue_until) {
                    // Nothing is queued for us any more: let the listeners go. The
                    // master (or the workers that stay) keep the sockets open.
                    self.pause_accepting();
                    self.listeners.clear();
                }
                if self.conns.is_empty() && self.listeners.is_empty() {
                    return exit::OK;
                }
                if self.svc.clock.now >= deadline {
                    forkd_shared::warn!(
                        "drain_timeout reached: closing {} connection(s) still open",
                        self.conns.len()
                    );
                    self.close_tunnels();
                    return exit::OK;
                }
            }
            if !self.accepting && !matches!(self.run, Run::Draining { .. }) {
                self.maybe_resume_accepting();
            }
        }
    }

    /// The drain is over: every tunnel still open is shut down on both sides (each
    /// peer reads an EOF, not a reset) and closed, and counted closed.
    fn close_tunnels(&mut self) {
        let keys: Vec<usize> = self
            .conns
            .iter()
            .filter(|(_, c)| c.is_tunnel())
            .map(|(k, _)| k)
            .collect();
        for key in keys {
            self.conns[key].shut_tunnel(&self.svc);
            self.close(key);
        }
        self.svc.stats.tunnels(0);
    }

    /// Takes the session-ticket keys the master keeps in the region (once a second:
    /// a rotation is seen within a second, and the previous key stays good a period).
    fn install_ticket_keys(&self) {
        if !self.svc.tls.any() {
            return;
        }
        let area = &self.svc.stats.region().layout().tls_keys;
        if let Some(keys) = forkd_shared::shm::tls_keys::read(area) {
            let key = |k: Option<forkd_shared::shm::tls_keys::Key>| {
                k.map(|k| crate::tls::tickets::TicketKey {
                    id: k.id,
                    secret: k.secret,
                })
            };
            self.svc
                .resumption
                .tickets
                .install(key(keys.current), key(keys.previous));
        }
    }

    /// Publishes the gauges that are sampled rather than counted.
    fn sample_stats(&self) {
        let (mut reading, mut writing, mut idle) = (0, 0, 0);
        let mut tunnels = 0;
        for (_, conn) in &self.conns {
            tunnels += u64::from(conn.is_tunnel());
            match conn.activity() {
                Activity::Reading => reading += 1,
                Activity::Writing => writing += 1,
                Activity::Idle => idle += 1,
            }
        }
        self.svc
            .stats
            .sample(self.conns.len() as u64, reading, writing, idle);
        self.svc.stats.tunnels(tunnels);
        self.svc.stats.temp_files(self.svc.temp.take_counts());
    }

    /// Publishes each upstream server's open and idle connections: idle ones are in
    /// the pools, open ones also include the exchanges using one.
    fn sample_upstreams(&mut self) {
        let upstreams = &self.svc.config.upstreams;
        if upstreams.is_empty() {
            return;
        }
        let mut busy: Vec<Vec<u64>> = upstreams.iter().map(|u| vec![0; u.servers.len()]).collect();
        for (_, conn) in &self.conns {
            let in_use = match conn.proxied() {
                Some(p) => p
                    .token
                    .and(p.server)
                    .map(|(server, _)| (p.upstream, server)),
                // An upgraded connection still holds its upstream connection.
                None => conn.tunnel_server(),
            };
            if let Some((upstream, server)) = in_use {
                if let Some(n) = busy.get_mut(upstream).and_then(|v| v.get_mut(server)) {
                    *n += 1;
                }
            }
        }
        for (u, servers) in busy.iter().enumerate() {
            for (s, &in_use) in servers.iter().enumerate() {
                let Some(cell) = self.svc.stats.upstream_cell(u, s) else {
                    continue;
                };
                let id = self.svc.upstreams.pools.server_id(u, s);
                let idle = self.svc.upstreams.pools.pool(id).map_or(0, |p| p.len()) as u64;
                self.svc.stats.upstream_gauges(cell, in_use + idle, idle);
            }
        }
    }

    /// Until the next deadline, but at least once a second (access-log flush, date).
    /// In the clock's microseconds (one read of the clock, no `Instant` arithmetic
    /// on a busy turn).
    fn poll_timeout(&self) -> Duration {
        if self.accepting && self.listeners.iter().any(|l| l.more) {
            return Duration::ZERO; // connections are waiting in the accept queue
        }
        if !self.ready.is_empty() {
            return Duration::ZERO; // connections have work left from the last turn
        }
        let clock = &self.svc.clock;
        let now = clock.precise_us();
        let mut until = now + 1_000_000;
        let dues = [
            self.svc.timers.next_due(),
            self.svc.upstreams.next_expiry(),
            self.svc.overload.next_due(),
        ];
        for due in dues.into_iter().flatten() {
            until = until.min(due);
        }
        match self.run {
            Run::Stopping { drain_at } => until = until.min(clock.micros(drain_at)),
            Run::Draining { deadline, .. } if !self.listeners.is_empty() => {
                // Check the accept queues often while emptying them.
                until = until.min(clock.micros(deadline)).min(now + 10_000);
            }
            Run::Draining { deadline, .. } => until = until.min(clock.micros(deadline)),
            Run::Serving => {}
        }
        if let Some(at) = self.accept_retry_at {
            until = until.min(clock.micros(at));
        }
        if self.at_limit.at_limit() {
            // Look at the accept queues again soon: clients may be waiting there.
            until = until.min(now + rotation::CHECK_EVERY_US);
        }
        if let Some(&(_, since)) = self.deferred.front() {
            // Connections wait unregistered for their upstream's answer: register
            // them when the oldest has waited long enough (a client hanging up is
            // noticed then).
            until = until.min(since + DEFERRED_FOR.as_micros() as u64);
        }
        // Round up to the next millisecond so a deadline is never polled for as 0 ms early.
        Duration::from_micros(until.saturating_sub(now) + 500)
    }

    /// Reads pending signals. Returns true for a fast stop.
    fn on_signals(&mut self) -> bool {
        let mut fast = false;
        while let Ok(Some(info)) = self.signals.read_signal() {
            match Signal::try_from(info.ssi_signo as i32) {
                Ok(Signal::SIGQUIT) => self.begin_stop(),
                Ok(Signal::SIGUSR2) => self.retire(),
                Ok(Signal::SIGHUP) => {} // woken to look at the configuration generation
                Ok(Signal::SIGTERM | Signal::SIGINT) => fast = true,
                Ok(Signal::SIGUSR1) => {
                    if let Err(e) = forkd_shared::log::reopen() {
                        forkd_shared::error!("reopening the error log failed: {e}");
                    }
                    self.svc.logs.reopen();
                }
                _ => {} // WINCH: the master's business
            }
        }
        fast
    }

    /// Replaced by a new generation (reload): drain at once; readiness is unaffected,
    /// since the server as a whole stays ready.
    fn retire(&mut self) {
        if self.run != Run::Serving {
            return;
        }
        self.run = Run::Stopping {
            drain_at: self.svc.clock.now,
        };
        self.advance_run();
    }

    /// A graceful stop: readiness fails now; draining starts after `shutdown_delay`.
    fn begin_stop(&mut self) {
        if self.run != Run::Serving {
            return;
        }
        self.svc.not_ready = true;
        let drain_at = self.svc.clock.now + self.svc.config.shutdown_delay;
        self.run = Run::Stopping { drain_at };
        self.advance_run();
    }

    fn advance_run(&mut self) {
        let Run::Stopping { drain_at } = self.run else {
            return;
        };
        if self.svc.clock.now < drain_at {
            return;
        }
        let now = self.svc.clock.now;
        let deadline = drain_at + self.svc.config.drain_timeout;
        self.run = Run::Draining {
            deadline,
            queue_until: now + QUEUE_DRAIN_MAX,
        };
        self.svc.draining = true;
        self.svc.upstreams.drain();
        self.svc.checks.stop();
        self.svc.cache_upkeep.stop();
        self.svc.stats.set_state(WorkerState::Draining);
        // Idle keep-alive connections get a short grace: a client about to send its next
        // request gets an answer with `Connection: close` instead of a reset.
        let keys: Vec<usize> = self.conns.iter().map(|(k, _)| k).collect();
        for key in keys {
            let verdict = self.conns[key].on_drain(key, &mut self.svc);
            self.settle(key, verdict);
        }
        forkd_shared::info!("draining {} connection(s)", self.conns.len());
    }

    /// Whether the listeners' accept queues are empty (or it is time to stop anyway).
    fn queues_drained(&self, queue_until: Instant) -> bool {
        if self.svc.clock.now >= queue_until {
            return true;
        }
        self.listeners.iter().all(|l| {
            forkd_shared::sys::socket::listen_queue(l.sock.as_raw_fd())
                .is_ok_and(|(depth, _)| depth == 0)
        })
    }

    /// One atomic load per turn: has the master published a new configuration?
    fn check_generation(&mut self) {
        let published = self
            .svc
            .stats
            .region()
            .layout()
            .header
            .config_generation
            .load(Relaxed);
        if published == self.generation || published == self.declined {
            return;
        }
        self.adopt(published);
    }

    /// Adopts the published configuration between requests: routes, timeouts, limits,
    /// logs. A change that needs new processes is declined: the master starts a new
    /// generation for it and retires this one.
    fn adopt(&mut self, published: u64) {
        let Some(snapshot) =
            forkd_shared::shm::snapshot::read(&self.svc.stats.region().layout().snapshot)
        else {
            return;
        };
        if snapshot.generation != published {
            return; // the master is between publishing and announcing: next turn
        }
        if snapshot.publisher != self.master {
            // Another master's (a binary upgrade shares the region): not ours.
            self.declined = published;
            return;
        }
        // Names the worker knows keep its addresses: no `getaddrinfo` on the event
        // loop for them (the checks' owner re-resolves them on its resolver thread).
        let path = std::path::Path::new(&snapshot.path);
        let config = match Config::parse_like(path, &snapshot.text, &self.svc.config) {
            Ok(mut c) => {
                c.resolve_like(&self.svc.config);
                c
            }
            Err(e) => {
                forkd_shared::error!(
                    "cannot adopt configuration generation {published}, keeping {}: {e}",
                    self.generation
                );
                self.declined = published;
                return;
            }
        };
        if let Some(why) = self.svc.config.needs_new_workers(&config) {
            forkd_shared::debug!("generation {published} needs new workers ({why})");
            self.declined = published;
            return;
        }
        let logs_changed = config.servers.iter().map(|s| &s.access_log).ne(self
            .svc
            .config
            .servers
            .iter()
            .map(|s| &s.access_log));
        if logs_changed {
            match AccessLogs::open(&config.servers) {
                Ok(logs) => {
                    self.svc.logs.flush();
                    self.svc.logs = logs;
                }
                Err(e) => {
                    forkd_shared::error!("cannot adopt configuration generation {published}: opening its access log failed: {e}");
                    self.declined = published;
                    return;
                }
            }
        } else if config.servers.len() != self.svc.config.servers.len() {
            // Same destinations, but the server-to-log mapping is by index.
            if let Ok(logs) = AccessLogs::open(&config.servers) {
                self.svc.logs.flush();
                self.svc.logs = logs;
            }
        }
        if config.error_log != self.svc.config.error_log
            || config.log_level != self.svc.config.log_level
        {
            let who = self.svc.stats.slot().worker.load(Relaxed).to_string();
            if let Err(e) = forkd_shared::log::init(&config.error_log, config.log_level, &who) {
                forkd_shared::error!("opening the new error log failed, keeping the old one: {e}");
            }
        }
        let new_routing = routing(&config);
        // Renewed certificates: connections accepted from now on get the new
        // configuration; handshakes under way keep the old one (their `Arc`).
        let tls = match crate::tls::Acceptors::new(&config, &new_routing, &self.svc.resumption) {
            Ok(tls) => tls,
            Err(e) => {
                forkd_shared::error!("cannot adopt configuration generation {published}: {e}");
                self.declined = published;
                return;
            }
        };
        let max_header = max_header_bytes(&config);
        self.svc.pool.resize(max_header);
        self.svc.routing = new_routing;
        self.svc.tls = tls;
        self.svc.cache = FileCache::default();
        self.svc.files.adopted();
        self.svc.upstreams.reconfigure(&config.upstreams);
        self.svc.stats.map_upstreams(&config);
        self.svc.checks.adopt(&config, &self.svc.stats);
        self.svc.overload.reconfigure(&config);
        self.svc.temp.reconfigure(&config);
        self.svc.caches.reconfigure(&config);
        self.svc.logs.set_formats(&config.servers);
        self.svc.config = config;
        self.start_cache_thread();
        self.generation = published;
        self.svc.stats.slot().generation.store(published, Relaxed);
        forkd_shared::info!(
            "adopted configuration generation {published} ({} upstream server pool(s))",
            self.svc.upstreams.pools.len()
        );
    }

    fn accept_on(&mut self, index: usize) {
        let max = self.svc.config.worker_connections.get();
        for attempt in 0..self.svc.config.multi_accept.get() {
            if self.conns.len() >= max {
                self.svc.stats.limit_hit();
                self.pause_accepting();
                return;
            }
            let Some(slot) = self.listeners.get_mut(index) else {
                return;
            };
            let (stream, peer) = match slot.sock.accept() {
                Ok(accepted) => accepted,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if attempt == 0 && !slot.more {
                        self.svc.stats.empty_wakeup();
                    }
                    slot.more = false;
                    return;
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                    ) =>
                {
                    continue
                }
                Err(e) => {
                    // EMFILE, ENFILE, ENOBUFS, ENOMEM: leave the queue to the kernel (and
                    // the other workers) for a moment instead of spinning on it.
                    forkd_shared::error!(
                        "accept() failed: {e}; pausing accepts for {ACCEPT_BACKOFF:?}"
                    );
                    self.pause_accepting();
                    self.accept_retry_at = Some(self.svc.clock.now + ACCEPT_BACKOFF);
                    return;
                }
            };
            slot.accepts_since_rearm += 1;
            self.svc.stats.accepted();
            // One worker has nobody to share the queue with fairly (a retiring one
            // stops accepting): it never pays for the two `epoll_ctl`s.
            let rearm = self.exclusive
                && self.svc.config.workers.get() > 1
                && slot.accepts_since_rearm >= REARM_EVERY;
            if rearm {
                slot.accepts_since_rearm = 0;
            }
            let entry = self.conns.vacant_entry();
            let key = entry.key();
            let server = self.svc.default_server(index);
            let Some(tls) = self.svc.tls.accept(index) else {
                continue;
            };
            let mut conn = Conn::new(stream, tls, peer.ip(), index, server, self.svc.clock.now_us);
            let proxy = self
                .svc
                .config
                .listeners
                .get(index)
                .map_or(ProxyHeader::Off, |l| l.proxy_header(peer.ip()));
            let verdict = match proxy {
                ProxyHeader::Untrusted => conn.refuse_untrusted_peer(&mut self.svc),
                // The client is named by the PROXY header: limits apply once it is read.
                ProxyHeader::Expected => {
                    conn.expect_proxy_header();
                    conn.drive(key, &mut self.svc)
                }
                ProxyHeader::Off => match admit::connection(&mut self.svc, server, conn.client()) {
                    admit::Connection::Admit(held) => {
                        conn.hold(held);
                        // The request usually arrives with the connection
                        // (TCP_DEFER_ACCEPT): answer it before paying for registration,
                        // which a one-request connection skips.
                        conn.drive(key, &mut self.svc)
                    }
                    admit::Connection::Refuse => conn.refuse_over_limit(key, &mut self.svc),
                },
            };
            match verdict {
                Verdict::Close => {
                    self.svc.stats.closed(conn.abandoned());
                    conn.release(&mut self.svc);
                }
                Verdict::Keep => {
                    entry.insert(conn);
                    self.settle(key, Verdict::Keep);
                }
            }
            if rearm {
                self.rearm_listener(index);
            }
        }
        if let Some(slot) = self.listeners.get_mut(index) {
            slot.more = true; // stopped at multi_accept: come back next turn
        }
    }

    /// At `worker_connections`, with clients waiting in the accept queues: close truly
    /// idle connections, then tell the longest-served to close after their next
    /// response, so the waiting are served in bounded time and no request fails.
    fn make_room(&mut self) {
        let now = self.svc.clock.now_us;
        let at_limit = self.conns.len() >= self.svc.config.worker_connections.get()
            && self.run == Run::Serving
            && !self.listeners.is_empty();
        let ms = self.at_limit.observe(at_limit, now);
        if ms > 0 {
            self.svc.stats.bump(counters::AT_LIMIT_MS, ms);
        }
        if !at_limit || !self.at_limit.check_due(now) {
            return;
        }
        let waiting: u32 = self
            .listeners
            .iter()
            .filter_map(|l| forkd_shared::sys::socket::listen_queue(l.sock.as_raw_fd()).ok())
            .map(|(depth, _)| depth)
            .sum();
        if waiting == 0 {
            return;
        }
        let candidates: Vec<rotation::Candidate> = self
            .conns
            .iter()
            .map(|(key, conn)| conn.candidate(key, now))
            .collect();
        let plan = rotation::plan(waiting as usize, &candidates);
        for key in plan.close_idle {
            let verdict = self.conns[key].close_if_idle(key, &mut self.svc);
            if verdict == Verdict::Close {
                self.svc.stats.bump(counters::IDLE_CLOSED_AT_LIMIT, 1);
            } else {
                self.svc.stats.bump(counters::CONNECTIONS_ROTATED, 1);
            }
            self.settle(key, verdict);
        }
        for key in plan.rotate {
            self.conns[key].rotate();
            self.svc.stats.bump(counters::CONNECTIONS_ROTATED, 1);
        }
    }

    /// Accepts on listeners whose last loop stopped at `multi_accept`.
    fn accept_more(&mut self) {
        if !self.accepting {
            return;
        }
        for index in 0..self.listeners.len() {
            if self.listeners[index].more {
                self.accept_on(index);
            }
        }
    }

    /// Moves this worker to the back of the listener's exclusive wait queue.
    fn rearm_listener(&mut self, index: usize) {
        if !self.accepting {
            return;
        }
        let epfd = self.poll.as_raw_fd();
        let fd = self.listeners[index].sock.as_raw_fd();
        let token = LISTENER_BASE - index;
        if let Err(e) = epoll::remove(epfd, fd).and_then(|()| epoll::add(epfd, fd, token, true)) {
            forkd_shared::error!("re-adding listener to epoll failed: {e}");
        }
    }

    /// File-pool jobs came back: each connection waiting for one is driven (it
    /// answers its request with the job's result, see `conn/io/file_wait.rs`).
    fn files_done(&mut self) {
        let mut wake = std::mem::take(&mut self.file_wake);
        let now = self.svc.clock.now_us;
        self.svc.files.collect(now, &self.svc.stats, &mut wake);
        for &key in &wake {
            // A key closed and reused since is driven once for nothing: harmless.
            let Some(conn) = self.conns.get_mut(key) else {
                continue;
            };
            let verdict = conn.drive(key, &mut self.svc);
            self.settle(key, verdict);
        }
        wake.clear();
        self.file_wake = wake;
    }

    /// Drives, once each, the connections that stopped on their budget last turn.
    /// Those that stop on it again wait for the next turn, after the events.
    fn drive_ready(&mut self) {
        if self.ready.is_empty() {
            return;
        }
        std::mem::swap(&mut self.ready, &mut self.ready_now);
        let mut now = std::mem::take(&mut self.ready_now);
        for key in now.drain(..) {
            let Some(conn) = self.conns.get_mut(key) else {
                continue;
            };
            if !conn.queued {
                continue; // closed, and the key given to a new connection
            }
            conn.queued = false;
            let verdict = conn.drive(key, &mut self.svc);
            self.settle(key, verdict);
        }
        self.ready_now = now;
    }

    /// After a drive: close, or make sure the poll reports what the connection waits for.
    fn settle(&mut self, key: usize, verdict: Verdict) {
        if verdict == Verdict::Close {
            self.close(key);
            return;
        }
        let conn = &mut self.conns[key];
        if conn.yielded() && !conn.queued {
            conn.queued = true;
            self.ready.push(key);
        }
        let want_write = conn.wants_write();
        if conn.registration != Registration::Registered {
            if conn.waits_on_upstream_only() {
                if conn.registration == Registration::None {
                    conn.registration = Registration::Deferred;
                    self.deferred.push_back((key, self.svc.clock.now_us));
                }
                return;
            }
            self.register(key);
        } else if want_write && !conn.write_interest {
            // Once a connection has had to wait for the socket, it stays registered for
            // writability: one epoll_ctl per slow client, not one per response.
            match self.poll.registry().reregister(
                conn.stream(),
                Token(key),
                Interest::READABLE | Interest::WRITABLE,
            ) {
                Ok(()) => conn.write_interest = true,
                Err(e) => {
                    forkd_shared::error!("epoll_ctl(MOD) for a connection failed: {e}");
                    self.close(key);
                }
            }
        }
    }

    /// Registers connection `key` with the poll: readable, and writable if it has
    /// output waiting. Readiness that came before is reported at once (epoll polls
    /// the socket when it is added), so nothing is missed by registering late.
    fn register(&mut self, key: usize) {
        let conn = &mut self.conns[key];
        let want_write = conn.wants_write();
        let interest = if want_write {
            Interest::READABLE | Interest::WRITABLE
        } else {
            Interest::READABLE
        };
        conn.registration = Registration::None;
        match self
            .poll
            .registry()
            .register(conn.stream(), Token(key), interest)
        {
            Ok(()) => {
                conn.registration = Registration::Registered;
                conn.write_interest = want_write;
            }
            Err(e) => {
                forkd_shared::error!("epoll_ctl(ADD) for a connection failed: {e}");
                self.close(key);
            }
        }
    }

    /// A proxied connection waiting only for its upstream is not registered when it
    /// starts waiting: if the answer comes within `DEFERRED_FOR` (it usually does), a
    /// `Connection: close` client is answered and closed with no `epoll_ctl` at all,
    /// and no removal from the epoll set at `close` (the floor's way). Those still
    /// waiting after it are registered now, so a client that hangs up while the
    /// upstream is slow is still noticed (and the poll waits at most `DEFERRED_FOR`
    /// while any are listed). By time, not by turns: with many clients a turn can
    /// come microseconds after the last, long before an upstream answers.
    fn register_deferred(&mut self) {
        let due_before = self
            .svc
            .clock
            .now_us
            .saturating_sub(DEFERRED_FOR.as_micros() as u64);
        // Listed in the order they began to wait: only the front can be due.
        while let Some(&(key, since)) = self.deferred.front() {
            if since > due_before {
                break;
            }
            self.deferred.pop_front();
            // A key closed and reused since is a new connection: it is registered
            // (or deferred) on its own, and one registered early is harmless.
            let pending = self
                .conns
                .get(key)
                .is_some_and(|c| c.registration == Registration::Deferred);
            if pending {
                self.register(key);
            }
        }
    }

    fn close(&mut self, key: usize) {
        if let Some(mut conn) = self.conns.try_remove(key) {
            self.svc.stats.closed(conn.abandoned());
            conn.release(&mut self.svc);
            // Dropping the stream closes it, which also removes it from the epoll set.
        }
    }

    fn expire_deadlines(&mut self) {
        let now = self.svc.clock.now_us;
        self.svc.upstreams.expire(now);
        while let Some(entry) = self.svc.timers.pop_due(now) {
            let key = entry.1;
            let Some(conn) = self.conns.get_mut(key) else {
                continue;
            };
            if self.svc.timers.settle(entry, &mut conn.deadline, now) {
                self.expired.push(key);
            }
        }
        while let Some(key) = self.expired.pop() {
            if let Some(conn) = self.conns.get_mut(key) {
                let verdict = conn.on_timeout(key, &mut self.svc);
                self.settle(key, verdict);
            }
        }
    }

    fn maybe_resume_accepting(&mut self) {
        if let Some(at) = self.accept_retry_at {
            if self.svc.clock.now < at {
                return;
            }
            self.accept_retry_at = None;
        }
        if self.conns.len() < self.svc.config.worker_connections.get() {
            if let Err(e) = self.resume_accepting() {
                forkd_shared::error!("resuming accepts failed: {e}");
            }
        }
    }

    fn resume_accepting(&mut self) -> io::Result<()> {
        if self.accepting {
            return Ok(());
        }
        let epfd = self.poll.as_raw_fd();
        for (i, slot) in self.listeners.iter().enumerate() {
            epoll::add(
                epfd,
                slot.sock.as_raw_fd(),
                LISTENER_BASE - i,
                self.exclusive,
            )?;
        }
        self.accepting = true;
        Ok(())
    }

    fn pause_accepting(&mut self) {
        if !self.accepting {
            return;
        }
        let epfd = self.poll.as_raw_fd();
        for slot in &self.listeners {
            if let Err(e) = epoll::remove(epfd, slot.sock.as_raw_fd()) {
                forkd_shared::error!("removing listener from epoll failed: {e}");
            }
        }
        self.accepting = false;
    }
}

//! The master's loop: start the workers, then react to signals and to workers ending.
//!
//! | signal      | action                                                           |
//! |-------------|------------------------------------------------------------------|
//! | TERM, QUIT  | graceful stop: workers drain (QUIT), forced at `drain_timeout`   |
//! | INT         | fast stop: workers exit at once                                  |
//! | HUP         | reload: validate the new file; on success a new generation of    |
//! |             | workers starts, then the old one drains; on error nothing changes |
//! | USR1        | re-open log files, here and in every worker                      |
//! | CHLD        | reap; respawn a worker in its slot (backing off if it keeps dying)|
//!
//! Signal handling only collects signals (signalfd); all work happens here.

use crate::daemon::PidFile;
use crate::listeners::Sockets;
use crate::process::{self, Ended};
use crate::signals::Signals;
use forkd_shared::config::Config;
use forkd_shared::exit;
use forkd_shared::shm::layout::{bump, WorkerState, MAX_LISTENERS};
use forkd_shared::shm::master::{self as shm_master, SlotAllocator};
use forkd_shared::shm::Region;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

/// A worker that dies this many times within `CRASH_WINDOW` is respawned with backoff.
const CRASH_LIMIT: usize = 5;
const CRASH_WINDOW: Duration = Duration::from_secs(10);
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// After `drain_timeout`, workers still alive get this long before SIGKILL.
const KILL_GRACE: Duration = Duration::from_secs(1);

/// One place in the current generation of workers.
struct Slot {
    pid: Option<Pid>,
    /// Its row in the stats region while a worker runs in it.
    region_slot: Option<usize>,
    /// Recent deaths, for backoff.
    deaths: VecDeque<Instant>,
    respawn_at: Option<Instant>,
    /// The worker failed to initialise: respawning would fail the same way.
    failed: bool,
}

/// A worker of an earlier generation.
struct Retiring {
    pid: Pid,
    /// Its row in the stats region.
    row: usize,
    /// It was told to drain (SIGUSR2).
    signaled: bool,
}

/// How long a reload waits for the new generation to serve before retiring the old.
const NEW_GENERATION_WAIT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Running,
    /// Graceful stop: workers were sent QUIT; SIGKILL at `kill_at`.
    Stopping {
        kill_at: Instant,
    },
    /// Fast stop: workers were sent INT; SIGKILL at `kill_at`.
    FastStopping {
        kill_at: Instant,
    },
}

struct Supervisor {
    config: Config,
    sockets: Sockets,
    slots: Vec<Slot>,
    /// Workers of earlier generations, draining after a reload.
    retiring: Vec<Retiring>,
    /// When to retire the old generation even if the new one is not serving yet.
    retire_after: Option<Instant>,
    state: State,
    region: Rc<Region>,
    region_slots: SlotAllocator,
    /// Configuration generation: 1 at start, +1 per successful reload.
    generation: u64,
}

/// Runs the master until it stops; returns the exit code.
pub fn run(config: Config) -> i32 {
    if let Err(e) = forkd_shared::log::init(&config.error_log, config.log_level, "-") {
        eprintln!("forkd: cannot open the error log: {e}");
        return 1;
    }
    if let Err(e) = PidFile::check_free(&config.pid_file) {
        forkd_shared::log_at!(forkd_shared::config::LogLevel::Emerg, "{e}");
        return 1;
    }
    let region = match Region::create(&config.shm_file, std::process::id() as i32) {
        Ok(r) => Rc::new(r),
        Err(e) => {
            forkd_shared::log_at!(forkd_shared::config::LogLevel::Emerg, "{e}");
            return 1;
        }
    };
    let sockets = match Sockets::open(&config, None) {
        Ok(s) => s,
        Err(e) => {
            forkd_shared::log_at!(forkd_shared::config::LogLevel::Emerg, "{e}");
            return 1;
        }
    };
    let mut signals = match Signals::install() {
        Ok(s) => s,
        Err(e) => {
            forkd_shared::log_at!(
                forkd_shared::config::LogLevel::Emerg,
                "signalfd failed: {e}"
            );
            return 1;
        }
    };
    let pid_file = match PidFile::write(&config.pid_file) {
        Ok(p) => p,
        Err(e) => {
            forkd_shared::log_at!(forkd_shared::config::LogLevel::Emerg, "{e}");
            return 1;
        }
    };
    let mut sup = Supervisor {
        slots: Vec::new(),
        retiring: Vec::new(),
        retire_after: None,
        state: State::Running,
        region,
        region_slots: SlotAllocator::default(),
        generation: 1,
        sockets,
        config,
    };
    let published = std::fs::read_to_string(&sup.config.file)
        .map_err(|e| e.to_string())
        .and_then(|text| {
            let path = sup.config.file.display().to_string();
            shm_master_publish(&sup.region, 1, &path, &text)
        });
    if let Err(e) = published {
        forkd_shared::log_at!(
            forkd_shared::config::LogLevel::Emerg,
            "publishing the configuration failed: {e}"
        );
        return 1;
    }
    sup.region
        .layout()
        .header
        .config_generation
        .store(1, Relaxed);
    sup.publish_system_stats();
    sup.start_generation();
    forkd_shared::notice!(
        "forkd {} started: {} worker(s), accept {:?}, listening on {}",
        env!("CARGO_PKG_VERSION"),
        sup.slots.len(),
        sup.config.accept,
        sup.sockets
            .addrs
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let code = sup.run(&mut signals);
    drop(pid_file);
    forkd_shared::notice!("forkd exited");
    code
}

impl Supervisor {
    fn run(&mut self, signals: &mut Signals) -> i32 {
        loop {
            for signal in signals.wait(self.wait_time()) {
                self.on_signal(signal);
            }
            for (pid, how) in process::reap_children() {
                self.on_child_ended(pid, how);
            }
            self.publish_system_stats();
            let now = Instant::now();
            match self.state {
                State::Running => {
                    self.respawn_due(now);
                    self.retire_old_generation(now);
                    if !self.slots.is_empty() && self.slots.iter().all(|s| s.failed) {
                        forkd_shared::alert!("no worker can start; exiting");
                        self.signal_all(Signal::SIGKILL);
                        return 1;
                    }
                }
                State::Stopping { kill_at } | State::FastStopping { kill_at } => {
                    if self.live_workers() == 0 {
                        return exit::OK;
                    }
                    if now >= kill_at {
                        forkd_shared::warn!(
                            "{} worker(s) still running at the stop deadline: killing them",
                            self.live_workers()
                        );
                        self.signal_all(Signal::SIGKILL);
                        self.state = State::FastStopping {
                            kill_at: now + Duration::from_secs(3600),
                        };
                    }
                }
            }
        }
    }

    /// How long to wait for signals: until the next respawn or deadline, at most 1 s.
    fn wait_time(&self) -> Duration {
        let now = Instant::now();
        let mut until = now + Duration::from_secs(1);
        for at in self.slots.iter().filter_map(|s| s.respawn_at) {
            until = until.min(at);
        }
        if let State::Stopping { kill_at } | State::FastStopping { kill_at } = self.state {
            until = until.min(kill_at);
        }
        if self.retire_after.is_some() {
            // Watching the new generation come up.
            until = until.min(now + Duration::from_millis(10));
        }
        until.saturating_duration_since(now)
    }

    /// Kernel counters the workers cannot see: listen overflows, accept-queue depths.
    fn publish_system_stats(&self) {
        let sys = &self.region.layout().system;
        if let Some(n) = shm_master::read_listen_overflows() {
            sys.listen_overflows.store(n, Relaxed);
        }
        let queues = self.sockets.queue_depths();
        for (stat, (addr, depth, max)) in sys.listeners.iter().zip(&queues) {
            stat.addr.set(&addr.to_string());
            stat.queue_depth.store(*depth, Relaxed);
            stat.queue_max.store(*max, Relaxed);
        }
        sys.listener_count
            .store(queues.len().min(MAX_LISTENERS) as u32, Relaxed);
    }

    fn live_workers(&self) -> usize {
        self.slots.iter().filter(|s| s.pid.is_some()).count() + self.retiring.len()
    }

    fn on_signal(&mut self, signal: Signal) {
        match signal {
            Signal::SIGCHLD => {} // reaped right after
            Signal::SIGTERM | Signal::SIGQUIT => self.stop_gracefully(),
            Signal::SIGINT => self.stop_fast(),
            Signal::SIGHUP => self.reload(),
            Signal::SIGUSR1 => {
                if let Err(e) = forkd_shared::log::reopen() {
                    forkd_shared::error!("reopening the error log failed: {e}");
                }
                forkd_shared::notice!("reopening logs");
                self.signal_all(Signal::SIGUSR1);
            }
            other => forkd_shared::notice!("{other} ignored: not supported yet"),
        }
    }

    fn stop_gracefully(&mut self) {
        if self.state != State::Running {
            return;
        }
        forkd_shared::notice!("graceful stop: draining workers");
        let kill_at =
            Instant::now() + self.config.shutdown_delay + self.config.drain_timeout + KILL_GRACE;
        self.state = State::Stopping { kill_at };
        self.signal_all(Signal::SIGQUIT);
    }

    fn stop_fast(&mut self) {
        if matches!(self.state, State::FastStopping { .. }) {
            return;
        }
        forkd_shared::notice!("fast stop");
        self.state = State::FastStopping {
            kill_at: Instant::now() + Duration::from_secs(5),
        };
        self.signal_all(Signal::SIGINT);
    }

    fn signal_all(&self, signal: Signal) {
        let pids = self
            .slots
            .iter()
            .filter_map(|s| s.pid)
            .chain(self.retiring.iter().map(|r| r.pid));
        for pid in pids {
            if let Err(e) = kill(pid, signal) {
                forkd_shared::warn!("kill({pid}, {signal}) failed: {e}");
            }
        }
    }

    /// Spawns a full set of workers for the current configuration.
    fn start_generation(&mut self) {
        if let Some(n) = self.config.rlimit_nofile {
            // rlimits are inherited across fork: raising ours raises every worker's.
            forkd_worker::setup::raise_nofile(n);
        }
        self.slots = (0..self.config.workers.get())
            .map(|_| Slot {
                pid: None,
                region_slot: None,
                deaths: VecDeque::new(),
                respawn_at: None,
                failed: false,
            })
            .collect();
        for slot in 0..self.slots.len() {
            self.spawn(slot);
        }
    }

    fn spawn(&mut self, slot: usize) {
        let Some(row) = self.region_slots.take() else {
            // Cannot happen while `workers` is at most half the region's rows.
            forkd_shared::alert!("no free stats row for worker {slot}; retrying");
            self.slots[slot].respawn_at = Some(Instant::now() + BACKOFF_MIN);
            return;
        };
        shm_master::claim_slot(self.region.layout(), row, slot, self.generation);
        match process::spawn_worker(slot, &self.config, &mut self.sockets, &self.region, row) {
            Ok(pid) => {
                self.slots[slot].pid = Some(pid);
                self.slots[slot].region_slot = Some(row);
                self.slots[slot].respawn_at = None;
                forkd_shared::debug!("worker {slot} started as process {pid}");
            }
            Err(e) => {
                shm_master::fold_slot(self.region.layout(), row);
                self.region_slots.give(row);
                forkd_shared::alert!("fork() for worker {slot} failed: {e}; retrying");
                self.slots[slot].respawn_at = Some(Instant::now() + BACKOFF_MIN);
            }
        }
    }

    /// Moves an ended worker's counters into the retired totals and frees its row.
    fn retire_row(&mut self, row: usize) {
        shm_master::fold_slot(self.region.layout(), row);
        self.region_slots.give(row);
    }

    fn on_child_ended(&mut self, pid: Pid, how: Ended) {
        if let Some(i) = self.retiring.iter().position(|r| r.pid == pid) {
            let row = self.retiring.swap_remove(i).row;
            self.retire_row(row);
            forkd_shared::info!("old worker {pid} exited ({how:?})");
            return;
        }
        let Some(slot) = self.slots.iter().position(|s| s.pid == Some(pid)) else {
            // As PID 1, orphans of other processes are re-parented to us: reaped, ignored.
            return;
        };
        self.slots[slot].pid = None;
        if let Some(row) = self.slots[slot].region_slot.take() {
            self.retire_row(row);
        }
        if self.state != State::Running {
            forkd_shared::info!("worker {slot} ({pid}) exited ({how:?})");
            return;
        }
        if how == Ended::Exited(exit::FATAL_INIT) {
            forkd_shared::alert!("worker {slot} ({pid}) could not start; not respawning it");
            self.slots[slot].failed = true;
            return;
        }
        let now = Instant::now();
        let s = &mut self.slots[slot];
        s.deaths.push_back(now);
        while s.deaths.front().is_some_and(|&t| now - t > CRASH_WINDOW) {
            s.deaths.pop_front();
        }
        let delay = if s.deaths.len() >= CRASH_LIMIT {
            let doublings = (s.deaths.len() - CRASH_LIMIT).min(16) as u32;
            (BACKOFF_MIN * 2u32.pow(doublings)).min(BACKOFF_MAX)
        } else {
            Duration::ZERO
        };
        let master = &self.region.layout().master;
        bump(&master.respawns, 1);
        master
            .last_respawn_reason
            .set(&format!("worker {slot} ({pid}) {}", describe(how)));
        if delay.is_zero() {
            forkd_shared::alert!("worker {slot} ({pid}) died ({how:?}); respawning");
            self.spawn(slot);
        } else {
            forkd_shared::alert!(
                "worker {slot} ({pid}) died ({how:?}), {} times in {CRASH_WINDOW:?}; respawning in {delay:?}",
                s.deaths.len()
            );
            s.respawn_at = Some(now + delay);
        }
    }

    fn respawn_due(&mut self, now: Instant) {
        for slot in 0..self.slots.len() {
            if self.slots[slot].pid.is_none()
                && !self.slots[slot].failed
                && self.slots[slot].respawn_at.is_some_and(|at| at <= now)
            {
                self.spawn(slot);
            }
        }
    }

    fn record_reload(&self, result: Result<(), &str>) {
        let master = &self.region.layout().master;
        match result {
            Ok(()) => {
                bump(&master.reloads_ok, 1);
                master.last_reload_error.set("");
            }
            Err(e) => {
                bump(&master.reloads_failed, 1);
                master.last_reload_error.set(e);
            }
        }
    }

    /// Re-reads the configuration; on any error keeps everything as it is.
    fn reload(&mut self) {
        if self.state != State::Running {
            return;
        }
        match self.try_reload() {
            Ok(how) => {
                self.record_reload(Ok(()));
                forkd_shared::notice!(
                    "reloaded {}: generation {} {how}",
                    self.config.file.display(),
                    self.generation
                );
            }
            Err(message) => {
                for line in message.lines() {
                    forkd_shared::error!(
                        "reload failed, keeping the running configuration: {line}"
                    );
                }
                self.record_reload(Err(&message));
            }
        }
    }

    /// Loads, validates and applies the configuration file; on any error nothing
    /// changes. Returns how it was applied.
    fn try_reload(&mut self) -> Result<&'static str, String> {
        let (config, text) =
            Config::load_with_text(&self.config.file).map_err(|e| e.to_string())?;
        if config.accept != self.config.accept {
            return Err(format!(
                "accept cannot change from {:?} to {:?} on reload (the sockets differ): restart, or upgrade the binary",
                self.config.accept, config.accept
            ));
        }
        if config.pid_file != self.config.pid_file {
            forkd_shared::warn!(
                "pid_file cannot change on reload; keeping {}",
                self.config.pid_file.display()
            );
        }
        if config.shm_file != self.config.shm_file {
            forkd_shared::warn!(
                "shm_file cannot change on reload; keeping {}",
                self.config.shm_file.display()
            );
        }
        let new_workers = self.config.needs_new_workers(&config);
        // Open what the new configuration needs before anything changes.
        let sockets = match new_workers {
            Some(_) => {
                Some(Sockets::open(&config, Some(&self.sockets)).map_err(|e| e.to_string())?)
            }
            None => None,
        };
        let generation = self.generation + 1;
        let path = config.file.display().to_string();
        shm_master_publish(&self.region, generation, &path, &text)?;
        if config.error_log != self.config.error_log || config.log_level != self.config.log_level {
            if let Err(e) = forkd_shared::log::init(&config.error_log, config.log_level, "-") {
                forkd_shared::error!(
                    "reload: opening the new error log failed, keeping the old one: {e}"
                );
            }
        }
        self.generation = generation;
        self.config = config;
        self.region
            .layout()
            .header
            .config_generation
            .store(generation, Relaxed);
        let Some(sockets) = sockets else {
            // Workers adopt the snapshot on their next loop turn; wake them for it.
            self.signal_all(Signal::SIGHUP);
            return Ok("adopted in place by the running workers");
        };
        // A new generation: it starts serving, then the old one is retired.
        for slot in &mut self.slots {
            if let (Some(pid), Some(row)) = (slot.pid.take(), slot.region_slot.take()) {
                self.retiring.push(Retiring {
                    pid,
                    row,
                    signaled: false,
                });
            }
        }
        // Sockets the new set does not reuse are closed here (old workers hold their
        // own copies until they have drained them).
        self.sockets = sockets;
        self.start_generation();
        self.retire_after = Some(Instant::now() + NEW_GENERATION_WAIT);
        Ok("with new workers")
    }

    /// Tells the old generation to drain once every new worker serves (or has had
    /// `NEW_GENERATION_WAIT` to get there).
    fn retire_old_generation(&mut self, now: Instant) {
        let Some(deadline) = self.retire_after else {
            return;
        };
        let layout = self.region.layout();
        let all_serving = self.slots.iter().all(|s| match s.region_slot {
            Some(row) => layout.slots[row].state.load(Relaxed) >= WorkerState::Serving as u32,
            None => s.failed,
        });
        if !all_serving && now < deadline {
            return;
        }
        self.retire_after = None;
        for r in self.retiring.iter_mut().filter(|r| !r.signaled) {
            if let Err(e) = kill(r.pid, Signal::SIGUSR2) {
                forkd_shared::warn!("kill({}, SIGUSR2) failed: {e}", r.pid);
            }
            r.signaled = true;
        }
    }
}

/// Publishes the configuration text for workers to adopt.
fn shm_master_publish(
    region: &Region,
    generation: u64,
    path: &str,
    text: &str,
) -> Result<(), String> {
    forkd_shared::shm::snapshot::publish(&region.layout().snapshot, generation, path, text)
        .map_err(|e| e.to_string())
}

fn describe(how: Ended) -> String {
    match how {
        Ended::Exited(code) => format!("exited with code {code}"),
        Ended::Signaled(sig) => format!("was killed by {sig}"),
    }
}

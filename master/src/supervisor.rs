//! The master's loop and its state: react to signals and to workers ending, and apply
//! what the parts it owns report: the workers (`workers.rs`), reload plans
//! (`reload.rs`), the upgrade state machine (`upgrade.rs`) and the new master's
//! takeover (`handover.rs`).
//!
//! | signal      | action                                                             |
//! |-------------|--------------------------------------------------------------------|
//! | TERM, QUIT  | graceful stop: workers drain (QUIT), forced after `drain_timeout`  |
//! | INT         | fast stop: workers exit at once                                    |
//! | HUP         | reload (planned by `reload.rs`); after WINCH: bring the workers back |
//! | USR1        | re-open log files, here and in every worker                        |
//! | USR2        | binary upgrade (`upgrade.rs`)                                      |
//! | WINCH       | retire the workers, keep the master (nginx's manual upgrade flow)  |
//! | CHLD        | reap; respawn in the slot, backing off if it keeps dying (`workers.rs`) |
//!
//! Signals are only collected (signalfd); all work happens in this loop.

use crate::daemon::PidFile;
use crate::handover::{Started, Starting};
use crate::inherited::Inherited;
use crate::listeners::Sockets;
use crate::netstat::Netstat;
use crate::notify;
use crate::preflight;
use crate::process::{self, Ended};
use crate::reload::{self, How};
use crate::signals::Signals;
use crate::upgrade::{self, Upgrade};
use crate::workers::{Spawn, Workers};
use forkd_shared::config::Config;
use forkd_shared::exit;
use forkd_shared::shm::layout::{bump, MAX_LISTENERS};
use forkd_shared::shm::Region;
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

/// After `drain_timeout`, workers still alive get this long before SIGKILL.
const KILL_GRACE: Duration = Duration::from_secs(1);
/// How long systemd's reload waits for the workers before READY=1 is sent anyway.
const RELOAD_READY_WAIT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Running,
    /// A new master (binary upgrade) serves: our workers retire; we exit after them.
    HandingOver,
    /// Graceful stop: workers were sent QUIT; SIGKILL at `kill_at`.
    Stopping {
        kill_at: Instant,
    },
    /// Fast stop: workers were sent INT; SIGKILL at `kill_at`.
    FastStopping {
        kill_at: Instant,
    },
}

/// What the master starts with.
pub struct Start {
    pub config: Config,
    /// The configuration's text, published for the workers.
    pub text: String,
    pub sockets: Sockets,
    pub region: Rc<Region>,
    pub pid_file: Option<PidFile>,
    pub starting: Starting,
    pub upgrade: Upgrade,
}

pub struct Supervisor {
    config: Config,
    /// The configuration text last published, to publish again after a rollback.
    text: String,
    /// The configuration generation this master last published.
    generation: u64,
    sockets: Sockets,
    region: Rc<Region>,
    workers: Workers,
    state: State,
    /// Waiting for the first workers to serve (then READY, or the upgrade handover).
    starting: Option<Starting>,
    /// A reload whose generation the workers have not all reported yet (for READY=1).
    reload_pending: Option<(u64, Instant)>,
    /// Binary upgrades this master starts.
    upgrade: Upgrade,
    pid_file: Option<PidFile>,
    netstat: Netstat,
}

impl Supervisor {
    /// Publishes the configuration and starts the first workers. On failure the
    /// master being upgraded from (if any) is told why.
    pub fn start(start: Start) -> Result<Supervisor, String> {
        let mut sup = Supervisor {
            config: start.config,
            text: String::new(),
            generation: 0,
            sockets: start.sockets,
            region: start.region,
            workers: Workers::default(),
            state: State::Running,
            starting: None,
            reload_pending: None,
            upgrade: start.upgrade,
            pid_file: start.pid_file,
            netstat: Netstat::open(),
        };
        let config = sup.config.clone();
        if let Err(e) = sup.publish(&config, &start.text) {
            let message = format!("publishing the configuration failed: {e}");
            if let Starting::Upgraded(mut child) = start.starting {
                child.failed(&message);
            }
            return Err(message);
        }
        sup.text = start.text;
        sup.rotate_ticket_keys();
        // Before any worker serves: a stats reader never sees a serving worker
        // without its listeners.
        sup.publish_system_stats();
        sup.start_workers();
        sup.starting = Some(start.starting);
        Ok(sup)
    }

    /// Runs until the master stops; returns the exit code. The pid file goes with it.
    pub fn run(mut self, signals: &mut Signals) -> i32 {
        loop {
            for signal in signals.wait(self.wait_time()) {
                self.on_signal(signal);
            }
            for (pid, how) in process::reap_children() {
                // A worker that ran the upstream checks is gone: another takes over
                // at its next look instead of after the heartbeat goes stale.
                forkd_shared::shm::health::release_if_held_by(
                    &self.region.layout().health,
                    pid.as_raw(),
                );
                self.on_child_ended(pid, how);
            }
            self.publish_system_stats();
            self.rotate_ticket_keys();
            forkd_shared::shm::master::recover_fold(self.region.layout());
            let now = Instant::now();
            self.check_starting();
            if self.starting.is_none() && self.upgrade.take_deferred() {
                self.begin_upgrade();
            }
            self.check_reload_done(now);
            let event = self.upgrade.poll(now, self.pid_file.as_mut());
            self.apply_upgrade(event);
            match self.state {
                State::Running => {
                    let (workers, mut spawn) = self.parts();
                    workers.respawn_due(now, &mut spawn);
                    workers.retire_old_generation(now, spawn.region.layout());
                    if self.workers.all_failed() {
                        forkd_shared::alert!("no worker can start; exiting");
                        self.workers.signal_all(Signal::SIGKILL);
                        return 1;
                    }
                }
                State::HandingOver => {
                    if self.workers.live() == 0 {
                        // The pid file (now `.oldbin`) is removed as this master drops.
                        forkd_shared::notice!("upgrade complete: this master exits");
                        return exit::OK;
                    }
                }
                State::Stopping { kill_at } | State::FastStopping { kill_at } => {
                    if self.workers.live() == 0 {
                        return exit::OK;
                    }
                    if now >= kill_at {
                        forkd_shared::warn!(
                            "{} worker(s) still running at the stop deadline: killing them",
                            self.workers.live()
                        );
                        self.workers.signal_all(Signal::SIGKILL);
                        self.state = State::FastStopping {
                            kill_at: now + Duration::from_secs(3600),
                        };
                    }
                }
            }
        }
    }

    /// The workers and what spawning one needs, borrowed side by side.
    fn parts(&mut self) -> (&mut Workers, Spawn<'_>) {
        (
            &mut self.workers,
            Spawn {
                config: &self.config,
                sockets: &mut self.sockets,
                region: &self.region,
                generation: self.generation,
                pid_file: &mut self.pid_file,
            },
        )
    }

    fn start_workers(&mut self) {
        let (workers, mut spawn) = self.parts();
        workers.start(&mut spawn);
    }

    /// How long to wait for signals: until the next respawn or deadline, at most 1 s,
    /// and briefly while watching workers come up.
    fn wait_time(&self) -> Duration {
        let now = Instant::now();
        let mut until = now + Duration::from_secs(1);
        if let Some(at) = self.workers.next_respawn() {
            until = until.min(at);
        }
        if let State::Stopping { kill_at } | State::FastStopping { kill_at } = self.state {
            until = until.min(kill_at);
        }
        let watching = self.workers.replacing()
            || self.starting.is_some()
            || self.reload_pending.is_some()
            || self.upgrade.in_progress();
        if watching {
            until = until.min(now + Duration::from_millis(10));
        }
        until.saturating_duration_since(now)
    }

    /// Makes the TLS ticket key, or rotates it when its period is over (workers read
    /// the keys from the region; a master of a binary upgrade finds them there).
    fn rotate_ticket_keys(&mut self) {
        let area = &self.region.layout().tls_keys;
        let now = forkd_shared::shm::now_ms();
        match forkd_shared::shm::tls_keys::rotate_if_due(
            area,
            now,
            forkd_shared::shm::tls_keys::ROTATION,
        ) {
            Ok(true) => match forkd_shared::shm::tls_keys::read(area).and_then(|k| k.previous) {
                Some(_) => forkd_shared::info!(
                    "TLS session-ticket key rotated (the previous one is accepted for a period)"
                ),
                None => forkd_shared::info!("TLS session-ticket key made"),
            },
            Ok(false) => {}
            Err(e) => forkd_shared::error!("reading /dev/urandom for a TLS ticket key failed: {e}"),
        }
    }

    /// Kernel counters the workers cannot see: listen overflows, accept-queue depths.
    fn publish_system_stats(&mut self) {
        let sys = &self.region.layout().system;
        if let Some(n) = self.netstat.listen_overflows() {
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

    fn on_signal(&mut self, signal: Signal) {
        match signal {
            Signal::SIGCHLD => {} // reaped right after
            Signal::SIGTERM | Signal::SIGQUIT => self.stop_gracefully(),
            Signal::SIGINT => self.stop_fast(),
            Signal::SIGHUP if self.workers.parked() => {
                let (workers, mut spawn) = self.parts();
                workers.unpark(&mut spawn);
            }
            Signal::SIGHUP => self.reload(),
            Signal::SIGUSR1 => {
                if let Err(e) = forkd_shared::log::reopen() {
                    forkd_shared::error!("reopening the error log failed: {e}");
                }
                if let Err(e) = forkd_shared::log::hand_to_workers(&self.config) {
                    forkd_shared::error!("preparing the log files for the workers failed: {e}");
                }
                forkd_shared::notice!("reopening logs");
                self.workers.signal_all(Signal::SIGUSR1);
            }
            Signal::SIGUSR2 => self.begin_upgrade(),
            Signal::SIGWINCH => {
                if self.state == State::Running && !self.workers.parked() {
                    self.workers.park();
                }
            }
            other => forkd_shared::notice!("{other} ignored"),
        }
    }

    fn on_child_ended(&mut self, pid: Pid, how: Ended) {
        if let Some(event) = self.upgrade.child_ended(pid, how, self.pid_file.as_mut()) {
            self.apply_upgrade(Some(event));
            return;
        }
        let respawn = self.state == State::Running;
        let (workers, mut spawn) = self.parts();
        // Not ours: as PID 1, orphans of other processes are re-parented to us.
        workers.child_ended(pid, how, respawn, &mut spawn);
    }

    fn stop_gracefully(&mut self) {
        if !matches!(self.state, State::Running | State::HandingOver) {
            return;
        }
        notify::notify("STOPPING=1");
        forkd_shared::notice!("graceful stop: draining workers");
        self.abandon_upgrade();
        let kill_at =
            Instant::now() + self.config.shutdown_delay + self.config.drain_timeout + KILL_GRACE;
        self.state = State::Stopping { kill_at };
        self.workers.signal_all(Signal::SIGQUIT);
    }

    fn stop_fast(&mut self) {
        if matches!(self.state, State::FastStopping { .. }) {
            return;
        }
        notify::notify("STOPPING=1");
        forkd_shared::notice!("fast stop");
        self.abandon_upgrade();
        self.state = State::FastStopping {
            kill_at: Instant::now() + Duration::from_secs(5),
        };
        self.workers.signal_all(Signal::SIGINT);
    }

    // ---- reload ----

    fn reload(&mut self) {
        if self.state != State::Running {
            return;
        }
        notify::reloading();
        match self.try_reload() {
            Ok(how) => {
                record_reload(&self.region, Ok(()));
                self.reload_pending = Some((self.generation, Instant::now() + RELOAD_READY_WAIT));
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
                record_reload(&self.region, Err(&message));
                let first = message.lines().next().unwrap_or("");
                notify::notify(&format!("STATUS=reload failed: {first}\nREADY=1"));
            }
        }
    }

    /// Loads the configuration file, plans the change and carries it out; on any
    /// error nothing changes. Returns how it was applied.
    fn try_reload(&mut self) -> Result<&'static str, String> {
        let (mut config, text) =
            Config::load_with_text(&self.config.file).map_err(|e| e.to_string())?;
        let plan = reload::plan(&self.config, &config).map_err(|e| e.to_string())?;
        for kept in &plan.kept {
            forkd_shared::warn!("{kept}");
        }
        for warning in &config.warnings {
            forkd_shared::warn!("{warning}");
        }
        config.pid_file = self.config.pid_file.clone();
        config.shm_file = self.config.shm_file.clone();
        // Log files the workers re-open as their user must be theirs first.
        forkd_shared::log::hand_to_workers(&config)
            .map_err(|e| format!("preparing the log files failed: {e}"))?;
        forkd_shared::temp_dir::prepare(&config)
            .map_err(|e| format!("preparing temp_dir failed: {e}"))?;
        use forkd_shared::cache::prepare::{prepare, When};
        prepare(&config, When::Reload)
            .map_err(|e| format!("preparing the cache zones failed: {e}"))?;
        // All or nothing: what the workers would refuse is refused here, before
        // anything is published.
        preflight::check(&self.config, &config, &text, &plan.how, &mut self.pid_file)?;
        // Open what the new configuration needs before anything changes.
        let sockets = match plan.how {
            How::NewGeneration { .. } => Some(
                Sockets::open(&config, Some(&self.sockets), &mut Inherited::default())
                    .map_err(|e| e.to_string())?,
            ),
            How::InPlace => None,
        };
        self.publish(&config, &text)?;
        if plan.reopen_error_log {
            if let Err(e) = forkd_shared::log::init(&config.error_log, config.log_level, "-") {
                forkd_shared::error!(
                    "reload: opening the new error log failed, keeping the old one: {e}"
                );
            }
        }
        self.config = config;
        self.text = text;
        let Some(sockets) = sockets else {
            // Workers adopt the snapshot on their next loop turn; wake them for it.
            self.workers.signal_all(Signal::SIGHUP);
            return Ok("adopted in place by the running workers");
        };
        // Sockets the new set does not reuse are closed here (old workers hold their
        // own copies until they have drained them).
        self.sockets = sockets;
        let (workers, mut spawn) = self.parts();
        workers.replace(&mut spawn, Instant::now());
        Ok("with new workers")
    }

    /// Publishes `text` as this master's next configuration generation. Generations are
    /// numbered region-wide, so two masters sharing the region never reuse one.
    fn publish(&mut self, config: &Config, text: &str) -> Result<(), String> {
        let header = &self.region.layout().header;
        let generation = header.config_generation.load(Relaxed).max(self.generation) + 1;
        let path = config.file.display().to_string();
        // Upstream servers' cells first: workers look them up when they adopt it.
        if let Some(left_out) =
            forkd_shared::shm::tls_certs::publish(&self.region.layout().tls_certs, config)
        {
            forkd_shared::warn!("{left_out}");
        }
        let labels = forkd_shared::shm::upstream::config_labels(config);
        for left_out in
            forkd_shared::shm::upstream::publish_labels(&self.region.layout().upstreams, &labels)
        {
            forkd_shared::warn!("{left_out}");
        }
        forkd_shared::shm::upstream_state::publish_settings(
            &self.region.layout().upstream_state,
            &self.region.layout().upstreams,
            config,
        );
        forkd_shared::shm::snapshot::publish(
            &self.region.layout().snapshot,
            std::process::id() as i32,
            generation,
            &path,
            text,
        )
        .map_err(|e| e.to_string())?;
        header.config_generation.store(generation, Relaxed);
        self.generation = generation;
        Ok(())
    }

    /// READY=1 for systemd once every worker of this master serves the generation a
    /// reload published (or after `RELOAD_READY_WAIT`).
    fn check_reload_done(&mut self, now: Instant) {
        let Some((generation, deadline)) = self.reload_pending else {
            return;
        };
        let in_force = self.workers.in_force(self.region.layout(), generation);
        if in_force {
            let master = &self.region.layout().master;
            master.generation_in_force.store(generation, Relaxed);
        }
        if in_force || now >= deadline {
            self.reload_pending = None;
            notify::notify(&format!(
                "READY=1\nSTATUS=serving configuration generation {generation}"
            ));
        }
    }

    // ---- binary upgrade ----

    /// Once every first worker serves: READY for systemd, and for a new master the
    /// takeover (pid file, `ready` to the old master, MAINPID).
    fn check_starting(&mut self) {
        if self.starting.is_none() || !self.workers.serving(self.region.layout()) {
            return;
        }
        let Some(starting) = self.starting.take() else {
            return;
        };
        let master = &self.region.layout().master;
        master.generation_in_force.store(self.generation, Relaxed);
        match starting.finish(&self.config.pid_file, &self.region) {
            Started::Fresh => {}
            Started::TookOver(pid_file) => self.pid_file = Some(pid_file),
            Started::Failed => {
                // A new master that could not take over: its workers go, it exits.
                self.state = State::FastStopping {
                    kill_at: Instant::now() + Duration::from_secs(5),
                };
                self.workers.signal_all(Signal::SIGINT);
            }
        }
    }

    /// USR2: exec the binary on disk with the listening sockets.
    fn begin_upgrade(&mut self) {
        if self.starting.is_some() && self.state == State::Running {
            // Not every worker serves yet: the upgrade starts as soon as they do.
            self.upgrade.defer();
            return;
        }
        let event = match self.pid_file.as_mut() {
            Some(pid_file) if self.state == State::Running && !self.workers.parked() => self
                .upgrade
                .begin(&self.sockets, pid_file, self.config.upgrade_timeout),
            _ => Some(upgrade::Event::Refused(
                "refused: the master is stopping, handing over, or parked (WINCH)".into(),
            )),
        };
        self.apply_upgrade(event);
    }

    /// The master is stopping: an upgrade under way is abandoned.
    fn abandon_upgrade(&mut self) {
        let event = self
            .upgrade
            .abandon("the master is stopping", self.pid_file.as_mut());
        self.apply_upgrade(event);
    }

    fn apply_upgrade(&mut self, event: Option<upgrade::Event>) {
        let master = &self.region.layout().master;
        match event {
            None => {}
            Some(upgrade::Event::Ready { child }) => {
                bump(&master.upgrades_ok, 1);
                master.last_upgrade_error.set("");
                forkd_shared::notice!(
                    "upgrade: the new master {child} serves; retiring the workers of this one"
                );
                self.state = State::HandingOver;
                self.workers.retire_all();
            }
            Some(upgrade::Event::RolledBack(why)) => {
                let layout = self.region.layout();
                layout
                    .header
                    .master_pid
                    .store(std::process::id() as i32, Relaxed);
                // The new master may have published its configuration: publish ours again.
                let (config, text) = (self.config.clone(), self.text.clone());
                if let Err(e) = self.publish(&config, &text) {
                    forkd_shared::error!(
                        "upgrade rollback: publishing the configuration failed: {e}"
                    );
                }
                self.upgrade_failed(&why);
            }
            Some(upgrade::Event::Refused(why)) => self.upgrade_failed(&why),
        }
    }

    fn upgrade_failed(&self, why: &str) {
        let master = &self.region.layout().master;
        bump(&master.upgrades_failed, 1);
        master.last_upgrade_error.set(why);
        forkd_shared::error!("upgrade failed, rolled back; this master keeps serving: {why}");
        notify::notify(&format!("STATUS=upgrade failed: {why}"));
    }
}

/// Counts a reload and keeps its error for `forkd -s reload` and `forkd stats`.
fn record_reload(region: &Region, result: Result<(), &str>) {
    let master = &region.layout().master;
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

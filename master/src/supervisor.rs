//! The master's loop and its state: react to signals and to workers ending.
//!
//! | signal      | action                                                             |
//! |-------------|--------------------------------------------------------------------|
//! | TERM, QUIT  | graceful stop: workers drain (QUIT), forced after `drain_timeout`  |
//! | INT         | fast stop: workers exit at once                                    |
//! | HUP         | reload (`reload.rs`); after WINCH: bring the workers back          |
//! | USR1        | re-open log files, here and in every worker                        |
//! | USR2        | binary upgrade (`handover.rs`)                                     |
//! | WINCH       | retire the workers, keep the master (nginx's manual upgrade flow)  |
//! | CHLD        | reap; respawn in the slot, backing off if it keeps dying (`workers.rs`) |
//!
//! Signals are only collected (signalfd); all work happens in this loop.

use crate::daemon::PidFile;
use crate::handover::Starting;
use crate::listeners::Sockets;
use crate::notify;
use crate::process;
use crate::signals::Signals;
use crate::upgrade::Upgrade;
use crate::workers::{Retiring, Slot};
use forkd_shared::config::Config;
use forkd_shared::exit;
use forkd_shared::shm::layout::MAX_LISTENERS;
use forkd_shared::shm::master as shm_master;
use forkd_shared::shm::Region;
use nix::sys::signal::{kill, Signal};
use std::ffi::OsString;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

/// After `drain_timeout`, workers still alive get this long before SIGKILL.
const KILL_GRACE: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
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

pub struct Supervisor {
    pub config: Config,
    /// The configuration text last published, to publish again after a rollback.
    pub text: String,
    pub sockets: Sockets,
    pub slots: Vec<Slot>,
    /// Workers of earlier generations, draining after a reload.
    pub retiring: Vec<Retiring>,
    /// When to retire the old generation even if the new one is not serving yet.
    pub retire_after: Option<Instant>,
    pub state: State,
    pub region: Rc<Region>,
    /// The configuration generation this master last published.
    pub generation: u64,
    /// WINCH retired the workers; they come back on HUP.
    pub parked: bool,
    /// Waiting for the first workers to serve (then READY, or the upgrade handover).
    pub starting: Option<Starting>,
    /// A reload whose generation the workers have not all reported yet (for READY=1).
    pub reload_pending: Option<(u64, Instant)>,
    /// A binary upgrade this master started.
    pub upgrade: Option<Upgrade>,
    /// USR2 arrived while the first workers were starting: upgrade once they serve.
    pub upgrade_requested: bool,
    pub pid_file: Option<PidFile>,
    /// This binary and its arguments, as resolved at start (what an upgrade execs).
    pub exe: PathBuf,
    pub args: Vec<OsString>,
}

impl Supervisor {
    pub fn run(&mut self, signals: &mut Signals) -> i32 {
        loop {
            for signal in signals.wait(self.wait_time()) {
                self.on_signal(signal);
            }
            for (pid, how) in process::reap_children() {
                self.on_child_ended(pid, how);
            }
            self.publish_system_stats();
            shm_master::recover_fold(self.region.layout());
            let now = Instant::now();
            self.check_starting();
            self.start_requested_upgrade();
            self.check_reload_done(now);
            self.check_upgrade(now);
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
                State::HandingOver => {
                    if self.live_workers() == 0 {
                        self.finish_handover();
                        return exit::OK;
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

    /// How long to wait for signals: until the next respawn or deadline, at most 1 s,
    /// and briefly while watching workers come up.
    fn wait_time(&self) -> Duration {
        let now = Instant::now();
        let mut until = now + Duration::from_secs(1);
        for at in self.slots.iter().filter_map(|s| s.respawn_at) {
            until = until.min(at);
        }
        if let State::Stopping { kill_at } | State::FastStopping { kill_at } = self.state {
            until = until.min(kill_at);
        }
        let watching = self.retire_after.is_some()
            || self.starting.is_some()
            || self.reload_pending.is_some()
            || self.upgrade.is_some();
        if watching {
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

    pub fn live_workers(&self) -> usize {
        self.slots.iter().filter(|s| s.pid.is_some()).count() + self.retiring.len()
    }

    fn on_signal(&mut self, signal: Signal) {
        match signal {
            Signal::SIGCHLD => {} // reaped right after
            Signal::SIGTERM | Signal::SIGQUIT => self.stop_gracefully(),
            Signal::SIGINT => self.stop_fast(),
            Signal::SIGHUP if self.parked => self.unpark(),
            Signal::SIGHUP => self.reload(),
            Signal::SIGUSR1 => {
                if let Err(e) = forkd_shared::log::reopen() {
                    forkd_shared::error!("reopening the error log failed: {e}");
                }
                forkd_shared::notice!("reopening logs");
                self.signal_all(Signal::SIGUSR1);
            }
            Signal::SIGUSR2 => self.begin_upgrade(),
            Signal::SIGWINCH => self.park(),
            other => forkd_shared::notice!("{other} ignored"),
        }
    }

    fn stop_gracefully(&mut self) {
        if !matches!(self.state, State::Running | State::HandingOver) {
            return;
        }
        notify::notify("STOPPING=1");
        forkd_shared::notice!("graceful stop: draining workers");
        self.abandon_upgrade("the master is stopping");
        let kill_at =
            Instant::now() + self.config.shutdown_delay + self.config.drain_timeout + KILL_GRACE;
        self.state = State::Stopping { kill_at };
        self.signal_all(Signal::SIGQUIT);
    }

    fn stop_fast(&mut self) {
        if matches!(self.state, State::FastStopping { .. }) {
            return;
        }
        notify::notify("STOPPING=1");
        forkd_shared::notice!("fast stop");
        self.abandon_upgrade("the master is stopping");
        self.state = State::FastStopping {
            kill_at: Instant::now() + Duration::from_secs(5),
        };
        self.signal_all(Signal::SIGINT);
    }

    pub fn signal_all(&self, signal: Signal) {
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
}

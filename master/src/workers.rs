//! The master's workers: a generation of slots, spawning, reaping with backoff, and
//! retiring an old generation once a new one serves.

use crate::process::{self, Ended};
use crate::supervisor::{State, Supervisor};
use forkd_shared::exit;
use forkd_shared::shm::layout::{bump, WorkerState};
use forkd_shared::shm::master as shm_master;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

/// A worker that dies this many times within `CRASH_WINDOW` is respawned with backoff.
const CRASH_LIMIT: usize = 5;
const CRASH_WINDOW: Duration = Duration::from_secs(10);
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// How long a reload waits for the new generation to serve before retiring the old.
pub const NEW_GENERATION_WAIT: Duration = Duration::from_secs(5);

/// One place in the current generation of workers.
pub struct Slot {
    pub pid: Option<Pid>,
    /// Its row in the stats region while a worker runs in it.
    pub region_slot: Option<usize>,
    /// Recent deaths, for backoff.
    deaths: VecDeque<Instant>,
    pub respawn_at: Option<Instant>,
    /// The worker failed to initialise: respawning would fail the same way.
    pub failed: bool,
}

/// A worker of an earlier generation.
pub struct Retiring {
    pub pid: Pid,
    /// Its row in the stats region.
    pub row: usize,
    /// It was told to drain (SIGUSR2).
    pub signaled: bool,
}

impl Supervisor {
    /// Spawns a full set of workers for the current configuration.
    pub fn start_generation(&mut self) {
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
        let layout = self.region.layout();
        let Some(row) = shm_master::claim_free_slot(layout, slot, self.generation) else {
            // Cannot happen while `workers` is at most half the region's rows.
            forkd_shared::alert!("no free stats row for worker {slot}; retrying");
            self.slots[slot].respawn_at = Some(Instant::now() + BACKOFF_MIN);
            return;
        };
        match process::spawn_worker(slot, &self.config, &mut self.sockets, &self.region, row) {
            Ok(pid) => {
                self.slots[slot].pid = Some(pid);
                self.slots[slot].region_slot = Some(row);
                self.slots[slot].respawn_at = None;
                forkd_shared::debug!("worker {slot} started as process {pid}");
            }
            Err(e) => {
                shm_master::fold_slot(layout, row);
                forkd_shared::alert!("fork() for worker {slot} failed: {e}; retrying");
                self.slots[slot].respawn_at = Some(Instant::now() + BACKOFF_MIN);
            }
        }
    }

    pub fn on_child_ended(&mut self, pid: Pid, how: Ended) {
        if self.upgrade_child_ended(pid, how) {
            return;
        }
        if let Some(i) = self.retiring.iter().position(|r| r.pid == pid) {
            let row = self.retiring.swap_remove(i).row;
            shm_master::fold_slot(self.region.layout(), row);
            forkd_shared::info!("old worker {pid} exited ({how:?})");
            return;
        }
        let Some(slot) = self.slots.iter().position(|s| s.pid == Some(pid)) else {
            // As PID 1, orphans of other processes are re-parented to us: reaped, ignored.
            return;
        };
        self.slots[slot].pid = None;
        if let Some(row) = self.slots[slot].region_slot.take() {
            shm_master::fold_slot(self.region.layout(), row);
        }
        if self.state != State::Running || self.parked {
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
        let reason = format!("worker {slot} ({pid}) {}", describe(how));
        let master = &self.region.layout().master;
        bump(&master.respawns, 1);
        if delay.is_zero() {
            master.last_respawn_reason.set(&reason);
            forkd_shared::alert!("{reason}; respawning");
            self.spawn(slot);
        } else {
            let reason = format!(
                "{reason}, {} times in {CRASH_WINDOW:?}; respawning in {delay:?}",
                s.deaths.len()
            );
            master.last_respawn_reason.set(&reason);
            forkd_shared::alert!("{reason}");
            s.respawn_at = Some(now + delay);
        }
    }

    pub fn respawn_due(&mut self, now: Instant) {
        if self.parked {
            return;
        }
        for slot in 0..self.slots.len() {
            if self.slots[slot].pid.is_none()
                && !self.slots[slot].failed
                && self.slots[slot].respawn_at.is_some_and(|at| at <= now)
            {
                self.spawn(slot);
            }
        }
    }

    /// Moves the current workers to the retiring list (they keep serving until told).
    pub fn demote_generation(&mut self) {
        for slot in &mut self.slots {
            if let (Some(pid), Some(row)) = (slot.pid.take(), slot.region_slot.take()) {
                self.retiring.push(Retiring {
                    pid,
                    row,
                    signaled: false,
                });
            }
        }
    }

    /// Whether every worker of the current generation serves (or cannot start).
    pub fn generation_serving(&self) -> bool {
        let layout = self.region.layout();
        self.slots.iter().all(|s| match s.region_slot {
            Some(row) => layout.slots[row].state.load(Relaxed) >= WorkerState::Serving as u32,
            None => s.failed,
        })
    }

    /// Tells the old generation to drain once every new worker serves (or has had
    /// `NEW_GENERATION_WAIT` to get there).
    pub fn retire_old_generation(&mut self, now: Instant) {
        let Some(deadline) = self.retire_after else {
            return;
        };
        if !self.generation_serving() && now < deadline {
            return;
        }
        self.retire_after = None;
        self.signal_retiring();
    }

    /// SIGUSR2 (drain, readiness unaffected) to every retiring worker not yet told.
    pub fn signal_retiring(&mut self) {
        for r in self.retiring.iter_mut().filter(|r| !r.signaled) {
            if let Err(e) = kill(r.pid, Signal::SIGUSR2) {
                forkd_shared::warn!("kill({}, SIGUSR2) failed: {e}", r.pid);
            }
            r.signaled = true;
        }
    }

    /// WINCH: the workers drain and are not replaced; the master stays (nginx's manual
    /// upgrade flow). HUP brings them back.
    pub fn park(&mut self) {
        if self.state != State::Running || self.parked {
            return;
        }
        forkd_shared::notice!("WINCH: retiring the workers; HUP brings them back");
        self.parked = true;
        self.demote_generation();
        self.signal_retiring();
    }

    pub fn unpark(&mut self) {
        forkd_shared::notice!("HUP after WINCH: starting workers again");
        self.parked = false;
        self.start_generation();
    }
}

pub fn describe(how: Ended) -> String {
    match how {
        Ended::Exited(code) => format!("exited with code {code}"),
        Ended::Signaled(sig) => format!("was killed by {sig}"),
    }
}

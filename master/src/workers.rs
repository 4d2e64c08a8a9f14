//! The master's workers: the current generation of slots, respawning with backoff,
//! the workers of earlier generations still draining, and retiring them once the new
//! generation serves. Owns that state; forks through `process.rs`.

use crate::daemon::PidFile;
use crate::listeners::Sockets;
use crate::process::{self, Ended};
use forkd_shared::config::Config;
use forkd_shared::exit;
use forkd_shared::shm::layout::{bump, Layout, WorkerState};
use forkd_shared::shm::master as shm_master;
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
/// How long a reload waits for the new generation to serve before retiring the old.
const NEW_GENERATION_WAIT: Duration = Duration::from_secs(5);

/// What forking a worker needs from the master: the configuration in force, its
/// sockets, the stats region and the configuration generation the worker starts with.
pub struct Spawn<'a> {
    pub config: &'a Config,
    pub sockets: &'a mut Sockets,
    pub region: &'a Rc<Region>,
    pub generation: u64,
    /// The master's locked pid file, which a worker closes its copy of.
    pub pid_file: &'a mut Option<PidFile>,
}

/// One place in the current generation of workers.
struct Slot {
    pid: Option<Pid>,
    /// Its row in the stats region while a worker runs in it.
    row: Option<usize>,
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

/// Every worker of this master.
#[derive(Default)]
pub struct Workers {
    slots: Vec<Slot>,
    /// Workers of earlier generations, draining after a reload.
    retiring: Vec<Retiring>,
    /// When to retire the old generation even if the new one is not serving yet.
    retire_after: Option<Instant>,
    /// WINCH retired the workers; they come back on HUP.
    parked: bool,
}

impl Workers {
    /// Spawns a full set of workers for `spawn.config`, replacing the slots.
    pub fn start(&mut self, spawn: &mut Spawn) {
        if let Some(n) = spawn.config.rlimit_nofile {
            // rlimits are inherited across fork: raising ours raises every worker's.
            forkd_worker::setup::raise_nofile(n);
        }
        self.slots = (0..spawn.config.workers.get())
            .map(|_| Slot {
                pid: None,
                row: None,
                deaths: VecDeque::new(),
                respawn_at: None,
                failed: false,
            })
            .collect();
        for slot in 0..self.slots.len() {
            self.spawn(slot, spawn);
        }
    }

    /// A new generation replaces the current one: the current workers move to the
    /// retiring list and drain once the new ones serve (or `NEW_GENERATION_WAIT`).
    pub fn replace(&mut self, spawn: &mut Spawn, now: Instant) {
        self.demote();
        self.start(spawn);
        self.retire_after = Some(now + NEW_GENERATION_WAIT);
    }

    fn spawn(&mut self, slot: usize, spawn: &mut Spawn) {
        let layout = spawn.region.layout();
        let Some(row) = shm_master::claim_free_slot(layout, slot, spawn.generation) else {
            // Cannot happen while `workers` is at most half the region's rows.
            forkd_shared::alert!("no free stats row for worker {slot}; retrying");
            self.slots[slot].respawn_at = Some(Instant::now() + BACKOFF_MIN);
            return;
        };
        let forked = process::spawn_worker(
            slot,
            spawn.config,
            spawn.sockets,
            spawn.region,
            row,
            spawn.pid_file,
        );
        match forked {
            Ok(pid) => {
                self.slots[slot].pid = Some(pid);
                self.slots[slot].row = Some(row);
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

    /// Handles the end of `pid` if it is one of ours (returns whether it was).
    /// `respawn`: the master is running and wants its slot filled again.
    pub fn child_ended(&mut self, pid: Pid, how: Ended, respawn: bool, spawn: &mut Spawn) -> bool {
        if let Some(i) = self.retiring.iter().position(|r| r.pid == pid) {
            let row = self.retiring.swap_remove(i).row;
            shm_master::fold_slot(spawn.region.layout(), row);
            forkd_shared::info!("old worker {pid} exited ({how:?})");
            return true;
        }
        let Some(slot) = self.slots.iter().position(|s| s.pid == Some(pid)) else {
            return false;
        };
        self.slots[slot].pid = None;
        if let Some(row) = self.slots[slot].row.take() {
            shm_master::fold_slot(spawn.region.layout(), row);
        }
        if !respawn || self.parked {
            forkd_shared::info!("worker {slot} ({pid}) exited ({how:?})");
            return true;
        }
        if how == Ended::Exited(exit::FATAL_INIT) {
            forkd_shared::alert!("worker {slot} ({pid}) could not start; not respawning it");
            self.slots[slot].failed = true;
            return true;
        }
        let now = Instant::now();
        let s = &mut self.slots[slot];
        s.deaths.push_back(now);
        while s.deaths.front().is_some_and(|&t| now - t > CRASH_WINDOW) {
            s.deaths.pop_front();
        }
        let delay = backoff(s.deaths.len());
        let reason = format!("worker {slot} ({pid}) {how}");
        let master = &spawn.region.layout().master;
        bump(&master.respawns, 1);
        if delay.is_zero() {
            master.last_respawn_reason.set(&reason);
            forkd_shared::alert!("{reason}; respawning");
            self.spawn(slot, spawn);
        } else {
            let reason = format!(
                "{reason}, {} times in {CRASH_WINDOW:?}; respawning in {delay:?}",
                s.deaths.len()
            );
            master.last_respawn_reason.set(&reason);
            forkd_shared::alert!("{reason}");
            s.respawn_at = Some(now + delay);
        }
        true
    }

    /// Spawns the workers whose backoff has passed.
    pub fn respawn_due(&mut self, now: Instant, spawn: &mut Spawn) {
        if self.parked {
            return;
        }
        for slot in 0..self.slots.len() {
            let s = &self.slots[slot];
            if s.pid.is_none() && !s.failed && s.respawn_at.is_some_and(|at| at <= now) {
                self.spawn(slot, spawn);
            }
        }
    }

    /// The earliest pending respawn.
    pub fn next_respawn(&self) -> Option<Instant> {
        self.slots.iter().filter_map(|s| s.respawn_at).min()
    }

    /// Whether a new generation is waiting to serve before the old one retires.
    pub fn replacing(&self) -> bool {
        self.retire_after.is_some()
    }

    /// Whether the generation has slots and none of them can start a worker.
    pub fn all_failed(&self) -> bool {
        !self.slots.is_empty() && self.slots.iter().all(|s| s.failed)
    }

    /// Workers alive, of every generation.
    pub fn live(&self) -> usize {
        self.slots.iter().filter(|s| s.pid.is_some()).count() + self.retiring.len()
    }

    /// Moves the current workers to the retiring list (they keep serving until told).
    pub fn demote(&mut self) {
        for slot in &mut self.slots {
            if let (Some(pid), Some(row)) = (slot.pid.take(), slot.row.take()) {
                self.retiring.push(Retiring {
                    pid,
                    row,
                    signaled: false,
                });
            }
        }
    }

    /// Whether every worker of the current generation serves (or cannot start).
    pub fn serving(&self, layout: &Layout) -> bool {
        self.slots.iter().all(|s| match s.row {
            Some(row) => layout.slots[row].state.load(Relaxed) >= WorkerState::Serving as u32,
            None => s.failed,
        })
    }

    /// Whether every worker of the current generation serves configuration
    /// `generation` and no old generation is waiting to be retired.
    pub fn in_force(&self, layout: &Layout, generation: u64) -> bool {
        self.retire_after.is_none()
            && self.slots.iter().all(|s| match s.row {
                Some(row) => {
                    let slot = &layout.slots[row];
                    slot.state.load(Relaxed) == WorkerState::Serving as u32
                        && slot.generation.load(Relaxed) == generation
                }
                None => s.failed || s.pid.is_none(),
            })
    }

    /// Tells the old generation to drain once every new worker serves (or has had
    /// `NEW_GENERATION_WAIT` to get there).
    pub fn retire_old_generation(&mut self, now: Instant, layout: &Layout) {
        let Some(deadline) = self.retire_after else {
            return;
        };
        if !self.serving(layout) && now < deadline {
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

    /// Every worker hands over: the current ones join the retiring and all drain.
    pub fn retire_all(&mut self) {
        self.demote();
        self.signal_retiring();
    }

    pub fn parked(&self) -> bool {
        self.parked
    }

    /// WINCH: the workers drain and are not replaced; the master stays (nginx's manual
    /// upgrade flow). HUP brings them back.
    pub fn park(&mut self) {
        forkd_shared::notice!("WINCH: retiring the workers; HUP brings them back");
        self.parked = true;
        self.retire_all();
    }

    pub fn unpark(&mut self, spawn: &mut Spawn) {
        forkd_shared::notice!("HUP after WINCH: starting workers again");
        self.parked = false;
        self.start(spawn);
    }

    /// Sends `signal` to every live worker, of every generation.
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

/// The respawn delay after `deaths` deaths within `CRASH_WINDOW`.
fn backoff(deaths: usize) -> Duration {
    if deaths < CRASH_LIMIT {
        return Duration::ZERO;
    }
    let doublings = (deaths - CRASH_LIMIT).min(16) as u32;
    (BACKOFF_MIN * 2u32.pow(doublings)).min(BACKOFF_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_starts_at_the_crash_limit_doubles_and_is_capped() {
        assert_eq!(backoff(CRASH_LIMIT - 1), Duration::ZERO);
        assert_eq!(backoff(CRASH_LIMIT), BACKOFF_MIN);
        assert_eq!(backoff(CRASH_LIMIT + 1), BACKOFF_MIN * 2);
        assert_eq!(backoff(CRASH_LIMIT + 100), BACKOFF_MAX);
    }
}

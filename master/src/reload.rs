//! Reload (HUP): load and validate the whole file first; on any error nothing changes.
//! Changes the running workers can take are published as a snapshot in shared memory
//! and adopted in place; changes that need new sockets or processes start a new
//! generation of workers, which serves before the old one drains.

use crate::listeners::Sockets;
use crate::notify;
use crate::supervisor::{State, Supervisor};
use crate::workers::NEW_GENERATION_WAIT;
use forkd_shared::config::Config;
use forkd_shared::shm::layout::{bump, WorkerState};
use forkd_shared::shm::Region;
use nix::sys::signal::Signal;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

/// How long systemd's reload waits for the workers before READY=1 is sent anyway.
const RELOAD_READY_WAIT: Duration = Duration::from_secs(30);

impl Supervisor {
    pub fn reload(&mut self) {
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

    /// Loads, validates and applies the configuration file; on any error nothing
    /// changes. Returns how it was applied.
    fn try_reload(&mut self) -> Result<&'static str, String> {
        let (config, text) =
            Config::load_with_text(&self.config.file).map_err(|e| e.to_string())?;
        if config.accept != self.config.accept {
            return Err(format!(
                "accept cannot change from {:?} to {:?} on reload (the sockets differ): it takes a restart",
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
        // Open what the new configuration needs before anything changes.
        let sockets = match self.config.needs_new_workers(&config) {
            Some(_) => {
                let mut none = crate::inherited::Inherited::default();
                Some(
                    Sockets::open(&config, Some(&self.sockets), &mut none)
                        .map_err(|e| e.to_string())?,
                )
            }
            None => None,
        };
        forkd_shared::log::hand_to_workers(&config)
            .map_err(|e| format!("preparing the log files failed: {e}"))?;
        self.publish(&config, &text)?;
        if config.error_log != self.config.error_log || config.log_level != self.config.log_level {
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
            self.signal_all(Signal::SIGHUP);
            return Ok("adopted in place by the running workers");
        };
        // A new generation: it starts serving, then the old one is retired.
        self.demote_generation();
        // Sockets the new set does not reuse are closed here (old workers hold their
        // own copies until they have drained them).
        self.sockets = sockets;
        self.start_generation();
        self.retire_after = Some(Instant::now() + NEW_GENERATION_WAIT);
        Ok("with new workers")
    }

    /// Publishes `text` as this master's next configuration generation. Generations are
    /// numbered region-wide, so two masters sharing the region never reuse one.
    pub fn publish(&mut self, config: &Config, text: &str) -> Result<(), String> {
        let header = &self.region.layout().header;
        let generation = header.config_generation.load(Relaxed).max(self.generation) + 1;
        let path = config.file.display().to_string();
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
    pub fn check_reload_done(&mut self, now: Instant) {
        let Some((generation, deadline)) = self.reload_pending else {
            return;
        };
        let layout = self.region.layout();
        let in_force = self.retire_after.is_none()
            && self.slots.iter().all(|s| match s.region_slot {
                Some(row) => {
                    let slot = &layout.slots[row];
                    slot.state.load(Relaxed) == WorkerState::Serving as u32
                        && slot.generation.load(Relaxed) == generation
                }
                None => s.failed || s.pid.is_none(),
            });
        if in_force || now >= deadline {
            self.reload_pending = None;
            notify::notify(&format!(
                "READY=1\nSTATUS=serving configuration generation {generation}"
            ));
        }
    }
}

/// Counts a reload and keeps its error for `forkd -s reload` and `forkd stats`.
pub fn record_reload(region: &Region, result: Result<(), &str>) {
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

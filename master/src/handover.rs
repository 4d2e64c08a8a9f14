//! Handing over to a new binary (USR2), on both sides.
//!
//! Old master: `begin_upgrade` execs the new binary (`upgrade.rs`); `check_upgrade`
//! waits for its answer; on `ready` the old workers retire and this master exits after
//! them; on anything else (`error: ...`, the new master exiting, no answer within
//! `upgrade_timeout`) `rollback` stops the new master, restores the pid file, and this
//! master keeps serving.
//!
//! New master: `check_starting` waits until its first workers serve, then writes the
//! pid file, answers `ready`, takes the stats region over, and tells systemd its pid.

use crate::daemon::PidFile;
use crate::inherited::UpgradeChild;
use crate::notify;
use crate::process::Ended;
use crate::supervisor::{State, Supervisor};
use crate::upgrade::{self, Answer};
use crate::workers::describe;
use forkd_shared::shm::layout::bump;
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

/// How this master came to be, until its first workers serve.
pub enum Starting {
    Fresh,
    /// Exec'd by another master, which waits for our answer.
    Upgraded(UpgradeChild),
}

/// How long a new master that is rolled back gets to stop before SIGKILL.
const ROLLBACK_GRACE: Duration = Duration::from_secs(2);

impl Supervisor {
    /// Once every first worker serves: READY for systemd, and for a new master the
    /// handover (pid file, `ready` to the old master, MAINPID).
    pub fn check_starting(&mut self) {
        if self.starting.is_none() || !self.generation_serving() {
            return;
        }
        match self.starting.take() {
            Some(Starting::Fresh) => notify::notify("READY=1\nSTATUS=serving"),
            Some(Starting::Upgraded(mut child)) => {
                match PidFile::write(&self.config.pid_file) {
                    Ok(p) => self.pid_file = Some(p),
                    Err(e) => {
                        child.failed(&e.to_string());
                        forkd_shared::error!("upgrade: {e}; the old master keeps serving");
                        self.stop_after_failed_upgrade();
                        return;
                    }
                }
                let header = &self.region.layout().header;
                header.master_pid.store(std::process::id() as i32, Relaxed);
                child.ready();
                forkd_shared::notice!("upgrade: serving; master {} retires", child.from);
                notify::notify(&format!(
                    "MAINPID={}\nREADY=1\nSTATUS=serving (upgraded)",
                    std::process::id()
                ));
            }
            None => {}
        }
    }

    /// A new master that could not take over: its workers go, it exits.
    fn stop_after_failed_upgrade(&mut self) {
        self.state = State::FastStopping {
            kill_at: Instant::now() + Duration::from_secs(5),
        };
        self.signal_all(Signal::SIGINT);
    }

    /// USR2: exec the binary on disk with the listening sockets.
    pub fn begin_upgrade(&mut self) {
        if self.starting.is_some() && self.state == State::Running {
            // Not every worker serves yet: the upgrade starts as soon as they do.
            forkd_shared::info!("USR2: the upgrade starts once the workers serve");
            self.upgrade_requested = true;
            return;
        }
        if self.state != State::Running || self.parked {
            self.upgrade_failed("refused: the master is stopping, handing over, or parked (WINCH)");
            return;
        }
        if self.upgrade.is_some() {
            forkd_shared::warn!("USR2 ignored: an upgrade is already under way");
            return;
        }
        let oldbin = upgrade::oldbin(&self.config.pid_file);
        if let Err(e) = std::fs::rename(&self.config.pid_file, &oldbin) {
            self.upgrade_failed(&format!(
                "renaming {} to {} failed: {e}",
                self.config.pid_file.display(),
                oldbin.display()
            ));
            return;
        }
        forkd_shared::notice!("upgrade: starting {}", self.exe.display());
        let deadline = Instant::now() + self.config.upgrade_timeout;
        match upgrade::start(&self.exe, &self.args, &self.sockets, deadline) {
            Ok(up) => self.upgrade = Some(up),
            Err(e) => {
                let _ = std::fs::rename(&oldbin, &self.config.pid_file);
                self.upgrade_failed(&e);
            }
        }
    }

    /// Starts an upgrade that USR2 asked for while the workers were starting.
    pub fn start_requested_upgrade(&mut self) {
        if self.upgrade_requested && self.starting.is_none() {
            self.upgrade_requested = false;
            self.begin_upgrade();
        }
    }

    /// Looks at the new master's answer; rolls back on failure or timeout.
    pub fn check_upgrade(&mut self, now: Instant) {
        let Some(up) = self.upgrade.as_mut() else {
            return;
        };
        match up.answer() {
            Answer::Pending if now < up.deadline => {}
            Answer::Pending => {
                let why = format!(
                    "the new master was not ready within upgrade_timeout ({:?})",
                    self.config.upgrade_timeout
                );
                self.rollback(&why);
            }
            Answer::Ready => {
                let child = up.child;
                self.upgrade = None;
                bump(&self.region.layout().master.upgrades_ok, 1);
                self.region.layout().master.last_upgrade_error.set("");
                forkd_shared::notice!(
                    "upgrade: the new master {child} serves; retiring the workers of this one"
                );
                self.state = State::HandingOver;
                self.demote_generation();
                self.signal_retiring();
            }
            Answer::Failed(why) => self.rollback(&why),
            Answer::Closed => {} // the exit status says more: see `upgrade_child_ended`
        }
    }

    /// Whether `pid` was the upgrade's new master; if it ended before answering, the
    /// upgrade is rolled back.
    pub fn upgrade_child_ended(&mut self, pid: Pid, how: Ended) -> bool {
        let Some(up) = self.upgrade.as_mut() else {
            return false;
        };
        if up.child != pid {
            return false;
        }
        let why = match up.answer() {
            Answer::Failed(why) => why,
            _ => format!(
                "the new master {} before it was ready (see the error log)",
                describe(how)
            ),
        };
        self.rollback_reaped(&why);
        true
    }

    /// Stops the new master (INT, then SIGKILL) and keeps serving.
    fn rollback(&mut self, why: &str) {
        if let Some(up) = &self.upgrade {
            stop_child(up.child);
        }
        self.rollback_reaped(why);
    }

    fn rollback_reaped(&mut self, why: &str) {
        self.upgrade = None;
        let oldbin = upgrade::oldbin(&self.config.pid_file);
        if let Err(e) = std::fs::rename(&oldbin, &self.config.pid_file) {
            forkd_shared::error!("upgrade rollback: restoring the pid file failed: {e}");
        }
        let layout = self.region.layout();
        layout
            .header
            .master_pid
            .store(std::process::id() as i32, Relaxed);
        // The new master may have published its configuration: publish ours again.
        let (config, text) = (self.config.clone(), self.text.clone());
        if let Err(e) = self.publish(&config, &text) {
            forkd_shared::error!("upgrade rollback: publishing the configuration failed: {e}");
        }
        self.upgrade_failed(why);
    }

    fn upgrade_failed(&self, why: &str) {
        let master = &self.region.layout().master;
        bump(&master.upgrades_failed, 1);
        master.last_upgrade_error.set(why);
        forkd_shared::error!("upgrade failed, rolled back; this master keeps serving: {why}");
        notify::notify(&format!("STATUS=upgrade failed: {why}"));
    }

    /// The master is stopping: an upgrade under way is abandoned.
    pub fn abandon_upgrade(&mut self, why: &str) {
        if self.upgrade.is_some() {
            self.rollback(why);
        }
    }

    /// The old master's last act: its workers are gone, the new master serves.
    pub fn finish_handover(&mut self) {
        let oldbin = upgrade::oldbin(&self.config.pid_file);
        let _ = std::fs::remove_file(oldbin);
        forkd_shared::notice!("upgrade complete: this master exits");
    }
}

/// INT to a new master being rolled back, SIGKILL if it has not exited in time; reaped.
fn stop_child(pid: Pid) {
    let _ = kill(pid, Signal::SIGINT);
    let deadline = Instant::now() + ROLLBACK_GRACE;
    loop {
        match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Ok(WaitStatus::StillAlive) => {
                let _ = kill(pid, Signal::SIGKILL);
                let _ = waitpid(pid, None);
                return;
            }
            _ => return,
        }
    }
}

//! Binary upgrade, the old master's side: a state machine that execs the binary on
//! disk with the listening sockets inherited, waits for the new master to say it
//! serves, and reports what happened as an [`Event`] for the supervisor to apply.
//!
//! ```text
//! old master                                   new master (exec'd)
//!  USR2 ─ rename pid file to .oldbin
//!       ─ pipe, fork, exec  ───────────────▶  adopt FORKD_LISTENERS, map the region,
//!                                             start workers, wait until they serve,
//!       ◀─────────────── "ready\n" ─────────  write the pid file, sd_notify MAINPID
//!  Event::Ready: retire workers, exit
//!
//!  on "error: ...", EOF, exit or timeout: stop the new master, restore the pid file,
//!  Event::RolledBack: keep serving, and say why.
//! ```
//!
//! ```text
//!  Idle ──USR2 while starting──▶ Deferred ──workers serve──▶ Idle ──begin──▶ Waiting
//!  Waiting ──ready──▶ Idle (Ready)      Waiting ──failure──▶ Idle (RolledBack)
//! ```

use crate::daemon::PidFile;
use crate::inherited::{LISTENERS_ENV, READY_FD_ENV, UPGRADE_FROM_ENV};
use crate::listeners::Sockets;
use crate::process::{self, Ended};
use nix::fcntl::OFlag;
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use std::ffi::{CString, OsString};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long a new master that is rolled back gets to stop before SIGKILL.
const ROLLBACK_GRACE: Duration = Duration::from_secs(2);

/// What an upgrade came to, for the supervisor to apply.
#[derive(Debug, PartialEq, Eq)]
pub enum Event {
    /// The upgrade did not start; nothing was changed.
    Refused(String),
    /// The new master serves: this master's workers retire, and it exits after them.
    Ready { child: Pid },
    /// The new master failed or was stopped: it is gone, the pid file is restored, and
    /// this master keeps serving. The new master may have published its configuration.
    RolledBack(String),
}

enum State {
    Idle,
    /// USR2 arrived while the first workers were starting: upgrade once they serve.
    Deferred,
    Waiting(Waiting),
}

/// An upgrade in progress: the new master and its ready pipe.
struct Waiting {
    child: Pid,
    /// Read end of the ready pipe.
    ready: OwnedFd,
    deadline: Instant,
    timeout: Duration,
    /// Where the pid file goes back to on a rollback.
    pid_path: PathBuf,
    /// Bytes read from the pipe so far.
    buffer: Vec<u8>,
}

/// What the new master said.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    /// Nothing complete yet.
    Pending,
    Ready,
    Failed(String),
    /// The pipe closed without an answer: the new master is gone (or never spoke).
    Closed,
}

/// The old master's side of binary upgrades.
pub struct Upgrade {
    state: State,
    /// This binary and its arguments, as resolved at start (what an upgrade execs).
    exe: PathBuf,
    args: Vec<OsString>,
}

/// `<pid_file>.oldbin`, where the old master's pid file waits during an upgrade.
pub fn oldbin(pid_file: &Path) -> PathBuf {
    let mut name = pid_file.as_os_str().to_os_string();
    name.push(".oldbin");
    PathBuf::from(name)
}

impl Upgrade {
    pub fn new(exe: PathBuf, args: Vec<OsString>) -> Upgrade {
        Upgrade {
            state: State::Idle,
            exe,
            args,
        }
    }

    /// Whether a new master is being waited for.
    pub fn in_progress(&self) -> bool {
        matches!(self.state, State::Waiting(_))
    }

    /// USR2 while the workers start: the upgrade begins once they serve.
    pub fn defer(&mut self) {
        if let State::Idle = self.state {
            forkd_shared::info!("USR2: the upgrade starts once the workers serve");
            self.state = State::Deferred;
        }
    }

    /// Whether an upgrade was deferred (it is no longer).
    pub fn take_deferred(&mut self) -> bool {
        if let State::Deferred = self.state {
            self.state = State::Idle;
            return true;
        }
        false
    }

    /// Renames the pid file to `.oldbin` and execs the new binary with `sockets`.
    pub fn begin(
        &mut self,
        sockets: &Sockets,
        pid_file: &mut PidFile,
        timeout: Duration,
    ) -> Option<Event> {
        if self.in_progress() {
            forkd_shared::warn!("USR2 ignored: an upgrade is already under way");
            return None;
        }
        let path = pid_file.path().to_path_buf();
        let oldbin = oldbin(&path);
        if let Err(e) = pid_file.rename(&oldbin) {
            return Some(Event::Refused(format!(
                "renaming {} to {} failed: {e}",
                path.display(),
                oldbin.display()
            )));
        }
        forkd_shared::notice!("upgrade: starting {}", self.exe.display());
        match self.exec(sockets, timeout, path.clone()) {
            Ok(waiting) => {
                self.state = State::Waiting(waiting);
                None
            }
            Err(e) => {
                let _ = pid_file.rename(&path);
                Some(Event::Refused(e))
            }
        }
    }

    fn exec(
        &self,
        sockets: &Sockets,
        timeout: Duration,
        pid_path: PathBuf,
    ) -> Result<Waiting, String> {
        let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)
            .map_err(|e| format!("pipe2 failed: {e}"))?;
        let list: String = sockets
            .describe()
            .iter()
            .map(|(fd, slot, addr)| format!("{fd}:{slot}:{addr};"))
            .collect();
        let program = CString::new(self.exe.as_os_str().as_bytes())
            .map_err(|_| "the binary path has a NUL byte".to_string())?;
        let mut argv = vec![program.clone()];
        for a in &self.args {
            argv.push(
                CString::new(a.as_bytes()).map_err(|_| "an argument has a NUL byte".to_string())?,
            );
        }
        let mut env: Vec<CString> = std::env::vars_os()
            .filter(|(k, _)| {
                let k = k.as_bytes();
                !matches!(k, b"LISTEN_PID" | b"LISTEN_FDS" | b"LISTEN_FDNAMES")
                    && k != LISTENERS_ENV.as_bytes()
                    && k != READY_FD_ENV.as_bytes()
                    && k != UPGRADE_FROM_ENV.as_bytes()
            })
            .filter_map(|(k, v)| {
                let mut kv = k.as_bytes().to_vec();
                kv.push(b'=');
                kv.extend_from_slice(v.as_bytes());
                CString::new(kv).ok()
            })
            .collect();
        for (k, v) in [
            (LISTENERS_ENV, list),
            (READY_FD_ENV, write.as_raw_fd().to_string()),
            (UPGRADE_FROM_ENV, std::process::id().to_string()),
        ] {
            env.push(CString::new(format!("{k}={v}")).expect("no NUL"));
        }
        let mut inherit = sockets.fds();
        inherit.push(write.as_fd());
        let child = process::spawn_exec(&program, &argv, &env, &inherit, &write)
            .map_err(|e| format!("fork failed: {e}"))?;
        drop(inherit);
        drop(write);
        Ok(Waiting {
            child,
            ready: read,
            deadline: Instant::now() + timeout,
            timeout,
            pid_path,
            buffer: Vec::new(),
        })
    }

    /// Looks at the new master's answer; rolls back on failure or after the deadline.
    pub fn poll(&mut self, now: Instant, pid_file: Option<&mut PidFile>) -> Option<Event> {
        let State::Waiting(waiting) = &mut self.state else {
            return None;
        };
        match waiting.answer() {
            Answer::Pending if now < waiting.deadline => None,
            Answer::Pending => {
                let why = format!(
                    "the new master was not ready within upgrade_timeout ({:?})",
                    waiting.timeout
                );
                Some(self.roll_back(&why, pid_file))
            }
            Answer::Ready => {
                let child = waiting.child;
                self.state = State::Idle;
                Some(Event::Ready { child })
            }
            Answer::Failed(why) => Some(self.roll_back(&why, pid_file)),
            Answer::Closed => None, // the exit status says more: see `child_ended`
        }
    }

    /// If `pid` was the new master, which ended before it was ready: rolled back.
    pub fn child_ended(
        &mut self,
        pid: Pid,
        how: Ended,
        pid_file: Option<&mut PidFile>,
    ) -> Option<Event> {
        let State::Waiting(waiting) = &mut self.state else {
            return None;
        };
        if waiting.child != pid {
            return None;
        }
        let why = match waiting.answer() {
            Answer::Failed(why) => why,
            _ => format!("the new master {how} before it was ready (see the error log)"),
        };
        let pid_path = waiting.pid_path.clone();
        self.state = State::Idle;
        restore(pid_file, &pid_path);
        Some(Event::RolledBack(why))
    }

    /// The master is stopping: an upgrade under way is rolled back.
    pub fn abandon(&mut self, why: &str, pid_file: Option<&mut PidFile>) -> Option<Event> {
        self.in_progress().then(|| self.roll_back(why, pid_file))
    }

    /// Stops the new master (INT, then SIGKILL) and restores the pid file.
    fn roll_back(&mut self, why: &str, pid_file: Option<&mut PidFile>) -> Event {
        if let State::Waiting(waiting) = std::mem::replace(&mut self.state, State::Idle) {
            process::stop_and_reap(waiting.child, Signal::SIGINT, ROLLBACK_GRACE);
            restore(pid_file, &waiting.pid_path);
        }
        Event::RolledBack(why.to_string())
    }
}

/// Puts the pid file back from `.oldbin`.
fn restore(pid_file: Option<&mut PidFile>, path: &Path) {
    let Some(pid_file) = pid_file else {
        return;
    };
    if let Err(e) = pid_file.rename(path) {
        forkd_shared::error!("upgrade rollback: restoring the pid file failed: {e}");
    }
}

impl Waiting {
    /// Reads what the new master wrote, without blocking.
    fn answer(&mut self) -> Answer {
        let mut chunk = [0u8; 512];
        loop {
            match nix::unistd::read(&self.ready, &mut chunk) {
                Ok(0) => {
                    return match self.complete_line() {
                        Some(answer) => answer,
                        None => Answer::Closed,
                    }
                }
                Ok(n) => self.buffer.extend_from_slice(&chunk[..n]),
                Err(nix::errno::Errno::EAGAIN) => {
                    return self.complete_line().unwrap_or(Answer::Pending)
                }
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => return Answer::Closed,
            }
        }
    }

    fn complete_line(&self) -> Option<Answer> {
        let end = self.buffer.iter().position(|&b| b == b'\n')?;
        let line = String::from_utf8_lossy(&self.buffer[..end]).into_owned();
        Some(match line.strip_prefix("error: ") {
            Some(why) => Answer::Failed(why.to_string()),
            None if line == "ready" => Answer::Ready,
            None => Answer::Failed(format!("unexpected message from the new master: {line:?}")),
        })
    }
}

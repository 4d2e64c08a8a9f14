//! Binary upgrade, the old master's side: fork and exec the binary on disk with the
//! listening sockets inherited, then wait for the new master to say it serves.
//!
//! ```text
//! old master                                   new master (exec'd)
//!  USR2 ─ rename pid file to .oldbin
//!       ─ pipe, fork, exec  ───────────────▶  adopt FORKD_LISTENERS, map the region,
//!                                             start workers, wait until they serve,
//!       ◀─────────────── "ready\n" ─────────  write the pid file, sd_notify MAINPID
//!  retire workers, exit
//!
//!  on "error: ...", EOF, exit or timeout: stop the new master, restore the pid file,
//!  keep serving, and say why.
//! ```

use crate::inherited::{LISTENERS_ENV, READY_FD_ENV, UPGRADE_FROM_ENV};
use crate::listeners::Sockets;
use nix::fcntl::{fcntl, FcntlArg, FdFlag, OFlag};
use nix::unistd::{fork, ForkResult, Pid};
use std::ffi::{CString, OsString};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// An upgrade in progress.
pub struct Upgrade {
    pub child: Pid,
    /// Read end of the ready pipe.
    pub ready: OwnedFd,
    pub deadline: Instant,
    /// Bytes read from the pipe so far.
    buffer: Vec<u8>,
}

/// What the new master said.
#[derive(Debug, PartialEq, Eq)]
pub enum Answer {
    /// Nothing complete yet.
    Pending,
    Ready,
    Failed(String),
    /// The pipe closed without an answer: the new master is gone (or never spoke).
    Closed,
}

/// `<pid_file>.oldbin`, where the old master's pid file waits during an upgrade.
pub fn oldbin(pid_file: &Path) -> PathBuf {
    let mut name = pid_file.as_os_str().to_os_string();
    name.push(".oldbin");
    PathBuf::from(name)
}

/// Forks and execs `exe` with `args`, handing over `sockets`.
pub fn start(
    exe: &Path,
    args: &[OsString],
    sockets: &Sockets,
    deadline: Instant,
) -> Result<Upgrade, String> {
    let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)
        .map_err(|e| format!("pipe2 failed: {e}"))?;
    let described = sockets.describe();
    let list: String = described
        .iter()
        .map(|(fd, slot, addr)| format!("{fd}:{slot}:{addr};"))
        .collect();
    let program = CString::new(exe.as_os_str().as_bytes())
        .map_err(|_| "the binary path has a NUL byte".to_string())?;
    let mut argv = vec![program.clone()];
    for a in args {
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
    // SAFETY: the master is single-threaded, so the child may run any code; it only
    // clears close-on-exec flags and execs (or exits).
    match unsafe { fork() }.map_err(|e| format!("fork failed: {e}"))? {
        ForkResult::Parent { child } => {
            drop(write);
            Ok(Upgrade {
                child,
                ready: read,
                deadline,
                buffer: Vec::new(),
            })
        }
        ForkResult::Child => {
            reset_signals();
            sockets.keep_across_exec();
            let _ = fcntl(write.as_fd(), FcntlArg::F_SETFD(FdFlag::empty()));
            let err = nix::unistd::execve(&program, &argv, &env).unwrap_err();
            let _ = nix::unistd::write(
                &write,
                format!("error: exec({}) failed: {err}\n", exe.display()).as_bytes(),
            );
            std::process::exit(127);
        }
    }
}

impl Upgrade {
    /// Reads what the new master wrote, without blocking.
    pub fn answer(&mut self) -> Answer {
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

/// Gives the exec'd program default signal handling: the master's blocked signals
/// would stay blocked across exec, and ignored ones ignored (a shell starts background
/// jobs with INT and QUIT ignored), so a rollback's INT would not stop it.
fn reset_signals() {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, SigmaskHow, Signal};
    let default = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    for sig in [
        Signal::SIGINT,
        Signal::SIGQUIT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGUSR1,
        Signal::SIGUSR2,
        Signal::SIGWINCH,
        Signal::SIGCHLD,
    ] {
        // SAFETY: installing SIG_DFL runs no code of ours in signal context, and this
        // process is single-threaded (the child of a fork, about to exec).
        let _ = unsafe { sigaction(sig, &default) };
    }
    let _ = nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None);
}

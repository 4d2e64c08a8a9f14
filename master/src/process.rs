//! Child processes: every `fork` of the program (a worker; the new master of a
//! binary upgrade, which execs; a reload's check as the workers' user), and reaping.

use crate::daemon::PidFile;
use crate::listeners::Sockets;
use forkd_shared::config::Config;
use forkd_shared::shm::Region;
use forkd_worker::WorkerInit;
use nix::fcntl::{fcntl, FcntlArg, FdFlag};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};
use std::ffi::{CStr, CString};
use std::fmt;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::rc::Rc;

/// Forks the worker for `slot`. In the child this never returns: the worker runs and
/// the process exits with its code.
pub fn spawn_worker(
    slot: usize,
    config: &Config,
    sockets: &mut Sockets,
    region: &Rc<Region>,
    region_slot: usize,
    pid_file: &mut Option<PidFile>,
) -> nix::Result<Pid> {
    let master = nix::unistd::getpid();
    flush_stdout();
    // SAFETY: the master is single-threaded (it never starts a thread), so the child
    // is a complete copy in which any code may run: no lock can be held by a thread
    // that does not exist in the child.
    match unsafe { fork() }? {
        ForkResult::Parent { child } => Ok(child),
        ForkResult::Child => {
            // The pid file's lock says the master lives: a worker that outlives it
            // (draining after the master died) must not hold it.
            if let Some(p) = pid_file.as_mut() {
                p.close_in_child();
            }
            let listeners = std::mem::replace(sockets, Sockets::empty()).into_slot(slot);
            // A panic must not unwind into the master's frames copied into this child
            // (their destructors are the master's to run); it ends the worker with the
            // code an uncaught panic has.
            let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                forkd_worker::run(WorkerInit {
                    slot,
                    config: config.clone(),
                    listeners,
                    exclusive: config.accept == forkd_shared::config::AcceptMode::Shared,
                    master,
                    region: region.clone(),
                    region_slot,
                })
            }))
            .unwrap_or(PANIC_EXIT);
            exit_child(code)
        }
    }
}

/// Forks a child that execs `program` with `argv` and `env`, keeping `inherit` open
/// across the exec (every other descriptor of the master is close-on-exec) and with
/// default signal handling. If the exec fails, the child writes
/// `error: exec(...) failed: ...` on `report` and exits with 127.
pub fn spawn_exec(
    program: &CStr,
    argv: &[CString],
    env: &[CString],
    inherit: &[BorrowedFd],
    report: &OwnedFd,
) -> nix::Result<Pid> {
    flush_stdout();
    // SAFETY: the master is single-threaded, so the child may run any code; it only
    // resets signals, clears close-on-exec flags and execs (or reports and exits).
    match unsafe { fork() }? {
        ForkResult::Parent { child } => Ok(child),
        ForkResult::Child => {
            reset_signals();
            for fd in inherit {
                let _ = fcntl(*fd, FcntlArg::F_SETFD(FdFlag::empty()));
            }
            let err = nix::unistd::execve(program, argv, env).unwrap_err();
            let _ = nix::unistd::write(
                report,
                format!("error: exec({}) failed: {err}\n", program.to_string_lossy()).as_bytes(),
            );
            exit_child(127)
        }
    }
}

/// Runs `check` in a forked child (which closes its copy of the pid file's lock) and
/// returns what it returned, or why it gave no answer within `timeout`. The child
/// ends with `_exit`; the master waits for it and reaps it before returning.
pub fn run_check(
    pid_file: &mut Option<PidFile>,
    timeout: std::time::Duration,
    check: impl FnOnce() -> Result<(), String>,
) -> Result<(), String> {
    use nix::fcntl::OFlag;
    let (read, write) =
        nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| format!("pipe2 failed: {e}"))?;
    flush_stdout();
    // SAFETY: the master is single-threaded, so the child may run any code; it runs
    // `check`, writes one line and `_exit`s.
    let child = match unsafe { fork() }.map_err(|e| format!("fork failed: {e}"))? {
        ForkResult::Parent { child } => child,
        ForkResult::Child => {
            drop(read);
            if let Some(p) = pid_file.as_mut() {
                p.close_in_child();
            }
            let answer = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(check)) {
                Ok(Ok(())) => "ok\n".to_string(),
                Ok(Err(why)) => format!("error: {}\n", why.replace('\n', " | ")),
                Err(_) => "error: the check panicked\n".to_string(),
            };
            let _ = nix::unistd::write(&write, answer.as_bytes());
            exit_child(0)
        }
    };
    drop(write);
    let answer = read_answer(&read, timeout);
    if answer.is_none() {
        let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
    }
    let _ = waitpid(child, None);
    match answer.as_deref().map(|a| a.trim_end_matches('\n')) {
        Some("ok") => Ok(()),
        Some(line) => Err(line
            .strip_prefix("error: ")
            .unwrap_or("the check ended without an answer")
            .to_string()),
        None => Err(format!("the check gave no answer within {timeout:?}")),
    }
}

/// Everything written on `read` until EOF, or None if it is not closed in `timeout`.
fn read_answer(read: &OwnedFd, timeout: std::time::Duration) -> Option<String> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let deadline = std::time::Instant::now() + timeout;
    let mut out = Vec::new();
    let mut chunk = [0u8; 512];
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return None;
        }
        let mut fds = [PollFd::new(read.as_fd(), PollFlags::POLLIN)];
        let millis = left.as_millis().min(u16::MAX as u128) as u16;
        match poll(&mut fds, PollTimeout::from(millis)) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => {}
            Err(_) => return None,
        }
        match nix::unistd::read(read, &mut chunk) {
            Ok(0) => return Some(String::from_utf8_lossy(&out).into_owned()),
            Ok(n) => out.extend_from_slice(&chunk[..n]),
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return None,
        }
    }
}

/// The exit code of a worker that panicked (as an uncaught panic's).
const PANIC_EXIT: i32 = 101;

/// Nothing of the master's may be left in the stdout buffer a child copies: the
/// child would write it a second time.
fn flush_stdout() {
    let _ = std::io::Write::flush(&mut std::io::stdout());
}

/// Ends a forked child that did not exec: its own output flushed, then `_exit`, so
/// none of the master's `atexit` handlers or stdio buffers run a second time
/// (`std::process::exit` would run both).
fn exit_child(code: i32) -> ! {
    flush_stdout();
    // SAFETY: `_exit` ends the process at once and touches no memory of ours (nix
    // 0.32 has no wrapper for it).
    unsafe { libc::_exit(code) }
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

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    Exited(i32),
    Signaled(nix::sys::signal::Signal),
}

impl fmt::Display for Ended {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ended::Exited(code) => write!(f, "exited with code {code}"),
            Ended::Signaled(sig) => write!(f, "was killed by {sig}"),
        }
    }
}

/// Reaps every child that has ended, without blocking.
pub fn reap_children() -> Vec<(Pid, Ended)> {
    let mut ended = Vec::new();
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) => ended.push((pid, Ended::Exited(code))),
            Ok(WaitStatus::Signaled(pid, sig, _)) => ended.push((pid, Ended::Signaled(sig))),
            Ok(WaitStatus::StillAlive) | Err(_) => return ended,
            Ok(_) => continue, // stopped / continued: not an end
        }
    }
}

/// Waits up to `grace` for `pid` to end after `signal`, then SIGKILLs it; reaped.
pub fn stop_and_reap(pid: Pid, signal: nix::sys::signal::Signal, grace: std::time::Duration) {
    use nix::sys::signal::{kill, Signal};
    let _ = kill(pid, signal);
    let deadline = std::time::Instant::now() + grace;
    loop {
        match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10));
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

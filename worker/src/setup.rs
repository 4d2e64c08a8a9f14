//! What a worker does between `fork` and its first loop turn: take over its signals,
//! tie its life to the master's, pin itself to its CPU. Also the descriptor limit,
//! which the master raises before forking so that workers inherit it.

use nix::sys::resource::{getrlimit, setrlimit, Resource};
use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::unistd::Pid;
use std::fmt;

/// Why a worker could not start. The master does not respawn a worker that fails here.
#[derive(Debug)]
pub enum InitError {
    Signals(nix::Error),
    ParentDeathSignal(nix::Error),
    /// The master died between `fork` and this point.
    Orphaned,
    Affinity {
        cpu: usize,
        source: nix::Error,
    },
    Poll(std::io::Error),
    Register {
        what: &'static str,
        source: std::io::Error,
    },
    AccessLog(std::io::Error),
    User {
        name: String,
        why: String,
    },
    NoNewPrivs(nix::Error),
    Tls(crate::tls::acceptor::BuildError),
}

impl fmt::Display for InitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InitError::Signals(e) => write!(f, "setting up signals failed: {e}"),
            InitError::ParentDeathSignal(e) => write!(f, "prctl(PR_SET_PDEATHSIG) failed: {e}"),
            InitError::Orphaned => write!(f, "the master exited before the worker started"),
            InitError::Affinity { cpu, source } => {
                write!(f, "sched_setaffinity(CPU {cpu}) failed: {source}")
            }
            InitError::Poll(e) => write!(f, "epoll_create failed: {e}"),
            InitError::Register { what, source } => write!(f, "epoll_ctl({what}) failed: {source}"),
            InitError::AccessLog(e) => write!(f, "opening the access log failed: {e}"),
            InitError::User { name, why } => write!(f, "switching to user `{name}` failed: {why}"),
            InitError::NoNewPrivs(e) => write!(f, "prctl(PR_SET_NO_NEW_PRIVS) failed: {e}"),
            InitError::Tls(e) => write!(f, "{e}"),
        }
    }
}

/// The signals a worker reads through its signalfd. Everything else is unblocked.
pub fn worker_signals() -> SigSet {
    let mut set = SigSet::empty();
    for s in [
        Signal::SIGQUIT,
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGUSR1,
        Signal::SIGUSR2,
        Signal::SIGHUP,
        Signal::SIGWINCH,
    ] {
        set.add(s);
    }
    set
}

/// Takes over signal handling from the master: exactly the worker's signals blocked
/// and readable from a signalfd (the master's signalfd is not ours to read).
pub fn signals() -> Result<SignalFd, InitError> {
    let set = worker_signals();
    nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&set), None)
        .map_err(InitError::Signals)?;
    SignalFd::with_flags(&set, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
        .map_err(InitError::Signals)
}

/// Makes the kernel send QUIT (graceful stop) to this worker if the master dies, so no
/// worker outlives its master.
pub fn follow_master(master: Pid) -> Result<(), InitError> {
    nix::sys::prctl::set_pdeathsig(Signal::SIGQUIT).map_err(InitError::ParentDeathSignal)?;
    if nix::unistd::getppid() != master {
        return Err(InitError::Orphaned);
    }
    Ok(())
}

/// Pins the worker in `slot` to `cpus[slot % len]`; no-op when `cpus` is empty.
pub fn pin(slot: usize, cpus: &[usize]) -> Result<(), InitError> {
    if cpus.is_empty() {
        return Ok(());
    }
    let cpu = cpus[slot % cpus.len()];
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu)
        .and_then(|()| nix::sched::sched_setaffinity(Pid::from_raw(0), &set))
        .map_err(|source| InitError::Affinity { cpu, source })
}

/// Raises the open-file limit to `want`, clamped to the hard limit with a warning
/// (root may raise the hard limit too). The master calls this before forking, so every
/// worker inherits the raised limit and the warning is logged once, not per worker.
pub fn raise_nofile(want: u64) {
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return;
    };
    if soft >= want {
        return;
    }
    if setrlimit(Resource::RLIMIT_NOFILE, want, want.max(hard)).is_ok() {
        return;
    }
    if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        forkd_shared::warn!("setrlimit(RLIMIT_NOFILE, {hard}) failed: {e}");
    } else {
        forkd_shared::warn!("rlimit_nofile {want} is above the hard limit {hard}: using {hard}");
    }
}

/// Switches to `name`'s uid and to `group` (default: the user's primary group),
/// dropping supplementary groups. Runs after the worker opened what it needs (log
/// files; the region mapping is inherited).
pub fn drop_privileges(name: &str, group: Option<&str>) -> Result<(), InitError> {
    let err = |why: String| InitError::User {
        name: name.to_string(),
        why,
    };
    let user = nix::unistd::User::from_name(name)
        .map_err(|e| err(format!("getpwnam: {e}")))?
        .ok_or_else(|| err("no such user".into()))?;
    let gid = match group {
        None => user.gid,
        Some(g) => {
            nix::unistd::Group::from_name(g)
                .map_err(|e| err(format!("getgrnam({g}): {e}")))?
                .ok_or_else(|| err(format!("no group named `{g}`")))?
                .gid
        }
    };
    if nix::unistd::geteuid() == user.uid && nix::unistd::getegid() == gid {
        return Ok(());
    }
    nix::unistd::setgroups(&[gid]).map_err(|e| err(format!("setgroups: {e}")))?;
    nix::unistd::setgid(gid).map_err(|e| err(format!("setgid({gid}): {e}")))?;
    nix::unistd::setuid(user.uid).map_err(|e| err(format!("setuid({}): {e}", user.uid)))?;
    // prctl(PR_SET_PDEATHSIG) is cleared by a credential change: set it again.
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGQUIT)
        .map_err(|e| err(format!("prctl(PR_SET_PDEATHSIG): {e}")))?;
    Ok(())
}

/// `PR_SET_NO_NEW_PRIVS`: nothing this worker executes can gain privileges (set-uid
/// binaries, file capabilities). A worker never execs, so this only closes doors.
pub fn forbid_new_privileges() -> Result<(), InitError> {
    nix::sys::prctl::set_no_new_privs().map_err(InitError::NoNewPrivs)
}

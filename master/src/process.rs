//! Worker processes: the one `fork` of the program, and reaping.

use crate::listeners::Sockets;
use forkd_shared::config::Config;
use forkd_shared::shm::Region;
use forkd_worker::WorkerInit;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};
use std::rc::Rc;

/// Forks the worker for `slot`. In the child this never returns: the worker runs and
/// the process exits with its code.
pub fn spawn_worker(
    slot: usize,
    config: &Config,
    sockets: &mut Sockets,
    region: &Rc<Region>,
    region_slot: usize,
) -> nix::Result<Pid> {
    let master = nix::unistd::getpid();
    // SAFETY: the master is single-threaded (it never starts a thread), so the child
    // is a complete copy in which any code may run: no lock can be held by a thread
    // that does not exist in the child.
    match unsafe { fork() }? {
        ForkResult::Parent { child } => Ok(child),
        ForkResult::Child => {
            let listeners = std::mem::replace(sockets, Sockets::empty()).into_slot(slot);
            let code = forkd_worker::run(WorkerInit {
                slot,
                config: config.clone(),
                listeners,
                exclusive: config.accept == forkd_shared::config::AcceptMode::Shared,
                master,
                region: region.clone(),
                region_slot,
            });
            std::process::exit(code);
        }
    }
}

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    Exited(i32),
    Signaled(nix::sys::signal::Signal),
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

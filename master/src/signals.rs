//! The master's signals: blocked, and read from a signalfd in the supervisor's loop.
//!
//! No handlers means nothing runs in signal context and nothing of it survives `fork`
//! but the mask, which each worker resets. Blocked signals are also delivered to PID 1
//! (the kernel drops only unblocked, default-action signals sent to init), so the same
//! code serves as a container's entrypoint.

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use std::os::fd::AsFd;
use std::time::Duration;

pub struct Signals {
    fd: SignalFd,
}

impl Signals {
    /// Blocks the master's signals and opens the signalfd that reads them.
    pub fn install() -> nix::Result<Signals> {
        let mut set = SigSet::empty();
        for s in [
            Signal::SIGCHLD,
            Signal::SIGHUP,
            Signal::SIGINT,
            Signal::SIGQUIT,
            Signal::SIGTERM,
            Signal::SIGUSR1,
            Signal::SIGUSR2,
            Signal::SIGWINCH,
        ] {
            set.add(s);
        }
        nix::sys::signal::sigprocmask(SigmaskHow::SIG_BLOCK, Some(&set), None)?;
        let fd = SignalFd::with_flags(&set, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)?;
        Ok(Signals { fd })
    }

    /// Waits up to `timeout` for signals; returns those that arrived.
    pub fn wait(&mut self, timeout: Duration) -> Vec<Signal> {
        let millis = timeout.as_millis().min(60_000) as u16;
        let mut fds = [PollFd::new(self.fd.as_fd(), PollFlags::POLLIN)];
        let _ = poll(&mut fds, PollTimeout::from(millis));
        let mut out = Vec::new();
        while let Ok(Some(info)) = self.fd.read_signal() {
            if let Ok(sig) = Signal::try_from(info.ssi_signo as i32) {
                if !out.contains(&sig) {
                    out.push(sig);
                }
            }
        }
        out
    }
}

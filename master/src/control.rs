//! `forkd -s SIGNAL`: find the running master through the pid file and signal it.

use crate::cli::ControlSignal;
use crate::daemon;
use forkd_shared::config::Config;
use nix::sys::signal::{kill, Signal};

/// The signal the master understands for each `-s` name (as nginx's).
pub fn signal_for(control: ControlSignal) -> Signal {
    match control {
        ControlSignal::Stop => Signal::SIGINT,
        ControlSignal::Quit => Signal::SIGQUIT,
        ControlSignal::Reload => Signal::SIGHUP,
        ControlSignal::Reopen => Signal::SIGUSR1,
    }
}

/// Sends the signal; returns the exit code.
pub fn send(config: &Config, control: ControlSignal) -> i32 {
    let pid = match daemon::read_live(&config.pid_file) {
        Ok(pid) => pid,
        Err(e) => {
            eprintln!("forkd: cannot send {control:?}: {e}");
            return 1;
        }
    };
    let signal = signal_for(control);
    match kill(pid, signal) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("forkd: kill({pid}, {signal}) failed: {e}");
            1
        }
    }
}

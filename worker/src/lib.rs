//! `forkd-worker`: one worker process. The master forks, then calls [`run`].
//!
//! - `setup`: signals, parent-death signal, CPU pinning, fd limit.
//! - `event_loop`: the mio loop: accepting, dispatching events, deadlines, drain.
//! - `conn`: a connection's state machine and I/O.
//! - `http`: sans-io HTTP/1.x parsing and response writing.
//! - `handlers`: what routes do (static files, health probes).
//! - `proxy`: the reverse proxy's sans-io parts (heads, bodies, pools, retries).
//! - [`file_cache`], [`out`], [`timers`], [`clock`], [`access_log`]:
//!   the per-worker machinery those use.
#![forbid(unsafe_code)]

pub mod access_log;
pub mod clock;
pub mod conn;
pub mod event_loop;
pub mod file_cache;
pub mod handlers;
pub mod http;
pub mod out;
pub mod proxy;
pub mod setup;
pub mod stats;
pub mod timers;

use forkd_shared::config::Config;
use forkd_shared::exit;
use std::net::TcpListener;

/// Everything a worker gets from its master.
pub struct WorkerInit {
    /// The worker's slot: its CPU, its reuseport sockets, its name in the logs.
    pub slot: usize,
    pub config: Config,
    /// One listening socket per entry of `config.listeners`, in that order: the shared
    /// sockets, or this slot's reuseport sockets.
    pub listeners: Vec<TcpListener>,
    /// Register listeners with `EPOLLEXCLUSIVE` (shared accept queue).
    pub exclusive: bool,
    pub master: nix::unistd::Pid,
    /// The stats region (mapped by the master before forking) and this worker's slot in it.
    pub region: std::rc::Rc<forkd_shared::shm::Region>,
    pub region_slot: usize,
}

/// Runs the worker until it is told to stop. Returns the process exit code.
pub fn run(init: WorkerInit) -> i32 {
    forkd_shared::log::set_who(&init.slot.to_string());
    let prepared = setup::signals().and_then(|signals| {
        setup::follow_master(init.master)?;
        setup::pin(init.slot, &init.config.cpus)?;
        let user = init.config.user.clone();
        let event_loop = event_loop::EventLoop::new(init, signals)?;
        if let Some(user) = user {
            setup::drop_privileges(&user)?;
        }
        Ok(event_loop)
    });
    match prepared {
        Ok(mut event_loop) => event_loop.run(),
        Err(e) => {
            forkd_shared::alert!("worker cannot start: {e}");
            exit::FATAL_INIT
        }
    }
}

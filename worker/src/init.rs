//! What a worker gets from its master at `fork` (kept apart from `lib.rs` so the
//! event loop can take it without depending on the crate root).

use forkd_shared::config::Config;
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

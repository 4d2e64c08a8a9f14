//! `forkd-worker`: one worker process. The master forks, then calls [`run`].
//!
//! - `setup`: signals, parent-death signal, CPU pinning, fd limit.
//! - `event_loop`: the mio loop: accepting, dispatching events, deadlines, drain.
//! - `conn`: a connection: its state machine and socket I/O (`conn/io.rs`), and
//!   dispatching a request to its handler (`conn/dispatch.rs`).
//! - `services`: what every connection uses (config, routing, pools, logs, stats),
//!   owned by the event loop; `routing`: the servers of each listener.
//! - `limits`: overload protection (rotation at `worker_connections`, per-client
//!   limits shared by the workers).
//! - `overload`: the adaptive concurrency limit of proxied routes, shared by the
//!   workers through the region.
//! - `http`: sans-io HTTP/1.x parsing and response writing.
//! - `proxy_protocol`: the sans-io PROXY protocol v1/v2 header parser; `real_ip`: the
//!   client behind trusted proxies.
//! - `handlers`: what routes do (static files, health probes).
//! - `proxy`: the reverse proxy's sans-io parts (heads, bodies, pools, retries).
//! - `checks`: active health checks and name re-resolution, run by one worker for
//!   the daemon, read by all.
//! - `spool`: proxied bodies held in memory and temporary files (request and
//!   response buffering).
//! - `tls`: HTTPS: the transport under a connection, SNI, shared session tickets.
//! - [`busy`], [`file_cache`], [`out`], [`timers`], [`clock`], [`access_log`]:
//!   the per-worker machinery those use.
#![forbid(unsafe_code)]

pub mod access_log;
pub mod busy;
pub mod cache;
pub mod checks;
pub mod clock;
pub mod conn;
pub mod event_loop;
pub mod file_cache;
pub mod file_pool;
pub mod handlers;
pub mod http;
mod init;
pub mod limits;
pub mod out;
pub mod overload;
pub mod proxy;
pub mod proxy_protocol;
pub mod real_ip;
pub mod routing;
pub mod services;
pub mod setup;
pub mod spool;
pub mod stats;
pub mod timers;
pub mod tls;
pub mod upstream_health;
pub mod upstreams;

#[cfg(test)]
mod test_region;
#[cfg(test)]
mod test_upstream;

use forkd_shared::exit;

pub use init::WorkerInit;

/// Runs the worker until it is told to stop. Returns the process exit code.
pub fn run(init: WorkerInit) -> i32 {
    forkd_shared::log::set_who(&init.slot.to_string());
    let prepared = setup::signals().and_then(|signals| {
        setup::follow_master(init.master)?;
        setup::pin(init.slot, &init.config.cpus)?;
        let user = init.config.user.clone();
        let group = init.config.group.clone();
        let event_loop = event_loop::EventLoop::new(init, signals)?;
        if let Some(user) = user {
            setup::drop_privileges(&user, group.as_deref())?;
        }
        setup::forbid_new_privileges()?;
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

//! The shared-memory stats region: written by the master and its workers, read by
//! `forkd stats`, the `Status` and `Metrics` handlers, and anything else that maps it.
//!
//! - `counters`: the table of counters, declared once.
//! - `cells`: what every area is built from (one-writer counters, the latency
//!   histogram and its buckets, tear-free texts, counter-name tables).
//! - `layout`: what is where (all atomics): the list of areas, composed; no area
//!   imports it.
//! - `limits`: the per-client limits table the workers share.
//! - `mapping`: creating and mapping the file (the only `unsafe`).
//! - `master`: what the master writes: slots of new workers, the counter names,
//!   system counters.
//! - `fold`: moving an exited worker's counters into the retired totals, crash-safe.
//! - `snapshot`: the configuration the master publishes for workers to adopt.
//! - `values`: counter values read out of the region, and their JSON.
//! - `report`: a consistent reading of the region, as JSON, a table or Prometheus text.
//! - `upstream_counters`: the table of per-upstream-server counters, declared once.
//! - `upstream`: the appended upstream area: per-server cells, their labels.
//! - `overload`: the appended overload area: adaptive limits per upstream group,
//!   latency samples per worker, the controllers' lease.
//! - `upstream_values`: upstream cells read out of the region, their JSON and text.
//! - `health`: the appended health area: the active checks' lease, per server its
//!   verdict and resolved addresses.
//! - `upstream_state`: the appended area every worker shares per upstream server:
//!   in flight, passive health, weights (balancing with a global view).
//! - `tls_keys`: the appended area of TLS session-ticket keys (master writes, workers read).
//! - `tls_certs`: the appended area of the certificates in force and their expiry.

pub mod cells;
pub mod counters;
pub mod fold;
pub mod health;
pub mod layout;
pub mod limits;
pub mod mapping;
pub mod master;
pub mod overload;
pub mod report;
pub mod snapshot;
#[cfg(test)]
mod testing;
pub mod tls_certs;
pub mod tls_keys;
pub mod upstream;
pub mod upstream_counters;
pub mod upstream_state;
pub mod upstream_values;
pub mod values;

pub use mapping::{Region, RegionReader, ShmError};

/// Wall-clock milliseconds since the epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// CLOCK_MONOTONIC in milliseconds: the same clock in every process of the machine,
/// so a reader can age a worker's heartbeat.
pub fn monotonic_ms() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |t| {
        t.tv_sec() as u64 * 1000 + t.tv_nsec() as u64 / 1_000_000
    })
}

/// Whether `pid` names a running process (a zombie has stopped running: it holds no
/// lock any more, it only waits to be reaped).
pub fn process_alive(pid: i32) -> bool {
    use nix::errno::Errno;
    if pid <= 0 {
        return false;
    }
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
        Ok(()) | Err(Errno::EPERM) => {}
        Err(_) => return false,
    }
    // `/proc/PID/stat`: "pid (comm) S ...", the state after the last ')'.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !matches!(
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next()),
            Some('Z' | 'X')
        ),
        Err(_) => true,
    }
}

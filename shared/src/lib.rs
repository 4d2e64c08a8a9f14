//! `forkd-shared`: what the forkd master and its workers agree on.
//!
//! - `capacity`: how many workers, upstream servers and addresses the shared-memory
//!   region has room for (what `shm` is laid out by and `config` is checked against).
//! - `config`: the configuration file, from RON text to a validated [`config::Config`].
//! - `log`: the error log (stderr, stdout, a file or syslog), shared by every process.
//! - `sys`: the few OS calls no safe crate wraps; the only `unsafe` of this crate.
//! - `exit`: the exit codes master and workers use to talk about a worker's death.

pub mod cache;
pub mod capacity;
pub mod config;
pub mod exit;
pub mod log;
pub mod shm;
pub mod sys;
pub mod temp_dir;

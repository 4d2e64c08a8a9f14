//! The shared proxy cache, in the worker: one zone's entries are shared by every
//! worker of the daemon through `forkd_shared::cache` (the index in shared memory,
//! the body files); this is what a request on a cached route does with them.
//!
//! - `policy`: what RFC 9111 says may be stored, for how long, and what a request
//!   may be answered with (sans-io);
//! - `key`: a request's key from its route's template, and a head's fields;
//! - `lookup`: answer from the zone, fetch (holding the key's lock), wait, or bypass;
//! - `hit`: a response written from an entry (or a 304 for a conditional request);
//! - `fill`: what a fetch decides at the response head, and the body into its file;
//! - `zones`: the worker's zones, their indexes mapped;
//! - `upkeep`: the worker's cache thread: the loader and manager while this worker
//!   holds a zone's lease, and the background refreshes of `stale-while-revalidate`.

pub mod fill;
pub mod hit;
pub mod key;
pub mod lookup;
pub mod policy;
pub mod purge;
pub mod upkeep;
pub mod zones;

/// What the cache did for a request: the access log's `cache` field (nginx's
/// `$upstream_cache_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheStatus {
    /// Answered from a fresh entry.
    Hit,
    /// Fetched from the application (and stored if it could be).
    Miss,
    /// Answered from a stale entry: while it is refreshed, or the application fails.
    Stale,
    /// A stale entry the application confirmed (304) answered the request.
    Revalidated,
    /// Not for the cache: its method, `no-store`, or no room to track it.
    Bypass,
}

impl CacheStatus {
    pub fn name(self) -> &'static str {
        match self {
            CacheStatus::Hit => "HIT",
            CacheStatus::Miss => "MISS",
            CacheStatus::Stale => "STALE",
            CacheStatus::Revalidated => "REVALIDATED",
            CacheStatus::Bypass => "BYPASS",
        }
    }
}

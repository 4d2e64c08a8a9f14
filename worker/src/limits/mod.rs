//! Protecting the worker and its clients from each other under load.
//!
//! - `rotation`: at `worker_connections` with clients waiting in the accept queue,
//!   which connections make room (idle ones closed, the longest-served told to close).
//! - `admit`: a server's or route's `limits` applied to a request or a connection.
//! - `bucket`: the token bucket a rate limit is, over plain integers (sans-io).
//! - `table`: the per-client counts shared by every worker, in the region.
//! - `log`: the throttled log line (one a second, with a count of those held back).

pub mod admit;
pub mod bucket;
pub mod log;
pub mod rotation;
pub mod table;

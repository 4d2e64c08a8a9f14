//! The adaptive concurrency limit of proxied routes (`overload` on an upstream).
//!
//! - `controller`: the limit of one upstream group from windows of latency samples
//!   (Envoy's gradient controller), sans-io.
pub mod controller;

//! The adaptive concurrency limit of an upstream, as written and as used (the serde
//! types are the validated ones; values are checked while deserializing, so ron
//! reports them where they are written, and `min_limit <= max_limit` is checked by
//! `validate`):
//!
//! ```text
//! upstreams: { "app": (servers: [...], overload: Some((mode: Enforce, sample_every: "100ms",
//!     latency_quantile: 0.9, min_limit: 4, max_limit: 1000, cpu_high: 0.8))) }
//! routes: [(prefix: "/search", handler: Proxy(upstream: "app"), priority: Low)]
//! ```

use super::units::ConfDuration;
use serde::de::{self, Deserializer};
use serde::Deserialize;
use std::time::Duration;

/// `overload` of an upstream.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Overload {
    #[serde(default)]
    pub mode: OverloadMode,
    /// The window latency is summarised over, and how often the limit is computed.
    #[serde(default = "default_sample_every", deserialize_with = "sample_every")]
    pub sample_every: Duration,
    /// The quantile of a window's latencies that stands for it (0 < q <= 1).
    #[serde(default = "default_quantile", deserialize_with = "quantile")]
    pub latency_quantile: f64,
    /// The limit never goes below this (at least 1); also the limit while the
    /// baseline latency is re-measured.
    #[serde(default = "default_min_limit", deserialize_with = "at_least_one")]
    pub min_limit: u32,
    #[serde(default = "default_max_limit", deserialize_with = "at_least_one")]
    pub max_limit: u32,
    /// Worker CPU use (0 < x <= 1) above which `Low` requests are shed.
    #[serde(default = "default_cpu_high", deserialize_with = "cpu_high")]
    pub cpu_high: f64,
}

impl Eq for Overload {}

/// What the limit does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub enum OverloadMode {
    /// No limit, nothing measured.
    #[default]
    Off,
    /// Measured and computed; a request over the limit is counted and logged, and
    /// admitted.
    DryRun,
    /// Over the limit: 503 with `Retry-After` at once.
    Enforce,
}

impl OverloadMode {
    pub fn name(self) -> &'static str {
        match self {
            OverloadMode::Off => "off",
            OverloadMode::DryRun => "dry_run",
            OverloadMode::Enforce => "enforce",
        }
    }
}

/// A route's share of an overloaded upstream: `Low` is shed first, `Critical` keeps a
/// reserved part of the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub enum Priority {
    Critical,
    #[default]
    Normal,
    Low,
}

impl Priority {
    pub const ALL: [Priority; 3] = [Priority::Critical, Priority::Normal, Priority::Low];

    pub fn name(self) -> &'static str {
        match self {
            Priority::Critical => "critical",
            Priority::Normal => "normal",
            Priority::Low => "low",
        }
    }

    /// 0, 1, 2: the index of per-priority counters.
    pub fn index(self) -> usize {
        self as usize
    }
}

fn default_sample_every() -> Duration {
    Duration::from_millis(100)
}
fn default_quantile() -> f64 {
    0.9
}
fn default_min_limit() -> u32 {
    4
}
fn default_max_limit() -> u32 {
    1000
}
fn default_cpu_high() -> f64 {
    0.8
}

fn sample_every<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    let d = ConfDuration::deserialize(deserializer)?.0;
    if d < Duration::from_millis(10) || d > Duration::from_secs(10) {
        return Err(de::Error::custom(format!(
            "sample_every {d:?} is out of range 10ms..=10s"
        )));
    }
    Ok(d)
}

fn quantile<'de, D: Deserializer<'de>>(deserializer: D) -> Result<f64, D::Error> {
    let q = f64::deserialize(deserializer)?;
    if !(q > 0.0 && q <= 1.0) {
        return Err(de::Error::custom(format!(
            "latency_quantile {q} must be above 0 and at most 1 (0.9 is p90)"
        )));
    }
    Ok(q)
}

fn at_least_one<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u32, D::Error> {
    match u32::deserialize(deserializer)? {
        0 => Err(de::Error::custom(
            "a concurrency limit of 0 would admit nothing: at least 1",
        )),
        n => Ok(n),
    }
}

fn cpu_high<'de, D: Deserializer<'de>>(deserializer: D) -> Result<f64, D::Error> {
    let x = f64::deserialize(deserializer)?;
    if !(x > 0.0 && x <= 1.0) {
        return Err(de::Error::custom(format!(
            "cpu_high {x} is a share of one CPU: above 0 and at most 1"
        )));
    }
    Ok(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overload_parses_with_documented_defaults() {
        let o: Overload = ron::from_str("(mode: Enforce)").unwrap();
        assert_eq!(o.mode, OverloadMode::Enforce);
        assert_eq!(o.sample_every, Duration::from_millis(100));
        assert_eq!(o.latency_quantile, 0.9);
        assert_eq!((o.min_limit, o.max_limit), (4, 1000));
        assert_eq!(o.cpu_high, 0.8);
        let o: Overload = ron::from_str(
            r#"(mode: DryRun, sample_every: "250ms", latency_quantile: 0.5, min_limit: 2, max_limit: 50, cpu_high: 1.0)"#,
        )
        .unwrap();
        assert_eq!(o.mode, OverloadMode::DryRun);
        assert_eq!(o.sample_every, Duration::from_millis(250));
        assert_eq!((o.min_limit, o.max_limit), (2, 50));
    }

    #[test]
    fn out_of_range_values_are_refused() {
        for bad in [
            r#"(sample_every: "1ms")"#,
            r#"(sample_every: "1m")"#,
            "(latency_quantile: 0.0)",
            "(latency_quantile: 1.5)",
            "(min_limit: 0)",
            "(max_limit: 0)",
            "(cpu_high: 0.0)",
            "(cpu_high: 2.0)",
            "(mode: On)",
        ] {
            assert!(ron::from_str::<Overload>(bad).is_err(), "{bad}");
        }
    }
}

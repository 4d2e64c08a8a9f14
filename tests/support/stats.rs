//! `forkd stats --json`, parsed with serde_json.

use super::daemon::TestDaemon;
use super::process::BIN;
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Stdio};

/// `forkd stats ARGS... --json`, parsed; Err says what failed.
fn stats_of(args: &[&std::ffi::OsStr]) -> Result<Value, String> {
    let out = Command::new(BIN)
        .arg("stats")
        .args(args)
        .arg("--json")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("run forkd stats: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "forkd stats --json failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| {
        format!(
            "forkd stats --json printed no JSON ({e}):\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// `forkd stats -c CONFIG --json` (the documented form: the subcommand first).
pub fn try_stats_json(config: &Path) -> Result<Value, String> {
    stats_of(&["-c".as_ref(), config.as_os_str()])
}

/// `forkd stats --shm SHM --json` (by region path: the config file may be broken on
/// purpose while this runs).
pub fn try_shm_json(shm: &Path) -> Result<Value, String> {
    stats_of(&["--shm".as_ref(), shm.as_os_str()])
}

/// `forkd stats -c CONFIG --json`; panics if it fails.
pub fn stats_json(config: &Path) -> Value {
    try_stats_json(config).unwrap_or_else(|e| panic!("{e}"))
}

/// `forkd stats --shm SHM --json`; panics if it fails.
pub fn shm_json(shm: &Path) -> Value {
    try_shm_json(shm).unwrap_or_else(|e| panic!("{e}"))
}

/// Whether the region shows every one of `workers` in state "serving" (what the master
/// waits for before it counts as started; it ignores USR2 until then).
pub fn workers_serving(shm: &Path, workers: &[i32]) -> bool {
    let Ok(json) = try_shm_json(shm) else {
        return false;
    };
    let rows = json["workers"].as_array().cloned().unwrap_or_default();
    workers.iter().all(|&w| {
        rows.iter().any(|r| {
            r["pid"].as_i64() == Some(i64::from(w)) && r["state"].as_str() == Some("serving")
        })
    })
}

/// The stats row of `server` (as written in the config) of upstream `upstream`, from
/// `forkd stats -c CONFIG --json`; panics, showing the stats, if there is none.
pub fn upstream_row(config: &Path, upstream: &str, server: &str) -> Value {
    let json = stats_json(config);
    json["upstreams"]
        .as_array()
        .expect("upstreams")
        .iter()
        .find(|u| u["upstream"] == upstream && u["server"] == server)
        .cloned()
        .unwrap_or_else(|| panic!("no row for {upstream} {server}: {json:#}"))
}

/// The counter `key` of a stats snapshot's `totals`; panics, showing them, if there is
/// none.
pub fn total_of(stats: &Value, key: &str) -> u64 {
    stats["totals"][key]
        .as_u64()
        .unwrap_or_else(|| panic!("no counter {key} in {}", stats["totals"]))
}

/// The counter `key` of `d`'s totals now.
pub fn total(d: &TestDaemon, key: &str) -> u64 {
    total_of(&stats_json(&d.config), key)
}

/// A Prometheus text (a `/metrics` body), parsed; panics if it does not parse.
pub fn scrape(text: &str) -> prometheus_parse::Scrape {
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
        .expect("the /metrics body parses")
}

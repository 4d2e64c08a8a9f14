//! Python's HTTP/2 stack for the conformance suite (`tests/h2/`, h2spec's
//! equivalent): PyPI's `h2`, `hyperframe`, `hpack` and `httpx[http2]`, pinned, in a
//! venv made once, and a runner for a group of the checks against a daemon.
//!
//! ```text
//! venv()          ─ once per machine ─▶ <target>/tmp/h2py-PINS-venv, made under a lock
//!                                       so parallel test binaries share it
//! run_group(..)   ─ per test ─────────▶ `python tests/h2/run.py GROUP`, one line per
//!                                       check (ok / FAIL), bounded in time
//! ```

use super::daemon::TempDir;
use super::wait::wait_child;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// The packages installed, pinned; the venv's folder names them, so a new pin gets a
/// new venv instead of reusing one with other versions.
pub const PINS: &[&str] = &[
    "h2==4.1.0",
    "hyperframe==6.0.1",
    "hpack==4.0.0",
    "httpx[http2]==0.28.1",
];

/// The checks: `tests/h2/` in the source tree.
pub fn checks_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/h2")
}

fn venv_name() -> String {
    let pins: Vec<String> = PINS
        .iter()
        .map(|p| p.replace("==", "-").replace(['[', ']'], ""))
        .collect();
    format!("h2py-{}", pins.join("_"))
}

/// The venv with the pinned packages (`venv.rs`), made once per machine.
pub fn venv() -> &'static Path {
    static VENV: OnceLock<PathBuf> = OnceLock::new();
    VENV.get_or_init(|| super::venv::pinned(&venv_name(), PINS))
}

/// What a group of checks reported.
pub struct GroupRun {
    pub group: String,
    /// Every line the runner printed.
    pub output: String,
    /// The lines of the checks that failed (`FAIL ID TITLE: expected ..., saw ...`).
    pub failed: Vec<String>,
    /// Checks that passed: (id, notes: what the RFC's letter and the server differ on,
    /// where h2spec accepts it).
    pub passed: Vec<String>,
}

impl GroupRun {
    /// Panics naming every failed check, what it expected and what it saw; prints
    /// the notes of the passed ones.
    pub fn assert_passed(&self) {
        for line in self.passed.iter().filter(|l| l.contains("[note:")) {
            println!("{line}");
        }
        assert!(
            self.failed.is_empty() && !self.passed.is_empty(),
            "HTTP/2 checks {}: {} failed of {}:\n{}\n\nwhole run:\n{}",
            self.group,
            self.failed.len(),
            self.failed.len() + self.passed.len(),
            self.failed.join("\n"),
            self.output
        );
    }
}

/// Runs `python tests/h2/run.py GROUP [ONLY...]` with `env` (H2_PORT and the
/// rest, see `tests/h2/h2conf.py`), killed after `limit`.
pub fn run_group(group: &str, only: &[&str], env: &[(&str, String)], limit: Duration) -> GroupRun {
    let python = venv().join("bin/python");
    let tmp = TempDir::new();
    let out_path = tmp.path().join("out.txt");
    let err_path = tmp.path().join("err.txt");
    let mut cmd = Command::new(python);
    cmd.arg("run.py")
        .arg(group)
        .args(only)
        .current_dir(checks_dir())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn the venv's python");
    let status = wait_child(&mut child, limit);
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let output = std::fs::read_to_string(&out_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    let mut failed: Vec<String> = output
        .lines()
        .filter(|l| l.starts_with("FAIL"))
        .map(str::to_string)
        .collect();
    let passed = output
        .lines()
        .filter(|l| l.starts_with("ok"))
        .map(str::to_string)
        .collect();
    match status {
        None => failed.push(format!(
            "FAIL {group}: still running after {limit:?} (killed); stderr:\n{stderr}"
        )),
        Some(s) if !s.success() && failed.is_empty() => failed.push(format!(
            "FAIL {group}: the runner exited {s}; stderr:\n{stderr}"
        )),
        Some(_) => {}
    }
    GroupRun {
        group: group.to_string(),
        output,
        failed,
        passed,
    }
}

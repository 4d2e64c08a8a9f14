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

/// A venv with the pinned packages, made once and shared by every test process: the
/// first to take the lock creates it, the others wait on the lock and find it made.
/// A venv left half-made (a killed pip) has no marker and is made again.
pub fn venv() -> &'static Path {
    static VENV: OnceLock<PathBuf> = OnceLock::new();
    VENV.get_or_init(|| {
        let base = option_env!("CARGO_TARGET_TMPDIR")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        std::fs::create_dir_all(&base).unwrap();
        let name = venv_name();
        let dir = base.join(format!("{name}-venv"));
        let lock = std::fs::File::create(base.join(format!("{name}.lock")))
            .expect("create the venv lock file");
        lock.lock().expect("lock the venv lock file");
        let marker = dir.join(".forkd-tests-ready");
        if !marker.exists() {
            create_venv(&dir);
            std::fs::write(&marker, PINS.join("\n")).unwrap();
        }
        drop(lock);
        dir
    })
}

fn create_venv(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
    run(
        Command::new("python3").arg("-m").arg("venv").arg(dir),
        "python3 -m venv (Debian: apt-get install python3-venv)",
    );
    run(
        Command::new(dir.join("bin/python"))
            .args([
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--no-input",
                "--quiet",
            ])
            .args(PINS),
        "pip install h2 hyperframe hpack httpx (needs PyPI)",
    );
}

fn run(cmd: &mut Command, what: &str) {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
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

//! Python venvs with pinned PyPI packages (gunicorn for `gunicorn.rs`, the HTTP/2
//! stack for `h2py.rs`), each made once per machine under
//! `<target>/tmp/NAME-venv` and shared by every test process: the first one to take
//! the lock creates it, the others wait on the lock and find it made. A venv left
//! half-made (a killed pip) has no marker and is made again. The name carries the
//! pins, so a new pin gets a new venv instead of reusing one with other versions.

use super::process::run_ok;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The venv `name` with `pins` installed, made if it is not yet.
pub fn pinned(name: &str, pins: &[&str]) -> PathBuf {
    let base = option_env!("CARGO_TARGET_TMPDIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&base).unwrap();
    let dir = base.join(format!("{name}-venv"));
    let lock = std::fs::File::create(base.join(format!("{name}.lock")))
        .expect("create the venv lock file");
    lock.lock().expect("lock the venv lock file");
    let marker = dir.join(".forkd-tests-ready");
    if !marker.exists() {
        create(&dir, pins);
        std::fs::write(&marker, pins.join("\n")).unwrap();
    }
    drop(lock);
    dir
}

fn create(dir: &Path, pins: &[&str]) {
    let _ = std::fs::remove_dir_all(dir);
    run_ok(
        Command::new("python3").arg("-m").arg("venv").arg(dir),
        "python3 -m venv (Debian: apt-get install python3-venv)",
    );
    run_ok(
        Command::new(dir.join("bin/python"))
            .args([
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--no-input",
                "--quiet",
            ])
            .args(pins),
        &format!("pip install {} (needs PyPI)", pins.join(" ")),
    );
}

//! Helpers for the shared-memory unit tests: a temporary region path, a dead pid.

use std::path::PathBuf;

/// A fresh path for a test's region (removed when dropped).
pub struct TempRegion(pub PathBuf);

impl TempRegion {
    pub fn new(name: &str) -> TempRegion {
        let dir = std::env::temp_dir().join(format!(
            "forkd-shm-{name}-{}-{}",
            std::process::id(),
            super::now_ms()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        TempRegion(dir.join("forkd.shm"))
    }
}

impl Drop for TempRegion {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.0.parent().unwrap());
    }
}

/// The pid of a process that has exited and been reaped.
pub fn dead_pid() -> i32 {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id() as i32;
    child.wait().unwrap();
    pid
}

//! For the worker's unit tests: a shared-memory region in a temporary folder of its
//! own, removed when the test is done (the shared crate's tests have their own copy
//! in `shm::testing`, which is private to that crate).

use forkd_shared::shm::Region;
use std::path::PathBuf;
use std::rc::Rc;

/// The folder of a test's region; dropping it removes the folder.
pub struct TempRegion(PathBuf);

impl Drop for TempRegion {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh region for the test `name` (unique per process and moment).
pub fn region(name: &str) -> (TempRegion, Rc<Region>) {
    let dir = std::env::temp_dir().join(format!(
        "forkd-worker-{name}-{}-{}",
        std::process::id(),
        forkd_shared::shm::now_ms()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let region = Region::create(&dir.join("forkd.shm"), std::process::id() as i32, None).unwrap();
    (TempRegion(dir), Rc::new(region))
}

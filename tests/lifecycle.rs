//! Process lifecycle of the real binary: signals, workers, accept modes, CLI.

mod support;
use support::*;
use std::time::Duration;

#[test]
fn quit_stops_gracefully_and_removes_pid_file() {
    let mut d = TestDaemon::builder().workers(2).start();
    let workers = d.workers();
    assert_eq!(workers.len(), 2);
    let status = d.stop().expect("exits");
    assert!(status.success());
    assert!(!d.pid_file().exists());
    assert!(wait_until(Duration::from_secs(2), || workers.iter().all(|&w| !alive(w))));
}

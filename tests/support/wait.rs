//! Waiting for a condition, a child process or a log line: polling with a deadline,
//! never a fixed sleep standing in for readiness.

use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

/// Polls `cond` every 10 ms until it holds or `timeout` passes.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits for `child` to exit, at most `timeout`; None if it is still running.
pub fn wait_child(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let mut status = None;
    wait_until(timeout, || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    status
}

/// Waits for `child` to exit, at most `timeout`; kills it and panics naming `what` if
/// it does not.
pub fn expect_exit(child: &mut Child, timeout: Duration, what: &str) -> ExitStatus {
    wait_child(child, timeout).unwrap_or_else(|| {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{what} did not exit within {timeout:?}");
    })
}

//! [`Gate`]: a test upstream that holds every request (but `/quick`, answered at
//! once) until the test opens the gate, counting arrivals, so that what is in flight
//! is known exactly and nothing depends on timing.

use super::daemon::SETTLE;
use super::upstream::{Reply, Settings, TestUpstream};
use super::wait::wait_until;
use std::sync::{Arc, Condvar, Mutex};

/// The gate: (open, requests arrived) and the condition upstream threads wait on.
pub struct Gate(Arc<(Mutex<(bool, usize)>, Condvar)>);

impl Gate {
    pub fn closed() -> Gate {
        Gate(Arc::new((Mutex::new((false, 0)), Condvar::new())))
    }

    /// An upstream behind this gate (the upstream records a request only once it
    /// is answered, so arrivals are counted here).
    pub fn upstream(&self) -> TestUpstream {
        let gate = self.0.clone();
        TestUpstream::start(Settings::default(), move |r| {
            if r.path() == "/quick" {
                return Reply::ok(b"quick");
            }
            let (state, cv) = &*gate;
            let mut g = state.lock().unwrap();
            g.1 += 1;
            while !g.0 {
                g = cv.wait(g).unwrap();
            }
            Reply::ok(format!("ok {}", r.path()).as_bytes())
        })
    }

    pub fn set(&self, open: bool) {
        self.0 .0.lock().unwrap().0 = open;
        self.0 .1.notify_all();
    }

    /// Requests that reached the upstream so far.
    pub fn arrived(&self) -> usize {
        self.0 .0.lock().unwrap().1
    }

    pub fn wait_arrived(&self, n: usize) {
        assert!(
            wait_until(SETTLE, || self.arrived() >= n),
            "the upstream got {} requests, not {n}",
            self.arrived()
        );
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.set(true); // no upstream thread stays blocked
    }
}

//! Who gets in over an upstream group's limit, as a pure function of the limit, the
//! priority and the worker's CPU use; and the [`Ticket`] an admitted request holds
//! until its upstream side ends (dropping it uncounts the request, whatever path the
//! exchange ends by).
//!
//! ```text
//! reserve  = ceil(limit / 10) + the most Critical requests in flight at once in the
//!            last window, between 1 and limit / 2      (published by the lease holder)
//! Critical: admitted while in flight < limit
//! Normal:   admitted while in flight < limit - reserve
//! Low:      admitted while in flight < limit - 2·reserve, and never while the
//!           worker's CPU use is above cpu_high
//! (Normal and Low caps are at least 1.)
//! ```
//!
//! A fixed share is not enough once Critical traffic is a real part of the load: at
//! 3x an upstream's capacity with a tenth of the requests Critical (a third of the
//! capacity), Normal keeps the count at its cap all the time, so Critical has little
//! more than the reserve (2 of a limit of 14, where it needs about 4), and
//! `bench/overload` shed 0.3-5% of Critical requests with a fixed tenth or fifth. So
//! the reserve follows what Critical uses. It costs no capacity when Critical is idle
//! (a tenth), and the controller raises the limit while latency allows.

use forkd_shared::config::overload::Priority;
use forkd_shared::shm::overload::RingSample;
use forkd_shared::shm::Region;
use std::rc::Rc;

/// The part of `limit` kept for Critical, when at most `critical_peak` Critical
/// requests were in flight at once lately.
pub fn reserve(limit: u64, critical_peak: u64) -> u64 {
    (limit.div_ceil(10) + critical_peak).clamp(1, (limit / 2).max(1))
}

/// How many may be in flight when a request of `priority` arrives, for it to be
/// admitted; 0: shed whatever the count (Low on a hot CPU).
pub fn cap(limit: u64, reserve: u64, priority: Priority, cpu_hot: bool) -> u64 {
    let limit = limit.max(1);
    match priority {
        Priority::Critical => limit,
        Priority::Normal => limit.saturating_sub(reserve).max(1),
        Priority::Low if cpu_hot => 0,
        Priority::Low => limit.saturating_sub(2 * reserve).max(1),
    }
}

/// What admission says of a proxied request.
#[derive(Debug)]
pub enum Admission {
    /// Go ahead; with a ticket when the group counts its requests (not `Off`).
    Admit(Option<Ticket>),
    /// Over the limit in `Enforce`: 503 with `Retry-After` now.
    Shed,
}

/// An admitted request's place in its group's in-flight count (global and this
/// worker's share); given back when dropped.
pub struct Ticket {
    pub(super) region: Rc<Region>,
    pub(super) row: usize,
    pub(super) cell: usize,
    /// When it was admitted (the worker clock's µs): its latency is measured from here.
    pub(super) admitted_at: u64,
    /// Admitted while the baseline was being measured.
    pub(super) probe: bool,
    /// A latency sample was recorded (one per request).
    pub(super) sampled: bool,
    /// Counted among the group's Critical requests too.
    pub(super) critical: bool,
}

impl Ticket {
    /// Records the request's latency, once: the response head arrived at `now`. Only
    /// admitted requests that got a response are samples; shed ones never are.
    pub fn completed(&mut self, now: u64) {
        if std::mem::replace(&mut self.sampled, true) {
            return;
        }
        let o = &self.region.layout().overload;
        o.slots[self.row].push(RingSample {
            group: self.cell,
            latency_us: now.saturating_sub(self.admitted_at),
            probe: self.probe,
        });
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let o = &self.region.layout().overload;
        o.slots[self.row].inflight[self.cell].fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        o.groups[self.cell].leave(1);
        if self.critical {
            o.slots[self.row].critical[self.cell].fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
            o.groups[self.cell].leave_critical(1);
        }
    }
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket")
            .field("cell", &self.cell)
            .field("admitted_at", &self.admitted_at)
            .field("probe", &self.probe)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn low_is_shed_first_and_critical_keeps_a_reserve() {
        let r = reserve(100, 0);
        assert_eq!(r, 10, "a tenth while Critical is idle");
        assert_eq!(cap(100, r, Priority::Critical, false), 100);
        assert_eq!(cap(100, r, Priority::Normal, false), 90);
        assert_eq!(cap(100, r, Priority::Low, false), 80);
        // Critical traffic in flight widens its reserve, up to half the limit.
        assert_eq!(reserve(14, 4), 6);
        assert_eq!(cap(14, 6, Priority::Normal, false), 8);
        assert_eq!(cap(14, 6, Priority::Low, false), 2);
        assert_eq!(reserve(14, 40), 7);
        assert_eq!(reserve(4, 0), 1);
        assert_eq!(cap(4, 1, Priority::Critical, false), 4);
        assert_eq!(cap(4, 1, Priority::Normal, false), 3);
        assert_eq!(cap(4, 1, Priority::Low, false), 2);
        // A hot CPU sheds Low whatever the count, and nothing else.
        assert_eq!(cap(100, r, Priority::Low, true), 0);
        assert_eq!(cap(100, r, Priority::Normal, true), 90);
        // Tiny limits: every priority still gets one.
        assert_eq!(reserve(1, 0), 1);
        assert_eq!(cap(1, 1, Priority::Low, false), 1);
        assert_eq!(cap(2, 1, Priority::Normal, false), 1);
    }
}

//! The upstream state area, appended after the upstream area: what every worker must
//! see the same about each upstream server, so that balancing and `max_fails` work on
//! the whole daemon's traffic rather than one worker's (issue #12).
//!
//! ```text
//! UpstreamStateArea
//!  ├── slots_seen        highest worker slot that ever counted in flight, plus one
//!  ├── servers[64]       per cell: settings (weight, backup, slow_start; the master's),
//!  │                     passive health (every worker's, compare-and-swap)
//!  └── in_flight[64][256] per cell, per worker slot: requests under way
//! ```
//!
//! **Identity.** The cells are those of `shm::upstream` (the label table): a worker
//! reaches a server's state through the `CellId` it counts with.
//!
//! **In flight** is one word per worker slot and cell, written only by that slot's
//! worker, and summed by readers over the slots in use. A worker that dies with
//! requests under way leaks nothing: folding its row (`fold::finish_fold`) zeroes its
//! words ([`clear_slot`]). A single shared counter could not be repaired that way.
//!
//! **Passive health.** A failure (any worker's) counts in a window of `fail_timeout`;
//! `max_fails` failures within it mark the server `Down` for every worker, with the
//! reason. After `fail_timeout`, one request (whichever worker claims it first:
//! [`ServerState::claim_trial`]) tries it again: a response marks it up (and starts
//! its `slow_start` ramp), a failure keeps it down for another `fail_timeout`.
//!
//! **Active checks** (another part of #12) plug in through [`ActiveVerdict`]: whether
//! a server may be used is [`usability`] of both, so the active verdict is a
//! parameter here, never read from a place this module owns.
//!
//! Times are CLOCK_MONOTONIC milliseconds ([`super::monotonic_ms`]): one clock for
//! every process of the machine.

use super::upstream::{LabelState, UpstreamArea, UPSTREAM_CELLS};
use crate::capacity::MAX_SLOTS;
use std::sync::atomic::{
    AtomicU32, AtomicU64, Ordering::AcqRel, Ordering::Acquire, Ordering::Relaxed, Ordering::Release,
};

/// Why a server was last marked down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DownReason {
    /// Never marked down.
    None = 0,
    ConnectRefused = 1,
    ConnectTimeout = 2,
    /// Closed or reset before the response head.
    Reset = 3,
    /// No progress within `send_timeout` or `read_timeout`.
    Timeout = 4,
    /// An invalid response head, or a broken body.
    BadResponse = 5,
    /// The active health check failed (set by the active checks).
    HealthCheck = 6,
}

impl DownReason {
    pub fn from_u32(v: u32) -> DownReason {
        match v {
            1 => DownReason::ConnectRefused,
            2 => DownReason::ConnectTimeout,
            3 => DownReason::Reset,
            4 => DownReason::Timeout,
            5 => DownReason::BadResponse,
            6 => DownReason::HealthCheck,
            _ => DownReason::None,
        }
    }

    /// As shown by `forkd stats` and `/metrics`.
    pub fn name(self) -> &'static str {
        match self {
            DownReason::None => "",
            DownReason::ConnectRefused => "connect refused",
            DownReason::ConnectTimeout => "connect timed out",
            DownReason::Reset => "closed before the response",
            DownReason::Timeout => "timed out",
            DownReason::BadResponse => "invalid response",
            DownReason::HealthCheck => "health check failed",
        }
    }
}

/// What the active health check says of a server (`NotChecked` without checks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActiveVerdict {
    NotChecked,
    Passing,
    Failing,
}

/// The active checks' verdicts on one upstream's servers; the active-check part
/// implements this over its own state. [`NoActiveChecks`] is the verdict of an
/// upstream without checks.
pub trait ActiveChecks {
    /// The verdict on `server` (its index in the upstream), whose region cell is `cell`.
    fn verdict(&self, server: usize, cell: usize) -> ActiveVerdict;
}

/// No active checks: every server `NotChecked`.
pub struct NoActiveChecks;

impl ActiveChecks for NoActiveChecks {
    fn verdict(&self, _server: usize, _cell: usize) -> ActiveVerdict {
        ActiveVerdict::NotChecked
    }
}

/// The passive side of a server's health, read at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Passive {
    Up,
    /// Marked down; may be tried again from `retry_at_ms`.
    Down {
        since_ms: u64,
        retry_at_ms: u64,
    },
    /// Marked down, and `fail_timeout` has passed: one request may try it.
    TrialDue,
}

/// Whether a server may take a request now, from both kinds of health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usability {
    Usable,
    /// Down, but due for its one trial request ([`ServerState::claim_trial`]).
    Trial,
    /// Not now; `retry_at_ms`: when the passive side lets it be tried (None: when
    /// the active check passes).
    Unusable {
        retry_at_ms: Option<u64>,
    },
}

/// A server may be used if no side says it is down; an active `Failing` wins over a
/// due passive trial (the check has newer news than the failure window).
pub fn usability(passive: Passive, active: ActiveVerdict) -> Usability {
    match (active, passive) {
        (ActiveVerdict::Failing, _) => Usability::Unusable { retry_at_ms: None },
        (_, Passive::Up) => Usability::Usable,
        (_, Passive::TrialDue) => Usability::Trial,
        (_, Passive::Down { retry_at_ms, .. }) => Usability::Unusable {
            retry_at_ms: Some(retry_at_ms),
        },
    }
}

/// The passive-health settings of a server's upstream, as the worker passes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailPolicy {
    /// 0: failures never mark the server down.
    pub max_fails: u32,
    pub fail_timeout_ms: u64,
}

const FLAG_BACKUP: u32 = 1;

/// One upstream server's shared state.
#[repr(C, align(64))]
pub struct ServerState {
    // Settings of the configuration published last (the master writes them).
    pub weight: AtomicU32,
    pub flags: AtomicU32,
    pub slow_start_ms: AtomicU64,
    // Passive health, written by every worker.
    /// 0: up, 1: down.
    pub down: AtomicU32,
    /// A [`DownReason`]: why it was last marked down.
    pub reason: AtomicU32,
    pub down_since_ms: AtomicU64,
    /// When a down server may be tried again (its trial is claimed by moving this on).
    pub retry_at_ms: AtomicU64,
    pub window_start_ms: AtomicU64,
    pub window_fails: AtomicU32,
    /// Failures since the last response, whatever the window.
    pub consecutive_fails: AtomicU32,
    /// When it last came back up (0: up since it was configured): `slow_start` runs
    /// from here.
    pub came_up_at_ms: AtomicU64,
    /// Times it was marked down.
    pub marked_down: AtomicU64,
}

impl ServerState {
    pub fn passive(&self, now_ms: u64) -> Passive {
        if self.down.load(Acquire) == 0 {
            return Passive::Up;
        }
        let retry_at_ms = self.retry_at_ms.load(Acquire);
        if now_ms >= retry_at_ms {
            Passive::TrialDue
        } else {
            Passive::Down {
                since_ms: self.down_since_ms.load(Relaxed),
                retry_at_ms,
            }
        }
    }

    /// Claims the one trial request of a down server whose `retry_at` has come:
    /// true for exactly one caller (all workers together) per `fail_timeout`.
    pub fn claim_trial(&self, now_ms: u64, policy: FailPolicy) -> bool {
        let at = self.retry_at_ms.load(Acquire);
        now_ms >= at
            && self
                .retry_at_ms
                .compare_exchange(at, now_ms + policy.fail_timeout_ms, AcqRel, Relaxed)
                .is_ok()
    }

    /// An attempt failed (not the stale pooled connection race, which says nothing
    /// of the server). Returns true if this failure marked the server down.
    /// `may_mark`: false for an upstream's only server, which is never marked down
    /// (there is nowhere else to send its requests, as in nginx).
    pub fn record_failure(
        &self,
        reason: DownReason,
        now_ms: u64,
        policy: FailPolicy,
        may_mark: bool,
    ) -> bool {
        self.consecutive_fails.fetch_add(1, Relaxed);
        if policy.max_fails == 0 || !may_mark {
            return false;
        }
        if self.down.load(Acquire) == 1 {
            // A failed trial: down for another window.
            self.retry_at_ms
                .fetch_max(now_ms + policy.fail_timeout_ms, AcqRel);
            self.reason.store(reason as u32, Relaxed);
            return false;
        }
        let start = self.window_start_ms.load(Acquire);
        if now_ms.saturating_sub(start) >= policy.fail_timeout_ms
            && self
                .window_start_ms
                .compare_exchange(start, now_ms, AcqRel, Relaxed)
                .is_ok()
        {
            self.window_fails.store(0, Release);
        }
        let fails = self.window_fails.fetch_add(1, AcqRel) + 1;
        if fails < policy.max_fails {
            return false;
        }
        self.mark_down(reason, now_ms, now_ms + policy.fail_timeout_ms)
    }

    /// Marks the server down until `retry_at_ms` (passive failures, or the active
    /// checks with `DownReason::HealthCheck`); true if it was up.
    pub fn mark_down(&self, reason: DownReason, now_ms: u64, retry_at_ms: u64) -> bool {
        self.reason.store(reason as u32, Release);
        self.down_since_ms.store(now_ms, Release);
        self.retry_at_ms.store(retry_at_ms, Release);
        if self.down.compare_exchange(0, 1, AcqRel, Relaxed).is_err() {
            return false;
        }
        self.window_fails.store(0, Release);
        self.marked_down.fetch_add(1, Relaxed);
        true
    }

    /// A response head arrived from the server: a down one is up again (its trial
    /// passed) and starts its `slow_start` ramp.
    pub fn record_success(&self, now_ms: u64) {
        if self.consecutive_fails.load(Relaxed) != 0 {
            self.consecutive_fails.store(0, Relaxed);
        }
        if self.down.load(Acquire) == 1 {
            self.mark_up(now_ms);
        }
    }

    /// Up again from now (a passed trial, or the active checks' `rise`).
    pub fn mark_up(&self, now_ms: u64) {
        if self.down.compare_exchange(1, 0, AcqRel, Relaxed).is_ok() {
            self.came_up_at_ms.store(now_ms.max(1), Release);
            self.window_fails.store(0, Release);
        }
    }

    /// Up again by its active checks (`rise` passes after `fall` failures): its
    /// `slow_start` ramp starts now, as after a passed trial. The passive side is
    /// left as it is.
    pub fn start_ramp(&self, now_ms: u64) {
        self.came_up_at_ms.store(now_ms.max(1), Release);
    }

    /// The configured weight (1 while unpublished).
    pub fn weight(&self) -> u32 {
        self.weight.load(Relaxed).max(1)
    }

    pub fn backup(&self) -> bool {
        self.flags.load(Relaxed) & FLAG_BACKUP != 0
    }

    /// The weight to balance with now: the configured weight, ramped linearly from 1
    /// over `slow_start` after the server came back up.
    pub fn weight_now(&self, now_ms: u64) -> u32 {
        ramp(
            self.weight(),
            self.came_up_at_ms.load(Acquire),
            self.slow_start_ms.load(Relaxed),
            now_ms,
        )
    }

    fn reset_health(&self) {
        self.down.store(0, Release);
        self.reason.store(DownReason::None as u32, Relaxed);
        self.down_since_ms.store(0, Relaxed);
        self.retry_at_ms.store(0, Relaxed);
        self.window_start_ms.store(0, Relaxed);
        self.window_fails.store(0, Relaxed);
        self.consecutive_fails.store(0, Relaxed);
        self.came_up_at_ms.store(0, Relaxed);
    }
}

/// `weight` ramped from 1 over `slow_start_ms` since `came_up_at_ms` (0: not ramping).
pub fn ramp(weight: u32, came_up_at_ms: u64, slow_start_ms: u64, now_ms: u64) -> u32 {
    if came_up_at_ms == 0 || slow_start_ms == 0 {
        return weight;
    }
    let elapsed = now_ms.saturating_sub(came_up_at_ms);
    if elapsed >= slow_start_ms {
        return weight;
    }
    ((u64::from(weight) * elapsed / slow_start_ms) as u32).clamp(1, weight)
}

/// One cell's in-flight words, one per worker slot.
#[repr(C, align(64))]
pub struct InFlightRow(pub [AtomicU32; MAX_SLOTS]);

#[repr(C, align(4096))]
pub struct UpstreamStateArea {
    /// One past the highest slot that counted in flight: readers sum below it.
    pub slots_seen: AtomicU32,
    pub servers: [ServerState; UPSTREAM_CELLS],
    pub in_flight: [InFlightRow; UPSTREAM_CELLS],
}

impl UpstreamStateArea {
    pub fn server(&self, cell: usize) -> &ServerState {
        &self.servers[cell]
    }

    /// Worker slot `slot` is about to count in flight (once, at its start).
    pub fn note_slot(&self, slot: usize) {
        self.slots_seen.fetch_max(slot as u32 + 1, AcqRel);
    }

    /// A request of slot `slot`'s worker to `cell` starts (its only writer).
    #[inline]
    pub fn begin(&self, cell: usize, slot: usize) {
        let w = &self.in_flight[cell].0[slot];
        w.store(w.load(Relaxed).wrapping_add(1), Release);
    }

    /// ... and ends.
    #[inline]
    pub fn end(&self, cell: usize, slot: usize) {
        let w = &self.in_flight[cell].0[slot];
        w.store(w.load(Relaxed).saturating_sub(1), Release);
    }

    /// Requests under way to `cell`, every worker together.
    #[inline]
    pub fn in_flight(&self, cell: usize) -> u64 {
        let seen = (self.slots_seen.load(Acquire) as usize).min(MAX_SLOTS);
        self.in_flight[cell].0[..seen]
            .iter()
            .map(|w| u64::from(w.load(Acquire)))
            .sum()
    }
}

/// Slot `slot`'s worker has exited (its row is being folded): what it had in flight
/// is no longer under way.
pub fn clear_slot(area: &UpstreamStateArea, slot: usize) {
    for row in &area.in_flight {
        row.0[slot].store(0, Release);
    }
}

/// Writes each configured server's settings in its cell (the master, when it
/// publishes a configuration, after the label table). Cells no longer configured
/// lose their health state, so a server given the cell later starts up; in-flight
/// words are left to their workers (a draining worker still ends its requests).
pub fn publish_settings(
    area: &UpstreamStateArea,
    upstreams: &UpstreamArea,
    config: &crate::config::Config,
) {
    let labels = &upstreams.header.labels;
    for (cell, label) in labels.iter().enumerate() {
        if LabelState::from_u32(label.state.load(Acquire)) != LabelState::Configured {
            area.servers[cell].reset_health();
        }
    }
    for u in &config.upstreams {
        for s in &u.servers {
            let Some(cell) = super::upstream::lookup(upstreams, &u.name, &s.label) else {
                continue;
            };
            let state = &area.servers[cell];
            state.weight.store(s.weight, Relaxed);
            state
                .flags
                .store(if s.backup { FLAG_BACKUP } else { 0 }, Relaxed);
            state
                .slow_start_ms
                .store(u.slow_start.as_millis() as u64, Relaxed);
        }
    }
}

/// A server's health as `forkd stats` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ServerHealth {
    /// The effective state, from both kinds of health ([`usability`]): `down` when
    /// either the passive side (failures) or the active checks say so, else `up`, or
    /// `backup` (a backup that is up: used only when no other is).
    pub state: &'static str,
    /// Why it is `down` now ("" when it is not): the active checks' verdict
    /// ("health check failed") wins, as it does for the balancer.
    pub down_reason: &'static str,
    pub weight: u32,
    pub weight_now: u32,
    pub in_flight: u64,
    pub consecutive_failures: u32,
    /// Why the passive side last marked it down ("" if never).
    pub last_down_reason: &'static str,
    pub marked_down: u64,
}

/// `cell`'s health at `now_ms`, given the active checks' verdict on it (a reader's
/// view: `NotChecked` for a server without checks or results).
pub fn read_health(
    area: &UpstreamStateArea,
    cell: usize,
    now_ms: u64,
    active: ActiveVerdict,
) -> ServerHealth {
    let s = &area.servers[cell];
    let passive_reason = DownReason::from_u32(s.reason.load(Relaxed));
    let (state, down_reason) = match (usability(s.passive(now_ms), active), active) {
        // A due trial is still down until its request passes.
        (Usability::Unusable { .. } | Usability::Trial, ActiveVerdict::Failing) => {
            ("down", DownReason::HealthCheck)
        }
        (Usability::Unusable { .. } | Usability::Trial, _) => ("down", passive_reason),
        (Usability::Usable, _) if s.backup() => ("backup", DownReason::None),
        (Usability::Usable, _) => ("up", DownReason::None),
    };
    ServerHealth {
        state,
        down_reason: down_reason.name(),
        weight: s.weight(),
        weight_now: s.weight_now(now_ms),
        in_flight: area.in_flight(cell),
        consecutive_failures: s.consecutive_fails.load(Relaxed),
        last_down_reason: passive_reason.name(),
        marked_down: s.marked_down.load(Relaxed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::testing::TempRegion;
    use crate::shm::Region;

    const POLICY: FailPolicy = FailPolicy {
        max_fails: 3,
        fail_timeout_ms: 10_000,
    };

    #[test]
    fn max_fails_within_the_window_mark_down_and_one_trial_brings_it_back() {
        let tmp = TempRegion::new("state-fails");
        let region = Region::create(&tmp.0, 1, None).unwrap();
        let s = region.layout().upstream_state.server(5);
        let t0 = 1_000_000;
        // Two failures, then the window passes: they no longer count.
        assert!(!s.record_failure(DownReason::Reset, t0, POLICY, true));
        assert!(!s.record_failure(DownReason::Reset, t0 + 1, POLICY, true));
        assert!(!s.record_failure(DownReason::Reset, t0 + 20_000, POLICY, true));
        assert_eq!(s.passive(t0 + 20_000), Passive::Up);
        assert!(!s.record_failure(DownReason::Timeout, t0 + 20_001, POLICY, true));
        assert!(s.record_failure(DownReason::ConnectRefused, t0 + 20_002, POLICY, true));
        assert_eq!(s.consecutive_fails.load(Relaxed), 5);
        let down_at = t0 + 20_002;
        assert_eq!(
            s.passive(down_at + 1),
            Passive::Down {
                since_ms: down_at,
                retry_at_ms: down_at + 10_000
            }
        );
        assert_eq!(
            DownReason::from_u32(s.reason.load(Relaxed)),
            DownReason::ConnectRefused
        );
        // fail_timeout later one caller (of many) gets the trial.
        let due = down_at + 10_000;
        assert_eq!(s.passive(due), Passive::TrialDue);
        assert!(s.claim_trial(due, POLICY));
        assert!(!s.claim_trial(due, POLICY), "one trial per window");
        // It fails: down for another window; the next trial passes.
        s.record_failure(DownReason::ConnectRefused, due + 5, POLICY, true);
        assert!(!s.claim_trial(due + 9_000, POLICY));
        assert!(s.claim_trial(due + 10_005, POLICY));
        s.record_success(due + 10_010);
        assert_eq!(s.passive(due + 10_011), Passive::Up);
        assert_eq!(s.consecutive_fails.load(Relaxed), 0);
        assert_eq!(s.came_up_at_ms.load(Relaxed), due + 10_010);
        assert_eq!(s.marked_down.load(Relaxed), 1);
    }

    #[test]
    fn an_only_server_or_max_fails_0_is_never_marked_down() {
        let tmp = TempRegion::new("state-only");
        let region = Region::create(&tmp.0, 1, None).unwrap();
        let s = region.layout().upstream_state.server(0);
        for i in 0..10 {
            assert!(!s.record_failure(DownReason::Reset, 100 + i, POLICY, false));
            let off = FailPolicy {
                max_fails: 0,
                ..POLICY
            };
            assert!(!s.record_failure(DownReason::Reset, 100 + i, off, true));
        }
        assert_eq!(s.passive(200), Passive::Up);
        assert_eq!(s.consecutive_fails.load(Relaxed), 20);
    }

    #[test]
    fn slow_start_ramps_the_weight_linearly_from_1() {
        assert_eq!(ramp(10, 0, 10_000, 5_000), 10, "up since configured");
        assert_eq!(ramp(10, 1_000, 0, 1_000), 10, "no slow_start");
        assert_eq!(ramp(10, 1_000, 10_000, 1_000), 1);
        assert_eq!(ramp(10, 1_000, 10_000, 6_000), 5);
        assert_eq!(ramp(10, 1_000, 10_000, 11_000), 10);
        assert_eq!(ramp(1, 1_000, 10_000, 1_500), 1);
    }

    #[test]
    fn the_active_verdict_and_the_passive_state_decide_together() {
        let down = Passive::Down {
            since_ms: 1,
            retry_at_ms: 9,
        };
        use ActiveVerdict::*;
        assert_eq!(usability(Passive::Up, NotChecked), Usability::Usable);
        assert_eq!(usability(Passive::Up, Passing), Usability::Usable);
        assert_eq!(
            usability(Passive::Up, Failing),
            Usability::Unusable { retry_at_ms: None }
        );
        assert_eq!(
            usability(down, Passing),
            Usability::Unusable {
                retry_at_ms: Some(9)
            }
        );
        assert_eq!(usability(Passive::TrialDue, NotChecked), Usability::Trial);
        assert_eq!(
            usability(Passive::TrialDue, Failing),
            Usability::Unusable { retry_at_ms: None }
        );
    }

    #[test]
    fn the_state_shown_is_the_effective_one_from_both_sides() {
        let tmp = TempRegion::new("state-effective");
        let region = Region::create(&tmp.0, 1, None).unwrap();
        let a = &region.layout().upstream_state;
        let show = |cell, active| {
            let h = read_health(a, cell, 5_000, active);
            (h.state, h.down_reason, h.last_down_reason)
        };
        use ActiveVerdict::*;
        assert_eq!(show(0, NotChecked), ("up", "", ""));
        // Down by its checks alone: the passive side is up, the server is not.
        assert_eq!(show(0, Failing), ("down", "health check failed", ""));
        a.server(1)
            .mark_down(DownReason::ConnectRefused, 1_000, 9_000);
        assert_eq!(
            show(1, Passing),
            ("down", "connect refused", "connect refused")
        );
        assert_eq!(
            show(1, Failing),
            ("down", "health check failed", "connect refused")
        );
        // Its trial is due: still down until the trial passes.
        a.server(2).mark_down(DownReason::Timeout, 1_000, 2_000);
        assert_eq!(show(2, NotChecked), ("down", "timed out", "timed out"));
        a.server(3).flags.store(FLAG_BACKUP, Relaxed);
        assert_eq!(show(3, Passing), ("backup", "", ""));
        assert_eq!(show(3, Failing), ("down", "health check failed", ""));
    }

    #[test]
    fn in_flight_is_summed_over_slots_and_a_dead_slot_leaks_nothing() {
        let tmp = TempRegion::new("state-inflight");
        let region = Region::create(&tmp.0, 1, None).unwrap();
        let a = &region.layout().upstream_state;
        a.note_slot(0);
        a.note_slot(3);
        for _ in 0..3 {
            a.begin(7, 0);
        }
        a.begin(7, 3);
        a.begin(7, 3);
        a.end(7, 0);
        assert_eq!(a.in_flight(7), 4);
        assert_eq!(a.in_flight(6), 0);
        // Slot 3's worker dies with two under way.
        clear_slot(a, 3);
        assert_eq!(a.in_flight(7), 2);
        a.end(7, 3);
        assert_eq!(
            a.in_flight(7),
            2,
            "an end after the clear does not underflow"
        );
    }
}

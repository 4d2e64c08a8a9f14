//! The health area of the region, appended after the upstream area: who runs the
//! active checks (the *lease*), and per upstream server (the same cells as the
//! upstream area's label table) the checks' verdict and the addresses its name
//! resolves to now.
//!
//! ```text
//! HealthArea
//!  ├── CheckLease    owner pid, heartbeat (CLOCK_MONOTONIC ms), takeovers
//!  └── cells[64]     per upstream server: verdict, passes/fails in a row, last
//!                    result and time, came_up_at; address set + generation
//! ```
//!
//! **One writer.** Exactly one worker of the daemon holds the lease and writes the
//! cells; every other process only reads them. A worker takes the lease with a
//! compare-and-swap when nobody holds it, when the holder's heartbeat is older than
//! the staleness limit, or when the holder is not running any more; the master
//! clears it when it reaps the holder ([`release_if_held_by`]), so a crashed owner is
//! replaced within one poll of the others, not only after the staleness limit.
//!
//! **Identity.** A cell is named by `key`, a hash of the `(upstream, server label)`
//! it holds results for, written by the owner. A reader whose server hashes to
//! another key (the cell was given to another server by a reload, or the owner has
//! not checked it yet) treats it as having no results: usable, addresses as
//! configured.
//!
//! **Addresses.** Up to [`MAX_ADDRS`] per cell, under a sequence count (odd while the
//! owner writes): the generation is `seq / 2`, so a worker notices a new set with one
//! load.

use super::upstream::UPSTREAM_CELLS;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{
    AtomicI32, AtomicU32, AtomicU64, Ordering::Acquire, Ordering::Relaxed, Ordering::Release,
};

/// Addresses a cell holds (as many as a server given by name keeps).
pub const MAX_ADDRS: usize = crate::capacity::MAX_RESOLVED;

/// What the checks say about a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Not checked yet, or no checks configured: usable.
    Unknown = 0,
    Up = 1,
    /// Failed `fall` checks in a row: no client request goes to it.
    Down = 2,
}

impl Verdict {
    pub fn from_u32(v: u32) -> Verdict {
        match v {
            1 => Verdict::Up,
            2 => Verdict::Down,
            _ => Verdict::Unknown,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Verdict::Unknown => "unknown",
            Verdict::Up => "up",
            Verdict::Down => "down",
        }
    }
}

/// Why a check failed (0 in the region: it passed, or none ran yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckError {
    /// The connection was refused or could not be made.
    Connect = 1,
    /// No complete response head within `timeout`.
    Timeout = 2,
    /// The server closed the connection before a complete head.
    Closed = 3,
    /// Not an HTTP/1.x response head.
    BadResponse = 4,
    /// A status outside `expect_status` (the status is recorded beside it).
    Status = 5,
}

impl CheckError {
    pub fn from_u32(v: u32) -> Option<CheckError> {
        Some(match v {
            1 => CheckError::Connect,
            2 => CheckError::Timeout,
            3 => CheckError::Closed,
            4 => CheckError::BadResponse,
            5 => CheckError::Status,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            CheckError::Connect => "connect",
            CheckError::Timeout => "timeout",
            CheckError::Closed => "closed",
            CheckError::BadResponse => "bad_response",
            CheckError::Status => "status",
        }
    }
}

/// One check's outcome: the status, if a head arrived, and the failure, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub status: Option<u16>,
    pub error: Option<CheckError>,
}

impl Outcome {
    pub fn passed(self) -> bool {
        self.error.is_none()
    }
}

#[repr(C, align(64))]
pub struct CheckLease {
    /// The pid of the worker running the checks; 0: nobody.
    pub owner: AtomicI32,
    _pad: AtomicU32,
    /// The owner's last renewal, CLOCK_MONOTONIC ms.
    pub heartbeat_ms: AtomicU64,
    /// How many times the lease was taken (the first owner included).
    pub takeovers: AtomicU64,
}

#[repr(C, align(64))]
pub struct HealthCell {
    /// Hash of the `(upstream, server)` these results are about; 0: none.
    pub key: AtomicU64,
    pub verdict: AtomicU32,
    pub passes: AtomicU32,
    pub fails: AtomicU32,
    /// Status of the last check's response; 0: none arrived.
    pub last_status: AtomicU32,
    /// [`CheckError`] of the last check; 0: it passed.
    pub last_error: AtomicU32,
    /// The last re-resolution failed (the set below is the last good one).
    pub resolve_failing: AtomicU32,
    /// Wall-clock ms of the last check; 0: none yet.
    pub last_check_ms: AtomicU64,
    /// Wall-clock ms the server last turned Up.
    pub came_up_ms: AtomicU64,
    pub checks: AtomicU64,
    /// Odd while the owner writes the address set; the generation is `seq / 2`.
    pub addr_seq: AtomicU64,
    pub addr_count: AtomicU32,
    _pad: AtomicU32,
    /// `[family << 16 | port, ip high 64 bits, ip low 64 bits]` per address.
    pub addrs: [[AtomicU64; 3]; MAX_ADDRS],
    /// Wall-clock ms of the last successful resolution.
    pub resolved_ms: AtomicU64,
    pub resolutions: AtomicU64,
    pub resolve_failures: AtomicU64,
}

#[repr(C, align(4096))]
pub struct HealthArea {
    pub lease: CheckLease,
    pub cells: [HealthCell; UPSTREAM_CELLS],
}

/// The key of `(upstream, server)` (FNV-1a; never 0).
pub fn key(upstream: &str, server: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in upstream.bytes().chain([0]).chain(server.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h.max(1)
}

/// What [`CheckLease::hold`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lease {
    /// Ours: it was, and the heartbeat is renewed.
    Renewed,
    /// Ours now: nobody held it, or the holder was stale or gone.
    Taken { from: i32 },
    /// Another live worker holds it.
    Held(i32),
}

impl CheckLease {
    /// Renews the lease if `me` holds it, or takes it if nobody does, the holder's
    /// heartbeat is older than `stale_ms`, or `alive(holder)` says it is gone.
    pub fn hold(&self, me: i32, now_ms: u64, stale_ms: u64, alive: impl Fn(i32) -> bool) -> Lease {
        let owner = self.owner.load(Acquire);
        if owner == me {
            self.heartbeat_ms.store(now_ms, Release);
            return Lease::Renewed;
        }
        let beat = self.heartbeat_ms.load(Acquire);
        let stale = owner == 0 || now_ms.saturating_sub(beat) > stale_ms || !alive(owner);
        if !stale {
            return Lease::Held(owner);
        }
        match self.owner.compare_exchange(owner, me, Release, Acquire) {
            Ok(_) => {
                self.heartbeat_ms.store(now_ms, Release);
                self.takeovers.fetch_add(1, Relaxed);
                Lease::Taken { from: owner }
            }
            Err(other) if other == me => Lease::Renewed,
            Err(other) => Lease::Held(other),
        }
    }

    /// Gives the lease up if `me` holds it (a draining worker), so another worker
    /// takes over at its next poll.
    pub fn release(&self, me: i32) {
        let _ = self.owner.compare_exchange(me, 0, Release, Relaxed);
    }

    pub fn holder(&self) -> Option<i32> {
        Some(self.owner.load(Acquire)).filter(|&p| p != 0)
    }
}

/// The master reaped `pid`: if it held the lease, nobody does now.
pub fn release_if_held_by(area: &HealthArea, pid: i32) {
    area.lease.release(pid);
}

impl HealthCell {
    /// Makes the cell about `key`, with no results and `addrs` as its set, if it is
    /// about another server (the owner does this before checking it).
    pub fn claim(&self, key: u64, addrs: &[SocketAddr]) {
        if self.key.load(Acquire) == key {
            return;
        }
        self.key.store(0, Release);
        self.verdict.store(Verdict::Unknown as u32, Relaxed);
        self.passes.store(0, Relaxed);
        self.fails.store(0, Relaxed);
        self.last_status.store(0, Relaxed);
        self.last_error.store(0, Relaxed);
        self.resolve_failing.store(0, Relaxed);
        self.last_check_ms.store(0, Relaxed);
        self.came_up_ms.store(0, Relaxed);
        self.checks.store(0, Relaxed);
        self.resolved_ms.store(0, Relaxed);
        self.resolutions.store(0, Relaxed);
        self.resolve_failures.store(0, Relaxed);
        self.publish_addrs(addrs);
        self.key.store(key, Release);
    }

    /// Records one check; returns the verdict before and after. Unknown turns Up at
    /// the first pass (it was usable already), Down after `fall` failures in a row;
    /// Down turns Up after `rise` passes in a row, Up Down after `fall` failures.
    pub fn record(
        &self,
        outcome: Outcome,
        rise: u32,
        fall: u32,
        now_ms: u64,
    ) -> (Verdict, Verdict) {
        let before = Verdict::from_u32(self.verdict.load(Relaxed));
        let (mut passes, mut fails) = (self.passes.load(Relaxed), self.fails.load(Relaxed));
        if outcome.passed() {
            passes = passes.saturating_add(1);
            fails = 0;
        } else {
            fails = fails.saturating_add(1);
            passes = 0;
        }
        let after = match before {
            Verdict::Unknown if outcome.passed() => Verdict::Up,
            Verdict::Down if passes >= rise => Verdict::Up,
            Verdict::Unknown | Verdict::Up if fails >= fall => Verdict::Down,
            v => v,
        };
        self.passes.store(passes, Relaxed);
        self.fails.store(fails, Relaxed);
        self.last_status
            .store(outcome.status.map_or(0, u32::from), Relaxed);
        self.last_error
            .store(outcome.error.map_or(0, |e| e as u32), Relaxed);
        self.last_check_ms.store(now_ms, Relaxed);
        self.checks.fetch_add(1, Relaxed);
        if after == Verdict::Up && before != Verdict::Up {
            self.came_up_ms.store(now_ms, Relaxed);
        }
        self.verdict.store(after as u32, Release);
        (before, after)
    }

    /// Publishes a new address set (at most [`MAX_ADDRS`]) under a new generation.
    pub fn publish_addrs(&self, addrs: &[SocketAddr]) {
        let seq = self.addr_seq.load(Relaxed);
        let writing = seq | 1;
        self.addr_seq.store(writing, Relaxed);
        std::sync::atomic::fence(Release);
        let n = addrs.len().min(MAX_ADDRS);
        for (slot, a) in self.addrs.iter().zip(&addrs[..n]) {
            let (w0, w1, w2) = encode(a);
            slot[0].store(w0, Relaxed);
            slot[1].store(w1, Relaxed);
            slot[2].store(w2, Relaxed);
        }
        self.addr_count.store(n as u32, Relaxed);
        self.addr_seq.store(writing.wrapping_add(1), Release);
    }

    /// The address set's generation (changes whenever a new set is published).
    pub fn addr_generation(&self) -> u64 {
        self.addr_seq.load(Acquire) / 2
    }

    /// The current address set and its generation; None while the owner writes it
    /// (the caller keeps what it has and looks again later).
    pub fn addrs(&self) -> Option<(u64, Vec<SocketAddr>)> {
        for _ in 0..4 {
            let before = self.addr_seq.load(Acquire);
            if before & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let n = (self.addr_count.load(Relaxed) as usize).min(MAX_ADDRS);
            let out: Vec<SocketAddr> = self.addrs[..n]
                .iter()
                .filter_map(|s| decode(s[0].load(Relaxed), s[1].load(Relaxed), s[2].load(Relaxed)))
                .collect();
            std::sync::atomic::fence(Acquire);
            if self.addr_seq.load(Relaxed) == before {
                return Some((before / 2, out));
            }
        }
        None
    }

    /// Whether client requests may go to this cell's server (`key` is the server's):
    /// anything but a Down verdict about that very server.
    #[inline]
    pub fn usable(&self, key: u64) -> bool {
        self.key.load(Acquire) != key || self.verdict.load(Acquire) != Verdict::Down as u32
    }
}

fn encode(a: &SocketAddr) -> (u64, u64, u64) {
    let (family, ip) = match a.ip() {
        IpAddr::V4(v4) => (4u64, u128::from(u32::from(v4))),
        IpAddr::V6(v6) => (6u64, u128::from(v6)),
    };
    (
        family << 16 | u64::from(a.port()),
        (ip >> 64) as u64,
        ip as u64,
    )
}

fn decode(w0: u64, hi: u64, lo: u64) -> Option<SocketAddr> {
    let port = (w0 & 0xffff) as u16;
    let ip = u128::from(hi) << 64 | u128::from(lo);
    match w0 >> 16 {
        4 => Some(SocketAddr::new(Ipv4Addr::from(ip as u32).into(), port)),
        6 => Some(SocketAddr::new(Ipv6Addr::from(ip).into(), port)),
        _ => None,
    }
}

/// The health of one server as `forkd stats` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct HealthReport {
    pub verdict: &'static str,
    pub checks: u64,
    pub passes_in_a_row: u32,
    pub fails_in_a_row: u32,
    /// The last check's status, if a response head arrived.
    pub last_status: Option<u16>,
    /// Why the last check failed (`connect`, `timeout`, `closed`, `bad_response`,
    /// `status`), if it did.
    pub last_error: Option<&'static str>,
    /// Wall-clock ms of the last check.
    pub last_check_ms: Option<u64>,
    pub came_up_ms: Option<u64>,
    /// The addresses in use (a name's last good resolution).
    pub addresses: Vec<String>,
    pub address_generation: u64,
    pub resolutions: u64,
    pub resolve_failures: u64,
    /// The last re-resolution failed (the addresses are the last good set).
    pub resolve_failing: bool,
}

impl HealthReport {
    /// The verdict as the balancer takes it: only `down` keeps client requests away.
    pub fn active(&self) -> super::upstream_state::ActiveVerdict {
        use super::upstream_state::ActiveVerdict;
        if self.verdict == Verdict::Down.name() {
            ActiveVerdict::Failing
        } else if self.verdict == Verdict::Up.name() {
            ActiveVerdict::Passing
        } else {
            ActiveVerdict::NotChecked
        }
    }
}

/// The health of `(upstream, server)` in `cell`, if the owner has written results
/// for it (the caller passes the area only when the region has it).
pub fn read(area: &HealthArea, cell: usize, upstream: &str, server: &str) -> Option<HealthReport> {
    let c = area.cells.get(cell)?;
    if c.key.load(Acquire) != key(upstream, server) {
        return None;
    }
    let (generation, addrs) = c.addrs().unwrap_or_default();
    let nonzero = |v: u64| (v != 0).then_some(v);
    Some(HealthReport {
        verdict: Verdict::from_u32(c.verdict.load(Acquire)).name(),
        checks: c.checks.load(Relaxed),
        passes_in_a_row: c.passes.load(Relaxed),
        fails_in_a_row: c.fails.load(Relaxed),
        last_status: u16::try_from(c.last_status.load(Relaxed))
            .ok()
            .filter(|&s| s != 0),
        last_error: CheckError::from_u32(c.last_error.load(Relaxed)).map(CheckError::name),
        last_check_ms: nonzero(c.last_check_ms.load(Relaxed)),
        came_up_ms: nonzero(c.came_up_ms.load(Relaxed)),
        addresses: addrs.iter().map(|a| a.to_string()).collect(),
        address_generation: generation,
        resolutions: c.resolutions.load(Relaxed),
        resolve_failures: c.resolve_failures.load(Relaxed),
        resolve_failing: c.resolve_failing.load(Relaxed) != 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::testing::TempRegion;
    use crate::shm::Region;

    const PASS: Outcome = Outcome {
        status: Some(200),
        error: None,
    };
    const FAIL: Outcome = Outcome {
        status: Some(500),
        error: Some(CheckError::Status),
    };

    #[test]
    fn fall_failures_take_a_server_down_and_rise_passes_bring_it_back() {
        let tmp = TempRegion::new("verdicts");
        let region = Region::create(&tmp.0, 1, None).unwrap();
        let cell = &region.layout().health.cells[3];
        let k = key("app", "127.0.0.1:9000");
        cell.claim(k, &[]);
        assert!(cell.usable(k));
        assert_eq!(cell.record(PASS, 2, 3, 10), (Verdict::Unknown, Verdict::Up));
        assert_eq!(cell.came_up_ms.load(Relaxed), 10);
        for _ in 0..2 {
            cell.record(FAIL, 2, 3, 20);
            assert!(cell.usable(k), "fewer than fall failures");
        }
        cell.record(PASS, 2, 3, 30);
        cell.record(FAIL, 2, 3, 40);
        cell.record(FAIL, 2, 3, 40);
        assert!(cell.usable(k), "the pass reset the count");
        assert_eq!(cell.record(FAIL, 2, 3, 50), (Verdict::Up, Verdict::Down));
        assert!(!cell.usable(k));
        assert!(
            cell.usable(key("app", "127.0.0.1:9001")),
            "another server's"
        );
        assert_eq!(
            cell.record(PASS, 2, 3, 60).1,
            Verdict::Down,
            "one pass of two"
        );
        assert_eq!(cell.record(PASS, 2, 3, 70), (Verdict::Down, Verdict::Up));
        assert_eq!(cell.came_up_ms.load(Relaxed), 70);
        let r = read(&region.layout().health, 3, "app", "127.0.0.1:9000").unwrap();
        assert_eq!((r.verdict, r.checks, r.passes_in_a_row), ("up", 9, 2));
        assert_eq!(r.last_status, Some(200));
        // The cell given to another server: no results until it is checked.
        cell.claim(key("app", "127.0.0.1:9001"), &[]);
        assert!(read(&region.layout().health, 3, "app", "127.0.0.1:9000").is_none());
        assert_eq!(
            read(&region.layout().health, 3, "app", "127.0.0.1:9001")
                .unwrap()
                .checks,
            0
        );
    }

    #[test]
    fn an_address_set_round_trips_with_a_new_generation() {
        let tmp = TempRegion::new("addrs");
        let region = Region::create(&tmp.0, 1, None).unwrap();
        let cell = &region.layout().health.cells[0];
        let a: Vec<SocketAddr> = vec![
            "10.0.0.1:9000".parse().unwrap(),
            "[2001:db8::7]:443".parse().unwrap(),
        ];
        cell.claim(5, &a);
        let (g1, got) = cell.addrs().unwrap();
        assert_eq!(got, a);
        cell.publish_addrs(&a[..1]);
        let (g2, got) = cell.addrs().unwrap();
        assert_eq!(got, a[..1]);
        assert!(g2 > g1);
        assert_eq!(cell.addr_generation(), g2);
    }

    #[test]
    fn the_lease_has_one_holder_and_moves_when_it_is_stale_or_gone() {
        let tmp = TempRegion::new("lease");
        let region = Region::create(&tmp.0, 1, None).unwrap();
        let lease = &region.layout().health.lease;
        let alive = |_| true;
        assert_eq!(lease.hold(100, 1_000, 300, alive), Lease::Taken { from: 0 });
        assert_eq!(lease.hold(200, 1_100, 300, alive), Lease::Held(100));
        assert_eq!(lease.hold(100, 1_200, 300, alive), Lease::Renewed);
        assert_eq!(
            lease.hold(200, 1_500, 300, alive),
            Lease::Held(100),
            "300ms: not stale yet"
        );
        assert_eq!(
            lease.hold(200, 1_501, 300, alive),
            Lease::Taken { from: 100 }
        );
        assert_eq!(
            lease.hold(100, 1_502, 300, alive),
            Lease::Held(200),
            "the old holder lost it"
        );
        assert_eq!(
            lease.hold(100, 1_503, 300, |pid| pid != 200),
            Lease::Taken { from: 200 }
        );
        release_if_held_by(&region.layout().health, 200);
        assert_eq!(
            lease.holder(),
            Some(100),
            "only the holder's release counts"
        );
        release_if_held_by(&region.layout().health, 100);
        assert_eq!(lease.holder(), None);
        assert_eq!(lease.takeovers.load(Relaxed), 3);
    }
}

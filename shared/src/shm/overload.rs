//! The overload area of the region: the adaptive concurrency limit of each upstream
//! group, shared by every worker, so the limit bounds the requests in flight to a
//! group over all workers (one limit, not one per worker).
//!
//! - a [`GroupCell`] per upstream group, found by the hash of its name (so a group
//!   keeps its cell across reloads that reorder `upstreams`): the requests in flight
//!   (every worker adds and removes its own with `fetch_add`/`fetch_sub`: many
//!   writers), the limit, baseline and last window's latency (written only by the
//!   worker holding the lease), sheds per priority;
//! - a [`SlotCell`] per worker row: the ring of latency samples the worker writes on
//!   its request path (one writer, plain stores, read by the lease holder), and the
//!   worker's own share of each group's in-flight count, so a worker that dies with
//!   requests in flight can be uncounted (by the next worker of its row, or by the
//!   lease holder once the row is `Exited`);
//! - the lease: the one worker that runs the controllers (see [`Lease`]).
//!
//! The worker side (admission, the controllers, the sampling timer) is
//! `forkd_worker::overload`; this is the memory, its lease and its readings.

use super::cells::Text;
use crate::capacity::MAX_SLOTS;
use serde::Serialize;
use std::fmt::Write as _;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicU32, AtomicU64};

/// Upstream groups with a limit (more are not limited, with a warning).
pub const MAX_GROUPS: usize = 32;
/// Samples a worker's ring holds: a window of more loses its oldest (it is a sample).
pub const RING: usize = 1024;

/// Ring entries: latency in the low 48 bits, the group above, and whether the request
/// was admitted while the baseline was being measured in the top bit.
const LATENCY_BITS: u32 = 48;
const PROBE_BIT: u64 = 1 << 63;

#[repr(C, align(64))]
pub struct GroupCell {
    /// [`name_hash`] of the upstream's name; 0: free.
    pub name_hash: AtomicU64,
    /// Requests in flight to the group, over every worker.
    pub inflight: AtomicU64,
    /// The most in flight at once since the lease holder last looked.
    pub peak: AtomicU64,
    /// The limit in force; 0: none computed yet.
    pub limit: AtomicU64,
    pub baseline_us: AtomicU64,
    pub sample_us: AtomicU64,
    /// 1 while the baseline is being measured.
    pub probing: AtomicU32,
    /// [`mode_code`] of the lease holder's configuration.
    pub mode: AtomicU32,
    /// Requests answered 503 (`Enforce`), by priority (critical, normal, low).
    pub shed: [AtomicU64; 3],
    /// Requests over the limit admitted by `DryRun`, by priority.
    pub dry_run: [AtomicU64; 3],
    /// Of `shed`, those shed because the worker's CPU use was above `cpu_high` (low).
    pub shed_cpu: AtomicU64,
    /// `Critical` requests in flight (of `inflight`), and the most at once since the
    /// lease holder last looked.
    pub critical: AtomicU64,
    pub critical_peak: AtomicU64,
    /// The part of the limit only `Critical` may use (lease holder); 0: not yet.
    pub reserve: AtomicU64,
    pub name: Text<64>,
}

#[repr(C, align(64))]
pub struct SlotCell {
    /// Samples written so far (the next goes to `head % RING`).
    pub head: AtomicU64,
    /// This row's worker's requests in flight, per group cell.
    pub inflight: [AtomicU32; MAX_GROUPS],
    /// Of `inflight`, the `Critical` ones: given back with it when the worker is
    /// gone, or the group's Critical count (and so its reserve) would stay raised.
    pub critical: [AtomicU32; MAX_GROUPS],
    pub ring: [AtomicU64; RING],
}

#[repr(C, align(64))]
pub struct OverloadArea {
    pub lease: Lease,
    pub groups: [GroupCell; MAX_GROUPS],
    pub slots: [SlotCell; MAX_SLOTS],
}

/// FNV-1a of the name, never 0 (0 marks a free cell).
pub fn name_hash(name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h.max(1)
}

pub fn mode_code(mode: crate::config::overload::OverloadMode) -> u32 {
    use crate::config::overload::OverloadMode::*;
    match mode {
        Off => 0,
        DryRun => 1,
        Enforce => 2,
    }
}

fn mode_name(code: u32) -> &'static str {
    match code {
        1 => "dry_run",
        2 => "enforce",
        _ => "off",
    }
}

impl OverloadArea {
    /// The cell of the group `name`: the one holding its hash, or a free one claimed
    /// for it. None when every cell is taken by other names.
    pub fn group(&self, name: &str) -> Option<usize> {
        let hash = name_hash(name);
        for (i, g) in self.groups.iter().enumerate() {
            match g.name_hash.load(Acquire) {
                h if h == hash => return Some(i),
                0 => match g.name_hash.compare_exchange(0, hash, AcqRel, Acquire) {
                    Ok(_) => {
                        g.name.set(name);
                        return Some(i);
                    }
                    Err(h) if h == hash => return Some(i),
                    Err(_) => continue,
                },
                _ => continue,
            }
        }
        None
    }
}

impl GroupCell {
    /// Counts a request in flight unless `cap` are already; returns whether it was.
    /// Exact over every worker: each request sees the count its own increment made.
    pub fn enter(&self, cap: u64) -> bool {
        let before = self.inflight.fetch_add(1, AcqRel);
        if before >= cap {
            self.inflight.fetch_sub(1, AcqRel);
            return false;
        }
        if before + 1 > self.peak.load(Relaxed) {
            self.peak.fetch_max(before + 1, Relaxed);
        }
        true
    }

    /// Counts a request in flight whatever the limit (`DryRun`).
    pub fn enter_anyway(&self) -> u64 {
        let before = self.inflight.fetch_add(1, AcqRel);
        if before + 1 > self.peak.load(Relaxed) {
            self.peak.fetch_max(before + 1, Relaxed);
        }
        before
    }

    /// Uncounts `n` requests (never below 0).
    pub fn leave(&self, n: u64) {
        let _ = self
            .inflight
            .fetch_update(AcqRel, Acquire, |v| Some(v.saturating_sub(n)));
    }

    /// The peak since the last call, restarting from what is in flight now.
    pub fn take_peak(&self) -> u64 {
        self.peak.swap(self.inflight.load(Relaxed), Relaxed)
    }

    /// Counts an admitted `Critical` request (already counted in `inflight`).
    pub fn enter_critical(&self) {
        let now = self.critical.fetch_add(1, AcqRel) + 1;
        if now > self.critical_peak.load(Relaxed) {
            self.critical_peak.fetch_max(now, Relaxed);
        }
    }

    /// Uncounts `n` `Critical` requests (never below 0).
    pub fn leave_critical(&self, n: u64) {
        let _ = self
            .critical
            .fetch_update(AcqRel, Acquire, |v| Some(v.saturating_sub(n)));
    }

    /// The most `Critical` in flight since the last call.
    pub fn take_critical_peak(&self) -> u64 {
        self.critical_peak
            .swap(self.critical.load(Relaxed), Relaxed)
    }
}

/// One latency sample as the ring holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingSample {
    pub group: usize,
    pub latency_us: u64,
    pub probe: bool,
}

impl SlotCell {
    /// Appends a sample (the row's worker only: one writer, no locked instruction).
    pub fn push(&self, s: RingSample) {
        let entry = s.latency_us.min((1 << LATENCY_BITS) - 1)
            | (s.group as u64 & 0x7fff) << LATENCY_BITS
            | if s.probe { PROBE_BIT } else { 0 };
        let head = self.head.load(Relaxed);
        self.ring[(head % RING as u64) as usize].store(entry, Relaxed);
        self.head.store(head + 1, Release);
    }

    /// The samples written since `*tail` (the last `RING` if more), moving `*tail`.
    pub fn drain(&self, tail: &mut u64, mut each: impl FnMut(RingSample)) {
        let head = self.head.load(Acquire);
        if head < *tail {
            *tail = head; // a new worker in the row started over
        }
        let from = (*tail).max(head.saturating_sub(RING as u64));
        for i in from..head {
            let e = self.ring[(i % RING as u64) as usize].load(Relaxed);
            each(RingSample {
                group: ((e & !PROBE_BIT) >> LATENCY_BITS) as usize,
                latency_us: e & ((1 << LATENCY_BITS) - 1),
                probe: e & PROBE_BIT != 0,
            });
        }
        *tail = head;
    }

    /// Gives back to the groups what this row still counts in flight (its worker is
    /// gone); exactly once whoever calls it, since each share is swapped out.
    pub fn uncount(&self, groups: &[GroupCell; MAX_GROUPS]) {
        for ((share, critical), g) in self.inflight.iter().zip(&self.critical).zip(groups) {
            if critical.load(Relaxed) != 0 {
                let left = critical.swap(0, AcqRel);
                if left > 0 {
                    g.leave_critical(u64::from(left));
                }
            }
            if share.load(Relaxed) == 0 {
                continue;
            }
            let left = share.swap(0, AcqRel);
            if left > 0 {
                g.leave(u64::from(left));
            }
        }
    }
}

/// Which worker runs the controllers: its pid and, in the low 32 bits, the
/// CLOCK_MONOTONIC milliseconds of its last renewal. A holder that stops renewing
/// (it exited, or died) is replaced after `stale_ms`. One schedule for all workers,
/// so the baseline is never re-measured by several at once.
#[repr(C, align(64))]
pub struct Lease {
    word: AtomicU64,
}

impl Lease {
    /// Renews the lease for `pid` or takes it over if free or stale; true if `pid`
    /// holds it now.
    pub fn hold(&self, pid: u32, now_ms: u64, stale_ms: u64) -> bool {
        let mine = u64::from(pid) << 32 | (now_ms & 0xffff_ffff);
        let cur = self.word.load(Acquire);
        let holder = (cur >> 32) as u32;
        let age = (now_ms as u32).wrapping_sub(cur as u32);
        let free = holder == 0 || (holder != pid && u64::from(age) > stale_ms);
        if holder != pid && !free {
            return false;
        }
        self.word
            .compare_exchange(cur, mine, AcqRel, Acquire)
            .is_ok()
    }

    /// Lets the lease go (a worker that stops).
    pub fn resign(&self, pid: u32) {
        let cur = self.word.load(Acquire);
        if (cur >> 32) as u32 == pid {
            let _ = self.word.compare_exchange(cur, 0, AcqRel, Acquire);
        }
    }

    /// The holder's pid, 0 if none.
    pub fn holder(&self) -> u32 {
        (self.word.load(Acquire) >> 32) as u32
    }
}

/// One group as `forkd stats` shows it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct OverloadReport {
    pub upstream: String,
    pub mode: &'static str,
    pub limit: u64,
    /// The part of the limit kept for `Critical`.
    pub reserve: u64,
    pub inflight: u64,
    pub baseline_us: u64,
    pub sample_us: u64,
    pub probing: bool,
    pub shed: PerPriority,
    pub shed_cpu: u64,
    pub dry_run: PerPriority,
}

#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq, Default)]
pub struct PerPriority {
    pub critical: u64,
    pub normal: u64,
    pub low: u64,
}

impl PerPriority {
    fn of(cells: &[AtomicU64; 3]) -> PerPriority {
        PerPriority {
            critical: cells[0].load(Relaxed),
            normal: cells[1].load(Relaxed),
            low: cells[2].load(Relaxed),
        }
    }

    fn each(&self) -> [(&'static str, u64); 3] {
        [
            ("critical", self.critical),
            ("normal", self.normal),
            ("low", self.low),
        ]
    }
}

/// Every claimed group.
pub fn read(area: &OverloadArea) -> Vec<OverloadReport> {
    area.groups
        .iter()
        .filter(|g| g.name_hash.load(Acquire) != 0)
        .map(|g| OverloadReport {
            upstream: g.name.get(),
            mode: mode_name(g.mode.load(Relaxed)),
            limit: g.limit.load(Relaxed),
            reserve: g.reserve.load(Relaxed),
            inflight: g.inflight.load(Relaxed),
            baseline_us: g.baseline_us.load(Relaxed),
            sample_us: g.sample_us.load(Relaxed),
            probing: g.probing.load(Relaxed) != 0,
            shed: PerPriority::of(&g.shed),
            shed_cpu: g.shed_cpu.load(Relaxed),
            dry_run: PerPriority::of(&g.dry_run),
        })
        .collect()
}

/// The `forkd stats` section.
pub fn table(o: &mut String, groups: &[OverloadReport]) {
    if groups.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "{:<12} {:<8} {:>6} {:>8} {:>10} {:>10} {:>6} {:>21} {:>21}",
        "overload",
        "mode",
        "limit",
        "inflight",
        "baseline",
        "sample",
        "probe",
        "shed crit/norm/low",
        "dry_run crit/norm/low"
    );
    for g in groups {
        let us = |v: u64| {
            if v == 0 {
                "-".to_string()
            } else {
                format!("{:.1}ms", v as f64 / 1000.0)
            }
        };
        let _ = writeln!(
            o,
            "{:<12} {:<8} {:>6} {:>8} {:>10} {:>10} {:>6} {:>21} {:>21}",
            g.upstream,
            g.mode,
            g.limit,
            g.inflight,
            us(g.baseline_us),
            us(g.sample_us),
            if g.probing { "yes" } else { "no" },
            format!("{}/{}/{}", g.shed.critical, g.shed.normal, g.shed.low),
            format!(
                "{}/{}/{}",
                g.dry_run.critical, g.dry_run.normal, g.dry_run.low
            ),
        );
    }
}

/// The Prometheus families, labelled `upstream` (and `priority`).
pub fn prometheus(o: &mut String, groups: &[OverloadReport], seconds: fn(f64) -> String) {
    if groups.is_empty() {
        return;
    }
    let label = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
    /// The value, and whether it is microseconds shown as seconds.
    type Gauge = fn(&OverloadReport) -> (u64, bool);
    let gauges: [(&str, &str, Gauge); 5] = [
        (
            "forkd_overload_limit",
            "Adaptive concurrency limit of the upstream group (requests in flight, all workers).",
            |g| (g.limit, false),
        ),
        (
            "forkd_overload_inflight",
            "Requests in flight to the upstream group, all workers.",
            |g| (g.inflight, false),
        ),
        (
            "forkd_overload_baseline_seconds",
            "Baseline (minimum) latency the limit is computed against.",
            |g| (g.baseline_us, true),
        ),
        (
            "forkd_overload_sample_seconds",
            "Latency quantile of the last sample window.",
            |g| (g.sample_us, true),
        ),
        (
            "forkd_overload_probing",
            "1 while the baseline latency is being re-measured (limit at min_limit).",
            |g| (u64::from(g.probing), false),
        ),
    ];
    for (family, help, value) in gauges {
        let _ = writeln!(o, "# HELP {family} {help}\n# TYPE {family} gauge");
        for g in groups {
            let (v, us) = value(g);
            let v = if us { seconds(v as f64) } else { v.to_string() };
            let _ = writeln!(
                o,
                "{family}{{upstream=\"{}\",mode=\"{}\"}} {v}",
                label(&g.upstream),
                g.mode,
            );
        }
    }
    type Counts = fn(&OverloadReport) -> PerPriority;
    let counters: [(&str, &str, Counts); 2] = [
        (
            "forkd_overload_shed_total",
            "Requests answered 503 by the adaptive limit (Enforce), by route priority.",
            |g| g.shed,
        ),
        (
            "forkd_overload_dry_run_total",
            "Requests over the adaptive limit admitted by DryRun, by route priority.",
            |g| g.dry_run,
        ),
    ];
    for (family, help, value) in counters {
        let _ = writeln!(o, "# HELP {family} {help}\n# TYPE {family} counter");
        for g in groups {
            for (priority, n) in value(g).each() {
                let _ = writeln!(
                    o,
                    "{family}{{upstream=\"{}\",priority=\"{priority}\"}} {n}",
                    label(&g.upstream)
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::testing::TempRegion;
    use crate::shm::Region;

    fn region(name: &str) -> (TempRegion, Region) {
        let tmp = TempRegion::new(name);
        let region = Region::create(&tmp.0, 1, None).unwrap();
        (tmp, region)
    }

    #[test]
    fn entering_is_bounded_by_the_cap_over_all_threads() {
        let (_tmp, region) = region("overload-enter");
        let g = &region.layout().overload.groups[0];
        let admitted: u64 = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..4)
                .map(|_| scope.spawn(|| (0..1000).filter(|_| g.enter(10)).count() as u64))
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).sum()
        });
        assert_eq!(admitted, 10, "never more than the cap in flight");
        assert_eq!(g.inflight.load(Relaxed), 10);
        assert_eq!(g.take_peak(), 10);
        g.leave(3);
        assert_eq!(g.take_peak(), 10, "the window started with 10 in flight");
        assert_eq!(g.take_peak(), 7, "the next starts from what is in flight");
        g.leave(100);
        assert_eq!(g.inflight.load(Relaxed), 0, "never below zero");
    }

    #[test]
    fn the_ring_hands_out_each_sample_once_and_the_newest_when_lapped() {
        let (_tmp, region) = region("overload-ring");
        let s = &region.layout().overload.slots[3];
        let mut tail = 0;
        for i in 0..5u64 {
            s.push(RingSample {
                group: (i % 3) as usize,
                latency_us: 1000 + i,
                probe: i == 4,
            });
        }
        let mut got = Vec::new();
        s.drain(&mut tail, |x| got.push(x));
        assert_eq!(got.len(), 5);
        assert_eq!(
            got[4],
            RingSample {
                group: 1,
                latency_us: 1004,
                probe: true
            }
        );
        got.clear();
        s.drain(&mut tail, |x| got.push(x));
        assert!(got.is_empty());
        for i in 0..(RING as u64 + 10) {
            s.push(RingSample {
                group: 0,
                latency_us: i,
                probe: false,
            });
        }
        s.drain(&mut tail, |x| got.push(x));
        assert_eq!(got.len(), RING);
        assert_eq!(got[0].latency_us, 10);
        assert_eq!(got[RING - 1].latency_us, RING as u64 + 9);
    }

    #[test]
    fn a_dead_rows_share_is_uncounted_exactly_once() {
        let (_tmp, region) = region("overload-uncount");
        let o = &region.layout().overload;
        o.groups[2].inflight.store(5, Relaxed);
        o.slots[7].inflight[2].store(3, Relaxed);
        o.groups[2].critical.store(4, Relaxed);
        o.slots[7].critical[2].store(1, Relaxed);
        o.slots[7].uncount(&o.groups);
        o.slots[7].uncount(&o.groups);
        assert_eq!(o.groups[2].inflight.load(Relaxed), 2);
        assert_eq!(
            o.groups[2].critical.load(Relaxed),
            3,
            "its Critical share too"
        );
    }

    /// One schedule for all workers: only the holder runs the controllers; another
    /// worker takes over only once the holder stopped renewing.
    #[test]
    fn one_worker_holds_the_lease_until_it_stops_renewing() {
        let (_tmp, region) = region("overload-lease");
        let lease = &region.layout().overload.lease;
        let (a, b) = (100, 200);
        let mut holders = Vec::new();
        for t in (0..1000).step_by(100) {
            let ha = lease.hold(a, t, 500);
            let hb = lease.hold(b, t, 500);
            assert!(ha != hb, "exactly one holder at {t}");
            holders.push(if ha { a } else { b });
        }
        assert!(holders.iter().all(|&h| h == a), "{holders:?}");
        // `a` stops renewing at t=900.
        assert!(!lease.hold(b, 1300, 500), "not stale yet");
        assert!(lease.hold(b, 1500, 500), "stale: taken over");
        assert!(!lease.hold(a, 1500, 500), "the old holder is out");
        lease.resign(a);
        assert_eq!(lease.holder(), b, "only the holder resigns");
        lease.resign(b);
        assert_eq!(lease.holder(), 0);
    }

    #[test]
    fn group_names_keep_their_cells_and_are_reported() {
        let (_tmp, region) = region("overload-groups");
        let o = &region.layout().overload;
        assert_eq!(o.group("app"), Some(0));
        assert_eq!(o.group("search"), Some(1));
        assert_eq!(o.group("app"), Some(0));
        o.groups[1].limit.store(12, Relaxed);
        o.groups[1].shed[2].store(5, Relaxed);
        let r = read(&region.layout().overload);
        assert_eq!(r.len(), 2);
        assert_eq!(
            (r[1].upstream.as_str(), r[1].limit, r[1].shed.low),
            ("search", 12, 5)
        );
        let mut text = String::new();
        prometheus(&mut text, &r, |us| format!("{}", us / 1e6));
        assert!(
            text.contains("forkd_overload_limit{upstream=\"search\",mode=\"off\"} 12"),
            "{text}"
        );
        assert!(
            text.contains("forkd_overload_shed_total{upstream=\"search\",priority=\"low\"} 5"),
            "{text}"
        );
        for i in 2..MAX_GROUPS {
            assert!(o.group(&format!("g{i}")).is_some());
        }
        assert_eq!(o.group("one too many"), None);
    }
}

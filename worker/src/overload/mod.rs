//! The adaptive concurrency limit of proxied routes (`overload` on an upstream).
//!
//! - `controller`: the limit of one upstream group from windows of latency samples
//!   (Envoy's gradient controller), sans-io.
//! - `admission`: who gets in under a limit (priorities, the CPU), and the ticket an
//!   admitted request holds.
//! - `cpu`: the worker's CPU use per sample period.
//!
//! [`Overload`] is the worker's side. The limit is global: every worker counts its
//! requests in flight in the group's cell of the region (`shm::overload`) and admits
//! against the one limit there. On the request path a worker does one `fetch_add`
//! on admission, one store into its own sample ring when the response head arrives,
//! and one `fetch_sub` when the upstream side ends. Off it, every `sample_every`
//! (a timer of the event loop), each worker reads its CPU use, and the one worker
//! holding the region's lease drains every worker's ring and runs the controllers,
//! publishing each group's limit.

pub mod admission;
pub mod controller;
pub mod cpu;

use admission::{cap, reserve, Admission, Ticket};
use controller::{Controller, Params, Sample, Window};
use forkd_shared::config::overload::{Overload as Settings, OverloadMode, Priority};
use forkd_shared::config::Config;
use forkd_shared::shm::layout::{WorkerState, MAX_SLOTS};
use forkd_shared::shm::overload::{mode_code, GroupCell, MAX_GROUPS};
use forkd_shared::shm::Region;
use std::rc::Rc;
use std::sync::atomic::Ordering::{AcqRel, Relaxed};

/// A lease holder that has not renewed for this many of its periods is replaced.
const STALE_PERIODS: u64 = 5;
/// At most one log line about sheds per worker this often.
const LOG_EVERY_US: u64 = 1_000_000;

/// One configured group as this worker sees it.
#[derive(Debug, Clone, Copy)]
struct Group {
    /// The region cell.
    cell: usize,
    settings: Settings,
}

/// A controller the lease holder runs, with its window so far.
struct Running {
    controller: Controller,
    settings: Settings,
    /// When the window started (worker clock µs).
    since: u64,
    samples: Vec<Sample>,
    /// The group's sheds (all priorities) counted when the window started.
    shed_before: u64,
}

pub struct Overload {
    region: Rc<Region>,
    row: usize,
    pid: u32,
    /// By upstream index: the group of each upstream with `overload` not `Off`.
    groups: Vec<Option<Group>>,
    /// The shortest `sample_every` of those: how often [`Overload::tick`] works.
    period_us: Option<u64>,
    next_tick: u64,
    cpu: cpu::CpuMeter,
    /// The worker's CPU use in the last period (share of one CPU).
    cpu_use: f64,
    /// By region cell, while this worker holds the lease.
    running: Vec<Option<Running>>,
    /// Each row's ring position read so far (lease holder).
    tails: Vec<u64>,
    log: ShedLog,
    seed: u64,
}

/// Per-priority sheds and dry-run hits not logged yet, and when the next line may be
/// written: an overload must not turn into a flood of the error log.
#[derive(Debug, Default)]
struct ShedLog {
    unlogged: [u64; 3],
    log_at: u64,
}

impl ShedLog {
    fn note(&mut self, now: u64, priority: usize, g: &GroupCell, what: &str) {
        self.unlogged[priority] += 1;
        if now < self.log_at {
            return;
        }
        self.log_at = now + LOG_EVERY_US;
        let [c, n, l] = std::mem::take(&mut self.unlogged);
        forkd_shared::info!(
            "upstream {} at its concurrency limit {} ({} in flight): {what}; since the last line: critical {c}, normal {n}, low {l}",
            g.name.get(),
            g.limit.load(Relaxed),
            g.inflight.load(Relaxed)
        );
    }
}

impl Overload {
    /// For the worker of region row `row`: gives back what a dead worker of the same
    /// row still counted in flight, and maps the configuration's groups.
    pub fn new(region: Rc<Region>, row: usize, config: &Config) -> Overload {
        let o = &region.layout().overload;
        o.slots[row].uncount(&o.groups);
        let pid = std::process::id();
        let mut me = Overload {
            region,
            row,
            pid,
            groups: Vec::new(),
            period_us: None,
            next_tick: 0,
            cpu: cpu::CpuMeter::default(),
            cpu_use: 0.0,
            running: (0..MAX_GROUPS).map(|_| None).collect(),
            tails: vec![0; MAX_SLOTS],
            log: ShedLog::default(),
            seed: u64::from(pid) << 32 ^ forkd_shared::shm::now_ms(),
        };
        me.reconfigure(config);
        me
    }

    /// A configuration adopted (start or reload): modes, bounds and groups take
    /// effect now; a group turned `Off` stops counting (requests admitted before keep
    /// their tickets).
    pub fn reconfigure(&mut self, config: &Config) {
        let area = &self.region.layout().overload;
        self.groups = config
            .upstreams
            .iter()
            .map(|u| {
                let settings = u.overload?;
                if settings.mode == OverloadMode::Off {
                    return None;
                }
                match area.group(&u.name) {
                    Some(cell) => Some(Group { cell, settings }),
                    None => {
                        forkd_shared::warn!(
                            "upstream {}: no room for its overload limit in the region ({MAX_GROUPS} groups): not limited",
                            u.name
                        );
                        None
                    }
                }
            })
            .collect();
        self.period_us = self
            .groups
            .iter()
            .flatten()
            .map(|g| g.settings.sample_every.as_micros() as u64)
            .min();
        // Groups this worker no longer limits: a lease holder stops their controller
        // and shows them as off; bounds of the others apply at once.
        for (cell, slot) in self.running.iter_mut().enumerate() {
            let now_on = self.groups.iter().flatten().find(|g| g.cell == cell);
            match (slot.as_mut(), now_on) {
                (Some(r), Some(g)) => {
                    r.settings = g.settings;
                    r.controller.set_params(params(&g.settings));
                }
                (Some(_), None) => {
                    *slot = None;
                    retire(&area.groups[cell]);
                }
                (None, _) => {}
            }
        }
        if self.period_us.is_none() {
            area.lease.resign(self.pid);
        }
    }

    /// Admission of a request of `priority` to upstream `upstream`, at `now` (µs).
    pub fn admit(&mut self, upstream: usize, priority: Priority, now: u64) -> Admission {
        let Some(Some(g)) = self.groups.get(upstream).copied() else {
            return Admission::Admit(None);
        };
        let area = &self.region.layout().overload;
        let cell = &area.groups[g.cell];
        let published = cell.limit.load(Relaxed);
        let limit = if published == 0 {
            u64::from(g.settings.min_limit) // nothing computed yet: as a measurement does
        } else {
            published
        };
        let hot = self.cpu_use > g.settings.cpu_high;
        let reserve = match cell.reserve.load(Relaxed) {
            0 => reserve(limit, 0),
            r => r,
        };
        let cap = cap(limit, reserve, priority, hot);
        let p = priority.index();
        let admitted = match g.settings.mode {
            OverloadMode::Enforce => {
                if !cell.enter(cap) {
                    cell.shed[p].fetch_add(1, Relaxed);
                    if hot && priority == Priority::Low {
                        cell.shed_cpu.fetch_add(1, Relaxed);
                    }
                    self.log.note(now, p, cell, "shed (503)");
                    return Admission::Shed;
                }
                true
            }
            OverloadMode::DryRun => {
                if cell.enter_anyway() >= cap {
                    cell.dry_run[p].fetch_add(1, Relaxed);
                    self.log
                        .note(now, p, cell, "over the limit (DryRun: admitted)");
                }
                true
            }
            OverloadMode::Off => false,
        };
        if !admitted {
            return Admission::Admit(None);
        }
        area.slots[self.row].inflight[g.cell].fetch_add(1, AcqRel);
        let critical = priority == Priority::Critical;
        if critical {
            area.slots[self.row].critical[g.cell].fetch_add(1, AcqRel);
            cell.enter_critical();
        }
        Admission::Admit(Some(Ticket {
            region: self.region.clone(),
            row: self.row,
            cell: g.cell,
            admitted_at: now,
            probe: cell.probing.load(Relaxed) != 0,
            sampled: false,
            critical,
        }))
    }

    /// When [`Overload::tick`] has work next (worker clock µs), if ever.
    pub fn next_due(&self) -> Option<u64> {
        self.period_us.map(|_| self.next_tick)
    }

    /// Every period: the worker's CPU use; for the lease holder, every worker's new
    /// samples into the windows, the controllers of the windows that ended, and
    /// uncounting rows whose worker is gone.
    pub fn tick(&mut self, now: u64) {
        let Some(period) = self.period_us else {
            return;
        };
        if now < self.next_tick {
            return;
        }
        self.next_tick = now + period;
        if let Some(share) = self.cpu.read(now) {
            self.cpu_use = share;
        }
        let layout = self.region.layout();
        let area = &layout.overload;
        let now_ms = forkd_shared::shm::monotonic_ms();
        let stale_ms = (period * STALE_PERIODS / 1000).max(200);
        if !area.lease.hold(self.pid, now_ms, stale_ms) {
            self.running.iter_mut().for_each(|r| *r = None);
            return;
        }
        // Newly leading, or a group newly on: controllers from the published state.
        for g in self.groups.iter().flatten() {
            let slot = &mut self.running[g.cell];
            if slot.is_none() {
                let cell = &area.groups[g.cell];
                let published = (
                    cell.limit.load(Relaxed) as u32,
                    cell.baseline_us.load(Relaxed),
                );
                let from = (cell.mode.load(Relaxed) != 0).then_some(published);
                self.seed = self.seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                *slot = Some(Running {
                    controller: Controller::new(params(&g.settings), now, self.seed, from),
                    settings: g.settings,
                    since: now,
                    samples: Vec::new(),
                    shed_before: total_shed(cell),
                });
                cell.mode.store(mode_code(g.settings.mode), Relaxed);
            }
        }
        for (row, slot) in area.slots.iter().enumerate() {
            let running = &mut self.running;
            slot.drain(&mut self.tails[row], |s| {
                if let Some(Some(r)) = running.get_mut(s.group) {
                    r.samples.push(Sample {
                        latency_us: s.latency_us,
                        probe: s.probe,
                    });
                }
            });
            let state = WorkerState::from_u32(layout.slots[row].state.load(Relaxed));
            if row != self.row && matches!(state, WorkerState::Exited | WorkerState::Empty) {
                slot.uncount(&area.groups);
            }
        }
        for (cell, slot) in self.running.iter_mut().enumerate() {
            let Some(r) = slot else { continue };
            let every = r.settings.sample_every.as_micros() as u64;
            if now.saturating_sub(r.since) + period / 2 < every {
                continue; // its window is longer than the tick
            }
            let g = &area.groups[cell];
            let shed = total_shed(g);
            let verdict = r.controller.tick(Window {
                now,
                samples: &mut r.samples,
                peak_inflight: g.take_peak().min(u64::from(u32::MAX)) as u32,
                shed: shed.wrapping_sub(r.shed_before),
            });
            r.shed_before = shed;
            r.samples.clear();
            r.since = now;
            g.limit.store(u64::from(verdict.limit), Relaxed);
            let critical = g.take_critical_peak();
            g.reserve
                .store(reserve(u64::from(verdict.limit), critical), Relaxed);
            g.baseline_us
                .store(verdict.baseline_us.unwrap_or(0), Relaxed);
            g.sample_us.store(verdict.sample_us.unwrap_or(0), Relaxed);
            g.probing.store(u32::from(verdict.probing), Relaxed);
            g.mode.store(mode_code(r.settings.mode), Relaxed);
        }
    }

    /// The worker stops: another takes the lease at once.
    pub fn stop(&mut self) {
        self.region.layout().overload.lease.resign(self.pid);
    }
}

/// Requests the group refused so far (`Enforce`) or would have (`DryRun`).
fn total_shed(g: &GroupCell) -> u64 {
    g.shed
        .iter()
        .chain(&g.dry_run)
        .map(|c| c.load(Relaxed))
        .sum()
}

fn params(s: &Settings) -> Params {
    Params {
        min_limit: s.min_limit,
        max_limit: s.max_limit,
        quantile: s.latency_quantile,
    }
}

/// A group no longer limited: shown as off, with no limit.
fn retire(g: &GroupCell) {
    g.mode.store(0, Relaxed);
    g.limit.store(0, Relaxed);
    g.reserve.store(0, Relaxed);
    g.probing.store(0, Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;
    use forkd_shared::shm::overload::RingSample;

    use crate::test_region::region;

    fn config(mode: &str) -> Config {
        let text = format!(
            r#"(
            upstreams: {{ "app": (servers: ["127.0.0.1:9000"],
                overload: Some((mode: {mode}, min_limit: 2, max_limit: 2))) }},
            servers: [(listen: ["127.0.0.1:8080"], routes: [
                (prefix: "/", handler: Proxy(upstream: "app")),
            ])],
        )"#
        );
        Config::parse(std::path::Path::new("/tmp/forkd-test.ron"), &text).unwrap()
    }

    fn samples(region: &Region, row: usize) -> Vec<RingSample> {
        let mut out = Vec::new();
        region.layout().overload.slots[row].drain(&mut 0, |s| out.push(s));
        out
    }

    /// The failure where rejections feed near-zero latencies into the estimate: a shed
    /// request is never a sample, and neither is one whose upstream failed before a
    /// response head; only admitted, completed requests are.
    #[test]
    fn shed_and_failed_requests_are_not_samples() {
        let (_tmp, region) = region("samples");
        let mut o = Overload::new(region.clone(), 3, &config("Enforce"));
        let mut first = match o.admit(0, Priority::Low, 1_000) {
            Admission::Admit(Some(t)) => t,
            other => panic!("{other:?}"),
        };
        for _ in 0..100 {
            assert!(matches!(o.admit(0, Priority::Low, 1_001), Admission::Shed));
        }
        let failed = match o.admit(0, Priority::Critical, 1_002) {
            Admission::Admit(Some(t)) => t,
            other => panic!("{other:?}"),
        };
        assert!(matches!(
            o.admit(0, Priority::Critical, 1_003),
            Admission::Shed
        ));
        first.completed(41_000);
        first.completed(99_000); // once per request
        drop(first);
        drop(failed); // its upstream failed: no head, no sample
        let got = samples(&region, 3);
        assert_eq!(
            got,
            [RingSample {
                group: 0,
                latency_us: 40_000,
                probe: false
            }]
        );
        let g = &region.layout().overload.groups[0];
        assert_eq!(
            g.inflight.load(Relaxed),
            0,
            "every ticket gave its place back"
        );
        assert_eq!(g.shed[Priority::Low.index()].load(Relaxed), 100);
        assert_eq!(g.shed[Priority::Critical.index()].load(Relaxed), 1);
        assert_eq!(
            o.region.layout().overload.slots[3].inflight[0].load(Relaxed),
            0
        );
    }

    #[test]
    fn dry_run_admits_everything_and_off_counts_nothing() {
        let (_tmp, region) = region("modes");
        let mut o = Overload::new(region.clone(), 0, &config("DryRun"));
        let held: Vec<_> = (0..5)
            .map(|i| match o.admit(0, Priority::Low, i) {
                Admission::Admit(Some(t)) => t,
                other => panic!("{other:?}"),
            })
            .collect();
        let g = &region.layout().overload.groups[0];
        assert_eq!(g.inflight.load(Relaxed), 5);
        assert_eq!(g.dry_run[Priority::Low.index()].load(Relaxed), 4);
        drop(held);
        o.reconfigure(&config("Off"));
        assert!(matches!(
            o.admit(0, Priority::Low, 9),
            Admission::Admit(None)
        ));
        assert_eq!(g.inflight.load(Relaxed), 0);
    }

    /// Above `cpu_high` (0.8 by default), a worker sheds Low however few are in
    /// flight, counted apart; Normal and Critical go on.
    #[test]
    fn a_hot_cpu_sheds_low_first() {
        let (_tmp, region) = region("cpu");
        let mut o = Overload::new(region.clone(), 1, &config("Enforce"));
        o.cpu_use = 0.95;
        assert!(matches!(o.admit(0, Priority::Low, 0), Admission::Shed));
        let normal = o.admit(0, Priority::Normal, 0);
        assert!(matches!(normal, Admission::Admit(Some(_))), "{normal:?}");
        let g = &region.layout().overload.groups[0];
        assert_eq!(g.shed_cpu.load(Relaxed), 1);
        assert_eq!(g.shed[Priority::Low.index()].load(Relaxed), 1);
        drop(normal);
        o.cpu_use = 0.5;
        assert!(matches!(
            o.admit(0, Priority::Low, 0),
            Admission::Admit(Some(_))
        ));
    }

    /// A worker that died with requests in flight: the next worker of its row gives
    /// its share back.
    #[test]
    fn a_new_worker_in_a_row_uncounts_what_the_dead_one_held() {
        let (_tmp, region) = region("dead");
        let mut dead = Overload::new(region.clone(), 5, &config("Enforce"));
        let held = dead.admit(0, Priority::Critical, 0);
        std::mem::forget(held); // a SIGKILL: no destructor runs
        let g = &region.layout().overload.groups[0];
        assert_eq!(g.inflight.load(Relaxed), 1);
        let _next = Overload::new(region.clone(), 5, &config("Enforce"));
        assert_eq!(g.inflight.load(Relaxed), 0);
    }
}

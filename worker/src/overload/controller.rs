//! The concurrency limit of one upstream group, sans-io: Envoy's gradient controller
//! (adaptive concurrency filter), fed one window of latency samples at a time.
//!
//! ```text
//! every sample_every, with the window's samples (admitted, completed requests only):
//!   sample   = latency_quantile of the window           (no samples: nothing changes)
//!   baseline = min(baseline, sample)                    (a lower sample proves it too high)
//!   gradient = clamp((baseline + 25%·baseline) / sample, 0.5, 2.0)
//!   used     = max(peak in flight, min_limit) if gradient < 1 and the peak stayed
//!              below the limit, else limit
//!   limit'   = gradient·used;   limit' += sqrt(limit')  (headroom for bursts)
//!   no growth while the window's peak in-flight stayed below limit/2 and nothing was
//!   shed (nothing to learn: the limit is not what holds the traffic back)
//!   limit    = clamp(0.8·limit + 0.2·limit', min_limit, max_limit)
//! every 60 s + up to 15% jitter, and after 5 windows in a row at min_limit with
//! limit' below it:
//!   re-measure the baseline: limit = min_limit until 50 samples of requests admitted
//!   during the measurement (or at least one and 2 s), baseline = their quantile; then
//!   the limit from before the measurement is restored
//! ```
//!
//! The baseline is measured only while the limit holds concurrency at `min_limit`, so
//! queueing under load never enters it (the baseline cannot creep up), and any window
//! faster than it lowers it at once. A baseline too low for an upstream that became
//! slower pins the limit at `min_limit`, which starts a re-measurement after 5 windows
//! (the floor cannot stick). Defaults are Envoy's (buffer 25%, interval 60 s, 50
//! requests), jitter aside (15%). One thing is Netflix Gradient2's: the new limit is
//! smoothed (0.2), so one window slowed by a scheduling stall of the machine, not by
//! the upstream, moves the limit by a tenth at most, not by half (`bench/overload`
//! on a loaded machine, same run: Critical admitted 96.8-99.0% with it, 94.8-95.9%
//! without).
//!
//! `used` is ours too. Envoy multiplies the limit because without priorities the
//! requests in flight are the limit once it holds traffic back. Here the priorities'
//! caps can hold them below it: at 3x an upstream of 8 slots Low's cap is full all the
//! time, so the sheds say "limited" and the limit rose to 19-24 while 10-12 were in
//! flight (`bench/overload --stats`); the latency of a window says what the
//! concurrency that produced it did, so a decrease applies to that. A limit far above
//! what is in use is a promise the upstream cannot keep: once Low's traffic stops,
//! that many Normal requests would be admitted into its queue at once.

use crate::timers::Micros;

/// The buffer over the baseline that counts as no queueing.
const BUFFER: f64 = 0.25;
/// Bounds of one window's correction.
const GRADIENT_MIN: f64 = 0.5;
const GRADIENT_MAX: f64 = 2.0;
/// The weight of a window's new limit against the current one (Gradient2's smoothing).
const SMOOTHING: f64 = 0.2;
/// How often the baseline is re-measured, and the jitter added to each interval.
pub const PROBE_EVERY_US: Micros = 60_000_000;
pub const PROBE_JITTER: f64 = 0.15;
/// Samples a re-measurement waits for, and how long at most once it has one.
pub const PROBE_SAMPLES: usize = 50;
pub const PROBE_MAX_US: Micros = 2_000_000;
/// Windows in a row at `min_limit` that start a re-measurement.
pub const STUCK_WINDOWS: u32 = 5;

/// The configured bounds and quantile.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    pub min_limit: u32,
    pub max_limit: u32,
    pub quantile: f64,
}

/// One completed request's latency (admission to the upstream's response head).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    pub latency_us: u64,
    /// Admitted while the baseline was being measured (concurrency held at min_limit).
    pub probe: bool,
}

/// What one window brought.
#[derive(Debug)]
pub struct Window<'a> {
    pub now: Micros,
    /// Reordered by the controller.
    pub samples: &'a mut [Sample],
    /// The most requests in flight at once during the window.
    pub peak_inflight: u32,
    /// Requests refused during the window (a priority's share of the limit may be
    /// full while the whole is not).
    pub shed: u64,
}

#[derive(Debug, Clone, PartialEq)]
enum Phase {
    /// The baseline is being measured: the limit is `min_limit`.
    Probing {
        since: Micros,
        /// The limit to restore afterwards.
        resume: f64,
        samples: Vec<u64>,
    },
    Tracking {
        next_probe: Micros,
        /// Windows in a row that ended at `min_limit`.
        at_min: u32,
    },
}

/// What the controller publishes after a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    pub limit: u32,
    /// The baseline latency, once measured.
    pub baseline_us: Option<u64>,
    /// The last window's latency quantile.
    pub sample_us: Option<u64>,
    pub probing: bool,
}

#[derive(Debug, Clone)]
pub struct Controller {
    params: Params,
    limit: f64,
    baseline_us: Option<u64>,
    sample_us: Option<u64>,
    phase: Phase,
    rng: u64,
}

impl Controller {
    /// A controller that starts by measuring the baseline (none known), or from a
    /// published state (a worker taking over the group from another).
    pub fn new(params: Params, now: Micros, seed: u64, from: Option<(u32, u64)>) -> Controller {
        let mut c = Controller {
            params,
            limit: f64::from(params.min_limit),
            baseline_us: None,
            sample_us: None,
            phase: Phase::Tracking {
                next_probe: now,
                at_min: 0,
            },
            rng: seed | 1,
        };
        match from {
            Some((limit, baseline)) if limit > 0 && baseline > 0 => {
                c.limit = f64::from(limit);
                c.clamp();
                c.baseline_us = Some(baseline);
                let next_probe = c.next_probe_at(now);
                c.phase = Phase::Tracking {
                    next_probe,
                    at_min: 0,
                };
            }
            _ => c.start_probe(now),
        }
        c
    }

    /// New bounds or quantile (a reload): the state carries on.
    pub fn set_params(&mut self, params: Params) {
        self.params = params;
        self.clamp();
    }

    pub fn params(&self) -> Params {
        self.params
    }

    pub fn verdict(&self) -> Verdict {
        let probing = matches!(self.phase, Phase::Probing { .. });
        Verdict {
            limit: if probing {
                self.params.min_limit
            } else {
                self.limit.round() as u32
            },
            baseline_us: self.baseline_us,
            sample_us: self.sample_us,
            probing,
        }
    }

    /// Takes one window; returns what to publish.
    pub fn tick(&mut self, w: Window) -> Verdict {
        if let Some(q) = quantile(w.samples, self.params.quantile) {
            self.sample_us = Some(q);
        }
        match &mut self.phase {
            Phase::Probing {
                since,
                resume,
                samples,
            } => {
                // Only requests admitted under the probe's limit show the upstream
                // without queueing (earlier ones may have queued).
                samples.extend(w.samples.iter().filter(|s| s.probe).map(|s| s.latency_us));
                let done = samples.len() >= PROBE_SAMPLES
                    || (!samples.is_empty() && w.now.saturating_sub(*since) >= PROBE_MAX_US);
                if done {
                    let mut measured: Vec<Sample> = samples
                        .iter()
                        .map(|&latency_us| Sample {
                            latency_us,
                            probe: true,
                        })
                        .collect();
                    self.baseline_us = quantile(&mut measured, self.params.quantile);
                    self.limit = *resume;
                    self.clamp();
                    let next_probe = self.next_probe_at(w.now);
                    self.phase = Phase::Tracking {
                        next_probe,
                        at_min: 0,
                    };
                }
            }
            Phase::Tracking { next_probe, at_min } => {
                let (next_probe, mut stuck) = (*next_probe, *at_min);
                if let (Some(sample), Some(baseline)) = (self.sample_us, self.baseline_us) {
                    if !w.samples.is_empty() {
                        let baseline = baseline.min(sample).max(1);
                        self.baseline_us = Some(baseline);
                        let limited = w.shed > 0 || f64::from(w.peak_inflight) >= self.limit / 2.0;
                        let wants_less =
                            self.adjust(baseline, sample.max(1), w.peak_inflight, limited);
                        // At the floor and pushed below it (not on its way up from it).
                        let floor = f64::from(self.params.min_limit);
                        stuck = if wants_less && self.limit.round() <= floor {
                            stuck + 1
                        } else {
                            0
                        };
                    }
                }
                if w.now >= next_probe || stuck >= STUCK_WINDOWS {
                    self.start_probe(w.now);
                } else if let Phase::Tracking { at_min, .. } = &mut self.phase {
                    *at_min = stuck;
                }
            }
        }
        self.verdict()
    }

    /// Moves the limit by one window's gradient; true if the unsmoothed new limit is
    /// at or below the floor. A decrease applies to the concurrency that was in use
    /// (`peak`, when below the limit), whose latency the sample is.
    fn adjust(&mut self, baseline: u64, sample: u64, peak: u32, limited: bool) -> bool {
        let target = baseline as f64 * (1.0 + BUFFER);
        let gradient = (target / sample as f64).clamp(GRADIENT_MIN, GRADIENT_MAX);
        // At the published (rounded) limit, the limit itself is in use.
        let used = if gradient < 1.0 && f64::from(peak) < self.limit.round() {
            f64::from(peak).max(f64::from(self.params.min_limit))
        } else {
            self.limit
        };
        let mut next = gradient * used;
        next += next.sqrt();
        if next > self.limit && !limited {
            // Too little traffic to say whether more would queue.
            next = self.limit;
        }
        let wants_less = next <= f64::from(self.params.min_limit);
        self.limit = self.limit * (1.0 - SMOOTHING) + next * SMOOTHING;
        self.clamp();
        wants_less
    }

    fn clamp(&mut self) {
        self.limit = self.limit.clamp(
            f64::from(self.params.min_limit),
            f64::from(self.params.max_limit),
        );
    }

    fn start_probe(&mut self, now: Micros) {
        let resume = match self.phase {
            Phase::Probing { resume, .. } => resume,
            Phase::Tracking { .. } => self.limit,
        };
        self.phase = Phase::Probing {
            since: now,
            resume,
            samples: Vec::with_capacity(PROBE_SAMPLES),
        };
    }

    /// `now` + the interval + up to [`PROBE_JITTER`] of it.
    fn next_probe_at(&mut self, now: Micros) -> Micros {
        // xorshift64: a different sequence per seed, no crate needed.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let unit = (self.rng >> 11) as f64 / (1u64 << 53) as f64;
        now + PROBE_EVERY_US + (PROBE_EVERY_US as f64 * PROBE_JITTER * unit) as Micros
    }
}

/// The `q` quantile of the samples' latencies (nearest rank), if there are any.
pub fn quantile(samples: &mut [Sample], q: f64) -> Option<u64> {
    if samples.is_empty() {
        return None;
    }
    let rank = ((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1;
    let (_, nth, _) = samples.select_nth_unstable_by_key(rank, |s| s.latency_us);
    Some(nth.latency_us)
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Micros = 100_000;
    const BASE: u64 = 10_000;
    /// The synthetic upstream's capacity: beyond it, requests queue.
    const CAPACITY: u32 = 8;

    fn params() -> Params {
        Params {
            min_limit: 4,
            max_limit: 1000,
            quantile: 0.9,
        }
    }

    /// An upstream of fixed capacity and `base` latency: with `inflight` requests in
    /// it, a request waits `base · inflight / CAPACITY` beyond capacity. A window
    /// holds one sample per request in flight (a little spread).
    fn window_of(c: &Controller, base: u64, offered: u32) -> Vec<Sample> {
        let v = c.verdict();
        let inflight = offered.min(v.limit);
        let latency = base * u64::from(inflight.max(CAPACITY)) / u64::from(CAPACITY);
        (0..inflight.max(1))
            .map(|i| Sample {
                latency_us: latency + u64::from(i % 5) * latency / 50,
                probe: v.probing,
            })
            .collect()
    }

    /// One window busy at the limit, every request taking `latency`.
    fn at_the_limit(c: &mut Controller, now: &mut Micros, latency: u64) -> Verdict {
        let v = c.verdict();
        let mut samples = vec![
            Sample {
                latency_us: latency,
                probe: v.probing,
            };
            v.limit as usize
        ];
        *now += WINDOW;
        c.tick(Window {
            now: *now,
            samples: &mut samples,
            peak_inflight: v.limit,
            shed: 0,
        })
    }

    /// Runs `windows` windows at `offered` concurrency; returns the verdicts.
    fn run(
        c: &mut Controller,
        now: &mut Micros,
        windows: usize,
        base: u64,
        offered: u32,
    ) -> Vec<Verdict> {
        (0..windows)
            .map(|_| {
                let mut samples = window_of(c, base, offered);
                let peak = samples.len() as u32;
                *now += WINDOW;
                c.tick(Window {
                    now: *now,
                    samples: &mut samples,
                    peak_inflight: peak,
                    shed: 0,
                })
            })
            .collect()
    }

    #[test]
    fn the_first_windows_measure_the_baseline_at_min_limit() {
        let mut now = 0;
        let mut c = Controller::new(params(), now, 7, None);
        assert!(c.verdict().probing);
        assert_eq!(c.verdict().limit, 4);
        let v = run(&mut c, &mut now, 40, BASE, 300);
        let last = v.last().unwrap();
        assert!(!last.probing);
        let b = last.baseline_us.unwrap();
        assert!((BASE..BASE * 11 / 10).contains(&b), "baseline {b}");
    }

    #[test]
    fn limit_falls_when_latency_rises_and_recovers_when_it_falls() {
        let mut now = 0;
        let mut c = Controller::new(params(), now, 7, None);
        let calm = run(&mut c, &mut now, 100, BASE, 40);
        let before = calm.last().unwrap().limit;
        assert!(
            before >= 9,
            "the limit grows to what the upstream takes: {before}"
        );
        // The upstream slows down 4x for everything (not queueing): latency rises.
        let slow = run(&mut c, &mut now, 40, BASE * 4, 40);
        let during = slow.iter().map(|v| v.limit).min().unwrap();
        assert!(during < before, "{during} < {before}");
        assert_eq!(during, 4, "at worst the floor");
        let after = run(&mut c, &mut now, 40, BASE, 40);
        assert!(after.last().unwrap().limit >= 9, "{after:?}");
    }

    #[test]
    fn the_limit_never_leaves_its_bounds() {
        let p = Params {
            min_limit: 3,
            max_limit: 20,
            quantile: 0.5,
        };
        let mut now = 0;
        let mut c = Controller::new(p, now, 3, None);
        let mut all = Vec::new();
        for (base, offered) in [
            (BASE, 1000),
            (BASE * 50, 1000),
            (1, 1000),
            (BASE, 2),
            (0, 5),
        ] {
            all.extend(run(&mut c, &mut now, 300, base, offered));
        }
        // An upstream whose latency does not depend on load, busy at the limit: the
        // limit rises to its ceiling; then 10x slower: down to its floor.
        for latency in [BASE, BASE * 10] {
            for _ in 0..200 {
                all.push(at_the_limit(&mut c, &mut now, latency));
            }
        }
        assert!(all.iter().all(|v| (3..=20).contains(&v.limit)), "{all:?}");
        assert!(all.iter().any(|v| v.limit == 20) && all.iter().any(|v| v.limit == 3));
    }

    /// Gradient2's failure: a smoothed baseline follows sustained queueing up.
    #[test]
    fn the_baseline_does_not_creep_up_under_sustained_load() {
        let mut now = 0;
        let mut c = Controller::new(params(), now, 11, None);
        // Ten minutes at ~40x the upstream's capacity in offered concurrency: every
        // window past the probes queues.
        let v = run(&mut c, &mut now, 6000, BASE, 300);
        let steady = &v[100..];
        let worst = steady.iter().filter_map(|v| v.baseline_us).max().unwrap();
        assert!(worst < BASE * 11 / 10, "baseline crept to {worst}");
        let queued = steady.iter().filter_map(|v| v.sample_us).max().unwrap();
        assert!(queued > BASE * 3 / 2, "the load did queue ({queued})");
        let probes = steady
            .windows(2)
            .filter(|w| !w[0].probing && w[1].probing)
            .count();
        assert!(
            (8..=11).contains(&probes),
            "re-measured about once a minute: {probes}"
        );
        // And the limit stays near what the upstream takes without much queueing.
        let limits: Vec<u32> = steady
            .iter()
            .filter(|v| !v.probing)
            .map(|v| v.limit)
            .collect();
        let mean = limits.iter().sum::<u32>() as f64 / limits.len() as f64;
        assert!(mean < f64::from(CAPACITY) * 2.5, "mean limit {mean}");
    }

    /// Shed requests never reach the controller; a window with none completed moves
    /// nothing, and a window of few slow completions among many sheds still says
    /// "slow".
    #[test]
    fn windows_without_completions_change_nothing() {
        let mut now = 0;
        let mut c = Controller::new(params(), now, 5, None);
        run(&mut c, &mut now, 100, BASE, 40);
        let before = c.verdict();
        for _ in 0..4 {
            now += WINDOW;
            let v = c.tick(Window {
                now,
                samples: &mut [],
                peak_inflight: 40,
                shed: 0,
            });
            assert_eq!((v.limit, v.baseline_us), (before.limit, before.baseline_us));
        }
        now += WINDOW;
        let mut few = [Sample {
            latency_us: BASE * 3,
            probe: false,
        }; 3];
        let v = c.tick(Window {
            now,
            samples: &mut few,
            peak_inflight: 40,
            shed: 0,
        });
        assert!(v.limit < before.limit);
        assert_eq!(v.baseline_us, before.baseline_us);
    }

    /// A baseline measured during a slow spell is replaced by the first faster window,
    /// and one too low for an upstream that became slower for good is re-measured
    /// after a few windows at the floor: the limit gets off the floor either way.
    #[test]
    fn a_wrong_baseline_does_not_keep_the_limit_on_the_floor() {
        let mut now = 0;
        let mut c = Controller::new(params(), now, 9, None);
        // Measured while the upstream was 5x slower.
        run(&mut c, &mut now, 30, BASE * 5, 40);
        assert!(c.verdict().baseline_us.unwrap() >= BASE * 5);
        // Back to normal: the first faster window lowers it, the next re-measurement
        // (at most an interval and its jitter away) puts it right.
        let windows = ((PROBE_EVERY_US as f64 * (1.0 + PROBE_JITTER)) as Micros / WINDOW) as usize;
        let v = run(&mut c, &mut now, windows + 30, BASE, 40);
        assert!(v[0].baseline_us.unwrap() < BASE * 5, "{:?}", v[0]);
        let end = v.last().unwrap();
        assert!(end.baseline_us.unwrap() < BASE * 11 / 10, "{end:?}");
        // Now the upstream becomes 3x slower for good.
        run(&mut c, &mut now, 50, BASE, 40);
        let v = run(&mut c, &mut now, 60, BASE * 3, 40);
        let first_floor = v.iter().position(|v| v.limit == 4 && !v.probing).unwrap();
        let probe = v.iter().position(|v| v.probing).unwrap();
        assert!(
            probe > first_floor && probe <= first_floor + STUCK_WINDOWS as usize + 1,
            "{v:?}"
        );
        let end = v.last().unwrap();
        assert!(end.baseline_us.unwrap() >= BASE * 3);
        assert!(end.limit >= 9, "off the floor: {end:?}");
    }

    /// Smoothing climbs off the floor slowly: windows at `min_limit` on the way up are
    /// not the floor sticking, and start no re-measurement.
    #[test]
    fn a_limit_climbing_off_the_floor_is_not_re_measured() {
        let mut now = 0;
        let mut c = Controller::new(params(), now, 2, Some((4, BASE)));
        let mut seen = Vec::new();
        for _ in 0..12 {
            seen.push(at_the_limit(&mut c, &mut now, BASE * 18 / 10));
        }
        assert!(seen[..5].iter().all(|v| v.limit == 4), "{seen:?}");
        assert!(seen.iter().all(|v| !v.probing), "{seen:?}");
        assert!(seen.last().unwrap().limit > 4, "{seen:?}");
    }

    /// Low's share of the limit is full (requests shed) while the whole is far from
    /// it: the limit grows while latency allows, rather than "too little traffic".
    #[test]
    fn sheds_below_the_limit_let_it_grow() {
        let mut now = 0;
        let mut grow = |shed: u64| {
            let mut c = Controller::new(params(), 0, 4, Some((10, BASE)));
            let mut samples = vec![
                Sample {
                    latency_us: BASE,
                    probe: false,
                };
                3
            ];
            now += WINDOW;
            c.tick(Window {
                now,
                samples: &mut samples,
                peak_inflight: 3,
                shed,
            })
            .limit
        };
        assert_eq!(
            grow(0),
            10,
            "3 in flight of 10, nothing shed: nothing to learn"
        );
        assert!(grow(5) > 10);
    }

    /// The priorities' caps hold the requests in flight well below the limit (Low's
    /// share full, sheds every window) while the upstream queues: the limit falls
    /// to what that latency says of the concurrency in use, rather than staying a
    /// multiple of it.
    #[test]
    fn a_decrease_applies_to_the_concurrency_in_use() {
        let mut now = 0;
        let mut c = Controller::new(params(), now, 4, Some((22, BASE)));
        let mut limits = Vec::new();
        for _ in 0..60 {
            // 11 in flight at an upstream of 8: latency 11/8 of the baseline.
            let mut samples = vec![
                Sample {
                    latency_us: BASE * 11 / 8 + BASE / 10,
                    probe: false,
                };
                11
            ];
            now += WINDOW;
            limits.push(
                c.tick(Window {
                    now,
                    samples: &mut samples,
                    peak_inflight: 11,
                    shed: 50,
                })
                .limit,
            );
        }
        let end = *limits.last().unwrap();
        assert!(end <= 15, "the limit came down from 22: {limits:?}");
        assert!(end >= 11, "not below what the latency allows: {limits:?}");
    }

    #[test]
    fn re_measurements_are_jittered() {
        let mut now = 0;
        let mut starts = Vec::new();
        let mut c = Controller::new(params(), now, 1234, None);
        let v = run(&mut c, &mut now, 20_000, BASE, 20);
        for (i, w) in v.windows(2).enumerate() {
            if !w[0].probing && w[1].probing {
                starts.push(i as u64 * WINDOW);
            }
        }
        let gaps: Vec<u64> = starts.windows(2).map(|s| s[1] - s[0]).collect();
        assert!(gaps.len() >= 20, "{gaps:?}");
        let lo = PROBE_EVERY_US;
        let hi = PROBE_EVERY_US + (PROBE_EVERY_US as f64 * PROBE_JITTER) as u64 + 3 * PROBE_MAX_US;
        assert!(gaps.iter().all(|g| (lo..=hi).contains(g)), "{gaps:?}");
        let (min, max) = (gaps.iter().min().unwrap(), gaps.iter().max().unwrap());
        assert!(max - min > PROBE_EVERY_US / 50, "not lockstep: {gaps:?}");
        // Two owners seeded apart (two forkd instances in front of one upstream)
        // do not re-measure in step.
        let mut other = Controller::new(params(), 0, 99, Some((10, BASE)));
        let mut mine = Controller::new(params(), 0, 100, Some((10, BASE)));
        assert_ne!(other.next_probe_at(0), mine.next_probe_at(0));
    }

    #[test]
    fn a_controller_taking_over_starts_from_the_published_state() {
        let c = Controller::new(params(), 0, 1, Some((37, 12_000)));
        let v = c.verdict();
        assert_eq!(
            (v.limit, v.baseline_us, v.probing),
            (37, Some(12_000), false)
        );
        let c = Controller::new(params(), 0, 1, Some((5000, 12_000)));
        assert_eq!(c.verdict().limit, 1000, "clamped to max_limit");
    }

    #[test]
    fn quantiles_use_the_nearest_rank() {
        let mut s: Vec<Sample> = (1..=10)
            .map(|i| Sample {
                latency_us: i * 10,
                probe: false,
            })
            .collect();
        assert_eq!(quantile(&mut s, 0.9), Some(90));
        assert_eq!(quantile(&mut s, 0.5), Some(50));
        assert_eq!(quantile(&mut s, 1.0), Some(100));
        assert_eq!(quantile(&mut s[..1], 0.01), Some(10));
        assert_eq!(quantile(&mut [], 0.9), None);
    }
}

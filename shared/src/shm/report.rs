//! A consistent reading of the region, and its three renderings: JSON (`forkd stats
//! --json`, the `Status` handler), a table (`forkd stats`) and Prometheus text (the
//! `Metrics` handler). One reading, three formats, so they always agree.

use super::counters::{
    CounterDef, BYTES_IN, BYTES_OUT, CONNECTIONS_ACCEPTED, COUNTERS, REQUESTS, RESPONSES_1XX,
    RESPONSES_2XX, RESPONSES_3XX, RESPONSES_499, RESPONSES_4XX, RESPONSES_5XX, TUNNELS_CLOSED,
    TUNNELS_OPENED,
};
use super::layout::{Layout, WorkerState};
pub use super::upstream_values::UpstreamReport;
pub use super::values::CounterValues;
use serde::Serialize;
use std::fmt::Write as _;
use std::sync::atomic::Ordering::{Acquire, Relaxed};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Serialize)]
pub struct WorkerReport {
    /// Index of the region slot.
    #[serde(rename = "id")]
    pub index: usize,
    /// The worker's slot number (CPU, reuseport queue).
    pub worker: u32,
    pub pid: i32,
    #[serde(serialize_with = "state_name")]
    pub state: WorkerState,
    pub generation: u64,
    pub started_ms: u64,
    pub heartbeat_age_ms: u64,
    pub connections_active: u64,
    pub connections_reading: u64,
    pub connections_writing: u64,
    pub connections_idle: u64,
    /// Upgraded connections (WebSocket tunnels) open.
    pub tunnels_open: u64,
    pub open_fds: u64,
    pub rss_bytes: u64,
    pub counters: CounterValues,
}

#[derive(Debug, Clone, Serialize)]
pub struct ListenerReport {
    pub addr: String,
    pub queue_depth: u32,
    pub queue_max: u32,
}

/// Everything in the region at one moment.
#[derive(Debug, Clone)]
pub struct Report {
    pub layout_version: u32,
    pub master_pid: i32,
    pub master_alive: bool,
    pub start_time_ms: u64,
    pub config_generation: u64,
    /// The generation every worker of the master serves (see `MasterStats`).
    pub generation_in_force: u64,
    pub respawns: u64,
    pub last_respawn_reason: String,
    pub reloads_ok: u64,
    pub reloads_failed: u64,
    pub last_reload_error: String,
    pub upgrades_ok: u64,
    pub upgrades_failed: u64,
    pub last_upgrade_error: String,
    pub listen_overflows: u64,
    pub listeners: Vec<ListenerReport>,
    pub workers: Vec<WorkerReport>,
    pub retired: CounterValues,
    /// Retired plus every worker: never goes backwards.
    pub totals: CounterValues,
    /// Every upstream server configured (and any removed one still holding counts),
    /// totals over the workers.
    pub upstreams: Vec<UpstreamReport>,
    /// Who runs the upstream checks and name resolution (`health` lease).
    pub checks: ChecksReport,
    /// Every upstream group with an adaptive limit.
    pub overload: Vec<super::overload::OverloadReport>,
    /// The TLS certificates in force and their expiry.
    pub tls_certificates: Vec<super::tls_certs::CertReport>,
}

/// The active checks' lease.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ChecksReport {
    /// The pid of the worker running them; None: nobody (no checks or names
    /// configured, or between two owners).
    pub owner_pid: Option<i32>,
    /// How many times a worker took the lease.
    pub takeovers: u64,
}

/// The lease, if the region has the health area.
fn checks_report(layout: &Layout) -> ChecksReport {
    if (layout.header.region_size.load(Relaxed) as usize) < std::mem::size_of::<Layout>() {
        return ChecksReport::default();
    }
    let lease = &layout.health.lease;
    ChecksReport {
        owner_pid: lease.holder(),
        takeovers: lease.takeovers.load(Relaxed),
    }
}

/// How long a reader waits for a fold to end before it gives up on the reading. A fold
/// takes microseconds; a count that stays odd this long belongs to a master that was
/// stopped or killed mid-fold (the next fold, by any master, finishes it).
pub const PATIENCE: Duration = Duration::from_millis(200);

/// A reading that could not be made consistent within [`PATIENCE`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inconsistent {
    /// The fold count, odd (a fold under way) or changing under the reader.
    pub fold_seq: u64,
    /// The process holding the fold lock (0: none), and whether it still runs.
    pub holder: i32,
    pub holder_alive: bool,
}

impl std::fmt::Display for Inconsistent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the stats region is inconsistent (a fold of a worker's counters is under way: \
             fold_seq {}, ",
            self.fold_seq
        )?;
        match (self.holder, self.holder_alive) {
            (0, _) => write!(f, "no master holds the fold lock")?,
            (pid, true) => write!(f, "held by master {pid}")?,
            (pid, false) => write!(f, "held by process {pid}, which is gone")?,
        }
        write!(f, ") for {PATIENCE:?}")
    }
}

impl std::error::Error for Inconsistent {}

impl Inconsistent {
    /// `{"error": "...", "retry": true}` and a newline: what the `Status` route answers
    /// instead.
    pub fn to_json(&self) -> String {
        format!(
            "{}\n",
            serde_json::json!({ "error": self.to_string(), "retry": true })
        )
    }
}

/// Reads the region consistently: retried while a master is folding a worker, for at
/// most [`PATIENCE`] (the caller decides what to do then: a handler answers 503, the
/// CLI says so and tries again).
pub fn read(layout: &Layout) -> Result<Report, Inconsistent> {
    let started = Instant::now();
    let mut tries = 0u32;
    loop {
        let before = layout.header.fold_seq.load(Acquire);
        if before & 1 == 0 {
            let report = read_once(layout);
            std::sync::atomic::fence(Acquire);
            if layout.header.fold_seq.load(Relaxed) == before {
                return Ok(report);
            }
        }
        if started.elapsed() >= PATIENCE {
            let holder = layout.header.fold_lock.load(Relaxed) as i32;
            return Err(Inconsistent {
                fold_seq: before,
                holder,
                holder_alive: holder > 0 && super::process_alive(holder),
            });
        }
        tries += 1;
        if tries < 64 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

fn read_once(layout: &Layout) -> Report {
    let h = &layout.header;
    let now = super::monotonic_ms();
    let master_pid = h.master_pid.load(Relaxed);
    let workers: Vec<WorkerReport> = layout
        .slots
        .iter()
        .enumerate()
        .filter_map(|(index, s)| {
            let state = WorkerState::from_u32(s.state.load(Acquire));
            if state == WorkerState::Empty {
                return None;
            }
            Some(WorkerReport {
                index,
                worker: s.worker.load(Relaxed),
                pid: s.pid.load(Relaxed),
                state,
                generation: s.generation.load(Relaxed),
                started_ms: s.started_ms.load(Relaxed),
                heartbeat_age_ms: now.saturating_sub(s.heartbeat_ms.load(Relaxed)),
                connections_active: s.connections_active.load(Relaxed),
                connections_reading: s.connections_reading.load(Relaxed),
                connections_writing: s.connections_writing.load(Relaxed),
                connections_idle: s.connections_idle.load(Relaxed),
                tunnels_open: u64::from(s.tunnels_open.load(Relaxed)),
                open_fds: s.open_fds.load(Relaxed),
                rss_bytes: s.rss_bytes.load(Relaxed),
                counters: CounterValues::read(&s.counters),
            })
        })
        .collect();
    let retired = CounterValues::read(&layout.retired.counters);
    let mut totals = retired.clone();
    for w in &workers {
        totals.add(&w.counters);
    }
    let sys = &layout.system;
    let listeners = sys.listeners
        [..(sys.listener_count.load(Relaxed) as usize).min(sys.listeners.len())]
        .iter()
        .map(|l| ListenerReport {
            addr: l.addr.get(),
            queue_depth: l.queue_depth.load(Relaxed),
            queue_max: l.queue_max.load(Relaxed),
        })
        .collect();
    Report {
        layout_version: h.layout_version.load(Relaxed),
        master_pid,
        master_alive: super::process_alive(master_pid),
        start_time_ms: h.start_time_ms.load(Relaxed),
        config_generation: h.config_generation.load(Relaxed),
        generation_in_force: layout.master.generation_in_force.load(Relaxed),
        respawns: layout.master.respawns.load(Relaxed),
        last_respawn_reason: layout.master.last_respawn_reason.get(),
        reloads_ok: layout.master.reloads_ok.load(Relaxed),
        reloads_failed: layout.master.reloads_failed.load(Relaxed),
        last_reload_error: layout.master.last_reload_error.get(),
        upgrades_ok: layout.master.upgrades_ok.load(Relaxed),
        upgrades_failed: layout.master.upgrades_failed.load(Relaxed),
        last_upgrade_error: layout.master.last_upgrade_error.get(),
        listen_overflows: sys.listen_overflows.load(Relaxed),
        listeners,
        workers,
        retired,
        totals,
        upstreams: super::upstream_values::read(layout),
        checks: checks_report(layout),
        overload: if layout.complete() {
            super::overload::read(&layout.overload)
        } else {
            Vec::new()
        },
        tls_certificates: if layout.complete() {
            super::tls_certs::read(&layout.tls_certs)
        } else {
            Vec::new()
        },
    }
}

fn state_name<S: serde::Serializer>(state: &WorkerState, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(state.name())
}

/// The JSON document: `Report` regrouped, borrowing its parts.
#[derive(Serialize)]
struct Json<'a> {
    layout_version: u32,
    master: JsonMaster<'a>,
    system: JsonSystem<'a>,
    workers: &'a [WorkerReport],
    retired: &'a CounterValues,
    totals: &'a CounterValues,
    upstreams: &'a [UpstreamReport],
    checks: &'a ChecksReport,
    overload: &'a [super::overload::OverloadReport],
    tls_certificates: &'a [super::tls_certs::CertReport],
}

#[derive(Serialize)]
struct JsonMaster<'a> {
    pid: i32,
    alive: bool,
    start_time_ms: u64,
    config_generation: u64,
    generation_in_force: u64,
    respawns: u64,
    last_respawn_reason: &'a str,
    reloads_ok: u64,
    reloads_failed: u64,
    last_reload_error: &'a str,
    upgrades_ok: u64,
    upgrades_failed: u64,
    last_upgrade_error: &'a str,
}

#[derive(Serialize)]
struct JsonSystem<'a> {
    listen_overflows: u64,
    listeners: &'a [ListenerReport],
}

impl Report {
    /// Every counter, as one JSON object (and a newline).
    pub fn to_json(&self) -> String {
        let doc = Json {
            layout_version: self.layout_version,
            master: JsonMaster {
                pid: self.master_pid,
                alive: self.master_alive,
                start_time_ms: self.start_time_ms,
                config_generation: self.config_generation,
                generation_in_force: self.generation_in_force,
                respawns: self.respawns,
                last_respawn_reason: &self.last_respawn_reason,
                reloads_ok: self.reloads_ok,
                reloads_failed: self.reloads_failed,
                last_reload_error: &self.last_reload_error,
                upgrades_ok: self.upgrades_ok,
                upgrades_failed: self.upgrades_failed,
                last_upgrade_error: &self.last_upgrade_error,
            },
            system: JsonSystem {
                listen_overflows: self.listen_overflows,
                listeners: &self.listeners,
            },
            workers: &self.workers,
            retired: &self.retired,
            totals: &self.totals,
            upstreams: &self.upstreams,
            checks: &self.checks,
            overload: &self.overload,
            tls_certificates: &self.tls_certificates,
        };
        // Serialising plain structs, maps of string keys and numbers cannot fail.
        let mut out = serde_json::to_string(&doc).expect("stats serialise to JSON");
        out.push('\n');
        out
    }

    /// A compact table: one row per worker and a totals row. Rates come from the
    /// difference with `previous`, read `interval_s` seconds earlier.
    pub fn to_table(&self, previous: Option<&Report>, interval_s: f64) -> String {
        let mut o = String::new();
        let up_s = super::now_ms().saturating_sub(self.start_time_ms) / 1000;
        let _ = writeln!(
            o,
            "forkd master {} ({}), up {}, config generation {}, respawns {}, reloads {} ok / {} failed",
            self.master_pid,
            if self.master_alive { "running" } else { "not running: last state shown" },
            human_duration(up_s),
            self.config_generation,
            self.respawns,
            self.reloads_ok,
            self.reloads_failed
        );
        if !self.last_reload_error.is_empty() {
            let _ = writeln!(o, "last reload error: {}", self.last_reload_error);
        }
        let _ = write!(o, "listen overflows {}", self.listen_overflows);
        for l in &self.listeners {
            let _ = write!(o, "; {} queue {}/{}", l.addr, l.queue_depth, l.queue_max);
        }
        o.push('\n');
        let _ = writeln!(
            o,
            "{:>3} {:>6} {:>8} {:>9} {:>4} {:>9} {:>9} {:>7} {:>8} {:>8} {:>10} {:>6}",
            "id",
            "worker",
            "pid",
            "state",
            "gen",
            "heartbeat",
            "req/s",
            "active",
            "p50",
            "p99",
            "accepted",
            "share"
        );
        let total_accepted: u64 = self
            .workers
            .iter()
            .map(|w| w.counters[CONNECTIONS_ACCEPTED])
            .sum();
        let rate = |now: u64, before: Option<u64>| -> String {
            match before {
                Some(b) if interval_s > 0.0 => {
                    format!("{:.0}", now.saturating_sub(b) as f64 / interval_s)
                }
                _ => "-".into(),
            }
        };
        // Rows of exited workers whose counts the master has folded into the totals
        // say nothing more: leave them out (the JSON keeps them).
        let shown = self
            .workers
            .iter()
            .filter(|w| w.state != WorkerState::Exited || w.counters != CounterValues::default());
        for w in shown {
            let before = previous.and_then(|p| {
                p.workers
                    .iter()
                    .find(|pw| pw.index == w.index && pw.pid == w.pid)
                    .map(|pw| pw.counters[REQUESTS])
            });
            let share = if total_accepted > 0 {
                format!(
                    "{:.1}%",
                    100.0 * w.counters[CONNECTIONS_ACCEPTED] as f64 / total_accepted as f64
                )
            } else {
                "-".into()
            };
            let _ = writeln!(
                o,
                "{:>3} {:>6} {:>8} {:>9} {:>4} {:>9} {:>9} {:>7} {:>8} {:>8} {:>10} {:>6}",
                w.index,
                w.worker,
                w.pid,
                w.state.name(),
                w.generation,
                format!("{:.1}s", w.heartbeat_age_ms as f64 / 1000.0),
                rate(w.counters[REQUESTS], before),
                w.connections_active,
                human_us(w.counters.percentile(0.5)),
                human_us(w.counters.percentile(0.99)),
                w.counters[CONNECTIONS_ACCEPTED],
                share
            );
        }
        let active: u64 = self.workers.iter().map(|w| w.connections_active).sum();
        let _ = writeln!(
            o,
            "{:>3} {:>6} {:>8} {:>9} {:>4} {:>9} {:>9} {:>7} {:>8} {:>8} {:>10} {:>6}",
            "all",
            "",
            "",
            "",
            "",
            "",
            rate(self.totals[REQUESTS], previous.map(|p| p.totals[REQUESTS])),
            active,
            human_us(self.totals.percentile(0.5)),
            human_us(self.totals.percentile(0.99)),
            self.totals[CONNECTIONS_ACCEPTED],
            ""
        );
        let t = &self.totals;
        let _ = writeln!(
            o,
            "requests {}  1xx {} 2xx {} 3xx {} 4xx {} 5xx {} 499 {}  in {} B  out {} B",
            t[REQUESTS],
            t[RESPONSES_1XX],
            t[RESPONSES_2XX],
            t[RESPONSES_3XX],
            t[RESPONSES_4XX],
            t[RESPONSES_5XX],
            t[RESPONSES_499],
            t[BYTES_IN],
            t[BYTES_OUT]
        );
        let tunnels: u64 = self.workers.iter().map(|w| w.tunnels_open).sum();
        if tunnels > 0 || t[TUNNELS_OPENED] > 0 {
            let _ = writeln!(
                o,
                "tunnels open {tunnels}  opened {}  closed {}",
                t[TUNNELS_OPENED], t[TUNNELS_CLOSED]
            );
        }
        super::upstream_values::table(&mut o, &self.upstreams);
        if let Some(pid) = self.checks.owner_pid {
            let _ = writeln!(o, "upstream checks and name resolution: worker pid {pid}");
        }
        super::upstream_values::health_table(&mut o, &self.upstreams);
        super::overload::table(&mut o, &self.overload);
        super::tls_certs::table(&mut o, &self.tls_certificates);
        o
    }

    /// Prometheus text exposition format 0.0.4. Workers are labelled by region row
    /// (`worker="3"`); the master moves an exited worker's counters to
    /// `worker="retired"`, so a sum over `worker` is monotonic.
    pub fn to_prometheus(&self) -> String {
        let mut o = String::with_capacity(8192);
        // Every row that holds counts, exited ones included: an exited worker keeps its
        // counts in its row until the master folds them into `retired` (and zeroes the
        // row), so dropping it before that would make the sum go backwards.
        let live: Vec<(String, &CounterValues)> = self
            .workers
            .iter()
            .map(|w| (w.index.to_string(), &w.counters))
            .chain(std::iter::once(("retired".to_string(), &self.retired)))
            .collect();
        // One family per distinct name of the counter table, in table order; a family
        // of several counters (responses by class) tells them apart by their label.
        let mut families: Vec<&str> = Vec::new();
        for def in COUNTERS {
            if !families.contains(&def.prometheus) {
                families.push(def.prometheus);
            }
        }
        for family in families {
            let members: Vec<&CounterDef> =
                COUNTERS.iter().filter(|d| d.prometheus == family).collect();
            let _ = writeln!(
                o,
                "# HELP {family} {}\n# TYPE {family} counter",
                members[0].help
            );
            for (label, c) in &live {
                for def in &members {
                    let extra = def
                        .label
                        .map_or_else(String::new, |(k, v)| format!(",{k}=\"{v}\""));
                    let _ = writeln!(
                        o,
                        "{family}{{worker=\"{label}\"{extra}}} {}",
                        c[def.counter]
                    );
                }
            }
        }
        let _ = writeln!(
            o,
            "# HELP forkd_request_duration_seconds Time from a request's first byte to its response being queued.\n\
             # TYPE forkd_request_duration_seconds histogram"
        );
        for (label, c) in &live {
            // Bucket edges at powers of two microseconds coincide with histogram bucket
            // edges, so these cumulative counts are exact.
            let mut cumulative = 0u64;
            let mut next = 0usize;
            for k in 4..=25u32 {
                let edge_index = 16 + (k as usize - 4) * 16;
                while next < edge_index {
                    cumulative += c.latency.buckets[next];
                    next += 1;
                }
                let _ = writeln!(
                    o,
                    "forkd_request_duration_seconds_bucket{{worker=\"{label}\",le=\"{}\"}} {cumulative}",
                    seconds((1u64 << k) as f64)
                );
            }
            let _ = writeln!(
                o,
                "forkd_request_duration_seconds_bucket{{worker=\"{label}\",le=\"+Inf\"}} {}",
                c.latency.count
            );
            let _ = writeln!(
                o,
                "forkd_request_duration_seconds_sum{{worker=\"{label}\"}} {}",
                seconds(c.latency.sum_us as f64)
            );
            let _ = writeln!(
                o,
                "forkd_request_duration_seconds_count{{worker=\"{label}\"}} {}",
                c.latency.count
            );
        }
        type Gauge = fn(&WorkerReport) -> String;
        let gauges: [(&str, &str, Gauge); 5] = [
            (
                "forkd_connections_active",
                "Open client connections.",
                |w| w.connections_active.to_string(),
            ),
            (
                "forkd_tunnels_open",
                "Upgraded connections (WebSocket tunnels) open.",
                |w| w.tunnels_open.to_string(),
            ),
            (
                "forkd_open_fds",
                "Open file descriptors of the worker.",
                |w| w.open_fds.to_string(),
            ),
            (
                "forkd_resident_memory_bytes",
                "Resident memory of the worker.",
                |w| w.rss_bytes.to_string(),
            ),
            (
                "forkd_worker_heartbeat_age_seconds",
                "Time since the worker's last loop turn.",
                |w| seconds(w.heartbeat_age_ms as f64 * 1000.0),
            ),
        ];
        let running: Vec<&WorkerReport> = self
            .workers
            .iter()
            .filter(|w| w.state != WorkerState::Exited)
            .collect();
        for (name, help, get) in gauges {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} gauge");
            for w in &running {
                let _ = writeln!(o, "{name}{{worker=\"{}\"}} {}", w.index, get(w));
            }
        }
        let _ = writeln!(o, "# HELP forkd_connections Open client connections by state.\n# TYPE forkd_connections gauge");
        for w in &running {
            for (state, n) in [
                ("reading", w.connections_reading),
                ("writing", w.connections_writing),
                ("idle", w.connections_idle),
            ] {
                let _ = writeln!(
                    o,
                    "forkd_connections{{worker=\"{}\",state=\"{state}\"}} {n}",
                    w.index
                );
            }
        }
        let _ = writeln!(o, "# HELP forkd_worker_respawns_total Workers respawned after dying.\n# TYPE forkd_worker_respawns_total counter\nforkd_worker_respawns_total {}", self.respawns);
        let _ = writeln!(
            o,
            "# HELP forkd_reloads_total Configuration reloads by result.\n# TYPE forkd_reloads_total counter\n\
             forkd_reloads_total{{result=\"ok\"}} {}\nforkd_reloads_total{{result=\"failed\"}} {}",
            self.reloads_ok, self.reloads_failed
        );
        let _ = writeln!(o, "# HELP forkd_config_generation Configuration generation in force.\n# TYPE forkd_config_generation gauge\nforkd_config_generation {}", self.config_generation);
        let _ = writeln!(o, "# HELP forkd_listen_overflows_total Kernel ListenOverflows (all sockets of the host).\n# TYPE forkd_listen_overflows_total counter\nforkd_listen_overflows_total {}", self.listen_overflows);
        let _ = writeln!(o, "# HELP forkd_listen_queue_depth Connections waiting in the accept queue.\n# TYPE forkd_listen_queue_depth gauge");
        for l in &self.listeners {
            let _ = writeln!(
                o,
                "forkd_listen_queue_depth{{listener=\"{}\"}} {}",
                l.addr, l.queue_depth
            );
        }
        let _ = writeln!(o, "# HELP forkd_listen_queue_max Accept queue limit.\n# TYPE forkd_listen_queue_max gauge");
        for l in &self.listeners {
            let _ = writeln!(
                o,
                "forkd_listen_queue_max{{listener=\"{}\"}} {}",
                l.addr, l.queue_max
            );
        }
        super::upstream_values::prometheus(&mut o, &self.upstreams, seconds);
        super::overload::prometheus(&mut o, &self.overload, seconds);
        super::tls_certs::prometheus(&mut o, &self.tls_certificates);
        o
    }
}

/// Microseconds as seconds, without float noise for exact values.
fn seconds(us: f64) -> String {
    let s = us / 1e6;
    let text = format!("{s:.6}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    if text.is_empty() {
        "0".into()
    } else {
        text.to_string()
    }
}

fn human_us(v: Option<u64>) -> String {
    match v {
        None => "-".into(),
        Some(us) if us < 1000 => format!("{us}µs"),
        Some(us) if us < 1_000_000 => format!("{:.1}ms", us as f64 / 1000.0),
        Some(us) => format!("{:.2}s", us as f64 / 1e6),
    }
}

fn human_duration(s: u64) -> String {
    match s {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s => format!("{}h", s / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::layout::bucket_of;

    #[test]
    fn percentiles_are_within_five_percent() {
        let mut c = CounterValues::default();
        let values: Vec<u64> = (1..=10_000).map(|i| i * 37 % 50_000 + 100).collect();
        for &v in &values {
            c.latency.buckets[bucket_of(v)] += 1;
        }
        let mut sorted = values.clone();
        sorted.sort_unstable();
        for q in [0.5, 0.9, 0.99, 0.999] {
            let exact = sorted[((q * sorted.len() as f64).ceil() as usize).max(1) - 1] as f64;
            let got = c.percentile(q).unwrap() as f64;
            assert!(
                (got - exact).abs() / exact < 0.05,
                "q {q}: {got} vs {exact}"
            );
        }
    }

    #[test]
    fn the_table_leaves_out_folded_rows_of_exited_workers() {
        let row = |index, state, requests| WorkerReport {
            index,
            worker: 0,
            pid: 100 + index as i32,
            state,
            generation: 1,
            started_ms: 0,
            heartbeat_age_ms: 0,
            connections_active: 0,
            connections_reading: 0,
            connections_writing: 0,
            connections_idle: 0,
            tunnels_open: 0,
            open_fds: 0,
            rss_bytes: 0,
            counters: {
                let mut c = CounterValues::default();
                c[REQUESTS] = requests;
                c
            },
        };
        let report = Report {
            layout_version: 1,
            master_pid: 1,
            master_alive: true,
            start_time_ms: 0,
            config_generation: 1,
            generation_in_force: 1,
            respawns: 0,
            last_respawn_reason: String::new(),
            reloads_ok: 0,
            reloads_failed: 0,
            last_reload_error: String::new(),
            upgrades_ok: 0,
            upgrades_failed: 0,
            last_upgrade_error: String::new(),
            listen_overflows: 0,
            listeners: Vec::new(),
            workers: vec![
                row(0, WorkerState::Exited, 0),
                row(1, WorkerState::Exited, 5),
                row(2, WorkerState::Serving, 0),
            ],
            retired: CounterValues::default(),
            totals: CounterValues::default(),
            upstreams: Vec::new(),
            checks: ChecksReport::default(),
            overload: Vec::new(),
            tls_certificates: Vec::new(),
        };
        let table = report.to_table(None, 0.0);
        assert!(!table.contains("      100 "), "{table}");
        assert!(table.contains("      101 "), "{table}");
        assert!(table.contains("      102 "), "{table}");
    }

    #[test]
    fn seconds_formatting() {
        assert_eq!(seconds(16.0), "0.000016");
        assert_eq!(seconds(1_000_000.0), "1");
        assert_eq!(seconds(0.0), "0");
    }
}

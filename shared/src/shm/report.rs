//! A consistent reading of the region, and its three renderings: JSON (`forkd stats
//! --json`, the `Status` handler), a table (`forkd stats`) and Prometheus text (the
//! `Metrics` handler). One reading, three formats, so they always agree.

use super::layout::{bucket_bounds, Counters, Layout, WorkerState, BUCKETS};
use std::fmt::Write as _;
use std::sync::atomic::Ordering::{Acquire, Relaxed};

/// Counter values read from a [`Counters`] block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterValues {
    pub connections_accepted: u64,
    pub connections_handled: u64,
    pub requests: u64,
    pub responses: [u64; 5],
    pub responses_499: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub accept_empty_wakeups: u64,
    pub connection_limit_hits: u64,
    pub latency_buckets: Vec<u64>,
    pub latency_sum_us: u64,
    pub latency_count: u64,
}

impl Default for CounterValues {
    fn default() -> Self {
        CounterValues {
            connections_accepted: 0,
            connections_handled: 0,
            requests: 0,
            responses: [0; 5],
            responses_499: 0,
            bytes_in: 0,
            bytes_out: 0,
            accept_empty_wakeups: 0,
            connection_limit_hits: 0,
            latency_buckets: vec![0; BUCKETS],
            latency_sum_us: 0,
            latency_count: 0,
        }
    }
}

impl CounterValues {
    fn read(c: &Counters) -> CounterValues {
        CounterValues {
            connections_accepted: c.connections_accepted.load(Relaxed),
            connections_handled: c.connections_handled.load(Relaxed),
            requests: c.requests.load(Relaxed),
            responses: std::array::from_fn(|i| c.responses[i].load(Relaxed)),
            responses_499: c.responses_499.load(Relaxed),
            bytes_in: c.bytes_in.load(Relaxed),
            bytes_out: c.bytes_out.load(Relaxed),
            accept_empty_wakeups: c.accept_empty_wakeups.load(Relaxed),
            connection_limit_hits: c.connection_limit_hits.load(Relaxed),
            latency_buckets: c.latency.buckets.iter().map(|b| b.load(Relaxed)).collect(),
            latency_sum_us: c.latency.sum_us.load(Relaxed),
            latency_count: c.latency.count.load(Relaxed),
        }
    }

    fn add(&mut self, o: &CounterValues) {
        self.connections_accepted += o.connections_accepted;
        self.connections_handled += o.connections_handled;
        self.requests += o.requests;
        for i in 0..5 {
            self.responses[i] += o.responses[i];
        }
        self.responses_499 += o.responses_499;
        self.bytes_in += o.bytes_in;
        self.bytes_out += o.bytes_out;
        self.accept_empty_wakeups += o.accept_empty_wakeups;
        self.connection_limit_hits += o.connection_limit_hits;
        for (a, b) in self.latency_buckets.iter_mut().zip(&o.latency_buckets) {
            *a += b;
        }
        self.latency_sum_us += o.latency_sum_us;
        self.latency_count += o.latency_count;
    }

    /// The `q` quantile (0..=1) of request latency in µs: the midpoint of the bucket
    /// holding it (within 3.1% of the true value). None without requests.
    pub fn percentile(&self, q: f64) -> Option<u64> {
        let total: u64 = self.latency_buckets.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (i, &n) in self.latency_buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                let (lo, hi) = bucket_bounds(i);
                return Some(if hi - lo == 1 { lo } else { (lo + hi) / 2 });
            }
        }
        None
    }
}

#[derive(Debug, Clone)]
pub struct WorkerReport {
    /// Index of the region slot.
    pub index: usize,
    /// The worker's slot number (CPU, reuseport queue).
    pub worker: u32,
    pub pid: i32,
    pub state: WorkerState,
    pub generation: u64,
    pub started_ms: u64,
    pub heartbeat_age_ms: u64,
    pub connections_active: u64,
    pub connections_reading: u64,
    pub connections_writing: u64,
    pub connections_idle: u64,
    pub open_fds: u64,
    pub rss_bytes: u64,
    pub counters: CounterValues,
}

#[derive(Debug, Clone)]
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
    pub respawns: u64,
    pub last_respawn_reason: String,
    pub reloads_ok: u64,
    pub reloads_failed: u64,
    pub last_reload_error: String,
    pub listen_overflows: u64,
    pub listeners: Vec<ListenerReport>,
    pub workers: Vec<WorkerReport>,
    pub retired: CounterValues,
    /// Retired plus every worker: never goes backwards.
    pub totals: CounterValues,
}

/// Reads the region consistently: retried while the master is folding a worker.
pub fn read(layout: &Layout) -> Report {
    loop {
        let before = layout.header.fold_seq.load(Acquire);
        if before % 2 == 1 {
            std::thread::yield_now();
            continue;
        }
        let report = read_once(layout);
        std::sync::atomic::fence(Acquire);
        if layout.header.fold_seq.load(Relaxed) == before {
            return report;
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
        master_alive: master_pid > 0
            && nix::sys::signal::kill(nix::unistd::Pid::from_raw(master_pid), None).is_ok(),
        start_time_ms: h.start_time_ms.load(Relaxed),
        config_generation: h.config_generation.load(Relaxed),
        respawns: layout.master.respawns.load(Relaxed),
        last_respawn_reason: layout.master.last_respawn_reason.get(),
        reloads_ok: layout.master.reloads_ok.load(Relaxed),
        reloads_failed: layout.master.reloads_failed.load(Relaxed),
        last_reload_error: layout.master.last_reload_error.get(),
        listen_overflows: sys.listen_overflows.load(Relaxed),
        listeners,
        workers,
        retired,
        totals,
    }
}

fn json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn json_opt(v: Option<u64>) -> String {
    v.map_or_else(|| "null".into(), |v| v.to_string())
}

fn json_counters(out: &mut String, c: &CounterValues) {
    let _ = write!(
        out,
        "{{\"connections_accepted\":{},\"connections_handled\":{},\"requests\":{},\
         \"responses_1xx\":{},\"responses_2xx\":{},\"responses_3xx\":{},\"responses_4xx\":{},\
         \"responses_5xx\":{},\"responses_499\":{},\"bytes_in\":{},\"bytes_out\":{},\
         \"accept_empty_wakeups\":{},\"connection_limit_hits\":{},\
         \"latency\":{{\"count\":{},\"sum_us\":{},\"p50_us\":{},\"p90_us\":{},\"p99_us\":{},\"p999_us\":{},\"buckets\":[",
        c.connections_accepted,
        c.connections_handled,
        c.requests,
        c.responses[0],
        c.responses[1],
        c.responses[2],
        c.responses[3],
        c.responses[4],
        c.responses_499,
        c.bytes_in,
        c.bytes_out,
        c.accept_empty_wakeups,
        c.connection_limit_hits,
        c.latency_count,
        c.latency_sum_us,
        json_opt(c.percentile(0.5)),
        json_opt(c.percentile(0.9)),
        json_opt(c.percentile(0.99)),
        json_opt(c.percentile(0.999)),
    );
    // Only non-empty buckets, as [low_us, high_us, count].
    let mut first = true;
    for (i, &n) in c.latency_buckets.iter().enumerate() {
        if n == 0 {
            continue;
        }
        let (lo, hi) = bucket_bounds(i);
        if !first {
            out.push(',');
        }
        first = false;
        let _ = write!(out, "[{lo},{hi},{n}]");
    }
    out.push_str("]}}");
}

impl Report {
    /// Every counter, as one JSON object.
    pub fn to_json(&self) -> String {
        let mut o = String::with_capacity(4096);
        let _ = write!(
            o,
            "{{\"layout_version\":{},\"master\":{{\"pid\":{},\"alive\":{},\"start_time_ms\":{},\
             \"config_generation\":{},\"respawns\":{},\"last_respawn_reason\":",
            self.layout_version,
            self.master_pid,
            self.master_alive,
            self.start_time_ms,
            self.config_generation,
            self.respawns
        );
        json_string(&mut o, &self.last_respawn_reason);
        let _ = write!(
            o,
            ",\"reloads_ok\":{},\"reloads_failed\":{},\"last_reload_error\":",
            self.reloads_ok, self.reloads_failed
        );
        json_string(&mut o, &self.last_reload_error);
        let _ = write!(
            o,
            "}},\"system\":{{\"listen_overflows\":{},\"listeners\":[",
            self.listen_overflows
        );
        for (i, l) in self.listeners.iter().enumerate() {
            if i > 0 {
                o.push(',');
            }
            o.push_str("{\"addr\":");
            json_string(&mut o, &l.addr);
            let _ = write!(
                o,
                ",\"queue_depth\":{},\"queue_max\":{}}}",
                l.queue_depth, l.queue_max
            );
        }
        o.push_str("]},\"workers\":[");
        for (i, w) in self.workers.iter().enumerate() {
            if i > 0 {
                o.push(',');
            }
            let _ = write!(
                o,
                "{{\"id\":{},\"worker\":{},\"pid\":{},\"state\":\"{}\",\"generation\":{},\"started_ms\":{},\
                 \"heartbeat_age_ms\":{},\"connections_active\":{},\"connections_reading\":{},\
                 \"connections_writing\":{},\"connections_idle\":{},\"open_fds\":{},\"rss_bytes\":{},\"counters\":",
                w.index,
                w.worker,
                w.pid,
                w.state.name(),
                w.generation,
                w.started_ms,
                w.heartbeat_age_ms,
                w.connections_active,
                w.connections_reading,
                w.connections_writing,
                w.connections_idle,
                w.open_fds,
                w.rss_bytes
            );
            json_counters(&mut o, &w.counters);
            o.push('}');
        }
        o.push_str("],\"retired\":");
        json_counters(&mut o, &self.retired);
        o.push_str(",\"totals\":");
        json_counters(&mut o, &self.totals);
        o.push_str("}\n");
        o
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
            .map(|w| w.counters.connections_accepted)
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
                    .map(|pw| pw.counters.requests)
            });
            let share = if total_accepted > 0 {
                format!(
                    "{:.1}%",
                    100.0 * w.counters.connections_accepted as f64 / total_accepted as f64
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
                rate(w.counters.requests, before),
                w.connections_active,
                human_us(w.counters.percentile(0.5)),
                human_us(w.counters.percentile(0.99)),
                w.counters.connections_accepted,
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
            rate(self.totals.requests, previous.map(|p| p.totals.requests)),
            active,
            human_us(self.totals.percentile(0.5)),
            human_us(self.totals.percentile(0.99)),
            self.totals.connections_accepted,
            ""
        );
        let t = &self.totals;
        let _ = writeln!(
            o,
            "requests {}  1xx {} 2xx {} 3xx {} 4xx {} 5xx {} 499 {}  in {} B  out {} B",
            t.requests,
            t.responses[0],
            t.responses[1],
            t.responses[2],
            t.responses[3],
            t.responses[4],
            t.responses_499,
            t.bytes_in,
            t.bytes_out
        );
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
        type Get = fn(&CounterValues) -> u64;
        let counters: [(&str, &str, Get); 10] = [
            (
                "forkd_connections_accepted_total",
                "Connections accepted.",
                |c| c.connections_accepted,
            ),
            (
                "forkd_connections_handled_total",
                "Connections closed after being served.",
                |c| c.connections_handled,
            ),
            ("forkd_requests_total", "Requests answered.", |c| c.requests),
            (
                "forkd_client_closed_requests_total",
                "Requests whose client went away before the response (499).",
                |c| c.responses_499,
            ),
            (
                "forkd_received_bytes_total",
                "Bytes read from clients.",
                |c| c.bytes_in,
            ),
            ("forkd_sent_bytes_total", "Bytes written to clients.", |c| {
                c.bytes_out
            }),
            (
                "forkd_accept_empty_wakeups_total",
                "Accept wake-ups that found no connection.",
                |c| c.accept_empty_wakeups,
            ),
            (
                "forkd_connection_limit_hits_total",
                "Times a worker reached worker_connections.",
                |c| c.connection_limit_hits,
            ),
            ("forkd_request_duration_seconds_sum", "", |c| {
                c.latency_sum_us
            }),
            ("forkd_request_duration_seconds_count", "", |c| {
                c.latency_count
            }),
        ];
        for (name, help, get) in &counters[..8] {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter");
            for (label, c) in &live {
                let _ = writeln!(o, "{name}{{worker=\"{label}\"}} {}", get(c));
            }
        }
        let _ = writeln!(o, "# HELP forkd_responses_total Responses by status class.\n# TYPE forkd_responses_total counter");
        for (label, c) in &live {
            for (i, n) in c.responses.iter().enumerate() {
                let _ = writeln!(
                    o,
                    "forkd_responses_total{{worker=\"{label}\",class=\"{}xx\"}} {n}",
                    i + 1
                );
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
                    cumulative += c.latency_buckets[next];
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
                c.latency_count
            );
            let _ = writeln!(
                o,
                "forkd_request_duration_seconds_sum{{worker=\"{label}\"}} {}",
                seconds(c.latency_sum_us as f64)
            );
            let _ = writeln!(
                o,
                "forkd_request_duration_seconds_count{{worker=\"{label}\"}} {}",
                c.latency_count
            );
        }
        type Gauge = fn(&WorkerReport) -> String;
        let gauges: [(&str, &str, Gauge); 4] = [
            (
                "forkd_connections_active",
                "Open client connections.",
                |w| w.connections_active.to_string(),
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
            c.latency_buckets[bucket_of(v)] += 1;
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
            open_fds: 0,
            rss_bytes: 0,
            counters: CounterValues {
                requests,
                ..CounterValues::default()
            },
        };
        let report = Report {
            layout_version: 1,
            master_pid: 1,
            master_alive: true,
            start_time_ms: 0,
            config_generation: 1,
            respawns: 0,
            last_respawn_reason: String::new(),
            reloads_ok: 0,
            reloads_failed: 0,
            last_reload_error: String::new(),
            listen_overflows: 0,
            listeners: Vec::new(),
            workers: vec![
                row(0, WorkerState::Exited, 0),
                row(1, WorkerState::Exited, 5),
                row(2, WorkerState::Serving, 0),
            ],
            retired: CounterValues::default(),
            totals: CounterValues::default(),
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

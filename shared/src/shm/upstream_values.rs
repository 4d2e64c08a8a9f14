//! Upstream servers' counts read out of the upstream area (retired totals plus every
//! worker row, per cell), and their three renderings, called from `report`: JSON
//! (serialised from the `upstream_counters` table), the `forkd stats` table section,
//! and Prometheus families (labels `upstream`, `server`).

use super::counters::{Counter, CounterDef};
use super::layout::Layout;
use super::upstream::{time_bucket_high, LabelState, UpstreamCell, TIME_BUCKETS};
use super::upstream_counters::{self as uc, UPSTREAM_COUNTERS, UPSTREAM_COUNTER_CELLS};
use super::upstream_state::{read_health, ActiveVerdict, ServerHealth};
use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;
use std::fmt::Write as _;
use std::sync::atomic::Ordering::{Acquire, Relaxed};

/// One upstream server's counts (a cell's, summed over the rows), with its gauges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamValues {
    pub cells: [u64; UPSTREAM_COUNTER_CELLS],
    pub head_time: [u64; TIME_BUCKETS],
    pub head_time_sum_us: u64,
    pub head_time_count: u64,
    /// Gauges, summed over the workers: open connections, and idle pooled ones.
    pub open: u64,
    pub idle: u64,
}

impl Default for UpstreamValues {
    fn default() -> Self {
        UpstreamValues {
            cells: [0; UPSTREAM_COUNTER_CELLS],
            head_time: [0; TIME_BUCKETS],
            head_time_sum_us: 0,
            head_time_count: 0,
            open: 0,
            idle: 0,
        }
    }
}

impl std::ops::Index<Counter> for UpstreamValues {
    type Output = u64;
    fn index(&self, c: Counter) -> &u64 {
        &self.cells[c.cell()]
    }
}

impl UpstreamValues {
    /// Adds one row's cell (relaxed loads: the caller makes the reading consistent).
    pub fn add_cell(&mut self, c: &UpstreamCell) {
        for (a, b) in self.cells.iter_mut().zip(&c.cells) {
            *a = a.wrapping_add(b.load(Relaxed));
        }
        for (a, b) in self.head_time.iter_mut().zip(&c.head_time.buckets) {
            *a = a.wrapping_add(b.load(Relaxed));
        }
        self.head_time_sum_us = self
            .head_time_sum_us
            .wrapping_add(c.head_time.sum_us.load(Relaxed));
        self.head_time_count = self
            .head_time_count
            .wrapping_add(c.head_time.count.load(Relaxed));
        self.open = self.open.wrapping_add(c.open.load(Relaxed));
        self.idle = self.idle.wrapping_add(c.idle.load(Relaxed));
    }

    fn has_counts(&self) -> bool {
        self.cells.iter().any(|&v| v != 0) || self.head_time_count != 0
    }

    /// The `q` quantile of the time to the response head, in µs: the upper edge of
    /// the bucket holding it (a power of two: within a factor of two). None without
    /// responses; `u64::MAX` in the last, open bucket.
    pub fn head_time_quantile(&self, q: f64) -> Option<u64> {
        let total: u64 = self.head_time.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (i, &n) in self.head_time.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Some(time_bucket_high(i).unwrap_or(u64::MAX));
            }
        }
        None
    }
}

/// One upstream server in a reading.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UpstreamReport {
    pub upstream: String,
    pub server: String,
    /// The region cell: stable across reloads for as long as the server is counted.
    pub cell: usize,
    /// In the configuration published last (false: a server that has left, shown
    /// while it holds counts).
    pub configured: bool,
    #[serde(flatten)]
    pub values: UpstreamValues,
    /// Active checks and name resolution (`health`), once the worker running them
    /// has written results for this server.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health: Option<super::health::HealthReport>,
    /// State, weight now, in flight, failures (None: a region without the state area).
    #[serde(flatten)]
    pub state: Option<ServerHealth>,
}

/// Every labelled cell that is configured or holds counts, in cell order.
/// Nothing while the region is an older build's, shorter than this layout
/// (`header.region_size`; see `mapping::RegionReader::open`).
pub fn read(layout: &Layout) -> Vec<UpstreamReport> {
    let size = layout.header.region_size.load(Acquire) as usize;
    if size < super::layout::UPSTREAM_AREA_END {
        return Vec::new();
    }
    // The state area only once the region covers it (a reader of an older build's
    // region during an upgrade).
    let shared = (size >= std::mem::size_of::<Layout>()).then_some(&layout.upstream_state);
    let now_ms = super::monotonic_ms();
    let area = &layout.upstreams;
    let mut out = Vec::new();
    for (cell, label) in area.header.labels.iter().enumerate() {
        let state = LabelState::from_u32(label.state.load(Acquire));
        if state == LabelState::Free {
            continue;
        }
        let mut values = UpstreamValues::default();
        values.add_cell(&area.retired[cell]);
        for row in &area.rows {
            values.add_cell(&row[cell]);
        }
        let configured = state == LabelState::Configured;
        if !configured && !values.has_counts() {
            continue;
        }
        let (upstream, server) = (label.upstream.get(), label.server.get());
        // The health area, like the shared state, is absent from an older build's region.
        let health = (configured && shared.is_some())
            .then(|| super::health::read(&layout.health, cell, &upstream, &server))
            .flatten();
        out.push(UpstreamReport {
            upstream,
            server,
            cell,
            configured,
            values,
            state: shared.map(|a| {
                let active = health
                    .as_ref()
                    .map_or(ActiveVerdict::NotChecked, |h| h.active());
                read_health(a, cell, now_ms, active)
            }),
            health,
        });
    }
    out
}

/// `{"requests": n, ..., "connections_open": n, "connections_idle": n,
/// "response_time": {...}}`: every counter of the table by name.
impl Serialize for UpstreamValues {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(UPSTREAM_COUNTERS.len() + 3))?;
        for def in UPSTREAM_COUNTERS {
            map.serialize_entry(def.name, &self[def.counter])?;
        }
        map.serialize_entry("connections_open", &self.open)?;
        map.serialize_entry("connections_idle", &self.idle)?;
        map.serialize_entry(
            "response_time",
            &TimeJson {
                count: self.head_time_count,
                sum_us: self.head_time_sum_us,
                p50_us_at_most: self.head_time_quantile(0.5),
                p99_us_at_most: self.head_time_quantile(0.99),
                buckets: self
                    .head_time
                    .iter()
                    .enumerate()
                    .filter(|(_, &n)| n > 0)
                    .map(|(i, &n)| (time_bucket_high(i), n))
                    .collect(),
            },
        )?;
        map.end()
    }
}

#[derive(Serialize)]
struct TimeJson {
    count: u64,
    sum_us: u64,
    p50_us_at_most: Option<u64>,
    p99_us_at_most: Option<u64>,
    /// Non-empty buckets as `[high_us, count]` (high null: the last, open bucket).
    buckets: Vec<(Option<u64>, u64)>,
}

/// The upstream section of the `forkd stats` table (nothing without upstreams).
pub fn table(o: &mut String, upstreams: &[UpstreamReport]) {
    if upstreams.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "{:<12} {:<24} {:>9} {:>7} {:>7} {:>7} {:>8} {:>7} {:>7} {:>8} {:>8} {:>5} {:>5} {:>8} {:<7} {:>6} {:>6} {:>9} {:>9}  last_down",
        "upstream",
        "server",
        "requests",
        "2xx",
        "4xx",
        "5xx",
        "conn_err",
        "timeout",
        "retries",
        "new",
        "reused",
        "open",
        "idle",
        "p99<=",
        "state",
        "weight",
        "now",
        "in_flight",
        "fails_row"
    );
    for u in upstreams {
        let v = &u.values;
        let server = if u.configured {
            u.server.clone()
        } else {
            format!("{} (removed)", u.server)
        };
        let h = u.state.as_ref();
        let dash = || "-".to_string();
        let _ = writeln!(
            o,
            "{:<12} {:<24} {:>9} {:>7} {:>7} {:>7} {:>8} {:>7} {:>7} {:>8} {:>8} {:>5} {:>5} {:>8} {:<7} {:>6} {:>6} {:>9} {:>9}  {}",
            u.upstream,
            server,
            v[uc::REQUESTS],
            v[uc::RESPONSES_2XX],
            v[uc::RESPONSES_4XX],
            v[uc::RESPONSES_5XX],
            v[uc::CONNECT_ERRORS],
            v[uc::TIMEOUTS],
            v[uc::RETRIES],
            v[uc::CONNECTIONS_NEW],
            v[uc::CONNECTIONS_REUSED],
            v.open,
            v.idle,
            match v.head_time_quantile(0.99) {
                None => "-".to_string(),
                Some(u64::MAX) => "inf".to_string(),
                Some(us) if us < 1000 => format!("{us}µs"),
                Some(us) if us < 1_000_000 => format!("{}ms", us / 1000),
                Some(us) => format!("{}s", us / 1_000_000),
            },
            h.map_or("-", |h| h.state),
            h.map_or_else(dash, |h| h.weight.to_string()),
            h.map_or_else(dash, |h| h.weight_now.to_string()),
            h.map_or_else(dash, |h| h.in_flight.to_string()),
            h.map_or_else(dash, |h| h.consecutive_failures.to_string()),
            // Why it is down now, else why it last was.
            h.map_or("", |h| if h.down_reason.is_empty() {
                h.last_down_reason
            } else {
                h.down_reason
            })
        );
    }
}

/// The checks section of the `forkd stats` table (servers with health results only).
pub fn health_table(o: &mut String, upstreams: &[UpstreamReport]) {
    let with: Vec<(&UpstreamReport, &super::health::HealthReport)> = upstreams
        .iter()
        .filter_map(|u| u.health.as_ref().map(|h| (u, h)))
        .collect();
    if with.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "{:<12} {:<24} {:<8} {:>7} {:>5} {:>5} {:<12} {:>8} {:>9} addresses",
        "upstream", "server", "verdict", "checks", "rise", "fall", "last", "ago", "dns_fail"
    );
    let now = super::now_ms();
    for (u, h) in with {
        let last = match (h.last_error, h.last_status) {
            (Some("status"), Some(s)) | (None, Some(s)) => s.to_string(),
            (Some(e), _) => e.to_string(),
            (None, None) => "-".to_string(),
        };
        let ago = h.last_check_ms.map_or_else(
            || "-".to_string(),
            |at| format!("{:.1}s", now.saturating_sub(at) as f64 / 1000.0),
        );
        let dns = if h.resolve_failing {
            format!("{} (now)", h.resolve_failures)
        } else {
            h.resolve_failures.to_string()
        };
        let _ = writeln!(
            o,
            "{:<12} {:<24} {:<8} {:>7} {:>5} {:>5} {:<12} {:>8} {:>9} {}",
            u.upstream,
            u.server,
            h.verdict,
            h.checks,
            h.passes_in_a_row,
            h.fails_in_a_row,
            last,
            ago,
            dns,
            h.addresses.join(",")
        );
    }
}

/// The checks' families: verdict (one sample per state, 1 for the current one),
/// checks run, passes and failures in a row, the last check's status and time,
/// addresses in use and resolutions, for servers with health results.
fn health_prometheus(o: &mut String, upstreams: &[UpstreamReport], labels: &[String]) {
    use super::health::HealthReport;
    let with: Vec<(&HealthReport, &String)> = upstreams
        .iter()
        .zip(labels)
        .filter_map(|(u, l)| u.health.as_ref().map(|h| (h, l)))
        .collect();
    if with.is_empty() {
        return;
    }
    let name = "forkd_upstream_health";
    let _ = writeln!(
        o,
        "# HELP {name} The active checks' verdict on the upstream server (1 for the current one).\n# TYPE {name} gauge"
    );
    for (h, l) in &with {
        for v in ["unknown", "up", "down"] {
            let _ = writeln!(
                o,
                "{name}{{{l},verdict=\"{v}\"}} {}",
                u8::from(h.verdict == v)
            );
        }
    }
    type Get = fn(&HealthReport) -> u64;
    let families: [(&str, &str, &str, Get); 8] = [
        (
            "forkd_upstream_checks_total",
            "counter",
            "Active checks run on the upstream server.",
            |h| h.checks,
        ),
        (
            "forkd_upstream_check_passes_in_a_row",
            "gauge",
            "Consecutive passed checks.",
            |h| u64::from(h.passes_in_a_row),
        ),
        (
            "forkd_upstream_check_fails_in_a_row",
            "gauge",
            "Consecutive failed checks.",
            |h| u64::from(h.fails_in_a_row),
        ),
        (
            "forkd_upstream_last_check_status",
            "gauge",
            "Status of the last check's response (0: none arrived).",
            |h| u64::from(h.last_status.unwrap_or(0)),
        ),
        (
            "forkd_upstream_last_check_timestamp_seconds",
            "gauge",
            "When the last check ran (Unix time; 0: never).",
            |h| h.last_check_ms.unwrap_or(0) / 1000,
        ),
        (
            "forkd_upstream_addresses",
            "gauge",
            "Addresses the upstream server's name resolves to now.",
            |h| h.addresses.len() as u64,
        ),
        (
            "forkd_upstream_resolutions_total",
            "counter",
            "Successful re-resolutions of the upstream server's name.",
            |h| h.resolutions,
        ),
        (
            "forkd_upstream_resolve_failures_total",
            "counter",
            "Failed re-resolutions of the upstream server's name (the last good addresses stay).",
            |h| h.resolve_failures,
        ),
    ];
    for (name, kind, help, get) in families {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (h, l) in &with {
            let _ = writeln!(o, "{name}{{{l}}} {}", get(h));
        }
    }
}

/// The balancing and passive-health families: `forkd_upstream_up` (1 usable, 0 marked down) with a
/// `state` label, weights, in flight, consecutive failures, times marked down, and
/// `forkd_upstream_last_down_reason` (1, labelled with the reason) for servers that
/// were ever marked down.
fn state_prometheus(o: &mut String, upstreams: &[UpstreamReport], labels: &[String]) {
    let with: Vec<(&ServerHealth, &String)> = upstreams
        .iter()
        .zip(labels)
        .filter_map(|(u, l)| u.state.as_ref().map(|h| (h, l)))
        .collect();
    if with.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "# HELP forkd_upstream_up Whether the upstream server may take requests (0: down, by its failures or by its active checks).\n# TYPE forkd_upstream_up gauge"
    );
    for (h, l) in &with {
        let up = u8::from(h.state != "down");
        let _ = writeln!(o, "forkd_upstream_up{{{l},state=\"{}\"}} {up}", h.state);
    }
    type Gauge = fn(&ServerHealth) -> u64;
    let gauges: [(&str, &str, &str, Gauge); 5] = [
        (
            "forkd_upstream_weight",
            "gauge",
            "The upstream server's configured weight.",
            |h| u64::from(h.weight),
        ),
        (
            "forkd_upstream_weight_now",
            "gauge",
            "The weight balanced with now (slow_start ramps it).",
            |h| u64::from(h.weight_now),
        ),
        (
            "forkd_upstream_in_flight",
            "gauge",
            "Requests under way to the upstream server, all workers.",
            |h| h.in_flight,
        ),
        (
            "forkd_upstream_consecutive_failures",
            "gauge",
            "Failed attempts since the upstream server's last response.",
            |h| u64::from(h.consecutive_failures),
        ),
        (
            "forkd_upstream_marked_down_total",
            "counter",
            "Times the upstream server was marked down.",
            |h| h.marked_down,
        ),
    ];
    for (name, kind, help, get) in gauges {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (h, l) in &with {
            let _ = writeln!(o, "{name}{{{l}}} {}", get(h));
        }
    }
    let name = "forkd_upstream_last_down_reason";
    let _ = writeln!(
        o,
        "# HELP {name} Why the upstream server was last marked down (the reason label).\n# TYPE {name} gauge"
    );
    for (h, l) in with.iter().filter(|(h, _)| !h.last_down_reason.is_empty()) {
        let _ = writeln!(o, "{name}{{{l},reason=\"{}\"}} 1", h.last_down_reason);
    }
}

/// A Prometheus label value, escaped (`\`, `"` and newlines).
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The upstream families: one per distinct family of the table (in table order), the
/// two gauges and the response-time histogram, every sample labelled `upstream` and
/// `server`. Totals over the workers (retired included), so every counter is
/// monotonic.
pub fn prometheus(o: &mut String, upstreams: &[UpstreamReport], seconds: fn(f64) -> String) {
    let labels: Vec<String> = upstreams
        .iter()
        .map(|u| {
            format!(
                "upstream=\"{}\",server=\"{}\"",
                label(&u.upstream),
                label(&u.server)
            )
        })
        .collect();
    let mut families: Vec<&str> = Vec::new();
    for def in UPSTREAM_COUNTERS {
        if !families.contains(&def.prometheus) {
            families.push(def.prometheus);
        }
    }
    for family in families {
        let members: Vec<&CounterDef> = UPSTREAM_COUNTERS
            .iter()
            .filter(|d| d.prometheus == family)
            .collect();
        let _ = writeln!(
            o,
            "# HELP {family} {}\n# TYPE {family} counter",
            members[0].help
        );
        for (u, l) in upstreams.iter().zip(&labels) {
            for def in &members {
                let extra = def
                    .label
                    .map_or_else(String::new, |(k, v)| format!(",{k}=\"{v}\""));
                let _ = writeln!(o, "{family}{{{l}{extra}}} {}", u.values[def.counter]);
            }
        }
    }
    type Gauge = fn(&UpstreamValues) -> u64;
    let gauges: [(&str, &str, Gauge); 2] = [
        (
            "forkd_upstream_connections_open",
            "Open connections to the upstream server, all workers.",
            |v| v.open,
        ),
        (
            "forkd_upstream_connections_idle",
            "Idle pooled connections to the upstream server, all workers.",
            |v| v.idle,
        ),
    ];
    for (name, help, get) in gauges {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (u, l) in upstreams.iter().zip(&labels) {
            let _ = writeln!(o, "{name}{{{l}}} {}", get(&u.values));
        }
    }
    state_prometheus(o, upstreams, &labels);
    let name = "forkd_upstream_response_time_seconds";
    let _ = writeln!(
        o,
        "# HELP {name} Time from sending a request to the upstream server to its response head.\n# TYPE {name} histogram"
    );
    for (u, l) in upstreams.iter().zip(&labels) {
        let v = &u.values;
        let mut cumulative = 0u64;
        for i in 0..TIME_BUCKETS - 1 {
            cumulative += v.head_time[i];
            let high = time_bucket_high(i).expect("not the last bucket");
            let _ = writeln!(
                o,
                "{name}_bucket{{{l},le=\"{}\"}} {cumulative}",
                seconds(high as f64)
            );
        }
        let _ = writeln!(o, "{name}_bucket{{{l},le=\"+Inf\"}} {}", v.head_time_count);
        let _ = writeln!(
            o,
            "{name}_sum{{{l}}} {}",
            seconds(v.head_time_sum_us as f64)
        );
        let _ = writeln!(o, "{name}_count{{{l}}} {}", v.head_time_count);
    }
    health_prometheus(o, upstreams, &labels);
}

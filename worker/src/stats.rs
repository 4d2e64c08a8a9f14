//! This worker's slot in the shared-memory stats region: what it records, and when.
//!
//! Counters are bumped where the events happen (plain loads and stores: this worker is
//! the slot's only writer, so no locked instruction is needed). Gauges that would cost
//! work per event — connections by state, open fds, RSS — are sampled once a second.
//!
//! Upstream servers: the master gives each configured `(upstream, server)` a cell of
//! the region's upstream area; [`Stats::map_upstreams`] looks them up when the worker
//! adopts a configuration, and the proxy counts through [`Stats::upstream_cell`] and
//! the `upstream_*` methods, on this worker's own row (plain loads and stores).

use forkd_shared::config::Config;
use forkd_shared::shm::counters::{self, Counter};
use forkd_shared::shm::layout::{WorkerSlot, WorkerState};
use forkd_shared::shm::upstream::{self, UpstreamCell};
use forkd_shared::shm::upstream_counters;
use forkd_shared::shm::upstream_state::UpstreamStateArea;
use forkd_shared::shm::Region;
use std::rc::Rc;
use std::sync::atomic::Ordering::{Relaxed, Release};
use std::time::Instant;

pub struct Stats {
    region: Rc<Region>,
    index: usize,
    /// A monotonic reading in both forms, to turn `Instant`s into CLOCK_MONOTONIC ms.
    origin: (Instant, u64),
    /// `cells[upstream][server]`: the region cell of each server of the configuration
    /// in force (None: not counted, see `shm::upstream` on capacity).
    cells: Vec<Vec<Option<CellId>>>,
}

/// An upstream server's cell in the region's upstream area, from
/// [`Stats::upstream_cell`]: what the proxy keeps beside a server to count its events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CellId(u16);

impl CellId {
    /// The cell's index in the region's upstream (and health) area.
    pub fn index(self) -> usize {
        usize::from(self.0)
    }
}

/// One request under way to an upstream server, counted in the region's in-flight
/// word of this worker's slot for as long as it lives (dropping it ends it, however
/// the exchange ended: done, failed, or its client gone).
pub struct InFlight {
    region: Rc<Region>,
    cell: u16,
    slot: u16,
}

impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "InFlight(cell {}, slot {})", self.cell, self.slot)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.region
            .layout()
            .upstream_state
            .end(usize::from(self.cell), usize::from(self.slot));
    }
}

impl Stats {
    pub fn new(region: Rc<Region>, index: usize) -> Stats {
        region.layout().upstream_state.note_slot(index);
        Stats {
            region,
            index,
            origin: (Instant::now(), forkd_shared::shm::monotonic_ms()),
            cells: Vec::new(),
        }
    }

    /// Maps `config`'s upstream servers to the cells the master gave them when it
    /// published the configuration (at start and before every reload's snapshot), so
    /// call it when adopting a configuration.
    pub fn map_upstreams(&mut self, config: &Config) {
        let area = &self.region.layout().upstreams;
        self.cells = upstream::config_labels(config)
            .iter()
            .map(|(name, servers)| {
                servers
                    .iter()
                    .map(|server| upstream::lookup(area, name, server).map(|c| CellId(c as u16)))
                    .collect()
            })
            .collect();
    }

    /// The cell of server `server` of `Config::upstreams[upstream]`; None if it is not
    /// counted (beyond the region's capacity) or the indices are not the configuration's.
    #[inline]
    pub fn upstream_cell(&self, upstream: usize, server: usize) -> Option<CellId> {
        *self.cells.get(upstream)?.get(server)?
    }

    /// The region's shared upstream state (in flight, passive health).
    #[inline]
    pub fn upstream_state(&self) -> &UpstreamStateArea {
        &self.region.layout().upstream_state
    }

    /// A request to `cell` starts; it is in flight until the guard is dropped.
    pub fn begin_in_flight(&self, cell: CellId) -> InFlight {
        self.upstream_state().begin(cell.index(), self.index);
        InFlight {
            region: Rc::clone(&self.region),
            cell: cell.0,
            slot: self.index as u16,
        }
    }

    /// `at` as CLOCK_MONOTONIC milliseconds, the clock of the region's times.
    #[inline]
    pub fn monotonic_ms(&self, at: Instant) -> u64 {
        self.origin.1 + at.saturating_duration_since(self.origin.0).as_millis() as u64
    }

    #[inline]
    fn cell(&self, cell: CellId) -> &UpstreamCell {
        &self.region.layout().upstreams.rows[self.index][cell.0 as usize]
    }

    /// Adds `n` to upstream counter `c` (declared in `shm::upstream_counters`) of
    /// `cell`: the named methods below are these.
    #[inline]
    pub fn upstream_bump(&self, cell: CellId, c: Counter, n: u64) {
        self.cell(cell).bump(c, n);
    }

    /// A request (an attempt: a retry counts again) was sent to the server.
    #[inline]
    pub fn upstream_request(&self, cell: CellId) {
        self.upstream_bump(cell, upstream_counters::REQUESTS, 1);
    }

    /// A response head arrived: `status`, `head_latency_us` after the request was sent.
    /// Interim (1xx) heads count by class; pass their time only for the final head.
    #[inline]
    pub fn upstream_response(&self, cell: CellId, status: u16, head_latency_us: Option<u64>) {
        let c = self.cell(cell);
        c.bump(upstream_counters::response_class(status / 100), 1);
        if let Some(us) = head_latency_us {
            c.record_time(us);
        }
    }

    /// Connecting to the server failed (refused, reset, unreachable).
    #[inline]
    pub fn upstream_connect_error(&self, cell: CellId) {
        self.upstream_bump(cell, upstream_counters::CONNECT_ERRORS, 1);
    }

    /// A connect, send or read timeout with the server.
    #[inline]
    pub fn upstream_timeout(&self, cell: CellId) {
        self.upstream_bump(cell, upstream_counters::TIMEOUTS, 1);
    }

    /// A request that failed on this server is being retried (count it on the server
    /// that failed).
    #[inline]
    pub fn upstream_retry(&self, cell: CellId) {
        self.upstream_bump(cell, upstream_counters::RETRIES, 1);
    }

    /// A connection to the server carries a request: `reused` from the pool, or new.
    #[inline]
    pub fn upstream_connection(&self, cell: CellId, reused: bool) {
        let c = if reused {
            upstream_counters::CONNECTIONS_REUSED
        } else {
            upstream_counters::CONNECTIONS_NEW
        };
        self.upstream_bump(cell, c, 1);
    }

    /// This worker's gauges for the server: open connections, and how many of them
    /// are idle in its pool (two stores: call it when they change, or once a second).
    #[inline]
    pub fn upstream_gauges(&self, cell: CellId, open: u64, idle: u64) {
        let c = self.cell(cell);
        c.open.store(open, Relaxed);
        c.idle.store(idle, Relaxed);
    }

    /// This worker's row of the region (its slot's index, not its worker number).
    #[inline]
    pub fn row(&self) -> usize {
        self.index
    }

    #[inline]
    pub fn slot(&self) -> &WorkerSlot {
        &self.region.layout().slots[self.index]
    }

    pub fn region(&self) -> &Region {
        &self.region
    }

    pub fn set_state(&self, state: WorkerState) {
        self.slot().state.store(state as u32, Release);
    }

    /// Marks the slot as this process's and serving.
    pub fn serving(&self) {
        self.slot().pid.store(std::process::id() as i32, Relaxed);
        self.set_state(WorkerState::Serving);
    }

    /// Once per loop turn: the heartbeat a reader ages to find a stuck worker.
    #[inline]
    pub fn heartbeat(&self, now: Instant) {
        let ms = self.monotonic_ms(now);
        self.slot().heartbeat_ms.store(ms, Relaxed);
    }

    /// Adds `n` to counter `c` of this worker's row: the increment of a counter
    /// declared in `forkd_shared::shm::counters` (the named methods below are these).
    #[inline]
    pub fn bump(&self, c: Counter, n: u64) {
        self.slot().counters.bump(c, n);
    }

    /// A response was queued: `status`, after `latency_us` since its request began.
    /// Interim (1xx) responses count by class but not as requests; a 101 (switching
    /// to a tunnel) is its request's final answer.
    #[inline]
    pub fn response(&self, status: u16, latency_us: Option<u64>) {
        self.bump(counters::response_class(status / 100), 1);
        if status >= 200 || status == 101 {
            self.bump(counters::REQUESTS, 1);
        }
        if let Some(us) = latency_us {
            self.slot().counters.latency.record(us);
        }
    }

    #[inline]
    pub fn bytes_in(&self, n: u64) {
        self.bump(counters::BYTES_IN, n);
    }

    /// What the worker's temporary files did since the last call.
    pub fn temp_files(&self, c: crate::spool::temp::TempCounts) {
        if c.opened > 0 {
            self.bump(counters::TEMP_FILES_OPENED, c.opened);
        }
        if c.closed > 0 {
            self.bump(counters::TEMP_FILES_CLOSED, c.closed);
        }
        if c.bytes_written > 0 {
            self.bump(counters::TEMP_FILE_BYTES, c.bytes_written);
        }
    }

    #[inline]
    pub fn bytes_out(&self, n: u64) {
        self.bump(counters::BYTES_OUT, n);
    }

    pub fn accepted(&self) {
        self.bump(counters::CONNECTIONS_ACCEPTED, 1);
    }

    /// A connection closed; `abandoned`: its client left while a request was under way.
    pub fn closed(&self, abandoned: bool) {
        self.bump(counters::CONNECTIONS_HANDLED, 1);
        if abandoned {
            self.bump(counters::RESPONSES_499, 1);
        }
    }

    pub fn empty_wakeup(&self) {
        self.bump(counters::ACCEPT_EMPTY_WAKEUPS, 1);
    }

    /// A connection was closed for a transfer below its server's minimum rate.
    pub fn slow_client(&self) {
        self.bump(counters::SLOW_CLIENTS_CLOSED, 1);
    }

    pub fn limit_hit(&self) {
        self.bump(counters::CONNECTION_LIMIT_HITS, 1);
    }

    /// Once a second: connection gauges, open fds and RSS.
    /// Publishes the upgraded connections (tunnels) open now.
    pub fn tunnels(&self, open: u64) {
        let open = u32::try_from(open).unwrap_or(u32::MAX);
        self.slot().tunnels_open.store(open, Relaxed);
    }

    pub fn sample(&self, active: u64, reading: u64, writing: u64, idle: u64) {
        let s = self.slot();
        s.connections_active.store(active, Relaxed);
        s.connections_reading.store(reading, Relaxed);
        s.connections_writing.store(writing, Relaxed);
        s.connections_idle.store(idle, Relaxed);
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            // The directory handle itself is one of the entries.
            s.open_fds
                .store(dir.count().saturating_sub(1) as u64, Relaxed);
        }
        if let Some(rss) = read_rss() {
            s.rss_bytes.store(rss, Relaxed);
        }
    }
}

fn read_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use forkd_shared::shm::master::{claim_free_slot, fold_slot};
    use forkd_shared::shm::upstream::publish_labels;
    use forkd_shared::shm::upstream_counters as uc;

    use crate::test_region::region;

    const CONFIG: &str = r#"(
        upstreams: {
            "app": (servers: ["127.0.0.1:9000", "127.0.0.1:9001"]),
            "auth": (servers: ["unix:/run/auth.sock"]),
        },
        servers: [(listen: ["127.0.0.1:8080"], routes: [
            (prefix: "/api/", handler: Proxy(upstream: "app")),
            (prefix: "/auth/", handler: Proxy(upstream: "auth")),
        ])],
    )"#;

    fn config() -> Config {
        Config::parse(std::path::Path::new("/tmp/forkd-test.ron"), CONFIG).unwrap()
    }

    /// Two workers count through the API; the readers sum them, and a fold keeps it.
    fn populated(name: &str) -> (crate::test_region::TempRegion, Rc<Region>, Vec<Stats>) {
        let (tmp, region) = region(name);
        let config = config();
        let l = region.layout();
        assert!(publish_labels(&l.upstreams, &upstream::config_labels(&config)).is_empty());
        let mut workers = Vec::new();
        for w in 0..2 {
            let row = claim_free_slot(l, w, 1).unwrap();
            let mut s = Stats::new(region.clone(), row);
            s.map_upstreams(&config);
            s.serving();
            workers.push(s);
        }
        for (i, s) in workers.iter().enumerate() {
            let app0 = s.upstream_cell(0, 0).unwrap();
            let auth = s.upstream_cell(1, 0).unwrap();
            for _ in 0..=i {
                s.upstream_request(app0);
                s.upstream_connection(app0, false);
                s.upstream_response(app0, 200, Some(1500));
            }
            s.upstream_request(app0);
            s.upstream_connection(app0, true);
            s.upstream_response(app0, 103, None);
            s.upstream_response(app0, 502, Some(300_000));
            s.upstream_connect_error(auth);
            s.upstream_retry(auth);
            s.upstream_timeout(auth);
            s.upstream_gauges(app0, 3, 1);
        }
        (tmp, region, workers)
    }

    #[test]
    fn in_flight_and_passive_health_are_shown_by_every_reader() {
        use forkd_shared::shm::upstream_state::{publish_settings, DownReason, FailPolicy};
        let (_tmp, region, w) = populated("health");
        publish_settings(
            &region.layout().upstream_state,
            &region.layout().upstreams,
            &config(),
        );
        let app0 = w[0].upstream_cell(0, 0).unwrap();
        let auth = w[0].upstream_cell(1, 0).unwrap();
        // One request under way from each worker, and a second from worker 1.
        let a = w[0].begin_in_flight(app0);
        let b = w[1].begin_in_flight(app0);
        let c = w[1].begin_in_flight(app0);
        let policy = FailPolicy {
            max_fails: 1,
            fail_timeout_ms: 10_000,
        };
        let now = forkd_shared::shm::monotonic_ms();
        assert!(w[0].upstream_state().server(auth.index()).record_failure(
            DownReason::ConnectRefused,
            now,
            policy,
            true
        ));

        let report = region.report().unwrap();
        let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
        let find = |s: &str| {
            json["upstreams"]
                .as_array()
                .unwrap()
                .iter()
                .find(|x| x["server"] == s)
                .cloned()
                .unwrap()
        };
        let row = find("127.0.0.1:9000");
        assert_eq!(
            (
                &row["state"],
                &row["in_flight"],
                &row["weight"],
                &row["weight_now"]
            ),
            (&"up".into(), &3.into(), &1.into(), &1.into()),
            "{row:#}"
        );
        let down = find("unix:/run/auth.sock");
        assert_eq!(down["state"], "down", "{down:#}");
        assert_eq!(down["last_down_reason"], "connect refused");
        assert_eq!(
            (&down["consecutive_failures"], &down["marked_down"]),
            (&1.into(), &1.into())
        );

        let table = report.to_table(None, 0.0);
        let line = table
            .lines()
            .find(|l| l.contains("unix:/run/auth.sock"))
            .unwrap();
        assert!(
            line.contains(" down ") && line.ends_with("connect refused"),
            "{line}"
        );

        let text = report.to_prometheus();
        let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
            .expect("parses");
        let value = |metric: &str, server: &str| {
            scrape
                .samples
                .iter()
                .find(|s| s.metric == metric && s.labels.get("server") == Some(server))
                .map(|s| match s.value {
                    prometheus_parse::Value::Gauge(v) | prometheus_parse::Value::Counter(v) => v,
                    _ => f64::NAN,
                })
                .unwrap_or_else(|| panic!("{metric} {server}: {text}"))
        };
        assert_eq!(value("forkd_upstream_in_flight", "127.0.0.1:9000"), 3.0);
        assert_eq!(value("forkd_upstream_up", "unix:/run/auth.sock"), 0.0);
        assert_eq!(value("forkd_upstream_up", "127.0.0.1:9000"), 1.0);
        assert!(text.contains(
            "forkd_upstream_last_down_reason{upstream=\"auth\",server=\"unix:/run/auth.sock\",reason=\"connect refused\"} 1"
        ), "{text}");

        // A request that ends ends its count; a worker that dies with two under way
        // leaks neither once its row is folded.
        drop(a);
        assert_eq!(w[0].upstream_state().in_flight(app0.index()), 2);
        std::mem::forget((b, c));
        fold_slot(region.layout(), w[1].index);
        assert_eq!(w[0].upstream_state().in_flight(app0.index()), 0);
    }

    #[test]
    fn cells_follow_the_configuration_indices() {
        let (_tmp, _region, w) = populated("cells");
        let s = &w[0];
        let cells = [
            s.upstream_cell(0, 0),
            s.upstream_cell(0, 1),
            s.upstream_cell(1, 0),
        ];
        assert!(cells.iter().all(Option::is_some));
        assert_ne!(cells[0], cells[1]);
        assert_ne!(cells[1], cells[2]);
        assert_eq!(s.upstream_cell(0, 2), None);
        assert_eq!(s.upstream_cell(2, 0), None);
        assert_eq!(
            w[1].upstream_cell(1, 0),
            cells[2],
            "every worker maps alike"
        );
    }

    #[test]
    fn readers_sum_the_workers_as_json_table_and_prometheus() {
        let (_tmp, region, w) = populated("readers");
        let report = region.report().unwrap();
        let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
        let ups = json["upstreams"].as_array().unwrap();
        assert_eq!(
            ups.len(),
            3,
            "every configured server, counted or not: {ups:?}"
        );
        let find = |u: &str, s: &str| {
            ups.iter()
                .find(|x| x["upstream"] == u && x["server"] == s)
                .unwrap_or_else(|| panic!("{u} {s} missing"))
                .clone()
        };
        let app0 = find("app", "127.0.0.1:9000");
        assert_eq!(app0["requests"], 5);
        assert_eq!(app0["responses_2xx"], 3);
        assert_eq!(app0["responses_1xx"], 2);
        assert_eq!(app0["responses_5xx"], 2);
        assert_eq!(app0["connections_new"], 3);
        assert_eq!(app0["connections_reused"], 2);
        assert_eq!(app0["connections_open"], 6);
        assert_eq!(app0["connections_idle"], 2);
        assert_eq!(app0["configured"], true);
        assert_eq!(app0["response_time"]["count"], 5);
        assert_eq!(app0["response_time"]["sum_us"], 3 * 1500 + 2 * 300_000);
        let app1 = find("app", "127.0.0.1:9001");
        assert_eq!(app1["requests"], 0);
        assert!(app1["response_time"]["p50_us_at_most"].is_null());
        let auth = find("auth", "unix:/run/auth.sock");
        assert_eq!(
            (&auth["connect_errors"], &auth["retries"], &auth["timeouts"]),
            (&2.into(), &2.into(), &2.into())
        );

        let table = report.to_table(None, 0.0);
        let line = table
            .lines()
            .find(|l| l.starts_with("app") && l.contains("127.0.0.1:9000"))
            .unwrap_or_else(|| panic!("{table}"));
        let cols: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(&cols[2..5], ["5", "3", "0"], "{line}");
        assert!(table.contains("unix:/run/auth.sock"), "{table}");

        let text = report.to_prometheus();
        let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
            .expect("parses");
        let sample = |metric: &str, server: &str, extra: Option<(&str, &str)>| -> f64 {
            let s = scrape
                .samples
                .iter()
                .find(|s| {
                    s.metric == metric
                        && s.labels.get("server") == Some(server)
                        && extra.is_none_or(|(k, v)| s.labels.get(k) == Some(v))
                })
                .unwrap_or_else(|| panic!("{metric} {server}"));
            match &s.value {
                prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Gauge(v) => *v,
                prometheus_parse::Value::Untyped(v) => *v,
                prometheus_parse::Value::Histogram(b) => {
                    b.iter()
                        .find(|b| b.less_than == f64::INFINITY)
                        .unwrap()
                        .count
                }
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(
            sample("forkd_upstream_requests_total", "127.0.0.1:9000", None),
            5.0
        );
        assert_eq!(
            sample(
                "forkd_upstream_responses_total",
                "127.0.0.1:9000",
                Some(("class", "5xx"))
            ),
            2.0
        );
        assert_eq!(
            sample(
                "forkd_upstream_connections_total",
                "127.0.0.1:9000",
                Some(("kind", "reused"))
            ),
            2.0
        );
        assert_eq!(
            sample("forkd_upstream_connections_open", "127.0.0.1:9000", None),
            6.0
        );
        assert_eq!(
            sample(
                "forkd_upstream_connect_errors_total",
                "unix:/run/auth.sock",
                None
            ),
            2.0
        );
        assert_eq!(
            sample(
                "forkd_upstream_response_time_seconds",
                "127.0.0.1:9000",
                None
            ),
            5.0
        );
        // 1.5 ms and 300 ms: in the buckets up to 2.048 ms and 524.288 ms.
        let hist = scrape
            .samples
            .iter()
            .find_map(|s| match &s.value {
                prometheus_parse::Value::Histogram(b)
                    if s.labels.get("server") == Some("127.0.0.1:9000") =>
                {
                    Some(b.clone())
                }
                _ => None,
            })
            .unwrap();
        let at = |le: f64| {
            hist.iter()
                .find(|b| (b.less_than - le).abs() < 1e-9)
                .unwrap()
                .count
        };
        assert_eq!(at(0.001024), 0.0);
        assert_eq!(at(0.002048), 3.0);
        assert_eq!(at(0.262144), 3.0);
        assert_eq!(at(0.524288), 5.0);

        // A worker exits: its counts move to the retired totals, its gauges go.
        let row = w[0].index;
        drop(w);
        fold_slot(region.layout(), row);
        let after = region.report().unwrap();
        let app0 = after
            .upstreams
            .iter()
            .find(|u| u.server == "127.0.0.1:9000")
            .unwrap();
        assert_eq!(app0.values[uc::REQUESTS], 5);
        assert_eq!(app0.values.open, 3);
    }
}

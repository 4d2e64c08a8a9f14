//! End-to-end tests of the shared-memory stats: `forkd stats` (table and JSON), the
//! `Status` (JSON) and `Metrics` (Prometheus) handlers, and what the master folds into
//! the retired totals when workers die.
//!
//! Counts are read as deltas from a baseline taken after start (the harness's
//! readiness probe is one request on one connection). Counters are bumped as responses
//! are queued, a few instructions before or after the client sees the bytes, so every
//! comparison polls until the numbers settle and then asserts exactly.

mod support;

use serde_json::Value;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::*;

/// How long a counter may take to settle, or a worker or a generation to come up: only
/// a failing test waits this long, so it is generous for a loaded 2-core machine.
const SETTLE: Duration = Duration::from_secs(30);

/// Liveness at /healthz (the harness's readiness probe), the stats handlers, static files.
const ROUTES: &str = r#"(prefix: "/healthz", handler: Liveness),
            (prefix: "/status", handler: Status),
            (prefix: "/metrics", handler: Metrics),
            (prefix: "/", handler: Static(root: "www", index: ["index.html"])),"#;

/// Every counter of a counters object (`totals`, `retired`, a worker's `counters`).
const COUNTERS: [&str; 15] = [
    "connections_accepted",
    "connections_handled",
    "requests",
    "responses_1xx",
    "responses_2xx",
    "responses_3xx",
    "responses_4xx",
    "responses_5xx",
    "responses_499",
    "bytes_in",
    "bytes_out",
    "accept_empty_wakeups",
    "connection_limit_hits",
    "latency.count",
    "latency.sum_us",
];

// ---------------------------------------------------------------------------------
// Running `forkd stats`
// ---------------------------------------------------------------------------------

/// Runs `forkd stats ARGS...` (the documented form: the subcommand first).
fn forkd_stats(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN)
        .arg("stats")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run forkd stats");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `forkd stats -c CONFIG` (the table).
fn stats_table(config: &Path) -> String {
    let config = config.to_str().expect("UTF-8 path");
    let (code, out, err) = forkd_stats(&["-c", config]);
    assert_eq!(code, 0, "forkd stats failed: {err}");
    out
}

/// A counter of a counters object; `latency.count` reaches into `latency`.
fn counter(counters: &Value, key: &str) -> u64 {
    let v = match key.split_once('.') {
        Some((outer, inner)) => &counters[outer][inner],
        None => &counters[key],
    };
    v.as_u64()
        .unwrap_or_else(|| panic!("no counter {key} in {counters}"))
}

fn total(stats: &Value, key: &str) -> u64 {
    counter(&stats["totals"], key)
}

/// The workers rows of a reading.
fn rows(stats: &Value) -> &Vec<Value> {
    stats["workers"].as_array().expect("workers array")
}

/// The row of the worker process `pid`.
fn row_of(stats: &Value, pid: i32) -> Option<&Value> {
    rows(stats)
        .iter()
        .find(|w| w["pid"].as_i64() == Some(pid as i64))
}

/// Polls `read` until `cond` holds; returns that reading, or panics with the last one.
fn poll(
    mut read: impl FnMut() -> Value,
    what: &str,
    mut cond: impl FnMut(&Value) -> bool,
) -> Value {
    let mut last = Value::Null;
    let ok = wait_until(SETTLE, || {
        last = read();
        cond(&last)
    });
    assert!(
        ok,
        "{what}: not reached within {SETTLE:?}; last reading:\n{last:#}"
    );
    last
}

/// Polls `forkd stats -c CONFIG --json` until `cond` holds.
fn poll_stats(config: &Path, what: &str, cond: impl FnMut(&Value) -> bool) -> Value {
    poll(|| stats_json(config), what, cond)
}

/// Polls `forkd stats` until every total of `expected` has grown by exactly its
/// number since `before`; returns that reading.
fn wait_deltas(d: &TestDaemon, before: &Value, expected: &[(&str, u64)]) -> Value {
    let delta = |s: &Value, k: &str| total(s, k).wrapping_sub(total(before, k));
    let mut last = Value::Null;
    let settled = wait_until(SETTLE, || {
        last = stats_json(&d.config);
        expected.iter().all(|&(k, v)| delta(&last, k) == v)
    });
    let got: Vec<(&str, u64)> = expected
        .iter()
        .map(|&(k, _)| (k, delta(&last, k)))
        .collect();
    assert!(
        settled,
        "counter deltas (expected vs got):\n{expected:?}\n{got:?}\nlast reading: {last:#}"
    );
    last
}

/// Waits until every worker of `d` has a `serving` row with its pid; returns the reading.
fn wait_serving(d: &TestDaemon) -> Value {
    let n = d.builder.workers;
    poll_stats(&d.config, "all workers serving", |s| {
        let pids: HashSet<i32> = d.workers().into_iter().collect();
        let serving: HashSet<i32> = rows(s)
            .iter()
            .filter(|w| w["state"] == "serving")
            .filter_map(|w| w["pid"].as_i64().map(|p| p as i32))
            .collect();
        pids.len() == n && serving == pids
    })
}

/// Waits until every accepted connection has been closed (load has fully settled).
fn wait_quiet(d: &TestDaemon) -> Value {
    poll_stats(&d.config, "every connection closed", |s| {
        total(s, "connections_handled") == total(s, "connections_accepted")
            && rows(s)
                .iter()
                .all(|w| w["connections_active"].as_u64() == Some(0))
    })
}

// ---------------------------------------------------------------------------------
// Talking to the server
// ---------------------------------------------------------------------------------

fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(SETTLE)).unwrap();
    s
}

/// Reads until the server closes the connection.
fn read_rest(s: &mut TcpStream) -> Vec<u8> {
    let mut rest = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return rest,
            Ok(n) => rest.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => panic!("reading to the end: {e} (got {rest:?})"),
        }
    }
}

/// One `GET path` on a new connection with `Connection: close`.
fn get_close(port: u16, path: &str) -> Response {
    let mut s = connect(port);
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .unwrap();
    let r = read_response(&mut s, false).expect("a response");
    let rest = read_rest(&mut s);
    assert!(rest.is_empty(), "bytes after the response: {rest:?}");
    r
}

/// `total` GETs of `path` from `threads` threads, each on a new connection.
fn load(port: u16, path: &str, total: usize, threads: usize) {
    std::thread::scope(|scope| {
        for t in 0..threads {
            scope.spawn(move || {
                for _ in (t..total).step_by(threads) {
                    let r = get_close(port, path);
                    assert_eq!(r.status, 200, "{}", r.head);
                }
            });
        }
    });
}

/// A client connection that counts every byte it writes and reads.
struct Counted {
    s: TcpStream,
    written: u64,
    read: u64,
}

impl Counted {
    fn new(port: u16) -> Counted {
        Counted {
            s: connect(port),
            written: 0,
            read: 0,
        }
    }

    /// Sends `request`, reads its response.
    fn exchange(&mut self, request: &[u8]) -> Response {
        self.send(request);
        self.response(request.starts_with(b"HEAD "))
    }

    fn send(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).unwrap();
        self.written += bytes.len() as u64;
    }

    /// Reads one response (an interim 1xx is one of its own).
    fn response(&mut self, head_only: bool) -> Response {
        let r = read_response(&mut self.s, head_only).expect("a response");
        self.read += (r.head.len() + r.body.len()) as u64;
        r
    }

    /// Closes our side and reads until the server closes; returns (written, read).
    fn finish(mut self) -> (u64, u64) {
        let _ = self.s.shutdown(Shutdown::Write);
        let rest = read_rest(&mut self.s);
        assert!(rest.is_empty(), "unexpected bytes: {rest:?}");
        (self.written, self.read)
    }
}

fn get_request(path: &str, extra: &str, close: bool) -> Vec<u8> {
    let conn = if close { "Connection: close\r\n" } else { "" };
    format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{extra}{conn}\r\n").into_bytes()
}

fn post_request(path: &str, body: &str, close: bool) -> Vec<u8> {
    let conn = if close { "Connection: close\r\n" } else { "" };
    format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: text/plain\r\n\
         Content-Length: {}\r\n{conn}\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Sends SIGCONT to a stopped worker when dropped, so a failing test never leaves it
/// stopped.
struct ContOnDrop(i32);

impl Drop for ContOnDrop {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("-CONT")
            .arg(self.0.to_string())
            .status();
    }
}

// ---------------------------------------------------------------------------------
// 1. Exact accounting
// ---------------------------------------------------------------------------------

#[test]
fn counters_account_exactly_for_requests_responses_connections_and_bytes() {
    let small = noise(1000, 1);
    let large = noise(200 * 1024, 2); // above the in-memory limit: sent with sendfile
    let d = TestDaemon::builder()
        .routes(ROUTES)
        .file("small.bin", &small)
        .file("large.bin", &large)
        .file("sub/index.html", b"<p>sub</p>\n")
        .start();
    wait_serving(&d);
    let before = wait_quiet(&d);

    let (mut written, mut read) = (0u64, 0u64);
    let mut statuses: BTreeMap<u16, u64> = BTreeMap::new();
    let mut note = |r: &Response| *statuses.entry(r.status).or_default() += 1;

    // One keep-alive connection: 4×200, 2×404, 1×405 (POST with a body), 1×301, 1×304.
    let mut ka = Counted::new(d.port);
    let r = ka.exchange(&get_request("/small.bin", "", false));
    assert_eq!((r.status, r.body.len()), (200, small.len()), "{}", r.head);
    note(&r);
    let etag = r.header("ETag").expect("an ETag").to_string();
    for path in ["/large.bin", "/small.bin", "/large.bin"] {
        let r = ka.exchange(&get_request(path, "", false));
        assert_eq!(r.status, 200, "{}", r.head);
        note(&r);
    }
    for path in ["/missing.txt", "/nope/deeper.html"] {
        let r = ka.exchange(&get_request(path, "", false));
        assert_eq!(r.status, 404, "{}", r.head);
        note(&r);
    }
    let r = ka.exchange(&post_request("/small.bin", "hello=world", false));
    assert_eq!(r.status, 405, "{}", r.head);
    note(&r);
    let r = ka.exchange(&get_request("/sub", "", false));
    assert_eq!(r.status, 301, "{}", r.head);
    assert_eq!(r.header("Location"), Some("/sub/"));
    note(&r);
    let r = ka.exchange(&get_request(
        "/small.bin",
        &format!("If-None-Match: {etag}\r\n"),
        false,
    ));
    assert_eq!(r.status, 304, "{}", r.head);
    note(&r);
    let (w, rd) = ka.finish();
    written += w;
    read += rd;

    // New connections, one request each: 3×200, 1×404, 1×405.
    let one_shots = [
        get_request("/small.bin", "", true),
        get_request("/large.bin", "", true),
        get_request("/sub/", "", true),
        get_request("/gone", "", true),
        post_request("/large.bin", "x", true),
    ];
    for request in &one_shots {
        let mut c = Counted::new(d.port);
        let r = c.exchange(request);
        note(&r);
        let (w, rd) = c.finish();
        written += w;
        read += rd;
    }
    let expected_statuses: BTreeMap<u16, u64> =
        [(200, 7), (301, 1), (304, 1), (404, 3), (405, 2)].into();
    assert_eq!(statuses, expected_statuses);

    let requests = 14;
    let connections = 1 + one_shots.len() as u64;
    let expected: [(&str, u64); 12] = [
        ("requests", requests),
        ("responses_1xx", 0),
        ("responses_2xx", 7),
        ("responses_3xx", 2),
        ("responses_4xx", 5),
        ("responses_5xx", 0),
        ("responses_499", 0),
        ("connections_accepted", connections),
        ("connections_handled", connections),
        ("bytes_in", written),
        ("bytes_out", read),
        ("latency.count", requests),
    ];
    let last = wait_deltas(&d, &before, &expected);
    // One worker: its row and the totals agree (nothing retired).
    let row = &rows(&last)[0];
    for k in COUNTERS {
        assert_eq!(counter(&row["counters"], k), total(&last, k), "{k}");
        assert_eq!(counter(&last["retired"], k), 0, "retired {k}");
    }
    // Latency percentiles exist once there are requests, and are ordered.
    let lat = &last["totals"]["latency"];
    let p50 = lat["p50_us"].as_u64().expect("p50");
    let p99 = lat["p99_us"].as_u64().expect("p99");
    assert!(p50 <= p99, "{lat}");
    let bucket_sum: u64 = lat["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b[2].as_u64().unwrap())
        .sum();
    assert_eq!(bucket_sum, counter(&last["totals"], "latency.count"));
}

// ---------------------------------------------------------------------------------
// 2. `forkd stats --json` and /status agree
// ---------------------------------------------------------------------------------

#[test]
fn stats_json_matches_the_status_handler() {
    let d = TestDaemon::builder().routes(ROUTES).start();
    wait_serving(&d);
    load(d.port, "/index.html", 20, 2);
    for _ in 0..3 {
        assert_eq!(get_close(d.port, "/nothing-here").status, 404);
    }
    wait_quiet(&d);
    // The master publishes its listeners on its loop turns, not before its workers
    // serve: both readings below must come after the first.
    poll_stats(&d.config, "the listeners published", |s| {
        s["system"]["listeners"]
            .as_array()
            .is_some_and(|l| !l.is_empty())
    });

    let mut c = Counted::new(d.port);
    let r = c.exchange(&get_request("/status", "", true));
    let (_, status_bytes) = c.finish();
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(r.header("Content-Type"), Some("application/json"));
    let status: Value = serde_json::from_slice(&r.body)
        .unwrap_or_else(|e| panic!("/status is not JSON ({e}): {}", r.body_str()));

    // The /status request was read (bytes in, connection accepted) before its body was
    // made; its response, its close and its latency come after.
    let cli = poll_stats(&d.config, "the /status exchange counted", |s| {
        total(s, "connections_handled") == total(s, "connections_accepted")
            && total(s, "bytes_out") == total(&status, "bytes_out") + status_bytes
    });
    for k in COUNTERS {
        let want = total(&status, k)
            + match k {
                "requests" | "responses_2xx" | "latency.count" | "connections_handled" => 1,
                "bytes_out" => status_bytes,
                _ => 0,
            };
        if k == "latency.sum_us" {
            assert!(total(&cli, k) >= total(&status, k), "{k}");
            continue;
        }
        assert_eq!(
            total(&cli, k),
            want,
            "totals.{k}: /status {status:#}\nCLI {cli:#}"
        );
    }
    assert!(total(&status, "requests") >= 24, "{status:#}");
    for k in [
        "pid",
        "alive",
        "start_time_ms",
        "config_generation",
        "respawns",
    ] {
        assert_eq!(cli["master"][k], status["master"][k], "master.{k}");
    }
    assert_eq!(cli["master"]["pid"].as_i64(), Some(d.pid() as i64));
    assert_eq!(cli["master"]["alive"], true);
    assert_eq!(cli["layout_version"], status["layout_version"]);
    let ids = |s: &Value| -> Vec<(i64, i64, String)> {
        rows(s)
            .iter()
            .map(|w| {
                (
                    w["id"].as_i64().unwrap(),
                    w["pid"].as_i64().unwrap(),
                    w["state"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    assert_eq!(
        ids(&cli),
        ids(&status),
        "worker rows (id, pid, state) of the CLI and of /status differ:\nCLI {:#}\n/status {:#}",
        cli["workers"],
        status["workers"]
    );
    assert_eq!(cli["system"]["listeners"], status["system"]["listeners"]);
    let addr = format!("127.0.0.1:{}", d.port);
    assert_eq!(cli["system"]["listeners"][0]["addr"], addr.as_str());
}

// ---------------------------------------------------------------------------------
// 3. Prometheus
// ---------------------------------------------------------------------------------

/// Checks that every sample belongs to a family whose `# TYPE` came before it (a
/// histogram's `_bucket`, `_sum` and `_count` belong to the histogram), with at most
/// one TYPE per family. Returns the families and their types.
fn check_types(text: &str) -> HashMap<String, String> {
    let mut types: HashMap<String, String> = HashMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, ty) = rest.split_once(' ').expect("# TYPE name type");
            assert!(
                types.insert(name.to_string(), ty.to_string()).is_none(),
                "second # TYPE for {name}"
            );
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let name = line
            .split(['{', ' '])
            .next()
            .expect("a sample name")
            .to_string();
        let family_known = types.contains_key(&name)
            || ["_bucket", "_sum", "_count"].iter().any(|suffix| {
                name.strip_suffix(suffix)
                    .is_some_and(|base| types.get(base).is_some_and(|t| t == "histogram"))
            });
        assert!(family_known, "sample without a # TYPE: {line}");
    }
    types
}

#[test]
fn metrics_are_valid_prometheus_and_agree_with_json() {
    let d = TestDaemon::builder()
        .workers(2)
        .accept("ReusePort")
        .routes(ROUTES)
        .start();
    wait_serving(&d);
    load(d.port, "/index.html", 60, 3);
    assert_eq!(get_close(d.port, "/missing").status, 404);
    wait_quiet(&d);

    let r = get_close(d.port, "/metrics");
    assert_eq!(r.status, 200, "{}", r.head);
    assert!(
        r.header("Content-Type")
            .is_some_and(|t| t.starts_with("text/plain; version=0.0.4")),
        "{}",
        r.head
    );
    let text = r.body_str();
    let json = poll_stats(&d.config, "the /metrics request counted", |s| {
        total(s, "connections_handled") == total(s, "connections_accepted")
    });

    let types = check_types(&text);
    for (family, ty) in [
        ("forkd_requests_total", "counter"),
        ("forkd_responses_total", "counter"),
        ("forkd_request_duration_seconds", "histogram"),
        ("forkd_worker_heartbeat_age_seconds", "gauge"),
    ] {
        assert_eq!(types.get(family).map(String::as_str), Some(ty), "{family}");
    }

    let scrape = scrape(&text);
    assert!(!scrape.samples.is_empty());
    let value = |s: &prometheus_parse::Sample| -> f64 {
        match &s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => *v,
            other => panic!("{} is not a number: {other:?}", s.metric),
        }
    };

    // Histograms: cumulative buckets; +Inf equals _count, per worker label.
    let counts: HashMap<String, f64> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == "forkd_request_duration_seconds_count")
        .map(|s| (s.labels.get("worker").unwrap().to_string(), value(s)))
        .collect();
    let mut histograms = 0;
    for s in &scrape.samples {
        let prometheus_parse::Value::Histogram(buckets) = &s.value else {
            continue;
        };
        histograms += 1;
        let worker = s.labels.get("worker").expect("worker label").to_string();
        let mut buckets = buckets.clone();
        buckets.sort_by(|a, b| a.less_than.total_cmp(&b.less_than));
        for pair in buckets.windows(2) {
            assert!(
                pair[0].count <= pair[1].count,
                "worker {worker}: bucket le={} has {} > le={} with {}",
                pair[0].less_than,
                pair[0].count,
                pair[1].less_than,
                pair[1].count
            );
        }
        let inf = buckets.last().expect("buckets");
        assert!(
            inf.less_than.is_infinite(),
            "worker {worker}: no +Inf bucket"
        );
        assert_eq!(
            Some(&inf.count),
            counts.get(&worker),
            "worker {worker}: +Inf vs _count"
        );
    }
    // Two live workers and the retired totals.
    assert_eq!(histograms, 3, "histograms by worker: {counts:?}");

    // forkd_requests_total over worker labels: the JSON totals, less the scrape itself
    // (its request is counted after its body was made).
    let sum_of = |metric: &str| -> u64 {
        scrape
            .samples
            .iter()
            .filter(|s| s.metric == metric)
            .map(|s| value(s) as u64)
            .sum()
    };
    let requests = sum_of("forkd_requests_total");
    assert_eq!(requests + 1, total(&json, "requests"), "{json:#}");
    assert!(requests >= 61, "{requests}");
    let labels: HashSet<String> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == "forkd_requests_total")
        .map(|s| s.labels.get("worker").unwrap().to_string())
        .collect();
    let mut want: HashSet<String> = rows(&json)
        .iter()
        .map(|w| w["id"].as_i64().unwrap().to_string())
        .collect();
    want.insert("retired".into());
    assert_eq!(labels, want);
    assert_eq!(
        sum_of("forkd_connections_accepted_total"),
        total(&json, "connections_accepted")
    );
    let class = |c: &str| -> u64 {
        scrape
            .samples
            .iter()
            .filter(|s| s.metric == "forkd_responses_total" && s.labels.get("class") == Some(c))
            .map(|s| value(s) as u64)
            .sum()
    };
    assert_eq!(class("2xx") + 1, total(&json, "responses_2xx"));
    assert_eq!(class("4xx"), total(&json, "responses_4xx"));
    assert_eq!(
        counts.values().sum::<f64>() as u64 + 1,
        total(&json, "latency.count")
    );
}

/// The moment between a worker's graceful exit and the master folding its counts into
/// `retired`, held open: a stopped master cannot reap. The JSON totals still count the
/// exited worker (its row holds its counts until the fold); `/metrics` must too, or
/// `sum(forkd_requests_total)` drops and a scrape in that moment sees a counter reset.
#[test]
fn metrics_still_count_an_exited_worker_until_it_is_folded() {
    let d = TestDaemon::builder()
        .workers(2)
        .accept("Shared")
        .routes(ROUTES)
        .expect_alerts() // the worker that exits is respawned
        .start();
    wait_serving(&d);
    load(d.port, "/index.html", 60, 3);
    let before = wait_quiet(&d);
    let leaver = rows(&before)
        .iter()
        .max_by_key(|w| counter(&w["counters"], "requests"))
        .unwrap()
        .clone();
    let leaver_pid = leaver["pid"].as_i64().unwrap() as i32;
    let leaver_requests = counter(&leaver["counters"], "requests");
    assert!(leaver_requests > 0);

    support::signal(d.pid(), "STOP");
    let _cont = ContOnDrop(d.pid());
    support::signal(leaver_pid, "QUIT"); // a graceful exit of one worker
    let json = poll_stats(&d.config, "the worker exited, not yet folded", |s| {
        row_of(s, leaver_pid).is_some_and(|w| w["state"] == "exited")
    });
    assert_eq!(
        counter(&row_of(&json, leaver_pid).unwrap()["counters"], "requests"),
        leaver_requests,
        "not folded yet: the row still holds the counts"
    );
    assert_eq!(total(&json, "requests"), total(&before, "requests"));

    let r = get_close(d.port, "/metrics");
    assert_eq!(r.status, 200, "{}", r.head);
    let text = r.body_str();
    let requests: u64 = text
        .lines()
        .filter(|l| l.starts_with("forkd_requests_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    let series: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("forkd_requests_total{"))
        .collect();
    assert_eq!(
        requests,
        total(&json, "requests"),
        "sum(forkd_requests_total) vs JSON totals.requests while worker {leaver_pid} \
         ({leaver_requests} requests) has exited but is not folded yet: {series:?}"
    );

    // Once the master runs again it folds the worker and respawns its slot.
    support::signal(d.pid(), "CONT");
    let folded = poll_stats(&d.config, "the exited worker folded", |s| {
        s["master"]["respawns"] == 1 && row_of(s, leaver_pid).is_none()
    });
    assert_eq!(counter(&folded["retired"], "requests"), leaver_requests);
    assert_eq!(total(&folded, "requests"), total(&before, "requests") + 1);
}

// ---------------------------------------------------------------------------------
// 4. Totals survive a worker's death
// ---------------------------------------------------------------------------------

#[test]
fn totals_stay_monotonic_when_a_worker_is_killed() {
    let d = TestDaemon::builder()
        .workers(2)
        .accept("ReusePort")
        .routes(ROUTES)
        .expect_alerts()
        .start();
    wait_serving(&d);
    load(d.port, "/index.html", 100, 4);
    assert_eq!(get_close(d.port, "/missing").status, 404);
    let before = wait_quiet(&d);
    assert_eq!(before["master"]["respawns"], 0);

    // The worker that served the most.
    let victim = rows(&before)
        .iter()
        .max_by_key(|w| counter(&w["counters"], "requests"))
        .unwrap()
        .clone();
    let victim_pid = victim["pid"].as_i64().unwrap() as i32;
    assert!(counter(&victim["counters"], "requests") > 0, "{before:#}");
    support::signal(victim_pid, "KILL");

    let after = poll_stats(&d.config, "the killed worker replaced", |s| {
        let pids = d.workers();
        s["master"]["respawns"].as_u64() == Some(1)
            && pids.len() == 2
            && !pids.contains(&victim_pid)
            && rows(s)
                .iter()
                .filter(|w| w["state"] == "serving" && w["pid"].as_i64() != Some(0))
                .count()
                == 2
    });
    let reason = after["master"]["last_respawn_reason"].as_str().unwrap();
    assert!(
        reason.contains("SIGKILL") && reason.contains(&victim_pid.to_string()),
        "last_respawn_reason: {reason}"
    );
    for k in COUNTERS {
        assert!(
            total(&after, k) >= total(&before, k),
            "totals.{k} went backwards: {} -> {}",
            total(&before, k),
            total(&after, k)
        );
    }
    // Nothing was served in between: the totals are the same, now partly retired.
    for k in [
        "requests",
        "responses_2xx",
        "responses_4xx",
        "bytes_in",
        "bytes_out",
    ] {
        assert_eq!(total(&after, k), total(&before, k), "totals.{k}");
    }
    assert!(row_of(&after, victim_pid).is_none(), "{after:#}");
    for k in COUNTERS {
        assert_eq!(
            counter(&after["retired"], k),
            counter(&before["retired"], k) + counter(&victim["counters"], k),
            "retired.{k} should hold the killed worker's count"
        );
    }
    // The replacement starts from zero.
    let replacement_pid = *d
        .workers()
        .iter()
        .find(|p| {
            rows(&before)
                .iter()
                .all(|w| w["pid"].as_i64() != Some(**p as i64))
        })
        .expect("a new worker");
    let replacement = row_of(&after, replacement_pid).expect("a row for the new worker");
    for k in COUNTERS {
        assert_eq!(counter(&replacement["counters"], k), 0, "replacement {k}");
    }

    // And counting goes on from there.
    load(d.port, "/index.html", 10, 2);
    poll_stats(&d.config, "requests after the respawn", |s| {
        total(s, "requests") == total(&before, "requests") + 10
    });
}

// ---------------------------------------------------------------------------------
// 5. Load spreads over both workers
// ---------------------------------------------------------------------------------

/// Sends 500 requests on new connections from 4 threads; asserts that both workers
/// served some and returns each worker row's request delta by pid.
fn spread(accept: &'static str) -> Vec<(i32, u64)> {
    let d = TestDaemon::builder()
        .workers(2)
        .accept(accept)
        .routes(ROUTES)
        .start();
    wait_serving(&d);
    let before = wait_quiet(&d);
    load(d.port, "/index.html", 500, 4);
    let after = poll_stats(&d.config, "500 requests counted", |s| {
        total(s, "requests") == total(&before, "requests") + 500
    });
    let deltas: Vec<(i32, u64)> = d
        .workers()
        .into_iter()
        .map(|pid| {
            let now = row_of(&after, pid).expect("a row per worker");
            let then = row_of(&before, pid).expect("a row per worker");
            (
                pid,
                counter(&now["counters"], "requests") - counter(&then["counters"], "requests"),
            )
        })
        .collect();
    assert_eq!(deltas.iter().map(|d| d.1).sum::<u64>(), 500, "{deltas:?}");
    assert_eq!(deltas.len(), 2, "{accept}");
    assert!(
        deltas.iter().all(|&(_, n)| n > 0),
        "{accept}: a worker served nothing: {deltas:?}"
    );
    deltas
}

#[test]
fn reuseport_spreads_load_over_both_workers() {
    spread("ReusePort");
}

#[test]
fn shared_accept_spreads_load_over_both_workers() {
    spread("Shared");
}

// ---------------------------------------------------------------------------------
// 6. A stuck worker shows in its heartbeat
// ---------------------------------------------------------------------------------

#[test]
fn stopped_worker_heartbeat_ages_while_the_other_serves() {
    let d = TestDaemon::builder()
        .workers(2)
        .accept("Shared")
        .routes(ROUTES)
        .start();
    wait_serving(&d);
    let pids = d.workers();
    let (stuck, other) = (pids[0], pids[1]);
    support::signal(stuck, "STOP");
    let _cont = ContOnDrop(stuck);
    let stopped_at = Instant::now();
    let before = stats_json(&d.config);
    let served_before = |s: &Value, pid| counter(&row_of(s, pid).unwrap()["counters"], "requests");

    let mut served = 0u64;
    let mut last = Value::Null;
    let reached = wait_until(Duration::from_secs(15), || {
        // Requests keep being answered, by the worker that still runs.
        let r = get_close(d.port, "/index.html");
        assert_eq!(r.status, 200, "{}", r.head);
        served += 1;
        last = stats_json(&d.config);
        let age = |pid| {
            row_of(&last, pid).unwrap()["heartbeat_age_ms"]
                .as_u64()
                .unwrap()
        };
        age(stuck) > 2000 && age(other) < 1500
    });
    assert!(
        reached,
        "after {:?}: heartbeat ages not (stuck > 2000 ms, other < 1500 ms): {last:#}",
        stopped_at.elapsed()
    );
    assert_eq!(row_of(&last, stuck).unwrap()["state"], "serving");
    assert_eq!(served_before(&last, stuck), served_before(&before, stuck));
    poll_stats(&d.config, "requests served by the running worker", |s| {
        served_before(s, other) == served_before(&before, other) + served
    });

    // The table shows the stuck worker's heartbeat age too.
    let table = stats_table(&d.config);
    let line = table
        .lines()
        .find(|l| l.split_whitespace().nth(2) == Some(&stuck.to_string()))
        .unwrap_or_else(|| panic!("no row for worker {stuck}:\n{table}"));
    let heartbeat = line.split_whitespace().nth(5).expect("heartbeat column");
    let secs: f64 = heartbeat
        .strip_suffix('s')
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("heartbeat column {heartbeat:?}:\n{table}"));
    assert!(secs >= 2.0, "heartbeat {heartbeat} in:\n{table}");

    // Once continued, the worker catches up.
    support::signal(stuck, "CONT");
    poll_stats(&d.config, "the continued worker's heartbeat", |s| {
        row_of(s, stuck).unwrap()["heartbeat_age_ms"]
            .as_u64()
            .unwrap()
            < 1500
    });
}

// ---------------------------------------------------------------------------------
// 7. `forkd stats` on bad regions
// ---------------------------------------------------------------------------------

#[test]
fn stats_rejects_missing_foreign_and_other_version_regions() {
    let tmp = TempDir::new();

    let missing = tmp.path().join("missing.shm");
    let (code, out, err) = forkd_stats(&["--shm", missing.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("does not exist"), "{err}");

    let foreign = tmp.path().join("foreign.shm");
    std::fs::write(&foreign, noise(64 * 1024, 7)).unwrap();
    let (code, out, err) = forkd_stats(&["--shm", foreign.to_str().unwrap(), "--json"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("not a forkd stats region"), "{err}");

    // A real region, copied, then with another layout version.
    let d = TestDaemon::builder().routes(ROUTES).start();
    let mut region = std::fs::read(d.dir.path().join("forkd.shm")).unwrap();
    let good = tmp.path().join("copy.shm");
    std::fs::write(&good, &region).unwrap();
    let (code, out, err) = forkd_stats(&["--shm", good.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0, "{err}");
    let copy: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(copy["master"]["pid"].as_i64(), Some(d.pid() as i64));

    region[8..12].copy_from_slice(&99u32.to_le_bytes());
    let other = tmp.path().join("v99.shm");
    std::fs::write(&other, &region).unwrap();
    let (code, out, err) = forkd_stats(&["--shm", other.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("layout version 99"), "{err}");
}

// ---------------------------------------------------------------------------------
// 8. The last state after the master stopped
// ---------------------------------------------------------------------------------

#[test]
fn stats_show_the_last_state_after_the_master_stopped() {
    let mut d = TestDaemon::builder().workers(2).routes(ROUTES).start();
    wait_serving(&d);
    let base = wait_quiet(&d);
    load(d.port, "/index.html", 30, 3);
    for _ in 0..2 {
        assert_eq!(get_close(d.port, "/absent").status, 404);
    }
    let served = poll_stats(&d.config, "32 requests counted", |s| {
        total(s, "requests") == total(&base, "requests") + 32
            && total(s, "connections_handled") == total(s, "connections_accepted")
    });
    assert!(
        d.stop().is_some_and(|s| s.success()),
        "forkd did not stop cleanly"
    );

    let last = stats_json(&d.config);
    assert_eq!(last["master"]["alive"], false, "{last:#}");
    assert_eq!(last["master"]["pid"], served["master"]["pid"]);
    for k in [
        "requests",
        "responses_2xx",
        "responses_4xx",
        "connections_accepted",
        "connections_handled",
        "bytes_in",
        "bytes_out",
        "latency.count",
    ] {
        assert_eq!(total(&last, k), total(&served, k), "totals.{k}");
    }
    assert_eq!(total(&last, "requests"), total(&base, "requests") + 32);
    assert_eq!(
        total(&last, "responses_4xx"),
        total(&base, "responses_4xx") + 2
    );
    // The exited workers' counts were folded into the retired totals.
    assert_eq!(
        counter(&last["retired"], "requests"),
        total(&served, "requests")
    );

    let table = stats_table(&d.config);
    assert!(table.contains("not running"), "{table}");
    assert!(
        table.contains(&format!("requests {}", total(&served, "requests"))),
        "{table}"
    );
}

// ---------------------------------------------------------------------------------
// 9. One region, one master
// ---------------------------------------------------------------------------------

#[test]
fn a_second_master_on_the_same_region_is_refused() {
    let d = TestDaemon::builder().routes(ROUTES).start();
    wait_serving(&d);
    let shm = d.dir.path().join("forkd.shm");
    let before = wait_quiet(&d);

    let other = TempDir::new();
    let config2 = support::second_master_config(other.path(), &shm);
    let mut second = forkd_command(&config2)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the second forkd");
    let mut status = None;
    wait_until(SETTLE, || {
        status = second.try_wait().unwrap();
        status.is_some()
    });
    let Some(status) = status else {
        let _ = Command::new("kill")
            .arg("-INT")
            .arg(second.id().to_string())
            .status();
        let _ = second.wait();
        panic!("the second master was not refused: it kept running");
    };
    let mut stderr = String::new();
    let _ = second.stderr.take().unwrap().read_to_string(&mut stderr);
    let log = std::fs::read_to_string(other.path().join("error.log")).unwrap_or_default();
    assert!(!status.success(), "the second master exited with {status}");
    assert!(
        format!("{stderr}{log}").contains(&format!("in use by the forkd master {}", d.pid())),
        "stderr: {stderr}\nerror log: {log}"
    );
    assert!(!other.path().join("second.pid").exists());

    // The first one keeps serving, and keeps counting in the same region.
    assert_eq!(d.get("/healthz").status, 200);
    assert_eq!(get_close(d.port, "/index.html").status, 200);
    let after = poll_stats(&d.config, "the first master still counting", |s| {
        total(s, "requests") == total(&before, "requests") + 2
    });
    assert_eq!(after["master"]["pid"].as_i64(), Some(d.pid() as i64));
    assert_eq!(after["master"]["alive"], true);
    assert_eq!(
        after["master"]["start_time_ms"],
        before["master"]["start_time_ms"]
    );
}

// ---------------------------------------------------------------------------------
// The `-c FILE` global option before the subcommand
// ---------------------------------------------------------------------------------

/// `forkd -c FILE stats --json`: `-c` is the global option of every other form
/// (`forkd -c FILE -s reload`), and the harness's `run_forkd` puts it first.
#[test]
fn stats_accepts_the_config_option_before_the_subcommand() {
    let d = TestDaemon::builder().routes(ROUTES).start();
    let (code, out, err) = run_forkd(&d.config, &["stats", "--json"]);
    assert_eq!(code, 0, "forkd -c FILE stats --json: {err}");
    let v: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["master"]["pid"].as_i64(), Some(d.pid() as i64));
}

// ---------------------------------------------------------------------------------
// Interim responses
// ---------------------------------------------------------------------------------

/// `Expect: 100-continue`: the interim `100 Continue` counts as a 1xx response (the
/// layout: "Final and interim responses by class"), not as a request.
#[test]
fn interim_100_continue_counts_as_1xx_but_not_as_a_request() {
    let d = TestDaemon::builder().routes(ROUTES).start();
    wait_serving(&d);
    let before = wait_quiet(&d);

    let mut c = Counted::new(d.port);
    // A GET with a body: the route will answer it, so the 100 comes (a POST would be
    // refused with 405 at once, instead of the 100).
    c.send(
        b"GET /index.html HTTP/1.1\r\nHost: localhost\r\nExpect: 100-continue\r\n\
          Content-Length: 5\r\nConnection: close\r\n\r\n",
    );
    let interim = c.response(false);
    assert_eq!(interim.status, 100, "{}", interim.head);
    c.send(b"hello");
    let r = c.response(false);
    assert_eq!(r.status, 200, "{}", r.head);
    let (written, read) = c.finish();

    let expected: [(&str, u64); 9] = [
        ("requests", 1),
        ("responses_1xx", 1),
        ("responses_2xx", 1),
        ("responses_4xx", 0),
        ("connections_accepted", 1),
        ("connections_handled", 1),
        ("bytes_in", written),
        ("bytes_out", read),
        ("latency.count", 1),
    ];
    wait_deltas(&d, &before, &expected);
}

// ---------------------------------------------------------------------------------
// Reloads
// ---------------------------------------------------------------------------------

/// Rewrites the `workers` count of the config file at `config` (a change the running
/// workers cannot adopt: it takes a new generation of workers).
fn set_workers(config: &Path, n: usize) {
    let text = std::fs::read_to_string(config).unwrap();
    let start = text.find("workers: Count(").expect("a workers key") + "workers: Count(".len();
    let end = start + text[start..].find(')').unwrap();
    std::fs::write(config, format!("{}{n}{}", &text[..start], &text[end..])).unwrap();
}

/// Waits until configuration generation `generation` is in force after `reloads_ok`
/// reloads, served by exactly `workers` workers, every other row retired ("exited").
fn wait_generation(d: &TestDaemon, reloads_ok: u64, generation: u64, workers: usize) -> Value {
    poll_stats(
        &d.config,
        &format!("generation {generation} served by {workers} workers"),
        |s| {
            let pids: HashSet<i32> = d.workers().into_iter().collect();
            let serving: HashSet<i32> = rows(s)
                .iter()
                .filter(|w| w["state"] == "serving" && w["generation"] == generation)
                .filter_map(|w| w["pid"].as_i64().map(|p| p as i32))
                .collect();
            s["master"]["reloads_ok"] == reloads_ok
                && s["master"]["config_generation"] == generation
                && serving.len() == workers
                && serving == pids
                && rows(s).iter().all(|w| {
                    // A row of the old generation still marked serving belongs to
                    // a worker the master has not reaped and folded yet.
                    (w["state"] == "serving" && w["generation"] == generation)
                        || (w["state"] == "exited"
                            && COUNTERS.iter().all(|k| counter(&w["counters"], k) == 0))
                })
        },
    )
}

#[test]
fn reloads_are_counted_and_retired_workers_fold_into_retired() {
    let d = TestDaemon::builder()
        .workers(2)
        .routes(ROUTES)
        .top(r#"drain_timeout: "3s","#)
        .start();
    wait_serving(&d);
    load(d.port, "/index.html", 40, 2);
    let before = wait_quiet(&d);
    let first_pids: HashSet<i32> = d.workers().into_iter().collect();
    assert_eq!(before["master"]["config_generation"], 1);

    // Same file: adopted in place, by the same workers, which keep their counts.
    d.signal("HUP");
    let adopted = wait_generation(&d, 1, 2, 2);
    assert_eq!(d.workers().into_iter().collect::<HashSet<_>>(), first_pids);
    assert_eq!(adopted["master"]["reloads_failed"], 0);
    assert_eq!(
        adopted["master"]["respawns"], 0,
        "a reload is not a respawn"
    );
    for &pid in &first_pids {
        assert_eq!(
            counter(&row_of(&adopted, pid).unwrap()["counters"], "requests"),
            counter(&row_of(&before, pid).unwrap()["counters"], "requests"),
            "worker {pid}"
        );
    }
    assert_eq!(counter(&adopted["retired"], "requests"), 0);

    // Three workers: a new generation; the old one drains, exits, and is folded.
    set_workers(&d.config, 3);
    d.signal("HUP");
    let after = wait_generation(&d, 2, 3, 3);
    assert!(d.workers().iter().all(|p| !first_pids.contains(p)));
    assert_eq!(after["master"]["respawns"], 0, "a reload is not a respawn");
    for &pid in &first_pids {
        if let Some(w) = row_of(&after, pid) {
            for k in COUNTERS {
                assert_eq!(counter(&w["counters"], k), 0, "old worker {pid}: {k}");
            }
        }
    }
    for k in [
        "requests",
        "responses_2xx",
        "bytes_in",
        "bytes_out",
        "latency.count",
    ] {
        assert_eq!(total(&after, k), total(&before, k), "totals.{k}");
        assert_eq!(
            counter(&after["retired"], k),
            total(&before, k),
            "retired.{k}: the old generation's counts"
        );
    }
    assert_eq!(get_close(d.port, "/index.html").status, 200);
    poll_stats(&d.config, "the new generation counting", |s| {
        total(s, "requests") == total(&before, "requests") + 1
    });

    // A broken file: counted as a failed reload, with its error; nothing changes.
    let good = std::fs::read_to_string(&d.config).unwrap();
    std::fs::write(&d.config, "(workers: Count(2), this is not RON").unwrap();
    d.signal("HUP");
    // The file no longer loads: read the region by path.
    let shm = d.dir.path().join("forkd.shm");
    let failed = poll(
        || shm_json(&shm),
        "a failed reload",
        |s| s["master"]["reloads_failed"] == 1,
    );
    std::fs::write(&d.config, good).unwrap();
    assert_eq!(failed["master"]["reloads_ok"], 2);
    assert_eq!(failed["master"]["config_generation"], 3);
    let error = failed["master"]["last_reload_error"].as_str().unwrap();
    assert!(error.contains("forkd.ron"), "last_reload_error: {error:?}");
    assert_eq!(get_close(d.port, "/index.html").status, 200);
}

// ---------------------------------------------------------------------------------
// --watch
// ---------------------------------------------------------------------------------

#[test]
fn stats_watch_repeats_json_readings() {
    let d = TestDaemon::builder().routes(ROUTES).start();
    wait_serving(&d);
    let mut watch = Command::new(BIN)
        .args(["stats", "--shm"])
        .arg(d.dir.path().join("forkd.shm"))
        .args(["--json", "--watch=100ms"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn forkd stats --watch");
    let stdout = watch.stdout.take().unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stdout));
    let mut next = || -> Value {
        let line = lines.next().expect("a reading").expect("UTF-8");
        serde_json::from_str(&line).expect("one JSON document per line")
    };
    let first = next();
    assert_eq!(first["master"]["pid"].as_i64(), Some(d.pid() as i64));
    assert_eq!(get_close(d.port, "/index.html").status, 200);
    // Later readings see the request: the region is read again each time.
    let mut seen = vec![total(&first, "requests")];
    while seen.len() < 200 && *seen.last().unwrap() < seen[0] + 1 {
        seen.push(total(&next(), "requests"));
    }
    let _ = watch.kill();
    let _ = watch.wait();
    assert!(seen.windows(2).all(|w| w[0] <= w[1]), "{seen:?}");
    assert_eq!(*seen.last().unwrap(), seen[0] + 1, "{seen:?}");
}

/// `forkd stats --watch` over the region of `d`, its stdout `stdout`.
fn spawn_watch(d: &TestDaemon, json: bool, stdout: Stdio) -> std::process::Child {
    let mut cmd = Command::new(BIN);
    cmd.args(["stats", "--shm"])
        .arg(d.dir.path().join("forkd.shm"))
        .arg("--watch=20ms");
    if json {
        cmd.arg("--json");
    }
    cmd.stdin(Stdio::null())
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn forkd stats --watch")
}

/// A watch whose consumer goes away (`| head -1`) ends, quietly and with 0, at its
/// next reading, in both renderings. It used to ignore `EPIPE` and run for ever.
#[test]
fn stats_watch_ends_when_its_reader_goes_away() {
    let d = TestDaemon::builder().routes(ROUTES).start();
    wait_serving(&d);
    for json in [true, false] {
        let mut watch = spawn_watch(&d, json, Stdio::piped());
        let mut first = String::new();
        let mut out = std::io::BufReader::new(watch.stdout.take().unwrap());
        std::io::BufRead::read_line(&mut out, &mut first).expect("a reading");
        assert!(!first.is_empty());
        drop(out);
        let status = wait_child(&mut watch, Duration::from_secs(30));
        if status.is_none() {
            let _ = watch.kill();
            let _ = watch.wait();
        }
        let status = status.unwrap_or_else(|| panic!("json {json}: still running"));
        assert!(status.success(), "json {json}: {status}");
        let mut err = String::new();
        let _ = std::io::Read::read_to_string(&mut watch.stderr.take().unwrap(), &mut err);
        assert!(err.is_empty(), "json {json}: {err}");
    }
}

/// A watch that cannot write (a full disk, here `/dev/full`) says so and ends with 1.
#[test]
fn stats_watch_ends_when_its_output_fails() {
    let d = TestDaemon::builder().routes(ROUTES).start();
    wait_serving(&d);
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full");
    let mut watch = spawn_watch(&d, true, Stdio::from(full));
    let status = wait_child(&mut watch, Duration::from_secs(30));
    if status.is_none() {
        let _ = watch.kill();
        let _ = watch.wait();
    }
    let status = status.expect("still running");
    assert_eq!(status.code(), Some(1));
    let mut err = String::new();
    let _ = std::io::Read::read_to_string(&mut watch.stderr.take().unwrap(), &mut err);
    assert!(err.contains("writing to stdout failed"), "{err}");
}

// ---------------------------------------------------------------------------------
// Counters never go backwards, in either rendering, across reloads
// ---------------------------------------------------------------------------------

/// A Prometheus counter that drops reads as a counter reset to `rate()` and
/// `increase()`. While reloads retire old generations of workers, a scraper reads `/metrics` and
/// `/status` back to back: `forkd_requests_total` summed over `worker` (which includes
/// `worker="retired"`) and the JSON `totals.requests` must never decrease.
#[test]
fn request_totals_never_go_backwards_across_reloads() {
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    use std::sync::Mutex;

    let d = TestDaemon::builder()
        .workers(2)
        .routes(ROUTES)
        .top(r#"drain_timeout: "3s","#)
        .start();
    wait_serving(&d);
    load(d.port, "/index.html", 40, 2);
    let done = AtomicBool::new(false);
    let prometheus_drops = Mutex::new(Vec::new());
    let json_drops = Mutex::new(Vec::new());
    let mut scrapes = 0;
    const RELOADS: u64 = 30;
    /// Stops the scraper however the reload loop ends (a panic included).
    struct Done<'a>(&'a AtomicBool);
    impl Drop for Done<'_> {
        fn drop(&mut self) {
            self.0.store(true, Relaxed);
        }
    }
    std::thread::scope(|scope| {
        let stop_scraper = Done(&done);
        let scraper = scope.spawn(|| {
            let (mut last_prometheus, mut last_json) = (0u64, 0u64);
            let mut n = 0;
            while !done.load(Relaxed) || n < 2 {
                let r = get_close(d.port, "/metrics");
                assert_eq!(r.status, 200, "{}", r.head);
                let sum: u64 = r
                    .body_str()
                    .lines()
                    .filter(|l| l.starts_with("forkd_requests_total{"))
                    .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
                    .sum();
                if sum < last_prometheus {
                    prometheus_drops
                        .lock()
                        .unwrap()
                        .push((last_prometheus, sum));
                }
                last_prometheus = sum;
                let r = get_close(d.port, "/status");
                assert_eq!(r.status, 200, "{}", r.head);
                let v: Value = serde_json::from_slice(&r.body).expect("JSON");
                let requests = total(&v, "requests");
                if requests < last_json {
                    json_drops.lock().unwrap().push((last_json, requests));
                }
                last_json = requests;
                n += 1;
            }
            n
        });
        // Alternating 3 and 2 workers: every reload starts a new generation and
        // retires the old one.
        for i in 1..=RELOADS {
            let workers = if i % 2 == 1 { 3 } else { 2 };
            set_workers(&d.config, workers);
            d.signal("HUP");
            wait_generation(&d, i, i + 1, workers);
        }
        drop(stop_scraper);
        scrapes = scraper.join().unwrap();
    });
    let json_drops = json_drops.into_inner().unwrap();
    let prometheus_drops = prometheus_drops.into_inner().unwrap();
    assert!(
        json_drops.is_empty(),
        "/status totals.requests went backwards ({} of {scrapes} scrapes, {RELOADS} reloads): \
         {json_drops:?}",
        json_drops.len()
    );
    assert!(
        prometheus_drops.is_empty(),
        "sum(forkd_requests_total) went backwards ({} of {scrapes} scrapes, {RELOADS} reloads): \
         (before, after) {prometheus_drops:?}",
        prometheus_drops.len()
    );
}

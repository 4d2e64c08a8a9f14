//! The adaptive concurrency limit of proxied routes (`overload` on an upstream), end
//! to end: Enforce sheds `Low` with 503 and `Retry-After` at once while `Critical`
//! passes, over all workers; DryRun never rejects but counts; a reload turns it on
//! and off without a restart; the stats show the limit within its bounds.
//!
//! Requests are held in flight by a gate in the test upstream (opened by the test),
//! so what is in flight is known exactly and nothing depends on timing.

mod support;

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use support::gate::Gate;
use support::upstream::{Reply, Settings, TestUpstream};
use support::*;

const ROUTES: &str = r#"(prefix: "/healthz", handler: Liveness),
            (prefix: "/readyz", handler: Readiness),
            (prefix: "/low", handler: Proxy(upstream: "app"), priority: Low),
            (prefix: "/normal", handler: Proxy(upstream: "app")),
            (prefix: "/critical", handler: Proxy(upstream: "app"), priority: Critical),"#;

/// A limit fixed at 2 (min = max): `Low` and `Normal` may have 1 in flight,
/// `Critical` 2, over both workers.
fn builder(up: &TestUpstream, mode: &str) -> Builder {
    TestDaemon::builder()
        .workers(2)
        .top(&upstreams(up, mode))
        .routes(ROUTES)
}

fn upstreams(up: &TestUpstream, mode: &str) -> String {
    let overload = match mode {
        "none" => String::new(),
        mode => format!(
            "overload: Some((mode: {mode}, sample_every: \"50ms\", min_limit: 2, max_limit: 2)),"
        ),
    };
    format!(
        "upstreams: {{ \"app\": (servers: [\"{}\"], keepalive: 0, {overload}) }},",
        up.addr()
    )
}

/// Sends a GET on a connection of its own and leaves the answer to be read.
fn send(d: &TestDaemon, path: &str) -> Conn {
    let mut c = Conn::connect_timeout(d.port, Duration::from_secs(60)).unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n");
    c.send(req.as_bytes()).unwrap();
    c
}

/// Waits until `n` requests reached the upstream.
fn wait_held(gate: &Gate, n: usize) {
    assert!(
        wait_until(Duration::from_secs(30), || gate.arrived() >= n),
        "the upstream got {} requests, not {n}",
        gate.arrived()
    );
}

/// The group's entry in `forkd stats --json`.
fn group(d: &TestDaemon) -> serde_json::Value {
    let stats = stats_json(&d.config);
    stats["overload"]
        .as_array()
        .and_then(|a| a.iter().find(|g| g["upstream"] == "app").cloned())
        .unwrap_or_else(|| panic!("no overload entry in {}", stats["overload"]))
}

/// The exact 503 an overloaded upstream's request gets, but for its `Date`.
const SHED_HEAD: &str = "HTTP/1.1 503 Service Unavailable\r\nServer: forkd\r\nDate: DATE\r\nContent-Type: text/html\r\nContent-Length: 119\r\nRetry-After: 1\r\n\r\n";
const SHED_BODY: &[u8] = b"<html><head><title>503 Service Unavailable</title></head><body><h1>503 Service Unavailable</h1><hr>forkd</body></html>\n";

/// Reads a response: its head as received with the `Date` value replaced, its body.
fn raw_head(c: &mut Conn) -> (String, Vec<u8>) {
    let head = c.read_head().unwrap();
    let body = c.read_body(head.content_length().unwrap()).unwrap();
    let text = head
        .head
        .split("\r\n")
        .map(|line| match line.split_once(": ") {
            Some((name, _)) if name.eq_ignore_ascii_case("Date") => format!("{name}: DATE"),
            _ => line.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\r\n");
    (text, body)
}

#[test]
fn enforce_sheds_low_at_once_with_503_and_retry_after_while_critical_passes() {
    let gate = Gate::closed();
    let up = gate.upstream();
    let d = builder(&up, "Enforce").start();
    let mut low = send(&d, "/low/1");
    wait_held(&gate, 1);
    // Over Low's share while the first is held: refused now, not queued.
    let mut shed = send(&d, "/low/2");
    let (head, body) = raw_head(&mut shed);
    assert_eq!(head, SHED_HEAD);
    assert_eq!(body, SHED_BODY);
    // The connection stays usable (the 503 is an answer).
    shed.send(b"GET /normal/x HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    assert_eq!(
        shed.read_head().unwrap().status,
        503,
        "Normal's share is taken too"
    );
    // Critical keeps its reserve: admitted beside the held Low request.
    let mut critical = send(&d, "/critical/1");
    wait_held(&gate, 2);
    // The limit (2) is reached over both workers: even Critical is refused now.
    let mut over = send(&d, "/critical/2");
    assert_eq!(raw_head(&mut over).0, SHED_HEAD);
    assert_eq!(gate.arrived(), 2, "no shed request reached the upstream");
    gate.set(true);
    for (c, body) in [(&mut low, "ok /low/1"), (&mut critical, "ok /critical/1")] {
        let r = c.response().unwrap();
        assert_eq!((r.status, r.body_str().as_str()), (200, body));
    }
    let g = group(&d);
    assert_eq!(g["mode"], "enforce", "{g}");
    assert_eq!(g["shed"]["low"], 1, "{g}");
    assert_eq!(g["shed"]["normal"], 1, "{g}");
    assert_eq!(g["shed"]["critical"], 1, "{g}");
    assert_eq!(g["dry_run"]["low"], 0, "{g}");
    assert!(
        wait_until(Duration::from_secs(10), || group(&d)["inflight"] == 0),
        "every admitted request left the count: {}",
        group(&d)
    );
}

#[test]
fn dry_run_never_rejects_but_counts_what_it_would_have_shed() {
    let gate = Gate::closed();
    let up = gate.upstream();
    let d = builder(&up, "DryRun").start();
    let mut held: Vec<Conn> = (0..4).map(|i| send(&d, &format!("/low/{i}"))).collect();
    held.push(send(&d, "/critical/x"));
    wait_held(&gate, 5);
    gate.set(true);
    for c in &mut held {
        assert_eq!(c.response().unwrap().status, 200);
    }
    let g = group(&d);
    assert_eq!(g["mode"], "dry_run", "{g}");
    // Low may have 1 in flight: the 2nd, 3rd and 4th were over; Critical (cap 2)
    // came with 4 in flight.
    assert_eq!(g["dry_run"]["low"], 3, "{g}");
    assert_eq!(g["dry_run"]["critical"], 1, "{g}");
    assert_eq!(g["shed"]["low"], 0, "{g}");
    assert_eq!(g["shed"]["critical"], 0, "{g}");
    assert!(d.wait_for_log("DryRun: admitted", Duration::from_secs(10)));
}

/// Sends `n` Low requests at once (each on its own connection) while the upstream
/// holds what reaches it; once every request is either held there or answered, opens
/// the gate. Returns the statuses, sorted.
fn low_statuses(d: &TestDaemon, gate: &Gate, n: usize) -> Vec<u16> {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    gate.set(false);
    let before = gate.arrived();
    let answered = AtomicUsize::new(0);
    let mut statuses: Vec<u16> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..n)
            .map(|i| {
                let mut c = send(d, &format!("/low/{i}"));
                let answered = &answered;
                s.spawn(move || {
                    let status = c.response().unwrap().status;
                    answered.fetch_add(1, SeqCst);
                    status
                })
            })
            .collect();
        let settled = wait_until(Duration::from_secs(30), || {
            gate.arrived() - before + answered.load(SeqCst) >= n
        });
        gate.set(true);
        assert!(settled, "requests neither held nor answered");
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    statuses.sort();
    statuses
}

#[test]
fn a_reload_turns_the_limit_on_and_off_without_a_restart() {
    let gate = Gate::open_later();
    let up = gate.upstream();
    let mut d = builder(&up, "Off").start();
    let master = d.pid();
    let workers = d.workers();
    assert_eq!(low_statuses(&d, &gate, 3), [200, 200, 200]);
    assert_eq!(group_or_none(&d), None, "Off: nothing counted");

    let enforce = builder(&up, "Enforce").config_text(d.port);
    write_config(&d.config, &enforce);
    let (code, out, err) = d.ctl(&["-s", "reload"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(low_statuses(&d, &gate, 3), [200, 503, 503]);
    assert!(wait_until(Duration::from_secs(10), || group(&d)["mode"] == "enforce"));

    let off = builder(&up, "Off").config_text(d.port);
    write_config(&d.config, &off);
    let (code, out, err) = d.ctl(&["-s", "reload"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(low_statuses(&d, &gate, 3), [200, 200, 200]);
    assert!(wait_until(Duration::from_secs(10), || group(&d)["mode"] == "off"));

    assert_eq!(d.pid(), master, "same master");
    let mut now = d.workers();
    now.sort();
    let mut before = workers;
    before.sort();
    assert_eq!(now, before, "same workers: adopted in place");
    d.stop();
}

fn group_or_none(d: &TestDaemon) -> Option<serde_json::Value> {
    let stats = stats_json(&d.config);
    stats["overload"]
        .as_array()
        .and_then(|a| a.iter().find(|g| g["upstream"] == "app").cloned())
}

impl Gate {
    /// A gate that holds requests only while a test closes it.
    fn open_later() -> Gate {
        let g = Gate::closed();
        g.set(true);
        g
    }
}

/// Under load on an upstream of fixed capacity the controller moves the limit, which
/// stays within its bounds, and every request is answered 200 or shed with 503.
#[test]
fn under_load_the_stats_show_a_limit_within_its_bounds() {
    let capacity = Arc::new((Mutex::new(0usize), Condvar::new()));
    let cap = capacity.clone();
    let up = TestUpstream::start(Settings::default(), move |_| {
        let (busy, cv) = &*cap;
        let mut n = busy.lock().unwrap();
        while *n >= 4 {
            n = cv.wait(n).unwrap();
        }
        *n += 1;
        drop(n);
        std::thread::sleep(Duration::from_millis(5));
        *busy.lock().unwrap() -= 1;
        cv.notify_one();
        Reply::ok(b"ok")
    });
    let top = format!(
        "upstreams: {{ \"app\": (servers: [\"{}\"], overload: Some((mode: Enforce, sample_every: \"20ms\", min_limit: 3, max_limit: 40))) }},",
        up.addr()
    );
    let d = TestDaemon::builder()
        .workers(2)
        .top(&top)
        .routes(&format!(
            "{ROUTES}\n(prefix: \"/metrics\", handler: Metrics),"
        ))
        .start();
    let port = d.port;
    let round = || -> Vec<(u64, u64, Vec<String>)> {
        std::thread::scope(|s| {
            let threads: Vec<_> = (0..16)
                .map(|i| {
                    s.spawn(move || {
                        let (mut ok, mut shed, mut other) = (0, 0, Vec::new());
                        let path = if i % 4 == 0 { "/critical/x" } else { "/low/x" };
                        let mut conn: Option<Conn> = None;
                        for _ in 0..60 {
                            let c = match conn.as_mut() {
                                Some(c) => c,
                                None => conn.insert(Conn::connect(port).unwrap()),
                            };
                            let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n");
                            match c.exchange(req.as_bytes()) {
                                Ok(r) if r.status == 200 => ok += 1,
                                Ok(r) if r.status == 503 => {
                                    assert_eq!(r.header("Retry-After"), Some("1"));
                                    shed += 1
                                }
                                Ok(r) => other.push(format!("status {}", r.status)),
                                Err(e) => {
                                    other.push(e);
                                    conn = None;
                                }
                            }
                        }
                        (ok, shed, other)
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        })
    };
    // Rounds of load until the controller has measured a baseline (the first
    // measurement waits for 50 requests admitted under it, however long that takes).
    let (mut ok, mut shed, mut rounds) = (0, 0, 0);
    let started = std::time::Instant::now();
    let g = loop {
        let results = round();
        rounds += 1;
        ok += results.iter().map(|r| r.0).sum::<u64>();
        shed += results.iter().map(|r| r.1).sum::<u64>();
        let other: Vec<&String> = results.iter().flat_map(|r| &r.2).collect();
        assert!(other.is_empty(), "{other:?}");
        let g = group(&d);
        let limit = g["limit"].as_u64().unwrap();
        assert!((3..=40).contains(&limit), "{g}");
        if g["baseline_us"].as_u64().unwrap() > 0 {
            break g;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no baseline measured after {rounds} rounds: {g}"
        );
    };
    assert_eq!(ok + shed, rounds * 16 * 60);
    assert!(ok > 0);
    let counted = ["critical", "normal", "low"]
        .iter()
        .map(|p| g["shed"][p].as_u64().unwrap())
        .sum::<u64>();
    assert_eq!(counted, shed, "{g}");
    let metrics = d.get("/metrics").body_str();
    assert!(
        metrics.contains("forkd_overload_limit{upstream=\"app\",mode=\"enforce\"} "),
        "{metrics}"
    );
    assert!(metrics.contains("forkd_overload_shed_total{upstream=\"app\",priority=\"low\"}"));
    let (code, table, _) = d.ctl(&["stats"]);
    assert_eq!(code, 0);
    assert!(
        table.contains("overload") && table.contains("enforce"),
        "{table}"
    );
}

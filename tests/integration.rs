//! Cross-feature end-to-end tests, written after six features were merged at once:
//! the proxy over TLS with balancing and failover, active checks with backups and
//! passive health, the adaptive limit with failover and clients that leave (its
//! tickets and the servers' in-flight counts given back whatever way an exchange
//! ends), keep-alive after forkd's own 502/503/504 on plain and TLS connections, and
//! the region's areas readable by `forkd stats --json` across reload and upgrade.

#[path = "support/backend.rs"]
mod backend;
#[allow(dead_code)]
#[path = "support/checked_upstream.rs"]
mod checked_upstream;
mod support;
#[allow(dead_code)]
#[path = "support/tls.rs"]
mod tls_support;

use backend::Backend;
use checked_upstream::CheckedUpstream;
use serde_json::Value;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::gate::Gate;
use support::upstream::{Reply, Settings, TestUpstream};
use support::*;
use tls_support::*;

const SETTLE: Duration = Duration::from_secs(30);

/// The TLS server's routes in most tests: everything proxied to upstream `app`.
const PROXY_APP: &str = r#"(prefix: "/", handler: Proxy(upstream: "app"))"#;

/// Adds a TLS server (`a.test`, certificate issued by `ca`) on a second reserved port
/// to the prepared daemon's config, with `routes`; returns that port.
fn add_tls_server(d: &mut TestDaemon, ca: &TestCa, routes: &str) -> u16 {
    let tls_port = d.reserve_port();
    ca.issue(&["a.test"], 90).write(d.dir.path(), "a");
    let text = std::fs::read_to_string(&d.config).unwrap();
    let at = text.rfind("    )],\n)").expect("the builder's config end");
    let tls = format!(
        r#"    ),
    (
        listen: ["127.0.0.1:{tls_port}"],
        names: ["a.test"],
        access_log: Some(File("access.log")),
        tls: Some((
            certificates: [(cert: "a.pem", key: "a.key")],
            versions: [Tls12, Tls13],
            session_tickets: true,
        )),
        routes: [{routes}],
    )],
)
"#
    );
    std::fs::write(&d.config, format!("{}{tls}", &text[..at])).unwrap();
    tls_port
}

/// Starts a prepared daemon.
fn run(mut d: TestDaemon) -> TestDaemon {
    let cmd = d.command();
    let pid = d.spawn(cmd);
    d.wait_serving(pid);
    d
}

/// The stats row of `server` of upstream `app`.
fn server_row(d: &TestDaemon, server: &str) -> Value {
    upstream_row(&d.config, "app", server)
}

/// The overload entry of upstream `app`.
fn overload_group(d: &TestDaemon) -> Value {
    let stats = stats_json(&d.config);
    stats["overload"]
        .as_array()
        .and_then(|a| a.iter().find(|g| g["upstream"] == "app").cloned())
        .unwrap_or_else(|| panic!("no overload entry in {}", stats["overload"]))
}

/// A port nothing listens on (bound, then closed).
fn refused_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

/// Over TLS, two servers balanced by LeastConn: the upstream is told the client
/// spoke https, and killing one server under keep-alive TLS load fails no GET.
#[test]
fn tls_proxy_with_least_conn_forwards_https_and_a_killed_server_fails_no_get() {
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let s2 = seen.clone();
    let echo = TestUpstream::start(Settings::default(), move |req| {
        let proto = req
            .header("X-Forwarded-Proto")
            .unwrap_or("none")
            .to_string();
        s2.lock().unwrap().push(proto);
        Reply::ok(b"echo")
    });
    let mut victim = Backend::start(Duration::from_millis(1));
    let ca = TestCa::new();
    let mut d = TestDaemon::builder()
        .workers(2)
        .top(&format!(
            r#"upstreams: {{ "app": (servers: ["{}", "{}"], balance: LeastConn, max_fails: 2, fail_timeout: "120s") }},"#,
            echo.addr(),
            victim.addr()
        ))
        .prepare();
    let tls_port = add_tls_server(&mut d, &ca, PROXY_APP);
    let d = run(d);

    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let threads: Vec<_> = (0..3)
        .map(|t| {
            let (stop, ok, failures) = (stop.clone(), ok.clone(), failures.clone());
            let client = ca.client();
            std::thread::spawn(move || {
                let mut conn: Option<TlsConn> = None;
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let c = match conn.as_mut() {
                        Some(c) => c,
                        None => match TlsConn::connect(tls_port, "a.test", &client) {
                            Ok(c) => conn.insert(c),
                            Err(e) => {
                                failures.lock().unwrap().push(e);
                                continue;
                            }
                        },
                    };
                    match c.get("a.test", &format!("/t{t}/{i}")) {
                        Ok(r) if r.status == 200 && !r.closes() => {
                            ok.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(r) if r.status == 200 => {
                            ok.fetch_add(1, Ordering::Relaxed);
                            conn = None;
                        }
                        Ok(r) => {
                            failures.lock().unwrap().push(r.head.clone());
                            conn = None;
                        }
                        Err(e) => {
                            failures.lock().unwrap().push(e);
                            conn = None;
                        }
                    }
                }
            })
        })
        .collect();
    let wait_ok = |more: u64| {
        let until = ok.load(Ordering::Relaxed) + more;
        assert!(
            wait_until(SETTLE, || ok.load(Ordering::Relaxed) >= until),
            "no progress: {:?}",
            failures.lock().unwrap()
        );
    };
    wait_ok(200);
    assert!(
        victim.served() > 0,
        "LeastConn sent the second server nothing"
    );
    victim.kill();
    let victim_addr = victim.addr().to_string();
    assert!(
        wait_until(SETTLE, || server_row(&d, &victim_addr)["state"] == "down"),
        "{:#}",
        server_row(&d, &victim_addr)
    );
    wait_ok(300);
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let failures = failures.lock().unwrap();
    assert!(
        failures.is_empty(),
        "{} failed: {:?}",
        failures.len(),
        &failures[..]
    );
    let seen = seen.lock().unwrap();
    assert!(!seen.is_empty());
    assert!(
        seen.iter().all(|p| p == "https"),
        "X-Forwarded-Proto: {:?}",
        seen.iter().filter(|p| *p != "https").collect::<Vec<_>>()
    );
    for addr in [echo.addr().to_string(), victim_addr] {
        let row = server_row(&d, &addr);
        assert_eq!(row["in_flight"], 0, "{row:#}");
    }
    d.assert_log_clean();
}

/// An upstream group with a fixed limit of 2 (Normal may have 1 in flight) and a
/// server that refuses before the one that answers.
fn overload_daemon(servers: &[String], extra: &str) -> (TestDaemon, TestCa, u16) {
    let ca = TestCa::new();
    let mut d = TestDaemon::builder()
        .workers(2)
        .top(&format!(
            r#"upstreams: {{ "app": (servers: [{}], balance: RoundRobin, keepalive: 0, max_fails: 0, retries: 3, {extra}
                overload: Some((mode: Enforce, sample_every: "50ms", min_limit: 2, max_limit: 2))) }},"#,
            support::upstream::server_list(servers)
        ))
        .routes(
            r#"(prefix: "/healthz", handler: Liveness),
            (prefix: "/", handler: Proxy(upstream: "app")),"#,
        )
        .prepare();
    let tls_port = add_tls_server(&mut d, &ca, PROXY_APP);
    (run(d), ca, tls_port)
}

fn wait_inflight_zero(d: &TestDaemon, what: &str) {
    assert!(
        wait_until(SETTLE, || overload_group(d)["inflight"] == 0),
        "{what}: tickets left in flight: {}",
        overload_group(d)
    );
}

/// Enforce with failover: a shed request never reaches an upstream; a request that
/// failed over (refused, then answered) or failed on every server gives its ticket
/// back; a TLS client that leaves while its request waits is logged 499 and gives its
/// ticket and the server's in-flight count back. Each time the next Normal request is
/// admitted (with a leaked ticket it would be shed: Normal's cap is 1).
#[test]
fn overload_tickets_come_back_after_failover_errors_and_a_tls_client_leaving() {
    let gate = Gate::closed();
    let up = gate.upstream();
    let dead = refused_addr();
    let (d, ca, tls_port) = overload_daemon(&[dead.clone(), up.addr().to_string()], "");

    // Failover: whichever server is tried first, the answer comes from the live one.
    gate.set(true);
    for i in 0..6 {
        let r = d.get(&format!("/f{i}"));
        assert_eq!(r.status, 200, "request {i}: {}", r.head);
    }
    wait_inflight_zero(&d, "after failovers");
    gate.set(false);

    // A request held: the next Normal one is shed at once and reaches no upstream.
    let arrived = gate.arrived();
    let mut held = Conn::connect_timeout(d.port, Duration::from_secs(60)).unwrap();
    held.send(b"GET /held HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    gate.wait_arrived(arrived + 1);
    let shed = d.get("/shed");
    assert_eq!(shed.status, 503, "{}", shed.head);
    assert_eq!(shed.header("Retry-After"), Some("1"), "{}", shed.head);
    // Shed over TLS: the connection stays open for the next request.
    let mut kept = TlsConn::connect(tls_port, "a.test", &ca.client()).unwrap();
    let r = kept.get("a.test", "/shed-tls").unwrap();
    assert_eq!(r.status, 503, "{}", r.head);
    assert!(!r.closes(), "{}", r.head);
    gate.set(true);
    let r = held.response().unwrap();
    assert_eq!(r.status, 200, "{}", r.head);
    let r = kept.get("a.test", "/after-shed").unwrap();
    assert_eq!(
        r.status, 200,
        "after a shed 503 on the same TLS connection: {}",
        r.head
    );
    assert!(
        !up.received().iter().any(|r| r.path().starts_with("/shed")),
        "a shed request reached the upstream"
    );
    wait_inflight_zero(&d, "after the held request");
    gate.set(false);

    // A TLS client leaves while its request waits on the upstream: 499.
    let arrived = gate.arrived();
    let mut c = TlsConn::connect(tls_port, "a.test", &ca.client()).unwrap();
    c.send(b"GET /leaving HTTP/1.1\r\nHost: a.test\r\n\r\n")
        .unwrap();
    gate.wait_arrived(arrived + 1);
    drop(c);
    assert!(
        d.wait_for_access_log("\"GET /leaving HTTP/1.1\" 499", SETTLE),
        "{}",
        d.access_log()
    );
    wait_inflight_zero(&d, "after a TLS client left");
    let row = server_row(&d, &up.addr().to_string());
    assert_eq!(row["in_flight"], 0, "{row:#}");
    gate.set(true);
    let r = d.get("/after-499");
    assert_eq!(
        r.status, 200,
        "the next Normal request after a 499: {}",
        r.head
    );

    // Every server fails: 502, and the ticket comes back.
    drop(up);
    for i in 0..3 {
        let r = d.get(&format!("/gone{i}"));
        assert_eq!(r.status, 502, "request {i}: {}", r.head);
    }
    wait_inflight_zero(&d, "after 502s");
    let g = overload_group(&d);
    assert_eq!(g["shed"]["normal"], 2, "{g}");
    d.assert_log_clean();
}

/// Active checks put the primary Down, so the backup serves; the backup dies and
/// passive health marks it down: 503 with Retry-After. The stats say both: the
/// primary's check verdict `down`, the backup's passive state `down`.
#[test]
fn checks_down_and_a_passively_failed_backup_give_503_and_coherent_stats() {
    let primary = CheckedUpstream::start("primary", "127.0.0.1");
    let mut backup = Backend::start(Duration::ZERO);
    let (lp, lb) = (primary.addr.to_string(), backup.addr().to_string());
    let d = TestDaemon::builder()
        .workers(2)
        .top(&format!(
            r#"upstreams: {{ "app": (servers: ["{lp}", (addr: "{lb}", backup: true)], keepalive: 4, max_fails: 1, fail_timeout: "60s", retries: 1,
                health_check: Some((path: "/healthz", interval: "300ms", timeout: "300ms", rise: 2, fall: 2))) }},"#
        ))
        .routes(
            r#"(prefix: "/healthz", handler: Liveness),
            (prefix: "/", handler: Proxy(upstream: "app")),"#,
        )
        .start();
    let verdict = |s: &str| server_row(&d, s)["health"]["verdict"].clone();
    assert!(
        wait_until(SETTLE, || verdict(&lp) == "up"),
        "{:#}",
        server_row(&d, &lp)
    );
    for i in 0..5 {
        let r = d.get(&format!("/p{i}"));
        assert_eq!(r.status, 200, "{}", r.head);
        assert_eq!(r.body_str(), "primary\n");
    }

    primary.set_health(500);
    assert!(
        wait_until(SETTLE, || verdict(&lp) == "down"),
        "{:#}",
        server_row(&d, &lp)
    );
    let before = primary.client_requests();
    for i in 0..10 {
        let r = d.get(&format!("/b{i}"));
        assert_eq!(r.status, 200, "{}", r.head);
        assert!(
            r.head
                .contains(&format!("X-Backend: {}", backup.addr().port())),
            "{}",
            r.head
        );
    }
    assert_eq!(
        primary.client_requests(),
        before,
        "a server Down by its checks was sent requests"
    );

    backup.kill();
    let first = d.get("/x");
    assert!(matches!(first.status, 502 | 503), "{}", first.head);
    let r = d.get("/y");
    assert_eq!(r.status, 503, "{}", r.head);
    let retry: u64 = r
        .header("Retry-After")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no Retry-After: {}", r.head));
    assert!(retry >= 1, "{}", r.head);
    assert_eq!(primary.client_requests(), before);

    let p = server_row(&d, &lp);
    let b = server_row(&d, &lb);
    assert_eq!(p["health"]["verdict"], "down", "{p:#}");
    assert_eq!(b["state"], "down", "{b:#}");
    assert_eq!(b["marked_down"], 1, "{b:#}");
    for row in [&p, &b] {
        assert_eq!(row["in_flight"], 0, "{row:#}");
    }
    // The primary was never failed by a client request: its passive state is not
    // `down` (the checks' verdict alone keeps it out).
    assert_eq!(p["marked_down"], 0, "{p:#}");
}

/// After forkd's own 502, 504 and 503 a keep-alive client keeps its connection and
/// the next request on it is answered, on plain and TLS connections alike.
#[test]
fn keep_alive_survives_forkds_own_502_504_and_503_on_plain_and_tls() {
    let up = TestUpstream::start(Settings::default(), |req| match req.path() {
        "/slow" => Reply::ok(b"too late").delayed(Duration::from_secs(3)),
        _ => Reply::ok(b"quick"),
    });
    // Two servers: an upstream's only server is never marked down.
    let (dead, dead2) = (refused_addr(), refused_addr());
    let ca = TestCa::new();
    let mut d = TestDaemon::builder()
        .top(&format!(
            r#"upstreams: {{
                "slow": (servers: ["{}"], read_timeout: "300ms", retries: 0),
                "dead": (servers: ["{dead}", "{dead2}"], retries: 1, max_fails: 1, fail_timeout: "120s"),
            }},"#,
            up.addr()
        ))
        .routes(
            r#"(prefix: "/healthz", handler: Liveness),
            (prefix: "/dead", handler: Proxy(upstream: "dead")),
            (prefix: "/", handler: Proxy(upstream: "slow")),"#,
        )
        .prepare();
    let tls_port = add_tls_server(
        &mut d,
        &ca,
        r#"(prefix: "/dead", handler: Proxy(upstream: "dead")), (prefix: "/", handler: Proxy(upstream: "slow"))"#,
    );
    let d = run(d);

    // Plain: the first /dead is a 502 (both refused, marked down), then 503 (all down).
    let mut s = d.connect();
    let mut plain = |path: &str| {
        std::io::Write::write_all(
            &mut s,
            format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes(),
        )
        .unwrap();
        read_response(&mut s, false)
            .unwrap_or_else(|| panic!("no answer to {path} on the kept connection"))
    };
    for (path, want) in [
        ("/dead", 502),
        ("/quick", 200),
        ("/dead", 503),
        ("/quick", 200),
        ("/slow", 504),
        ("/quick", 200),
    ] {
        let r = plain(path);
        assert_eq!(r.status, want, "plain {path}: {}", r.head);
        assert!(!r.closes(), "plain {path}: {}", r.head);
    }
    let mut c = TlsConn::connect(tls_port, "a.test", &ca.client()).unwrap();
    for (path, want) in [
        ("/dead", 503),
        ("/quick", 200),
        ("/slow", 504),
        ("/quick", 200),
    ] {
        let r = c
            .get("a.test", path)
            .unwrap_or_else(|e| panic!("TLS {path}: {e}"));
        assert_eq!(r.status, want, "TLS {path}: {}", r.head);
        assert!(!r.closes(), "TLS {path}: {}", r.head);
    }
}

/// Every area of the region exists (TLS certificates, upstream state, checks,
/// overload): `forkd stats --json` reads them all, and still does after a reload and
/// a binary upgrade, with no layout complaint in the log.
#[test]
fn stats_read_every_area_across_reload_and_upgrade() {
    let up = CheckedUpstream::start("a", "127.0.0.1");
    let ca = TestCa::new();
    let mut d = TestDaemon::builder()
        .workers(2)
        .own_binary()
        .top(&format!(
            r#"upstreams: {{ "app": (servers: ["{}"], keepalive: 4,
                health_check: Some((path: "/healthz", interval: "300ms", timeout: "300ms", rise: 1, fall: 2)),
                overload: Some((mode: DryRun, sample_every: "50ms", min_limit: 2, max_limit: 50))) }},"#,
            up.addr
        ))
        .routes(
            r#"(prefix: "/healthz", handler: Liveness),
            (prefix: "/", handler: Proxy(upstream: "app")),"#,
        )
        .prepare();
    let tls_port = add_tls_server(&mut d, &ca, PROXY_APP);
    let mut d = run(d);
    let addr = up.addr.to_string();
    let coherent = |d: &TestDaemon, what: &str| {
        let json = match try_stats_json(&d.config) {
            Ok(j) => j,
            Err(e) => panic!("{what}: forkd stats --json: {e}"),
        };
        let row = json["upstreams"]
            .as_array()
            .and_then(|a| a.iter().find(|u| u["server"] == addr.as_str()).cloned());
        let ok = row.as_ref().is_some_and(|r| {
            r["state"] == "up" && r["health"]["verdict"] == "up" && r["requests"].as_u64() > Some(0)
        }) && json["overload"].as_array().is_some_and(|a| {
            a.iter()
                .any(|g| g["upstream"] == "app" && g["mode"] == "dry_run")
        }) && json["tls_certificates"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["server"] == "a.test" && c["not_after_s"].as_u64() > Some(0))
        });
        (ok, json)
    };
    let exercise = |d: &TestDaemon, what: &str| {
        let r = d.get("/plain");
        assert_eq!(r.status, 200, "{what}: {}", r.head);
        let (_, r) = tls_get(tls_port, "a.test", &ca.client(), "/tls")
            .unwrap_or_else(|e| panic!("{what}: TLS: {e}\n{}", d.error_log()));
        assert_eq!(r.status, 200, "{what}: {}", r.head);
        let mut last = Value::Null;
        assert!(
            wait_until(SETTLE, || {
                let (ok, json) = coherent(d, what);
                last = json;
                ok
            }),
            "{what}: stats not coherent: {last:#}"
        );
    };
    exercise(&d, "at start");
    // (`d.reload()` would write the builder's config again, without the TLS server.)
    let (code, out, err) = d.ctl(&["-s", "reload"]);
    assert_eq!(code, 0, "reload: {out} {err}");
    exercise(&d, "after reload");
    let old = d.master().unwrap();
    let config = d.config.clone();
    let r = d.ctl_with(&config, &["-s", "upgrade"]);
    assert_eq!(r.code, 0, "forkd -s upgrade: {r:?}\n{}", d.error_log());
    let new = d.master().unwrap();
    assert_ne!(new, old);
    d.adopt_master(new);
    assert!(wait_until(SETTLE, || {
        d.reap_first();
        !alive(old)
    }));
    d.wait_serving(new);
    exercise(&d, "after upgrade");
    // The new master's workers run the checks, and what they find is what the stats
    // read.
    let owner = || {
        try_stats_json(&d.config)
            .ok()
            .and_then(|j| j["checks"]["owner_pid"].as_i64())
            .map(|p| p as i32)
    };
    assert!(
        wait_until(SETTLE, || owner()
            .is_some_and(|p| children_of(new).contains(&p))),
        "the checks owner {:?} is not a worker of the new master {:?}",
        owner(),
        children_of(new)
    );
    up.set_health(500);
    let verdict = || {
        try_stats_json(&d.config).ok().and_then(|j| {
            j["upstreams"].as_array().and_then(|a| {
                a.iter()
                    .find(|u| u["server"] == addr.as_str())
                    .map(|u| u["health"]["verdict"].clone())
            })
        })
    };
    assert!(
        wait_until(SETTLE, || verdict() == Some(Value::from("down"))),
        "a failing check after the upgrade: {:?}",
        verdict()
    );
    let log = d.error_log();
    assert!(!log.to_lowercase().contains("layout"), "{log}");
    d.stop_master();
    d.assert_log_clean();
}

/// Workers killed while holding `Critical` requests: their share of the group's count
/// is given back (in flight 0), and so is their share of the Critical count, or the
/// part of the limit kept for Critical would stay widened for ever (Normal and Low
/// shed early with no Critical traffic at all).
#[test]
fn killed_workers_critical_requests_stop_widening_the_critical_reserve() {
    let gate = Gate::closed();
    let up = gate.upstream();
    let d = TestDaemon::builder()
        .workers(2)
        .expect_alerts()
        .top(&format!(
            r#"upstreams: {{ "app": (servers: ["{}"], keepalive: 0,
                overload: Some((mode: Enforce, sample_every: "50ms", min_limit: 10, max_limit: 10))) }},"#,
            up.addr()
        ))
        .routes(
            r#"(prefix: "/healthz", handler: Liveness),
            (prefix: "/critical", handler: Proxy(upstream: "app"), priority: Critical),
            (prefix: "/", handler: Proxy(upstream: "app")),"#,
        )
        .start();
    let held: Vec<Conn> = (0..4)
        .map(|i| {
            let mut c = Conn::connect_timeout(d.port, Duration::from_secs(60)).unwrap();
            c.send(format!("GET /critical/{i} HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes())
                .unwrap();
            c
        })
        .collect();
    gate.wait_arrived(4);
    // A tenth of 10, plus the 4 Critical in flight, at most half the limit.
    assert!(
        wait_until(SETTLE, || overload_group(&d)["reserve"] == 5),
        "{}",
        overload_group(&d)
    );
    let old = d.workers();
    for &w in &old {
        signal(w, "KILL");
    }
    assert!(d.wait_replaced(&old, 2, SETTLE), "workers not replaced");
    drop(held);
    gate.set(true);
    let mut last = Value::Null;
    assert!(
        wait_until(SETTLE, || {
            last = overload_group(&d);
            last["inflight"] == 0 && last["reserve"] == 1
        }),
        "the dead workers' Critical requests are still counted: {last}"
    );
    let r = d.get("/normal");
    assert_eq!(r.status, 200, "{}", r.head);
}

//! Overload protection, end to end: nobody starves at `worker_connections`, per-client
//! limits shared by the workers.
//!
//! Nothing here asserts timing: deadlines are generous and only bound a broken run.

mod support;

use nix::sys::signal::Signal;
use std::io::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::*;

/// 48 keep-alive clients, each requesting in a loop, on one worker that holds 16
/// connections: each is served, none of their requests fails. Before rotation, 32 of
/// them waited in the accept queue for the whole run.
#[test]
fn at_worker_connections_every_waiting_client_is_served_and_no_request_fails() {
    let d = TestDaemon::builder()
        .workers(1)
        .top("worker_connections: 16,")
        // Unlimited requests per connection: only rotation frees a connection.
        .server("keepalive_requests: 0,")
        .start();
    every_waiting_client_is_served(&d);
}

/// The same with every request proxied: a connection waiting on its upstream is
/// rotated out like one served from disk (it used to keep its place for ever).
#[test]
fn at_worker_connections_proxied_keep_alive_connections_are_rotated_too() {
    let up = support::upstream::TestUpstream::start(support::upstream::Settings::default(), |_| {
        support::upstream::Reply::ok(b"proxied")
    });
    let d = TestDaemon::builder()
        .workers(1)
        .top(&format!(
            "worker_connections: 16, upstreams: {{ \"app\": (servers: [\"{}\"]) }},",
            up.addr()
        ))
        .server("keepalive_requests: 0,")
        .routes(
            r#"(prefix: "/healthz", handler: Liveness),
            (prefix: "/readyz", handler: Readiness),
            (prefix: "/", handler: Proxy(upstream: "app")),"#,
        )
        .start();
    every_waiting_client_is_served(&d);
}

/// 48 clients requesting `/` in a loop on `d` (one worker, 16 connections): each is
/// served at least once, none of their requests fails, and stats count rotations.
fn every_waiting_client_is_served(d: &TestDaemon) {
    const CLIENTS: usize = 48;
    let port = d.port;
    let served = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(AtomicU64::new(0));
    let responses = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(90);
    let threads: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (served, failures, responses) =
                (served.clone(), failures.clone(), responses.clone());
            std::thread::spawn(move || -> Vec<String> {
                let mut errors = Vec::new();
                let mut mine = 0u64;
                let mut conn: Option<Conn> = None;
                while Instant::now() < deadline && (served.load(SeqCst) < CLIENTS || mine < 3) {
                    let c = match conn.as_mut() {
                        Some(c) => c,
                        None => match Conn::connect_timeout(port, Duration::from_secs(60)) {
                            Ok(c) => conn.insert(c),
                            Err(e) => {
                                errors.push(e);
                                failures.fetch_add(1, SeqCst);
                                std::thread::sleep(Duration::from_millis(50));
                                continue;
                            }
                        },
                    };
                    match c.exchange(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n") {
                        Ok(r) => {
                            assert_eq!(r.status, 200);
                            mine += 1;
                            if mine == 1 {
                                served.fetch_add(1, SeqCst);
                            }
                            responses.fetch_add(1, SeqCst);
                            if r.closes() {
                                conn = None;
                            }
                        }
                        Err(e) => {
                            // A request sent and not answered (closed, reset, or
                            // starved past the read timeout).
                            errors.push(e);
                            failures.fetch_add(1, SeqCst);
                            conn = None;
                        }
                    }
                }
                errors
            })
        })
        .collect();
    let errors: Vec<String> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    assert_eq!(
        served.load(SeqCst),
        CLIENTS,
        "clients never served; errors: {errors:?}"
    );
    assert_eq!(failures.load(SeqCst), 0, "failed requests: {errors:?}");
    let stats = stats_json(&d.config);
    assert!(
        total_of(&stats, "connections_rotated") > 0,
        "{}",
        stats["totals"]
    );
    assert!(total_of(&stats, "connection_limit_hits") > 0);
    assert!(responses.load(SeqCst) >= CLIENTS as u64 * 3);
}

/// The default routes, with `limits` on the static route only: the harness's
/// readiness probes must not take tokens.
fn limited_routes(limits: &str) -> String {
    format!(
        r#"(prefix: "/healthz", handler: Liveness),
            (prefix: "/readyz", handler: Readiness),
            (prefix: "/", handler: Static(root: "www", index: ["index.html"]), limits: Some({limits})),"#
    )
}

/// One request on a connection of its own; the status, or None if unanswered.
fn status_on_new_connection(port: u16, extra: &str) -> Option<u16> {
    let mut c = Conn::connect_timeout(port, Duration::from_secs(30)).ok()?;
    let req = format!("GET / HTTP/1.1\r\nHost: localhost\r\n{extra}Connection: close\r\n\r\n");
    c.exchange(req.as_bytes()).ok().map(|r| r.status)
}

/// Requests of every worker row.
/// Counter `key` of every worker row.
fn per_worker(stats: &serde_json::Value, key: &str) -> Vec<u64> {
    stats["workers"]
        .as_array()
        .expect("workers")
        .iter()
        .map(|w| w["counters"][key].as_u64().unwrap_or(0))
        .collect()
}

#[test]
fn a_rate_limit_per_client_address_is_one_limit_over_all_workers() {
    let d = TestDaemon::builder()
        .workers(2)
        .routes(&limited_routes(
            r#"(rates: [(key: ClientIp, rate: "1/s", burst: 10)])"#,
        ))
        .start();
    let started = Instant::now();
    let mut admitted = 0u64;
    let mut limited = 0u64;
    // Batches of 200 new connections until both workers refused some over the one
    // limit (on a loaded machine one worker may accept a whole batch while the other
    // is not scheduled; the readiness probes are requests too, so refusals it is).
    let mut refused = Vec::new();
    for _ in 0..10 {
        for _ in 0..200 {
            match status_on_new_connection(d.port, "") {
                Some(200) => admitted += 1,
                Some(429) => limited += 1,
                other => panic!("unexpected answer {other:?}"),
            }
        }
        refused = per_worker(&stats_json(&d.config), "rate_limited");
        if refused.iter().filter(|&&n| n > 0).count() >= 2 {
            break;
        }
    }
    // The burst, plus at most one token per second that passed (and one for rounding).
    let ceiling = 10 + started.elapsed().as_secs() + 1;
    assert!(
        (10..=ceiling).contains(&admitted),
        "admitted {admitted}, limited {limited}, ceiling {ceiling}"
    );
    assert!(
        refused.iter().filter(|&&n| n > 0).count() >= 2,
        "the limit was not met on both workers: {refused:?} refused"
    );
    let stats = stats_json(&d.config);
    assert_eq!(total_of(&stats, "rate_limited"), limited);
}

#[test]
fn over_a_rate_the_answer_is_429_with_retry_after_until_the_next_token() {
    let d = TestDaemon::builder()
        .routes(&limited_routes(
            r#"(rates: [(key: ClientIp, rate: "1/m", burst: 1)])"#,
        ))
        .start();
    let mut c = Conn::connect(d.port).unwrap();
    let req = b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n";
    assert_eq!(c.exchange(req).unwrap().status, 200);
    c.send(req).unwrap();
    let head = c.read_head().unwrap();
    assert_eq!(head.status, 429);
    // The next token is a minute after the first request, less the moment since.
    assert_eq!(head.header("Retry-After"), Some("60"));
    assert_eq!(head.header("Content-Type"), Some("text/html"));
    let body = c.read_body(head.content_length().unwrap()).unwrap();
    assert_eq!(
        body,
        b"<html><head><title>429 Too Many Requests</title></head><body><h1>429 Too Many Requests</h1><hr>forkd</body></html>\n"
    );
    // The connection stays usable: a 429 is an answer, not a broken framing.
    assert!(!head.closes());
    c.send(req).unwrap();
    assert_eq!(c.read_head().unwrap().status, 429);
}

#[test]
fn a_header_keyed_limit_counts_each_key_apart() {
    let d = TestDaemon::builder()
        .routes(&limited_routes(
            r#"(rates: [(key: Header("X-Api-Key"), rate: "1/m", burst: 2)])"#,
        ))
        .start();
    let a = "X-Api-Key: alpha\r\n";
    let b = "X-Api-Key: beta\r\n";
    let got: Vec<Option<u16>> = [a, a, a, b, b, b, ""]
        .iter()
        .map(|h| status_on_new_connection(d.port, h))
        .collect();
    // Without the header, the rule does not apply.
    let want = [200, 200, 429, 200, 200, 429, 200].map(Some);
    assert_eq!(got, want);
}

#[test]
fn dry_run_never_rejects_and_a_reload_to_enforce_does() {
    let mut d = TestDaemon::builder()
        .workers(2)
        .routes(&limited_routes(
            r#"(rates: [(key: ClientIp, rate: "1/m", burst: 1)], mode: DryRun)"#,
        ))
        .start();
    for _ in 0..30 {
        assert_eq!(status_on_new_connection(d.port, ""), Some(200));
    }
    let stats = stats_json(&d.config);
    assert_eq!(total_of(&stats, "limits_dry_run_hits"), 29);
    assert_eq!(total_of(&stats, "rate_limited"), 0);
    assert!(d.error_log().contains("DryRun: admitted"));

    d.builder.routes =
        limited_routes(r#"(rates: [(key: ClientIp, rate: "1/m", burst: 1)], mode: Enforce)"#);
    let (code, out, err) = d.reload();
    assert_eq!(code, 0, "{out} {err}");
    let statuses: Vec<Option<u16>> = (0..10)
        .map(|_| status_on_new_connection(d.port, ""))
        .collect();
    assert!(
        statuses.iter().all(|s| *s == Some(429)),
        "the bucket was emptied under DryRun: {statuses:?}"
    );
}

#[test]
fn conn_per_ip_is_one_limit_over_all_workers_and_frees_on_close() {
    let d = TestDaemon::builder()
        .workers(2)
        .server("limits: Some((conn_per_ip: Some(3))),")
        .start();
    let req = b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n";
    let mut open: Vec<Conn> = (0..3)
        .map(|_| {
            let mut c = Conn::connect(d.port).unwrap();
            assert_eq!(c.exchange(req).unwrap().status, 200);
            c
        })
        .collect();
    for _ in 0..4 {
        let mut c = Conn::connect(d.port).unwrap();
        c.send(req).unwrap();
        let r = c.response().unwrap();
        assert_eq!(r.status, 503);
        assert_eq!(r.header("Retry-After"), Some("1"));
        assert!(r.closes());
        assert!(read_to_close(&mut c.s).is_empty(), "closed after the 503");
    }
    let stats = stats_json(&d.config);
    assert_eq!(total_of(&stats, "conn_limited"), 4);
    // A closed connection makes room (the worker uncounts it when it sees the close).
    drop(open.pop());
    assert!(wait_until(Duration::from_secs(20), || {
        status_on_new_connection(d.port, "") == Some(200)
    }));
    drop(open);
}

/// A daemon with a second server on its own port whose listen entry speaks PROXY
/// protocol (the harness's probes use the first, plain one). Returns it and the port.
fn proxied_daemon() -> (TestDaemon, u16) {
    proxied_daemon_with("")
}

/// Likewise, with `extra` (`, proxy_protocol_from: [...]`) in the listen entry.
fn proxied_daemon_with(extra: &str) -> (TestDaemon, u16) {
    let mut d = TestDaemon::builder().prepare();
    let proxied = d.reserve_port();
    // The routes text ends the first server and opens the second, whose routes the
    // template's closing brackets end.
    d.builder.routes = format!(
        r#"(prefix: "/healthz", handler: Liveness),
            (prefix: "/readyz", handler: Readiness),
            (prefix: "/", handler: Static(root: "www", index: ["index.html"])),
        ],
    ), (
        listen: [(addr: "127.0.0.1:{proxied}", proxy_protocol: true{extra})],
        names: ["proxied"],
        header_timeout: "1s",
        access_log: Some(File("proxied.log")),
        routes: [
            (prefix: "/", handler: Static(root: "www", index: ["index.html"])),"#
    );
    write_config(&d.config, &d.builder.config_text(d.port));
    let cmd = d.command();
    let pid = d.spawn(cmd);
    d.wait_serving(pid);
    (d, proxied)
}

#[test]
fn a_proxy_protocol_header_names_the_client_in_the_access_log() {
    let (d, port) = proxied_daemon();
    let req = b"GET / HTTP/1.1\r\nHost: proxied\r\nConnection: close\r\n\r\n";
    let mut v1 = b"PROXY TCP4 203.0.113.9 127.0.0.1 5555 80\r\n".to_vec();
    v1.extend_from_slice(req);
    let mut v2 = proxy_v2_header([198, 51, 100, 23], 6666);
    v2.extend_from_slice(req);
    for raw in [v1, v2] {
        let mut c = Conn::connect(port).unwrap();
        assert_eq!(c.exchange(&raw).unwrap().status, 200);
    }
    let log = d.path("proxied.log");
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        wait_until(Duration::from_secs(20), || {
            let text = read();
            text.contains("203.0.113.9") && text.contains("198.51.100.23")
        }),
        "{}",
        read()
    );
    assert!(!read().contains("127.0.0.1 "), "{}", read());
}

#[test]
fn without_a_valid_proxy_header_the_connection_is_closed_unanswered() {
    let (d, port) = proxied_daemon();
    let mut c = Conn::connect_timeout(port, Duration::from_secs(30)).unwrap();
    c.send(b"GET / HTTP/1.1\r\nHost: proxied\r\n\r\n").unwrap();
    assert!(read_to_close(&mut c.s).is_empty());
    // Nothing at all: closed after header_timeout.
    let mut quiet = Conn::connect_timeout(port, Duration::from_secs(30)).unwrap();
    assert!(read_to_close(&mut quiet.s).is_empty());
    let stats = stats_json(&d.config);
    assert_eq!(total_of(&stats, "proxy_header_refused"), 2);
}

/// `proxy_protocol_from` (issue #21): only the balancers it lists may name a client;
/// a connection from any other peer is closed before anything is read, counted and
/// logged. 127.0.0.1 is the only peer a test has: outside the list, then in it.
#[test]
fn a_peer_outside_proxy_protocol_from_is_refused_and_one_inside_is_served() {
    let req = b"GET / HTTP/1.1\r\nHost: proxied\r\nConnection: close\r\n\r\n";
    let mut v1 = b"PROXY TCP4 203.0.113.9 127.0.0.1 5555 80\r\n".to_vec();
    v1.extend_from_slice(req);
    let (d, port) = proxied_daemon_with(r#", proxy_protocol_from: ["10.0.0.0/8", "192.0.2.1"]"#);
    for _ in 0..2 {
        let mut c = Conn::connect_timeout(port, Duration::from_secs(30)).unwrap();
        // The write may meet the close already: only what comes back matters.
        let _ = c.send(&v1);
        assert!(
            read_to_close(&mut c.s).is_empty(),
            "an untrusted peer was answered"
        );
    }
    assert!(wait_until(Duration::from_secs(20), || {
        total(&d, "proxy_header_refused") == 2
    }));
    assert!(
        d.wait_for_log("not in its proxy_protocol_from", Duration::from_secs(20)),
        "{}",
        d.error_log()
    );
    let served = std::fs::read_to_string(d.path("proxied.log")).unwrap_or_default();
    assert!(served.is_empty(), "{served}");
    drop(d);
    let (d, port) = proxied_daemon_with(r#", proxy_protocol_from: ["::1", "127.0.0.0/8"]"#);
    let mut c = Conn::connect(port).unwrap();
    assert_eq!(c.exchange(&v1).unwrap().status, 200);
    let log = d.path("proxied.log");
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        wait_until(Duration::from_secs(20), || read().contains("203.0.113.9")),
        "{}",
        read()
    );
    assert_eq!(total(&d, "proxy_header_refused"), 0);
}

/// `forkd -t` on two servers of one address, the first with `first` in its listen
/// entry, the second with `second` (issue #21): the exit code and what it printed,
/// with the `FILE:LINE:COL` of the second entry the error must name.
fn check_listen_pair(first: &str, second: &str) -> (i32, String, String) {
    let dir = TempDir::new();
    std::fs::create_dir_all(dir.path().join("www")).unwrap();
    let addr = format!("\"127.0.0.1:{}\"", free_port());
    let text = format!(
        r#"(
    servers: [
        (
            listen: [(addr: {addr}{first})],
            names: ["a"],
            routes: [(prefix: "/", handler: Liveness)],
        ),
        (
            listen: [(addr: {addr}{second})],
            names: ["b"],
            routes: [(prefix: "/", handler: Liveness)],
        ),
    ],
)
"#
    );
    let config = dir.path().join("forkd.ron");
    std::fs::write(&config, &text).unwrap();
    let (code, out, err) = run_forkd(&config, &["-t"]);
    // The second entry's address: line 9 of the text, after `listen: [(addr: `.
    let line = text.lines().nth(8).unwrap();
    let at = format!("{}:9:{}:", config.display(), line.find(&addr).unwrap() + 1);
    (code, format!("{out}{err}"), at)
}

/// Servers that share an address but disagree on the PROXY protocol are refused by
/// `-t` at the second one's entry, instead of the address taking the header for all
/// of them (issue #21); agreeing ones pass.
#[test]
fn check_refuses_servers_of_one_address_that_disagree_on_the_proxy_protocol() {
    let pp = ", proxy_protocol: true";
    let (code, said, at) = check_listen_pair(pp, "");
    assert_eq!(code, 1, "{said}");
    assert!(
        said.contains(&at)
            && said.contains("`proxy_protocol: true` in servers[0] and not in this one"),
        "{at}\n{said}"
    );
    let from = |blocks: &str| format!("{pp}, proxy_protocol_from: [{blocks}]");
    let (code, said, at) = check_listen_pair(&from(r#""10.0.0.0/8""#), &from(r#""10.0.0.0/16""#));
    assert_eq!(code, 1, "{said}");
    assert!(
        said.contains(&at) && said.contains("another `proxy_protocol_from` in servers[0]"),
        "{at}\n{said}"
    );
    // The header without a list, and a list without the header, are not the same.
    let (code, said, _) = check_listen_pair(pp, &from(r#""10.0.0.0/8""#));
    assert_eq!(code, 1, "{said}");
    let (code, said, at) = check_listen_pair("", r#", proxy_protocol_from: ["10.0.0.0/8"]"#);
    assert_eq!(code, 1, "{said}");
    assert!(
        said.contains(&at) && said.contains("without `proxy_protocol: true`"),
        "{at}\n{said}"
    );
    // The same blocks in another order agree.
    let (code, said, _) = check_listen_pair(
        &from(r#""10.0.0.0/8", "192.0.2.1""#),
        &from(r#""192.0.2.1", "10.0.0.0/8""#),
    );
    assert_eq!(code, 0, "{said}");
    let (code, said, _) = check_listen_pair(
        ", proxy_protocol_from: [\"ten/8\"], proxy_protocol: true",
        "",
    );
    assert_eq!(code, 1, "{said}");
    assert!(
        said.contains("proxy_protocol_from: `ten/8` is not an address"),
        "{said}"
    );
}

#[test]
fn x_forwarded_for_from_a_trusted_peer_is_the_client_for_limits_and_the_log() {
    let d = TestDaemon::builder()
        .server(r#"trusted_proxies: ["127.0.0.1", "10.0.0.0/8"], real_ip_header: Some("X-Forwarded-For"),"#)
        .routes(&limited_routes(r#"(rates: [(key: ClientIp, rate: "1/m", burst: 1)])"#))
        .start();
    let from = |xff: &str| status_on_new_connection(d.port, &format!("X-Forwarded-For: {xff}\r\n"));
    // The right-most address that is not a trusted proxy is the client.
    assert_eq!(from("192.0.2.50, 203.0.113.1, 10.0.0.7"), Some(200));
    assert_eq!(from("203.0.113.1"), Some(429));
    assert_eq!(from("203.0.113.2"), Some(200));
    let log = || d.access_log();
    assert!(
        wait_until(Duration::from_secs(20), || {
            log().contains("203.0.113.1") && log().contains("203.0.113.2")
        }),
        "{}",
        log()
    );
    assert!(!log().contains("192.0.2.50"), "{}", log());
}

#[test]
fn ipv6_clients_of_one_prefix_share_a_client_ip_rate() {
    let rate = |prefix: &str| {
        format!(r#"limits: Some((rates: [(key: ClientIp, rate: "1/m", burst: 1{prefix})]))"#)
    };
    let d = TestDaemon::builder()
        .server(r#"trusted_proxies: ["127.0.0.1"], real_ip_header: Some("X-Forwarded-For"),"#)
        .routes(&format!(
            r#"(prefix: "/healthz", handler: Liveness),
            (prefix: "/readyz", handler: Readiness),
            (prefix: "/p48", handler: Return(status: 200), {}),
            (prefix: "/", handler: Return(status: 200), {}),"#,
            rate(", ipv6_prefix: 48"),
            rate("")
        ))
        .start();
    let get = |path: &str, client: &str| {
        let mut c = Conn::connect_timeout(d.port, Duration::from_secs(30)).ok()?;
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: localhost\r\nX-Forwarded-For: {client}\r\nConnection: close\r\n\r\n"
        );
        c.exchange(req.as_bytes()).ok().map(|r| r.status)
    };
    // The default: one bucket per /64.
    assert_eq!(get("/", "2001:db8:0:1::1"), Some(200));
    assert_eq!(get("/", "2001:db8:0:1:ffff::2"), Some(429), "same /64");
    assert_eq!(get("/", "2001:db8:0:2::1"), Some(200), "another /64");
    // IPv4 clients, also written IPv4-mapped, keep one bucket per address.
    assert_eq!(get("/", "192.0.2.1"), Some(200));
    assert_eq!(get("/", "::ffff:192.0.2.2"), Some(200));
    assert_eq!(
        get("/", "::ffff:192.0.2.1"),
        Some(429),
        "the same IPv4 client"
    );
    // `ipv6_prefix: 48`: one bucket for both of those /64s.
    assert_eq!(get("/p48", "2001:db8:0:1::1"), Some(200));
    assert_eq!(get("/p48", "2001:db8:0:2::1"), Some(429), "same /48");
    assert_eq!(get("/p48", "2001:db8:1::1"), Some(200), "another /48");
}

/// Two keep-alive connections, served (so counted under `conn_per_ip: 2`), on one
/// worker; then the worker dies with them open: what it held is released once it is
/// gone (they used to count for the life of the region: every later connection from
/// the address was refused 503).
fn two_held_connections(d: &TestDaemon) -> Vec<Conn> {
    let req = b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n";
    let held: Vec<Conn> = (0..2)
        .map(|_| {
            let mut c = Conn::connect(d.port).unwrap();
            assert_eq!(c.exchange(req).unwrap().status, 200);
            c
        })
        .collect();
    assert_eq!(
        status_on_new_connection(d.port, ""),
        Some(503),
        "two held: a third is over conn_per_ip"
    );
    held
}

#[test]
fn connections_counted_by_a_killed_worker_are_released() {
    let d = TestDaemon::builder()
        .workers(1)
        .expect_alerts()
        .server("limits: Some((conn_per_ip: Some(2))),")
        .start();
    let held = two_held_connections(&d);
    let victim = d.workers()[0];
    send_signal(victim, Signal::SIGKILL);
    assert!(
        d.wait_replaced(&[victim], 1, Duration::from_secs(30)),
        "worker {victim} not respawned"
    );
    assert!(wait_until(Duration::from_secs(30), || workers_serving(
        &d.shm(),
        &d.workers()
    )));
    drop(held);
    assert_eq!(
        status_on_new_connection(d.port, ""),
        Some(200),
        "the dead worker's connections still count:\n{}",
        d.error_log()
    );
    // And the limit still holds for the new worker's connections.
    let again = two_held_connections(&d);
    drop(again);
}

#[test]
fn connections_left_open_at_drain_timeout_are_released() {
    let mut d = TestDaemon::builder()
        .workers(1)
        .top(r#"drain_timeout: "1s","#)
        .server("limits: Some((conn_per_ip: Some(2))),")
        .file("big.bin", &noise(16 << 20, 0))
        .start();
    // Two downloads their clients do not read: far more than the socket buffers hold
    // is left to send, so the old worker's drain ends at drain_timeout with both open.
    let downloads: Vec<std::net::TcpStream> = (0..2)
        .map(|_| {
            let mut s = d.connect();
            s.write_all(b"GET /big.bin HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                .unwrap();
            assert_eq!(read_response(&mut s, true).expect("a head").status, 200);
            s
        })
        .collect();
    assert_eq!(status_on_new_connection(d.port, ""), Some(503));
    let old = d.workers();
    d.builder.workers = 2;
    let (code, out, err) = d.reload();
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        d.wait_replaced(&old, 2, Duration::from_secs(60)),
        "the old worker did not leave at drain_timeout:\n{}",
        d.error_log()
    );
    assert!(
        d.error_log().contains("drain_timeout reached"),
        "{}",
        d.error_log()
    );
    drop(downloads);
    assert_eq!(
        status_on_new_connection(d.port, ""),
        Some(200),
        "the drained worker's connections still count:\n{}",
        d.error_log()
    );
}

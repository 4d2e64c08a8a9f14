//! A server that comes back (issue #12): it rejoins, and its weight ramps up over the
//! upstream's `slow_start` instead of taking its full share at once. Twice: a server
//! that was killed and restarted (passive health: `max_fails`, then a passed trial),
//! and one whose check failed and then passed `rise` times (active checks). Two
//! workers, so the ramp is the region's, not one worker's.
//!
//! No clock is asserted: the ramp is read from `forkd stats --json` (`weight_now`
//! below `weight`, and rising between two reads), and a burst's share is compared
//! with the weights read after it.

// Only some of its helpers are used here.
#[allow(dead_code)]
#[path = "support/checked_upstream.rs"]
mod checked_upstream;
mod support;

use checked_upstream::CheckedUpstream;
use serde_json::Value;
use support::*;

/// Each server's weight: large, so the ramp (weight × elapsed / slow_start, from 1)
/// moves every 600 ms and is still far from the top long after the server is back.
const WEIGHT: u64 = 100;
/// Requests of a burst.
const BURST: usize = 200;

fn daemon(a: &CheckedUpstream, b: &CheckedUpstream, keys: &str) -> TestDaemon {
    TestDaemon::builder()
        .workers(2)
        .top(&format!(
            r#"upstreams: {{
        "app": (servers: [(addr: "{}", weight: {WEIGHT}), (addr: "{}", weight: {WEIGHT})],
                slow_start: "60s", {keys}),
    }},"#,
            a.addr, b.addr
        ))
        .routes(
            r#"(prefix: "/healthz", handler: Liveness),
            (prefix: "/api/", handler: Proxy(upstream: "app")),"#,
        )
        .start()
}

/// The stats row of `server` of upstream `app`.
fn row(d: &TestDaemon, server: &str) -> Value {
    upstream_row(&d.config, "app", server)
}

fn weight_now(d: &TestDaemon, server: &str) -> u64 {
    row(d, server)["weight_now"].as_u64().expect("weight_now")
}

fn verdict(d: &TestDaemon, server: &str) -> String {
    row(d, server)["health"]["verdict"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// `BURST` requests, each of which must succeed: how many `b` answered.
fn burst(d: &TestDaemon, b: &CheckedUpstream) -> u64 {
    let before = b.client_requests();
    for i in 0..BURST {
        let r = d.get(&format!("/api/burst{i}"));
        assert_eq!(r.status, 200, "request {i}: {}", r.head);
    }
    b.client_requests() - before
}

/// What every test checks once `b` is back: its weight is ramping (below its weight,
/// and higher on a later read), and while it still is, a burst sends it less than
/// its fair half.
fn assert_ramps(d: &TestDaemon, lb: &str, b: &CheckedUpstream) {
    let r = row(d, lb);
    assert_eq!(r["weight"], WEIGHT, "{r:#}");
    let first = r["weight_now"].as_u64().unwrap();
    assert!(
        first < WEIGHT,
        "back up with its full weight at once, no slow start: {r:#}"
    );
    let mut now = first;
    assert!(
        wait_until(SETTLE, || {
            now = weight_now(d, lb);
            now > first
        }),
        "weight_now stayed at {first} (now {now})"
    );
    let got = burst(d, b);
    let after = row(d, lb);
    let w = after["weight_now"].as_u64().unwrap();
    assert!(
        w < WEIGHT,
        "the ramp ended before the burst did (the machine is too slow for this test): {after:#}"
    );
    // Every choice in the burst weighed b with at most `w` against a's WEIGHT.
    assert!(
        (got as usize) * 2 < BURST,
        "b got {got} of {BURST} requests with weight_now {w} of {WEIGHT}: its full share"
    );
}

/// Proxied requests (each answered 200) until `server`'s stats row says `state`;
/// panics with `what` and the last row if it never does.
fn probe_until_state(d: &TestDaemon, server: &str, state: &str, what: &str) {
    let mut r = Value::Null;
    assert!(
        wait_until(SETTLE, || {
            let x = d.get("/api/probe");
            assert_eq!(x.status, 200, "{}", x.head);
            r = row(d, server);
            r["state"] == state
        }),
        "{what}: {r:#}"
    );
}

#[test]
fn a_killed_server_that_comes_back_rejoins_and_ramps_up_over_slow_start() {
    let a = CheckedUpstream::start("a", "127.0.0.1");
    let b = CheckedUpstream::start("b", "127.0.0.1");
    let lb = b.addr.to_string();
    // No pooled connections: once b's listener is gone, every attempt is refused.
    let d = daemon(&a, &b, r#"keepalive: 0, max_fails: 1, fail_timeout: "1s","#);
    assert!(burst(&d, &b) > 0, "b serves before it dies");
    assert_eq!(row(&d, &lb)["weight_now"], WEIGHT, "no ramp at the start");

    drop(b);
    // Requests fail over to a; b's refusal marks it down.
    probe_until_state(&d, &lb, "down", "never marked down");

    let b = CheckedUpstream::start_on("b", &lb);
    probe_until_state(&d, &lb, "up", "never back up after its trial");
    assert_ramps(&d, &lb, &b);
}

#[test]
fn a_server_whose_check_fails_then_passes_rise_times_rejoins_and_ramps_up() {
    let a = CheckedUpstream::start("a", "127.0.0.1");
    let b = CheckedUpstream::start("b", "127.0.0.1");
    let (la, lb) = (a.addr.to_string(), b.addr.to_string());
    let d = daemon(
        &a,
        &b,
        r#"health_check: Some((path: "/healthz", interval: "300ms", timeout: "300ms", rise: 3, fall: 2)),"#,
    );
    assert!(
        wait_until(SETTLE, || verdict(&d, &la) == "up"
            && verdict(&d, &lb) == "up"),
        "both up: {:#} {:#}",
        row(&d, &la),
        row(&d, &lb)
    );
    assert_eq!(row(&d, &lb)["weight_now"], WEIGHT, "no ramp at the start");

    b.set_health(500);
    assert!(
        wait_until(SETTLE, || verdict(&d, &lb) == "down"),
        "{:#}",
        row(&d, &lb)
    );
    assert_eq!(burst(&d, &b), 0, "a server down by its checks gets nothing");

    let checks_down = row(&d, &lb)["health"]["checks"].as_u64().unwrap();
    b.set_health(200);
    assert!(
        wait_until(SETTLE, || verdict(&d, &lb) == "up"),
        "{:#}",
        row(&d, &lb)
    );
    let r = row(&d, &lb);
    // Up only after `rise` (3) checks since it was down (`passes_in_a_row` would be
    // reset by a check timed out on a loaded machine since, with b still up).
    assert!(
        r["health"]["checks"].as_u64().unwrap() >= checks_down + 3,
        "up after rise passes: {r:#}"
    );
    assert_eq!(r["state"], "up", "{r:#}");
    assert_ramps(&d, &lb, &b);
}

//! End-to-end tests of active health checks and name re-resolution (issue #12,
//! part B): a server whose check fails is out before any client request reaches it
//! and rejoins after `rise` passes; one worker runs the checks for the daemon and
//! another takes over when it dies; a reload changes the check in place; a name whose
//! address changes is followed without a reload (forkd runs in a private mount
//! namespace with a hosts file of the test's bound over /etc/hosts), and a failed
//! re-resolution keeps the last good addresses, logged once.

#[path = "support/checked_upstream.rs"]
mod checked_upstream;
mod support;

use checked_upstream::CheckedUpstream;
use serde_json::Value;
use std::process::Command;
use std::time::{Duration, Instant};
use support::*;

const ROUTES: &str = r#"(prefix: "/healthz", handler: Liveness),
            (prefix: "/metrics", handler: Metrics),
            (prefix: "/api/", handler: Proxy(upstream: "app")),
            (prefix: "/", handler: Static(root: "www", index: ["index.html"])),"#;

fn upstreams(servers: &[String], extra: &str) -> String {
    format!(
        r#"upstreams: {{
        "app": (servers: [{}], keepalive: 4, {extra}),
    }},"#,
        support::upstream::server_list(servers)
    )
}

/// The check interval (and timeout) of the tests: short, so they run quickly, and
/// long enough that a loaded machine answers a healthy server's check in time.
const INTERVAL_MS: u64 = 300;

fn check(path: &str) -> String {
    format!(
        r#"health_check: Some((path: "{path}", interval: "{INTERVAL_MS}ms", timeout: "{INTERVAL_MS}ms", rise: 2, fall: 2)),"#
    )
}

/// The `health` object of `server` in the region's stats, if the checks wrote one.
fn health(d: &TestDaemon, server: &str) -> Option<Value> {
    let json = try_shm_json(&d.shm()).ok()?;
    json["upstreams"]
        .as_array()?
        .iter()
        .find(|u| u["upstream"] == "app" && u["server"] == server)
        .map(|u| u["health"].clone())
        .filter(|h| !h.is_null())
}

fn verdict(d: &TestDaemon, server: &str) -> String {
    health(d, server)
        .and_then(|h| h["verdict"].as_str().map(String::from))
        .unwrap_or_default()
}

fn checks_owner(d: &TestDaemon) -> Option<i32> {
    let json = try_shm_json(&d.shm()).ok()?;
    json["checks"]["owner_pid"].as_i64().map(|p| p as i32)
}

/// `n` client requests through the proxy; the body (upstream name) of each.
fn bodies(d: &TestDaemon, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            let r = d.get(&format!("/api/item{i}"));
            assert_eq!(r.status, 200, "request {i}: {}", r.head);
            r.body_str()
        })
        .collect()
}

#[test]
fn a_server_whose_check_fails_gets_no_client_request_until_rise_checks_pass() {
    let a = CheckedUpstream::start("a", "127.0.0.1");
    let b = CheckedUpstream::start("b", "127.0.0.1");
    let (la, lb) = (a.addr.to_string(), b.addr.to_string());
    let d = TestDaemon::builder()
        .workers(2)
        .top(&upstreams(&[la.clone(), lb.clone()], &check("/healthz")))
        .routes(ROUTES)
        .start();
    assert!(
        wait_until(SETTLE, || verdict(&d, &la) == "up"
            && verdict(&d, &lb) == "up"),
        "both servers up: {:?} {:?}",
        health(&d, &la),
        health(&d, &lb)
    );

    b.set_health(500);
    assert!(
        wait_until(SETTLE, || verdict(&d, &lb) == "down"),
        "b down after its checks fail: {:?}",
        health(&d, &lb)
    );
    let h = health(&d, &lb).unwrap();
    assert_eq!(h["last_status"], 500, "{h}");
    assert_eq!(h["last_error"], "status", "{h}");
    assert!(h["fails_in_a_row"].as_u64().unwrap() >= 2, "{h}");
    // One state says what the balancer does: down, by its checks (it used to say
    // `up`, the passive side's, beside `verdict: down`).
    let row = upstream_row(&d.config, "app", &lb);
    assert_eq!(
        (row["state"].as_str(), row["down_reason"].as_str()),
        (Some("down"), Some("health check failed")),
        "{row}"
    );
    assert_eq!(upstream_row(&d.config, "app", &la)["state"], "up");
    let before = b.client_requests();
    let served = bodies(&d, 60);
    assert!(served.iter().all(|b| b == "a\n"), "{served:?}");
    assert_eq!(
        b.client_requests(),
        before,
        "a server Down by its checks got client requests"
    );
    let metrics = d.get("/metrics").body_str();
    let down =
        format!("forkd_upstream_health{{upstream=\"app\",server=\"{lb}\",verdict=\"down\"}} 1");
    assert!(metrics.contains(&down), "{down} in:\n{metrics}");
    let not_up = format!("forkd_upstream_up{{upstream=\"app\",server=\"{lb}\",state=\"down\"}} 0");
    assert!(metrics.contains(&not_up), "{not_up} in:\n{metrics}");
    let scrape = scrape(&metrics);
    let fails = scrape
        .samples
        .iter()
        .find(|s| {
            s.metric == "forkd_upstream_check_fails_in_a_row"
                && s.labels.get("server") == Some(lb.as_str())
        })
        .unwrap_or_else(|| panic!("no fails_in_a_row for {lb}:\n{metrics}"));
    match fails.value {
        prometheus_parse::Value::Gauge(v) => assert!(v >= 2.0, "{v}"),
        ref other => panic!("{other:?}"),
    }
    assert!(
        d.error_log().contains(&format!("server {lb} is down")),
        "{}",
        d.error_log()
    );
    let table = Command::new(BIN)
        .args(["stats", "--shm"])
        .arg(d.shm())
        .output()
        .expect("run forkd stats");
    let table = String::from_utf8_lossy(&table.stdout);
    // Both its rows say down: the upstream table's (the effective state, why) and
    // the checks table's (the verdict, the last status).
    let rows: Vec<&str> = table
        .lines()
        .filter(|l| l.starts_with("app") && l.contains(&lb) && l.contains(" down "))
        .collect();
    assert_eq!(rows.len(), 2, "two rows saying {lb} is down in:\n{table}");
    assert!(rows[0].ends_with("health check failed"), "{}", rows[0]);
    assert!(
        rows[1].contains("500"),
        "the last status is shown: {}",
        rows[1]
    );

    let checks_down = health(&d, &lb).unwrap()["checks"].as_u64().unwrap();
    b.set_health(200);
    assert!(
        wait_until(SETTLE, || verdict(&d, &lb) == "up"),
        "b back up: {:?}",
        health(&d, &lb)
    );
    let h = health(&d, &lb).unwrap();
    // Up only after `rise` (2) checks since it was down. (Not `passes_in_a_row`: a
    // check timed out on a loaded machine since then resets it, and b stays up.)
    assert!(
        h["checks"].as_u64().unwrap() >= checks_down + 2,
        "rise passes: {h}"
    );
    assert!(h["came_up_ms"].as_u64().is_some(), "{h}");
    let served = bodies(&d, 60);
    assert!(
        served.iter().any(|b| b == "b\n"),
        "b serves again after rise passes: {served:?}"
    );
}

#[test]
fn with_every_server_down_by_its_checks_a_request_is_a_503_and_reaches_none() {
    let a = CheckedUpstream::start("a", "127.0.0.1");
    let la = a.addr.to_string();
    let d = TestDaemon::builder()
        .top(&upstreams(std::slice::from_ref(&la), &check("/healthz")))
        .routes(ROUTES)
        .start();
    a.set_health(503);
    assert!(
        wait_until(SETTLE, || verdict(&d, &la) == "down"),
        "{:?}",
        health(&d, &la)
    );
    for i in 0..5 {
        let r = d.get(&format!("/api/x{i}"));
        assert_eq!(r.status, 503, "{}", r.head);
    }
    assert_eq!(a.client_requests(), 0);
}

#[test]
fn one_worker_runs_the_checks_and_another_takes_over_when_it_is_killed() {
    let a = CheckedUpstream::start("a", "127.0.0.1");
    let la = a.addr.to_string();
    let d = TestDaemon::builder()
        .workers(2)
        .top(&upstreams(std::slice::from_ref(&la), &check("/healthz")))
        .routes(ROUTES)
        .expect_alerts() // the killed worker is reported as crashed
        .start();
    assert!(
        wait_until(SETTLE, || verdict(&d, &la) == "up"),
        "{:?}",
        health(&d, &la)
    );
    let owner = checks_owner(&d).expect("a worker holds the checks");
    assert!(
        d.workers().contains(&owner),
        "{owner} is not a worker of {:?}",
        d.workers()
    );

    // One checker makes at most one check per interval; a second one doubles
    // that. A loaded machine can only make fewer.
    let (h0, t0) = (a.hits("/healthz"), Instant::now());
    std::thread::sleep(Duration::from_millis(10 * INTERVAL_MS));
    let (h1, t1) = (a.hits("/healthz"), Instant::now());
    let most = (t1 - t0).as_millis() as u64 / INTERVAL_MS + 2;
    assert!(h1 > h0, "no check ran in {:?}", t1 - t0);
    assert!(
        h1 - h0 <= most,
        "{} checks in {:?} with a {INTERVAL_MS}ms interval: more than one worker checks",
        h1 - h0,
        t1 - t0
    );
    let stats_checks = health(&d, &la).unwrap()["checks"].as_u64().unwrap();
    assert!(
        stats_checks <= a.hits("/healthz"),
        "every check counted is one request"
    );

    signal(owner, "KILL");
    assert!(
        wait_until(SETTLE, || checks_owner(&d)
            .is_some_and(|p| p != owner && alive(p))),
        "nobody took the checks over from {owner}: {:?}",
        checks_owner(&d)
    );
    let taken = a.hits("/healthz");
    assert!(
        wait_until(SETTLE, || a.hits("/healthz") >= taken + 3),
        "checks go on after the takeover"
    );
    let json = shm_json(&d.shm());
    assert!(
        json["checks"]["takeovers"].as_u64().unwrap() >= 2,
        "{}",
        json["checks"]
    );
}

#[test]
fn a_reload_changes_the_check_path_in_place() {
    let a = CheckedUpstream::start("a", "127.0.0.1");
    let la = a.addr.to_string();
    let mut d = TestDaemon::builder()
        .workers(2)
        .top(&upstreams(std::slice::from_ref(&la), &check("/healthz")))
        .routes(ROUTES)
        .start();
    assert!(wait_until(SETTLE, || a.hits("/healthz") >= 2), "checks run");
    let workers = d.workers();

    d.builder.top = upstreams(std::slice::from_ref(&la), &check("/ready2"));
    let (code, out, err) = d.reload();
    assert_eq!(code, 0, "reload: {out} {err}");
    assert!(
        wait_until(SETTLE, || a.hits("/ready2") >= 1),
        "the new path is checked"
    );
    let old = a.hits("/healthz");
    assert!(
        wait_until(SETTLE, || a.hits("/ready2") >= 4),
        "the new path keeps being checked"
    );
    assert_eq!(a.hits("/healthz"), old, "the old path is checked no more");
    assert_eq!(d.workers(), workers, "the change was adopted in place");
}

/// forkd in a private mount namespace, with `hosts` bound over /etc/hosts and an
/// empty resolv.conf (no name server: a name not in the file fails at once, never
/// after a DNS timeout).
fn start_with_hosts(builder: Builder, hosts: &str) -> (TestDaemon, std::path::PathBuf) {
    let mut d = builder.prepare();
    let file = d.path("hosts");
    std::fs::write(&file, hosts).unwrap();
    let resolv = d.path("resolv.conf");
    std::fs::write(&resolv, "").unwrap();
    let script = "mount --bind \"$0\" /etc/hosts && mount --bind \"$1\" /etc/resolv.conf \
                  && exec \"$2\" -c \"$3\"";
    let mut cmd = Command::new("unshare");
    cmd.args(["-m", "sh", "-c", script])
        .arg(&file)
        .arg(&resolv)
        .arg(BIN)
        .arg(&d.config);
    d.plumb(&mut cmd);
    let pid = d.spawn(cmd);
    d.wait_serving(pid);
    (d, file)
}

#[test]
fn a_name_whose_address_changes_is_followed_without_reload_and_a_failure_keeps_the_last_set() {
    let a = CheckedUpstream::start("a", "127.0.0.1");
    let port = a.addr.port();
    let b = CheckedUpstream::start_on("b", &format!("127.0.0.2:{port}"));
    let name = format!("app.forkd.test:{port}");
    let builder = TestDaemon::builder()
        .workers(2)
        .top(&upstreams(
            std::slice::from_ref(&name),
            r#"resolve_every: "1s","#,
        ))
        .routes(ROUTES);
    let (d, hosts) = start_with_hosts(builder, "127.0.0.1 localhost\n127.0.0.1 app.forkd.test\n");
    let served = bodies(&d, 10);
    assert!(served.iter().all(|s| s == "a\n"), "{served:?}");
    assert!(
        a.connections() < 10,
        "the proxy pools its connections to a ({} for 10 requests)",
        a.connections()
    );
    let h = health(&d, &name).expect("the name's addresses are published");
    assert_eq!(
        h["addresses"],
        serde_json::json!([a.addr.to_string()]),
        "{h}"
    );

    write_config(&hosts, "127.0.0.1 localhost\n127.0.0.2 app.forkd.test\n");
    let moved = format!("127.0.0.2:{port}");
    assert!(
        wait_until(SETTLE, || health(&d, &name).is_some_and(
            |h| h["addresses"] == serde_json::json!([moved.clone()])
        )),
        "the new address is published: {:?}",
        health(&d, &name)
    );
    let a_before = a.client_requests();
    let served = bodies(&d, 40);
    assert!(served.iter().all(|s| s == "b\n"), "{served:?}");
    assert_eq!(
        a.client_requests(),
        a_before,
        "requests (pooled connections included) still went to the old address"
    );
    assert!(b.client_requests() >= 40, "b got {}", b.client_requests());
    let json = shm_json(&d.shm());
    assert_eq!(json["master"]["reloads_ok"], 0, "no reload was needed");

    write_config(&hosts, "127.0.0.1 localhost\n");
    assert!(
        wait_until(SETTLE, || health(&d, &name)
            .is_some_and(|h| h["resolve_failures"].as_u64() >= Some(3))),
        "re-resolution fails: {:?}",
        health(&d, &name)
    );
    let h = health(&d, &name).unwrap();
    assert_eq!(
        h["addresses"],
        serde_json::json!([moved]),
        "the last good set stays: {h}"
    );
    assert_eq!(h["resolve_failing"], true, "{h}");
    let served = bodies(&d, 10);
    assert!(served.iter().all(|s| s == "b\n"), "{served:?}");
    let log = d.error_log();
    assert_eq!(
        log.matches("resolving it again failed").count(),
        1,
        "a failing name is logged once, not at every interval:\n{log}"
    );
}

#[test]
fn an_unresolvable_name_fails_t_with_the_name() {
    let d = TestDaemon::builder()
        .top(&upstreams(&["nope.forkd.test:9000".to_string()], ""))
        .routes(ROUTES)
        .prepare();
    let (code, out, err) = run_forkd(&d.config, &["-t"]);
    assert_eq!(code, 1, "{out} {err}");
    assert!(
        err.contains("cannot resolve `nope.forkd.test:9000`"),
        "{err}"
    );
}

#[test]
fn a_bad_health_check_fails_t_where_written() {
    let d = TestDaemon::builder()
        .top(&upstreams(
            &["127.0.0.1:9000".to_string()],
            r#"health_check: Some((path: "healthz", rise: 0, expect_status: (400, 200))),"#,
        ))
        .routes(ROUTES)
        .prepare();
    let (code, out, err) = run_forkd(&d.config, &["-t"]);
    assert_eq!(code, 1, "{out} {err}");
    let config = d.config.display().to_string();
    for want in [
        "upstreams.\"app\".health_check.path: must start with `/`",
        "upstreams.\"app\".health_check.rise: must be at least 1",
        "upstreams.\"app\".health_check.expect_status: must be (LOW, HIGH)",
    ] {
        assert!(err.contains(want), "want {want} in:\n{err}");
    }
    let text = std::fs::read_to_string(&d.config).unwrap();
    let at = text.find("path: \"healthz\"").unwrap();
    let line = text[..at].matches('\n').count() + 1;
    let col = text[..at].rsplit('\n').next().unwrap().chars().count() + 1;
    let want = format!("{config}:{line}:{col}: upstreams.\"app\".health_check.path");
    assert!(err.contains(&want), "want {want} in:\n{err}");
}

//! End-to-end tests of the per-upstream-server stats: every configured upstream server
//! is listed (with zero counts until the proxy sends it requests) in `forkd stats`
//! (table and `--json`), the `Status` route and the `Metrics` route (labels
//! `upstream`, `server`); a reload that adds and removes servers updates the list
//! while a kept server keeps its cell; a binary upgrade keeps the cells.

mod support;

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use support::*;

const SETTLE: Duration = Duration::from_secs(30);

const ROUTES: &str = r#"(prefix: "/healthz", handler: Liveness),
            (prefix: "/status", handler: Status),
            (prefix: "/metrics", handler: Metrics),
            (prefix: "/api/", handler: Proxy(upstream: "app")),
            (prefix: "/auth/", handler: Proxy(upstream: "auth")),
            (prefix: "/", handler: Static(root: "www", index: ["index.html"])),"#;

fn upstreams(app: &[&str]) -> String {
    format!(
        r#"upstreams: {{
        "app": (servers: [{}], keepalive: 4),
        "auth": (servers: ["unix:/run/forkd-test-auth.sock"]),
    }},"#,
        support::upstream::server_list(app)
    )
}

fn daemon(app: &[&str]) -> TestDaemon {
    TestDaemon::builder()
        .workers(2)
        .top(&upstreams(app))
        .routes(ROUTES)
        .start()
}

/// `(upstream, server) -> cell` of the upstreams listed in a stats JSON document,
/// after checking each has every counter at zero.
fn listed(json: &Value) -> BTreeMap<(String, String), u64> {
    let list = json["upstreams"]
        .as_array()
        .unwrap_or_else(|| panic!("no upstreams list: {json}"));
    list.iter()
        .map(|u| {
            for counter in [
                "requests",
                "responses_1xx",
                "responses_2xx",
                "responses_3xx",
                "responses_4xx",
                "responses_5xx",
                "connect_errors",
                "timeouts",
                "retries",
                "connections_new",
                "connections_reused",
                "bodies_in_memory",
                "bodies_on_disk",
                "buffering_fell_back",
                "held_us",
                "client_transfer_us",
                "connections_open",
                "connections_idle",
            ] {
                assert_eq!(u[counter], 0, "{counter} of {u}");
            }
            assert_eq!(u["response_time"]["count"], 0, "{u}");
            assert_eq!(u["configured"], true, "{u}");
            (
                (
                    u["upstream"].as_str().unwrap().to_string(),
                    u["server"].as_str().unwrap().to_string(),
                ),
                u["cell"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn names(list: &BTreeMap<(String, String), u64>) -> BTreeSet<(String, String)> {
    list.keys().cloned().collect()
}

fn pairs(p: &[(&str, &str)]) -> BTreeSet<(String, String)> {
    p.iter()
        .map(|(u, s)| (u.to_string(), s.to_string()))
        .collect()
}

/// The `(upstream, server)` label pairs of `metric` in a Prometheus text.
fn prometheus_servers(text: &str, metric: &str) -> BTreeSet<(String, String)> {
    let scrape = scrape(text);
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == metric)
        .map(|s| {
            match &s.value {
                prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Gauge(v) => {
                    assert_eq!(*v, 0.0, "{metric} {:?}", s.labels)
                }
                prometheus_parse::Value::Histogram(b) => {
                    assert!(b.iter().all(|b| b.count == 0.0), "{metric} {:?}", s.labels)
                }
                other => panic!("{metric}: {other:?}"),
            }
            (
                s.labels
                    .get("upstream")
                    .expect("upstream label")
                    .to_string(),
                s.labels.get("server").expect("server label").to_string(),
            )
        })
        .collect()
}

#[test]
fn every_configured_upstream_server_is_listed_with_zero_counts_everywhere() {
    let d = daemon(&["127.0.0.1:9000", "127.0.0.1:9001"]);
    let want = pairs(&[
        ("app", "127.0.0.1:9000"),
        ("app", "127.0.0.1:9001"),
        ("auth", "unix:/run/forkd-test-auth.sock"),
    ]);

    let cli = listed(&stats_json(&d.config));
    assert_eq!(names(&cli), want);
    let cells: BTreeSet<u64> = cli.values().copied().collect();
    assert_eq!(cells.len(), 3, "one cell per server: {cli:?}");

    let status = d.get("/status");
    assert_eq!(status.status, 200);
    let json: Value = serde_json::from_str(&status.body_str()).unwrap();
    assert_eq!(listed(&json), cli, "/status and forkd stats agree");

    let metrics = d.get("/metrics");
    assert_eq!(metrics.status, 200);
    let text = metrics.body_str();
    for metric in [
        "forkd_upstream_requests_total",
        "forkd_upstream_connect_errors_total",
        "forkd_upstream_timeouts_total",
        "forkd_upstream_retries_total",
        "forkd_upstream_connections_open",
        "forkd_upstream_connections_idle",
        "forkd_upstream_response_time_seconds",
    ] {
        assert_eq!(prometheus_servers(&text, metric), want, "{metric}\n{text}");
    }

    let (code, table, err) = d.ctl(&["stats"]);
    assert_eq!(code, 0, "{err}");
    for (upstream, server) in &want {
        assert!(
            table
                .lines()
                .any(|l| l.starts_with(upstream.as_str()) && l.contains(server.as_str())),
            "{upstream} {server} missing from the table:\n{table}"
        );
    }
    d.assert_log_clean();
}

#[test]
fn a_reload_updates_the_list_and_a_kept_server_keeps_its_cell() {
    let mut d = daemon(&["127.0.0.1:9000", "127.0.0.1:9001"]);
    let before = listed(&stats_json(&d.config));
    let kept = ("app".to_string(), "127.0.0.1:9000".to_string());

    d.builder.top = upstreams(&["127.0.0.1:9002", "127.0.0.1:9000"]);
    let (code, out, err) = d.reload();
    assert_eq!(code, 0, "reload: {out} {err}\n{}", d.error_log());

    let want = pairs(&[
        ("app", "127.0.0.1:9000"),
        ("app", "127.0.0.1:9002"),
        ("auth", "unix:/run/forkd-test-auth.sock"),
    ]);
    let mut after = BTreeMap::new();
    let settled = wait_until(SETTLE, || {
        after = listed(&stats_json(&d.config));
        names(&after) == want
    });
    assert!(settled, "after the reload: {after:?}");
    assert_eq!(
        after[&kept], before[&kept],
        "the kept server keeps its cell"
    );
    let auth = (
        "auth".to_string(),
        "unix:/run/forkd-test-auth.sock".to_string(),
    );
    assert_eq!(after[&auth], before[&auth]);
    let new_cell = after[&("app".to_string(), "127.0.0.1:9002".to_string())];
    assert!(
        !before.values().any(|&c| c == new_cell),
        "a new server takes a never-used cell while there are some: {before:?} -> {after:?}"
    );

    let json: Value = serde_json::from_str(&d.get("/status").body_str()).unwrap();
    assert_eq!(
        names(&listed(&json)),
        want,
        "the workers' /status after adopting"
    );
    let text = d.get("/metrics").body_str();
    assert_eq!(
        prometheus_servers(&text, "forkd_upstream_requests_total"),
        want
    );
    d.stop();
}

#[test]
fn a_binary_upgrade_keeps_the_upstream_cells() {
    let mut d = TestDaemon::builder()
        .workers(1)
        .own_binary()
        .top(&upstreams(&["127.0.0.1:9000", "127.0.0.1:9001"]))
        .routes(ROUTES)
        .start();
    let before = listed(&stats_json(&d.config));
    let old = d.master().expect("a master");
    let (code, out, err) = d.ctl(&["-s", "upgrade"]);
    assert_eq!(code, 0, "upgrade: {out} {err}\n{}", d.error_log());
    let new = d.master().expect("a master after the upgrade");
    assert_ne!(new, old);
    d.adopt_master(new);
    assert!(
        !d.error_log()
            .contains("cannot share the previous master's stats region"),
        "{}",
        d.error_log()
    );
    assert_eq!(listed(&stats_json(&d.config)), before);
    d.stop();
}

//! End-to-end: `access_log_format: Json` writes one JSON object per request line
//! that serde_json parses, with the documented fields; weird targets and user agents
//! cannot break a line or add fields. The default stays the combined format.

mod support;

use serde_json::Value;
use std::time::Duration;
use support::*;

const SETTLE: Duration = Duration::from_secs(30);

/// The access log's lines once it has `n` of them (the workers flush at least once a
/// second).
fn lines(d: &TestDaemon, n: usize) -> Vec<String> {
    let mut got = Vec::new();
    let ok = wait_until(SETTLE, || {
        got = d.access_log().lines().map(str::to_string).collect();
        got.len() >= n
    });
    assert!(ok, "expected {n} access-log lines, got {got:?}");
    got
}

#[test]
fn a_static_request_is_logged_as_one_json_object_with_its_fields() {
    let d = TestDaemon::builder()
        .server("access_log_format: Json,")
        .file("a.html", b"hello\n")
        .start();
    let before = d.access_log().lines().count();
    let r = d.request(
        "GET /a.html?x=1 HTTP/1.1\r\nHost: localhost\r\nUser-Agent: test/1.0\r\n\
         Referer: http://example.test/\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 200);
    let all = lines(&d, before + 1);
    let v: Value =
        serde_json::from_str(&all[before]).unwrap_or_else(|e| panic!("{e}: {}", all[before]));
    assert_eq!(v["client"], "127.0.0.1");
    assert_eq!(v["method"], "GET");
    assert_eq!(v["target"], "/a.html?x=1");
    assert_eq!(v["protocol"], "HTTP/1.1");
    assert_eq!(v["status"], 200);
    assert_eq!(v["bytes"], 6);
    assert_eq!(v["user_agent"], "test/1.0");
    assert_eq!(v["referer"], "http://example.test/");
    assert!(v["request_time"].as_f64().is_some_and(|t| t >= 0.0), "{v}");
    let time = v["time"].as_str().unwrap();
    assert!(
        time.len() == 20 && time.ends_with('Z') && &time[10..11] == "T",
        "{time}"
    );
    // A static request has no id: present, null.
    assert!(v.get("request_id").is_some_and(Value::is_null), "{v}");
    assert!(v.get("upstream_addr").is_none(), "{v}");
    d.assert_log_clean();
}

#[test]
fn weird_targets_and_user_agents_stay_inside_their_json_strings() {
    let d = TestDaemon::builder()
        .server("access_log_format: Json,")
        .start();
    let before = d.access_log().lines().count();
    let target = "/x\"y\\z%22{\"status\":1}";
    let ua = "ua\"}, {\"status\": 7, \"x\": \"\t\u{e9}";
    let mut raw =
        format!("GET {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n").into_bytes();
    raw.extend_from_slice(b"User-Agent: ");
    raw.extend_from_slice(ua.as_bytes());
    raw.extend_from_slice(b"\xff\r\n\r\n");
    let mut s = d.connect();
    std::io::Write::write_all(&mut s, &raw).unwrap();
    let r = read_response(&mut s, false).expect("a response");
    assert_eq!(r.status, 404);
    let all = lines(&d, before + 1);
    assert_eq!(all.len(), before + 1, "one line: {all:?}");
    let v: Value =
        serde_json::from_str(&all[before]).unwrap_or_else(|e| panic!("{e}: {}", all[before]));
    assert_eq!(v["target"], target);
    assert_eq!(v["user_agent"], format!("{ua}\\xFF"));
    assert_eq!(v["status"], 404);
    assert!(v.get("x").is_none());
}

#[test]
fn the_default_stays_combined_and_a_reload_switches_to_json() {
    let mut d = TestDaemon::builder().file("a.html", b"hello\n").start();
    let before = d.access_log().lines().count();
    assert_eq!(d.get("/a.html").status, 200);
    let all = lines(&d, before + 1);
    assert!(
        all[before].starts_with("127.0.0.1 - - [")
            && all[before].contains("\"GET /a.html HTTP/1.1\" 200 6"),
        "{}",
        all[before]
    );
    d.builder.server.push_str("access_log_format: Json,");
    let (code, out, err) = d.reload();
    assert_eq!(code, 0, "{out} {err}");
    assert_eq!(d.get("/a.html").status, 200);
    let all = lines(&d, before + 2);
    let v: Value = serde_json::from_str(&all[before + 1])
        .unwrap_or_else(|e| panic!("{e}: {}", all[before + 1]));
    assert_eq!(v["target"], "/a.html");
}

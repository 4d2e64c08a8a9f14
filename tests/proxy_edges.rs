//! Edges of a proxied exchange end to end: a client that leaves while forkd waits
//! for the upstream (logged 499, the upstream connection closed rather than pooled),
//! and the client connection after a 502 or 504 of forkd's own (kept when the
//! request was read whole).

mod support;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::Duration;
use support::upstream::{Received, Reply, Settings, TestUpstream};
use support::*;

/// A daemon with `/` proxied to `servers` (an upstream named `app`, `keys` added).
fn proxy_daemon(servers: &[String], keys: &str) -> TestDaemon {
    let list = servers
        .iter()
        .map(|s| format!("\"{s}\""))
        .collect::<Vec<_>>()
        .join(", ");
    TestDaemon::builder()
        .top(&format!(
            "upstreams: {{ \"app\": (servers: [{list}], {keys}) }},"
        ))
        .routes(r#"(prefix: "/", handler: Proxy(upstream: "app")),"#)
        .start()
}

fn upstream(respond: impl Fn(&Received) -> Reply + Send + Sync + 'static) -> TestUpstream {
    TestUpstream::start(Settings::default(), respond)
}

/// A port nobody listens on.
fn refused_port() -> String {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string()
}

/// Reads one response with a `Content-Length`, as the bytes that came.
fn read_one(s: &mut TcpStream) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(1) => got.push(byte[0]),
            other => panic!(
                "the head ended early ({other:?}): {:?}",
                String::from_utf8_lossy(&got)
            ),
        }
    }
    let head = String::from_utf8_lossy(&got).into_owned();
    let len: usize = head
        .split("\r\n")
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .unwrap_or_else(|| panic!("no Content-Length: {head}"))
        .parse()
        .unwrap();
    let mut body = vec![0u8; len];
    s.read_exact(&mut body)
        .unwrap_or_else(|e| panic!("reading a {len}-byte body: {e}"));
    got.extend_from_slice(&body);
    got
}

/// The response with its `Date` value replaced by `D` (the only field that varies).
fn undated(raw: &[u8]) -> String {
    let text = String::from_utf8_lossy(raw).into_owned();
    let Some(at) = text.find("\r\nDate: ") else {
        return text;
    };
    let from = at + "\r\nDate: ".len();
    let to = from + text[from..].find("\r\n").expect("end of Date");
    format!("{}D{}", &text[..from], &text[to..])
}

const PAGE_502: &str = "<html><head><title>502 Bad Gateway</title></head><body>\
    <h1>502 Bad Gateway</h1><hr>forkd</body></html>\n";
const PAGE_504: &str = "<html><head><title>504 Gateway Timeout</title></head><body>\
    <h1>504 Gateway Timeout</h1><hr>forkd</body></html>\n";

/// An error page of forkd's own on a connection that stays open.
fn kept_page(status: &str, page: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\nServer: forkd\r\nDate: D\r\nContent-Type: text/html\r\n\
         Content-Length: {}\r\n\r\n{page}",
        page.len()
    )
}

#[test]
fn a_client_that_leaves_while_the_upstream_answers_is_logged_499_and_its_upstream_connection_closed(
) {
    let up = upstream(|req| match req.path() {
        "/slow" => Reply::ok(b"too late").delayed(Duration::from_millis(1500)),
        _ => Reply::ok(b"fresh"),
    });
    let d = proxy_daemon(&[up.addr().to_string()], "");
    let mut s = d.connect();
    s.write_all(b"GET /slow HTTP/1.1\r\nHost: h\r\n\r\n")
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || up.received().len() == 1),
        "the request reached the upstream"
    );
    drop(s);
    assert!(
        wait_until(Duration::from_secs(10), || d
            .access_log()
            .contains("\"GET /slow HTTP/1.1\" 499 0")),
        "{}",
        d.access_log()
    );
    // forkd let go of the upstream connection at once: the upstream sees it closed
    // when its delayed answer is through, and the next request needs a new one.
    assert!(
        wait_until(Duration::from_secs(10), || up.open_connections() == 0),
        "the upstream connection was closed, {} open",
        up.open_connections()
    );
    let r = d.get("/next");
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(r.body, b"fresh");
    assert_eq!(
        up.connections(),
        2,
        "the abandoned connection was not pooled"
    );
    let stats = stats::stats_json(&d.config);
    assert_eq!(
        stats["totals"]["responses_499"].as_u64(),
        Some(1),
        "{stats}"
    );
    assert!(
        !d.access_log().contains("/slow HTTP/1.1\" 200"),
        "{}",
        d.access_log()
    );
}

#[test]
fn a_client_that_half_closes_after_its_request_still_gets_its_response() {
    let up = upstream(|_| Reply::ok(b"late but wanted").delayed(Duration::from_millis(300)));
    let d = proxy_daemon(&[up.addr().to_string()], "");
    let mut s = d.connect();
    s.write_all(b"GET /a HTTP/1.1\r\nHost: h\r\n\r\nGET /b HTTP/1.1\r\nHost: h\r\n\r\n")
        .unwrap();
    // The next request is already buffered: forkd must not take the FIN after it
    // for a client that left.
    s.shutdown(Shutdown::Write).unwrap();
    let r = read_response(&mut s, false).expect("the first response");
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(r.body, b"late but wanted");
}

#[test]
fn after_a_502_of_its_own_forkd_keeps_the_client_connection_when_the_request_was_read() {
    let d = proxy_daemon(&[refused_port()], "");
    let mut s = d.connect();
    let want = kept_page("502 Bad Gateway", PAGE_502);
    // A GET, then a POST with its body on the same connection, then one that closes.
    s.write_all(b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n").unwrap();
    assert_eq!(undated(&read_one(&mut s)), want);
    s.write_all(b"POST /b HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello")
        .unwrap();
    assert_eq!(undated(&read_one(&mut s)), want);
    s.write_all(b"GET /c HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        .unwrap();
    let last = read_to_close(&mut s);
    let closing = format!(
        "HTTP/1.1 502 Bad Gateway\r\nServer: forkd\r\nDate: D\r\nContent-Type: text/html\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{PAGE_502}",
        PAGE_502.len()
    );
    assert_eq!(undated(&last), closing);
    let logged = |path: &str| d.access_log().contains(&format!("{path} HTTP/1.1\" 502 "));
    assert!(
        wait_until(Duration::from_secs(10), || ["/a", "/b", "/c"]
            .iter()
            .all(|p| logged(p))),
        "{}",
        d.access_log()
    );
}

#[test]
fn after_a_504_of_its_own_forkd_keeps_the_client_connection_and_answers_the_next_request() {
    let up = upstream(|req| match req.path() {
        "/slow" => Reply::ok(b"too late").delayed(Duration::from_secs(3)),
        _ => Reply::ok(b"quick"),
    });
    let d = proxy_daemon(
        &[up.addr().to_string()],
        "read_timeout: \"300ms\", retries: 0,",
    );
    let mut s = d.connect();
    let want = kept_page("504 Gateway Timeout", PAGE_504);
    s.write_all(b"GET /slow HTTP/1.1\r\nHost: h\r\n\r\n")
        .unwrap();
    assert_eq!(undated(&read_one(&mut s)), want);
    s.write_all(b"GET /quick HTTP/1.1\r\nHost: h\r\n\r\n")
        .unwrap();
    let r = read_response(&mut s, false).expect("the next response on the same connection");
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(r.body, b"quick");
}

#[test]
fn after_a_502_with_the_request_body_unread_the_connection_closes() {
    let d = proxy_daemon(&[refused_port()], "");
    let mut s = d.connect();
    // The body is announced but never sent: what would follow on the connection is
    // not a request.
    s.write_all(b"POST /b HTTP/1.1\r\nHost: h\r\nContent-Length: 100\r\n\r\npart")
        .unwrap();
    let raw = read_to_close(&mut s);
    let text = undated(&raw);
    assert!(text.starts_with("HTTP/1.1 502 Bad Gateway\r\n"), "{text}");
    assert!(text.contains("\r\nConnection: close\r\n"), "{text}");
}

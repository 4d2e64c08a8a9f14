//! The shared proxy cache (issue 24), end to end: a `Proxy` route with `cache` in
//! front of a test application whose answers each test chooses, checked the way a
//! client and an operator see it: the bytes of the answers, how many requests reached
//! the application, the access log's `cache` field, the zone's files on disk.
//!
//! Nothing here waits a fixed time for the daemon: the tests poll (with a bound) for
//! what must happen anyway. Staleness comes from the application's own fields
//! (`Cache-Control: max-age=60` with `Age: 60` arrives stale), never from waiting for
//! an entry to expire.

mod support;

use serde_json::Value;
use std::collections::HashMap;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use support::upstream::{pattern_byte, pattern_hash, upstream, Reply, TestUpstream, Writer};
use support::*;

/// The zone of most tests (as the issue's example, smaller).
const ZONE: &str = r#"max_size: "64MiB", index_entries: 1024, inactive: "10m""#;

/// A response with `Content-Length` and these fields.
fn full(status: u16, fields: &[(&str, &str)], body: &[u8]) -> Reply {
    Reply::Full {
        status,
        extra: fields
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect(),
        body: body.to_vec(),
    }
}

/// A config with the upstream `app` (`upstream_keys` added to it), the zone `pages`
/// (`zone_keys` after its path), the JSON access log and `routes` after `/healthz`.
fn builder(up: SocketAddr, upstream_keys: &str, zone_keys: &str, routes: &str) -> Builder {
    TestDaemon::builder()
        .top(&format!(
            r#"upstreams: {{ "app": (servers: ["{up}"], {upstream_keys}) }},
    caches: {{ "pages": (path: "cache/pages", {zone_keys}) }},"#
        ))
        .server("access_log_format: Json,")
        .routes(&format!(
            r#"(prefix: "/healthz", handler: Liveness),
            {routes}"#
        ))
}

/// A route on `prefix` proxied to `app` and cached in `pages` with `keys`.
fn cached_route(prefix: &str, keys: &str) -> String {
    format!(
        r#"(prefix: "{prefix}", handler: Proxy(upstream: "app", cache: Some((zone: "pages", {keys})))),"#
    )
}

/// The usual daemon: one cached route on `/` with `keys`.
fn daemon(up: &TestUpstream, keys: &str) -> TestDaemon {
    builder(up.addr(), "", ZONE, &cached_route("/", keys)).start()
}

/// GET `path` on a new connection with `extra` field lines (each ending in CRLF).
fn get(d: &TestDaemon, path: &str, extra: &str) -> Response {
    d.request(&format!(
        "GET {path} HTTP/1.1\r\nHost: localhost\r\n{extra}Connection: close\r\n\r\n"
    ))
}

/// The `cache` field of the access-log lines for `target`, in log order, once there
/// are at least `n` of them (workers write their lines at least once a second).
fn cache_log(d: &TestDaemon, target: &str, n: usize) -> Vec<String> {
    let mut got = Vec::new();
    let ok = wait_until(SETTLE, || {
        got = log_lines(d, target)
            .iter()
            .map(|v| v["cache"].as_str().unwrap_or("-").to_string())
            .collect();
        got.len() >= n
    });
    assert!(
        ok,
        "{n} access-log lines for {target} expected, got {got:?}:\n{}",
        d.access_log()
    );
    got
}

/// The access-log lines for `target`, parsed.
fn log_lines(d: &TestDaemon, target: &str) -> Vec<Value> {
    d.access_log()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["target"] == target)
        .collect()
}

/// Requests for `target` (path and query) the application answered.
fn asked(up: &TestUpstream, target: &str) -> usize {
    up.received().iter().filter(|r| r.path() == target).count()
}

/// The response's fields without those named in `skip`, in order.
fn fields_without(r: &Response, skip: &[&str]) -> Vec<(String, String)> {
    r.headers
        .iter()
        .filter(|(n, _)| !skip.iter().any(|s| n.eq_ignore_ascii_case(s)))
        .cloned()
        .collect()
}

/// The `Age` of a response from the cache.
fn age(r: &Response) -> u64 {
    r.header("Age")
        .unwrap_or_else(|| panic!("no Age on an answer from the cache:\n{}", r.head))
        .parse()
        .unwrap_or_else(|e| panic!("Age is not a number ({e}):\n{}", r.head))
}

/// A chunked body decoded.
fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let eol = raw
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("chunk size line");
        let size = usize::from_str_radix(std::str::from_utf8(&raw[..eol]).unwrap(), 16).unwrap();
        raw = &raw[eol + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&raw[..size]);
        raw = &raw[size + 2..];
    }
}

/// The body files of the zone (`<path>/<hh>/<32 hex>`), and any other file in its
/// folders but the index (a writer's leftovers).
fn zone_files(d: &TestDaemon) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let root = d.path("cache/pages");
    let (mut bodies, mut other) = (Vec::new(), Vec::new());
    for sub in std::fs::read_dir(&root).unwrap().flatten() {
        if !sub.path().is_dir() {
            continue;
        }
        for f in std::fs::read_dir(sub.path()).unwrap().flatten() {
            let name = f.file_name().to_string_lossy().into_owned();
            let is_body = name.len() == 32 && name.bytes().all(|b| b.is_ascii_hexdigit());
            if is_body {
                bodies.push(f.path());
            } else {
                other.push(f.path());
            }
        }
    }
    bodies.sort();
    (bodies, other)
}

/// Bytes of the zone's body files.
fn zone_bytes(d: &TestDaemon) -> u64 {
    zone_files(d)
        .0
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum()
}

/// Waits until the zone has `n` body files (a store is published once the
/// application's body is in whole, which may be just after the client has it).
fn wait_files(d: &TestDaemon, n: usize) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let ok = wait_until(SETTLE, || {
        files = zone_files(d).0;
        files.len() == n
    });
    assert!(ok, "{n} body files expected in the zone, found {files:?}");
    files
}

/// How many times the error log says a zone's index was filled from the files.
fn loads(d: &TestDaemon) -> Vec<String> {
    d.error_log()
        .lines()
        .filter(|l| l.contains("cache zone `pages`") && l.contains("loaded from"))
        .map(str::to_string)
        .collect()
}

/// Waits until the loader ran `n` times in all; its last line.
fn wait_loaded(d: &TestDaemon, n: usize) -> String {
    let ok = wait_until(SETTLE, || loads(d).len() >= n);
    assert!(ok, "the loader did not run {n} times:\n{}", d.error_log());
    loads(d).pop().unwrap()
}

/// A point where the application holds requests until the test opens it; it
/// records the heads of the requests that arrived (before holding them).
#[derive(Clone)]
struct Valve(Arc<(Mutex<ValveState>, Condvar)>);

/// Whether the valve is open, and the heads of the requests that reached it.
type ValveState = (bool, Vec<String>);

impl Valve {
    fn closed() -> Valve {
        Valve(Arc::new((Mutex::new((false, Vec::new())), Condvar::new())))
    }

    /// Called by the application: counts the request, then waits for the valve.
    fn pass(&self, head: &str) {
        let (state, cv) = &*self.0;
        let mut s = state.lock().unwrap();
        s.1.push(head.to_string());
        cv.notify_all();
        while !s.0 {
            s = cv.wait(s).unwrap();
        }
    }

    fn open(&self) {
        self.0 .0.lock().unwrap().0 = true;
        self.0 .1.notify_all();
    }

    fn heads(&self) -> Vec<String> {
        self.0 .0.lock().unwrap().1.clone()
    }

    fn arrived(&self) -> usize {
        self.0 .0.lock().unwrap().1.len()
    }

    fn wait_arrived(&self, n: usize) {
        assert!(
            wait_until(SETTLE, || self.arrived() >= n),
            "{} requests reached the application, not {n}",
            self.arrived()
        );
    }
}

/// Counts a request for `target`: its number (from 1) and the body
/// `"<target> #<n>"`, which tells a client whether its answer was fetched anew.
fn numbered(counts: &Mutex<HashMap<String, usize>>, target: &str) -> (usize, Vec<u8>) {
    let mut c = counts.lock().unwrap();
    let n = c.entry(target.to_string()).or_insert(0);
    *n += 1;
    (*n, format!("{target} #{n}").into_bytes())
}

// ---------------------------------------------------------------------------------------
// Hits
// ---------------------------------------------------------------------------------------

/// A first GET goes to the application and is stored; the next ones are answered
/// from the zone: the same status, fields and body byte for byte, with forkd's `Date`
/// and an `Age`, and the application asked once. Small bodies, bodies sent with
/// `sendfile` and chunked ones alike (a chunked one is answered with its length).
#[test]
fn a_miss_is_fetched_once_and_then_answered_from_the_zone_byte_for_byte() {
    let page = noise(5000, 1);
    let big = noise(300_000, 2);
    let (page2, big2) = (page.clone(), big.clone());
    let date = http_date(now_secs());
    let up = upstream(move |r| match r.path() {
        "/page" => full(
            200,
            &[
                ("Date", &date),
                ("Server", "app/1.0"),
                ("Cache-Control", "max-age=600"),
                ("Content-Type", "text/html; charset=utf-8"),
                ("ETag", "\"p1\""),
                ("X-App", "a"),
            ],
            &page2,
        ),
        "/big" => full(200, &[("Cache-Control", "max-age=600")], &big2),
        // No freshness of its own: the route's `valid` keeps it.
        "/chunked" => Reply::Large {
            len: 70_000,
            chunked: true,
        },
        _ => full(404, &[], b""),
    });
    let d = daemon(&up, r#"valid: [(200, "10m"), (404, "1m")]"#);

    let miss = get(&d, "/page", "");
    assert_eq!(miss.status, 200, "{}", miss.head);
    assert_eq!(miss.body, page);
    for round in 0..2 {
        let hit = get(&d, "/page", "");
        assert_eq!(hit.status, 200, "{}", hit.head);
        assert_eq!(hit.body, page, "hit {round}: the stored body");
        assert!(age(&hit) < 60, "{}", hit.head);
        let hit_date = hit.header("Date").expect("Date on a hit");
        assert!(
            hit_date.ends_with(" GMT") && hit_date.len() == 29,
            "{}",
            hit.head
        );
        // The stored fields in the application's order (its `Server` too), then the
        // length and the connection's: the miss's head, but forkd's Date and the Age.
        assert_eq!(
            fields_without(&hit, &["date", "age"]),
            fields_without(&miss, &["date"]),
            "hit {round}:\n{}\nmiss:\n{}",
            hit.head,
            miss.head
        );
        assert!(
            hit.head.starts_with("HTTP/1.1 200 OK\r\nDate: "),
            "{}",
            hit.head
        );
    }
    assert_eq!(asked(&up, "/page"), 1, "the application was asked again");
    assert_eq!(cache_log(&d, "/page", 3), ["MISS", "HIT", "HIT"]);
    let lines = log_lines(&d, "/page");
    assert_eq!(lines[1]["status"], 200);
    assert_eq!(lines[1]["bytes"], 5000, "{}", lines[1]);
    assert!(lines[1].get("upstream_addr").is_none(), "{}", lines[1]);

    // Larger than what the first read of a file brings: sent from the file.
    assert_eq!(get(&d, "/big", "").body, big);
    let hit = get(&d, "/big", "");
    assert_eq!(hit.header("Content-Length"), Some("300000"));
    assert!(hit.body == big, "the big hit differs from the stored body");
    assert_eq!(asked(&up, "/big"), 1);

    // Hits one after another on a kept-alive connection: each framed by its length,
    // the file-sent one too.
    let mut c = Conn::connect(d.port).unwrap();
    c.send(b"GET /big HTTP/1.1\r\nHost: localhost\r\n\r\nGET /page HTTP/1.1\r\nHost: localhost\r\n\r\nGET /big HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    for want in [&big, &page, &big] {
        let r = c.response().unwrap();
        assert!(r.body == *want, "a pipelined hit differs");
    }
    c.wait_close(Duration::from_secs(10)).unwrap();
    assert_eq!((asked(&up, "/big"), asked(&up, "/page")), (1, 1));

    // Chunked from the application; stored whole, answered with its length.
    let miss = get(&d, "/chunked", "");
    assert_eq!(miss.header("Transfer-Encoding"), Some("chunked"));
    let want: Vec<u8> = (0..70_000).map(pattern_byte).collect();
    assert_eq!(dechunk(&miss.body), want);
    let hit = get(&d, "/chunked", "");
    assert_eq!(hit.header("Content-Length"), Some("70000"), "{}", hit.head);
    assert_eq!(hit.header("Transfer-Encoding"), None, "{}", hit.head);
    assert_eq!(
        support::upstream::fnv(support::upstream::FNV_START, &hit.body),
        pattern_hash(70_000)
    );
    assert_eq!(asked(&up, "/chunked"), 1);
    assert_eq!(cache_log(&d, "/chunked", 2), ["MISS", "HIT"]);
}

/// HEAD: a HEAD that misses is proxied and not stored (it has no body to keep); a
/// HEAD of a stored entry is its head, with its length, and no body byte.
#[test]
fn a_head_miss_is_not_stored_and_a_head_of_an_entry_has_no_body() {
    let counts = Arc::new(Mutex::new(HashMap::new()));
    let c = counts.clone();
    let up = upstream(move |r| {
        let (_, body) = numbered(&c, r.path());
        full(200, &[("Cache-Control", "max-age=600")], &body)
    });
    let d = daemon(&up, "");
    let head_only = |d: &TestDaemon| {
        let mut s = d.connect();
        s.write_all(b"HEAD /h HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .unwrap();
        read_until_close(&mut s)
    };
    let first = head_only(&d);
    assert!(first.starts_with(b"HTTP/1.1 200 "), "{first:?}");
    assert_eq!(up.received()[0].method(), "HEAD");
    // Not stored: the GET goes to the application.
    assert_eq!(get(&d, "/h", "").body, b"/h #2");
    let raw = head_only(&d);
    let text = String::from_utf8_lossy(&raw);
    assert!(
        text.ends_with("\r\n\r\n") && text.contains("\r\nContent-Length: 5\r\n"),
        "a HEAD from the cache is its head alone:\n{text}"
    );
    assert!(text.contains("\r\nAge: "), "{text}");
    assert_eq!(get(&d, "/h", "").body, b"/h #2");
    assert_eq!(up.received().len(), 2);
    assert_eq!(cache_log(&d, "/h", 4), ["MISS", "MISS", "HIT", "HIT"]);
}

// ---------------------------------------------------------------------------------------
// RFC 9111: what is stored
// ---------------------------------------------------------------------------------------

/// Which responses are stored, each seen by a client as whether a second request
/// gets the first one's body (`#1`) or a new one from the application (`#2`).
#[test]
fn responses_are_stored_as_rfc_9111_allows_and_not_otherwise() {
    let now = now_secs();
    let (date, later, earlier) = (http_date(now), http_date(now + 600), http_date(now - 60));
    let counts = Arc::new(Mutex::new(HashMap::new()));
    let c = counts.clone();
    let up = upstream(move |r| {
        let target = r.path().to_string();
        let (_, body) = numbered(&c, &target);
        let cc = |v: &'static str| ("Cache-Control", v);
        let path = target.split('?').next().unwrap().to_string();
        let (status, fields): (u16, Vec<(&str, &str)>) = match path.as_str() {
            "/no-store" => (200, vec![cc("no-store, max-age=600")]),
            "/private" => (200, vec![cc("private, max-age=600")]),
            "/private-field" => (200, vec![cc("private=\"x-user\", max-age=600")]),
            "/cookie" => (200, vec![cc("max-age=600"), ("Set-Cookie", "s=1")]),
            "/cookie-public" => (200, vec![cc("public, max-age=600"), ("Set-Cookie", "s=1")]),
            "/auth" | "/auth-none" => (200, vec![cc("max-age=600")]),
            "/auth-public" => (200, vec![cc("public, max-age=600")]),
            "/auth-s-maxage" => (200, vec![cc("s-maxage=600")]),
            "/expires" => (200, vec![("Date", &date), ("Expires", &later)]),
            "/expired" => (200, vec![("Date", &date), ("Expires", &earlier)]),
            "/expires-bad" => (200, vec![("Expires", "0")]),
            "/max-age-0" => (200, vec![cc("max-age=0")]),
            "/no-cache" => (200, vec![cc("no-cache, max-age=600")]),
            "/s-maxage" => (200, vec![cc("s-maxage=600, max-age=0")]),
            "/aged" => (200, vec![cc("max-age=600"), ("Age", "600")]),
            "/aged-some" => (200, vec![cc("max-age=600"), ("Age", "100")]),
            "/vary-star" => (200, vec![cc("max-age=600"), ("Vary", "*")]),
            "/vary-many" => (200, vec![cc("max-age=600"), ("Vary", "a, b, c, d, e")]),
            "/valid" | "/plain/valid" | "/nq/k" | "/q" | "/host" | "/req-no-store" => (200, vec![]),
            "/missing" => (404, vec![]),
            "/error" => (500, vec![]),
            "/partial" => (
                206,
                vec![cc("max-age=600"), ("Content-Range", "bytes 0-4/10")],
            ),
            "/created" => (201, vec![cc("max-age=600")]),
            _ => (400, vec![]),
        };
        full(status, &fields, &body)
    });
    let routes = [
        cached_route("/plain/", ""),
        cached_route(
            "/nq/",
            r#"key: "{scheme}{host}{path}", valid: [(0, "10m")]"#,
        ),
        cached_route("/", r#"valid: [(200, "10m"), (404, "1m")]"#),
    ]
    .concat();
    let d = builder(up.addr(), "", ZONE, &routes).start();

    const AUTH: &str = "Authorization: Basic dTpw\r\n";
    // (target, request fields, second request stored: the first's body again)
    let cases: &[(&str, &str, bool)] = &[
        ("/no-store", "", false),
        ("/private", "", false),
        ("/private-field", "", false),
        ("/cookie", "", false),
        ("/cookie-public", "", true),
        ("/auth", AUTH, false),
        ("/auth-public", AUTH, true),
        ("/auth-s-maxage", AUTH, true),
        ("/expires", "", true),
        ("/expired", "", false),
        ("/expires-bad", "", false),
        ("/max-age-0", "", false),
        ("/no-cache", "", false),
        ("/s-maxage", "", true),
        // Its age on arrival used its whole lifetime: stale at once.
        ("/aged", "", false),
        ("/aged-some", "", true),
        ("/vary-star", "", false),
        ("/vary-many", "", false),
        // Nothing said: the route's `valid` table decides.
        ("/valid", "", true),
        ("/missing", "", true),
        ("/error", "", false),
        ("/plain/valid", "", false),
        ("/partial", "", false),
        // A status stored on explicit freshness only if `valid` lists it.
        ("/created", "", false),
    ];
    let mut wrong = Vec::new();
    for &(target, extra, stored) in cases {
        let a = get(&d, target, extra);
        let b = get(&d, target, extra);
        let want = if stored { 1 } else { 2 };
        if a.body != format!("{target} #1").as_bytes()
            || b.body != format!("{target} #{want}").as_bytes()
        {
            wrong.push(format!(
                "{target}: stored {stored}, got {:?} then {:?}",
                a.body_str(),
                b.body_str()
            ));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    // The application's status and fields come back from the cache too.
    let r = get(&d, "/missing", "");
    assert_eq!((r.status, r.body_str().as_str()), (404, "/missing #1"));
    assert!(r.header("Age").is_some(), "{}", r.head);
    // The age it had on arrival counts in the `Age` of every hit.
    let r = get(&d, "/aged-some", "");
    assert!((100..600).contains(&age(&r)), "{}", r.head);
    let r = get(&d, "/cookie-public", "");
    assert_eq!(r.header("Set-Cookie"), Some("s=1"), "{}", r.head);

    // A request without Authorization may use an entry whose request had none, and
    // must not get what was sent to one that had it.
    assert_eq!(get(&d, "/auth-none", "").body, b"/auth-none #1");
    assert_eq!(get(&d, "/auth-none", "").body, b"/auth-none #1");
    assert_eq!(get(&d, "/auth", "").body, b"/auth #3");

    // The key: the query and the host are parts of `{scheme}{host}{uri}`; a route
    // whose key has `{path}` alone shares one entry over queries.
    assert_eq!(get(&d, "/q?a=1", "").body, b"/q?a=1 #1");
    assert_eq!(get(&d, "/q?a=2", "").body, b"/q?a=2 #1");
    assert_eq!(get(&d, "/q?a=1", "").body, b"/q?a=1 #1");
    assert_eq!(get(&d, "/nq/k?a=1", "").body, b"/nq/k?a=1 #1");
    assert_eq!(get(&d, "/nq/k?a=2", "").body, b"/nq/k?a=1 #1");
    let host = |h: &str| {
        d.request(&format!(
            "GET /host HTTP/1.1\r\nHost: {h}\r\nConnection: close\r\n\r\n"
        ))
        .body_str()
    };
    assert_eq!(host("a.example"), "/host #1");
    assert_eq!(host("b.example"), "/host #2");
    assert_eq!(host("A.EXAMPLE:8080"), "/host #1");
    assert_eq!(host("b.example"), "/host #2");

    // A request that says `no-store` is neither answered from nor stored in the zone.
    let ns = "Cache-Control: no-store\r\n";
    assert_eq!(get(&d, "/req-no-store", ns).body, b"/req-no-store #1");
    assert_eq!(get(&d, "/req-no-store", "").body, b"/req-no-store #2");
    assert_eq!(get(&d, "/req-no-store", ns).body, b"/req-no-store #3");
    assert_eq!(get(&d, "/req-no-store", "").body, b"/req-no-store #2");
    assert_eq!(
        cache_log(&d, "/req-no-store", 4),
        ["BYPASS", "MISS", "BYPASS", "HIT"]
    );

    // Other methods go to the application, and leave the entry as it was.
    let post = d.request(
        "POST /valid HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi",
    );
    assert_eq!(post.body, b"/valid #2");
    let post = d.request("POST /valid HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    assert_eq!(post.body, b"/valid #3");
    assert_eq!(get(&d, "/valid", "").body, b"/valid #1");
    let log = cache_log(&d, "/valid", 5);
    assert_eq!(
        [&log[..2], &log[3..]].concat(),
        ["MISS", "HIT", "BYPASS", "HIT"]
    );
    assert_eq!(cache_log(&d, "/no-store", 2), ["MISS", "MISS"]);
}

/// `Vary: Accept-Encoding`: each encoding asked for is its own entry, each then a
/// hit with its own body; a request naming another value is a miss of its own.
#[test]
fn responses_that_vary_are_stored_apart_per_value_and_each_then_hits() {
    let counts = Arc::new(Mutex::new(HashMap::new()));
    let c = counts.clone();
    let up = upstream(move |r| {
        let ae = r.header("accept-encoding").unwrap_or("none").to_string();
        let (n, _) = numbered(&c, r.path());
        let body = format!("{ae} #{n}");
        full(
            200,
            &[
                ("Cache-Control", "max-age=600"),
                ("Vary", "Accept-Encoding"),
            ],
            body.as_bytes(),
        )
    });
    let d = daemon(&up, "");
    let ask = |ae: &str| {
        let extra = if ae.is_empty() {
            String::new()
        } else {
            format!("Accept-Encoding: {ae}\r\n")
        };
        let r = get(&d, "/v", &extra);
        assert_eq!(r.status, 200, "{}", r.head);
        r
    };
    let order = [
        ("gzip", "gzip #1"),
        ("br", "br #2"),
        ("gzip", "gzip #1"),
        ("br", "br #2"),
        ("", "none #3"),
        ("", "none #3"),
        ("gzip", "gzip #1"),
    ];
    for (ae, want) in order {
        let r = ask(ae);
        assert_eq!(r.body_str(), want, "Accept-Encoding {ae:?}:\n{}", r.head);
        assert_eq!(r.header("Vary"), Some("Accept-Encoding"), "{}", r.head);
    }
    assert_eq!(up.received().len(), 3);
    assert_eq!(
        cache_log(&d, "/v", 7),
        ["MISS", "MISS", "HIT", "HIT", "MISS", "HIT", "HIT"]
    );
}

// ---------------------------------------------------------------------------------------
// Conditional requests
// ---------------------------------------------------------------------------------------

/// A client's `If-None-Match` or `If-Modified-Since` that the entry satisfies gets a
/// 304 from the cache, with the entry's validators and no body; one it does not
/// satisfy gets the entry. The application is asked once.
#[test]
fn a_clients_conditional_request_is_answered_304_from_the_entry() {
    let lm = http_date(now_secs() - 3600);
    let lm2 = lm.clone();
    let up = upstream(move |_| {
        full(
            200,
            &[
                ("Cache-Control", "max-age=600"),
                ("ETag", "\"c1\""),
                ("Last-Modified", &lm2),
                ("Content-Type", "text/plain"),
            ],
            b"conditional body",
        )
    });
    let d = daemon(&up, "");
    assert_eq!(get(&d, "/c", "").body, b"conditional body");
    let cases = [
        ("If-None-Match: \"c1\"\r\n".to_string(), 304),
        ("If-None-Match: \"x\", W/\"c1\"\r\n".to_string(), 304),
        ("If-None-Match: *\r\n".to_string(), 304),
        (format!("If-Modified-Since: {lm}\r\n"), 304),
        (
            format!("If-Modified-Since: {}\r\n", http_date(now_secs())),
            304,
        ),
        ("If-None-Match: \"c2\"\r\n".to_string(), 200),
        (
            format!("If-Modified-Since: {}\r\n", http_date(now_secs() - 7200)),
            200,
        ),
        // If-None-Match decides over If-Modified-Since (RFC 9110 §13.2.2).
        (
            format!("If-None-Match: \"c2\"\r\nIf-Modified-Since: {lm}\r\n"),
            200,
        ),
    ];
    for (extra, status) in &cases {
        let r = get(&d, "/c", extra);
        assert_eq!(r.status, *status, "{extra}:\n{}", r.head);
        if *status == 304 {
            assert_eq!(r.header("ETag"), Some("\"c1\""), "{}", r.head);
            assert_eq!(r.header("Last-Modified"), Some(lm.as_str()), "{}", r.head);
            assert_eq!(r.header("Cache-Control"), Some("max-age=600"), "{}", r.head);
            assert_eq!(r.header("Content-Type"), None, "{}", r.head);
            assert!(r.header("Age").is_some(), "{}", r.head);
        } else {
            assert_eq!(r.body, b"conditional body");
        }
    }
    // Nothing follows a 304's head on the connection.
    let mut s = d.connect();
    s.write_all(
        b"GET /c HTTP/1.1\r\nHost: localhost\r\nIf-None-Match: \"c1\"\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    let raw = read_until_close(&mut s);
    assert!(
        raw.starts_with(b"HTTP/1.1 304 ") && raw.ends_with(b"\r\n\r\n"),
        "{}",
        String::from_utf8_lossy(&raw)
    );
    assert_eq!(up.received().len(), 1);
    let log = cache_log(&d, "/c", cases.len() + 2);
    assert!(log[1..].iter().all(|s| s == "HIT"), "{log:?}");

    // A miss with a conditional or a range asks the application for the whole
    // response, which is stored; the entry then answers the conditional.
    let r = get(
        &d,
        "/c2",
        "If-None-Match: \"c1\"\r\nIf-Modified-Since: Sun, 06 Nov 1994 08:49:37 GMT\r\n",
    );
    assert_eq!(r.status, 200, "{}", r.head);
    let r = get(&d, "/c3", "Range: bytes=0-3\r\nIf-Range: \"c1\"\r\n");
    assert_eq!(
        (r.status, r.body.as_slice()),
        (200, &b"conditional body"[..])
    );
    for sent in &up.received()[1..] {
        for name in ["if-none-match", "if-modified-since", "range", "if-range"] {
            assert_eq!(sent.header(name), None, "{name} forwarded:\n{}", sent.head);
        }
    }
    let r = get(&d, "/c2", "If-None-Match: \"c1\"\r\n");
    assert_eq!(r.status, 304, "{}", r.head);
    assert_eq!(get(&d, "/c3", "").body, b"conditional body");
    assert_eq!(up.received().len(), 3);
}

// ---------------------------------------------------------------------------------------
// One fetch for all workers
// ---------------------------------------------------------------------------------------

/// The worker holding the server's end of the connection from `client_port`.
fn holder(d: &TestDaemon, client_port: u16) -> Option<i32> {
    let local = format!("0100007F:{:04X}", d.port);
    let remote = format!("0100007F:{client_port:04X}");
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let inode = table
        .lines()
        .map(|l| l.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .find(|f| f.len() > 9 && f[1] == local && f[2] == remote)?[9]
        .clone();
    let link = format!("socket:[{inode}]");
    d.workers()
        .into_iter()
        .find(|&w| fd_links(w).contains(&link))
}

/// An entry stored through one worker is a hit on the other: connections are
/// opened until one lands on the worker that did not store it, which answers it from
/// the zone; the application is asked once.
#[test]
fn an_entry_stored_through_one_worker_is_a_hit_on_the_other() {
    let body = noise(20_000, 7);
    let b2 = body.clone();
    let up = upstream(move |_| full(200, &[("Cache-Control", "max-age=600")], &b2));
    let d = builder(up.addr(), "", ZONE, &cached_route("/", ""))
        .workers(2)
        .accept("ReusePort")
        .start();
    // Keep-alive exchanges, so the connection is still there to ask who holds it.
    let exchange = || {
        let mut c = Conn::connect(d.port).unwrap();
        let r = c
            .exchange(b"GET /x HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .unwrap();
        let w = holder(&d, c.s.local_addr().unwrap().port());
        (c, r, w.expect("a worker holds the connection"))
    };
    let (_first, r, storer) = exchange();
    assert_eq!(r.body, body);
    let mut kept = Vec::new();
    let mut other = None;
    for _ in 0..200 {
        let (c, r, w) = exchange();
        assert_eq!(r.status, 200, "{}", r.head);
        assert!(r.body == body, "a hit's body differs");
        assert!(r.header("Age").is_some(), "{}", r.head);
        kept.push(c);
        if w != storer {
            other = Some(w);
            break;
        }
    }
    assert!(
        other.is_some(),
        "200 connections all landed on worker {storer}"
    );
    assert_eq!(
        up.received().len(),
        1,
        "the other worker asked the application"
    );
    let log = cache_log(&d, "/x", kept.len() + 1);
    let hits = log.iter().filter(|s| *s == "HIT").count();
    assert_eq!((log.len(), hits), (kept.len() + 1, kept.len()), "{log:?}");
}

/// The sum over the daemon's workers of their gauge `key` (sampled once a second).
fn gauge(d: &TestDaemon, key: &str) -> u64 {
    stats_json(&d.config)["workers"]
        .as_array()
        .expect("workers")
        .iter()
        .map(|w| w[key].as_u64().unwrap_or(0))
        .sum()
}

/// The stampede: 50 clients ask for one key at once, on two workers, while the
/// application holds its answer; the application gets one request, and every
/// client the whole body once it answers.
#[test]
fn concurrent_misses_for_one_key_on_all_workers_make_one_upstream_request() {
    const N: usize = 50;
    let valve = Valve::closed();
    let v = valve.clone();
    let body = noise(40_000, 9);
    let b2 = body.clone();
    let up = upstream(move |r| {
        v.pass(&r.head);
        full(200, &[("Cache-Control", "max-age=600")], &b2)
    });
    let d = builder(
        up.addr(),
        "",
        ZONE,
        &cached_route("/", r#"lock_timeout: "120s""#),
    )
    .workers(2)
    .accept("ReusePort")
    .start();
    // Every client connected first, then all ask at once (in the same
    // milliseconds, as many as the machine allows).
    let mut conns: Vec<TcpStream> = (0..N).map(|_| d.connect()).collect();
    assert!(
        wait_until(SETTLE, || gauge(&d, "connections_active") >= N as u64),
        "{} connections open",
        gauge(&d, "connections_active")
    );
    for s in &mut conns {
        s.write_all(b"GET /hot HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .unwrap();
    }
    let clients: Vec<_> = conns
        .into_iter()
        .map(|mut s| {
            s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
            std::thread::spawn(move || read_response(&mut s, false))
        })
        .collect();
    valve.wait_arrived(1);
    // Every request is in: one fetching, the others waiting for it (a connection
    // waiting for the cache counts as writing).
    assert!(
        wait_until(SETTLE, || gauge(&d, "connections_writing") >= N as u64),
        "{} connections writing",
        gauge(&d, "connections_writing")
    );
    assert_eq!(
        valve.arrived(),
        1,
        "a second request reached the application: {:?}",
        valve.heads()
    );
    valve.open();
    for (i, c) in clients.into_iter().enumerate() {
        let r = c
            .join()
            .unwrap()
            .unwrap_or_else(|| panic!("client {i}: no answer"));
        assert_eq!(r.status, 200, "client {i}: {}", r.head);
        assert!(r.body == body, "client {i}: the body differs");
    }
    assert_eq!(valve.arrived(), 1);
    let log = cache_log(&d, "/hot", N);
    let misses = log.iter().filter(|s| *s == "MISS").count();
    let hits = log.iter().filter(|s| *s == "HIT").count();
    assert_eq!((misses, hits), (1, N - 1), "{log:?}");
    let s = cache_stats(&d);
    let figures = ["misses", "hits", "lock_waits", "stores"].map(|k| zone_counter(&s, k));
    assert_eq!(figures, [1, N as u64 - 1, N as u64 - 1, 1], "{s:#}");
}

/// A fetch that takes longer than `lock_timeout` no longer holds the others: they go
/// to the application themselves, and once the answers are in the key is a hit.
#[test]
fn requests_waiting_past_lock_timeout_go_to_the_application_themselves() {
    let valve = Valve::closed();
    let v = valve.clone();
    let counts = Arc::new(Mutex::new(HashMap::new()));
    let c = counts.clone();
    let up = upstream(move |r| {
        let (_, body) = numbered(&c, r.path());
        v.pass(&r.head);
        full(200, &[("Cache-Control", "max-age=600")], &body)
    });
    let d = daemon(&up, r#"lock_timeout: "1s""#);
    let first = {
        let mut s = d.connect();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        s.write_all(b"GET /slow HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .unwrap();
        s
    };
    valve.wait_arrived(1);
    let others: Vec<_> = (0..3)
        .map(|_| {
            let mut s = d.connect();
            s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
            s.write_all(b"GET /slow HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                .unwrap();
            s
        })
        .collect();
    // Held longer than the lock: each waiter goes upstream.
    valve.wait_arrived(4);
    valve.open();
    let mut bodies = Vec::new();
    for mut s in std::iter::once(first).chain(others) {
        let r = read_response(&mut s, false).expect("an answer");
        assert_eq!(r.status, 200);
        bodies.push(r.body_str());
    }
    bodies.sort();
    assert_eq!(bodies, ["/slow #1", "/slow #2", "/slow #3", "/slow #4"]);
    // One of them is the entry (a lock past `lock_timeout` is taken over by the
    // next request, which stores too): a hit from now on.
    let stored = get(&d, "/slow", "").body_str();
    assert!(bodies.contains(&stored), "{stored:?} is none of {bodies:?}");
    assert_eq!(get(&d, "/slow", "").body_str(), stored);
    assert_eq!(valve.arrived(), 4);
    assert_eq!(cache_log(&d, "/slow", 6)[4..], ["HIT", "HIT"]);
}

// ---------------------------------------------------------------------------------------
// Stale entries
// ---------------------------------------------------------------------------------------

/// Fields that make a response stale on arrival: fresh for 60 s, 60 s old.
const STALE_ON_ARRIVAL: [(&str, &str); 2] = [("Cache-Control", "max-age=60"), ("Age", "60")];

/// A stale entry is revalidated with its validators: the application's 304 makes
/// the client get the stored entry (200, `REVALIDATED`) and refreshes it, so the
/// next request is a hit; a 200 replaces it.
#[test]
fn a_stale_entry_is_revalidated_and_a_304_answers_with_the_stored_entry() {
    let lm = http_date(now_secs() - 3600);
    let lm2 = lm.clone();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    let up = upstream(move |r| {
        s2.lock().unwrap().push(r.head.clone());
        let n = s2
            .lock()
            .unwrap()
            .iter()
            .filter(|h| h.contains(r.path()))
            .count();
        match (r.path(), n) {
            (_, 1) => {
                let mut f = STALE_ON_ARRIVAL.to_vec();
                f.extend([("ETag", "\"v1\""), ("Last-Modified", lm2.as_str())]);
                f.push(("X-Version", "1"));
                full(200, &f, b"version one")
            }
            ("/r-no-store", _) => full(
                200,
                &[("Cache-Control", "no-store")],
                format!("not stored {n}").as_bytes(),
            ),
            ("/r304", _) => full(
                304,
                &[("Cache-Control", "max-age=600"), ("ETag", "\"v1\"")],
                b"",
            ),
            _ => full(
                200,
                &[("Cache-Control", "max-age=600"), ("ETag", "\"v2\"")],
                b"version two",
            ),
        }
    });
    let d = daemon(&up, "");
    for path in ["/r304", "/r200", "/r-no-store"] {
        assert_eq!(get(&d, path, "").body, b"version one");
    }

    let r = get(&d, "/r304", "");
    assert_eq!(
        (r.status, r.body.as_slice()),
        (200, &b"version one"[..]),
        "{}",
        r.head
    );
    assert_eq!(
        r.header("X-Version"),
        Some("1"),
        "the stored fields: {}",
        r.head
    );
    assert_eq!(r.header("ETag"), Some("\"v1\""), "{}", r.head);
    let reval = up
        .received()
        .into_iter()
        .filter(|r| r.path() == "/r304")
        .nth(1)
        .expect("a revalidation");
    assert!(reval.head.starts_with("GET /r304 "), "{}", reval.head);
    assert_eq!(
        reval.header("If-None-Match"),
        Some("\"v1\""),
        "{}",
        reval.head
    );
    assert_eq!(
        reval.header("If-Modified-Since"),
        Some(lm.as_str()),
        "{}",
        reval.head
    );
    // Refreshed: a hit now, the application not asked. The entry took the 304's
    // fields (RFC 9111 §4.3.4) and its age starts again from the 304's: a downstream
    // cache sees it fresh for 600 s, not already stale as the first answer said.
    let r = get(&d, "/r304", "");
    assert_eq!(r.body, b"version one");
    assert_eq!(asked(&up, "/r304"), 2);
    assert_eq!(r.header("Cache-Control"), Some("max-age=600"), "{}", r.head);
    assert_eq!(
        r.header("X-Version"),
        Some("1"),
        "the other stored fields stay: {}",
        r.head
    );
    let age: u64 = r.header("Age").unwrap().parse().unwrap();
    assert!(
        age < 60,
        "the age counts from the revalidation, not from the first answer's Age: 60: {}",
        r.head
    );
    assert_eq!(cache_log(&d, "/r304", 3), ["MISS", "REVALIDATED", "HIT"]);

    // A new version replaces the entry.
    assert_eq!(get(&d, "/r200", "").body, b"version two");
    let r = get(&d, "/r200", "");
    assert_eq!(
        (r.body.as_slice(), r.header("ETag")),
        (&b"version two"[..], Some("\"v2\""))
    );
    assert_eq!(asked(&up, "/r200"), 2);
    assert_eq!(cache_log(&d, "/r200", 3), ["MISS", "MISS", "HIT"]);

    // The application says the resource may not be stored any more: the old entry
    // is gone, never served again.
    assert_eq!(get(&d, "/r-no-store", "").body, b"not stored 2");
    assert_eq!(get(&d, "/r-no-store", "").body, b"not stored 3");
    assert_eq!(get(&d, "/r-no-store", "").body, b"not stored 4");
}

/// A revalidation asks about the entry's version, whatever the client asks about:
/// a client that has the application's current version (`"v2"`) while the stale
/// entry is `"v1"` must not get `"v1"` as if the application had confirmed it.
#[test]
fn a_clients_own_validators_do_not_confirm_a_stale_entry_of_another_version() {
    let n = Arc::new(AtomicUsize::new(0));
    let n2 = n.clone();
    let up = upstream(move |r| {
        let first = n2.fetch_add(1, SeqCst) == 0;
        let has_v2 = r.headers("if-none-match").any(|v| v.contains("\"v2\""));
        if first {
            let mut f = STALE_ON_ARRIVAL.to_vec();
            f.push(("ETag", "\"v1\""));
            full(200, &f, b"version one")
        } else if has_v2 {
            // The application has v2 now, as the request says it has.
            full(
                304,
                &[("Cache-Control", "max-age=600"), ("ETag", "\"v2\"")],
                b"",
            )
        } else {
            full(
                200,
                &[("Cache-Control", "max-age=600"), ("ETag", "\"v2\"")],
                b"version two",
            )
        }
    });
    let d = daemon(&up, "");
    assert_eq!(get(&d, "/doc", "").body, b"version one");
    let r = get(&d, "/doc", "If-None-Match: \"v2\"\r\n");
    let current = (r.status == 304 && r.header("ETag") == Some("\"v2\""))
        || (r.status == 200 && r.body == b"version two");
    assert!(
        current,
        "a client with v2 got the stale v1 as confirmed:\n{}{}\nthe application was asked:\n{}",
        r.head,
        r.body_str(),
        up.received().last().unwrap().head
    );
    let reval = &up.received()[1];
    assert_eq!(
        reval.headers("if-none-match").collect::<Vec<_>>(),
        ["\"v1\""],
        "{}",
        reval.head
    );
    let r = get(&d, "/doc", "");
    assert_eq!(r.body, b"version two", "{}", r.head);
}

/// `stale_while_revalidate`: a stale entry answers at once (`STALE`, with its
/// `Age`) while one background request refreshes it; the application is asked once
/// however many requests meanwhile, with the entry's validators; then the new
/// version is a hit.
#[test]
fn a_stale_entry_is_served_at_once_while_one_background_refresh_fetches_it() {
    let valve = Valve::closed();
    let v = valve.clone();
    let n = Arc::new(AtomicUsize::new(0));
    let n2 = n.clone();
    let up = upstream(move |r| {
        if n2.fetch_add(1, SeqCst) == 0 {
            let mut f = STALE_ON_ARRIVAL.to_vec();
            f.push(("ETag", "\"v1\""));
            return full(200, &f, b"version one");
        }
        v.pass(&r.head);
        full(
            200,
            &[("Cache-Control", "max-age=600"), ("ETag", "\"v2\"")],
            b"version two",
        )
    });
    let d = builder(
        up.addr(),
        "",
        ZONE,
        &cached_route("/", r#"stale_while_revalidate: "1h""#),
    )
    .workers(2)
    .accept("ReusePort")
    .start();
    assert_eq!(get(&d, "/s", "").body, b"version one");
    // The application holds the refresh: these answers cannot have waited for it.
    for i in 0..10 {
        let r = get(&d, "/s", "");
        assert_eq!(
            (r.status, r.body.as_slice()),
            (200, &b"version one"[..]),
            "{i}"
        );
        assert!(age(&r) >= 60, "{}", r.head);
        if i == 0 {
            valve.wait_arrived(1);
        }
    }
    let mut log = cache_log(&d, "/s", 11);
    log.sort();
    assert_eq!(log, [&["MISS"][..], &["STALE"; 10]].concat());
    assert_eq!(
        valve.arrived(),
        1,
        "more than one refresh: {:?}",
        valve.heads()
    );
    let refresh = &valve.heads()[0];
    assert!(
        refresh.starts_with("GET /s ") && refresh.contains("\r\nIf-None-Match: \"v1\""),
        "{refresh}"
    );
    valve.open();
    let mut last = Vec::new();
    assert!(
        wait_until(SETTLE, || {
            last = get(&d, "/s", "").body;
            last == b"version two"
        }),
        "the refresh was not stored: {:?}",
        String::from_utf8_lossy(&last)
    );
    let r = get(&d, "/s", "");
    assert_eq!(r.body, b"version two");
    assert_eq!(up.received().len(), 2);
    let log = cache_log(&d, "/s", 13);
    assert!(log.iter().any(|s| s == "HIT"), "{log:?}");
}

/// The response's own `stale-while-revalidate=N` opens the window on a route that
/// has none.
#[test]
fn a_responses_own_stale_while_revalidate_is_honoured() {
    let n = Arc::new(AtomicUsize::new(0));
    let n2 = n.clone();
    let up = upstream(move |_| {
        if n2.fetch_add(1, SeqCst) == 0 {
            let cc = ("Cache-Control", "max-age=60, stale-while-revalidate=3600");
            return full(200, &[cc, ("Age", "60")], b"version one");
        }
        full(200, &[("Cache-Control", "max-age=600")], b"version two")
    });
    let d = daemon(&up, "");
    assert_eq!(get(&d, "/own", "").body, b"version one");
    let r = get(&d, "/own", "");
    assert_eq!(r.body, b"version one", "{}", r.head);
    assert!(
        wait_until(SETTLE, || get(&d, "/own", "").body == b"version two"),
        "the background refresh was not stored"
    );
    assert_eq!(up.received().len(), 2);
    assert_eq!(cache_log(&d, "/own", 2)[..2], ["MISS", "STALE"]);
}

/// `stale_if_error`: while the application answers 5xx, times out or is down, a
/// stale entry answers (`STALE`, its `Age`) instead of the error; never one that
/// says `must-revalidate`, nor on a route without the window.
#[test]
fn a_stale_entry_answers_while_the_application_fails_or_is_down() {
    let n = Arc::new(Mutex::new(HashMap::new()));
    let n2 = n.clone();
    let up = upstream(move |r| {
        let (i, _) = numbered(&n2, r.path());
        let must = [
            ("Cache-Control", "max-age=60, must-revalidate"),
            ("Age", "60"),
        ];
        match (r.path(), i) {
            ("/must", 1) => full(200, &must, b"must one"),
            ("/plain/own", 1) => {
                let cc = ("Cache-Control", "max-age=60, stale-if-error=3600");
                full(200, &[cc, ("Age", "60")], b"version one")
            }
            (_, 1) => full(200, &STALE_ON_ARRIVAL, b"version one"),
            ("/slow", _) => full(200, &[], b"late").delayed(Duration::from_secs(5)),
            _ => full(503, &[], b"application error"),
        }
    });
    let routes = [
        cached_route("/plain/", ""),
        cached_route("/", r#"stale_if_error: "1h""#),
    ]
    .concat();
    // No pooled connections: once the application is gone, connecting fails.
    let d = builder(
        up.addr(),
        r#"keepalive: 0, read_timeout: "1s""#,
        ZONE,
        &routes,
    )
    .start();
    for path in ["/e", "/must", "/plain/e", "/plain/own", "/slow", "/down"] {
        assert_eq!(get(&d, path, "").status, 200, "{path}");
    }
    let stale = |path: &str| {
        let r = get(&d, path, "");
        assert_eq!(
            (r.status, r.body_str().as_str()),
            (200, "version one"),
            "{path}: {}",
            r.head
        );
        assert!(age(&r) >= 60, "{}", r.head);
    };
    stale("/e");
    stale("/slow");
    // The response's own window, on a route without one.
    stale("/plain/own");
    let r = get(&d, "/must", "");
    assert_eq!(
        (r.status, r.body.as_slice()),
        (503, &b"application error"[..])
    );
    let r = get(&d, "/plain/e", "");
    assert_eq!(
        (r.status, r.body.as_slice()),
        (503, &b"application error"[..])
    );
    assert_eq!(asked(&up, "/e"), 2);
    drop(up);
    // Every server down: refused, then marked down.
    stale("/down");
    stale("/down");
    stale("/e");
    let r = get(&d, "/plain/e", "");
    assert!(r.status >= 500, "{}", r.head);
    assert_eq!(cache_log(&d, "/e", 3), ["MISS", "STALE", "STALE"]);
    assert_eq!(cache_log(&d, "/down", 3), ["MISS", "STALE", "STALE"]);
    assert_eq!(cache_log(&d, "/slow", 2), ["MISS", "STALE"]);
    assert_eq!(cache_log(&d, "/must", 2), ["MISS", "MISS"]);
}

// ---------------------------------------------------------------------------------------
// Storage
// ---------------------------------------------------------------------------------------

/// Entries outlive the daemon: after a restart and after `-s upgrade`, the index is
/// made anew and filled from the files, and a stored key is a hit again without the
/// application.
#[test]
fn entries_survive_a_restart_and_an_upgrade() {
    let body = noise(50_000, 5);
    let b2 = body.clone();
    let up = upstream(move |_| full(200, &[("Cache-Control", "max-age=3600")], &b2));
    let mut d = builder(up.addr(), "", ZONE, &cached_route("/", ""))
        .own_binary()
        .start();
    assert_eq!(get(&d, "/keep", "").body, body);
    wait_files(&d, 1);
    wait_loaded(&d, 1);

    d.stop().expect("the daemon stops");
    let cmd = d.command();
    let pid = d.spawn(cmd);
    d.wait_serving(pid);
    let line = wait_loaded(&d, 2);
    assert!(line.contains(": 1 entries ("), "{line}");
    let r = get(&d, "/keep", "");
    assert!(r.body == body, "after the restart: the body differs");
    assert_eq!(
        up.received().len(),
        1,
        "the application was asked after the restart"
    );

    let new = d.upgrade();
    d.wait_serving(new);
    let line = wait_loaded(&d, 3);
    assert!(line.contains(": 1 entries ("), "{line}");
    let r = get(&d, "/keep", "");
    assert!(r.body == body, "after the upgrade: the body differs");
    assert_eq!(
        up.received().len(),
        1,
        "the application was asked after the upgrade"
    );
    assert_eq!(cache_log(&d, "/keep", 3), ["MISS", "HIT", "HIT"]);
    d.stop_master();
}

/// A worker killed (`kill -9`) while it stores a large response leaves nothing a
/// request could be answered with: the next request fetches the whole body again,
/// and after a restart the loader finds the one whole entry and no leftovers.
#[test]
fn a_worker_killed_while_storing_leaves_no_half_entry() {
    const LEN: usize = 1 << 20;
    let body = Arc::new(noise(LEN, 11));
    let valve = Valve::closed();
    let n = Arc::new(AtomicUsize::new(0));
    let (v, b2, n2) = (valve.clone(), body.clone(), n.clone());
    let up = upstream(move |_| {
        if n2.fetch_add(1, SeqCst) > 0 {
            return full(200, &[("Cache-Control", "max-age=600")], &b2);
        }
        let (v, b) = (v.clone(), b2.clone());
        Reply::Written(Writer(Arc::new(move |s: &mut TcpStream| {
            let head = format!(
                "HTTP/1.1 200 OK\r\nCache-Control: max-age=600\r\nContent-Length: {LEN}\r\n\r\n"
            );
            let _ = s.write_all(head.as_bytes());
            let _ = s.write_all(&b[..LEN / 2]);
            v.pass("half written");
            let _ = s.write_all(&b[LEN / 2..]);
            false
        })))
    });
    let mut d = builder(up.addr(), "", ZONE, &cached_route("/", ""))
        .expect_alerts()
        .start();
    let mut client = d.connect();
    client
        .write_all(b"GET /big HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    valve.wait_arrived(1);
    // The worker has the body file open, unnamed, half written.
    let dir = d.path("cache/pages").to_string_lossy().into_owned();
    let mut storing = None;
    assert!(
        wait_until(SETTLE, || {
            storing = d.workers().into_iter().find(|&w| {
                fd_links(w)
                    .iter()
                    .any(|l| l.starts_with(&dir) && l.contains("(deleted)"))
            });
            storing.is_some()
        }),
        "no worker holds an unnamed body file under {dir}"
    );
    let victim = storing.unwrap();
    send_signal(victim, nix::sys::signal::Signal::SIGKILL);
    let got = read_to_close(&mut client);
    assert!(
        got.len() < LEN,
        "the client of the killed worker got {} bytes",
        got.len()
    );
    valve.open();
    assert!(
        d.wait_replaced(&[victim], 1, SETTLE),
        "no worker replaced {victim}"
    );
    d.wait_ready();
    let (bodies, other) = zone_files(&d);
    assert!(
        bodies.is_empty() && other.is_empty(),
        "files after the kill: {bodies:?} {other:?}"
    );
    let r = get(&d, "/big", "");
    assert_eq!(r.status, 200);
    assert!(r.body == *body, "the refetched body differs");
    assert_eq!(n.load(SeqCst), 2);
    wait_files(&d, 1);

    wait_loaded(&d, 1);
    let before = loads(&d).len();
    d.stop();
    let cmd = d.command();
    let pid = d.spawn(cmd);
    d.wait_serving(pid);
    let line = wait_loaded(&d, before + 1);
    assert!(
        line.contains(": 1 entries (") && line.contains(", 0 damaged files removed"),
        "{line}"
    );
    let r = get(&d, "/big", "");
    assert!(r.body == *body, "the body after the restart differs");
    assert_eq!(n.load(SeqCst), 2);
    let (bodies, other) = zone_files(&d);
    assert_eq!((bodies.len(), other.len()), (1, 0), "{bodies:?} {other:?}");
}

/// The body file whose key is `key`.
fn file_of(d: &TestDaemon, key: &[u8]) -> PathBuf {
    zone_files(d)
        .0
        .into_iter()
        .find(|p| {
            let b = std::fs::read(p).unwrap_or_default();
            b.windows(key.len() + 1)
                .any(|w| &w[..key.len()] == key && w[key.len()] == b'C')
        })
        .unwrap_or_else(|| panic!("no body file for {}", String::from_utf8_lossy(key)))
}

/// A body file cut short, or of another format, is never served: the request is a
/// miss, fetched again whole, and the damage is logged; the entry is then stored
/// again. `/a` is cut short after a hit (its worker keeps the file open for the next
/// ones), `/c` before any, `/b` loses its format.
#[test]
fn a_damaged_body_file_is_a_miss_and_is_fetched_again() {
    let body = noise(30_000, 21);
    let b2 = body.clone();
    let up = upstream(move |_| full(200, &[("Cache-Control", "max-age=600")], &b2));
    let d = daemon(&up, "");
    let paths = ["/a", "/b", "/c"];
    for p in paths {
        assert_eq!(get(&d, p, "").body, body);
    }
    wait_files(&d, 3);
    assert!(get(&d, "/a", "").body == body);
    // The key is followed by the stored head (`Cache-Control: ...`).
    let file = |p: &str| file_of(&d, format!("httplocalhost{p}").as_bytes());
    let (fa, fb, fc) = (file("/a"), file("/b"), file("/c"));
    let len = std::fs::metadata(&fa).unwrap().len();
    for f in [&fa, &fc] {
        std::fs::OpenOptions::new()
            .write(true)
            .open(f)
            .unwrap()
            .set_len(len - 1)
            .unwrap();
    }
    let mut b = std::fs::read(&fb).unwrap();
    b[0] = b'X';
    std::fs::write(&fb, &b).unwrap();

    for p in paths {
        let r = get(&d, p, "");
        assert_eq!(r.status, 200, "{p}: {}", r.head);
        assert!(r.body == body, "{p}: the body differs");
        assert_eq!(asked(&up, p), 2, "{p} was not fetched again");
    }
    assert!(
        wait_until(SETTLE, || d.error_log().matches("is damaged").count() == 3),
        "three damaged files logged:\n{}",
        d.error_log()
    );
    // Stored again, whole.
    assert!(wait_until(SETTLE, || {
        [&fa, &fc]
            .iter()
            .all(|f| std::fs::metadata(f).is_ok_and(|m| m.len() == len))
            && std::fs::read(&fb).is_ok_and(|b| b.starts_with(b"FKDCENT1"))
    }));
    for p in paths {
        assert!(get(&d, p, "").body == body);
        assert_eq!(asked(&up, p), 2);
    }
    assert_eq!(cache_log(&d, "/a", 4), ["MISS", "HIT", "MISS", "HIT"]);
    assert_eq!(cache_log(&d, "/c", 3), ["MISS", "MISS", "HIT"]);
}

/// `max_size`: an entry larger than a quarter of the zone is passed on whole but not
/// stored; past the size the least recently used entries are evicted (by the
/// manager, once a second) and fetched again when asked for, the others stay hits.
#[test]
fn the_zone_keeps_to_max_size_by_evicting_the_least_recently_used() {
    let up = upstream(|r| {
        let len = if r.path() == "/huge" {
            300_000
        } else {
            200_000
        };
        let seed = r.path().bytes().map(u64::from).sum();
        full(200, &[("Cache-Control", "max-age=600")], &noise(len, seed))
    });
    let want = |path: &str| {
        let len = if path == "/huge" { 300_000 } else { 200_000 };
        noise(len, path.bytes().map(u64::from).sum())
    };
    let zone = r#"max_size: "1MiB", index_entries: 1024, inactive: "10m""#;
    let d = builder(up.addr(), "", zone, &cached_route("/", "")).start();
    let check = |path: &str, times: usize| {
        let r = get(&d, path, "");
        assert_eq!(r.status, 200, "{path}");
        assert!(r.body == want(path), "{path}: the body differs");
        assert_eq!(
            asked(&up, path),
            times,
            "{path}: requests to the application"
        );
    };
    check("/huge", 1);
    check("/huge", 2);
    assert!(zone_files(&d).0.is_empty(), "the huge response was stored");

    // Four entries, 800 kB: room for all.
    let start = now_secs();
    for i in 0..4 {
        check(&format!("/e/{i}"), 1);
    }
    wait_files(&d, 4);
    // Used later than 1..3 (whole seconds apart), stored before 4..7.
    assert!(wait_until(SETTLE, || now_secs() >= start + 2));
    check("/e/0", 1);
    assert!(wait_until(SETTLE, || now_secs() >= start + 4));
    for i in 4..8 {
        check(&format!("/e/{i}"), 1);
    }
    let mut bytes = 0;
    assert!(
        wait_until(SETTLE, || {
            bytes = zone_bytes(&d);
            bytes <= 1 << 20 && zone_files(&d).0.len() == 5
        }),
        "the zone holds {bytes} bytes in {} files",
        zone_files(&d).0.len()
    );
    for i in [0, 4, 5, 6, 7] {
        check(&format!("/e/{i}"), 1);
    }
    for i in 1..4 {
        check(&format!("/e/{i}"), 2);
    }
    assert_eq!(cache_log(&d, "/e/1", 2), ["MISS", "MISS"]);
}

/// `inactive`: an entry nobody asked for in that long is removed, fresh or not.
#[test]
fn an_entry_unused_for_inactive_is_removed() {
    let up = upstream(|_| full(200, &[("Cache-Control", "max-age=3600")], b"idle"));
    let zone = r#"max_size: "1MiB", index_entries: 64, inactive: "1s""#;
    let d = builder(up.addr(), "", zone, &cached_route("/", "")).start();
    assert_eq!(get(&d, "/i", "").body, b"idle");
    wait_files(&d, 1);
    wait_files(&d, 0);
    assert_eq!(get(&d, "/i", "").body, b"idle");
    assert_eq!(up.received().len(), 2);
    assert_eq!(cache_log(&d, "/i", 2), ["MISS", "MISS"]);
}

// ---------------------------------------------------------------------------------------
// Purge and figures
// ---------------------------------------------------------------------------------------

/// `forkd cache stats --json`: the zone `pages`.
fn cache_stats(d: &TestDaemon) -> Value {
    let (code, out, err) = d.ctl(&["cache", "stats", "--json"]);
    assert_eq!(code, 0, "forkd cache stats --json: {out} {err}");
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    v.as_array()
        .and_then(|zones| zones.iter().find(|z| z["zone"] == "pages").cloned())
        .unwrap_or_else(|| panic!("no zone `pages` in {out}"))
}

/// A counter of the zone `pages`.
fn zone_counter(stats: &Value, name: &str) -> u64 {
    stats["counters"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("no counter {name} in {stats:#}"))
}

/// `PURGE target` on `port`.
fn purge(port: u16, target: &str) -> Response {
    let mut c = Conn::connect(port).unwrap();
    c.exchange(
        format!("PURGE {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )
    .unwrap()
}

/// Entries go by key or by prefix, from the command line (`forkd cache purge`) or
/// with `PURGE` on a `Purge` route (which its `allow` restricts); each purged key is
/// fetched again, the others stay hits. `forkd cache stats` and `/metrics` count
/// what the zone did.
#[test]
fn purge_by_key_and_prefix_from_the_cli_and_the_purge_route_and_the_zones_figures() {
    let counts = Arc::new(Mutex::new(HashMap::new()));
    let c = counts.clone();
    let up = upstream(move |r| {
        let (n, _) = numbered(&c, r.path());
        let body = match r.header("accept-encoding") {
            Some(ae) => format!("{} {ae} #{n}", r.path()),
            None => format!("{} #{n}", r.path()),
        };
        let mut f = vec![("Cache-Control", "max-age=600")];
        if r.path() == "/v" {
            f.push(("Vary", "Accept-Encoding"));
        }
        full(200, &f, body.as_bytes())
    });
    // An admin server beside the cached one, as the README has it.
    let admin = free_port();
    let routes = format!(
        r#"(prefix: "/metrics", handler: Metrics),
        {cached}
        ],
    ), (
        listen: ["127.0.0.1:{admin}"],
        routes: [
            (prefix: "/denied/", handler: Purge(zone: "pages"), allow: ["10.0.0.0/8"]),
            (prefix: "/", handler: Purge(zone: "pages"), allow: ["127.0.0.1"]),"#,
        cached = cached_route("/", "")
    );
    let d = builder(up.addr(), "", ZONE, &routes).start();
    let body = |path: &str, extra: &str| get(&d, path, extra).body_str();
    let gzip = "Accept-Encoding: gzip\r\n";
    let br = "Accept-Encoding: br\r\n";
    for _ in 0..2 {
        for p in ["/a", "/b", "/dir/1", "/dir/2", "/denied/x"] {
            assert_eq!(body(p, ""), format!("{p} #1"));
        }
        assert_eq!(body("/v", gzip), "/v gzip #1");
        assert_eq!(body("/v", br), "/v br #2");
    }
    let s = cache_stats(&d);
    assert_eq!(
        (
            zone_counter(&s, "misses"),
            zone_counter(&s, "hits"),
            zone_counter(&s, "stores")
        ),
        (7, 7, 7),
        "{s:#}"
    );
    // Five entries, two variants and the record of their fields.
    assert_eq!(s["entries"], 8, "{s:#}");
    assert_eq!(s["loaded"], true, "{s:#}");
    assert_eq!(s["max_size"], 64 << 20, "{s:#}");

    // PURGE: the key of the request, as the cached route makes it.
    let r = purge(admin, "/a");
    assert_eq!(
        (r.status, r.body.as_slice()),
        (200, &b"purged\n"[..]),
        "{}",
        r.head
    );
    let r = purge(admin, "/a");
    assert_eq!((r.status, r.body.as_slice()), (404, &b"not cached\n"[..]));
    assert_eq!(body("/a", ""), "/a #2");
    assert_eq!(body("/a", ""), "/a #2");
    let r = d.request(&format!(
        "GET /a HTTP/1.1\r\nHost: localhost:{admin}\r\nConnection: close\r\n\r\n"
    ));
    assert_eq!(r.status, 200, "the admin port is another server");
    let mut c = Conn::connect(admin).unwrap();
    let r = c
        .exchange(b"GET /a HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    assert_eq!(
        (r.status, r.header("Allow")),
        (405, Some("PURGE")),
        "{}",
        r.head
    );
    // Refused by the route's `allow`: the entry stays.
    assert_eq!(purge(admin, "/denied/x").status, 403);
    assert_eq!(body("/denied/x", ""), "/denied/x #1");
    // A response that varies: every variant goes with its record.
    assert_eq!(purge(admin, "/v").status, 200);
    assert_eq!(body("/v", br), "/v br #3");
    assert_eq!(body("/v", gzip), "/v gzip #4");
    assert_eq!(body("/v", br), "/v br #3");

    // The command line: one key, then every key under a prefix.
    let (code, out, err) = d.ctl(&["cache", "purge", "pages", "httplocalhost/b"]);
    assert_eq!(code, 0, "{out} {err}");
    assert!(
        out.contains("purged 1 entry from cache zone `pages`"),
        "{out}"
    );
    assert_eq!(body("/b", ""), "/b #2");
    let (code, out, err) = d.ctl(&["cache", "purge", "pages", "--prefix", "httplocalhost/dir/"]);
    assert_eq!(code, 0, "{out} {err}");
    assert!(
        out.contains("purged 2 entries from cache zone `pages`"),
        "{out}"
    );
    for p in ["/dir/1", "/dir/2"] {
        assert_eq!(body(p, ""), format!("{p} #2"));
        assert_eq!(body(p, ""), format!("{p} #2"));
    }
    assert_eq!(body("/a", ""), "/a #2");
    assert_eq!(body("/denied/x", ""), "/denied/x #1");
    let (code, out, err) = d.ctl(&["cache", "purge", "nope", "x"]);
    assert_eq!(code, 1, "{out}");
    assert!(err.contains("no cache zone named `nope`"), "{err}");

    let s = cache_stats(&d);
    assert_eq!(zone_counter(&s, "purged"), 5, "{s:#}");
    let hits = zone_counter(&s, "hits");
    let text = get(&d, "/metrics", "").body_str();
    let scraped = scrape(&text);
    let sample = |family: &str| {
        scraped
            .samples
            .iter()
            .find(|s| s.metric == family && s.labels.get("zone") == Some("pages"))
            .map(|s| match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                ref other => panic!("{family}: {other:?}"),
            })
            .unwrap_or_else(|| panic!("no {family}{{zone=\"pages\"}} in:\n{text}"))
    };
    assert_eq!(sample("forkd_cache_hits_total"), hits as f64, "{text}");
    assert_eq!(sample("forkd_cache_purged_total"), 5.0);
    assert_eq!(sample("forkd_cache_max_bytes"), (64u64 << 20) as f64);
    assert_eq!(
        sample("forkd_cache_entries"),
        cache_stats(&d)["entries"].as_f64().unwrap()
    );
}

/// A full index evicts rather than fails: far more keys than `index_entries` are
/// all answered whole, the index keeps to its size, and the evictions are counted.
#[test]
fn a_full_index_evicts_instead_of_failing_requests() {
    let up = upstream(|r| {
        full(
            200,
            &[("Cache-Control", "max-age=600")],
            r.path().as_bytes(),
        )
    });
    let zone = r#"max_size: "64MiB", index_entries: 64, inactive: "10m""#;
    let d = builder(up.addr(), "", zone, &cached_route("/", "")).start();
    for i in 0..300 {
        let p = format!("/k/{i}");
        let r = get(&d, &p, "");
        assert_eq!((r.status, r.body_str()), (200, p.clone()), "{}", r.head);
    }
    let s = cache_stats(&d);
    assert_eq!(s["index_entries"], 64, "{s:#}");
    assert!(s["entries"].as_u64().unwrap() <= 64, "{s:#}");
    assert!(zone_counter(&s, "evictions") >= 300 - 64, "{s:#}");
    assert_eq!(zone_counter(&s, "bypass"), 0, "{s:#}");
    // The last key is still there; the first was evicted long ago.
    assert_eq!(get(&d, "/k/299", "").body, b"/k/299");
    assert_eq!(asked(&up, "/k/299"), 1);
    assert_eq!(get(&d, "/k/0", "").body, b"/k/0");
    assert_eq!(asked(&up, "/k/0"), 2);
    // Evicted entries' files go with them.
    assert!(wait_until(SETTLE, || zone_files(&d).0.len() as u64
        <= cache_stats(&d)["entries"].as_u64().unwrap()));
}

/// A cached route under load through five reloads (each changing the zone's
/// `inactive` and the route's `lock_timeout`) and a binary upgrade: no request fails,
/// every answer is whole, and the entries outlive the reloads (the application is
/// asked once per key until the upgrade; the new master's index is filled again).
#[test]
fn reloads_and_an_upgrade_under_load_fail_no_request_and_keep_the_entries() {
    use support::load::{big_body, small_body, Kind, Load, BIG_PATH, SMALL_PATH};
    let up = upstream(|r| match r.path() {
        SMALL_PATH => full(200, &[("Cache-Control", "max-age=3600")], small_body()),
        BIG_PATH => full(200, &[("Cache-Control", "max-age=3600")], big_body()),
        _ => full(404, &[("Cache-Control", "no-store")], b"none\n"),
    });
    let zone = |inactive: u32| {
        format!(r#"max_size: "64MiB", index_entries: 1024, inactive: "{inactive}m""#)
    };
    let mut d = builder(up.addr(), "", &zone(10), &cached_route("/", ""))
        .workers(2)
        .own_binary()
        .start();
    let asked = |path: &str| up.received().iter().filter(|r| r.path() == path).count();
    let load = Load::start_mix(
        d.port,
        &[
            Kind::KeepAlive,
            Kind::KeepAlive,
            Kind::KeepAlive,
            Kind::PerConnection { http10: false },
        ],
    );
    load.wait_for(300);
    for round in 1..=5u32 {
        d.builder.top = format!(
            r#"upstreams: {{ "app": (servers: ["{}"]) }},
    caches: {{ "pages": (path: "cache/pages", {}) }},"#,
            up.addr(),
            zone(10 + round)
        );
        d.builder.routes = format!(
            r#"(prefix: "/healthz", handler: Liveness),
            {}"#,
            cached_route("/", &format!("lock_timeout: \"{}s\"", 4 + round))
        );
        let (code, out, err) = d.reload();
        assert_eq!(code, 0, "round {round}: -s reload failed: {out}{err}");
        load.wait_for(200);
    }
    assert_eq!(
        (asked(SMALL_PATH), asked(BIG_PATH)),
        (1, 1),
        "through the reloads every answer came from the zone"
    );
    d.upgrade();
    load.wait_for(300);
    let report = load.stop();
    report.assert_clean("reloads and an upgrade of a cached route", 1000);
    d.stop_master();
}

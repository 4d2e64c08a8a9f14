//! The reverse proxy end to end: the real `forkd` in front of the test upstream
//! (`support::upstream`) and `python3 -m http.server`, over real sockets.

mod support;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use support::upstream::{pattern_hash, upstream, Reply, Settings, TestUpstream};
use support::*;

/// A daemon with `/` proxied to `servers` (an upstream named `app`, `keys` added).
fn proxy_daemon(servers: &[String], keys: &str) -> TestDaemon {
    proxy_builder(servers, keys).start()
}

fn proxy_builder(servers: &[String], keys: &str) -> Builder {
    proxy_builder_with(servers, keys, "")
}

/// `route` adds options to the `Proxy` route (`buffering: false`, say).
fn proxy_builder_with(servers: &[String], keys: &str, route: &str) -> Builder {
    let list = support::upstream::server_list(servers);
    TestDaemon::builder()
        .top(&format!(
            "upstreams: {{ \"app\": (servers: [{list}], {keys}) }},"
        ))
        .server("max_body_bytes: \"1G\",")
        .routes(&format!(
            r#"(prefix: "/healthz", handler: Liveness),
            (prefix: "/", handler: Proxy(upstream: "app"{route})),"#,
        ))
}

/// Reads everything until the server closes.
fn raw_exchange(d: &TestDaemon, request: &[u8]) -> Vec<u8> {
    let mut s = d.connect();
    s.write_all(request).unwrap();
    read_to_close(&mut s)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The head of a raw response (through the empty line) and its body.
fn split(raw: &[u8]) -> (String, Vec<u8>) {
    let at = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no head in {:?}", text(raw)));
    (text(&raw[..at + 4]), raw[at + 4..].to_vec())
}

fn has_field(head: &str, name: &str) -> bool {
    head.split("\r\n").any(|l| {
        l.split_once(':')
            .is_some_and(|(n, _)| n.eq_ignore_ascii_case(name))
    })
}

#[test]
fn a_request_is_re_serialised_for_the_upstream() {
    let up = upstream(|_| Reply::ok(b"hello"));
    let d = proxy_daemon(&[up.addr().to_string()], "");
    let r = d.request(
        "GET /a/b?q=1 HTTP/1.1\r\nHost: example.test\r\nConnection: close, X-Secret\r\n\
         X-Secret: 1\r\nKeep-Alive: timeout=5\r\nProxy-Connection: x\r\nTE: trailers\r\n\
         Upgrade: h2c\r\nX-Forwarded-For: 10.0.0.1\r\nX-Forwarded-Proto: https\r\n\
         X-Request-Id: abc-123\r\nAccept: */*\r\n\r\n",
    );
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(r.body, b"hello");
    let got = &up.received()[0];
    assert_eq!(got.head.lines().next().unwrap(), "GET /a/b?q=1 HTTP/1.1");
    assert_eq!(got.header("host"), Some("example.test"));
    for dropped in [
        "connection",
        "x-secret",
        "keep-alive",
        "proxy-connection",
        "te",
        "upgrade",
    ] {
        assert!(
            !has_field(&got.head, dropped),
            "{dropped} forwarded:\n{}",
            got.head
        );
    }
    assert_eq!(got.header("x-forwarded-for"), Some("10.0.0.1, 127.0.0.1"));
    assert_eq!(got.header("x-forwarded-proto"), Some("http"));
    assert_eq!(got.header("x-forwarded-host"), Some("example.test"));
    assert_eq!(got.header("x-request-id"), Some("abc-123"));
    assert_eq!(got.header("accept"), Some("*/*"));
    // A request without an id gets one.
    d.get("/x");
    let id = up.received()[1].header("x-request-id").unwrap().to_string();
    assert_eq!(id.len(), 32, "{id}");
    assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
    // Counted and logged like any other request.
    assert!(
        d.wait_for_access_log("\"GET /a/b?q=1 HTTP/1.1\" 200 5", Duration::from_secs(10)),
        "{}",
        d.access_log()
    );
    d.assert_log_clean();
}

#[test]
fn hop_by_hop_fields_of_the_response_are_dropped_and_a_length_is_kept() {
    let up = upstream(|_| Reply::Full {
        status: 200,
        extra: vec![
            ("Connection".into(), "X-Internal".into()),
            ("X-Internal".into(), "secret".into()),
            ("Keep-Alive".into(), "timeout=5".into()),
            ("X-App".into(), "yes".into()),
        ],
        body: b"0123456789".to_vec(),
    });
    let d = proxy_daemon(&[up.addr().to_string()], "");
    let raw = raw_exchange(
        &d,
        b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
    );
    let (head, body) = split(&raw);
    assert!(head.contains("\r\nContent-Length: 10\r\n"), "{head}");
    assert!(head.contains("\r\nX-App: yes\r\n"), "{head}");
    assert!(!has_field(&head, "x-internal"), "{head}");
    assert!(!has_field(&head, "keep-alive"), "{head}");
    assert!(!has_field(&head, "transfer-encoding"), "{head}");
    assert_eq!(body, b"0123456789");
}

#[test]
fn a_chunked_response_is_passed_through_with_its_trailers() {
    let up = upstream(|_| Reply::Chunked {
        body: b"abcdefghij".to_vec(),
        chunk: 4,
        trailers: vec![("X-Checksum".into(), "42".into())],
    });
    let d = proxy_daemon(&[up.addr().to_string()], "");
    let raw = raw_exchange(
        &d,
        b"GET / HTTP/1.1\r\nHost: h\r\nTE: trailers\r\nConnection: close\r\n\r\n",
    );
    let (head, body) = split(&raw);
    assert!(
        head.contains("\r\nTransfer-Encoding: chunked\r\n"),
        "{head}"
    );
    assert!(!has_field(&head, "content-length"), "{head}");
    assert_eq!(
        text(&body),
        "4\r\nabcd\r\n4\r\nefgh\r\n2\r\nij\r\n0\r\nX-Checksum: 42\r\n\r\n"
    );
}

#[test]
fn a_close_delimited_body_is_chunked_for_1_1_and_close_delimited_for_1_0() {
    let up = upstream(|_| Reply::CloseDelimited {
        body: b"until the end".to_vec(),
    });
    let d = proxy_daemon(&[up.addr().to_string()], "");
    let raw = raw_exchange(
        &d,
        b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
    );
    let (head, body) = split(&raw);
    assert!(
        head.contains("\r\nTransfer-Encoding: chunked\r\n"),
        "{head}"
    );
    assert_eq!(text(&body), "d\r\nuntil the end\r\n0\r\n\r\n");
    let raw = raw_exchange(&d, b"GET / HTTP/1.0\r\nHost: h\r\n\r\n");
    let (head, body) = split(&raw);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(!has_field(&head, "transfer-encoding"), "{head}");
    assert!(!has_field(&head, "content-length"), "{head}");
    assert_eq!(body, b"until the end");
    // A close-delimited response is never pooled.
    assert_eq!(up.connections(), 2);
}

#[test]
fn te_and_cl_or_an_invalid_length_is_a_502_and_the_connection_closed() {
    let up = upstream(|req| match req.path() {
        "/both" => Reply::BothTeAndCl {
            body: b"smuggled".to_vec(),
        },
        _ => Reply::Full {
            status: 200,
            extra: vec![("Content-Length".into(), "12, 13".into())],
            body: Vec::new(),
        },
    });
    let d = proxy_daemon(&[up.addr().to_string()], "");
    for path in ["/both", "/badlength"] {
        let r = d.get(path);
        assert_eq!(r.status, 502, "{path}: {}", r.head);
        assert!(r.body_str().contains("502 Bad Gateway"), "{}", r.body_str());
    }
    assert!(
        wait_until(Duration::from_secs(10), || up.open_connections() == 0),
        "the upstream connections stay open: {}",
        up.open_connections()
    );
    let log = d.error_log();
    assert!(
        log.contains(&format!("upstream app {}", up.addr())),
        "{log}"
    );
}

#[test]
fn early_hints_then_the_response_are_forwarded() {
    let up = upstream(|_| Reply::EarlyHints {
        body: b"final".to_vec(),
    });
    let d = proxy_daemon(&[up.addr().to_string()], "");
    let raw = raw_exchange(
        &d,
        b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
    );
    let raw = text(&raw);
    assert!(raw.starts_with("HTTP/1.1 103 "), "{raw}");
    assert!(raw.contains("\r\nLink: "), "{raw}");
    assert!(raw.contains("\r\n\r\nHTTP/1.1 200 "), "{raw}");
    assert!(raw.ends_with("final"), "{raw}");
}

#[test]
fn head_204_and_304_carry_no_body() {
    let up = upstream(|req| match req.path() {
        "/204" => Reply::Full {
            status: 204,
            extra: vec![],
            body: Vec::new(),
        },
        "/304" => Reply::Full {
            status: 304,
            extra: vec![],
            body: Vec::new(),
        },
        _ => Reply::ok(b"a body for GET"),
    });
    let d = proxy_daemon(&[up.addr().to_string()], "");
    // On one kept connection: a body where none belongs would break the next response.
    let mut s = d.connect();
    for (req, status) in [
        ("HEAD /x HTTP/1.1\r\nHost: h\r\n\r\n", 200),
        ("GET /204 HTTP/1.1\r\nHost: h\r\n\r\n", 204),
        ("GET /304 HTTP/1.1\r\nHost: h\r\n\r\n", 304),
        ("GET /x HTTP/1.1\r\nHost: h\r\n\r\n", 200),
    ] {
        s.write_all(req.as_bytes()).unwrap();
        let r = read_response(&mut s, req.starts_with("HEAD")).expect("a response");
        assert_eq!(r.status, status, "{req}: {}", r.head);
        if req.starts_with("HEAD") {
            assert_eq!(r.header("Content-Length"), Some("14"), "{}", r.head);
        }
        if status == 200 && req.starts_with("GET") {
            assert_eq!(r.body, b"a body for GET");
        }
    }
    // Pooled: all four on one upstream connection.
    assert_eq!(up.connections(), 1);
}

#[test]
fn a_refused_connection_garbage_or_a_close_before_the_head_is_a_502() {
    // A port nobody listens on: bind, note it, close.
    let refused = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let up = upstream(|req| match req.path() {
        "/garbage" => Reply::Garbage(b"SPDY/9 what\r\n\r\n".to_vec()),
        _ => Reply::Close,
    });
    let d = proxy_daemon(&[refused.to_string()], "");
    let r = d.get("/");
    assert_eq!(r.status, 502, "{}", r.head);
    assert!(
        d.error_log()
            .contains(&format!("upstream app {refused}: connect() refused")),
        "{}",
        d.error_log()
    );
    drop(d);
    let d = proxy_daemon(&[up.addr().to_string()], "retries: 0,");
    for path in ["/garbage", "/close"] {
        let r = d.get(path);
        assert_eq!(r.status, 502, "{path}: {}", r.head);
    }
}

#[test]
fn a_connect_or_read_timeout_is_a_504() {
    let up = upstream(|_| Reply::ok(b"too late").delayed(Duration::from_secs(3)));
    let d = proxy_daemon(
        &[up.addr().to_string()],
        "read_timeout: \"300ms\", retries: 0,",
    );
    let r = d.get("/slow");
    assert_eq!(r.status, 504, "{}", r.head);
    assert!(
        d.error_log().contains("upstream timed out"),
        "{}",
        d.error_log()
    );
    drop(d);
    // A connect that never completes: a non-routable address (TEST-NET-1 drops SYNs
    // on most hosts; where it is refused instead, the answer is a 502).
    let d = proxy_daemon(
        &["192.0.2.1:81".to_string()],
        "connect_timeout: \"300ms\", retries: 0,",
    );
    let r = d.get("/");
    assert!(r.status == 504 || r.status == 502, "{}", r.head);
    if r.status == 504 {
        assert!(
            d.error_log().contains("connect() timed out"),
            "{}",
            d.error_log()
        );
    }
}

#[test]
fn a_failure_after_the_head_closes_the_client_connection() {
    let up = upstream(|_| Reply::CloseMidBody {
        body: vec![b'x'; 100_000],
        after: 30_000,
    });
    let d = proxy_daemon(&[up.addr().to_string()], "");
    let raw = raw_exchange(&d, b"GET / HTTP/1.1\r\nHost: h\r\n\r\n");
    let (head, body) = split(&raw);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("Content-Length: 100000"), "{head}");
    assert!(
        body.len() < 100_000,
        "a truncated response, never a complete one"
    );
    assert!(body.iter().all(|&b| b == b'x'));
}

#[test]
fn expect_100_continue_is_answered_by_forkd_then_the_body_goes_upstream() {
    let up = upstream(|_| Reply::Echo);
    let d = proxy_daemon(&[up.addr().to_string()], "");
    let mut s = d.connect();
    s.write_all(
        b"POST /up HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n",
    )
    .unwrap();
    let interim = read_response(&mut s, false).expect("100 Continue");
    assert_eq!(interim.status, 100, "{}", interim.head);
    s.write_all(b"hello").unwrap();
    let r = read_response(&mut s, false).expect("the response");
    assert_eq!(r.status, 200, "{}", r.head);
    let got = &up.received()[0];
    assert_eq!(got.body, b"hello");
    assert!(!has_field(&got.head, "expect"), "{}", got.head);
    assert_eq!(got.header("content-length"), Some("5"));
}

#[test]
fn a_chunked_request_body_is_streamed_chunked_with_its_trailers() {
    let up = upstream(|_| Reply::ok(b"ok"));
    let d = proxy_daemon(&[up.addr().to_string()], "");
    let r = d.request(
        "POST /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
         3\r\nabc\r\n2\r\nde\r\n0\r\nX-T: 1\r\n\r\n",
    );
    assert_eq!(r.status, 200, "{}", r.head);
    let got = &up.received()[0];
    assert_eq!(got.body, b"abcde");
    assert_eq!(got.header("transfer-encoding"), Some("chunked"));
    assert!(got.trailers.contains("X-T: 1"), "{:?}", got.trailers);
}

/// `python3 -m http.server` as the upstream: HTTP/1.0, close-delimited bodies.
#[test]
fn python_http_server_as_an_upstream() {
    let dir = TempDir::new();
    std::fs::write(dir.path().join("hello.txt"), b"hello from python\n").unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = match std::process::Command::new("python3")
        .args([
            "-m",
            "http.server",
            "--bind",
            "127.0.0.1",
            &port.to_string(),
        ])
        .current_dir(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => panic!("python3 is needed for this test: {e}"),
    };
    assert!(wait_until(Duration::from_secs(10), || TcpStream::connect(
        ("127.0.0.1", port)
    )
    .is_ok()));
    let d = proxy_daemon(&[format!("127.0.0.1:{port}")], "");
    let mut s = d.connect();
    for _ in 0..3 {
        s.write_all(b"GET /hello.txt HTTP/1.1\r\nHost: h\r\n\r\n")
            .unwrap();
        let r = read_response(&mut s, false).expect("a response");
        assert_eq!(r.status, 200, "{}", r.head);
        assert_eq!(r.body, b"hello from python\n");
    }
    let r = d.get("/missing");
    assert_eq!(r.status, 404);
    let _ = child.kill();
    let _ = child.wait();
}

fn worker_rss_kib(d: &TestDaemon) -> u64 {
    let w = d.workers()[0];
    proc_status_u64(w, "VmRSS")
}

#[test]
fn large_bodies_stream_both_ways_with_flat_worker_memory() {
    const LEN: u64 = 64 * 1024 * 1024;
    let up = upstream(|req| match req.method() {
        "POST" => Reply::ok(format!("{} {}", req.body_len, req.body_hash).as_bytes()),
        _ => Reply::Large {
            len: LEN,
            chunked: req.path() == "/chunked",
        },
    });
    let d = proxy_daemon(&[up.addr().to_string()], "");
    d.get("/warm-up-is-small?x");
    let before = worker_rss_kib(&d);
    // Response bodies, Content-Length and chunked.
    for path in ["/length", "/chunked"] {
        let mut s = d.connect();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let raw = read_to_close(&mut s);
        let (head, body) = split(&raw);
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        if path == "/length" {
            assert_eq!(body.len() as u64, LEN);
            assert_eq!(
                support::upstream::fnv(support::upstream::FNV_START, &body),
                pattern_hash(LEN)
            );
        } else {
            assert!(body.len() as u64 > LEN);
        }
    }
    // A request body.
    let mut s = d.connect();
    write!(
        s,
        "POST /up HTTP/1.1\r\nHost: h\r\nContent-Length: {LEN}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let piece: Vec<u8> = (0..1024 * 1024u64).map(|i| (i % 251) as u8).collect();
    let mut hash = support::upstream::FNV_START;
    for _ in 0..64 {
        s.write_all(&piece).unwrap();
        hash = support::upstream::fnv(hash, &piece);
    }
    // The upstream hashes what the socket buffers still hold after the last write
    // (tens of MiB on loopback): slow in a debug build on a loaded machine.
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let r = read_response(&mut s, false).expect("a response");
    assert_eq!(r.body_str(), format!("{LEN} {hash}"));
    let after = worker_rss_kib(&d);
    assert!(
        after < before + 32 * 1024,
        "worker RSS grew from {before} KiB to {after} KiB"
    );
}

#[test]
fn a_slow_client_stops_the_upstream_being_read() {
    const LEN: u64 = 32 * 1024 * 1024;
    let up = upstream(|_| Reply::Large {
        len: LEN,
        chunked: false,
    });
    let d = proxy_daemon(&[up.addr().to_string()], "");
    let mut s = d.connect();
    s.write_all(b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut first = [0u8; 1024];
    s.read_exact(&mut first).unwrap();
    // The client reads nothing more: forkd's buffers and both sockets' fill up, and the
    // upstream stops being able to write. What it wrote is bounded by those buffers.
    let w = d.workers()[0];
    std::thread::sleep(Duration::from_millis(500));
    let rss = proc_status_u64(w, "VmRSS");
    std::thread::sleep(Duration::from_millis(500));
    let rss_later = proc_status_u64(w, "VmRSS");
    assert!(rss_later < rss + 4 * 1024, "{rss} KiB then {rss_later} KiB");
    // Then it reads the rest, which is all there.
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    let head_end = first.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    assert_eq!((first.len() - head_end + rest.len()) as u64, LEN);
}

#[test]
fn a_slow_upstream_stops_the_client_being_read_without_request_buffering() {
    // Far more than every socket buffer on the way can hold (receive buffers grow to
    // tcp_rmem's 32 MiB here: client -> forkd and forkd -> upstream, plus send buffers).
    const LEN: usize = 160 * 1024 * 1024;
    const BUFFERS_AT_MOST: usize = 100 * 1024 * 1024;
    let up = TestUpstream::start(
        Settings {
            slow_read: Some((16 * 1024, Duration::from_millis(20))),
            ..Settings::default()
        },
        |req| Reply::ok(req.body_len.to_string().as_bytes()),
    );
    let d = proxy_builder_with(
        &[up.addr().to_string()],
        "send_timeout: \"30s\",",
        ", request_buffering: false",
    )
    .start();
    d.get("/warm-up");
    let before = worker_rss_kib(&d);
    let mut s = d.connect();
    write!(
        s,
        "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: {LEN}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    s.set_nonblocking(true).unwrap();
    let piece = vec![7u8; 256 * 1024];
    let mut sent = 0;
    // Write as fast as the socket takes it: it must stop taking it, since the
    // upstream reads slowly (about 800 KB/s) and forkd buffers little.
    let mut stalled = 0;
    while stalled < 100 && sent < LEN {
        match s.write(&piece) {
            Ok(n) => {
                sent += n;
                stalled = 0;
            }
            Err(_) => {
                stalled += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
    assert!(
        sent < BUFFERS_AT_MOST,
        "forkd took {sent} of {LEN} bytes from the client without the upstream reading them"
    );
    let after = worker_rss_kib(&d);
    assert!(
        after < before + 32 * 1024,
        "worker RSS grew from {before} KiB to {after} KiB"
    );
}

/// Requests paced around the upstream's idle close: each may meet a pooled
/// connection the upstream is closing. None may fail.
#[test]
fn the_stale_connection_race_fails_no_request() {
    let up = idle_closing_upstream(Duration::from_millis(200));
    let d = proxy_daemon(&[up.addr().to_string()], "keepalive_timeout: \"10s\",");
    let failed = Arc::new(AtomicU64::new(0));
    let ok = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let (failed, ok, port) = (failed.clone(), ok.clone(), d.port);
            std::thread::spawn(move || {
                for i in 0..100u64 {
                    let gap = 150 + (t * 37 + i * 13) % 101; // 150..250 ms
                    std::thread::sleep(Duration::from_millis(gap));
                    let method = if i % 4 == 3 { "POST" } else { "GET" };
                    match one_request(port, method) {
                        Ok(()) => ok.fetch_add(1, SeqCst),
                        Err(e) => {
                            eprintln!("request failed: {e}");
                            failed.fetch_add(1, SeqCst)
                        }
                    };
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(failed.load(SeqCst), 0, "{} ok", ok.load(SeqCst));
    assert_eq!(ok.load(SeqCst), 800);
}

/// The upstream closes connections idle for a second. Once forkd has seen it do so,
/// a POST does not go on a pooled connection idle for half that or more: the upstream
/// may be closing it as the request goes out, and a POST cannot be sent twice. It gets
/// a new connection instead (before, it took the pooled one and could meet the close).
#[test]
fn a_post_stays_off_a_pooled_connection_the_upstream_may_be_closing() {
    let up = idle_closing_upstream(Duration::from_secs(1));
    let d = proxy_daemon(&[up.addr().to_string()], "keepalive_timeout: \"10s\",");
    // forkd learns the upstream's idle time: its pooled connection is closed after 1 s.
    assert_eq!(d.get("/learn").status, 200);
    assert!(
        wait_until(SETTLE, || up.open_connections() == 0),
        "the upstream never closed its idle connection"
    );
    assert_eq!(d.get("/a").status, 200);
    // Idle 0.8 s: open at the upstream still, but past half its idle time.
    std::thread::sleep(Duration::from_millis(800));
    one_request(d.port, "POST").unwrap();
    let received = up.received();
    let on = |path: &str| {
        received
            .iter()
            .find(|r| r.path() == path)
            .unwrap_or_else(|| panic!("no {path} upstream"))
            .connection
    };
    assert_ne!(
        on("/p"),
        on("/a"),
        "the POST went on the connection idle past half the upstream's idle time"
    );
}

/// An upstream answering `fresh` that closes keep-alive connections idle for `idle`.
fn idle_closing_upstream(idle: Duration) -> TestUpstream {
    TestUpstream::start(
        Settings {
            idle_close: Some(idle),
            ..Settings::default()
        },
        |_| Reply::ok(b"fresh"),
    )
}

fn one_request(port: u16, method: &str) -> Result<(), String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let req = if method == "POST" {
        "POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\nConnection: close\r\n\r\nbody"
            .to_string()
    } else {
        "GET /g HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n".to_string()
    };
    s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|e| e.to_string())?;
    let (head, body) = split(&raw);
    if !head.starts_with("HTTP/1.1 200") || body != b"fresh" {
        return Err(format!("{head}{}", text(&body)));
    }
    Ok(())
}

/// Clients proxying through forkd on `port` until `stop`, counting into `ok` and
/// `failed`; returns the first failures.
fn proxied_load(
    port: u16,
    threads: usize,
    stop: Arc<std::sync::atomic::AtomicBool>,
    ok: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
) -> Vec<std::thread::JoinHandle<Vec<String>>> {
    (0..threads)
        .map(|_| {
            let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
            std::thread::spawn(move || {
                let mut why = Vec::new();
                while !stop.load(SeqCst) {
                    match one_request(port, "GET") {
                        Ok(()) => ok.fetch_add(1, SeqCst),
                        Err(e) => {
                            if why.len() < 5 {
                                why.push(e);
                            }
                            failed.fetch_add(1, SeqCst)
                        }
                    };
                }
                why
            })
        })
        .collect()
}

#[test]
fn reloads_and_upgrades_under_proxied_load_fail_no_request() {
    let up = upstream(|_| Reply::ok(b"fresh"));
    let up2 = upstream(|_| Reply::ok(b"fresh"));
    let mut d = proxy_builder(&[up.addr().to_string()], "")
        .workers(2)
        .own_binary()
        .start();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let load = proxied_load(d.port, 4, stop.clone(), ok.clone(), failed.clone());
    let progress = |ok: &AtomicU64| {
        let target = ok.load(SeqCst) + 50;
        assert!(
            wait_until(Duration::from_secs(30), || ok.load(SeqCst) >= target),
            "the load made no progress"
        );
    };
    progress(&ok);
    for i in 0..16 {
        // Alternate the server list: pooled connections to a removed server close.
        let servers = if i % 2 == 0 {
            vec![up.addr().to_string(), up2.addr().to_string()]
        } else {
            vec![up2.addr().to_string()]
        };
        d.builder = proxy_builder(&servers, "").workers(2).own_binary();
        let (code, out, err) = d.reload();
        assert_eq!(code, 0, "reload {i}: {out} {err}");
        progress(&ok);
    }
    assert!(
        !up2.received().is_empty(),
        "the reloads did not reach the workers: {}",
        d.error_log()
    );
    for i in 0..4 {
        let old = d.master().expect("a master");
        let (code, out, err) = d.ctl(&["-s", "upgrade"]);
        assert_eq!(code, 0, "upgrade {i}: {out} {err}");
        let new = d.master().expect("a master after the upgrade");
        assert_ne!(new, old, "upgrade {i}: {out}");
        d.adopt_master(new);
        assert!(wait_until(Duration::from_secs(30), || {
            d.reap_first();
            !alive(old)
        }));
        progress(&ok);
    }
    stop.store(true, SeqCst);
    let mut why = Vec::new();
    for t in load {
        why.extend(t.join().unwrap());
    }
    assert_eq!(failed.load(SeqCst), 0, "{} ok; {why:?}", ok.load(SeqCst));
    d.stop_master();
}

#[test]
fn term_lets_slow_proxied_responses_in_flight_finish() {
    let up = upstream(|_| Reply::ok(&[b'z'; 50_000]).trickled(5_000, Duration::from_millis(100)));
    let mut d = proxy_builder(&[up.addr().to_string()], "")
        .top("drain_timeout: \"20s\", shutdown_delay: \"0s\",")
        .start();
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let mut s = d.connect();
            s.write_all(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n").unwrap();
            s
        })
        .collect();
    assert!(wait_until(Duration::from_secs(10), || up.received().len() == 4));
    d.signal("TERM");
    for mut s in clients {
        let r = read_response(&mut s, false).expect("the whole response");
        assert_eq!(r.status, 200);
        assert_eq!(r.body.len(), 50_000);
    }
    assert!(d.wait_exit(Duration::from_secs(30)).is_some());
}

/// The proxy's own figures: per upstream server requests, responses by class, new
/// and reused connections and connect errors in `forkd stats`, and the upstream part
/// of a JSON access-log line.
#[test]
fn proxied_requests_are_counted_per_upstream_server_and_logged_with_their_upstream() {
    let up = upstream(|_| Reply::ok(b"hi"));
    let dead = support::free_port(); // reserved, never listening: refused
    let servers = [format!("127.0.0.1:{dead}"), up.addr().to_string()];
    let d = proxy_builder(&servers, "retries: 1")
        .server("access_log_format: Json,")
        .start();
    // Keep-alive towards forkd; the second request reuses the pooled connection.
    let mut s = d.connect();
    for _ in 0..3 {
        s.write_all(b"GET /p HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .unwrap();
        let r = read_response(&mut s, false).expect("a response");
        assert_eq!(r.status, 200, "{}", r.head);
    }
    let live = up.addr().to_string();
    let dead_label = format!("127.0.0.1:{dead}");
    let find = |json: &serde_json::Value, server: &str| -> serde_json::Value {
        json["upstreams"]
            .as_array()
            .expect("upstreams")
            .iter()
            .find(|u| u["upstream"] == "app" && u["server"] == server)
            .cloned()
            .unwrap_or_else(|| panic!("no row for {server}: {json:#}"))
    };
    let mut last = serde_json::Value::Null;
    let settled = wait_until(SETTLE, || {
        last = stats_json(&d.config);
        find(&last, &live)["responses_2xx"].as_u64() == Some(3)
    });
    assert!(settled, "not counted: {last:#}");
    let row = find(&last, &live);
    assert_eq!(row["requests"], 3, "{row:#}");
    let (new, reused) = (
        row["connections_new"].as_u64().unwrap(),
        row["connections_reused"].as_u64().unwrap(),
    );
    assert_eq!(new + reused, 3, "{row:#}");
    assert!(reused >= 1, "the pool was never used: {row:#}");
    // Round-robin over the servers tried the refused one at least once.
    let down = find(&last, &dead_label);
    assert!(down["connect_errors"].as_u64() >= Some(1), "{down:#}");
    assert!(
        down["retries"].as_u64() >= Some(1),
        "a refused connection moves on to the next server: {down:#}"
    );
    // The JSON access log names the upstream of each proxied request.
    assert!(
        wait_until(SETTLE, || d.access_log().lines().count() >= 3),
        "{}",
        d.access_log()
    );
    for line in d.access_log().lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect(line);
        assert_eq!(v["status"], 200, "{line}");
        assert_eq!(v["upstream_addr"], live.as_str(), "{line}");
        assert_eq!(v["upstream_status"], 200, "{line}");
        assert!(
            matches!(v["upstream_connect"].as_str(), Some("new" | "reused")),
            "{line}"
        );
        assert_eq!(v["request_id"].as_str().map(str::len), Some(32), "{line}");
    }
}

/// Issue 10's bound on chunk extensions holds for a body on its way to an upstream
/// too: 64 KiB of one extension is refused at once, never relayed.
#[test]
fn an_endless_chunk_extension_towards_an_upstream_is_refused_at_once() {
    let up = upstream(|_| Reply::ok(b"hi"));
    let d = proxy_daemon(&[up.addr().to_string()], "");
    let mut s = d.connect();
    s.write_all(b"POST /p HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n5;e=")
        .unwrap();
    // Far more than the 4 KiB a line may carry; then nothing more is ever sent.
    let mut sent = 0;
    while sent < 64 * 1024 {
        if s.write_all(&[b'v'; 4096]).is_err() {
            break; // refused while we were still sending
        }
        sent += 4096;
    }
    let got = read_to_close(&mut s);
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{text}");
    assert!(
        up.received().iter().all(|r| r.body_len < 5),
        "the body reached the upstream"
    );
    let r = d.get("/p");
    assert_eq!(
        (r.status, r.body),
        (200, b"hi".to_vec()),
        "served afterwards"
    );
}

/// `max_body_bytes` holds for a chunked body on its way to an upstream: 413 on the
/// chunk that crosses it, before that chunk reaches the upstream.
#[test]
fn a_chunked_body_over_max_body_bytes_towards_an_upstream_is_413() {
    let up = upstream(|_| Reply::ok(b"hi"));
    let mut b = proxy_builder(&[up.addr().to_string()], "");
    b.server = b
        .server
        .replace("max_body_bytes: \"1G\",", "max_body_bytes: \"1KiB\",");
    let d = b.start();
    let mut s = d.connect();
    let chunk = "a".repeat(600);
    s.write_all(
        format!(
            "POST /p HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n\
             258\r\n{chunk}\r\n258\r\n"
        )
        .as_bytes(),
    )
    .unwrap();
    let got = read_to_close(&mut s);
    let text = String::from_utf8_lossy(&got);
    assert!(
        text.starts_with("HTTP/1.1 413 Content Too Large\r\n"),
        "{text}"
    );
    assert!(
        up.received().iter().all(|r| r.body_len <= 600),
        "more than the first chunk reached the upstream"
    );
    // Within the limit it is relayed whole.
    let mut s = d.connect();
    s.write_all(
        format!(
            "POST /p HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
             258\r\n{chunk}\r\n0\r\n\r\n"
        )
        .as_bytes(),
    )
    .unwrap();
    let r = read_response(&mut s, false).expect("a response");
    assert_eq!((r.status, r.body), (200, b"hi".to_vec()));
}

/// A request head of `method` for `path` with 99 header fields in all (`Host`,
/// `Connection: close` and `extra` among them), one under the parser's 100: forkd
/// adds its own fields to the head it sends upstream, which then has more than a
/// client may send.
fn head_of_99_fields(method: &str, path: &str, extra: &[&str]) -> String {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    for field in extra {
        head.push_str(field);
        head.push_str("\r\n");
    }
    for i in 0..99 - 2 - extra.len() {
        head.push_str(&format!("X-Fill-{i}: {i}\r\n"));
    }
    head.push_str("\r\n");
    head
}

/// Issue 21, item 4: a request near the field limit is answered and logged with its
/// own request line, `Referer` and `User-Agent`, although the head sent upstream
/// (with `X-Forwarded-*` and `X-Request-Id` added) has more than 100 fields.
#[test]
fn a_request_of_99_fields_is_answered_and_logged() {
    let up = upstream(|_| Reply::ok(b"hello"));
    let d = proxy_daemon(&[up.addr().to_string()], "");
    let head = head_of_99_fields(
        "GET",
        "/many?fields=99",
        &["Referer: http://example.test/", "User-Agent: many/1.0"],
    );
    let r = d.request(&head);
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(r.body, b"hello");
    assert!(
        d.wait_for_access_log(
            "\"GET /many?fields=99 HTTP/1.1\" 200 5 \"http://example.test/\" \"many/1.0\"",
            Duration::from_secs(10)
        ),
        "not logged:\n{}",
        d.access_log()
    );
    d.assert_log_clean();
}

/// Issue 21, item 4: forkd's own error page for a HEAD near the field limit (its
/// upstream refuses connections: 502) is a head without a body, and is logged with
/// the request's line.
#[test]
fn a_head_request_of_99_fields_gets_a_502_without_a_body() {
    let refused = support::free_port(); // reserved, never listening: refused
    let d = proxy_daemon(&[format!("127.0.0.1:{refused}")], "");
    let head = head_of_99_fields("HEAD", "/down", &[]);
    let raw = raw_exchange(&d, head.as_bytes());
    let (head, body) = split(&raw);
    assert!(head.starts_with("HTTP/1.1 502 "), "{head}");
    assert!(head.contains("Content-Length: "), "{head}");
    assert!(
        body.is_empty(),
        "a body after a HEAD's 502: {:?}",
        text(&body)
    );
    assert!(
        d.wait_for_access_log("\"HEAD /down HTTP/1.1\" 502 ", Duration::from_secs(10)),
        "not logged:\n{}",
        d.access_log()
    );
}

/// The access log names a proxied request's client as it does any request's: the
/// address `real_ip_header` gives when the peer is a trusted proxy (it named the
/// connection's peer, the proxy in front).
#[test]
fn a_proxied_request_is_logged_with_the_client_real_ip_header_names() {
    let up = upstream(|_| Reply::ok(b"hi"));
    let d = proxy_builder(&[up.addr().to_string()], "")
        .server(r#"trusted_proxies: ["127.0.0.1"], real_ip_header: Some("X-Forwarded-For"),"#)
        .start();
    let r = d.request(
        "GET /behind HTTP/1.1\r\nHost: localhost\r\nX-Forwarded-For: 203.0.113.9\r\n\
         Connection: close\r\n\r\n",
    );
    assert_eq!(r.status, 200, "{}", r.head);
    assert!(
        d.wait_for_access_log("203.0.113.9 - - [", Duration::from_secs(10)),
        "{}",
        d.access_log()
    );
    assert!(d.access_log().contains("\"GET /behind HTTP/1.1\" 200 2"));
}

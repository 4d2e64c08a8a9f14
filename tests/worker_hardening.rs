//! Worker hardening (issue 10): routes that cannot be bypassed by spelling a path
//! differently, per-host limits that apply, final answers instead of `100 Continue`,
//! fairness between connections, minimum transfer rates.
//!
//! Every test starts its own daemon and talks raw HTTP/1.1 to it; none asserts a
//! duration (deadlines are generous bounds on outcomes, for a loaded machine).

mod support;

use std::io::{Read, Write};
use std::time::Duration;
use support::*;

/// How long anything that must happen may take on a loaded machine.
const WAIT: Duration = Duration::from_secs(10);

fn get_close(d: &TestDaemon, target: &str) -> Response {
    d.request(&format!(
        "GET {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    ))
}

// ---------------------------------------------------------------------------------------
// Routing by the normalised path (item 1)

const API_ROUTES: &str = r#"(prefix: "/api", handler: Liveness),
            (prefix: "/", handler: Static(root: "www", index: ["index.html"])),"#;

#[test]
fn every_spelling_of_a_routed_path_reaches_its_route() {
    let d = TestDaemon::builder()
        .routes(API_ROUTES)
        .file("x/api-file.txt", b"static\n")
        .start();
    for target in ["/api/x", "//api/x", "/%61pi/x", "/x/../api/x", "/./api/x"] {
        let r = get_close(&d, target);
        assert_eq!(r.status, 200, "{target}: {}", r.head);
        assert_eq!(r.body_str(), "alive\n", "{target} went past the /api route");
    }
}

#[test]
fn a_path_that_leaves_a_route_is_served_by_the_route_it_lands_in() {
    let d = TestDaemon::builder().file("1kb.txt", &[b'k'; 1024]).start();
    let r = get_close(&d, "/healthz/../1kb.txt");
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(r.body, vec![b'k'; 1024], "answered by the /healthz route");
    let r = get_close(&d, "/%68ealthz");
    assert_eq!(r.body_str(), "alive\n");
}

#[test]
fn a_path_that_cannot_be_normalised_is_400_before_routing() {
    let d = TestDaemon::builder().start();
    for target in [
        "/healthz/../../x",
        "/healthz/%2e%2e/%2e%2e/x",
        "/healthz%2fx",
        "/healthz%00",
        "/healthz%zz",
    ] {
        let r = get_close(&d, target);
        assert_eq!(r.status, 400, "{target}: {}", r.head);
    }
}

#[test]
fn a_folder_prefix_matches_the_folder_only() {
    let d = TestDaemon::builder()
        .routes(
            r#"(prefix: "/api/", handler: Liveness),
            (prefix: "/", handler: Static(root: "www", index: ["index.html"])),"#,
        )
        .file("apix", b"not the api\n")
        .start();
    assert_eq!(get_close(&d, "/api/x").body_str(), "alive\n");
    assert_eq!(get_close(&d, "//api//x").body_str(), "alive\n");
    assert_eq!(get_close(&d, "/apix").body_str(), "not the api\n");
}

#[test]
fn every_spelling_of_a_file_is_the_same_file_and_the_cache_follows_changes() {
    let d = TestDaemon::builder().file("dir/a.txt", b"one\n").start();
    for target in [
        "/dir/a.txt",
        "//dir/a.txt",
        "/dir/./a.txt",
        "/%64ir/a.txt",
        "/x/../dir/a.txt",
    ] {
        assert_eq!(get_close(&d, target).body_str(), "one\n", "{target}");
    }
    std::fs::write(d.www().join("dir/a.txt"), b"two, longer\n").unwrap();
    assert!(
        wait_until(WAIT, || get_close(&d, "/%64ir/a.txt").body_str()
            == "two, longer\n"),
        "a changed file is served fresh under another spelling"
    );
    assert_eq!(get_close(&d, "/dir/a.txt").body_str(), "two, longer\n");
}

// ---------------------------------------------------------------------------------------
// Per-host settings (item 4)

/// Two servers on one address: the default one (`localhost`) with the limits given in
/// `default_keys`, and `other` with `other_keys`. Both serve liveness and `www`.
fn two_servers(default_keys: &str, other_keys: &str) -> Builder {
    let routes = r#"(prefix: "/healthz", handler: Liveness),
            (prefix: "/", handler: Static(root: "www", index: ["index.html"])),"#;
    // The support builder writes one server; the routes text closes it and opens a
    // second one on the same address.
    let second = format!(
        r#"{routes}
        ],
    ), (
        listen: ["127.0.0.1:{{port}}"],
        names: ["other"],
        {other_keys}
        routes: [
            {routes}"#
    );
    TestDaemon::builder().server(default_keys).routes(&second)
}

fn head_with_padding(host: &str, padding: usize, close: bool) -> String {
    format!(
        "GET /healthz HTTP/1.1\r\nHost: {host}\r\nX-Pad: {}\r\n{}\r\n",
        "p".repeat(padding),
        if close { "Connection: close\r\n" } else { "" }
    )
}

#[test]
fn max_header_bytes_is_the_selected_servers() {
    let d = two_servers(
        r#"max_header_bytes: "1KiB","#,
        r#"max_header_bytes: "8KiB","#,
    )
    .start();
    // 3 KiB of header: too large for the default server, fine for `other`.
    let r = d.request(&head_with_padding("other", 3000, true));
    assert_eq!(r.status, 200, "{}", r.head);
    let r = d.request(&head_with_padding("localhost", 3000, true));
    assert_eq!(r.status, 431, "{}", r.head);
    let r = d.request(&head_with_padding("unknown.example", 3000, true));
    assert_eq!(
        r.status, 431,
        "an unknown name gets the default server: {}",
        r.head
    );
    // The other way round: a small limit on the named server applies to it.
    let d = two_servers(
        r#"max_header_bytes: "8KiB","#,
        r#"max_header_bytes: "1KiB","#,
    )
    .start();
    assert_eq!(
        d.request(&head_with_padding("other", 3000, true)).status,
        431
    );
    assert_eq!(
        d.request(&head_with_padding("localhost", 3000, true))
            .status,
        200
    );
}

/// Whether the server closes `s` (EOF) before `WAIT`, reading and dropping anything.
fn closed_by_server(s: &mut std::net::TcpStream) -> bool {
    s.set_read_timeout(Some(WAIT)).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false, // timed out: still open
        }
    }
}

#[test]
fn keepalive_timeout_is_the_selected_servers() {
    let d = two_servers(
        r#"keepalive_timeout: "60s", header_timeout: "60s","#,
        r#"keepalive_timeout: "1s","#,
    )
    .start();
    let mut s = d.connect();
    s.write_all(head_with_padding("other", 1, false).as_bytes())
        .unwrap();
    let r = read_response(&mut s, false).expect("a response");
    assert_eq!(r.status, 200);
    assert!(
        closed_by_server(&mut s),
        "the idle connection outlived the 1 s keepalive_timeout of the server its Host chose"
    );
}

#[test]
fn header_timeout_of_a_later_request_is_the_selected_servers() {
    let d = two_servers(
        r#"keepalive_timeout: "60s", header_timeout: "60s","#,
        r#"keepalive_timeout: "60s", header_timeout: "1s","#,
    )
    .start();
    let mut s = d.connect();
    s.write_all(head_with_padding("other", 1, false).as_bytes())
        .unwrap();
    assert_eq!(
        read_response(&mut s, false).expect("a response").status,
        200
    );
    // Half a head, never finished.
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: oth").unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    let r = read_response(&mut s, false).expect("408 before the connection closes");
    assert_eq!(r.status, 408, "{}", r.head);
}

#[test]
fn send_timeout_is_the_selected_servers() {
    let big = noise(32 << 20, 7);
    let d = two_servers(r#"send_timeout: "60s","#, r#"send_timeout: "1s","#)
        .file("big.bin", &big)
        .start();
    let mut s = d.connect();
    s.write_all(b"GET /big.bin HTTP/1.1\r\nHost: other\r\nConnection: close\r\n\r\n")
        .unwrap();
    // Not reading: the server's writes stop making progress. With `other`'s 1 s
    // send_timeout it gives up; a reader that starts after that gets a cut response.
    let gave_up = wait_until(WAIT, || {
        d.error_log().contains("timed out reading its response")
    });
    assert!(gave_up, "no send timeout: {}", d.error_log());
    let got = read_to_close(&mut s);
    assert!(got.len() < big.len(), "the whole response arrived");
}

// ---------------------------------------------------------------------------------------
// `Expect: 100-continue` when the answer is already known (item 10)

/// Sends `head` (with `Expect: 100-continue` and a body announced but not sent) and
/// returns the first response, and whether the server then closed the connection.
fn expect_continue(d: &TestDaemon, method: &str, target: &str) -> (Response, bool) {
    let mut s = d.connect();
    write!(
        s,
        "{method} {target} HTTP/1.1\r\nHost: localhost\r\nExpect: 100-continue\r\nContent-Length: 100000\r\n\r\n"
    )
    .unwrap();
    let r = read_response(&mut s, false).expect("a response before the body is sent");
    let closed = closed_by_server(&mut s);
    (r, closed)
}

#[test]
fn a_known_refusal_comes_instead_of_100_continue_and_the_connection_closes() {
    let d = TestDaemon::builder()
        .routes(
            r#"(prefix: "/healthz", handler: Liveness),
            (prefix: "/files/", handler: Static(root: "www", index: ["index.html"])),"#,
        )
        .file("files/a.txt", b"a\n")
        .start();
    for (method, target, status) in [
        ("POST", "/files/a.txt", 405), // the static handler takes GET and HEAD only
        ("PUT", "/healthz", 405),
        ("GET", "/elsewhere", 404),     // no route
        ("GET", "/files/../../x", 400), // cannot be normalised
    ] {
        let (r, closed) = expect_continue(&d, method, target);
        assert_eq!(r.status, status, "{method} {target}: {}", r.head);
        assert_eq!(r.header("Connection"), Some("close"), "{method} {target}");
        assert!(
            closed,
            "{method} {target}: the unread body would be taken for a request"
        );
    }
    // A request the route will answer still gets its `100 Continue`.
    let mut s = d.connect();
    s.write_all(
        b"GET /files/a.txt HTTP/1.1\r\nHost: localhost\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n",
    )
    .unwrap();
    assert_eq!(read_response(&mut s, false).unwrap().status, 100);
    s.write_all(b"abc").unwrap();
    let r = read_response(&mut s, false).unwrap();
    assert_eq!((r.status, r.body_str().as_str()), (200, "a\n"));
}

// ---------------------------------------------------------------------------------------
// Fairness inside a worker (item 6)

#[test]
fn small_requests_are_served_while_a_client_pulls_a_huge_file() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
    use std::sync::Arc;
    const HUGE: u64 = 1 << 30;
    let d = TestDaemon::builder()
        .file("small.txt", b"small\n")
        .server(r#"send_timeout: "60s","#)
        .start();
    // Sparse: no disk, and read from the page cache as fast as memory goes.
    std::fs::File::create(d.www().join("huge.bin"))
        .unwrap()
        .set_len(HUGE)
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let pulled = Arc::new(AtomicU64::new(0)); // body bytes
    let done = Arc::new(AtomicU64::new(0)); // complete huge responses
    let puller = {
        let (stop, pulled, done) = (stop.clone(), pulled.clone(), done.clone());
        let mut s = d.connect();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 1 << 20];
            while !stop.load(SeqCst) {
                s.write_all(b"GET /huge.bin HTTP/1.1\r\nHost: localhost\r\n\r\n")
                    .unwrap();
                // The head is small and ends the first read or so; then the body.
                let mut head = Vec::new();
                while !head.ends_with(b"\r\n\r\n") {
                    let mut b = [0u8; 1];
                    s.read_exact(&mut b).unwrap();
                    head.push(b[0]);
                }
                let mut left = HUGE;
                while left > 0 {
                    if stop.load(SeqCst) {
                        return; // mid-response: the test is over
                    }
                    let want = left.min(buf.len() as u64) as usize;
                    let n = s.read(&mut buf[..want]).unwrap();
                    assert!(n > 0, "the huge response was cut short");
                    left -= n as u64;
                    pulled.fetch_add(n as u64, SeqCst);
                }
                done.fetch_add(1, SeqCst);
            }
        })
    };
    assert!(
        wait_until(WAIT, || pulled.load(SeqCst) > 4 << 20),
        "the huge download does not start"
    );
    // A keep-alive client asks for a small file again and again meanwhile.
    let mut s = d.connect();
    let huge_before = done.load(SeqCst);
    let pulled_before = pulled.load(SeqCst);
    const SMALL: usize = 100;
    for i in 0..SMALL {
        s.write_all(b"GET /small.txt HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .unwrap();
        let r = read_response(&mut s, false).unwrap_or_else(|| panic!("request {i}: no answer"));
        assert_eq!(r.body_str(), "small\n");
    }
    let huge_during = done.load(SeqCst) - huge_before;
    let pulled_during = pulled.load(SeqCst) - pulled_before;
    stop.store(true, SeqCst);
    puller.join().unwrap();
    // Served between the huge responses only, the small requests would each wait for
    // one to end. Interleaved, they all fit within the span of one or two.
    assert!(
        huge_during <= 2,
        "{SMALL} small requests took {huge_during} complete huge responses ({pulled_during} bytes) to be answered"
    );
}

// ---------------------------------------------------------------------------------------
// Minimum rates (item 12)

#[test]
fn a_body_sent_below_min_body_rate_is_answered_408_after_the_grace() {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    use std::sync::Arc;
    let d = TestDaemon::builder()
        .server(r#"body_timeout: "3s", min_body_rate: "1KiB/s", min_rate_grace: "2s","#)
        .start();
    let mut s = d.connect();
    s.write_all(b"GET /index.html HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100000\r\n\r\n")
        .unwrap();
    // One byte a second: never 3 s apart, so body_timeout alone would wait for ever.
    let stop = Arc::new(AtomicBool::new(false));
    let dripper = {
        let (stop, mut w) = (stop.clone(), s.try_clone().unwrap());
        std::thread::spawn(move || {
            let mut sent = 0;
            while !stop.load(SeqCst) && w.write_all(b"x").is_ok() {
                sent += 1;
                std::thread::sleep(Duration::from_secs(1));
            }
            sent
        })
    };
    s.set_read_timeout(Some(WAIT + WAIT)).unwrap();
    let r = read_response(&mut s, false);
    stop.store(true, SeqCst);
    let sent = dripper.join().unwrap();
    let r = r.unwrap_or_else(|| panic!("closed without an answer after {sent} body bytes"));
    assert_eq!(r.status, 408, "{}", r.head);
    assert!(
        d.error_log()
            .contains("sent its request body below the minimum rate"),
        "{}",
        d.error_log()
    );
}

#[test]
fn a_reader_below_min_send_rate_is_closed() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
    use std::sync::Arc;
    const SIZE: u64 = 32 << 20;
    let d = TestDaemon::builder()
        .server(r#"send_timeout: "60s", min_send_rate: "1KiB/s", min_rate_grace: "1s","#)
        .start();
    std::fs::File::create(d.www().join("big.bin"))
        .unwrap()
        .set_len(SIZE)
        .unwrap();
    let mut s = d.connect();
    s.write_all(b"GET /big.bin HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    // One byte at a time, about 200 bytes a second.
    let stop = Arc::new(AtomicBool::new(false));
    let got = Arc::new(AtomicU64::new(0));
    let reader = {
        let (stop, got, mut r) = (stop.clone(), got.clone(), s.try_clone().unwrap());
        std::thread::spawn(move || {
            let mut b = [0u8; 1];
            while !stop.load(SeqCst) && matches!(r.read(&mut b), Ok(1)) {
                got.fetch_add(1, SeqCst);
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let closed = wait_until(WAIT + WAIT, || {
        d.error_log()
            .contains("read its response below the minimum rate")
    });
    stop.store(true, SeqCst);
    reader.join().unwrap();
    assert!(closed, "the slow reader was not closed: {}", d.error_log());
    // What the socket buffers still hold arrives, then the end: the response is cut.
    let rest = read_to_close(&mut s).len() as u64;
    assert!(got.load(SeqCst) + rest < SIZE, "the whole response arrived");
}

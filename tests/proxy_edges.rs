//! Edges of a proxied exchange end to end: a client that leaves while forkd waits
//! for the upstream (logged 499, the upstream connection closed rather than pooled),
//! the client connection after a 502 or 504 of forkd's own (kept when the
//! request was read whole), `read_timeout` after forkd held a response for a
//! client that did not read (the time held is not the upstream's), and a request body
//! forkd already read from the client going on once the upstream takes what was
//! buffered for it.
//!
//! These are the edges of a streamed exchange: the routes here turn request and
//! response buffering off (`tests/proxy_buffering.rs` has the buffered ones), since a
//! body read whole first, or a response spooled for a slow client, never meets them.

mod support;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};
use support::upstream::{
    fnv, pattern_byte, pattern_hash, upstream, Reply, TestUpstream, Writer, FNV_START,
};
use support::*;

/// A daemon with `/` proxied to `servers` (an upstream named `app`, `keys` added).
fn proxy_daemon(servers: &[String], keys: &str) -> TestDaemon {
    let list = support::upstream::server_list(servers);
    TestDaemon::builder()
        .top(&format!(
            "upstreams: {{ \"app\": (servers: [{list}], {keys}) }},"
        ))
        .routes(r#"(prefix: "/", handler: Proxy(upstream: "app", buffering: false, request_buffering: false)),"#)
        .start()
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
        d.wait_for_access_log("\"GET /slow HTTP/1.1\" 499 0", Duration::from_secs(10)),
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

/// The body of a [`Held`] response, in bytes.
const HELD_LEN: u64 = 16 << 20;
/// The first part is written this much at a time.
const PIECE: u64 = 16 * 1024;

/// A value one thread sets once and others wait for.
struct Latch(Mutex<Option<u64>>, Condvar);

impl Latch {
    fn new() -> Latch {
        Latch(Mutex::new(None), Condvar::new())
    }
    fn set(&self, value: u64) {
        *self.0.lock().unwrap() = Some(value);
        self.1.notify_all();
    }
    fn wait(&self, timeout: Duration) -> Option<u64> {
        let (guard, _) = self
            .1
            .wait_timeout_while(self.0.lock().unwrap(), timeout, |v| v.is_none())
            .unwrap();
        *guard
    }
}

/// A response forkd holds for a client that does not read while the upstream is
/// silent. The upstream writes the head and then the body in [`PIECE`]s, each once
/// forkd has read the one before, until forkd holds some of it for the client (its
/// socket buffers are full: what forkd wrote to the client falls behind what it read
/// from the upstream, as /proc/net/tcp shows). Then the upstream has nothing more in
/// flight, says how long that first part was (`first_part`), and waits for `resume`
/// before it writes the rest. [`pattern_byte`]s, `HELD_LEN` of them.
struct Held {
    /// The client's end of its connection to forkd: (client, forkd).
    client: OnceLock<(SocketAddr, SocketAddr)>,
    /// The first part's length (body bytes); `u64::MAX`: forkd never held any.
    first_part: Latch,
    resume: Latch,
    /// Why the first part could not be written as wanted.
    failed: Mutex<String>,
}

impl Held {
    fn new() -> Held {
        Held {
            client: OnceLock::new(),
            first_part: Latch::new(),
            resume: Latch::new(),
            failed: Mutex::new(String::new()),
        }
    }

    fn reply(self: &Arc<Held>) -> Reply {
        let held = Arc::clone(self);
        Reply::Written(Writer(Arc::new(move |s| held.write(s))))
    }

    fn write(&self, s: &mut TcpStream) -> bool {
        let (upstream, forkd_side) = (s.local_addr().unwrap(), s.peer_addr().unwrap());
        let &(client, forkd) = self.client.get().expect("the client connected first");
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {HELD_LEN}\r\n\r\n");
        if s.write_all(head.as_bytes()).is_err() {
            return false;
        }
        let (mut at, mut written) = (0, head.len() as u64);
        loop {
            if at + PIECE > HELD_LEN / 2 {
                *self.failed.lock().unwrap() = format!("forkd took {at} bytes without holding any");
                self.first_part.set(u64::MAX);
                return false;
            }
            if !write_pattern(s, at, PIECE) {
                return false;
            }
            at += PIECE;
            written += PIECE;
            // What forkd wrote to the client, once it has read all the upstream sent.
            let mut delivered = 0;
            let mut seen = [None; 4];
            let all_read = wait_until(Duration::from_secs(10), || {
                seen = tcp_queues([
                    (upstream, forkd_side),
                    (forkd_side, upstream),
                    (forkd, client),
                    (client, forkd),
                ]);
                match seen {
                    [Some((unsent, _)), Some((_, unread)), Some((to_client, _)), Some((_, at_client))] =>
                    {
                        delivered = to_client + at_client;
                        unsent == 0 && unread == 0
                    }
                    _ => false,
                }
            });
            if !all_read {
                *self.failed.lock().unwrap() = format!(
                    "forkd did not read the upstream's piece after {at} bytes (delivered \
                     {delivered} of {written}; queues {seen:?})"
                );
                self.first_part.set(u64::MAX);
                return false;
            }
            // The last piece may be read but not yet written on; two pieces behind,
            // forkd holds at least one (forkd's head is the longer one).
            if written.saturating_sub(delivered) >= 2 * PIECE {
                break;
            }
        }
        self.first_part.set(at);
        if self.resume.wait(Duration::from_secs(60)).is_none() {
            return false;
        }
        write_pattern(s, at, HELD_LEN - at)
    }
}

/// Writes pattern bytes `from..from + len` of a body.
fn write_pattern(s: &mut TcpStream, from: u64, len: u64) -> bool {
    let mut at = from;
    while at < from + len {
        let n = (from + len - at).min(64 * 1024);
        let piece: Vec<u8> = (at..at + n).map(pattern_byte).collect();
        if s.write_all(&piece).is_err() {
            return false;
        }
        at += n;
    }
    true
}

/// (tx_queue, rx_queue) of each TCP socket `local` → `remote` (/proc/net/tcp, read
/// once): bytes written on it that the peer has not acknowledged (taken into its
/// buffer), and bytes received that its process has not read. One pass with no
/// allocation per line: the table may hold thousands of sockets of other tests.
fn tcp_queues<const N: usize>(sockets: [(SocketAddr, SocketAddr); N]) -> [Option<(u64, u64)>; N] {
    let hex = |a: SocketAddr| match a {
        SocketAddr::V4(v4) => format!(
            "{:08X}:{:04X}",
            u32::from_le_bytes(v4.ip().octets()),
            v4.port()
        ),
        SocketAddr::V6(_) => String::new(),
    };
    let wanted: Vec<(String, String)> = sockets.iter().map(|&(l, r)| (hex(l), hex(r))).collect();
    let mut found = [None; N];
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    for line in table.lines().skip(1) {
        // "  sl: LOCAL REMOTE ST TX:RX ..."
        let mut fields = line.split_ascii_whitespace().skip(1);
        let (Some(local), Some(remote), _, Some(queues)) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let Some(i) = wanted.iter().position(|(l, r)| l == local && r == remote) else {
            continue;
        };
        found[i] = queues.split_once(':').and_then(|(tx, rx)| {
            Some((
                u64::from_str_radix(tx, 16).ok()?,
                u64::from_str_radix(rx, 16).ok()?,
            ))
        });
    }
    found
}

/// A daemon proxying to a [`Held`] upstream with `read_timeout: "1s"`, and a client
/// that asked it for the response and has not read any of it while forkd held part
/// of it for longer than `read_timeout`, then read the head and the first part: all
/// the upstream sent. Returns the daemon, the upstream, the client's connection, the
/// body bytes read and the first part's length.
fn held_for_the_client(held: &Arc<Held>) -> (TestDaemon, TestUpstream, TcpStream, Vec<u8>, u64) {
    let up = {
        let held = Arc::clone(held);
        // Other requests (the harness's readiness check) get a plain answer.
        upstream(move |req| match req.path() {
            "/held" => held.reply(),
            _ => Reply::ok(b"not held"),
        })
    };
    let d = proxy_daemon(
        &[up.addr().to_string()],
        "read_timeout: \"1s\", retries: 0,",
    );
    let mut s = d.connect();
    held.client
        .set((s.local_addr().unwrap(), s.peer_addr().unwrap()))
        .unwrap();
    s.write_all(b"GET /held HTTP/1.1\r\nHost: h\r\n\r\n")
        .unwrap();
    let first = held
        .first_part
        .wait(Duration::from_secs(120))
        .expect("the upstream wrote its first part");
    assert_ne!(first, u64::MAX, "{}", held.failed.lock().unwrap());
    // Held for the client, with nothing coming from the upstream: 2.5 × read_timeout.
    std::thread::sleep(Duration::from_millis(2500));
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).expect("the response head");
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(
        head.contains(&format!("\r\nContent-Length: {HELD_LEN}\r\n")),
        "{head}"
    );
    let mut body = vec![0u8; first as usize];
    s.read_exact(&mut body).expect("the first part");
    (d, up, s, body, first)
}

/// Reads body bytes until `HELD_LEN` of them are in `body` or the connection ends.
fn read_rest(s: &mut TcpStream, body: &mut Vec<u8>) {
    let mut buf = vec![0u8; 64 * 1024];
    while (body.len() as u64) < HELD_LEN {
        match s.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => body.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => panic!("reading the body after {} bytes: {e}", body.len()),
        }
    }
}

/// Where `body` first differs from the pattern, if it does.
fn first_mismatch(body: &[u8]) -> Option<usize> {
    (0..body.len()).find(|&i| body[i] != pattern_byte(i as u64))
}

#[test]
fn read_timeout_counts_from_when_forkd_went_back_to_reading_after_holding_a_response() {
    let held = Arc::new(Held::new());
    let (d, _up, mut s, mut body, first) = held_for_the_client(&held);
    // forkd took in all the upstream sent long ago and now waits for more; the
    // upstream answers at once.
    held.resume.set(1);
    read_rest(&mut s, &mut body);
    assert_eq!(
        body.len() as u64,
        HELD_LEN,
        "the response was cut {} bytes after its {first}-byte first part; error log:\n{}",
        body.len() as u64 - first,
        d.error_log()
    );
    assert_eq!(
        first_mismatch(&body),
        None,
        "the body is not what the upstream sent"
    );
    assert!(!d.error_log().contains("timed out"), "{}", d.error_log());
}

#[test]
fn an_upstream_silent_for_read_timeout_after_a_held_response_drained_is_still_cut() {
    let held = Arc::new(Held::new());
    let (d, _up, mut s, mut body, first) = held_for_the_client(&held);
    // The upstream stays silent: forkd, waiting on it again, gives up after
    // read_timeout, and the client sees the response end short.
    read_rest(&mut s, &mut body);
    assert_eq!(
        body.len() as u64,
        first,
        "the response ends where the upstream stopped"
    );
    assert_eq!(first_mismatch(&body), None);
    assert!(
        d.wait_for_log("upstream timed out", Duration::from_secs(10)),
        "{}",
        d.error_log()
    );
    held.resume.set(1); // the upstream's thread ends (its writes fail)
}

/// An upstream that reads a request's head at once but its body (`Content-Length`)
/// only once `go` is set, then as fast as it can; it answers 200 with the body's
/// length and FNV hash (and a request without a body with "no body").
struct Gated {
    go: Latch,
    /// The connection a request with a body came on: (upstream, forkd's end).
    body_on: OnceLock<(SocketAddr, SocketAddr)>,
}

impl Gated {
    fn new() -> Gated {
        Gated {
            go: Latch::new(),
            body_on: OnceLock::new(),
        }
    }
}

fn body_gated_upstream(gated: Arc<Gated>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(s) = s else { return };
            let gated = Arc::clone(&gated);
            std::thread::spawn(move || serve_gated(s, &gated));
        }
    });
    addr
}

/// A daemon proxying to a [`body_gated_upstream`] at `addr`, the upstream's `keys`
/// added, bodies up to 1 GiB.
fn gated_daemon(addr: SocketAddr, keys: &str) -> TestDaemon {
    TestDaemon::builder()
        .top(&format!(
            "upstreams: {{ \"app\": (servers: [\"{addr}\"], {keys}) }},"
        ))
        .server("max_body_bytes: \"1G\",")
        .routes(r#"(prefix: "/", handler: Proxy(upstream: "app", buffering: false, request_buffering: false)),"#)
        .start()
}

fn serve_gated(mut s: TcpStream, gated: &Gated) {
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            match s.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        buf.drain(..end);
        let len: u64 = head
            .split("\r\n")
            .find_map(|l| l.strip_prefix("content-length: "))
            .map_or(0, |v| v.trim().parse().unwrap());
        let answer = if len == 0 {
            "no body".to_string()
        } else {
            let _ = gated
                .body_on
                .set((s.local_addr().unwrap(), s.peer_addr().unwrap()));
            gated.go.wait(Duration::from_secs(120));
            let (mut got, mut hash) = (0u64, FNV_START);
            while got < len {
                if buf.is_empty() {
                    match s.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let take = buf.len().min((len - got) as usize);
                hash = fnv(hash, &buf[..take]);
                got += take as u64;
                buf.drain(..take);
            }
            format!("{got} {hash}")
        };
        let reply = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{answer}",
            answer.len()
        );
        if s.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

/// A daemon proxying to a body-gated upstream (`keys` added to it), and a client
/// connection that sent the head of a `len`-byte POST; the head's length.
fn post_to_gated(gated: &Arc<Gated>, keys: &str, len: u64) -> (TestDaemon, TcpStream, u64) {
    let addr = body_gated_upstream(Arc::clone(gated));
    let d = gated_daemon(addr, keys);
    let mut s = d.connect();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let head = format!("POST /up HTTP/1.1\r\nHost: h\r\nContent-Length: {len}\r\n\r\n");
    s.write_all(head.as_bytes()).unwrap();
    (d, s, head.len() as u64)
}

#[test]
fn a_request_body_forkd_has_read_goes_on_once_the_upstream_takes_what_it_buffered() {
    // More than forkd's buffer and the upstream connection's hold, so that forkd has
    // body bytes read from the client and waiting for room when the upstream starts.
    const LEN: u64 = 64 << 20;
    let gated = Arc::new(Gated::new());
    let (d, mut s, _) = post_to_gated(&gated, "send_timeout: \"10s\", retries: 0,", LEN);
    let (written, done) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let writer = {
        let mut s = s.try_clone().unwrap();
        let (written, done) = (Arc::clone(&written), Arc::clone(&done));
        std::thread::spawn(move || {
            let mut at = 0;
            while at < LEN {
                let n = (LEN - at).min(256 * 1024);
                if !write_pattern(&mut s, at, n) {
                    break;
                }
                at += n;
                written.store(at, Ordering::SeqCst);
            }
            done.store(true, Ordering::SeqCst);
        })
    };
    // Every buffer on the way is full (the client's writes stopped), or the body is
    // all in them: then the upstream starts reading.
    let mut last = (0, Instant::now());
    assert!(
        wait_until(Duration::from_secs(60), || {
            let now = written.load(Ordering::SeqCst);
            if now != last.0 {
                last = (now, Instant::now());
            }
            done.load(Ordering::SeqCst) || last.1.elapsed() > Duration::from_millis(300)
        }),
        "the client's writes never stopped"
    );
    gated.go.set(1);
    let r = read_response(&mut s, false).expect("a response");
    assert_eq!(
        (r.status, r.body_str()),
        (200, format!("{LEN} {}", pattern_hash(LEN))),
        "after {} of {LEN} body bytes; error log:\n{}",
        written.load(Ordering::SeqCst),
        d.error_log()
    );
    writer.join().unwrap();
}

#[test]
fn send_timeout_counts_from_when_forkd_went_back_to_writing_after_waiting_for_the_body() {
    const LEN: u64 = 64 << 20;
    let gated = Arc::new(Gated::new());
    let (d, mut s, head_len) = post_to_gated(&gated, "send_timeout: \"1s\", retries: 0,", LEN);
    let (client, forkd) = (s.local_addr().unwrap(), s.peer_addr().unwrap());
    let on = wait_until(Duration::from_secs(10), || gated.body_on.get().is_some());
    assert!(on, "the request reached the upstream");
    let &(upstream, forkd_side) = gated.body_on.get().unwrap();
    // The body in pieces, each once forkd has read the one before, until the upstream
    // (not reading) has stopped taking them and forkd holds some with room for more:
    // it waits for the client, which is not the upstream's delay.
    let (mut at, mut sent) = (0, head_len);
    loop {
        assert!(at + PIECE < LEN / 2, "forkd never held part of the body");
        assert!(write_pattern(&mut s, at, PIECE));
        at += PIECE;
        sent += PIECE;
        let mut delivered = 0;
        let all_read = wait_until(Duration::from_secs(10), || {
            match tcp_queues([
                (client, forkd),
                (forkd, client),
                (forkd_side, upstream),
                (upstream, forkd_side),
            ]) {
                [Some((unsent, _)), Some((_, unread)), Some((to_up, _)), Some((_, at_up))] => {
                    delivered = to_up + at_up;
                    unsent == 0 && unread == 0
                }
                _ => false,
            }
        });
        assert!(all_read, "forkd stopped reading the body after {at} bytes");
        // As for the response: two pieces behind, forkd holds at least one (its
        // upstream head is the longer one).
        if sent.saturating_sub(delivered) >= 2 * PIECE {
            break;
        }
    }
    // The client pauses for 2.5 × send_timeout, then sends the rest: forkd's buffer
    // fills and it waits on the upstream again, which starts reading soon after.
    std::thread::sleep(Duration::from_millis(2500));
    let writer = {
        let mut s = s.try_clone().unwrap();
        std::thread::spawn(move || write_pattern(&mut s, at, LEN - at))
    };
    std::thread::sleep(Duration::from_millis(100));
    gated.go.set(1);
    let r = read_response(&mut s, false).expect("a response");
    assert_eq!(
        (r.status, r.body_str()),
        (200, format!("{LEN} {}", pattern_hash(LEN))),
        "the first part was {at} bytes; error log:\n{}",
        d.error_log()
    );
    assert!(writer.join().unwrap());
    assert!(!d.error_log().contains("timed out"), "{}", d.error_log());
}

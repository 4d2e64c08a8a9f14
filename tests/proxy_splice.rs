//! Large bodies relayed without buffering (#23), end to end against one worker: a
//! response body relayed as is (`Content-Length`, or close-delimited to an HTTP/1.0
//! client) goes upstream socket → pipe → client socket with `splice(2)` when the
//! client is a plain connection and buffering is off for the exchange. The worker
//! keeps an emptied pipe for the next exchange, so a pipe in its descriptor table
//! says the body was spliced, and its absence that it was copied.
//!
//! Each test checks what the client gets byte for byte, what happens to the
//! upstream connection (pooled only when nothing came past the body), and what the
//! worker holds afterwards (no descriptor left behind by a client that left).

mod support;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;
use support::process::fd_links;
use support::scripted::{Script, ScriptedUpstream};
use support::upstream::{fnv, pattern_byte, pattern_hash, upstream, Reply, FNV_START};
use support::*;

/// How long a test waits for what it expects.
const WAIT: Duration = Duration::from_secs(30);
/// A body far larger than a pipe and the socket buffers around it.
const BIG: u64 = 8 << 20;

/// One worker proxying `/` to `addr` (an upstream named `app` with `keys`), the
/// route with `route` keys.
fn daemon(addr: std::net::SocketAddr, keys: &str, route: &str) -> TestDaemon {
    TestDaemon::builder()
        .workers(1)
        .top(&format!(
            "upstreams: {{ \"app\": (servers: [\"{addr}\"], {keys}) }},"
        ))
        .server("max_body_bytes: \"64M\",")
        .routes(&format!(
            r#"(prefix: "/healthz", handler: Liveness),
            (prefix: "/", handler: Proxy(upstream: "app"{route})),"#
        ))
        .start()
}

fn worker(d: &TestDaemon) -> i32 {
    let workers = d.workers();
    assert_eq!(workers.len(), 1, "{workers:?}");
    workers[0]
}

/// The worker's open descriptors that are pipes.
fn pipes(pid: i32) -> usize {
    fd_links(pid)
        .iter()
        .filter(|l| l.starts_with("pipe:"))
        .count()
}

fn client(d: &TestDaemon) -> TcpStream {
    let s = d.connect();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s
}

/// A keep-alive client connection that asked for `/big`, and the response.
fn get_big(d: &TestDaemon) -> (TcpStream, Response) {
    let mut s = client(d);
    s.write_all(b"GET /big HTTP/1.1\r\nHost: h\r\n\r\n")
        .unwrap();
    let r = read_response(&mut s, false).expect("the big response");
    (s, r)
}

/// The hash of `body`, to compare with [`pattern_hash`].
fn hash(body: &[u8]) -> u64 {
    fnv(FNV_START, body)
}

#[test]
fn a_large_unbuffered_response_is_spliced_whole_and_the_connection_goes_on() {
    let up = upstream(|r| match r.path() {
        "/big" => Reply::Large {
            len: BIG,
            chunked: false,
        },
        _ => Reply::ok(b"next"),
    });
    let d = daemon(up.addr(), "", ", buffering: false");
    let pid = worker(&d);
    let before = pipes(pid);
    let (mut s, r) = get_big(&d);
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(r.header("Content-Length"), Some("8388608"), "{}", r.head);
    assert_eq!(r.body.len() as u64, BIG);
    assert_eq!(hash(&r.body), pattern_hash(BIG), "every byte, in order");
    // The length was honoured: the next request on the connection is answered.
    s.write_all(b"GET /small HTTP/1.1\r\nHost: h\r\n\r\n")
        .unwrap();
    let next = read_response(&mut s, false).expect("the next response");
    assert_eq!((next.status, next.body_str().as_str()), (200, "next"));
    assert_eq!(up.connections(), 1, "the upstream connection was pooled");
    assert!(
        wait_until(WAIT, || pipes(pid) == before + 2),
        "the body went through a pipe, kept for the next exchange: {:?}",
        fd_links(pid)
    );
    assert!(d.wait_for_access_log("\"GET /big HTTP/1.1\" 200 8388608", WAIT));
    d.assert_log_clean();
}

#[test]
fn x_accel_buffering_no_splices_and_chunked_or_buffered_bodies_are_copied() {
    let body: Vec<u8> = (0..BIG).map(pattern_byte).collect();
    let up = upstream(move |r| match r.path() {
        "/accel" => Reply::Full {
            status: 200,
            extra: vec![("X-Accel-Buffering".into(), "no".into())],
            body: body.clone(),
        },
        "/chunked" => Reply::Large {
            len: BIG,
            chunked: true,
        },
        _ => Reply::Large {
            len: BIG,
            chunked: false,
        },
    });
    // Buffering on for the route: `/plain` is buffered (copied), `/chunked` too;
    // `/accel` turns it off and is spliced.
    let d = daemon(up.addr(), "", "");
    let pid = worker(&d);
    let before = pipes(pid);
    for path in ["/plain", "/chunked", "/accel"] {
        let mut s = client(&d);
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .unwrap();
        let raw = read_to_close(&mut s);
        let end = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        let head = String::from_utf8_lossy(&raw[..end]);
        assert!(head.starts_with("HTTP/1.1 200"), "{path}: {head}");
        let data = if head.contains("Transfer-Encoding: chunked") {
            dechunk(&raw[end..])
        } else {
            raw[end..].to_vec()
        };
        assert_eq!(hash(&data), pattern_hash(BIG), "{path}");
        if path != "/accel" {
            assert_eq!(pipes(pid), before, "{path} was copied, not spliced");
        }
    }
    assert!(
        wait_until(WAIT, || pipes(pid) == before + 2),
        "X-Accel-Buffering: no spliced it: {:?}",
        fd_links(pid)
    );
    d.assert_log_clean();
}

/// The data of a chunked body (without trailers).
fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut data = Vec::new();
    loop {
        let line = raw.windows(2).position(|w| w == b"\r\n").unwrap();
        let size = std::str::from_utf8(&raw[..line]).unwrap();
        let size = usize::from_str_radix(size.split(';').next().unwrap(), 16).unwrap();
        raw = &raw[line + 2..];
        if size == 0 {
            assert_eq!(raw, b"\r\n", "the end, no trailers");
            return data;
        }
        data.extend_from_slice(&raw[..size]);
        assert_eq!(&raw[size..size + 2], b"\r\n");
        raw = &raw[size + 2..];
    }
}

#[test]
fn bytes_past_a_spliced_body_never_reach_the_client_and_its_connection_is_not_pooled() {
    const LEN: usize = 2 << 20;
    let mut first = format!("HTTP/1.1 200 OK\r\nContent-Length: {LEN}\r\n\r\n").into_bytes();
    first.extend((0..LEN as u64).map(pattern_byte));
    first.extend_from_slice(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\npoison");
    let up = ScriptedUpstream::start(vec![
        Script::new().read_head().write(&first).await_close(),
        Script::new()
            .read_head()
            .write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfresh")
            .await_close(),
    ]);
    let d = daemon(up.addr(), "", ", buffering: false");
    let pid = worker(&d);
    let before = pipes(pid);
    let (mut s, r) = get_big(&d);
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(hash(&r.body), pattern_hash(LEN as u64));
    s.write_all(b"GET /next HTTP/1.1\r\nHost: h\r\n\r\n")
        .unwrap();
    let next = read_response(&mut s, false).expect("the next response");
    assert_eq!(
        (next.status, next.body_str().as_str()),
        (200, "fresh"),
        "the bytes past the body were never relayed"
    );
    assert_eq!(up.connections(), 2, "the first connection was not pooled");
    assert!(
        up.wait_finished(0, WAIT),
        "forkd closed the first connection"
    );
    assert!(wait_until(WAIT, || pipes(pid) == before + 2), "spliced");
}

#[test]
fn an_upstream_closing_before_a_spliced_body_ends_truncates_it_and_closes_the_client() {
    const LEN: usize = 4 << 20;
    const AFTER: usize = 3 << 20;
    let body: Vec<u8> = (0..LEN as u64).map(pattern_byte).collect();
    let up = upstream(move |_| Reply::CloseMidBody {
        body: body.clone(),
        after: AFTER,
    });
    let d = daemon(up.addr(), "", ", buffering: false");
    let pid = worker(&d);
    let before = pipes(pid);
    let mut s = client(&d);
    s.write_all(b"GET /cut HTTP/1.1\r\nHost: h\r\n\r\n")
        .unwrap();
    let raw = read_to_close(&mut s);
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let head = String::from_utf8_lossy(&raw[..end]);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("Content-Length: 4194304"), "{head}");
    let got = &raw[end..];
    assert_eq!(
        got.len(),
        AFTER,
        "every byte the upstream sent, then the close"
    );
    assert_eq!(hash(got), pattern_hash(AFTER as u64));
    assert!(
        d.wait_for_log("invalid or truncated response body from the upstream", WAIT),
        "{}",
        d.error_log()
    );
    // Counted and logged as what it was, when it failed (as a copied body is).
    assert!(
        d.wait_for_access_log("\"GET /cut HTTP/1.1\" 200 ", WAIT),
        "{}",
        d.access_log()
    );
    assert!(wait_until(WAIT, || pipes(pid) == before + 2), "spliced");
}

#[test]
fn a_client_leaving_mid_spliced_body_leaves_no_descriptor_behind() {
    const LONG: u64 = 64 << 20;
    let up = upstream(|_| Reply::Large {
        len: LONG,
        chunked: false,
    });
    // `keepalive: 0`: no pooled upstream connection stays in the fd table.
    let d = daemon(up.addr(), "keepalive: 0", ", buffering: false");
    let pid = worker(&d);
    let whole = |d: &TestDaemon| {
        let mut s = client(d);
        s.write_all(b"GET /all HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
            .unwrap();
        let r = read_response(&mut s, false).expect("a whole response");
        assert_eq!(r.status, 200, "{}", r.head);
        assert_eq!(hash(&r.body), pattern_hash(LONG));
    };
    let before = fd_links(pid).len();
    whole(&d);
    // The exchange's pipe is kept for the next; nothing else stays.
    assert!(
        wait_until(WAIT, || fd_links(pid).len() == before + 2),
        "{:?}",
        fd_links(pid)
    );
    let kept = fd_links(pid).len();

    let mut s = client(&d);
    s.write_all(b"GET /leave HTTP/1.1\r\nHost: h\r\n\r\n")
        .unwrap();
    let mut some = vec![0u8; 1 << 20];
    s.read_exact(&mut some).unwrap();
    drop(s); // with bytes unread: a reset
    assert!(
        d.wait_for_access_log("\"GET /leave HTTP/1.1\" 499", WAIT),
        "{}",
        d.access_log()
    );

    // The worker serves others, and holds what it held before.
    whole(&d);
    assert!(
        wait_until(WAIT, || fd_links(pid).len() == kept),
        "descriptors left behind: {:?}",
        fd_links(pid)
    );
    assert_eq!(d.workers(), vec![pid], "the same worker");
}

#[test]
fn an_unbuffered_upload_is_spliced_whole_and_the_request_after_it_is_answered() {
    const UP: usize = 8 << 20;
    let up = upstream(|r| match r.path() {
        "/up" => Reply::ok(b"stored"),
        _ => Reply::ok(b"next"),
    });
    let d = daemon(
        up.addr(),
        "",
        ", request_buffering: false, buffering: false",
    );
    let pid = worker(&d);
    let before = pipes(pid);
    let mut request =
        format!("PUT /up HTTP/1.1\r\nHost: h\r\nContent-Length: {UP}\r\n\r\n").into_bytes();
    request.extend((0..UP as u64).map(pattern_byte));
    // The next request right behind the body: it must not be taken as body bytes.
    request.extend_from_slice(b"GET /next HTTP/1.1\r\nHost: h\r\n\r\n");
    let mut s = client(&d);
    let mut writer = s.try_clone().unwrap();
    let sender = std::thread::spawn(move || writer.write_all(&request).unwrap());
    let r = read_response(&mut s, false).expect("the response");
    assert_eq!((r.status, r.body_str().as_str()), (200, "stored"));
    let next = read_response(&mut s, false).expect("the next response");
    assert_eq!((next.status, next.body_str().as_str()), (200, "next"));
    sender.join().unwrap();
    let got = up.received();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].body_len, UP as u64);
    assert_eq!(
        got[0].body_hash,
        pattern_hash(UP as u64),
        "every byte, in order"
    );
    assert_eq!(got[1].path(), "/next");
    assert!(
        wait_until(WAIT, || pipes(pid) == before + 2),
        "the body went through a pipe: {:?}",
        fd_links(pid)
    );
    d.assert_log_clean();
}

#[test]
fn a_client_leaving_mid_spliced_upload_leaves_no_descriptor_behind() {
    const UP: usize = 8 << 20;
    let up = upstream(|_| Reply::ok(b"stored"));
    let d = daemon(
        up.addr(),
        "keepalive: 0",
        ", request_buffering: false, buffering: false",
    );
    let pid = worker(&d);
    let put = |d: &TestDaemon, len: usize, whole: bool| {
        let mut s = client(d);
        let head = format!("PUT /up HTTP/1.1\r\nHost: h\r\nContent-Length: {UP}\r\n\r\n");
        s.write_all(head.as_bytes()).unwrap();
        let body: Vec<u8> = (0..len as u64).map(pattern_byte).collect();
        s.write_all(&body).unwrap();
        if whole {
            let r = read_response(&mut s, false).expect("the response");
            assert_eq!((r.status, r.body_str().as_str()), (200, "stored"));
        }
    };
    let before = fd_links(pid).len();
    put(&d, UP, true);
    assert!(
        wait_until(WAIT, || fd_links(pid).len() == before + 2),
        "the pipe is kept, nothing else: {:?}",
        fd_links(pid)
    );
    let kept = fd_links(pid).len();
    put(&d, 1 << 20, false); // then gone, 7 MiB short
    assert!(
        d.wait_for_access_log("\"PUT /up HTTP/1.1\" 499", WAIT),
        "{}",
        d.access_log()
    );
    put(&d, UP, true);
    assert!(
        wait_until(WAIT, || fd_links(pid).len() == kept),
        "descriptors left behind: {:?}",
        fd_links(pid)
    );
    let got = up.received();
    assert_eq!(got.len(), 2, "the cut upload never counted as a request");
    assert_eq!(got[1].body_hash, pattern_hash(UP as u64));
}

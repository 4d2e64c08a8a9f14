//! `min_body_rate` and `min_send_rate` on proxied exchanges, end to end: a client
//! that sends its body, or reads its response, far below the server's minimum rate
//! is let go (a body with 408), whether the exchange buffers or streams, and holds
//! nothing of the upstream's meanwhile (no connection while its body is buffered, no
//! place under the adaptive limit); a client that keeps up, or that only waits for a
//! slow upstream, is never judged.
//!
//! Nothing here asserts timing: the slow clients are far below the rate, the rates
//! are judged per `min_rate_grace` (1 s) while every idle timeout is 120 s, and the
//! tests wait (with generous bounds) for what forkd must do.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use support::gate::Gate;
use support::scripted::{Ended, Script, ScriptedUpstream};
use support::serial::SerialUpstream;
use support::upstream::TestUpstream;
use support::*;

/// Minimum rates judged every second; idle timeouts that never fire in a test.
const RATES: &str = r#"max_body_bytes: "64M", body_timeout: "120s", send_timeout: "120s",
    min_body_rate: "1KiB/s", min_send_rate: "1KiB/s", min_rate_grace: "1s","#;

fn daemon(upstream: std::net::SocketAddr, route: &str) -> TestDaemon {
    TestDaemon::builder()
        .workers(1)
        .top(&format!(
            "upstreams: {{ \"app\": (servers: [\"{upstream}\"], keepalive: 0, read_timeout: \"120s\", send_timeout: \"120s\") }},"
        ))
        .server(RATES)
        .routes(&format!(
            r#"(prefix: "/healthz", handler: Liveness),
            (prefix: "/", handler: Proxy(upstream: "app"{route})),"#
        ))
        .start()
}

/// Sends one body byte every 200 ms (5 B/s, a fifth of a percent of the minimum)
/// until stopped or the connection fails; returns how many it sent.
struct Dripper {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<u64>,
}

impl Dripper {
    fn start(s: &TcpStream) -> Dripper {
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, mut w) = (stop.clone(), s.try_clone().unwrap());
        let thread = std::thread::spawn(move || {
            let mut sent = 0;
            while !flag.load(SeqCst) && w.write_all(b"x").is_ok() {
                sent += 1;
                std::thread::sleep(Duration::from_millis(200));
            }
            sent
        });
        Dripper { stop, thread }
    }

    fn stop(self) -> u64 {
        self.stop.store(true, SeqCst);
        self.thread.join().unwrap()
    }
}

/// A POST of `len` body bytes whose head is sent now, the body dripped.
fn slow_upload(d: &TestDaemon, len: usize) -> (TcpStream, Dripper) {
    let mut s = d.connect();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "POST /upload HTTP/1.1\r\nHost: h\r\nContent-Length: {len}\r\n\r\n"
    )
    .unwrap();
    let dripper = Dripper::start(&s);
    (s, dripper)
}

fn assert_logged_slow(d: &TestDaemon, what: &str) {
    let line = format!("{what} below the minimum rate");
    assert!(
        wait_until(Duration::from_secs(30), || d.error_log().contains(&line)),
        "no {line:?} in the error log:\n{}",
        d.error_log()
    );
}

fn assert_slow_clients(d: &TestDaemon, n: u64) {
    assert!(
        wait_until(Duration::from_secs(20), || total(d, "slow_clients_closed")
            >= n),
        "slow_clients_closed is {}, not {n}",
        total(d, "slow_clients_closed")
    );
    assert_eq!(total(d, "slow_clients_closed"), n);
}

#[test]
fn a_slow_buffered_upload_gets_408_and_never_reaches_the_upstream() {
    let up = SerialUpstream::start();
    let d = daemon(up.addr(), "");
    let (mut s, dripper) = slow_upload(&d, 100_000);
    // Never 120 s apart, so body_timeout alone would wait for ever.
    let r = read_response(&mut s, false);
    let sent = dripper.stop();
    let r = r.unwrap_or_else(|| panic!("closed without an answer after {sent} body bytes"));
    assert_eq!(r.status, 408, "{}", r.head);
    assert!(r.header("Connection") == Some("close"), "{}", r.head);
    assert_logged_slow(&d, "sent its request body");
    assert_slow_clients(&d, 1);
    assert!(
        d.wait_for_access_log("\"POST /upload HTTP/1.1\" 408", Duration::from_secs(20)),
        "the 408 is logged:\n{}",
        d.access_log()
    );
    // The application never saw it: the next request is its first connection.
    let r = get_close(d.port, "/tiny").expect("served");
    assert_eq!((r.status, r.body.as_slice()), (200, &b"ok"[..]));
    assert_eq!(up.connections(), 1, "{:?}", up.heads());
    assert!(
        up.heads().iter().all(|h| h.starts_with("GET")),
        "{:?}",
        up.heads()
    );
}

#[test]
fn a_slow_streamed_upload_gets_408_and_its_upstream_connection_is_closed() {
    // The upstream reads the head and whatever body comes, until forkd closes.
    let up = ScriptedUpstream::start(vec![Script::new().read_head().await_close()]);
    let d = daemon(up.addr(), ", request_buffering: false");
    let (mut s, dripper) = slow_upload(&d, 100_000);
    let r = read_response(&mut s, false);
    let sent = dripper.stop();
    let r = r.unwrap_or_else(|| panic!("closed without an answer after {sent} body bytes"));
    assert_eq!(r.status, 408, "{}", r.head);
    assert_eq!(
        up.wait_ended(0, Duration::from_secs(30)),
        Some(Ended::Finished),
        "forkd closed the upstream connection of the exchange it ended"
    );
    let received = up.received(0);
    assert!(received.starts_with(b"POST /upload HTTP/1.1\r\n"));
    assert_logged_slow(&d, "sent its request body");
    assert_slow_clients(&d, 1);
}

/// A GET of `/big/{len}` whose response is read by a thread, `per_read` bytes at a
/// time with `pause` after each, until stopped or the connection ends; returns the
/// bytes it read.
fn reader(d: &TestDaemon, len: u64, per_read: usize, pause: Duration) -> Dripper {
    let mut s = d.connect();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "GET /big/{len} HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let got = Arc::new(AtomicU64::new(0));
    let flag = stop.clone();
    let thread = std::thread::spawn(move || {
        let mut buf = vec![0u8; per_read];
        while !flag.load(SeqCst) {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    got.fetch_add(n as u64, SeqCst);
                    std::thread::sleep(pause);
                }
            }
        }
        got.load(SeqCst)
    });
    Dripper { stop, thread }
}

#[test]
fn a_slow_reader_of_a_proxied_response_is_closed_and_a_good_one_is_not() {
    // Far more than the socket buffers between forkd and a client can hold.
    const BIG: u64 = 32 << 20;
    let up = SerialUpstream::start();
    for route in ["", ", buffering: false"] {
        let d = daemon(up.addr(), route);
        // One byte at a time, about 200 bytes a second.
        let slow = reader(&d, BIG, 1, Duration::from_millis(5));
        assert_logged_slow(&d, "read its response");
        let got = slow.stop();
        assert!(got < BIG, "{route}: the whole response arrived");
        // A client that reads at its own pace is served whole.
        let mut s = d.connect();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        write!(
            s,
            "GET /big/{BIG} HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let r = read_response(&mut s, false).expect("a response");
        assert_eq!(r.status, 200, "{route}: {}", r.head);
        assert_eq!(r.body.len() as u64, BIG, "{route}");
        assert_slow_clients(&d, 1);
        // Both logged as what they were: a 200, the cut one with the bytes it got.
        let request = format!("\"GET /big/{BIG} HTTP/1.1\" 200 ");
        let bytes = |log: String| -> Vec<u64> {
            let mut sent: Vec<u64> = log
                .lines()
                .filter_map(|l| l.split_once(&request))
                .filter_map(|(_, rest)| rest.split(' ').next()?.parse().ok())
                .collect();
            sent.sort();
            sent
        };
        assert!(
            wait_until(Duration::from_secs(20), || bytes(d.access_log()).len() == 2),
            "{route}: both responses are logged:\n{}",
            d.access_log()
        );
        let sent = bytes(d.access_log());
        assert!(sent[0] < BIG && sent[1] == BIG, "{route}: {sent:?}");
    }
}

#[test]
fn a_client_waiting_for_a_slow_upstream_is_not_judged() {
    // The upstream thinks for several rate periods before it answers, after the
    // whole body arrived.
    let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\ndone";
    let up = ScriptedUpstream::start(vec![Script::new()
        .read_head()
        .read_bytes(5000)
        .pause(Duration::from_secs(4))
        .write(answer)
        .close()]);
    let d = daemon(up.addr(), "");
    let mut s = d.connect();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(b"POST /think HTTP/1.1\r\nHost: h\r\nContent-Length: 5000\r\n\r\n")
        .unwrap();
    s.write_all(&noise(5000, 7)).unwrap();
    let r = read_response(&mut s, false).expect("a response");
    assert_eq!(
        (r.status, r.body.as_slice()),
        (200, &b"done"[..]),
        "{}",
        r.head
    );
    assert_eq!(total(&d, "slow_clients_closed"), 0);
}

#[test]
fn a_slow_uploader_holds_no_place_under_the_adaptive_limit() {
    // A limit fixed at 2: a Normal request may have 1 in flight.
    let gate = Gate::closed();
    let up: TestUpstream = gate.upstream();
    let d = TestDaemon::builder()
        .workers(1)
        .top(&format!(
            "upstreams: {{ \"app\": (servers: [\"{}\"], keepalive: 0, overload: Some((mode: Enforce, sample_every: \"50ms\", min_limit: 2, max_limit: 2))) }},",
            up.addr()
        ))
        .server(r#"min_body_rate: 0,"#)
        .routes(
            r#"(prefix: "/healthz", handler: Liveness),
            (prefix: "/", handler: Proxy(upstream: "app")),"#,
        )
        .start();
    // The uploader's head is read (forkd answers `100 Continue` once it is) and part
    // of its body; the rest comes later.
    let mut upload = d.connect();
    upload
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let body = noise(100_000, 5);
    upload
        .write_all(b"POST /upload HTTP/1.1\r\nHost: h\r\nContent-Length: 100000\r\nExpect: 100-continue\r\n\r\n")
        .unwrap();
    let r = read_response(&mut upload, false).expect("an interim response");
    assert_eq!(r.status, 100, "{}", r.head);
    upload.write_all(&body[..10_000]).unwrap();
    // A request admitted beside it: the upload is not in flight.
    let mut held = Conn::connect(d.port).unwrap();
    held.send(b"GET /first HTTP/1.1\r\nHost: h\r\n\r\n")
        .unwrap();
    gate.wait_arrived(1);
    // The limit still holds: a second Normal request is shed.
    let mut shed = Conn::connect(d.port).unwrap();
    let r = shed
        .exchange(b"GET /second HTTP/1.1\r\nHost: h\r\n\r\n")
        .unwrap();
    assert_eq!(r.status, 503, "{}", r.head);
    gate.set(true);
    let r = held.response().unwrap();
    assert_eq!((r.status, r.body_str().as_str()), (200, "ok /first"));
    // Once its body is in, the upload goes upstream (and is admitted then).
    upload.write_all(&body[10_000..]).unwrap();
    let r = read_response(&mut upload, false).expect("a response");
    assert_eq!((r.status, r.body.as_slice()), (200, &b"ok /upload"[..]));
    assert_eq!(
        gate.arrived(),
        2,
        "the shed request never reached the upstream"
    );
}

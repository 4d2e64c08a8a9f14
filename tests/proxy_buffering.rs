//! Request and response buffering, end to end, against an application server that
//! serves one connection at a time (`support::serial`, like a gunicorn sync worker):
//! a slow client must cost it nothing. Responses are checked byte for byte.
//!
//! Nothing here asserts timing: a client "stalls" by not reading or not sending,
//! and the test waits (with a generous bound) for what the upstream must do anyway.

mod support;

use nix::sys::signal::Signal;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;
use support::serial::SerialUpstream;
use support::upstream::{pattern_byte, pattern_hash, upstream, Reply, TestUpstream};
use support::*;

/// Far more than the socket buffers between the upstream and a client that reads
/// nothing can hold.
const BIG: u64 = 24 << 20;

fn daemon(up: &SerialUpstream, top: &str, route: &str) -> TestDaemon {
    builder(up, top, route).start()
}

fn builder(up: &SerialUpstream, top: &str, route: &str) -> Builder {
    // `keepalive: 0`: one request per connection, as the serial upstream closes.
    TestDaemon::builder()
        .workers(1)
        .top(&format!(
            "upstreams: {{ \"app\": (servers: [\"{}\"], keepalive: 0, read_timeout: \"120s\", send_timeout: \"120s\") }}, {top}",
            up.addr()
        ))
        .server("max_body_bytes: \"64M\", send_timeout: \"120s\", body_timeout: \"120s\",")
        .routes(&format!(
            r#"(prefix: "/healthz", handler: Liveness),
            (prefix: "/", handler: Proxy(upstream: "app"{route})),"#
        ))
}

/// A GET of `/tiny` on a new connection, bounded: `None` if no answer came.
fn tiny(d: &TestDaemon) -> Option<Response> {
    let mut s = d.connect();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(b"GET /tiny HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    if raw.is_empty() {
        return None;
    }
    parse_head(&raw[..raw.windows(4).position(|w| w == b"\r\n\r\n")? + 4])
        .ok()
        .map(|mut r| {
            r.body = raw[raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4..].to_vec();
            r
        })
}

/// Starts a GET of `path` and reads nothing yet.
fn start_get(d: &TestDaemon, path: &str) -> TcpStream {
    let mut s = d.connect();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    s
}

/// Reads the rest of a response to `/big/N` or `/held/N` and checks it byte for
/// byte; returns its head.
fn finish_pattern(s: &mut TcpStream, len: u64) -> String {
    check_pattern(&read_to_close(s), len)
}

/// Checks a whole raw response of `len` body bytes of [`pattern_byte`]s; returns its
/// head.
fn check_pattern(raw: &[u8], len: u64) -> String {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a head")
        + 4;
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let body = &raw[end..];
    assert_eq!(body.len() as u64, len, "{head}");
    let hash = body.iter().fold(support::upstream::FNV_START, |h, &b| {
        support::upstream::fnv(h, &[b])
    });
    if hash != pattern_hash(len) {
        let at = (0..len)
            .find(|&i| body[i as usize] != pattern_byte(i))
            .unwrap_or(0);
        panic!("the body differs from byte {at}");
    }
    head
}

/// GETs `path`, a `/gated/N` or `/gated-held/N` of `len` bytes, and shows that it
/// streams: its head and first bytes reach the client while the upstream holds the
/// rest back (it sends nothing more until released), and once released the upstream
/// is held back by the client, which reads nothing more, before it has written the
/// whole response (a buffered response would be read whole into a temporary file).
/// Then the client reads it all, byte for byte. Returns the head.
fn assert_streams(d: &TestDaemon, up: &SerialUpstream, path: &str, len: u64) -> String {
    let mut s = start_get(d, path);
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    while raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .is_none_or(|at| raw.len() <= at + 4)
    {
        let n = s.read(&mut buf).unwrap_or_else(|e| {
            panic!(
                "the first bytes did not arrive ({e}): {:?}\n{}",
                String::from_utf8_lossy(&raw),
                d.error_log()
            )
        });
        assert!(n > 0, "closed early: {:?}", String::from_utf8_lossy(&raw));
        raw.extend_from_slice(&buf[..n]);
    }
    assert_eq!(
        up.responses(),
        0,
        "the first bytes came while the upstream held the rest"
    );
    up.release(1);
    let settled = wait_until(Duration::from_secs(60), || {
        up.responses() >= 1 || up.stalled_at().is_some()
    });
    assert!(
        settled && up.responses() == 0,
        "the upstream wrote the whole response ({} done, stalled at {:?}) while the client \
         read nothing past the first {} bytes: it was buffered, not streamed",
        up.responses(),
        up.stalled_at(),
        raw.len()
    );
    raw.extend_from_slice(&read_to_close(&mut s));
    let head = check_pattern(&raw, len);
    assert_eq!(up.responses(), 1);
    assert_eq!(total(d, "temp_file_bytes"), 0, "nothing was spooled");
    head
}

#[test]
fn a_client_that_reads_slowly_does_not_hold_the_application() {
    let up = SerialUpstream::start();
    let d = daemon(&up, "", "");
    let mut slow = start_get(&d, &format!("/big/{BIG}"));
    // forkd reads the whole response while the client reads nothing: the upstream
    // is done with it and serves the next client.
    assert!(
        wait_until(Duration::from_secs(60), || up.responses() >= 1),
        "the upstream is still writing the response the client does not read"
    );
    let r = tiny(&d).expect("the next client is answered while the slow one reads nothing");
    assert_eq!((r.status, r.body.as_slice()), (200, &b"ok"[..]));
    let head = finish_pattern(&mut slow, BIG);
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(
        head.contains(&format!("Content-Length: {BIG}\r\n")),
        "{head}"
    );
    assert!(total(&d, "proxy_bodies_on_disk") >= 1);
    assert!(total(&d, "temp_file_bytes") >= BIG / 2);
    // Counted once a second at the latest.
    assert!(
        wait_until(Duration::from_secs(10), || total(&d, "temp_files_opened")
            == total(&d, "temp_files_closed")),
        "every temporary file was closed"
    );
}

#[test]
fn a_client_that_uploads_slowly_does_not_hold_the_application() {
    const LEN: usize = 2 << 20;
    let up = SerialUpstream::start();
    let d = daemon(&up, "", "");
    let body = noise(LEN, 3);
    let mut slow = d.connect();
    slow.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    write!(
        slow,
        "POST /upload HTTP/1.1\r\nHost: h\r\nContent-Length: {LEN}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    slow.write_all(&body[..LEN / 2]).unwrap();
    // Half the body is in: no server was chosen for it yet, so the next client is
    // served at once.
    let r = tiny(&d).expect("the next client is answered while the upload is under way");
    assert_eq!((r.status, r.body.as_slice()), (200, &b"ok"[..]));
    assert_eq!(
        up.connections(),
        1,
        "only the other client reached the upstream"
    );
    slow.write_all(&body[LEN / 2..]).unwrap();
    let r = read_response(&mut slow, false).expect("a response");
    assert_eq!(r.status, 200, "{}", r.head);
    let hash = support::upstream::fnv(support::upstream::FNV_START, &body);
    assert_eq!(String::from_utf8_lossy(&r.body), format!("{LEN} {hash:x}"));
    let heads = up.heads();
    assert!(
        heads[1].contains(&format!("Content-Length: {LEN}\r\n")),
        "{}",
        heads[1]
    );
}

#[test]
fn an_upload_the_client_gives_up_on_never_reaches_the_application() {
    let up = SerialUpstream::start();
    let d = daemon(&up, "", "");
    let mut s = d.connect();
    s.write_all(b"POST /upload HTTP/1.1\r\nHost: h\r\nContent-Length: 100000\r\n\r\n")
        .unwrap();
    s.write_all(&noise(40_000, 1)).unwrap();
    drop(s);
    assert!(
        d.wait_for_access_log("\"POST /upload HTTP/1.1\" 499", Duration::from_secs(30)),
        "the abandoned upload is logged 499:\n{}\n{}",
        d.access_log(),
        d.error_log()
    );
    let r = tiny(&d).expect("served");
    assert_eq!(r.status, 200);
    assert_eq!(
        up.heads().iter().filter(|h| h.starts_with("POST")).count(),
        0,
        "the upstream never saw the upload"
    );
}

#[test]
fn server_sent_events_arrive_one_by_one() {
    let up = SerialUpstream::start();
    let d = daemon(&up, "", "");
    let mut s = start_get(&d, "/events/3");
    let started = std::time::Instant::now();
    let mut got = Vec::new();
    for i in 0..3 {
        up.release(1);
        let want = format!("data: event {i}\n\n");
        let mut byte = [0u8; 1];
        while !String::from_utf8_lossy(&got).ends_with(&want) {
            let n = s.read(&mut byte).unwrap_or_else(|e| {
                panic!(
                    "event {i} did not arrive ({e}) after {:?}: {:?}\n{}",
                    started.elapsed(),
                    String::from_utf8_lossy(&got),
                    d.error_log()
                )
            });
            assert!(
                n > 0,
                "closed early: {:?}\n{}",
                String::from_utf8_lossy(&got),
                d.error_log()
            );
            got.push(byte[0]);
        }
        if i < 2 {
            assert_eq!(up.responses(), 0, "the stream is still under way");
        }
    }
    let text = String::from_utf8_lossy(&got).into_owned();
    assert!(
        text.contains("Content-Type: text/event-stream\r\n"),
        "{text}"
    );
}

#[test]
fn x_accel_buffering_no_streams_and_is_not_forwarded() {
    let up = SerialUpstream::start();
    let d = daemon(&up, "", "");
    let head = assert_streams(&d, &up, &format!("/gated-held/{BIG}"), BIG);
    assert!(
        !head.to_ascii_lowercase().contains("x-accel-buffering"),
        "{head}"
    );
}

#[test]
fn a_route_without_buffering_streams_the_response() {
    let up = SerialUpstream::start();
    let d = daemon(&up, "", ", buffering: false");
    assert_streams(&d, &up, &format!("/gated/{BIG}"), BIG);
}

/// GETs a `/gated/N` response of [`BIG`] bytes while the client reads nothing, on a
/// daemon whose temporary files take at most `limit` bytes of it: the spool fills to
/// the bound, then the rest streams, so the upstream is held back by the client
/// before it has written the whole response (it notes when its socket first had no
/// room). Then the client reads it all, byte for byte; the fall-back is counted and
/// no more than `limit` bytes went to temporary files.
fn assert_falls_back_to_streaming(d: &TestDaemon, up: &SerialUpstream, limit: u64) {
    let mut s = start_get(d, &format!("/gated/{BIG}"));
    up.release(1);
    let settled = wait_until(Duration::from_secs(60), || {
        up.responses() >= 1 || up.stalled_at().is_some()
    });
    assert!(
        settled && up.responses() == 0,
        "the upstream wrote the whole response ({} done, stalled at {:?}) to a client that \
         reads nothing: it was buffered past the bound",
        up.responses(),
        up.stalled_at()
    );
    finish_pattern(&mut s, BIG);
    assert!(
        wait_until(SETTLE, || total(d, "proxy_buffering_fell_back") >= 1),
        "the fall-back is counted"
    );
    let spooled = total(d, "temp_file_bytes");
    assert!(
        spooled <= limit,
        "{spooled} bytes went to temporary files, past the bound of {limit}"
    );
}

#[test]
fn past_temp_max_bytes_the_response_streams_byte_exact() {
    let up = SerialUpstream::start();
    let d = daemon(&up, "temp_max_bytes: \"16KiB\",", "");
    assert_falls_back_to_streaming(&d, &up, 16 * 1024);
}

#[test]
fn past_max_temp_file_size_the_response_streams_byte_exact() {
    let up = SerialUpstream::start();
    let d = daemon(&up, "max_temp_file_size: \"1MiB\",", "");
    assert_falls_back_to_streaming(&d, &up, 1 << 20);
    // The file took bytes up to its bound: the fall-back is the file's, not a
    // spool kept in memory.
    assert!(total(&d, "temp_file_bytes") > 0);
}

#[test]
fn temporary_files_have_no_name_and_a_killed_worker_leaves_none() {
    let up = SerialUpstream::start();
    let d = builder(&up, "temp_dir: \"spool\",", "")
        .expect_alerts()
        .start();
    let dir = d.path("spool");
    let slow = start_get(&d, &format!("/big/{BIG}"));
    assert!(
        wait_until(Duration::from_secs(60), || up.responses() >= 1),
        "the response was read whole into the spool"
    );
    let worker = d.workers()[0];
    let spool_fds: Vec<String> = fd_links(worker)
        .into_iter()
        .filter(|l| l.starts_with(&dir.display().to_string()))
        .collect();
    assert!(
        !spool_fds.is_empty() && spool_fds.iter().all(|l| l.ends_with("(deleted)")),
        "the worker holds a temporary file without a name in {}: {spool_fds:?}",
        dir.display()
    );
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "no name on disk"
    );
    send_signal(worker, Signal::SIGKILL);
    assert!(d.wait_replaced(&[worker], 1, Duration::from_secs(30)));
    drop(slow.shutdown(std::net::Shutdown::Both));
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    let r = tiny(&d).expect("the replacement serves");
    assert_eq!(r.status, 200);
}

#[test]
fn temp_dir_that_cannot_be_made_is_an_error_in_dash_t() {
    let up = SerialUpstream::start();
    let d = builder(&up, "temp_dir: \"www/index.html/sub\",", "").prepare();
    let (code, _out, err) = run_forkd(&d.config, &["-t"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("temp_dir") && err.contains("is not a folder"),
        "{err}"
    );
}

/// The buffering counters of `forkd stats --json` for one upstream server's row.
fn buffering_of(d: &TestDaemon, upstream: &str, server: &str) -> [u64; 5] {
    let row = stats::upstream_row(&d.config, upstream, server);
    [
        "bodies_in_memory",
        "bodies_on_disk",
        "buffering_fell_back",
        "held_us",
        "client_transfer_us",
    ]
    .map(|k| {
        row[k]
            .as_u64()
            .unwrap_or_else(|| panic!("no {k} in {row:#}"))
    })
}

/// The value of the Prometheus sample `family{upstream,server[,kind]}` in `text`.
fn sample(text: &str, family: &str, upstream: &str, server: &str, kind: Option<&str>) -> f64 {
    let scrape = scrape(text);
    let s = scrape
        .samples
        .iter()
        .find(|s| {
            s.metric == family
                && s.labels.get("upstream") == Some(upstream)
                && s.labels.get("server") == Some(server)
                && s.labels.get("kind") == kind
        })
        .unwrap_or_else(|| panic!("no {family} for {upstream} {server} {kind:?}:\n{text}"));
    match s.value {
        prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Untyped(v) => v,
        ref other => panic!("{family}: {other:?}"),
    }
}

/// Buffering is counted in the row of the server whose exchange it was (`forkd stats
/// --json` and `/metrics`): an upload read whole in memory and a slow reader's
/// response spooled to disk on `app`, nothing on `other`, whose client kept up.
#[test]
fn buffering_is_counted_per_upstream_server() {
    let app = SerialUpstream::start();
    let other = SerialUpstream::start();
    let (app_label, other_label) = (app.addr().to_string(), other.addr().to_string());
    let d = TestDaemon::builder()
        .workers(1)
        .top(&format!(
            "upstreams: {{ \
               \"app\": (servers: [\"{app_label}\"], keepalive: 0, read_timeout: \"120s\", send_timeout: \"120s\"), \
               \"other\": (servers: [\"{other_label}\"], keepalive: 0) }},"
        ))
        .server("max_body_bytes: \"64M\", send_timeout: \"120s\", body_timeout: \"120s\",")
        .routes(
            r#"(prefix: "/healthz", handler: Liveness),
            (prefix: "/metrics", handler: Metrics),
            (prefix: "/tiny", handler: Proxy(upstream: "other")),
            (prefix: "/", handler: Proxy(upstream: "app")),"#,
        )
        .start();
    // A request body read whole before it went upstream: in memory.
    let mut s = d.connect();
    s.write_all(
        b"POST /upload HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
    )
    .unwrap();
    let r = read_response(&mut s, false).expect("a response");
    assert_eq!(r.status, 200, "{}", r.head);
    // A response the client does not read while the upstream sends it: on disk.
    let before = app.responses();
    let mut slow = start_get(&d, &format!("/big/{BIG}"));
    assert!(
        wait_until(Duration::from_secs(60), || app.responses() > before),
        "the upstream is still writing the response the client does not read"
    );
    finish_pattern(&mut slow, BIG);
    // A response a fast client takes as it comes, from the other server: not buffered.
    let r = tiny(&d).expect("served");
    assert_eq!(r.status, 200);

    let [memory, disk, fell_back, held, transfer] = buffering_of(&d, "app", &app_label);
    assert_eq!((memory, disk, fell_back), (1, 1, 0), "app's bodies");
    assert!(held > 0, "the upstream's time is counted");
    assert!(
        transfer > 0,
        "the slow client's time after the upstream was done is counted"
    );
    let [memory, disk, fell_back, _, _] = buffering_of(&d, "other", &other_label);
    assert_eq!(
        (memory, disk, fell_back),
        (0, 0, 0),
        "nothing of other's was buffered"
    );

    let metrics = String::from_utf8(d.get("/metrics").body).unwrap();
    let family = "forkd_upstream_buffered_bodies_total";
    assert_eq!(
        sample(&metrics, family, "app", &app_label, Some("disk")),
        1.0
    );
    assert_eq!(
        sample(&metrics, family, "app", &app_label, Some("memory")),
        1.0
    );
    assert_eq!(
        sample(&metrics, family, "other", &other_label, Some("disk")),
        0.0
    );
    for family in [
        "forkd_upstream_buffering_fell_back_total",
        "forkd_upstream_held_microseconds_total",
        "forkd_upstream_client_transfer_microseconds_total",
    ] {
        sample(&metrics, family, "app", &app_label, None);
    }
    assert!(
        sample(
            &metrics,
            "forkd_upstream_client_transfer_microseconds_total",
            "app",
            &app_label,
            None
        ) > 0.0
    );
}

/// A daemon proxying to `up` (a keep-alive [`TestUpstream`]) with a pool of idle
/// upstream connections, and the route keys of the other tests' daemons.
fn pooled_daemon(up: &TestUpstream, server: &str) -> TestDaemon {
    TestDaemon::builder()
        .workers(1)
        .top(&format!(
            "upstreams: {{ \"app\": (servers: [\"{}\"], keepalive: 4, read_timeout: \"120s\", send_timeout: \"120s\") }},",
            up.addr()
        ))
        .server(&format!(
            "max_body_bytes: \"64M\", send_timeout: \"120s\", body_timeout: \"120s\", {server}"
        ))
        .routes(
            r#"(prefix: "/healthz", handler: Liveness),
            (prefix: "/", handler: Proxy(upstream: "app")),"#,
        )
        .start()
}

/// `/tiny` is `ok`; anything else [`BIG`] bytes of [`pattern_byte`]s.
fn big_or_tiny() -> TestUpstream {
    upstream(|r| match r.path() {
        "/tiny" => Reply::ok(b"ok"),
        _ => Reply::Large {
            len: BIG,
            chunked: false,
        },
    })
}

/// The upstream server's requests in flight (`forkd stats`), every worker together.
fn in_flight(d: &TestDaemon, up: &TestUpstream) -> u64 {
    let row = stats::upstream_row(&d.config, "app", &up.addr().to_string());
    row["in_flight"]
        .as_u64()
        .unwrap_or_else(|| panic!("no in_flight in {row:#}"))
}

/// With response buffering, a client that reads nothing holds nothing upstream: once
/// forkd has read the response whole, the server's in-flight count is 0 and the same
/// upstream connection, back in the pool, serves the next request, while the slow
/// client has not read a byte of the body (far more than the sockets between hold).
/// Then it reads the whole response, byte for byte.
#[test]
fn a_slow_reader_of_a_buffered_response_gives_its_upstream_connection_back_at_once() {
    let up = big_or_tiny();
    let d = pooled_daemon(&up, "");
    let mut slow = start_get(&d, &format!("/big/{BIG}"));
    assert!(
        wait_until(SETTLE, || up.received().len() == 1),
        "the request reached the upstream"
    );
    assert!(
        wait_until(Duration::from_secs(60), || in_flight(&d, &up) == 0),
        "the response was read whole and the server has nothing in flight: {:#}",
        stats::upstream_row(&d.config, "app", &up.addr().to_string())
    );
    let r = tiny(&d).expect("the next client is answered while the slow one reads nothing");
    assert_eq!(
        (r.status, r.body.as_slice()),
        (200, &b"ok"[..]),
        "{}",
        r.head
    );
    let seen = up.received();
    assert_eq!(seen.len(), 2);
    assert_eq!(
        (up.connections(), seen[1].connection, seen[1].nth),
        (1, seen[0].connection, 1),
        "the next request went out on the slow client's upstream connection, its second"
    );
    finish_pattern(&mut slow, BIG);
    d.assert_log_clean();
}

/// The worker's counter `key` (the daemon runs one worker).
fn worker_counter(d: &TestDaemon, key: &str) -> u64 {
    let stats = stats_json(&d.config);
    let workers = stats["workers"].as_array().expect("workers");
    assert_eq!(workers.len(), 1, "{stats:#}");
    workers[0]["counters"][key]
        .as_u64()
        .unwrap_or_else(|| panic!("no counter {key} in {:#}", workers[0]))
}

/// A buffered exchange with a slow reader moves the worker's buffering counters and
/// splits its time in the JSON access log: a request body read whole in memory
/// counts in `proxy_bodies_in_memory`; the upstream's part of a response the client
/// did not read for a while counts in `proxy_upstream_held_us` and the client's part
/// in `proxy_client_transfer_us`, which is at least as long as the test kept the
/// client from reading after forkd had the response whole; and the log line's
/// `upstream_response_time` falls short of its `request_time` by at least as much.
#[test]
fn a_slow_readers_buffered_exchange_is_counted_and_logged_as_upstream_and_client_time() {
    let up = upstream(|r| match r.path() {
        "/upload" => Reply::Echo,
        _ => Reply::Large {
            len: BIG,
            chunked: false,
        },
    });
    let d = pooled_daemon(&up, "access_log_format: Json,");
    let r = d.request(
        "POST /upload HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
    );
    assert_eq!(r.status, 200, "{}", r.head);
    assert!(
        wait_until(SETTLE, || worker_counter(&d, "proxy_bodies_in_memory") == 1),
        "the upload was counted as buffered in memory: {}",
        worker_counter(&d, "proxy_bodies_in_memory")
    );
    // Counted when the exchange ends, with the others.
    let held_before = worker_counter(&d, "proxy_upstream_held_us");
    let transfer_before = worker_counter(&d, "proxy_client_transfer_us");
    let mut slow = start_get(&d, &format!("/big/{BIG}"));
    assert!(wait_until(SETTLE, || up.received().len() == 2));
    assert!(
        wait_until(Duration::from_secs(60), || in_flight(&d, &up) == 0),
        "the response was read whole"
    );
    let read_whole_by = std::time::Instant::now();
    assert_eq!(
        worker_counter(&d, "proxy_client_transfer_us"),
        transfer_before,
        "the slow reader's exchange is not over"
    );
    let unread = read_whole_by.elapsed();
    finish_pattern(&mut slow, BIG);
    let at_least = unread.as_micros() as u64;
    assert!(
        wait_until(SETTLE, || worker_counter(&d, "proxy_client_transfer_us")
            >= transfer_before + at_least),
        "proxy_client_transfer_us grew by {} µs, at least the {at_least} µs the client read \
         nothing after forkd had the response whole",
        worker_counter(&d, "proxy_client_transfer_us") - transfer_before
    );
    assert!(
        worker_counter(&d, "proxy_upstream_held_us") > held_before,
        "the upstream's part of the exchange is counted"
    );
    let mut line = None;
    assert!(
        wait_until(SETTLE, || {
            line = d
                .access_log()
                .lines()
                .find(|l| l.contains("\"/big/"))
                .map(str::to_string);
            line.is_some()
        }),
        "the slow reader's request is logged:\n{}",
        d.access_log()
    );
    let v: serde_json::Value = serde_json::from_str(line.as_deref().unwrap()).unwrap();
    let (request, upstream) = (
        v["request_time"].as_f64().expect("request_time"),
        v["upstream_response_time"]
            .as_f64()
            .expect("upstream_response_time"),
    );
    assert!(
        upstream > 0.0 && request - upstream >= at_least as f64 / 1e6,
        "upstream_response_time {upstream} s is below request_time {request} s by at least \
         the {at_least} µs the client read nothing: {v}"
    );
}

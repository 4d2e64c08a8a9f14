//! Upstreams that do what HTTP allows but few do, or what it does not allow, end to
//! end against one worker (so a pooled connection is the next request's), each
//! scripted byte for byte (`support::scripted`): a response that begins before the
//! request body is sent whole, bytes past a response without a body, a head split
//! over two reads with bytes past its body, and a trailer line that is not a field.
//! Request bodies stream (`request_buffering: false`), so a response can begin while
//! the upload is under way, except where a test needs a buffered body: one sent again
//! after the stale pooled-connection race.

mod support;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Duration;
use support::scripted::{Ended, Script, ScriptedUpstream};
use support::*;

/// How long a test waits for bytes it expects.
const WAIT: Duration = Duration::from_secs(20);

/// One worker with `/` proxied to `up` (an upstream named `app`, `keys` added).
fn proxy_daemon(up: &ScriptedUpstream, keys: &str) -> TestDaemon {
    daemon_with_route(up, keys, ", request_buffering: false")
}

/// As [`proxy_daemon`], the proxy route with `route` keys (request bodies buffered
/// unless they say otherwise).
fn daemon_with_route(up: &ScriptedUpstream, keys: &str, route: &str) -> TestDaemon {
    TestDaemon::builder()
        .workers(1)
        .top(&format!(
            "upstreams: {{ \"app\": (servers: [\"{}\"], {keys}) }},",
            up.addr()
        ))
        // The readiness probe must not take a scripted connection.
        .routes(&format!(
            r#"(prefix: "/healthz", handler: Liveness),
            (prefix: "/", handler: Proxy(upstream: "app"{route})),"#
        ))
        .start()
}

/// Reads from `s` until what came ends with `end` (Ok) or the connection closes,
/// fails or times out (Err, with what came).
fn read_through(s: &mut TcpStream, got: &mut Vec<u8>, end: &[u8]) -> Result<(), String> {
    s.set_read_timeout(Some(WAIT)).unwrap();
    let mut chunk = [0u8; 16 * 1024];
    while !got.ends_with(end) {
        match s.read(&mut chunk) {
            Ok(0) => return Err(format!("closed after {:?}", String::from_utf8_lossy(got))),
            Ok(n) => got.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("{e} after {:?}", String::from_utf8_lossy(got))),
        }
    }
    Ok(())
}

#[test]
fn a_response_that_streams_while_the_upload_is_read_gets_the_whole_upload_and_reaches_the_client_whole(
) {
    // The upstream answers the head and a first chunk at once, reads the body, then
    // ends the response: an echo, a progress report, a transcoder.
    let up = ScriptedUpstream::start(vec![Script::new()
        .read_head()
        .write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        .read_bytes(5)
        .write(b"0\r\n\r\n")
        .read_head()
        .write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nagain")
        .await_close()]);
    let d = proxy_daemon(&up, "");
    let mut s = d.connect();
    s.write_all(b"POST /upload HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\n")
        .unwrap();
    // The body goes only once the response began.
    let mut got = Vec::new();
    read_through(&mut s, &mut got, b"5\r\nfirst\r\n").unwrap();
    s.write_all(b"hello").unwrap();
    read_through(&mut s, &mut got, b"0\r\n\r\n").unwrap();
    assert_eq!(
        String::from_utf8_lossy(&got),
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n0\r\n\r\n"
    );
    let received = String::from_utf8_lossy(&up.received(0)).into_owned();
    assert!(received.ends_with("\r\n\r\nhello"), "{received:?}");
    // The request and the response were both whole: both connections go on, the
    // upstream one from its pool.
    s.write_all(b"GET /next HTTP/1.1\r\nHost: h\r\n\r\n")
        .unwrap();
    let mut next = Vec::new();
    read_through(&mut s, &mut next, b"again").unwrap();
    assert_eq!(
        String::from_utf8_lossy(&next),
        "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nagain"
    );
    assert_eq!(up.connections(), 1, "the upstream connection was pooled");
    let log = d.error_log();
    assert!(!log.contains("[error]"), "{log}");
}

#[test]
fn a_response_that_ends_before_the_upload_closes_the_client_after_it_and_is_not_pooled() {
    // The upstream answers at once and never reads the body (an early 413).
    let up = ScriptedUpstream::start(vec![
        Script::new()
            .read_head()
            .write(b"HTTP/1.1 413 Content Too Large\r\nContent-Length: 4\r\n\r\nbig!")
            .await_close(),
        Script::new()
            .read_head()
            .write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfresh")
            .await_close(),
    ]);
    let d = proxy_daemon(&up, "");
    let mut s = d.connect();
    s.write_all(b"POST /upload HTTP/1.1\r\nHost: h\r\nContent-Length: 100\r\n\r\nabc")
        .unwrap();
    let mut got = Vec::new();
    read_through(&mut s, &mut got, b"big!").unwrap();
    assert_eq!(
        String::from_utf8_lossy(&got),
        "HTTP/1.1 413 Content Too Large\r\nContent-Length: 4\r\n\r\nbig!"
    );
    // The rest of the body is still on the client connection: it closes.
    assert_eq!(read_to_close(&mut s), b"");
    // The upstream connection's framing is off: closed, not pooled.
    assert!(matches!(up.wait_ended(0, WAIT), Some(Ended::Finished)));
    let r = d.get("/after");
    assert_eq!((r.status, r.body_str().as_str()), (200, "fresh"));
}

#[test]
fn bytes_after_a_response_to_head_are_never_pooled() {
    // The head of a 100 000-byte response, and then such a body nobody asked for.
    assert_bytes_past_a_bodiless_response_are_never_pooled(
        "HEAD /h HTTP/1.1\r\nHost: h\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n",
    );
}

#[test]
fn a_head_split_over_two_reads_with_bytes_past_its_body_ends_the_exchange() {
    // The head arrives in two reads; the second brings the body and 4 bytes more.
    let up = ScriptedUpstream::start(vec![
        Script::new()
            .read_head()
            .write_split(
                &[b"HTTP/1.1 200 OK\r\nContent-", b"Length: 2\r\n\r\nokJUNK"],
                Duration::from_millis(200),
            )
            .await_close(),
        Script::new()
            .read_head()
            .write(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecond")
            .await_close(),
    ]);
    // Before the fix the exchange waited for `read_timeout`, then closed the client.
    let d = proxy_daemon(&up, "read_timeout: \"2s\",");
    let mut s = d.connect();
    s.write_all(b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n").unwrap();
    let mut got = Vec::new();
    read_through(&mut s, &mut got, b"ok").unwrap();
    assert_eq!(
        String::from_utf8_lossy(&got),
        "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    );
    s.write_all(b"GET /b HTTP/1.1\r\nHost: h\r\n\r\n").unwrap();
    let mut next = Vec::new();
    read_through(&mut s, &mut next, b"second").unwrap();
    assert_eq!(
        String::from_utf8_lossy(&next),
        "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecond"
    );
    assert!(
        matches!(up.wait_ended(0, WAIT), Some(Ended::Finished)),
        "the connection with bytes left over was closed, not pooled"
    );
    let log = d.error_log();
    assert!(!log.contains("[error]"), "{log}");
}

#[test]
fn a_trailer_line_that_is_not_a_field_never_reaches_the_client() {
    // A folded line in the trailer section: a receiver could read it as a field of
    // its own, or as part of the one before.
    let up = ScriptedUpstream::start(vec![Script::new()
        .read_head()
        .write(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n\
              0\r\nX-Sum: 1\r\n Injected: yes\r\n\r\n",
        )
        .await_close()]);
    let d = proxy_daemon(&up, "");
    let mut s = d.connect();
    s.write_all(b"GET /t HTTP/1.1\r\nHost: h\r\nTE: trailers\r\nConnection: close\r\n\r\n")
        .unwrap();
    // Read with the head: a 502 of forkd's own. Read after the head went out: the
    // response is cut after its data. Never the trailers.
    let got = String::from_utf8_lossy(&read_to_close(&mut s)).into_owned();
    let cut =
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n";
    assert!(
        got.starts_with("HTTP/1.1 502 Bad Gateway\r\n") || got == cut,
        "{got:?}"
    );
    assert!(
        !got.contains("X-Sum") && !got.contains("Injected"),
        "{got:?}"
    );
    assert!(
        d.wait_for_log("upstream app 127.0.0.1", Duration::from_secs(10)),
        "{}",
        d.error_log()
    );
    let log = d.error_log();
    assert_eq!(log.matches("[error]").count(), 1, "logged once: {log}");
    assert!(log.contains("invalid or truncated response body"), "{log}");
}

/// The stale pooled-connection race with a buffered body: the upstream answers a GET
/// and keeps the connection; the next request, a POST, goes out on that pooled
/// connection, and the upstream reads it whole and closes without a byte of response
/// (it had decided to close the idle connection). No response byte came and forkd has
/// the whole body, so it sends the POST again on a new connection, head and body
/// byte-exact, and the client gets that answer.
#[test]
fn a_buffered_post_that_meets_a_closing_pooled_connection_is_sent_again_whole() {
    const LEN: usize = 200_000; // past the spool's memory part: the file is resent too
    let body = noise(LEN, 20);
    let up = ScriptedUpstream::start(vec![
        Script::new()
            .read_head()
            .write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst")
            .read_head()
            .read_bytes(LEN)
            .close(),
        Script::new()
            .read_head()
            .read_bytes(LEN)
            .write(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nstored")
            .await_close(),
    ]);
    let d = daemon_with_route(&up, "keepalive: 4,", "");
    let r = d.get("/first");
    assert_eq!((r.status, r.body_str().as_str()), (200, "first"));
    let mut s = d.connect();
    write!(
        s,
        "POST /store HTTP/1.1\r\nHost: h\r\nContent-Length: {LEN}\r\n\r\n"
    )
    .unwrap();
    s.write_all(&body).unwrap();
    let mut got = Vec::new();
    read_through(&mut s, &mut got, b"stored").unwrap_or_else(|e| {
        panic!(
            "{e}\nconnections {}, ended {:?} {:?}\n{}",
            up.connections(),
            up.ended(0),
            up.ended(1),
            d.error_log()
        )
    });
    let got = String::from_utf8_lossy(&got);
    assert!(got.starts_with("HTTP/1.1 200 OK\r\n"), "{got}");
    assert!(got.ends_with("\r\n\r\nstored"), "{got}");
    // The race was met, not avoided: the POST went out whole on the pooled
    // connection first, then again on a second one.
    assert_eq!(up.wait_ended(0, WAIT), Some(Ended::Finished));
    assert_eq!(up.connections(), 2);
    let (first, again) = (up.received(0), up.received(1));
    let post_of = |raw: &[u8]| -> (String, Vec<u8>) {
        let at = raw
            .windows(5)
            .position(|w| w == b"POST ")
            .unwrap_or_else(|| panic!("no POST in {:?}", String::from_utf8_lossy(raw)));
        let raw = &raw[at..];
        let end = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        (
            String::from_utf8_lossy(&raw[..end]).into_owned(),
            raw[end..].to_vec(),
        )
    };
    let (head0, body0) = post_of(&first);
    let (head1, body1) = post_of(&again);
    assert!(
        first.starts_with(b"GET /first "),
        "the POST came second on connection 0"
    );
    assert!(again.starts_with(b"POST /store "), "{head1}");
    assert_eq!(head0, head1, "the same head both times");
    assert!(
        head1.contains(&format!("Content-Length: {LEN}\r\n")),
        "{head1}"
    );
    assert!(body0 == body, "the first attempt had the whole body");
    assert!(
        body1 == body,
        "the resent body is byte-exact ({} of {LEN} bytes)",
        body1.len()
    );
    assert!(!d.error_log().contains("[error]"), "{}", d.error_log());
}

/// A response without a body (`status_head`, the answer to `request`) followed by
/// bytes nobody asked for: a whole response that would be the next request's if the
/// connection were pooled (response queue poisoning), then 100 000 more, so some are
/// still in the socket when the response ends. The client gets the head alone; the
/// next request on the worker goes out on a new upstream connection and gets its own
/// answer; forkd closed the first.
fn assert_bytes_past_a_bodiless_response_are_never_pooled(request: &str, status_head: &str) {
    let mut junk = status_head.as_bytes().to_vec();
    junk.extend_from_slice(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\npoison");
    junk.extend(std::iter::repeat_n(b'x', 100_000));
    let up = ScriptedUpstream::start(vec![
        Script::new().read_head().write(&junk).await_close(),
        Script::new()
            .read_head()
            .write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfresh")
            .await_close(),
    ]);
    let d = proxy_daemon(&up, "");
    let mut s = d.connect();
    s.write_all(request.as_bytes()).unwrap();
    let mut got = Vec::new();
    read_through(&mut s, &mut got, b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&got).into_owned();
    assert_eq!(head, status_head);
    s.write_all(b"GET /next HTTP/1.1\r\nHost: h\r\n\r\n")
        .unwrap();
    let mut next = Vec::new();
    read_through(&mut s, &mut next, b"fresh").unwrap_or_else(|e| {
        panic!(
            "{e}\nafter {head:?}; upstream connections {}",
            up.connections()
        )
    });
    assert_eq!(
        String::from_utf8_lossy(&next),
        "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfresh",
        "nothing of the first response came before it"
    );
    assert_eq!(up.connections(), 2);
    assert!(
        matches!(up.wait_ended(0, WAIT), Some(Ended::Finished)),
        "forkd closed the connection with bytes left over"
    );
}

#[test]
fn bytes_after_a_204_response_are_never_pooled() {
    assert_bytes_past_a_bodiless_response_are_never_pooled(
        "DELETE /item HTTP/1.1\r\nHost: h\r\n\r\n",
        "HTTP/1.1 204 No Content\r\n\r\n",
    );
}

#[test]
fn bytes_after_a_304_response_are_never_pooled() {
    assert_bytes_past_a_bodiless_response_are_never_pooled(
        "GET /page HTTP/1.1\r\nHost: h\r\nIf-None-Match: \"v1\"\r\n\r\n",
        "HTTP/1.1 304 Not Modified\r\nETag: \"v1\"\r\n\r\n",
    );
}

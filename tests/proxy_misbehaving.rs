//! Upstreams that do what HTTP allows but few do, or what it does not allow, end to
//! end against one worker (so a pooled connection is the next request's), each
//! scripted byte for byte (`support::scripted`): a response that begins before the
//! request body is sent whole.

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
    TestDaemon::builder()
        .workers(1)
        .top(&format!(
            "upstreams: {{ \"app\": (servers: [\"{}\"], {keys}) }},",
            up.addr()
        ))
        // The readiness probe must not take a scripted connection.
        .routes(
            r#"(prefix: "/healthz", handler: Liveness),
            (prefix: "/", handler: Proxy(upstream: "app")),"#,
        )
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
    s.write_all(b"GET /next HTTP/1.1\r\nHost: h\r\n\r\n").unwrap();
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

//! Request framing an attacker controls, against the real binary: chunk metadata that
//! never ends, and HTTP/1.0 messages with a transfer coding.
//!
//! The "answered at once" tests send the start of something that would be huge and
//! then only wait: the client never sends more than a bounded prefix, so a response can
//! only come from a server that decided on that prefix. `body_timeout` is set far
//! beyond the read timeout, so the answer cannot be a timeout's either.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use support::*;

/// A body timeout no test waits for.
const SLOW_BODY: &str = r#"body_timeout: "120s","#;

fn site() -> Builder {
    TestDaemon::builder()
        .file("a.txt", b"hello\n")
        .server(SLOW_BODY)
}

fn open(d: &TestDaemon) -> TcpStream {
    let s = d.connect();
    s.set_write_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    s
}

fn send(s: &mut TcpStream, bytes: impl AsRef<[u8]>) {
    s.write_all(bytes.as_ref()).expect("sending a request");
}

/// Reads until the server closes the connection.
fn read_until_close(s: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => panic!(
                "the server did not close the connection ({e}); received:\n{}",
                String::from_utf8_lossy(&out)
            ),
        }
    }
}

/// The bytes of forkd's error response `status` (e.g. `400 Bad Request`) that closes
/// the connection, with the `Date` it was sent with.
fn closing_error(status: &str, date: &str) -> String {
    let page = format!(
        "<html><head><title>{status}</title></head><body><h1>{status}</h1><hr>forkd</body></html>\n"
    );
    format!(
        "HTTP/1.1 {status}\r\nServer: forkd\r\nDate: {date}\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
        page.len()
    )
}

/// The `Date` of a response, checked to be an IMF-fixdate in shape.
fn date_of(response: &[u8]) -> String {
    let text = String::from_utf8_lossy(response);
    let date = text
        .split("\r\n")
        .find_map(|l| l.strip_prefix("Date: "))
        .unwrap_or_else(|| panic!("no Date in\n{text}"))
        .to_string();
    assert!(
        date.len() == 29 && date.ends_with(" GMT"),
        "not an IMF-fixdate: {date:?}"
    );
    date
}

/// Sends `prefix`, then `filler` bytes of `fill` (never the end of the message), then
/// waits for the answer. Asserts it is the closing error `status`, and that the server
/// still serves the next connection.
fn assert_answered_on_prefix(
    d: &TestDaemon,
    prefix: &[u8],
    fill: &[u8],
    filler: usize,
    status: &str,
) {
    let mut s = open(d);
    send(&mut s, prefix);
    let mut sent = 0;
    while sent < filler {
        send(&mut s, fill);
        sent += fill.len();
    }
    // Nothing more is ever sent: what comes back was decided on what was.
    let got = read_until_close(&mut s);
    let expected = closing_error(status, &date_of(&got));
    assert_eq!(
        String::from_utf8_lossy(&got),
        expected,
        "the answer after {} bytes of the message",
        prefix.len() + sent
    );
    let r = d.get("/a.txt");
    assert_eq!(
        r.status, 200,
        "a good request after the bad one: {}",
        r.head
    );
    assert_eq!(r.body, b"hello\n");
}

const CHUNKED_POST: &str =
    "GET /a.txt HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n";

#[test]
fn an_endless_chunk_extension_is_answered_400_at_once() {
    // Issue 10: the server read a 64 MiB extension to its end. Send 64 KiB of one
    // (16 times the 4 KiB a line may carry) and nothing more.
    let d = site().start();
    let prefix = format!("{CHUNKED_POST}5;name=");
    assert_answered_on_prefix(
        &d,
        prefix.as_bytes(),
        &[b'v'; 4096],
        64 * 1024,
        "400 Bad Request",
    );
}

#[test]
fn an_endless_extension_on_the_last_chunk_is_answered_400_at_once() {
    let d = site().start();
    let prefix = format!("{CHUNKED_POST}5\r\nhello\r\n0;");
    assert_answered_on_prefix(
        &d,
        prefix.as_bytes(),
        &[b'v'; 4096],
        64 * 1024,
        "400 Bad Request",
    );
}

#[test]
fn endless_trailer_fields_are_answered_431_at_once() {
    // Issue 10: 64 MiB of trailer fields were read to their end. The trailer section is
    // a header section: `max_header_bytes` (4 KiB here) bounds it. Send 64 KiB of fields.
    let d = site().server(r#"max_header_bytes: "4KiB","#).start();
    let prefix = format!("{CHUNKED_POST}5\r\nhello\r\n0\r\n");
    let mut field = b"X-Pad: ".to_vec();
    field.resize(62, b'a');
    field.extend_from_slice(b"\r\n");
    assert_answered_on_prefix(
        &d,
        prefix.as_bytes(),
        &field,
        64 * 1024,
        "431 Request Header Fields Too Large",
    );
}

#[test]
fn one_endless_trailer_field_is_answered_431_at_once() {
    let d = site().server(r#"max_header_bytes: "4KiB","#).start();
    let prefix = format!("{CHUNKED_POST}5\r\nhello\r\n0\r\nX-Pad: ");
    assert_answered_on_prefix(
        &d,
        prefix.as_bytes(),
        &[b'a'; 4096],
        64 * 1024,
        "431 Request Header Fields Too Large",
    );
}

#[test]
fn chunk_metadata_within_the_limits_is_still_served() {
    // An extension of 4 KiB on a line, and trailers that fill most of `max_header_bytes`.
    let d = site().server(r#"max_header_bytes: "4KiB","#).start();
    let mut body = CHUNKED_POST.as_bytes().to_vec();
    body.extend_from_slice(b"5;");
    body.resize(body.len() + 4096 - 1, b'e');
    body.extend_from_slice(b"\r\nhello\r\n0\r\n");
    for i in 0..30 {
        body.extend_from_slice(format!("X-Trailer-{i:02}: {}\r\n", "t".repeat(100)).as_bytes());
    }
    body.extend_from_slice(b"\r\n");
    body.extend_from_slice(b"GET /a.txt HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    let mut s = open(&d);
    send(&mut s, &body);
    let first = read_response(&mut s, false).expect("a response to the chunked request");
    assert_eq!(first.status, 200, "{}", first.head);
    assert_eq!(first.body, b"hello\n");
    let second = read_response(&mut s, false).expect("a response to the pipelined request");
    assert_eq!(second.status, 200, "{}", second.head);
    assert_eq!(second.body, b"hello\n");
}

#[test]
fn http10_with_transfer_encoding_is_400_and_closes() {
    // RFC 9112 §6.1: an HTTP/1.0 message with Transfer-Encoding has faulty framing.
    // It used to be framed by the coding and answered (405 for a POST to a file).
    let d = site().start();
    for request in [
        "POST /a.txt HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        "GET /a.txt HTTP/1.0\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /a.txt HTTP/1.0\r\n\r\n",
        "GET /a.txt HTTP/1.0\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
    ] {
        let mut s = open(&d);
        send(&mut s, request);
        let got = read_until_close(&mut s);
        let expected = closing_error("400 Bad Request", &date_of(&got));
        assert_eq!(
            String::from_utf8_lossy(&got),
            expected,
            "the answer to {request:?}"
        );
    }
    let r = d.get("/a.txt");
    assert_eq!(r.status, 200, "{}", r.head);
}

#[test]
fn range_units_are_case_insensitive_and_positions_may_exceed_u64() {
    // Found by fuzzing the range parser: both were ignored (the whole file, 200).
    let d = site().file("digits.txt", b"0123456789").start();
    let get = |range: &str| {
        d.request(&format!(
            "GET /digits.txt HTTP/1.1\r\nHost: localhost\r\nRange: {range}\r\nConnection: close\r\n\r\n"
        ))
    };
    let r = get("BYTES=2-4");
    assert_eq!(
        (r.status, r.body.as_slice()),
        (206, &b"234"[..]),
        "{}",
        r.head
    );
    let r = get("bytes=7-99999999999999999999999");
    assert_eq!(
        (r.status, r.body.as_slice()),
        (206, &b"789"[..]),
        "{}",
        r.head
    );
    assert_eq!(r.header("Content-Range"), Some("bytes 7-9/10"));
    let r = get("bytes=-99999999999999999999999");
    assert_eq!(
        (r.status, r.body.as_slice()),
        (206, &b"0123456789"[..]),
        "{}",
        r.head
    );
    let r = get("bytes=99999999999999999999999-");
    assert_eq!(r.status, 416, "{}", r.head);
    assert_eq!(r.header("Content-Range"), Some("bytes */10"));
}

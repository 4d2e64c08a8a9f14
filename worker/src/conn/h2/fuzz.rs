//! Property tests ("fuzzing" on the stable toolchain, as `worker/tests/fuzz_parsers.rs`
//! does for HTTP/1.1) of what HTTP/2 adds, a fixed number of cases from a fixed seed
//! so every run tries the same inputs (`PROPTEST_CASES` / `PROPTEST_RNG_SEED` for a
//! longer or different hunt):
//!
//! - the `h2` server as forkd configures it (`session::builder`), fed the preface and
//!   any sequence of frames (random types, flags, stream ids and payloads, real HPACK
//!   blocks among them), in any split: it never panics and always comes to rest;
//! - the frame meter counts the same streams and resets however reads split;
//! - an HTTP/2 request written as an HTTP/1.1 head is one complete head our parser
//!   reads back with the same method and target, or a `Malformed` the RFC names;
//! - an HTTP/1.1 response read back as HEADERS, DATA and trailers gives the same body
//!   and trailers however its bytes arrive.

use super::meter::{Inbound, PREFACE};
use super::request::{self, Malformed};
use super::response::{Part, Reader};
use super::session::builder;
use crate::http::request as h1;
use bytes::{Bytes, BytesMut};
use forkd_shared::config::H2Settings;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use std::cell::Cell;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

fn config(cases: u32) -> Config {
    let mut config = Config::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = cases;
    }
    if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
        config.rng_seed = RngSeed::Fixed(0x0066_6f72_6b64_6832);
    }
    config.failure_persistence = None;
    config
}

const SETTINGS: H2Settings = H2Settings {
    max_concurrent_streams: 8,
    initial_window: 65_535,
    max_header_list: 4096,
    idle_timeout: Duration::from_secs(180),
    max_requests: 1000,
};

/// HPACK blocks of real requests (static-table indices and literals, RFC 7541
/// appendix C), for HEADERS frames that get past the decoder.
const BLOCKS: &[&[u8]] = &[
    // :method GET, :scheme http, :path /, :authority www.example.com
    b"\x82\x86\x84\x41\x0fwww.example.com",
    // the same, Huffman-coded authority
    b"\x82\x86\x84\x41\x8c\xf1\xe3\xc2\xe5\xf2\x3a\x6b\xa0\xab\x90\xf4\xff",
    // :method POST, :scheme https, :path /index.html, :authority a, content-length: 3
    b"\x83\x87\x85\x41\x01a\x5c\x013",
    // a dynamic-table size update to 0, then GET /
    b"\x20\x82\x86\x84\x41\x01a",
    // a literal with an oversized length prefix
    b"\x82\x86\x84\x40\x7f\xff\xff\xff\x0f",
];

#[derive(Debug, Clone)]
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

fn frame() -> impl Strategy<Value = Frame> {
    let odd = || (0u32..8).prop_map(|i| 2 * i + 1);
    let block = || prop::sample::select(BLOCKS.to_vec()).prop_map(<[u8]>::to_vec);
    let f = |kind: u8, flags: u8, stream: u32, payload: Vec<u8>| Frame {
        kind,
        flags,
        stream,
        payload,
    };
    prop_oneof![
        // HEADERS: END_HEADERS and END_STREAM, or a block CONTINUATION ends, or a
        // PRIORITY part first.
        4 => (odd(), block(), prop::sample::select(vec![0x5u8, 0x5, 0x5, 0x4, 0x25, 0x1, 0x0]))
            .prop_map(move |(s, b, flags)| {
                let payload = if flags & 0x20 != 0 {
                    [&[0, 0, 0, 0, 16][..], &b].concat()
                } else {
                    b
                };
                f(1, flags, s, payload)
            }),
        2 => (odd(), prop::collection::vec(any::<u8>(), 0..32), 0u8..2)
            .prop_map(move |(s, d, end)| f(0, end, s, d)),
        1 => (odd(), block(), prop::sample::select(vec![0x4u8, 0x0]))
            .prop_map(move |(s, b, flags)| f(9, flags, s, b)),
        1 => (odd(), 0u32..14).prop_map(move |(s, code)| f(3, 0, s, code.to_be_bytes().to_vec())),
        1 => (any::<[u8; 8]>(), 0u8..2).prop_map(move |(d, ack)| f(6, ack, 0, d.to_vec())),
        1 => (prop::sample::select(vec![0u32, 1, 3]), any::<u32>())
            .prop_map(move |(s, n)| f(8, 0, s, (n & 0x7fff_ffff).to_be_bytes().to_vec())),
        1 => prop::collection::vec((1u16..=9, prop_oneof![3 => 0u32..70_000, 1 => any::<u32>()]), 0..4).prop_map(move |pairs| {
            let mut p = Vec::new();
            for (id, value) in pairs {
                p.extend_from_slice(&id.to_be_bytes());
                p.extend_from_slice(&value.to_be_bytes());
            }
            f(4, 0, 0, p)
        }),
        1 => (odd(), any::<[u8; 5]>()).prop_map(move |(s, p)| f(2, 0, s, p.to_vec())),
        1 => (any::<u32>(), 0u32..14).prop_map(move |(last, code)| {
            f(7, 0, 0, [(last & 0x7fff_ffff).to_be_bytes(), code.to_be_bytes()].concat())
        }),
        // Anything: a type, flags, a stream and bytes, a real block mangled.
        1 => (any::<u8>(), any::<u8>(), any::<u32>(), prop::collection::vec(any::<u8>(), 0..24))
            .prop_map(move |(k, fl, s, p)| f(k, fl, s, p)),
        1 => (odd(), block(), any::<prop::sample::Index>(), any::<u8>()).prop_map(
            move |(s, mut b, at, byte)| {
                let i = at.index(b.len());
                b[i] = byte;
                f(1, 0x5, s, b)
            }
        ),
    ]
}

/// The preface, an empty SETTINGS, then `frames`. A small odd stream id (below 16)
/// is a slot, so that sequences get past the first frames: a HEADERS on one opens
/// the next stream (ids grow, as the RFC wants), any other frame on one goes to a
/// stream opened before. Other ids are sent as they are.
fn wire(frames: &[Frame]) -> Vec<u8> {
    let mut out = PREFACE.to_vec();
    out.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]); // SETTINGS, empty
    let mut opened: Vec<u32> = Vec::new();
    for f in frames {
        let stream = match f.stream {
            slot @ 1..=15 if slot % 2 == 1 => {
                if f.kind == 1 {
                    let id = opened.last().map_or(1, |last| last + 2);
                    opened.push(id);
                    id
                } else {
                    opened
                        .get(slot as usize / 2 % opened.len().max(1))
                        .copied()
                        .unwrap_or(1)
                }
            }
            other => other,
        };
        let len = f.payload.len() as u32;
        out.extend_from_slice(&len.to_be_bytes()[1..]);
        out.push(f.kind);
        out.push(f.flags);
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(&f.payload);
    }
    out
}

/// The connection's socket: the client's bytes in pieces of the given sizes, each
/// after a read that would block (so the server acts on every piece before the
/// next), then nothing more (the client waits); what the server writes is counted.
struct Wire {
    input: Vec<u8>,
    pieces: Vec<usize>,
    at: usize,
    piece: usize,
    written: usize,
    /// The next read blocks once.
    pause: bool,
    /// Every byte was read.
    drained: Rc<Cell<bool>>,
}

impl Wire {
    fn new(input: Vec<u8>, pieces: Vec<usize>) -> (Wire, Rc<Cell<bool>>) {
        let drained = Rc::new(Cell::new(false));
        let wire = Wire {
            input,
            pieces,
            at: 0,
            piece: 0,
            written: 0,
            pause: false,
            drained: Rc::clone(&drained),
        };
        (wire, drained)
    }
}

impl AsyncRead for Wire {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        if me.at == me.input.len() {
            me.drained.set(true);
            return Poll::Pending;
        }
        if std::mem::take(&mut me.pause) {
            return Poll::Pending;
        }
        let size = me
            .pieces
            .get(me.piece)
            .copied()
            .unwrap_or(usize::MAX)
            .max(1);
        me.piece += 1;
        let n = size.min(me.input.len() - me.at).min(buf.remaining());
        buf.put_slice(&me.input[me.at..me.at + n]);
        me.at += n;
        me.pause = true;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Wire {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        self.get_mut().written += b.len();
        Poll::Ready(Ok(b.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Drives the server over `wire` until it comes to rest, answering every stream it
/// accepts; the streams it accepted (a server that never rests fails).
fn serve(wire: Wire, drained: &Cell<bool>) -> usize {
    let mut cx = Context::from_waker(Waker::noop());
    let mut handshake = Box::pin(builder(&SETTINGS).handshake::<_, Bytes>(wire));
    let mut conn = loop {
        match handshake.as_mut().poll(&mut cx) {
            Poll::Ready(Ok(conn)) => break conn,
            Poll::Ready(Err(_)) => return 0,
            Poll::Pending if drained.get() => return 0,
            Poll::Pending => {}
        }
    };
    let mut accepted = 0;
    for _ in 0..100_000 {
        match conn.poll_accept(&mut cx) {
            Poll::Ready(Some(Ok((_request, mut respond)))) => {
                accepted += 1;
                if let Ok(mut body) = respond.send_response(http::Response::new(()), false) {
                    let _ = body.send_data(Bytes::from_static(b"ok"), true);
                }
            }
            Poll::Ready(Some(Err(_))) | Poll::Ready(None) => return accepted,
            // Waiting for bytes the client will not send.
            Poll::Pending if drained.get() => return accepted,
            Poll::Pending => {}
        }
    }
    panic!("the server never came to rest");
}

proptest! {
    #![proptest_config(config(300))]

    #[test]
    fn the_h2_server_survives_any_frames_in_any_split(
        frames in prop::collection::vec(frame(), 0..24),
        pieces in prop::collection::vec(1usize..64, 0..16),
    ) {
        let (wire, drained) = Wire::new(wire(&frames), pieces);
        let accepted = serve(wire, &drained);
        let opened = frames.iter().filter(|f| f.kind == 1).count();
        prop_assert!(accepted <= opened, "{} streams from {} HEADERS", accepted, opened);
    }

    #[test]
    fn the_meter_counts_the_same_however_reads_split(
        frames in prop::collection::vec(frame(), 0..40),
        pieces in prop::collection::vec(1usize..32, 1..32),
    ) {
        let input = wire(&frames);
        let mut whole = Inbound::new(1 << 20, 1 << 20);
        let verdict = whole.read(&input);
        let mut split = Inbound::new(1 << 20, 1 << 20);
        let mut rest = &input[..];
        let mut sizes = pieces.iter().cycle();
        while !rest.is_empty() {
            let n = (*sizes.next().unwrap()).min(rest.len());
            split.read(&rest[..n]);
            rest = &rest[n..];
        }
        if verdict.is_none() {
            prop_assert_eq!((whole.streams, whole.resets), (split.streams, split.resets));
        }
    }

    #[test]
    fn a_translated_request_is_one_head_the_parser_reads_back(
        method in prop::sample::select(vec!["GET", "HEAD", "POST", "PUT", "OPTIONS", "PATCH", "X-CUSTOM"]),
        path in "/[a-zA-Z0-9._~%/?=&-]{0,24}",
        authority in prop::option::of("[a-z0-9.-]{1,12}(:[0-9]{1,5})?"),
        fields in prop::collection::vec(
            (prop::sample::select(vec![
                "accept", "cookie", "content-length", "host", "te", "connection",
                "transfer-encoding", "upgrade", "x-a", "user-agent", "range",
            ]), "[ -~]{0,16}"),
            0..8,
        ),
        ended in any::<bool>(),
    ) {
        let mut b = http::Request::builder().method(method).uri(match &authority {
            Some(a) => format!("http://{a}{path}"),
            None => path.clone(),
        });
        for (name, value) in &fields {
            b = b.header(*name, value.as_str());
        }
        let Ok(req) = b.body(()) else { return Ok(()) };
        let parts = req.into_parts().0;
        let mut out = Vec::new();
        match request::head(&parts, ended, &mut out) {
            Ok(_) => {
                let names: Vec<&str> = parts.headers.keys().map(|n| n.as_str()).collect();
                for special in ["connection", "transfer-encoding", "upgrade"] {
                    prop_assert!(!names.contains(&special), "{} passed", special);
                }
                match h1::parse(&out, 1 << 20) {
                    Ok(Some(r)) => {
                        prop_assert_eq!(r.head_len, out.len(), "one head, nothing after it");
                        prop_assert_eq!(r.method_name, method);
                        prop_assert_eq!(r.target, parts.uri.path_and_query().unwrap().as_str().as_bytes());
                    }
                    Ok(None) => prop_assert!(false, "an incomplete head: {:?}", String::from_utf8_lossy(&out)),
                    // A value HTTP/1.1 refuses (a bad content-length, an empty
                    // Host) is answered 400, as over HTTP/1.1.
                    Err(_) => {}
                }
            }
            Err(Malformed::ConnectionField(name)) => {
                prop_assert!(["connection", "transfer-encoding", "upgrade", "keep-alive", "proxy-connection"].contains(&name.as_str()));
            }
            Err(Malformed::Te) => prop_assert!(fields.iter().any(|(n, v)| *n == "te" && !v.eq_ignore_ascii_case("trailers"))),
            Err(Malformed::HostDisagrees) => prop_assert!(authority.is_some() && fields.iter().any(|(n, _)| *n == "host")),
            Err(Malformed::NoPath) => {}
            Err(Malformed::LengthWithoutBody) => prop_assert!(ended && fields.iter().any(|(n, _)| *n == "content-length")),
        }
    }

    #[test]
    fn a_response_reads_the_same_however_its_bytes_arrive(
        status in prop::sample::select(vec![200u16, 201, 204, 304, 404, 500]),
        body in prop::collection::vec(any::<u8>(), 0..200),
        framing in 0u8..3,
        chunk in 1usize..50,
        trailer in any::<bool>(),
        pieces in prop::collection::vec(1usize..40, 1..16),
    ) {
        let bodiless = status == 204 || status == 304;
        let mut bytes = format!("HTTP/1.1 {status} X\r\nx-a: b\r\n").into_bytes();
        match framing {
            0 => bytes.extend_from_slice(format!("content-length: {}\r\n\r\n", body.len()).as_bytes()),
            1 => bytes.extend_from_slice(b"transfer-encoding: chunked\r\n\r\n"),
            _ => bytes.extend_from_slice(b"\r\n"),
        }
        if !bodiless {
            if framing == 1 {
                for c in body.chunks(chunk) {
                    bytes.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
                    bytes.extend_from_slice(c);
                    bytes.extend_from_slice(b"\r\n");
                }
                bytes.extend_from_slice(b"0\r\n");
                if trailer {
                    bytes.extend_from_slice(b"x-sum: 1\r\n");
                }
                bytes.extend_from_slice(b"\r\n");
            } else {
                bytes.extend_from_slice(&body);
            }
        }
        let whole = read_all(&bytes, &[bytes.len()]);
        let split = read_all(&bytes, &pieces);
        prop_assert_eq!(&whole, &split);
        let (got_status, data, trailers, ended) = whole.expect("a well-formed response");
        prop_assert_eq!(got_status, status);
        prop_assert!(ended);
        if bodiless {
            prop_assert!(data.is_empty());
        } else {
            prop_assert_eq!(data, body);
            prop_assert_eq!(trailers, framing == 1 && trailer);
        }
    }

    #[test]
    fn a_mangled_response_never_panics_and_reads_the_same_however_it_arrives(
        bytes in prop::collection::vec(any::<u8>(), 0..120),
        prefix in prop::sample::select(vec![&b"HTTP/1.1 200 OK\r\n"[..], b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n", b""]),
        pieces in prop::collection::vec(1usize..20, 1..16),
    ) {
        let input = [prefix, &bytes].concat();
        prop_assert_eq!(read_all(&input, &[input.len()]), read_all(&input, &pieces));
    }
}

/// What a response reads as when `bytes` arrive in pieces of `pieces` sizes (then
/// the writer closes): status, body, whether trailers came, whether it ended; Err:
/// it could not be read.
type Read = Result<(u16, Vec<u8>, bool, bool), &'static str>;

fn read_all(bytes: &[u8], pieces: &[usize]) -> Read {
    let mut reader = Reader::new(false);
    let mut buf = BytesMut::new();
    let (mut status, mut data, mut trailers, mut ended) = (0, Vec::new(), false, false);
    let mut rest = bytes;
    let mut sizes = pieces.iter().cycle();
    loop {
        let closed = rest.is_empty();
        loop {
            match reader.next(&mut buf, closed).map_err(|b| b.0)? {
                Some(Part::Informational(_)) => {}
                Some(Part::Head(r, _)) => status = r.status().as_u16(),
                Some(Part::Data(d)) => data.extend_from_slice(&d),
                Some(Part::Trailers(_)) => trailers = true,
                Some(Part::End) => ended = true,
                None => break,
            }
            if reader.done() {
                ended = true;
                break;
            }
        }
        if closed || reader.done() {
            return Ok((status, data, trailers, ended));
        }
        let n = (*sizes.next().unwrap()).min(rest.len());
        buf.extend_from_slice(&rest[..n]);
        rest = &rest[n..];
    }
}

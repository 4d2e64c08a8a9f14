//! Property tests ("fuzzing" on the stable toolchain, as `worker/tests/fuzz_parsers.rs`
//! does for HTTP/1.1) of what HTTP/2 adds, a fixed number of cases from a fixed seed
//! so every run tries the same inputs (`PROPTEST_CASES` / `PROPTEST_RNG_SEED` for a
//! longer or different hunt):
//!
//! - the connection (`connection.rs`) as forkd configures it, fed the preface and
//!   any sequence of frames (random types, flags, stream ids and payloads, real HPACK
//!   blocks among them), in any split, answering every request it reports: it never
//!   panics, always comes to rest, reports no more streams than HEADERS came, and
//!   everything it writes is well-formed frames within the client's limits;
//! - the frame meter counts the same streams and resets however reads split.
//!
//! The request and response heads' own property tests are in `request.rs` and
//! `response.rs`.

use super::connection::{Connection, Event};
use super::frame::{self, Head, HEAD_LEN};
use super::meter::{Inbound, PREFACE};
use forkd_shared::config::H2Settings;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use std::time::Duration;

/// The property tests' configuration in every HTTP/2 module: `cases` cases from a
/// fixed seed unless `PROPTEST_CASES` / `PROPTEST_RNG_SEED` say otherwise.
pub(super) fn config(cases: u32) -> Config {
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

/// Bytes written as hex digits (test vectors).
pub(super) fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
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

/// Feeds `input` to a connection in pieces of the given sizes, polling after each
/// and answering every request at once (a head, then "ok" within the windows);
/// the streams it reported. Checks what it wrote frame by frame.
fn serve(input: &[u8], pieces: &[usize]) -> usize {
    let mut c = Connection::new(SETTINGS);
    let mut accepted = 0;
    let mut out = Vec::new();
    let mut rest = input;
    let mut sizes = pieces.iter().copied().chain(std::iter::repeat(usize::MAX));
    loop {
        let mut rounds = 0;
        while let Some(event) = c.poll() {
            rounds += 1;
            assert!(rounds < 10_000, "the connection never came to rest");
            if let Event::Request { id, .. } = event {
                accepted += 1;
                c.send_headers(id, b"\x88", false);
                c.send_data(id, b"ok", true);
            }
        }
        out.append(&mut c.out);
        if rest.is_empty() || c.failed() {
            break;
        }
        let n = sizes.next().unwrap_or(usize::MAX).max(1).min(rest.len());
        c.input(&rest[..n]);
        rest = &rest[n..];
    }
    let mut at = 0;
    while at < out.len() {
        assert!(out.len() - at >= HEAD_LEN, "a cut frame header");
        let h = Head::read(&out[at..]);
        assert!(h.len <= frame::MAX_FRAME, "a frame past the client's limit");
        assert!(h.kind <= frame::CONTINUATION && h.kind != frame::PUSH_PROMISE);
        at += HEAD_LEN + h.len;
    }
    assert_eq!(at, out.len(), "a cut frame");
    accepted
}

proptest! {
    #![proptest_config(config(300))]

    #[test]
    fn the_connection_survives_any_frames_in_any_split(
        frames in prop::collection::vec(frame(), 0..24),
        pieces in prop::collection::vec(1usize..64, 0..16),
    ) {
        let accepted = serve(&wire(&frames), &pieces);
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
}

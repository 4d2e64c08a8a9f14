//! Frame meters: each direction of an HTTP/2 connection's bytes read as frame
//! headers only (9 bytes each; payloads skipped, except the few bytes of an error
//! code), sans-io. `connection.rs` does the protocol; the meters do the rest:
//!
//! - **Inbound**, the flood rules, each a verdict the connection acts on with
//!   GOAWAY(ENHANCE_YOUR_CALM):
//!   - *rapid reset* (CVE-2023-44487): streams the client resets itself, past a
//!     budget and past half the streams it opened;
//!   - *new streams per read*: more than twice `h2_max_concurrent_streams` HEADERS
//!     in one read (nginx's rule);
//!   - *control floods* (SETTINGS, PING, PRIORITY, WINDOW_UPDATE, empty DATA): frame
//!     bytes far above the bytes that carry requests (nginx's rule: an eighth of
//!     the total, past a 1 MiB allowance);
//!   - *header blocks* (the 2024 CONTINUATION floods): one block, however it is
//!     split, bounded by `h2_max_header_list`, and in a bounded number of frames.
//! - **Outbound**, what forkd sent, for the stats: streams refused, stream errors,
//!   GOAWAY by code.

/// The client preface (RFC 9113 §3.4): 24 octets before the first frame.
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

use super::frame::{Code, CONTINUATION, DATA, END_HEADERS, GOAWAY, HEADERS, RST_STREAM};

/// Client resets tolerated before the ratio to streams opened is looked at.
const RESET_BUDGET: u64 = 256;
/// Frame bytes tolerated beyond eight times the request bytes.
const CONTROL_ALLOWANCE: u64 = 1 << 20;
/// Frames one header block may be split into.
const MAX_BLOCK_FRAMES: u32 = 64;
/// Payload octets kept of each frame: a GOAWAY's last stream id and error code.
const HEAD: usize = 8;

/// Why a client's connection is closed with ENHANCE_YOUR_CALM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flood {
    /// Streams opened and reset by the client itself, again and again.
    RapidReset,
    /// More new streams in one read than the concurrency limit explains.
    StreamsPerRead,
    /// Control frames (or empty DATA) far beyond what carries requests.
    Control,
    /// A header block past the bound, or split into too many frames.
    HeaderBlock,
}

/// Where the reader is in the byte stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pos {
    /// Inside the client preface, this many octets in.
    Preface(usize),
    /// Inside a frame header, this many octets in.
    Header(usize),
    /// Inside a payload, this many octets left.
    Payload { left: u32 },
}

/// What [`Frames::read`] reports.
enum Event<'a> {
    Header {
        kind: u8,
        flags: u8,
        length: u32,
    },
    /// A frame ended; `head`: its first payload octets (at most `HEAD`).
    End {
        kind: u8,
        head: &'a [u8],
    },
}

/// Frame-header reader shared by both directions.
#[derive(Debug, Clone)]
struct Frames {
    pos: Pos,
    header: [u8; 9],
    /// The current frame's type and flags, once its header is read.
    kind: u8,
    flags: u8,
    /// First octets of the payload (an error code is at most 8 in).
    head: [u8; HEAD],
    head_len: usize,
    length: u32,
}

impl Frames {
    fn new(preface: bool) -> Frames {
        Frames {
            pos: if preface {
                Pos::Preface(0)
            } else {
                Pos::Header(0)
            },
            header: [0; 9],
            kind: 0,
            flags: 0,
            head: [0; HEAD],
            head_len: 0,
            length: 0,
        }
    }

    /// Reads `bytes`, telling `on` of each frame header as it completes and of each
    /// frame as it ends.
    fn read(&mut self, mut bytes: &[u8], on: &mut dyn FnMut(Event)) {
        while !bytes.is_empty() {
            match self.pos {
                Pos::Preface(seen) => {
                    let n = (PREFACE.len() - seen).min(bytes.len());
                    bytes = &bytes[n..];
                    self.pos = match seen + n {
                        all if all == PREFACE.len() => Pos::Header(0),
                        part => Pos::Preface(part),
                    };
                }
                Pos::Header(have) => {
                    let n = (9 - have).min(bytes.len());
                    self.header[have..have + n].copy_from_slice(&bytes[..n]);
                    bytes = &bytes[n..];
                    if have + n < 9 {
                        self.pos = Pos::Header(have + n);
                        continue;
                    }
                    let h = self.header;
                    self.length = u32::from_be_bytes([0, h[0], h[1], h[2]]);
                    self.kind = h[3];
                    self.flags = h[4];
                    self.head_len = 0;
                    on(Event::Header {
                        kind: self.kind,
                        flags: self.flags,
                        length: self.length,
                    });
                    if self.length == 0 {
                        on(Event::End {
                            kind: self.kind,
                            head: &[],
                        });
                        self.pos = Pos::Header(0);
                    } else {
                        self.pos = Pos::Payload { left: self.length };
                    }
                }
                Pos::Payload { left } => {
                    let n = (left as usize).min(bytes.len());
                    let keep = (self.head.len() - self.head_len).min(n);
                    self.head[self.head_len..self.head_len + keep].copy_from_slice(&bytes[..keep]);
                    self.head_len += keep;
                    bytes = &bytes[n..];
                    let left = left - n as u32;
                    if left == 0 {
                        on(Event::End {
                            kind: self.kind,
                            head: &self.head[..self.head_len],
                        });
                        self.pos = Pos::Header(0);
                    } else {
                        self.pos = Pos::Payload { left };
                    }
                }
            }
        }
    }
}

/// The client's side: counts and the flood rules.
#[derive(Debug, Clone)]
pub struct Inbound {
    frames: Frames,
    max_concurrent: u64,
    /// The header block bound (`h2_max_header_list`).
    max_block: u64,
    /// Streams the client opened (HEADERS that start a block on a new stream).
    pub streams: u64,
    /// RST_STREAM frames from the client.
    pub resets: u64,
    /// Every frame octet, headers included.
    total: u64,
    /// Octets that carry requests: DATA payloads and header blocks.
    useful: u64,
    block_bytes: u64,
    block_frames: u32,
    in_block: bool,
    opened_this_read: u64,
    flood: Option<Flood>,
}

impl Inbound {
    pub fn new(max_concurrent: u32, max_header_list: u32) -> Inbound {
        Inbound {
            frames: Frames::new(true),
            max_concurrent: u64::from(max_concurrent),
            // A block's HPACK octets never exceed its decoded size by more than
            // a few length prefixes, so no slack: a block past the bound in octets
            // is past it decoded too, and this meter sees it before the
            // connection buffers it (`connection.rs` keeps twice the bound as
            // its own backstop).
            max_block: u64::from(max_header_list),
            streams: 0,
            resets: 0,
            total: 0,
            useful: 0,
            block_bytes: 0,
            block_frames: 0,
            in_block: false,
            opened_this_read: 0,
            flood: None,
        }
    }

    /// Meters one read's bytes; a flood once found stays found.
    pub fn read(&mut self, bytes: &[u8]) -> Option<Flood> {
        if self.flood.is_some() {
            return self.flood;
        }
        self.opened_this_read = 0;
        let mut frames = self.frames.clone();
        let mut found = None;
        frames.read(bytes, &mut |event| match event {
            Event::Header {
                kind,
                flags,
                length,
            } => self.header(kind, flags, length, &mut found),
            Event::End { kind, .. } if kind == RST_STREAM => self.resets += 1,
            Event::End { .. } => {}
        });
        self.frames = frames;
        if found.is_none() && self.resets > RESET_BUDGET && self.resets * 2 > self.streams {
            found = Some(Flood::RapidReset);
        }
        if found.is_none() && self.total / 8 > self.useful + CONTROL_ALLOWANCE {
            found = Some(Flood::Control);
        }
        self.flood = found;
        found
    }

    fn header(&mut self, kind: u8, flags: u8, length: u32, found: &mut Option<Flood>) {
        if length as usize > super::frame::MAX_FRAME {
            // Not a flood but a frame the connection refuses (FRAME_SIZE_ERROR)
            // before it reads its payload.
            return;
        }
        let length = u64::from(length);
        self.total += 9 + length;
        match kind {
            DATA => self.useful += length,
            HEADERS => {
                self.streams += 1;
                self.opened_this_read += 1;
                if self.opened_this_read > 2 * self.max_concurrent {
                    found.get_or_insert(Flood::StreamsPerRead);
                }
                self.start_block(flags, length, found);
            }
            CONTINUATION if self.in_block => {
                self.block_frames += 1;
                self.block_bytes += length;
                self.useful += length;
                self.check_block(flags, found);
            }
            _ => {}
        }
    }

    fn start_block(&mut self, flags: u8, length: u64, found: &mut Option<Flood>) {
        self.in_block = true;
        self.block_frames = 1;
        self.block_bytes = length;
        self.useful += length;
        self.check_block(flags, found);
    }

    fn check_block(&mut self, flags: u8, found: &mut Option<Flood>) {
        if self.block_bytes > self.max_block || self.block_frames > MAX_BLOCK_FRAMES {
            found.get_or_insert(Flood::HeaderBlock);
        }
        if flags & END_HEADERS != 0 {
            self.in_block = false;
        }
    }
}

/// What forkd sent, as counts for the stats (taken with [`Outbound::take`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sent {
    /// RST_STREAM(REFUSED_STREAM): a stream over `h2_max_concurrent_streams`, or
    /// one opened after GOAWAY.
    pub refused: u64,
    /// RST_STREAM with any other error (PROTOCOL_ERROR for a malformed request, say).
    pub stream_errors: u64,
    /// GOAWAY(NO_ERROR): a graceful close (drain, `h2_max_requests`, idle).
    pub goaway: u64,
    /// GOAWAY with an error: the client broke the protocol (or flooded).
    pub connection_errors: u64,
}

/// forkd's side of a connection, metered as it is written.
#[derive(Debug, Clone)]
pub struct Outbound {
    frames: Frames,
    sent: Sent,
}

impl Default for Outbound {
    fn default() -> Outbound {
        Outbound {
            frames: Frames::new(false),
            sent: Sent::default(),
        }
    }
}

impl Outbound {
    /// Meters bytes the socket took.
    pub fn wrote(&mut self, bytes: &[u8]) {
        let mut frames = self.frames.clone();
        let sent = &mut self.sent;
        frames.read(bytes, &mut |event| {
            let Event::End { kind, head } = event else {
                return;
            };
            let code = |at: usize| {
                head.get(at..at + 4)
                    .map(|b| Code(u32::from_be_bytes([b[0], b[1], b[2], b[3]])))
            };
            match kind {
                RST_STREAM => match code(0) {
                    Some(Code::REFUSED_STREAM) => sent.refused += 1,
                    Some(Code::NO_ERROR | Code::CANCEL) | None => {}
                    Some(_) => sent.stream_errors += 1,
                },
                GOAWAY => match code(4) {
                    Some(Code::NO_ERROR) => sent.goaway += 1,
                    _ => sent.connection_errors += 1,
                },
                _ => {}
            }
        });
        self.frames = frames;
    }

    /// The counts since the last call.
    pub fn take(&mut self) -> Sent {
        std::mem::take(&mut self.sent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len() as u32;
        let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    fn with_preface(frames: &[Vec<u8>]) -> Vec<u8> {
        let mut v = PREFACE.to_vec();
        for f in frames {
            v.extend_from_slice(f);
        }
        v
    }

    #[test]
    fn a_normal_connection_is_no_flood_however_its_bytes_are_split() {
        let bytes = with_preface(&[
            frame(4, 0, 0, &[0, 3, 0, 0, 0, 100]),
            frame(1, 0x5, 1, &[0x82, 0x86, 0x84]),
            frame(1, 0x4, 3, &[0x82]),
            frame(0, 0x1, 3, b"hello"),
            frame(3, 0, 3, &[0, 0, 0, 8]),
        ]);
        for split in 1..bytes.len() {
            let mut m = Inbound::new(128, 16384);
            assert_eq!(m.read(&bytes[..split]), None);
            assert_eq!(m.read(&bytes[split..]), None);
            assert_eq!((m.streams, m.resets), (2, 1), "split at {split}");
        }
    }

    #[test]
    fn headers_and_resets_at_full_speed_are_a_rapid_reset() {
        let mut m = Inbound::new(128, 16384);
        assert_eq!(m.read(PREFACE), None);
        let mut found = None;
        for i in 0..1000u32 {
            let id = 2 * i + 1;
            let mut pair = frame(1, 0x5, id, &[0x82, 0x86, 0x84]);
            pair.extend(frame(3, 0, id, &[0, 0, 0, 8]));
            found = found.or(m.read(&pair));
        }
        assert_eq!(found, Some(Flood::RapidReset));
        // A browser cancelling a few of many streams is not one.
        let mut m = Inbound::new(128, 16384);
        m.read(PREFACE);
        for i in 0..2000u32 {
            let id = 2 * i + 1;
            let mut f = frame(1, 0x5, id, &[0x82, 0x86, 0x84]);
            if i % 4 == 0 {
                f.extend(frame(3, 0, id, &[0, 0, 0, 8]));
            }
            assert_eq!(m.read(&f), None, "stream {id}");
        }
    }

    #[test]
    fn more_new_streams_in_one_read_than_twice_the_limit_is_a_flood() {
        let mut many = Vec::new();
        for i in 0..9u32 {
            many.extend(frame(1, 0x5, 2 * i + 1, &[0x82]));
        }
        let mut m = Inbound::new(4, 16384);
        m.read(PREFACE);
        assert_eq!(m.read(&many), Some(Flood::StreamsPerRead));
        let mut m = Inbound::new(8, 16384);
        m.read(PREFACE);
        assert_eq!(m.read(&many), None);
    }

    #[test]
    fn pings_and_settings_far_beyond_requests_are_a_control_flood() {
        let mut m = Inbound::new(128, 16384);
        m.read(PREFACE);
        let ping = frame(6, 0, 0, &[0; 8]);
        let mut found = None;
        let mut sent = 0u64;
        while found.is_none() && sent < 16 << 20 {
            found = m.read(&ping);
            sent += ping.len() as u64;
        }
        assert_eq!(found, Some(Flood::Control));
        assert!(
            sent > 8 << 20,
            "closed after {sent} bytes: past the allowance only"
        );
        // Empty DATA frames carry nothing either.
        let mut m = Inbound::new(128, 16384);
        m.read(PREFACE);
        let empty = frame(0, 0, 1, &[]);
        let found = (0..2_000_000).find_map(|_| m.read(&empty));
        assert_eq!(found, Some(Flood::Control));
    }

    #[test]
    fn a_header_block_is_bounded_however_it_is_split() {
        // One HEADERS then CONTINUATION frames of 1 KiB each, never END_HEADERS.
        let mut m = Inbound::new(128, 8192);
        m.read(PREFACE);
        let mut found = m.read(&frame(1, 0x1, 1, &[0; 1024]));
        let mut frames = 1;
        while found.is_none() && frames < 100 {
            found = m.read(&frame(9, 0, 1, &[0; 1024]));
            frames += 1;
        }
        assert_eq!(found, Some(Flood::HeaderBlock));
        assert!(frames <= 13, "{frames} frames");
        // Tiny pieces: bounded by the frame count.
        let mut m = Inbound::new(128, 1 << 20);
        m.read(PREFACE);
        m.read(&frame(1, 0x1, 1, &[0x82]));
        let found = (0..100).find_map(|_| m.read(&frame(9, 0, 1, &[0x82])));
        assert_eq!(found, Some(Flood::HeaderBlock));
        // A block that ends starts the count again.
        let mut m = Inbound::new(128, 8192);
        m.read(PREFACE);
        for id in 0..50u32 {
            assert_eq!(m.read(&frame(1, 0x0, 2 * id + 1, &[0; 4000])), None);
            assert_eq!(m.read(&frame(9, 0x4, 2 * id + 1, &[0; 4000])), None);
        }
    }

    #[test]
    fn what_forkd_sends_is_counted_by_code() {
        let mut out = Outbound::default();
        let mut bytes = frame(4, 0, 0, &[]);
        bytes.extend(frame(3, 0, 1, &7u32.to_be_bytes())); // REFUSED_STREAM
        bytes.extend(frame(3, 0, 3, &1u32.to_be_bytes())); // PROTOCOL_ERROR
        bytes.extend(frame(3, 0, 5, &8u32.to_be_bytes())); // CANCEL
        let mut goaway = 0x7fff_ffffu32.to_be_bytes().to_vec();
        goaway.extend(0u32.to_be_bytes());
        bytes.extend(frame(7, 0, 0, &goaway));
        let mut calm = 5u32.to_be_bytes().to_vec();
        calm.extend(0xbu32.to_be_bytes());
        bytes.extend(frame(7, 0, 0, &calm));
        for b in bytes.chunks(3) {
            out.wrote(b);
        }
        assert_eq!(
            out.take(),
            Sent {
                refused: 1,
                stream_errors: 1,
                goaway: 1,
                connection_errors: 1,
            }
        );
        assert_eq!(out.take(), Sent::default());
    }
}

//! HTTP/2 frames (RFC 9113 §4, §6), sans-io: the 9-octet frame header read from
//! bytes, each frame type's payload checked and read into [`Frame`], and the frames
//! a server sends written into an output buffer.
//!
//! Reading checks what one frame alone can break (its length for its type, its
//! stream id being zero or not, padding longer than the payload) and names the error
//! the RFC gives; what depends on the connection's state is `connection.rs`'s.

/// Octets of a frame header.
pub const HEAD_LEN: usize = 9;

/// The largest frame payload forkd accepts (SETTINGS_MAX_FRAME_SIZE's initial
/// value, which forkd does not raise).
pub const MAX_FRAME: usize = 16_384;

/// The largest flow-control window (RFC 9113 §6.9.1).
pub const MAX_WINDOW: i64 = (1 << 31) - 1;

pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const PRIORITY: u8 = 0x2;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PUSH_PROMISE: u8 = 0x5;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const WINDOW_UPDATE: u8 = 0x8;
pub const CONTINUATION: u8 = 0x9;

pub const END_STREAM: u8 = 0x1;
pub const ACK: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const PADDED: u8 = 0x8;
pub const PRIORITY_FLAG: u8 = 0x20;

/// SETTINGS identifiers (RFC 9113 §6.5.2).
pub const SETTINGS_ENABLE_PUSH: u16 = 0x2;
pub const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
pub const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;
pub const SETTINGS_MAX_FRAME_SIZE: u16 = 0x5;
pub const SETTINGS_MAX_HEADER_LIST_SIZE: u16 = 0x6;

/// Error codes (RFC 9113 §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Code(pub u32);

impl Code {
    pub const NO_ERROR: Code = Code(0x0);
    pub const PROTOCOL_ERROR: Code = Code(0x1);
    pub const INTERNAL_ERROR: Code = Code(0x2);
    pub const FLOW_CONTROL_ERROR: Code = Code(0x3);
    pub const STREAM_CLOSED: Code = Code(0x5);
    pub const FRAME_SIZE_ERROR: Code = Code(0x6);
    pub const REFUSED_STREAM: Code = Code(0x7);
    pub const CANCEL: Code = Code(0x8);
    pub const COMPRESSION_ERROR: Code = Code(0x9);
    pub const ENHANCE_YOUR_CALM: Code = Code(0xb);
}

/// A frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    pub len: usize,
    pub kind: u8,
    pub flags: u8,
    /// The stream identifier, its reserved bit ignored (RFC 9113 §4.1).
    pub stream: u32,
}

impl Head {
    /// The header at the front of `b` (at least [`HEAD_LEN`] octets).
    pub fn read(b: &[u8]) -> Head {
        Head {
            len: usize::from(b[0]) << 16 | usize::from(b[1]) << 8 | usize::from(b[2]),
            kind: b[3],
            flags: b[4],
            stream: u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & 0x7fff_ffff,
        }
    }

    pub fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }
}

/// What a frame alone breaks: a connection error, or an error of its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    Connection(Code, &'static str),
    Stream(u32, Code, &'static str),
}

/// A frame's payload as read.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    Data {
        stream: u32,
        data: &'a [u8],
        end: bool,
    },
    Headers {
        stream: u32,
        fragment: &'a [u8],
        end_stream: bool,
        end_headers: bool,
        /// Its priority names the stream itself (RFC 9113 §5.3.1): a stream error,
        /// raised once the block is decoded (HPACK must stay in step).
        depends_on_self: bool,
    },
    Priority,
    RstStream {
        stream: u32,
        code: Code,
    },
    Settings {
        ack: bool,
        payload: &'a [u8],
    },
    Ping {
        ack: bool,
        data: [u8; 8],
    },
    GoAway {
        last: u32,
        code: Code,
    },
    WindowUpdate {
        stream: u32,
        increment: u32,
    },
    Continuation {
        stream: u32,
        fragment: &'a [u8],
        end_headers: bool,
    },
    /// A frame of a type this endpoint does not know: ignored (RFC 9113 §4.1).
    Unknown,
}

fn conn(why: &'static str) -> Error {
    Error::Connection(Code::PROTOCOL_ERROR, why)
}

fn size(why: &'static str) -> Error {
    Error::Connection(Code::FRAME_SIZE_ERROR, why)
}

/// The payload without its padding (RFC 9113 §6.1, §6.2), and what was cut.
fn unpad<'a>(h: &Head, p: &'a [u8]) -> Result<&'a [u8], Error> {
    if !h.has(PADDED) {
        return Ok(p);
    }
    let Some((&pad, rest)) = p.split_first() else {
        return Err(size("padded frame without its pad length"));
    };
    let pad = usize::from(pad);
    if pad > rest.len() {
        return Err(conn("padding longer than the frame"));
    }
    Ok(&rest[..rest.len() - pad])
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// Reads the frame `h` with its payload `p` (`p.len() == h.len`).
pub fn read<'a>(h: &Head, p: &'a [u8]) -> Result<Frame<'a>, Error> {
    let s = h.stream;
    let on_stream = |why| if s == 0 { Err(conn(why)) } else { Ok(()) };
    let on_conn = |why| if s != 0 { Err(conn(why)) } else { Ok(()) };
    match h.kind {
        DATA => {
            on_stream("DATA on stream 0")?;
            Ok(Frame::Data {
                stream: s,
                data: unpad(h, p)?,
                end: h.has(END_STREAM),
            })
        }
        HEADERS => {
            on_stream("HEADERS on stream 0")?;
            let mut body = unpad(h, p)?;
            let mut depends_on_self = false;
            if h.has(PRIORITY_FLAG) {
                if body.len() < 5 {
                    return Err(size("HEADERS too short for its priority"));
                }
                depends_on_self = be32(body) & 0x7fff_ffff == s;
                body = &body[5..];
            }
            Ok(Frame::Headers {
                stream: s,
                fragment: body,
                end_stream: h.has(END_STREAM),
                end_headers: h.has(END_HEADERS),
                depends_on_self,
            })
        }
        PRIORITY => {
            on_stream("PRIORITY on stream 0")?;
            if p.len() != 5 {
                return Err(Error::Stream(
                    s,
                    Code::FRAME_SIZE_ERROR,
                    "PRIORITY not 5 octets",
                ));
            }
            if be32(p) & 0x7fff_ffff == s {
                return Err(Error::Stream(
                    s,
                    Code::PROTOCOL_ERROR,
                    "stream depends on itself",
                ));
            }
            Ok(Frame::Priority)
        }
        RST_STREAM => {
            on_stream("RST_STREAM on stream 0")?;
            if p.len() != 4 {
                return Err(size("RST_STREAM not 4 octets"));
            }
            Ok(Frame::RstStream {
                stream: s,
                code: Code(be32(p)),
            })
        }
        SETTINGS => {
            on_conn("SETTINGS on a stream")?;
            let ack = h.has(ACK);
            if ack && !p.is_empty() {
                return Err(size("SETTINGS ACK with a payload"));
            }
            if !p.len().is_multiple_of(6) {
                return Err(size("SETTINGS not a multiple of 6 octets"));
            }
            Ok(Frame::Settings { ack, payload: p })
        }
        PUSH_PROMISE => Err(conn("PUSH_PROMISE from a client")),
        PING => {
            on_conn("PING on a stream")?;
            if p.len() != 8 {
                return Err(size("PING not 8 octets"));
            }
            let mut data = [0; 8];
            data.copy_from_slice(p);
            Ok(Frame::Ping {
                ack: h.has(ACK),
                data,
            })
        }
        GOAWAY => {
            on_conn("GOAWAY on a stream")?;
            if p.len() < 8 {
                return Err(size("GOAWAY shorter than 8 octets"));
            }
            Ok(Frame::GoAway {
                last: be32(p) & 0x7fff_ffff,
                code: Code(be32(&p[4..])),
            })
        }
        WINDOW_UPDATE => {
            if p.len() != 4 {
                return Err(size("WINDOW_UPDATE not 4 octets"));
            }
            Ok(Frame::WindowUpdate {
                stream: s,
                increment: be32(p) & 0x7fff_ffff,
            })
        }
        CONTINUATION => {
            on_stream("CONTINUATION on stream 0")?;
            Ok(Frame::Continuation {
                stream: s,
                fragment: p,
                end_headers: h.has(END_HEADERS),
            })
        }
        _ => Ok(Frame::Unknown),
    }
}

/// One setting of a SETTINGS payload.
pub fn settings(payload: &[u8]) -> impl Iterator<Item = (u16, u32)> + '_ {
    payload
        .chunks_exact(6)
        .map(|c| (u16::from_be_bytes([c[0], c[1]]), be32(&c[2..])))
}

/// Writes a frame header.
pub fn head(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream: u32) {
    let l = (len as u32).to_be_bytes();
    let s = stream.to_be_bytes();
    out.extend_from_slice(&[l[1], l[2], l[3], kind, flags, s[0], s[1], s[2], s[3]]);
}

/// Writes a SETTINGS frame of `pairs`.
pub fn write_settings(out: &mut Vec<u8>, pairs: &[(u16, u32)]) {
    head(out, pairs.len() * 6, SETTINGS, 0, 0);
    for &(id, value) in pairs {
        out.extend_from_slice(&id.to_be_bytes());
        out.extend_from_slice(&value.to_be_bytes());
    }
}

pub fn write_settings_ack(out: &mut Vec<u8>) {
    head(out, 0, SETTINGS, ACK, 0);
}

pub fn write_ping(out: &mut Vec<u8>, ack: bool, data: [u8; 8]) {
    head(out, 8, PING, if ack { ACK } else { 0 }, 0);
    out.extend_from_slice(&data);
}

pub fn write_goaway(out: &mut Vec<u8>, last: u32, code: Code) {
    head(out, 8, GOAWAY, 0, 0);
    out.extend_from_slice(&last.to_be_bytes());
    out.extend_from_slice(&code.0.to_be_bytes());
}

pub fn write_rst(out: &mut Vec<u8>, stream: u32, code: Code) {
    head(out, 4, RST_STREAM, 0, stream);
    out.extend_from_slice(&code.0.to_be_bytes());
}

pub fn write_window_update(out: &mut Vec<u8>, stream: u32, increment: u32) {
    head(out, 4, WINDOW_UPDATE, 0, stream);
    out.extend_from_slice(&increment.to_be_bytes());
}

/// Writes a header block as HEADERS and as many CONTINUATION frames as frames of
/// `max_frame` octets need; the block is `prefix` then `block`.
pub fn write_headers(
    out: &mut Vec<u8>,
    stream: u32,
    prefix: &[u8],
    block: &[u8],
    end_stream: bool,
    max_frame: usize,
) {
    let total = prefix.len() + block.len();
    let mut at = 0;
    let mut kind = HEADERS;
    let mut flags = if end_stream { END_STREAM } else { 0 };
    loop {
        let n = (total - at).min(max_frame);
        let last = at + n == total;
        if last {
            flags |= END_HEADERS;
        }
        head(out, n, kind, flags, stream);
        let (from, to) = (at, at + n);
        if from < prefix.len() {
            out.extend_from_slice(&prefix[from..to.min(prefix.len())]);
        }
        if to > prefix.len() {
            out.extend_from_slice(&block[from.max(prefix.len()) - prefix.len()..to - prefix.len()]);
        }
        at = to;
        if last {
            return;
        }
        kind = CONTINUATION;
        flags = 0;
    }
}

/// Writes `data` as DATA frames of at most `max_frame` octets, END_STREAM on the
/// last if `end` (one empty frame if `data` is empty).
pub fn write_data(out: &mut Vec<u8>, stream: u32, data: &[u8], end: bool, max_frame: usize) {
    let mut rest = data;
    loop {
        let n = rest.len().min(max_frame);
        let last = n == rest.len();
        head(
            out,
            n,
            DATA,
            if last && end { END_STREAM } else { 0 },
            stream,
        );
        out.extend_from_slice(&rest[..n]);
        rest = &rest[n..];
        if last {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Result<Frame<'_>, Error> {
        let mut b = Vec::new();
        head(&mut b, payload.len(), kind, flags, stream);
        let h = Head::read(&b);
        assert_eq!(
            (h.len, h.kind, h.flags, h.stream),
            (payload.len(), kind, flags, stream)
        );
        read(&h, payload)
    }

    #[test]
    fn a_frame_header_reads_back_and_ignores_the_reserved_bit() {
        let h = Head::read(&[0, 0x40, 0x01, DATA, END_STREAM, 0x80, 0, 0, 3]);
        assert_eq!(h.len, 0x4001);
        assert_eq!(h.stream, 3);
        assert!(h.has(END_STREAM));
    }

    #[test]
    fn padding_is_cut_and_padding_past_the_frame_is_a_protocol_error() {
        assert_eq!(
            one(DATA, PADDED | END_STREAM, 1, b"\x02abcXY"),
            Ok(Frame::Data {
                stream: 1,
                data: b"abc",
                end: true
            })
        );
        assert_eq!(
            one(DATA, PADDED, 1, b"\x05abc"),
            Err(Error::Connection(
                Code::PROTOCOL_ERROR,
                "padding longer than the frame"
            ))
        );
        let mut headers = vec![1u8];
        headers.extend_from_slice(&[0, 0, 0, 3, 16]);
        headers.extend_from_slice(b"\x82P");
        assert_eq!(
            one(HEADERS, PADDED | PRIORITY_FLAG | END_HEADERS, 1, &headers),
            Ok(Frame::Headers {
                stream: 1,
                fragment: b"\x82",
                end_stream: false,
                end_headers: true,
                depends_on_self: false
            })
        );
    }

    #[test]
    fn each_type_has_its_length_and_stream_rules() {
        let frame_size = |r: Result<Frame, Error>| {
            matches!(r, Err(Error::Connection(Code::FRAME_SIZE_ERROR, _)))
        };
        let protocol =
            |r: Result<Frame, Error>| matches!(r, Err(Error::Connection(Code::PROTOCOL_ERROR, _)));
        assert!(protocol(one(DATA, 0, 0, b"x")));
        assert!(protocol(one(HEADERS, END_HEADERS, 0, b"\x82")));
        assert!(protocol(one(SETTINGS, 0, 1, b"")));
        assert!(protocol(one(PING, 0, 1, &[0; 8])));
        assert!(protocol(one(GOAWAY, 0, 1, &[0; 8])));
        assert!(protocol(one(PUSH_PROMISE, 0, 1, &[0; 4])));
        assert!(protocol(one(RST_STREAM, 0, 0, &[0; 4])));
        assert!(frame_size(one(SETTINGS, ACK, 0, &[0; 6])));
        assert!(frame_size(one(SETTINGS, 0, 0, &[0; 5])));
        assert!(frame_size(one(PING, 0, 0, &[0; 7])));
        assert!(frame_size(one(RST_STREAM, 0, 1, &[0; 3])));
        assert!(frame_size(one(WINDOW_UPDATE, 0, 0, &[0; 3])));
        assert!(frame_size(one(GOAWAY, 0, 0, &[0; 7])));
        assert_eq!(
            one(PRIORITY, 0, 1, &[0; 4]),
            Err(Error::Stream(
                1,
                Code::FRAME_SIZE_ERROR,
                "PRIORITY not 5 octets"
            ))
        );
        assert_eq!(
            one(PRIORITY, 0, 3, &[0, 0, 0, 3, 16]),
            Err(Error::Stream(
                3,
                Code::PROTOCOL_ERROR,
                "stream depends on itself"
            ))
        );
        assert_eq!(one(0x42, 0xff, 7, b"anything"), Ok(Frame::Unknown));
    }

    #[test]
    fn a_large_header_block_is_split_into_continuations_and_data_into_frames() {
        let mut out = Vec::new();
        let block = vec![7u8; 40];
        write_headers(&mut out, 5, b"\x20", &block, true, 16);
        let mut at = 0;
        let mut got = Vec::new();
        let mut kinds = Vec::new();
        while at < out.len() {
            let h = Head::read(&out[at..]);
            kinds.push((h.kind, h.flags));
            got.extend_from_slice(&out[at + HEAD_LEN..at + HEAD_LEN + h.len]);
            at += HEAD_LEN + h.len;
        }
        assert_eq!(got, [&b"\x20"[..], &block].concat());
        assert_eq!(
            kinds,
            [
                (HEADERS, END_STREAM),
                (CONTINUATION, 0),
                (CONTINUATION, END_HEADERS)
            ]
        );
        let mut out = Vec::new();
        write_data(&mut out, 1, &[1; 20], true, 16);
        assert_eq!(Head::read(&out).len, 16);
        assert_eq!(Head::read(&out).flags, 0);
        assert_eq!(Head::read(&out[25..]).len, 4);
        assert_eq!(Head::read(&out[25..]).flags, END_STREAM);
        let mut out = Vec::new();
        write_data(&mut out, 1, &[], true, 16);
        assert_eq!(out, [0, 0, 0, DATA, END_STREAM, 0, 0, 0, 1]);
    }
}

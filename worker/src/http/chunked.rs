//! The chunked transfer coding (RFC 9112 §7.1), decoded incrementally.
//!
//! Strict on framing, because a lenient decoder is how request smuggling starts: the
//! size must be hex (at most 16 digits), lines end in CRLF, data is followed by CRLF.
//!
//! Chunk extensions and trailer fields are skipped, but never without bound: both are
//! metadata a client can make as long as it likes, and a body limit that counts only
//! data would let it stream any amount of metadata into a connection.
//! - A chunk extension (the bytes between the size and the CR of a chunk line) may be
//!   at most [`MAX_EXTENSION_BYTES`] on one line and [`MAX_EXTENSIONS_TOTAL`] in one
//!   body; more is 400.
//! - The trailer section (every byte after the last chunk's line, the final empty line
//!   included) is a header section, so it gets a head's budget: at most
//!   `max_trailer_bytes` (the server's `max_header_bytes`) and [`MAX_HEADERS`] fields;
//!   more is 431.
//!
//! Trailer lines must be fields (RFC 9110 §5.5, RFC 9112 §5): a token, a colon, a
//! value of visible characters, spaces and tabs. A line that starts with whitespace
//! (obs-fold), has no colon, or a NUL or other control character in it is 400: a
//! relayed body is re-encoded with its trailers, and the receiver must never get a
//! line it could read as something else.
//!
//! Every limit is checked on the byte that crosses it, so the answer goes out at once
//! instead of after the client has sent the rest.
//!
//! Sans-io and the only chunked decoder of the worker: a body forkd discards uses
//! [`ChunkedDecoder::decode`], a body the proxy relays (either direction) uses
//! [`ChunkedDecoder::step`], which says where the data is, with
//! [`ChunkedDecoder::keeping_trailers`] so the trailer fields can be re-encoded.

use super::request::MAX_HEADERS;
use super::response::Status;
use std::ops::Range;

/// Extension bytes one chunk line may carry. The extensions in use (a name, perhaps a
/// short value) take tens of bytes; 4 KiB leaves a hundredfold room for a signature
/// or a checksum, and is a quarter of the default `max_header_bytes`, so a chunk line
/// never gets more room than a header field line could reasonably take.
pub const MAX_EXTENSION_BYTES: usize = 4 * 1024;

/// Extension bytes one body may carry, across all its chunk lines. Without it, a body of
/// one-byte chunks could carry 4 KiB of extension per byte of data (4 GiB for a 1 MiB
/// body). 16 KiB is the budget hyper and Node.js settled on for the same reason.
pub const MAX_EXTENSIONS_TOTAL: usize = 16 * 1024;

/// Why a chunked body was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkedError {
    /// A chunk size that is not hex, too long, or a line not ended by CRLF.
    BadFraming,
    /// The body's decoded size went over the limit.
    TooLarge,
    /// A chunk line's extension over [`MAX_EXTENSION_BYTES`], or a body's extensions
    /// over [`MAX_EXTENSIONS_TOTAL`].
    ExtensionTooLong,
    /// The trailer section over `max_trailer_bytes`, or more than [`MAX_HEADERS`] fields.
    TrailersTooLarge,
    /// A trailer line that is not a field: leading whitespace, no `name:`, or a
    /// control character.
    BadTrailer,
}

impl ChunkedError {
    /// The status that answers the request.
    pub fn status(self) -> Status {
        match self {
            ChunkedError::BadFraming
            | ChunkedError::ExtensionTooLong
            | ChunkedError::BadTrailer => Status::BAD_REQUEST,
            ChunkedError::TooLarge => Status::CONTENT_TOO_LARGE,
            ChunkedError::TrailersTooLarge => Status::HEADER_FIELDS_TOO_LARGE,
        }
    }

    /// A short reason for the error log.
    pub fn reason(self) -> &'static str {
        match self {
            ChunkedError::BadFraming => "invalid chunked framing",
            ChunkedError::TooLarge => "chunked body too large",
            ChunkedError::ExtensionTooLong => "chunk extension too long",
            ChunkedError::TrailersTooLarge => "trailer section too large",
            ChunkedError::BadTrailer => "invalid trailer field",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading hex digits of a chunk size; `digits` read so far.
    Size {
        digits: u8,
    },
    /// After the size: skipping a chunk extension up to CR; `len` bytes so far.
    Extension {
        len: usize,
    },
    /// Expecting the LF of the size line.
    SizeLf,
    /// Skipping `remaining` bytes of chunk data.
    Data,
    /// Expecting CR after chunk data.
    DataCr,
    /// Expecting LF after chunk data.
    DataLf,
    /// At the start of a trailer line (or the final empty line).
    TrailerStart,
    /// In a trailer field's name, up to its colon.
    TrailerName,
    /// In a trailer field's value, up to CR.
    TrailerValue,
    /// Expecting LF of a trailer field line.
    TrailerLf,
    /// Expecting LF of the final empty line.
    EndLf,
    Done,
}

/// Decodes a chunked body incrementally.
#[derive(Debug, Clone)]
pub struct ChunkedDecoder {
    state: State,
    size: u64,
    remaining: u64,
    /// Sum of the sizes declared so far.
    total: u64,
    limit: u64,
    extensions: usize,
    trailer_bytes: usize,
    trailer_fields: usize,
    max_trailer_bytes: usize,
    /// The trailer field lines (each ending in CRLF), when kept.
    trailers: Option<Vec<u8>>,
}

/// One [`ChunkedDecoder::step`]: `consumed` input bytes, of which `data` (a range of
/// the input, possibly empty) are chunk data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub consumed: usize,
    pub data: Range<usize>,
}

impl ChunkedDecoder {
    /// A decoder that rejects bodies larger than `limit` decoded bytes and trailer
    /// sections larger than `max_trailer_bytes`.
    pub fn new(limit: u64, max_trailer_bytes: usize) -> Self {
        ChunkedDecoder {
            state: State::Size { digits: 0 },
            size: 0,
            remaining: 0,
            total: 0,
            limit,
            extensions: 0,
            trailer_bytes: 0,
            trailer_fields: 0,
            max_trailer_bytes,
            trailers: None,
        }
    }

    /// Also keeps the trailer field lines ([`ChunkedDecoder::trailers`]), within the
    /// same bounds: a relayed body is re-encoded with them.
    pub fn keeping_trailers(mut self) -> Self {
        self.trailers = Some(Vec::new());
        self
    }

    /// The trailer field lines read so far, each ending in CRLF (empty unless kept).
    pub fn trailers(&self) -> &[u8] {
        self.trailers.as_deref().unwrap_or_default()
    }

    /// Whether the whole body, trailers included, has been read.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Consumes bytes of `input`, discarding the data; returns how many belong to the
    /// body. Stops at the end of the body, so any bytes after that are the next request.
    pub fn decode(&mut self, input: &[u8]) -> Result<usize, ChunkedError> {
        self.decode_into(input, |_| {})
    }

    /// Like [`decode`](Self::decode), handing every run of chunk data to `data` in order.
    /// After an error nothing more may be fed.
    pub fn decode_into(
        &mut self,
        input: &[u8],
        mut data: impl FnMut(&[u8]),
    ) -> Result<usize, ChunkedError> {
        let mut at = 0;
        while at < input.len() && !self.is_done() {
            let step = self.step(&input[at..])?;
            if !step.data.is_empty() {
                data(&input[at + step.data.start..at + step.data.end]);
            }
            at += step.consumed;
        }
        Ok(at)
    }

    /// Decodes from the start of `input` up to and including the next run of chunk
    /// data (or to the end of `input`, or of the body): call again with the rest.
    /// After an error nothing more may be fed.
    pub fn step(&mut self, input: &[u8]) -> Result<Step, ChunkedError> {
        let mut i = 0;
        while i < input.len() {
            if self.state == State::Data {
                let take = self.remaining.min((input.len() - i) as u64) as usize;
                self.remaining -= take as u64;
                if self.remaining == 0 {
                    self.state = State::DataCr;
                }
                return Ok(Step {
                    consumed: i + take,
                    data: i..i + take,
                });
            }
            if self.state == State::Done {
                break;
            }
            let b = input[i];
            i += 1;
            self.framing_byte(b)?;
        }
        Ok(Step {
            consumed: i,
            data: i..i,
        })
    }

    /// One byte of framing (size lines, CRLFs, trailers).
    fn framing_byte(&mut self, b: u8) -> Result<(), ChunkedError> {
        if matches!(
            self.state,
            State::TrailerStart
                | State::TrailerName
                | State::TrailerValue
                | State::TrailerLf
                | State::EndLf
        ) {
            self.trailer_bytes += 1;
            if self.trailer_bytes > self.max_trailer_bytes {
                return Err(ChunkedError::TrailersTooLarge);
            }
        }
        self.state = match self.state {
            State::Size { digits } => match hex_value(b) {
                Some(v) => {
                    if digits >= 16 {
                        return Err(ChunkedError::BadFraming);
                    }
                    self.size = (self.size << 4) | u64::from(v);
                    State::Size { digits: digits + 1 }
                }
                None if digits == 0 => return Err(ChunkedError::BadFraming),
                None => match b {
                    b'\r' => State::SizeLf,
                    b';' | b' ' | b'\t' => self.extension_byte(0)?,
                    _ => return Err(ChunkedError::BadFraming),
                },
            },
            State::Extension { len } => match b {
                b'\r' => State::SizeLf,
                b'\n' => return Err(ChunkedError::BadFraming),
                _ => self.extension_byte(len)?,
            },
            State::SizeLf => {
                if b != b'\n' {
                    return Err(ChunkedError::BadFraming);
                }
                self.total = self
                    .total
                    .checked_add(self.size)
                    .ok_or(ChunkedError::TooLarge)?;
                if self.total > self.limit {
                    return Err(ChunkedError::TooLarge);
                }
                if self.size == 0 {
                    State::TrailerStart
                } else {
                    self.remaining = self.size;
                    self.size = 0;
                    State::Data
                }
            }
            State::DataCr if b == b'\r' => State::DataLf,
            State::DataLf if b == b'\n' => State::Size { digits: 0 },
            State::DataCr | State::DataLf => return Err(ChunkedError::BadFraming),
            State::TrailerStart => match b {
                b'\r' => State::EndLf,
                b'\n' => return Err(ChunkedError::BadFraming),
                // A name starts the line: whitespace here is obs-fold (or a name
                // that starts with a space), either is refused.
                _ if is_tchar(b) => {
                    self.trailer_fields += 1;
                    if self.trailer_fields > MAX_HEADERS {
                        return Err(ChunkedError::TrailersTooLarge);
                    }
                    self.keep_trailer(b);
                    State::TrailerName
                }
                _ => return Err(ChunkedError::BadTrailer),
            },
            State::TrailerName => match b {
                b':' => {
                    self.keep_trailer(b);
                    State::TrailerValue
                }
                _ if is_tchar(b) => {
                    self.keep_trailer(b);
                    State::TrailerName
                }
                // Whitespace before the colon, a line without one, a NUL.
                _ => return Err(ChunkedError::BadTrailer),
            },
            State::TrailerValue => match b {
                b'\r' => State::TrailerLf,
                b'\n' => return Err(ChunkedError::BadFraming),
                _ if is_field_value_byte(b) => {
                    self.keep_trailer(b);
                    State::TrailerValue
                }
                _ => return Err(ChunkedError::BadTrailer),
            },
            State::TrailerLf if b == b'\n' => {
                if let Some(kept) = self.trailers.as_mut() {
                    kept.extend_from_slice(b"\r\n");
                }
                State::TrailerStart
            }
            State::EndLf if b == b'\n' => State::Done,
            State::TrailerLf | State::EndLf => return Err(ChunkedError::BadFraming),
            State::Data | State::Done => unreachable!("handled by step"),
        };
        Ok(())
    }

    /// A trailer byte, kept if asked (bounded by `max_trailer_bytes` already).
    fn keep_trailer(&mut self, b: u8) {
        if let Some(kept) = self.trailers.as_mut() {
            kept.push(b);
        }
    }

    /// Counts one more byte of extension on a line that had `len`.
    fn extension_byte(&mut self, len: usize) -> Result<State, ChunkedError> {
        self.extensions += 1;
        if len >= MAX_EXTENSION_BYTES || self.extensions > MAX_EXTENSIONS_TOTAL {
            return Err(ChunkedError::ExtensionTooLong);
        }
        Ok(State::Extension { len: len + 1 })
    }
}

/// A byte of a token (RFC 9110 §5.6.2): a field name.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// A byte a field value may hold (RFC 9110 §5.5): visible characters, obs-text,
/// space and tab; never NUL, CR, LF or another control character.
fn is_field_value_byte(b: u8) -> bool {
    b == b' ' || b == b'\t' || (0x21..=0x7e).contains(&b) || b >= 0x80
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRAILERS: usize = 16 * 1024;

    fn decode_all(input: &[u8], limit: u64) -> Result<(usize, bool), ChunkedError> {
        let mut d = ChunkedDecoder::new(limit, TRAILERS);
        let n = d.decode(input)?;
        Ok((n, d.is_done()))
    }

    #[test]
    fn simple_body_stops_at_its_end() {
        let body = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\nGET / HTTP/1.1\r\n";
        let end = body.len() - b"GET / HTTP/1.1\r\n".len();
        assert_eq!(decode_all(body, 100), Ok((end, true)));
    }

    #[test]
    fn data_is_handed_over_in_order() {
        let mut d = ChunkedDecoder::new(100, TRAILERS);
        let mut got = Vec::new();
        let body = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\n";
        for piece in body.chunks(4) {
            d.decode_into(piece, |data| got.extend_from_slice(data))
                .unwrap();
        }
        assert!(d.is_done());
        assert_eq!(got, b"hello world");
    }

    #[test]
    fn trailers_are_skipped() {
        let body = b"3\r\nabc\r\n0\r\nX-Sum: 1\r\nY: 2\r\n\r\n";
        assert_eq!(decode_all(body, 100), Ok((body.len(), true)));
    }

    #[test]
    fn byte_at_a_time_gives_same_result() {
        let body = b"A\r\n0123456789\r\n0\r\n\r\n";
        let mut d = ChunkedDecoder::new(100, TRAILERS);
        for (i, b) in body.iter().enumerate() {
            assert!(!d.is_done(), "done early at {i}");
            assert_eq!(d.decode(std::slice::from_ref(b)), Ok(1));
        }
        assert!(d.is_done());
    }

    #[test]
    fn bad_framing_is_rejected() {
        for bad in [
            &b"zz\r\n"[..],
            b"\r\n",
            b"5\nhello\r\n",
            b"5\r\nhelloX\r\n",
            b"11111111111111111\r\n",
            b"0\r\n\n",
            b"-5\r\n",
        ] {
            assert_eq!(
                decode_all(bad, u64::MAX),
                Err(ChunkedError::BadFraming),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn limit_is_enforced_on_declared_sizes() {
        assert_eq!(decode_all(b"10\r\n", 15), Err(ChunkedError::TooLarge));
        assert_eq!(
            decode_all(b"8\r\n12345678\r\n8\r\n", 15),
            Err(ChunkedError::TooLarge)
        );
        assert_eq!(
            decode_all(b"8\r\n12345678\r\n7\r\n1234567\r\n0\r\n\r\n", 15),
            Ok((30, true))
        );
        assert_eq!(
            decode_all(b"ffffffffffffffff\r\n", u64::MAX),
            Ok((18, false))
        );
    }

    /// `size;` followed by `ext` bytes of extension, without the CR.
    fn line_with_extension(size: &str, ext: usize) -> Vec<u8> {
        let mut line = format!("{size};").into_bytes();
        line.resize(line.len() + ext - 1, b'x');
        line
    }

    #[test]
    fn an_extension_up_to_the_limit_is_skipped() {
        let mut body = line_with_extension("3", MAX_EXTENSION_BYTES);
        body.extend_from_slice(b"\r\nabc\r\n0\r\n\r\n");
        assert_eq!(decode_all(&body, 100), Ok((body.len(), true)));
    }

    #[test]
    fn a_long_extension_is_refused_on_the_byte_over_the_limit() {
        // Issue 10: 64 MiB of extension used to be read to its end.
        let line = line_with_extension("3", MAX_EXTENSION_BYTES + 1);
        let mut d = ChunkedDecoder::new(100, TRAILERS);
        assert_eq!(
            d.decode(&line[..line.len() - 1]),
            Ok(line.len() - 1),
            "the limit itself is allowed"
        );
        assert_eq!(
            d.decode(&line[line.len() - 1..]),
            Err(ChunkedError::ExtensionTooLong)
        );
        assert_eq!(ChunkedError::ExtensionTooLong.status(), Status::BAD_REQUEST);
        // The last chunk's line has the same bound.
        let line = line_with_extension("0", MAX_EXTENSION_BYTES + 1);
        assert_eq!(decode_all(&line, 100), Err(ChunkedError::ExtensionTooLong));
    }

    #[test]
    fn extensions_are_bounded_per_body() {
        // Many short extensions, each well under the per-line limit.
        let line = line_with_extension("1", 1000);
        let mut body = Vec::new();
        let lines = MAX_EXTENSIONS_TOTAL / 1000 + 1;
        for _ in 0..lines {
            body.extend_from_slice(&line);
            body.extend_from_slice(b"\r\na\r\n");
        }
        body.extend_from_slice(b"0\r\n\r\n");
        assert_eq!(
            decode_all(&body, u64::MAX),
            Err(ChunkedError::ExtensionTooLong)
        );
        let fits = lines - 1;
        let mut ok = Vec::new();
        for _ in 0..fits {
            ok.extend_from_slice(&line);
            ok.extend_from_slice(b"\r\na\r\n");
        }
        ok.extend_from_slice(b"0\r\n\r\n");
        assert_eq!(decode_all(&ok, u64::MAX), Ok((ok.len(), true)));
    }

    #[test]
    fn trailer_section_is_bounded_by_max_trailer_bytes() {
        // "X: aaa\r\n" (8 bytes) + final "\r\n": a section of 10 bytes.
        let body = b"0\r\nX: aaa\r\n\r\n";
        let mut d = ChunkedDecoder::new(100, 10);
        assert_eq!(d.decode(body), Ok(body.len()));
        assert!(d.is_done());
        let mut d = ChunkedDecoder::new(100, 9);
        assert_eq!(d.decode(body), Err(ChunkedError::TrailersTooLarge));
        assert_eq!(
            ChunkedError::TrailersTooLarge.status(),
            Status::HEADER_FIELDS_TOO_LARGE
        );
    }

    #[test]
    fn an_endless_trailer_is_refused_at_the_limit() {
        // Issue 10: 64 MiB of trailer fields used to be read to their end.
        let mut d = ChunkedDecoder::new(100, 1024);
        assert_eq!(d.decode(b"0\r\n"), Ok(3));
        let field = b"X-Pad: aaaaaaaaaaaaaaaaaaaaaaa\r\n";
        assert_eq!(field.len(), 32);
        for _ in 0..1024 / field.len() {
            assert_eq!(d.decode(field), Ok(field.len()));
        }
        assert_eq!(d.decode(b"X"), Err(ChunkedError::TrailersTooLarge));
    }

    #[test]
    fn steps_say_where_the_data_is_and_kept_trailers_are_whole() {
        let body = b"5;x=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Sum: 1\r\nY: 2\r\n\r\nNEXT";
        for piece in [1, 3, 7, body.len()] {
            let mut d = ChunkedDecoder::new(100, 1024).keeping_trailers();
            let (mut data, mut at) = (Vec::new(), 0);
            while !d.is_done() {
                let end = body.len().min(at + piece);
                let step = d.step(&body[at..end]).unwrap();
                data.extend_from_slice(&body[at + step.data.start..at + step.data.end]);
                at += step.consumed;
            }
            assert_eq!(data, b"hello world", "pieces of {piece}");
            assert_eq!(&body[at..], b"NEXT", "stops at the body's end");
            assert_eq!(d.trailers(), b"X-Sum: 1\r\nY: 2\r\n");
        }
        // Not kept unless asked.
        let mut d = ChunkedDecoder::new(100, 1024);
        d.decode(b"0\r\nX: 1\r\n\r\n").unwrap();
        assert!(d.is_done() && d.trailers().is_empty());
    }

    #[test]
    fn trailer_lines_must_be_fields() {
        for good in [
            &b"0\r\nX-Sum: 1\r\n\r\n"[..],
            b"0\r\nX:\r\n\r\n",
            b"0\r\nX:v\r\n\r\n",
            b"0\r\nX: a\tb \xe9\r\n\r\n",
            b"0\r\n!#$%&'*+-.^_`|~09az: 1\r\n\r\n",
        ] {
            let mut d = ChunkedDecoder::new(100, TRAILERS).keeping_trailers();
            assert_eq!(d.decode(good), Ok(good.len()), "{good:?}");
            assert!(d.is_done());
            assert_eq!(d.trailers(), &good[3..good.len() - 2], "kept as sent");
        }
        for bad in [
            &b"0\r\n folded: 1\r\n\r\n"[..],
            b"0\r\nX: 1\r\n\tcontinued\r\n\r\n",
            b"0\r\nno colon\r\n\r\n",
            b"0\r\nnocolon\r\n\r\n",
            b"0\r\nX : 1\r\n\r\n",
            b"0\r\n: 1\r\n\r\n",
            b"0\r\nX\0: 1\r\n\r\n",
            b"0\r\nX: a\0b\r\n\r\n",
            b"0\r\nX: \x7f\r\n\r\n",
            b"0\r\nX: \x1b[2J\r\n\r\n",
        ] {
            for keep in [false, true] {
                let mut d = ChunkedDecoder::new(100, TRAILERS);
                if keep {
                    d = d.keeping_trailers();
                }
                assert_eq!(
                    d.decode(bad),
                    Err(ChunkedError::BadTrailer),
                    "{:?}",
                    String::from_utf8_lossy(bad)
                );
            }
        }
        assert_eq!(ChunkedError::BadTrailer.status(), Status::BAD_REQUEST);
        // A bare LF or CR is still a framing error.
        for bad in [&b"0\r\nX: 1\n\r\n"[..], b"0\r\nX: a\rb\r\n\r\n"] {
            assert_eq!(decode_all(bad, 100), Err(ChunkedError::BadFraming));
        }
    }

    #[test]
    fn trailer_fields_are_counted() {
        let mut body = b"0\r\n".to_vec();
        for _ in 0..MAX_HEADERS {
            body.extend_from_slice(b"X: 1\r\n");
        }
        let mut ok = body.clone();
        ok.extend_from_slice(b"\r\n");
        assert_eq!(decode_all(&ok, 100), Ok((ok.len(), true)));
        body.extend_from_slice(b"Y: 2\r\n\r\n");
        assert_eq!(decode_all(&body, 100), Err(ChunkedError::TrailersTooLarge));
    }
}

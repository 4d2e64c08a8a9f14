//! The HTTP/1.1 response a handler (or the proxy) wrote for an HTTP/2 stream, read
//! back as what HTTP/2 sends: a head (status and fields as an HPACK block, names
//! lowercased, connection-specific fields dropped, RFC 9113 §8.2.2), body bytes
//! (de-chunked), trailers (a block too), the end. Sans-io: [`Reader::next`] takes
//! from the front of the bytes written so far.
//!
//! The bytes were made by forkd itself (handlers, or the proxy's checked rewrite of
//! the upstream's head), so a head that does not parse is a bug upstream of here,
//! reported as [`Bad`] and answered with a stream reset.

use super::hpack;
use bytes::{Buf, BytesMut};

/// Fields of a response head read at most.
const MAX_FIELDS: usize = 128;

/// One part of the response, in order.
#[derive(Debug)]
pub enum Part {
    /// A 1xx (`100 Continue`) as a header block: more heads follow.
    Informational(Vec<u8>),
    /// The final head as a header block; `body`: body bytes follow (else the
    /// stream ends with it).
    Head(Vec<u8>, bool),
    /// This many body octets are at the front of the input: the caller takes them
    /// (`advance`) before it asks for the next part.
    Data(usize),
    /// The trailers as a header block.
    Trailers(Vec<u8>),
    /// The body is complete (a length-framed body's last `Data` says so itself:
    /// [`Reader::done`]).
    End,
}

/// The response bytes cannot be read as HTTP/1.1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bad(pub &'static str);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Head,
    Length(u64),
    /// Inside a chunked body: the next chunk's size line, or this many data bytes
    /// left of the current chunk (then its CRLF).
    ChunkSize,
    ChunkData(u64),
    ChunkEnd,
    Trailers,
    /// Until the writer closes (an HTTP/1.0-style body).
    UntilClose,
    Done,
}

#[derive(Debug)]
pub struct Reader {
    state: State,
    /// The request was a HEAD: the head's framing describes a body never sent.
    head_request: bool,
    /// The trailers read so far, as a header block, and how many.
    trailers: Vec<u8>,
    trailer_count: usize,
}

impl Reader {
    pub fn new(head_request: bool) -> Reader {
        Reader {
            state: State::Head,
            head_request,
            trailers: Vec::new(),
            trailer_count: 0,
        }
    }

    /// The body (or the whole response) has been read.
    pub fn done(&self) -> bool {
        self.state == State::Done
    }

    /// The next part from the front of `buf` (consumed), `None` if more bytes are
    /// needed. `closed`: the writer is done (no more bytes will come).
    pub fn next(&mut self, buf: &mut BytesMut, closed: bool) -> Result<Option<Part>, Bad> {
        loop {
            match self.state {
                State::Head => return self.head(buf),
                State::Length(0) => {
                    self.state = State::Done;
                    return Ok(Some(Part::End));
                }
                State::Length(left) => {
                    if buf.is_empty() {
                        return wait_or_cut(closed);
                    }
                    let n = (left as usize).min(buf.len());
                    // The last bytes end the body: [`Reader::done`] says so at once,
                    // so they go out with END_STREAM (no empty DATA frame after).
                    self.state = match left - n as u64 {
                        0 => State::Done,
                        left => State::Length(left),
                    };
                    return Ok(Some(Part::Data(n)));
                }
                State::UntilClose => {
                    if !buf.is_empty() {
                        return Ok(Some(Part::Data(buf.len())));
                    }
                    if closed {
                        self.state = State::Done;
                        return Ok(Some(Part::End));
                    }
                    return Ok(None);
                }
                State::ChunkSize => {
                    let Some(line) = take_line(buf)? else {
                        return wait_or_cut(closed);
                    };
                    let hex = line.split(|&b| b == b';').next().unwrap_or(&[]);
                    let size = std::str::from_utf8(hex)
                        .ok()
                        .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
                        .ok_or(Bad("bad chunk size"))?;
                    self.state = match size {
                        0 => State::Trailers,
                        n => State::ChunkData(n),
                    };
                }
                State::ChunkData(left) => {
                    if buf.is_empty() {
                        return wait_or_cut(closed);
                    }
                    let n = (left as usize).min(buf.len());
                    let left = left - n as u64;
                    self.state = if left == 0 {
                        State::ChunkEnd
                    } else {
                        State::ChunkData(left)
                    };
                    return Ok(Some(Part::Data(n)));
                }
                State::ChunkEnd => {
                    if buf.len() < 2 {
                        return wait_or_cut(closed);
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err(Bad("chunk not followed by CRLF"));
                    }
                    buf.advance(2);
                    self.state = State::ChunkSize;
                }
                State::Trailers => {
                    let Some(line) = take_line(buf)? else {
                        return wait_or_cut(closed);
                    };
                    if line.is_empty() {
                        self.state = State::Done;
                        let trailers = std::mem::take(&mut self.trailers);
                        self.trailer_count = 0;
                        return Ok(Some(if trailers.is_empty() {
                            Part::End
                        } else {
                            Part::Trailers(trailers)
                        }));
                    }
                    let mut split = line.splitn(2, |&b| b == b':');
                    let (Some(name), Some(value)) = (split.next(), split.next()) else {
                        return Err(Bad("bad trailer"));
                    };
                    let value = value.trim_ascii();
                    if !is_token(name) || !is_value(value) {
                        return Err(Bad("bad trailer"));
                    }
                    if self.trailer_count >= MAX_FIELDS {
                        return Err(Bad("too many trailers"));
                    }
                    self.trailer_count += 1;
                    if !super::request::is_connection_specific(name) {
                        hpack::field(&mut self.trailers, name, value);
                    }
                }
                State::Done => return Ok(None),
            }
        }
    }

    fn head(&mut self, buf: &mut BytesMut) -> Result<Option<Part>, Bad> {
        // Uninitialised: a head of a few fields does not pay for clearing 128.
        let mut fields =
            [const { std::mem::MaybeUninit::<httparse::Header>::uninit() }; MAX_FIELDS];
        let mut parsed = httparse::Response::new(&mut []);
        let config = httparse::ParserConfig::default();
        let len = match config.parse_response_with_uninit_headers(&mut parsed, buf, &mut fields) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(_) => return Err(Bad("response head does not parse")),
        };
        let code = parsed.code.ok_or(Bad("no status"))?;
        if !(100..=999).contains(&code) {
            return Err(Bad("bad status"));
        }
        let mut block = Vec::with_capacity(len);
        hpack::status(&mut block, code);
        let mut length = None;
        let mut chunked = false;
        for f in parsed.headers.iter() {
            let name = f.name;
            if name.eq_ignore_ascii_case("content-length") {
                let text = std::str::from_utf8(f.value).map_err(|_| Bad("bad length"))?;
                length = Some(text.trim().parse::<u64>().map_err(|_| Bad("bad length"))?);
            }
            if name.eq_ignore_ascii_case("transfer-encoding") {
                if !f.value.eq_ignore_ascii_case(b"chunked") {
                    return Err(Bad("transfer-encoding other than chunked"));
                }
                chunked = true;
            }
            if super::request::is_connection_specific(name.as_bytes()) {
                continue;
            }
            // httparse took only values HTTP/2 can carry (no control bytes but tab,
            // no DEL: the rule `is_value` applies to trailers, which it does not
            // parse).
            hpack::field(&mut block, name.as_bytes(), f.value);
        }
        buf.advance(len);
        if code < 200 {
            return Ok(Some(Part::Informational(block)));
        }
        let bodiless = self.head_request || code == 204 || code == 304;
        self.state = match (bodiless, chunked, length) {
            (true, _, _) => State::Done,
            (false, true, _) => State::ChunkSize,
            (false, false, Some(0)) => State::Done,
            (false, false, Some(n)) => State::Length(n),
            (false, false, None) => State::UntilClose,
        };
        let body = self.state != State::Done;
        Ok(Some(Part::Head(block, body)))
    }
}

/// More bytes are needed: wait for them, unless the writer is done (cut short).
fn wait_or_cut(closed: bool) -> Result<Option<Part>, Bad> {
    match closed {
        true => Err(Bad("body cut short")),
        false => Ok(None),
    }
}

/// A field name HTTP allows (a token, RFC 9110 §5.6.2), in any case.
fn is_token(name: &[u8]) -> bool {
    !name.is_empty()
        && name
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// A field value HTTP/2 can carry: no controls but tab, no DEL (RFC 9110 §5.5).
fn is_value(value: &[u8]) -> bool {
    super::bytes_check::is_value(value)
}

/// A CRLF-terminated line from the front of `buf` (consumed, without its CRLF).
fn take_line(buf: &mut BytesMut) -> Result<Option<Vec<u8>>, Bad> {
    match buf.windows(2).position(|w| w == b"\r\n") {
        Some(at) => {
            let line = buf.split_to(at).to_vec();
            buf.advance(2);
            Ok(Some(line))
        }
        None if buf.len() > 8192 => Err(Bad("line too long")),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::super::fuzz::config;
    use super::super::hpack::{Decoder, Fields};
    use super::*;
    use proptest::prelude::*;

    /// A block's fields, as (name, value) text.
    fn decoded(block: &[u8]) -> Vec<(String, String)> {
        let mut f = Fields::new();
        Decoder::new().decode(block, usize::MAX, &mut f).unwrap();
        f.iter()
            .map(|(n, v)| {
                let text = |b: &[u8]| String::from_utf8(b.to_vec()).unwrap();
                (text(n), text(v))
            })
            .collect()
    }

    /// A head block's status (its first field) and its other fields' names.
    fn status_and_names(block: &[u8]) -> (String, Vec<String>) {
        let mut fields = decoded(block).into_iter();
        let (name, status) = fields.next().unwrap();
        assert_eq!(name, ":status");
        (status, fields.map(|(n, _)| n).collect())
    }

    /// Every part, feeding `bytes` in pieces of `step`.
    fn parts(bytes: &[u8], step: usize, head_request: bool) -> Vec<String> {
        let mut r = Reader::new(head_request);
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        let mut data = Vec::new();
        let mut fed = 0;
        loop {
            let closed = fed == bytes.len();
            match r.next(&mut buf, closed).unwrap() {
                Some(Part::Data(n)) => {
                    data.extend_from_slice(&buf[..n]);
                    buf.advance(n);
                }
                Some(p) => {
                    if !data.is_empty() {
                        out.push(format!("data {}", String::from_utf8_lossy(&data)));
                        data.clear();
                    }
                    out.push(match p {
                        Part::Informational(b) => format!("info {}", status_and_names(&b).0),
                        Part::Head(b, body) => {
                            let (status, mut names) = status_and_names(&b);
                            names.sort();
                            format!("head {status} {body} {}", names.join(","))
                        }
                        Part::Trailers(t) => format!("trailers {}", decoded(&t).len()),
                        Part::End => "end".into(),
                        Part::Data(_) => unreachable!(),
                    });
                }
                None if closed => break,
                None => {
                    let n = step.min(bytes.len() - fed);
                    buf.extend_from_slice(&bytes[fed..fed + n]);
                    fed += n;
                }
            }
            if r.done() && buf.is_empty() && fed == bytes.len() {
                break;
            }
        }
        if !data.is_empty() {
            out.push(format!("data {}", String::from_utf8_lossy(&data)));
        }
        out
    }

    #[test]
    fn a_length_framed_response_loses_its_connection_fields() {
        let bytes = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\nETag: \"x\"\r\n\r\nhello";
        for step in [1, 3, 7, 1000] {
            assert_eq!(
                parts(bytes, step, false),
                ["head 200 true content-length,etag", "data hello"],
                "step {step}"
            );
        }
    }

    #[test]
    fn a_chunked_body_is_dechunked_and_its_trailers_kept() {
        let bytes = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Checksum: 1\r\n\r\n";
        for step in [1, 4, 1000] {
            assert_eq!(
                parts(bytes, step, false),
                ["head 200 true ", "data hello world", "trailers 1"],
                "step {step}"
            );
        }
    }

    #[test]
    fn heads_and_bodiless_statuses_end_with_the_head() {
        let bytes = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n";
        assert_eq!(parts(bytes, 100, true), ["head 200 false content-length"]);
        let bytes = b"HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\n\r\n";
        assert_eq!(parts(bytes, 100, false), ["head 304 false etag"]);
        let bytes =
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n";
        assert_eq!(
            parts(bytes, 100, false),
            ["info 100", "head 201 false content-length"]
        );
    }

    #[test]
    fn a_body_until_close_ends_when_the_writer_closes() {
        let bytes = b"HTTP/1.1 200 OK\r\n\r\nall of it";
        assert_eq!(
            parts(bytes, 4, false),
            ["head 200 true ", "data all of it", "end"]
        );
    }

    #[test]
    fn a_body_cut_short_is_bad() {
        let mut r = Reader::new(false);
        let mut buf = BytesMut::from(&b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nabc"[..]);
        assert!(matches!(r.next(&mut buf, false), Ok(Some(Part::Head(..)))));
        assert!(matches!(r.next(&mut buf, false), Ok(Some(Part::Data(3)))));
        buf.advance(3);
        assert_eq!(r.next(&mut buf, true).unwrap_err(), Bad("body cut short"));
    }

    #[test]
    fn the_head_block_is_the_status_then_the_fields_lowercased_in_order() {
        let mut r = Reader::new(false);
        let mut buf = BytesMut::from(
            &b"HTTP/1.1 502 Bad Gateway\r\nServer: forkd\r\nSet-Cookie: a=1\r\nUpgrade: h2c\r\nX-Empty:\r\nContent-Length: 0\r\n\r\n"[..],
        );
        let Ok(Some(Part::Head(block, false))) = r.next(&mut buf, false) else {
            panic!("no head")
        };
        assert_eq!(
            decoded(&block),
            [
                (":status", "502"),
                ("server", "forkd"),
                ("set-cookie", "a=1"),
                ("x-empty", ""),
                ("content-length", "0"),
            ]
            .map(|(n, v)| (n.to_string(), v.to_string()))
        );
        assert!(r.done());
    }

    #[test]
    fn trailers_are_a_block_without_connection_fields_and_bad_ones_are_bad() {
        let mut r = Reader::new(false);
        let mut buf = BytesMut::from(
            &b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-Sum:  12 \r\nConnection: close\r\n\r\n"[..],
        );
        assert!(matches!(
            r.next(&mut buf, false),
            Ok(Some(Part::Head(_, true)))
        ));
        let Ok(Some(Part::Trailers(block))) = r.next(&mut buf, false) else {
            panic!("no trailers")
        };
        assert_eq!(decoded(&block), [("x-sum".to_string(), "12".to_string())]);
        for trailer in [&b"X Sum: 1"[..], b": 1", b"x-sum: a\x01b", b"no colon"] {
            let mut r = Reader::new(false);
            let mut buf =
                BytesMut::from(&b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n"[..]);
            buf.extend_from_slice(trailer);
            buf.extend_from_slice(b"\r\n\r\n");
            assert!(r.next(&mut buf, false).is_ok());
            assert_eq!(
                r.next(&mut buf, false).unwrap_err(),
                Bad("bad trailer"),
                "{}",
                String::from_utf8_lossy(trailer)
            );
        }
    }

    proptest! {
        #![proptest_config(config(256))]

        /// An HTTP/1.1 response read back as HEADERS, DATA and trailers gives the
        /// same body and trailers however its bytes arrive.
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

    /// What a response reads as when `bytes` arrive in pieces of `pieces` sizes
    /// (then the writer closes): status, body, whether trailers came, whether it
    /// ended; Err: it could not be read. Every block must decode.
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
                    Some(Part::Informational(b)) => {
                        status_and_names(&b);
                    }
                    Some(Part::Head(b, _)) => status = status_and_names(&b).0.parse().unwrap(),
                    Some(Part::Data(n)) => {
                        data.extend_from_slice(&buf[..n]);
                        buf.advance(n);
                    }
                    Some(Part::Trailers(t)) => {
                        decoded(&t);
                        trailers = true;
                    }
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
}

//! The HTTP/1.1 response a handler (or the proxy) wrote for an HTTP/2 stream, read
//! back as what HTTP/2 sends: a head (status and fields, connection-specific ones
//! dropped, RFC 9113 §8.2.2), body bytes (de-chunked), trailers, the end. Sans-io:
//! [`Reader::next`] takes from the front of the bytes written so far.
//!
//! The bytes were made by forkd itself (handlers, or the proxy's checked rewrite of
//! the upstream's head), so a head that does not parse is a bug upstream of here,
//! reported as [`Bad`] and answered with a stream reset.

use bytes::{Buf, Bytes, BytesMut};
use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Response, StatusCode};

/// Fields of a response head read at most.
const MAX_FIELDS: usize = 128;

/// One part of the response, in order.
#[derive(Debug)]
pub enum Part {
    /// A 1xx (`100 Continue`): more heads follow.
    Informational(Response<()>),
    /// The final head; `body`: body bytes follow (else the stream ends with it).
    Head(Response<()>, bool),
    Data(Bytes),
    Trailers(HeaderMap),
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
    trailers: HeaderMap,
}

impl Reader {
    pub fn new(head_request: bool) -> Reader {
        Reader {
            state: State::Head,
            head_request,
            trailers: HeaderMap::new(),
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
                    return Ok(Some(Part::Data(buf.split_to(n).freeze())));
                }
                State::UntilClose => {
                    if !buf.is_empty() {
                        return Ok(Some(Part::Data(buf.split().freeze())));
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
                    return Ok(Some(Part::Data(buf.split_to(n).freeze())));
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
                    let name = HeaderName::from_bytes(name).map_err(|_| Bad("bad trailer"))?;
                    let value = HeaderValue::from_bytes(value.trim_ascii())
                        .map_err(|_| Bad("bad trailer"))?;
                    if self.trailers.len() >= MAX_FIELDS {
                        return Err(Bad("too many trailers"));
                    }
                    self.trailers.append(name, value);
                }
                State::Done => return Ok(None),
            }
        }
    }

    fn head(&mut self, buf: &mut BytesMut) -> Result<Option<Part>, Bad> {
        let mut fields = [httparse::EMPTY_HEADER; MAX_FIELDS];
        let mut parsed = httparse::Response::new(&mut fields);
        let len = match parsed.parse(buf) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(_) => return Err(Bad("response head does not parse")),
        };
        let code = parsed.code.ok_or(Bad("no status"))?;
        let status = StatusCode::from_u16(code).map_err(|_| Bad("bad status"))?;
        let mut response = Response::new(());
        *response.status_mut() = status;
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
            if is_connection_specific(name) {
                continue;
            }
            let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| Bad("bad field"))?;
            let value = HeaderValue::from_bytes(f.value).map_err(|_| Bad("bad field"))?;
            response.headers_mut().append(name, value);
        }
        buf.advance(len);
        if status.is_informational() {
            return Ok(Some(Part::Informational(response)));
        }
        let bodiless = self.head_request
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::NOT_MODIFIED;
        self.state = match (bodiless, chunked, length) {
            (true, _, _) => State::Done,
            (false, true, _) => State::ChunkSize,
            (false, false, Some(0)) => State::Done,
            (false, false, Some(n)) => State::Length(n),
            (false, false, None) => State::UntilClose,
        };
        let body = self.state != State::Done;
        Ok(Some(Part::Head(response, body)))
    }
}

/// More bytes are needed: wait for them, unless the writer is done (cut short).
fn wait_or_cut(closed: bool) -> Result<Option<Part>, Bad> {
    match closed {
        true => Err(Bad("body cut short")),
        false => Ok(None),
    }
}

/// Fields that mean something only to one HTTP/1.1 connection (RFC 9113 §8.2.2).
fn is_connection_specific(name: &str) -> bool {
    [
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "upgrade",
    ]
    .iter()
    .any(|n| name.eq_ignore_ascii_case(n))
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
    use super::*;

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
                Some(Part::Data(d)) => data.extend_from_slice(&d),
                Some(p) => {
                    if !data.is_empty() {
                        out.push(format!("data {}", String::from_utf8_lossy(&data)));
                        data.clear();
                    }
                    out.push(match p {
                        Part::Informational(r) => format!("info {}", r.status().as_u16()),
                        Part::Head(r, body) => {
                            let mut names: Vec<&str> =
                                r.headers().keys().map(|k| k.as_str()).collect();
                            names.sort();
                            format!("head {} {body} {}", r.status().as_u16(), names.join(","))
                        }
                        Part::Trailers(t) => format!("trailers {}", t.len()),
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
        assert!(matches!(r.next(&mut buf, false), Ok(Some(Part::Data(_)))));
        assert_eq!(r.next(&mut buf, true).unwrap_err(), Bad("body cut short"));
    }
}

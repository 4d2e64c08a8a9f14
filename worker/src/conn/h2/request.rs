//! An HTTP/2 request as the HTTP/1.1 head every handler already reads: one dispatch
//! for both protocols (the `h2` crate has checked the pseudo-headers; the rules of
//! RFC 9113 §8.2–8.3 that are ours are checked here).
//!
//! - `:authority` becomes `Host` (a `host` field beside it must agree);
//! - `cookie` fields, which HTTP/2 may split, are joined with `; ` (§8.2.3);
//! - connection-specific fields are refused (§8.2.2), and `te` other than
//!   `trailers`;
//! - a body without `content-length` is framed `chunked` for the handlers (the
//!   stream's DATA frames are written as chunks), so a proxied upload goes upstream
//!   as HTTP/1.1 would send it.

use http::request::Parts;
use http::HeaderValue;

/// How the stream's DATA frames are framed in the HTTP/1.1 input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// The request ended with its HEADERS.
    None,
    /// `content-length` said how long: DATA goes in as it is.
    Length,
    /// Each DATA frame becomes a chunk, the end of the stream the last chunk.
    Chunked,
}

/// A request HTTP/2 forbids (a stream error PROTOCOL_ERROR, RFC 9113 §8.1.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Malformed {
    /// A connection-specific field (`connection`, `transfer-encoding`, ...).
    ConnectionField(String),
    /// `te` with anything but `trailers`.
    Te,
    /// `host` names another authority than `:authority`.
    HostDisagrees,
    /// No `:path` (a CONNECT request, which forkd does not serve over HTTP/2).
    NoPath,
    /// `content-length` on a request whose HEADERS ended the stream, other than 0.
    LengthWithoutBody,
}

/// Writes the HTTP/1.1 head of `parts` into `out`; `ended`: the HEADERS frame ended
/// the stream (no body).
pub fn head(parts: &Parts, ended: bool, out: &mut Vec<u8>) -> Result<Framing, Malformed> {
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .filter(|p| !p.is_empty())
        .ok_or(Malformed::NoPath)?;
    out.extend_from_slice(parts.method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(path.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let authority = parts.uri.authority().map(|a| a.as_str());
    if let Some(a) = authority {
        field(out, "host", a.as_bytes());
    }
    let mut cookies: Vec<&HeaderValue> = Vec::new();
    let mut length = None;
    for (name, value) in &parts.headers {
        match name.as_str() {
            "connection" | "keep-alive" | "proxy-connection" | "transfer-encoding" | "upgrade" => {
                return Err(Malformed::ConnectionField(name.to_string()))
            }
            "te" if !value.as_bytes().eq_ignore_ascii_case(b"trailers") => {
                return Err(Malformed::Te)
            }
            "host" => match authority {
                Some(a) if !a.as_bytes().eq_ignore_ascii_case(value.as_bytes()) => {
                    return Err(Malformed::HostDisagrees)
                }
                Some(_) => {}
                None => field(out, "host", value.as_bytes()),
            },
            "cookie" => cookies.push(value),
            "content-length" => {
                length = Some(value.as_bytes());
                field(out, "content-length", value.as_bytes());
            }
            other => field(out, other, value.as_bytes()),
        }
    }
    if !cookies.is_empty() {
        out.extend_from_slice(b"cookie: ");
        for (i, c) in cookies.iter().enumerate() {
            if i > 0 {
                out.extend_from_slice(b"; ");
            }
            out.extend_from_slice(c.as_bytes());
        }
        out.extend_from_slice(b"\r\n");
    }
    let framing = match (ended, length) {
        (true, Some(l)) if l != b"0" => return Err(Malformed::LengthWithoutBody),
        (true, _) => Framing::None,
        (false, Some(_)) => Framing::Length,
        (false, None) => {
            out.extend_from_slice(b"transfer-encoding: chunked\r\n");
            Framing::Chunked
        }
    };
    out.extend_from_slice(b"\r\n");
    Ok(framing)
}

fn field(out: &mut Vec<u8>, name: &str, value: &[u8]) {
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Writes `data` as one chunk of a chunked body into `out`.
pub fn chunk(out: &mut Vec<u8>, data: &[u8]) {
    use std::io::Write;
    let _ = write!(out, "{:x}\r\n", data.len());
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// The end of a chunked body.
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(build: http::request::Builder) -> Parts {
        build.body(()).unwrap().into_parts().0
    }

    fn text(p: &Parts, ended: bool) -> Result<(String, Framing), Malformed> {
        let mut out = Vec::new();
        let f = head(p, ended, &mut out)?;
        Ok((String::from_utf8(out).unwrap(), f))
    }

    #[test]
    fn a_get_becomes_the_head_http11_would_send() {
        let p = parts(
            http::Request::get("https://example.com/a/b?x=1")
                .header("accept", "*/*")
                .header("cookie", "a=1")
                .header("cookie", "b=2"),
        );
        assert_eq!(
            text(&p, true).unwrap(),
            (
                "GET /a/b?x=1 HTTP/1.1\r\nhost: example.com\r\naccept: */*\r\ncookie: a=1; b=2\r\n\r\n"
                    .into(),
                Framing::None
            )
        );
    }

    #[test]
    fn a_body_without_length_is_chunked_and_one_with_it_is_not() {
        let p = parts(http::Request::post("http://h/up"));
        let (t, f) = text(&p, false).unwrap();
        assert!(t.ends_with("transfer-encoding: chunked\r\n\r\n"), "{t}");
        assert_eq!(f, Framing::Chunked);
        let p = parts(http::Request::post("http://h/up").header("content-length", "5"));
        let (t, f) = text(&p, false).unwrap();
        assert!(t.contains("content-length: 5\r\n") && !t.contains("chunked"));
        assert_eq!(f, Framing::Length);
        let mut body = Vec::new();
        chunk(&mut body, b"hello world, 17 b");
        body.extend_from_slice(LAST_CHUNK);
        assert_eq!(body, b"11\r\nhello world, 17 b\r\n0\r\n\r\n");
    }

    #[test]
    fn connection_specific_fields_and_te_other_than_trailers_are_malformed() {
        for (name, value) in [
            ("connection", "keep-alive"),
            ("keep-alive", "5"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("proxy-connection", "x"),
        ] {
            let p = parts(http::Request::get("http://h/").header(name, value));
            assert_eq!(text(&p, true), Err(Malformed::ConnectionField(name.into())));
        }
        let p = parts(http::Request::get("http://h/").header("te", "gzip"));
        assert_eq!(text(&p, true), Err(Malformed::Te));
        let p = parts(http::Request::get("http://h/").header("te", "trailers"));
        assert!(text(&p, true).is_ok());
    }

    #[test]
    fn host_must_agree_with_authority_and_serves_without_it() {
        let p = parts(http::Request::get("http://a.example/").header("host", "b.example"));
        assert_eq!(text(&p, true), Err(Malformed::HostDisagrees));
        let p = parts(http::Request::get("/x").header("host", "b.example"));
        let (t, _) = text(&p, true).unwrap();
        assert_eq!(t, "GET /x HTTP/1.1\r\nhost: b.example\r\n\r\n");
        let p = parts(http::Request::get("http://h/").header("content-length", "3"));
        assert_eq!(text(&p, true), Err(Malformed::LengthWithoutBody));
    }
}

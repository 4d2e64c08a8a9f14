//! The upstream's response head: parsed (httparse), framed per RFC 9112 §6.3, and
//! re-serialised for the client.
//!
//! Framing, in the RFC's order:
//!
//! | upstream response | upstream body | to a 1.1 client | to a 1.0 client |
//! |---|---|---|---|
//! | to HEAD, 1xx, 204, 304 | none | none | none |
//! | `Transfer-Encoding` and `Content-Length` | 502, connection closed | | |
//! | `Transfer-Encoding: chunked` | chunked | chunked | until close |
//! | other transfer codings | 502, connection closed | | |
//! | valid `Content-Length` | that length | that length | that length |
//! | invalid `Content-Length` | 502, connection closed | | |
//! | neither | until close (not reusable) | chunked | until close |
//!
//! 1xx other than 101 are forwarded to a 1.1 client (RFC 9110 §15.2: never to a 1.0
//! one) and parsing goes on with the next head. A 101 is final when the request asked
//! for an upgrade forkd forwarded (`ResponseContext::upgrade`; its head carries the
//! upstream's `Upgrade` and `Connection: upgrade`, see `upgrade.rs`), else a 502.
//! Hop-by-hop fields and those `Connection` names are dropped.
//!
//! A `Location` or `Refresh` URL naming the upstream is rewritten for the client
//! ([`Redirects`], nginx's `proxy_redirect default`): an absolute `http://` URL
//! (the scheme forkd speaks to the upstream in) whose authority is one of the
//! upstream's servers as written or the `Host` forkd sent gets the client's scheme
//! and host instead; then, when the route's `path` is
//! `LITERAL{path}`, a path starting with that literal gets the route's prefix in its
//! place. Relative URLs and other hosts are left as they are.

use super::{is_hop_by_hop, parse_decimal, push_decimal, trim, ConnectionTokens};

/// How many fields an upstream response head may have.
pub const MAX_FIELDS: usize = 100;

/// What the proxy knows about the exchange when the head arrives.
#[derive(Debug, Clone, Copy)]
pub struct ResponseContext {
    /// The client's method was HEAD.
    pub head_request: bool,
    /// The client speaks HTTP/1.0.
    pub client_http10: bool,
    /// The client connection may stay open after this response (as `conn` decided
    /// from the request, the server's keep-alive settings and draining).
    pub client_keep_alive: bool,
    /// Requests sent on this upstream connection so far, this one included.
    pub upstream_requests: u64,
    /// The upstream's `keepalive_requests`.
    pub keepalive_requests: u64,
    /// The largest head accepted (more is a 502).
    pub max_head: usize,
    /// The request asked for an upgrade the route allows (`upgrade::requested`): a
    /// 101 is forwarded and the connection becomes a tunnel; otherwise a 101 is a 502.
    pub upgrade: bool,
}

/// What a redirect naming the upstream is rewritten to, for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redirects {
    /// `scheme://host[:port]` as the client reached forkd (what replaces a matching
    /// scheme and authority), the authorities that name the upstream (each followed
    /// by a space), then the upstream path's literal start and the route prefix that
    /// takes its place: one allocation per exchange, moved from attempt to attempt.
    buf: Box<[u8]>,
    origin_end: usize,
    names_end: usize,
    /// Where the path map's `from` ends and `to` begins; None: no path map.
    from_end: Option<usize>,
}

impl Redirects {
    /// `https`: the client spoke TLS; `client_host` the host it named (port
    /// included); `upstream` the authorities naming the upstream (its servers as
    /// written, the `Host` sent); `paths` the upstream path's literal start and the
    /// route prefix it maps back to.
    pub fn new<'a>(
        https: bool,
        client_host: &[u8],
        upstream: impl IntoIterator<Item = &'a [u8]> + Clone,
        paths: Option<(&[u8], &[u8])>,
    ) -> Redirects {
        let scheme: &[u8] = if https { b"https://" } else { b"http://" };
        let names: usize = upstream.clone().into_iter().map(|n| n.len() + 1).sum();
        let path_len = paths.map_or(0, |(from, to)| from.len() + to.len());
        // Exactly sized: `into_boxed_slice` keeps the one allocation.
        let mut buf = Vec::with_capacity(scheme.len() + client_host.len() + names + path_len);
        buf.extend_from_slice(scheme);
        buf.extend_from_slice(client_host);
        let origin_end = buf.len();
        for name in upstream {
            buf.extend_from_slice(name);
            buf.push(b' ');
        }
        let names_end = buf.len();
        let from_end = paths.map(|(from, to)| {
            buf.extend_from_slice(from);
            let end = buf.len();
            buf.extend_from_slice(to);
            end
        });
        Redirects {
            buf: buf.into_boxed_slice(),
            origin_end,
            names_end,
            from_end,
        }
    }

    fn origin(&self) -> &[u8] {
        &self.buf[..self.origin_end]
    }

    fn upstream(&self) -> &[u8] {
        &self.buf[self.origin_end..self.names_end]
    }

    /// The path map: the upstream path's literal start and the prefix for it.
    fn paths(&self) -> Option<(&[u8], &[u8])> {
        self.from_end
            .map(|end| (&self.buf[self.names_end..end], &self.buf[end..]))
    }

    /// `url` rewritten for the client when it names the upstream; None otherwise.
    fn rewrite(&self, url: &[u8]) -> Option<Vec<u8>> {
        // Only `http://`, the scheme forkd speaks to the upstream in: an application
        // sending a client to `https://` on purpose (forcing TLS) keeps its redirect.
        if !starts_with_ci(url, b"http://") {
            return None;
        }
        let rest = &url[7..];
        let end = rest
            .iter()
            .position(|b| b"/?#".contains(b))
            .unwrap_or(rest.len());
        let authority = without_suffix(&rest[..end], b":80");
        let names = self
            .upstream()
            .split(|&b| b == b' ')
            .filter(|n| !n.is_empty());
        if !names
            .map(|n| without_suffix(n, b":80"))
            .any(|n| n.eq_ignore_ascii_case(authority))
        {
            return None;
        }
        let mut tail = &rest[end..];
        let mut out = Vec::with_capacity(self.origin().len() + tail.len());
        out.extend_from_slice(self.origin());
        if let Some((from, to)) = self.paths() {
            if let Some(after) = tail.strip_prefix(from) {
                out.extend_from_slice(to);
                tail = after;
            }
        }
        out.extend_from_slice(tail);
        Some(out)
    }

    /// A `Refresh` value (`5; url=http://...`) with its URL rewritten, if it names
    /// the upstream.
    fn rewrite_refresh(&self, value: &[u8]) -> Option<Vec<u8>> {
        let at = value
            .windows(4)
            .position(|w| w.eq_ignore_ascii_case(b"url="))?
            + 4;
        let quoted = matches!(value.get(at), Some(b'"' | b'\''));
        let start = at + usize::from(quoted);
        let end = match quoted {
            true => value[start..]
                .iter()
                .position(|&b| b == value[at])
                .map_or(value.len(), |i| start + i),
            false => value.len(),
        };
        let url = self.rewrite(&value[start..end])?;
        let mut out = Vec::with_capacity(value.len() + url.len());
        out.extend_from_slice(&value[..start]);
        out.extend_from_slice(&url);
        out.extend_from_slice(&value[end..]);
        Some(out)
    }
}

fn starts_with_ci(s: &[u8], prefix: &[u8]) -> bool {
    s.len() >= prefix.len() && s[..prefix.len()].eq_ignore_ascii_case(prefix)
}

fn without_suffix<'a>(s: &'a [u8], suffix: &[u8]) -> &'a [u8] {
    s.strip_suffix(suffix).unwrap_or(s)
}

/// How the body is read from the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamBody {
    None,
    Length(u64),
    Chunked,
    UntilClose,
}

/// How the body is sent to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientBody {
    None,
    Length(u64),
    Chunked,
    /// Close-delimited: the client connection closes at the end.
    UntilClose,
}

/// A final (non-1xx) response head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseHead {
    pub status: u16,
    /// Upstream bytes the head took; the body starts after them.
    pub head_len: usize,
    pub upstream_body: UpstreamBody,
    pub client_body: ClientBody,
    /// The upstream connection may be pooled once the body has been read whole.
    pub upstream_reusable: bool,
    /// The client connection closes after this response.
    pub client_close: bool,
    /// What the response says of buffering: `X-Accel-Buffering: yes` / `no`
    /// (nginx's convention; the field is not forwarded), and `no` for a
    /// `text/event-stream` body, which is never held back. `None`: the route decides.
    pub buffering: Option<bool>,
}

/// One head read from the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parsed {
    /// A 1xx other than 101, `head_len` bytes; `forwarded` says whether it was written
    /// to the output (not for a 1.0 client). The next head follows.
    Interim {
        head_len: usize,
        forwarded: bool,
    },
    Final(ResponseHead),
}

/// An upstream response that cannot be forwarded: the client gets a 502 and the
/// upstream connection is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseError {
    /// httparse rejected it (the reason, for the error log).
    Malformed(&'static str),
    /// The head is larger than `max_head` or has too many fields.
    TooLarge,
    /// Both `Transfer-Encoding` and `Content-Length` (a smuggling attempt or a bug).
    LengthAndChunked,
    /// A `Content-Length` that is not one decimal number.
    InvalidLength,
    /// A transfer coding other than a final `chunked`.
    UnsupportedCoding,
    /// 101 without forkd having asked for an upgrade.
    UnexpectedSwitch,
    /// 101 to an upgrade request, without the `Upgrade` field naming the protocol.
    SwitchWithoutUpgrade,
}

impl ResponseError {
    /// A short reason for the error log.
    pub fn reason(self) -> &'static str {
        match self {
            ResponseError::Malformed(why) => why,
            ResponseError::TooLarge => "response head too large",
            ResponseError::LengthAndChunked => "both Transfer-Encoding and Content-Length",
            ResponseError::InvalidLength => "invalid Content-Length",
            ResponseError::UnsupportedCoding => "unsupported transfer coding",
            ResponseError::UnexpectedSwitch => "101 Switching Protocols without Upgrade",
            ResponseError::SwitchWithoutUpgrade => "101 Switching Protocols naming no protocol",
        }
    }
}

/// Parses the head at the start of `buf`; for a final or forwarded interim head,
/// appends the client's head to `out`. `Ok(None)`: not complete yet (nothing written).
pub fn parse(
    buf: &[u8],
    ctx: &ResponseContext,
    out: &mut Vec<u8>,
) -> Result<Option<Parsed>, ResponseError> {
    parse_with(buf, ctx, None, out)
}

/// [`parse`], rewriting a final head's `Location` and `Refresh` with `redirects`.
pub fn parse_with(
    buf: &[u8],
    ctx: &ResponseContext,
    redirects: Option<&Redirects>,
    out: &mut Vec<u8>,
) -> Result<Option<Parsed>, ResponseError> {
    // Uninitialised: zeroing a hundred slots costs more than parsing a dozen fields.
    let mut fields = [const { std::mem::MaybeUninit::<httparse::Header>::uninit() }; MAX_FIELDS];
    let mut resp = httparse::Response::new(&mut []);
    let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut resp,
        buf,
        &mut fields,
    );
    let head_len = match parsed {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() >= ctx.max_head => {
            return Err(ResponseError::TooLarge)
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(ResponseError::TooLarge),
        Err(e) => return Err(ResponseError::Malformed(malformed_reason(e))),
    };
    if head_len > ctx.max_head {
        return Err(ResponseError::TooLarge);
    }
    // The head written is the head read, less hop-by-hop fields, plus at most a
    // framing field and `Connection`: one allocation instead of one per doubling.
    out.reserve(head_len + HEAD_ADDED);
    let status = resp.code.unwrap_or(0);
    let reason = resp.reason.unwrap_or("");
    let http10 = resp.version == Some(0);
    let headers: &[httparse::Header] = resp.headers;
    let tokens = ConnectionTokens::of(headers);

    if status == 101 {
        if !ctx.upgrade {
            return Err(ResponseError::UnexpectedSwitch);
        }
        write_status_line(out, status, reason);
        write_end_to_end(out, headers, tokens, true);
        super::upgrade::write_switch_fields(out, headers)
            .ok_or(ResponseError::SwitchWithoutUpgrade)?;
        out.extend_from_slice(b"\r\n");
        return Ok(Some(Parsed::Final(ResponseHead {
            status,
            head_len,
            upstream_body: UpstreamBody::None,
            client_body: ClientBody::None,
            upstream_reusable: false,
            client_close: true,
            buffering: Some(false),
        })));
    }
    if (100..200).contains(&status) {
        let forwarded = !ctx.client_http10;
        if forwarded {
            write_status_line(out, status, reason);
            write_end_to_end(out, headers, tokens, true);
            out.extend_from_slice(b"\r\n");
        }
        return Ok(Some(Parsed::Interim {
            head_len,
            forwarded,
        }));
    }

    let framing = framing_fields(headers)?;
    let no_body = ctx.head_request || status == 204 || status == 304;
    let upstream_body = match framing {
        _ if no_body => UpstreamBody::None,
        Framing { chunked: true, .. } => UpstreamBody::Chunked,
        Framing {
            length: Some(n), ..
        } => UpstreamBody::Length(n),
        Framing { .. } => UpstreamBody::UntilClose,
    };
    let client_body = match upstream_body {
        UpstreamBody::None => ClientBody::None,
        UpstreamBody::Length(n) => ClientBody::Length(n),
        UpstreamBody::Chunked | UpstreamBody::UntilClose if ctx.client_http10 => {
            ClientBody::UntilClose
        }
        UpstreamBody::Chunked | UpstreamBody::UntilClose => ClientBody::Chunked,
    };
    let upstream_close = http10 || tokens.contains(b"close");
    let upstream_reusable = !upstream_close
        && upstream_body != UpstreamBody::UntilClose
        && ctx.upstream_requests < ctx.keepalive_requests;
    let client_close = !ctx.client_keep_alive || client_body == ClientBody::UntilClose;

    write_status_line(out, status, reason);
    // A HEAD or 304 response's Content-Length describes the representation: keep it.
    let keep_length = no_body && status != 204;
    write_end_to_end_with(out, headers, tokens, !keep_length, redirects);
    match client_body {
        ClientBody::Length(n) => {
            out.extend_from_slice(b"Content-Length: ");
            push_decimal(out, n);
            out.extend_from_slice(b"\r\n");
        }
        ClientBody::Chunked => out.extend_from_slice(b"Transfer-Encoding: chunked\r\n"),
        ClientBody::None | ClientBody::UntilClose => {}
    }
    if client_close {
        out.extend_from_slice(b"Connection: close\r\n");
    } else if ctx.client_http10 {
        out.extend_from_slice(b"Connection: keep-alive\r\n");
    }
    out.extend_from_slice(b"\r\n");
    Ok(Some(Parsed::Final(ResponseHead {
        status,
        head_len,
        upstream_body,
        client_body,
        upstream_reusable,
        client_close,
        buffering: buffering_of(headers),
    })))
}

/// `X-Accel-Buffering` and a `text/event-stream` `Content-Type`, see
/// [`ResponseHead::buffering`].
fn buffering_of(headers: &[httparse::Header]) -> Option<bool> {
    let mut said = None;
    for h in headers {
        if h.name.eq_ignore_ascii_case(ACCEL_BUFFERING) {
            let v = trim(h.value);
            if v.eq_ignore_ascii_case(b"no") {
                said = Some(false);
            } else if v.eq_ignore_ascii_case(b"yes") {
                said = said.or(Some(true));
            }
        } else if h.name.eq_ignore_ascii_case("content-type") {
            let v = trim(h.value);
            let essence = v.split(|&b| b == b';').next().map_or(&b""[..], trim);
            if essence.eq_ignore_ascii_case(b"text/event-stream") {
                return Some(false);
            }
        }
    }
    said
}

/// The response field an application sets to say whether its response may be held
/// back (nginx's); it is for forkd, not forwarded.
const ACCEL_BUFFERING: &str = "x-accel-buffering";

/// The framing fields of a response, checked.
struct Framing {
    chunked: bool,
    length: Option<u64>,
}

fn framing_fields(headers: &[httparse::Header]) -> Result<Framing, ResponseError> {
    let mut length: Option<u64> = None;
    let mut coding_seen = false;
    let mut chunked = false;
    for h in headers {
        if h.name.eq_ignore_ascii_case("content-length") {
            for item in h.value.split(|&b| b == b',').map(trim) {
                let n = parse_decimal(item).ok_or(ResponseError::InvalidLength)?;
                if length.is_some_and(|prev| prev != n) {
                    return Err(ResponseError::InvalidLength);
                }
                length = Some(n);
            }
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            for coding in h.value.split(|&b| b == b',').map(trim) {
                if coding.is_empty() {
                    continue;
                }
                // `chunked` must be the only and final coding; others are not decoded.
                if chunked || !coding.eq_ignore_ascii_case(b"chunked") {
                    return Err(ResponseError::UnsupportedCoding);
                }
                chunked = true;
            }
            coding_seen = true;
        }
    }
    if coding_seen && length.is_some() {
        return Err(ResponseError::LengthAndChunked);
    }
    if coding_seen && !chunked {
        return Err(ResponseError::UnsupportedCoding);
    }
    Ok(Framing { chunked, length })
}

/// What a forwarded head may gain over the upstream's: `Content-Length: ` and 20
/// digits, or `Transfer-Encoding: chunked`, and `Connection: keep-alive` (each with
/// CRLF).
const HEAD_ADDED: usize = 80;

fn write_status_line(out: &mut Vec<u8>, status: u16, reason: &str) {
    out.extend_from_slice(b"HTTP/1.1 ");
    push_decimal(out, u64::from(status));
    out.push(b' ');
    out.extend_from_slice(reason.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Writes the fields that are not hop-by-hop, not named by `Connection`, and not
/// framing (`Content-Length` too unless `drop_length` is false).
fn write_end_to_end(
    out: &mut Vec<u8>,
    headers: &[httparse::Header],
    tokens: ConnectionTokens,
    drop_length: bool,
) {
    write_end_to_end_with(out, headers, tokens, drop_length, None);
}

/// [`write_end_to_end`], with `Location` and `Refresh` rewritten by `redirects`.
fn write_end_to_end_with(
    out: &mut Vec<u8>,
    headers: &[httparse::Header],
    tokens: ConnectionTokens,
    drop_length: bool,
    redirects: Option<&Redirects>,
) {
    for h in headers {
        let name = h.name.as_bytes();
        if is_hop_by_hop(name)
            || tokens.contains(name)
            || (drop_length && name.eq_ignore_ascii_case(b"content-length"))
            || name.eq_ignore_ascii_case(ACCEL_BUFFERING.as_bytes())
        {
            continue;
        }
        out.extend_from_slice(name);
        out.extend_from_slice(b": ");
        let value = trim(h.value);
        let rewritten = redirects.and_then(|r| {
            if name.eq_ignore_ascii_case(b"location") {
                r.rewrite(value)
            } else if name.eq_ignore_ascii_case(b"refresh") {
                r.rewrite_refresh(value)
            } else {
                None
            }
        });
        out.extend_from_slice(rewritten.as_deref().unwrap_or(value));
        out.extend_from_slice(b"\r\n");
    }
}

fn malformed_reason(e: httparse::Error) -> &'static str {
    match e {
        httparse::Error::Status => "invalid status line",
        httparse::Error::Version => "not an HTTP/1.x response",
        httparse::Error::HeaderName => "invalid header name",
        httparse::Error::HeaderValue => "invalid header value",
        httparse::Error::NewLine => "invalid line ending",
        httparse::Error::Token => "invalid token",
        httparse::Error::TooManyHeaders => "too many header fields",
    }
}

/// For the proxy's unit tests: a keep-alive HTTP/1.1 client's GET, the first request
/// on its upstream connection, no upgrade.
#[cfg(test)]
pub const TEST_CONTEXT: ResponseContext = ResponseContext {
    head_request: false,
    client_http10: false,
    client_keep_alive: true,
    upstream_requests: 1,
    keepalive_requests: 100,
    max_head: 4096,
    upgrade: false,
};

#[cfg(test)]
mod tests {
    use super::*;

    const CTX: ResponseContext = TEST_CONTEXT;

    fn final_head(raw: &str, ctx: &ResponseContext) -> (ResponseHead, String) {
        let mut out = Vec::new();
        match parse(raw.as_bytes(), ctx, &mut out) {
            Ok(Some(Parsed::Final(h))) => (h, String::from_utf8(out).unwrap()),
            other => panic!("{raw:?}: {other:?}"),
        }
    }

    #[test]
    fn content_length_is_kept_and_the_connection_reusable() {
        let raw = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-App: 1\r\n\r\nhello";
        let (h, out) = final_head(raw, &CTX);
        assert_eq!(
            out,
            "HTTP/1.1 200 OK\r\nX-App: 1\r\nContent-Length: 5\r\n\r\n"
        );
        assert_eq!(h.head_len, raw.len() - 5);
        assert_eq!(h.upstream_body, UpstreamBody::Length(5));
        assert_eq!(h.client_body, ClientBody::Length(5));
        assert!(h.upstream_reusable && !h.client_close);
    }

    #[test]
    fn chunked_goes_chunked_to_11_and_close_delimited_to_10() {
        let raw = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
        let (h, out) = final_head(raw, &CTX);
        assert_eq!(out, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
        assert_eq!(
            (h.upstream_body, h.client_body),
            (UpstreamBody::Chunked, ClientBody::Chunked)
        );
        let ctx10 = ResponseContext {
            client_http10: true,
            ..CTX
        };
        let (h, out) = final_head(raw, &ctx10);
        assert_eq!(out, "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n");
        assert_eq!(h.client_body, ClientBody::UntilClose);
        assert!(h.client_close && h.upstream_reusable);
    }

    #[test]
    fn close_delimited_is_chunked_to_11_and_never_reused() {
        let raw = "HTTP/1.0 200 OK\r\nServer: SimpleHTTP/0.6\r\n\r\n";
        let (h, out) = final_head(raw, &CTX);
        assert_eq!(
            out,
            "HTTP/1.1 200 OK\r\nServer: SimpleHTTP/0.6\r\nTransfer-Encoding: chunked\r\n\r\n"
        );
        assert_eq!(
            (h.upstream_body, h.client_body),
            (UpstreamBody::UntilClose, ClientBody::Chunked)
        );
        assert!(!h.upstream_reusable && !h.client_close);
        let ctx10 = ResponseContext {
            client_http10: true,
            ..CTX
        };
        let (h, out) = final_head(raw, &ctx10);
        assert_eq!(
            out,
            "HTTP/1.1 200 OK\r\nServer: SimpleHTTP/0.6\r\nConnection: close\r\n\r\n"
        );
        assert_eq!(h.client_body, ClientBody::UntilClose);
    }

    #[test]
    fn head_204_304_have_no_body() {
        let ctx = ResponseContext {
            head_request: true,
            ..CTX
        };
        let (h, out) = final_head("HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n", &ctx);
        assert_eq!(h.upstream_body, UpstreamBody::None);
        assert_eq!(
            out, "HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n",
            "HEAD keeps the length"
        );
        let (h, out) = final_head("HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\n\r\n", &CTX);
        assert_eq!(
            (h.upstream_body, h.client_body),
            (UpstreamBody::None, ClientBody::None)
        );
        assert_eq!(out, "HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\n\r\n");
        let (h, out) = final_head("HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n", &CTX);
        assert_eq!(h.upstream_body, UpstreamBody::None);
        assert_eq!(out, "HTTP/1.1 204 No Content\r\n\r\n");
        assert!(h.upstream_reusable);
    }

    #[test]
    fn both_framings_or_a_bad_length_are_refused() {
        let mut out = Vec::new();
        for (raw, want) in [
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
                ResponseError::LengthAndChunked,
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
                ResponseError::InvalidLength,
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
                ResponseError::InvalidLength,
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 0x10\r\n\r\n",
                ResponseError::InvalidLength,
            ),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
                ResponseError::UnsupportedCoding,
            ),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
                ResponseError::UnsupportedCoding,
            ),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: ,\r\n\r\n",
                ResponseError::UnsupportedCoding,
            ),
            (
                "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n",
                ResponseError::UnexpectedSwitch,
            ),
        ] {
            assert_eq!(parse(raw.as_bytes(), &CTX, &mut out), Err(want), "{raw:?}");
        }
        assert!(out.is_empty(), "nothing is written for a refused head");
        assert!(matches!(
            parse(b"garbage\r\n\r\n", &CTX, &mut out),
            Err(ResponseError::Malformed(_))
        ));
        let same = "HTTP/1.1 200 OK\r\nContent-Length: 3, 3\r\n\r\n";
        assert_eq!(
            final_head(same, &CTX).0.upstream_body,
            UpstreamBody::Length(3)
        );
    }

    #[test]
    fn interim_responses_are_forwarded_to_11_clients_only() {
        let raw =
            b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\n";
        let n = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        let mut out = Vec::new();
        let got = parse(raw, &CTX, &mut out).unwrap().unwrap();
        assert_eq!(
            got,
            Parsed::Interim {
                head_len: n,
                forwarded: true
            }
        );
        assert_eq!(out, &raw[..n]);
        out.clear();
        let ctx10 = ResponseContext {
            client_http10: true,
            ..CTX
        };
        let got = parse(raw, &ctx10, &mut out).unwrap().unwrap();
        assert_eq!(
            got,
            Parsed::Interim {
                head_len: n,
                forwarded: false
            }
        );
        assert!(out.is_empty());
    }

    #[test]
    fn hop_by_hop_response_fields_are_dropped_and_close_is_not_reused() {
        let raw = "HTTP/1.1 200 OK\r\nConnection: close, X-Internal\r\nX-Internal: 1\r\n\
                   Keep-Alive: timeout=5\r\nUpgrade: h2c\r\nContent-Length: 0\r\n\r\n";
        let (h, out) = final_head(raw, &CTX);
        assert_eq!(out, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
        assert!(!h.upstream_reusable);
        assert!(!h.client_close, "the upstream's close is not the client's");
    }

    #[test]
    fn x_accel_buffering_and_event_streams_say_whether_to_buffer_and_the_field_is_dropped() {
        let raw = "HTTP/1.1 200 OK\r\nX-Accel-Buffering: no\r\nContent-Length: 0\r\n\r\n";
        let (h, out) = final_head(raw, &CTX);
        assert_eq!(h.buffering, Some(false));
        assert_eq!(out, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
        let yes = "HTTP/1.1 200 OK\r\nx-accel-buffering:  YES \r\nContent-Length: 0\r\n\r\n";
        assert_eq!(final_head(yes, &CTX).0.buffering, Some(true));
        let sse = "HTTP/1.1 200 OK\r\nContent-Type: Text/Event-Stream; charset=utf-8\r\n\
                   X-Accel-Buffering: yes\r\n\r\n";
        let (h, out) = final_head(sse, &CTX);
        assert_eq!(
            h.buffering,
            Some(false),
            "an event stream is never held back"
        );
        assert!(out.contains("Content-Type: Text/Event-Stream"), "{out}");
        let plain = "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 0\r\n\r\n";
        assert_eq!(
            final_head(plain, &CTX).0.buffering,
            None,
            "the route decides"
        );
    }

    #[test]
    fn keepalive_requests_and_http10_retire_the_connection() {
        let raw = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
        let last = ResponseContext {
            upstream_requests: 100,
            ..CTX
        };
        assert!(!final_head(raw, &last).0.upstream_reusable);
        let raw10 = "HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n";
        assert!(!final_head(raw10, &CTX).0.upstream_reusable);
    }

    #[test]
    fn connection_header_follows_the_client_side() {
        let raw = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
        let closing = ResponseContext {
            client_keep_alive: false,
            ..CTX
        };
        let (h, out) = final_head(raw, &closing);
        assert!(
            h.client_close && out.ends_with("Connection: close\r\n\r\n"),
            "{out}"
        );
        let ka10 = ResponseContext {
            client_http10: true,
            ..CTX
        };
        let (_, out) = final_head(raw, &ka10);
        assert!(out.ends_with("Connection: keep-alive\r\n\r\n"), "{out}");
    }

    fn redirected(raw: &str, r: &Redirects) -> String {
        let mut out = Vec::new();
        match parse_with(raw.as_bytes(), &CTX, Some(r), &mut out) {
            Ok(Some(Parsed::Final(_))) => String::from_utf8(out).unwrap(),
            other => panic!("{raw:?}: {other:?}"),
        }
    }

    #[test]
    fn a_location_naming_the_upstream_gets_the_clients_scheme_host_and_prefix() {
        let r = Redirects::new(
            true,
            b"shop.example:8443",
            [&b"127.0.0.1:9000"[..], b"app.internal:80", b"backend"],
            Some((b"/v1/", b"/api/")),
        );
        for (location, want) in [
            (
                "http://127.0.0.1:9000/v1/login?next=%2F",
                "https://shop.example:8443/api/login?next=%2F",
            ),
            ("HTTP://APP.internal/v1/", "https://shop.example:8443/api/"),
            (
                "http://app.internal:80/other",
                "https://shop.example:8443/other",
            ),
            ("http://backend#top", "https://shop.example:8443#top"),
            // An application forcing TLS on purpose keeps its redirect.
            ("https://backend/v1/x", "https://backend/v1/x"),
            // Not the upstream, not absolute, or another port: as sent.
            ("http://127.0.0.1:9001/v1/x", "http://127.0.0.1:9001/v1/x"),
            ("http://evil.example/v1/x", "http://evil.example/v1/x"),
            ("/v1/relative", "/v1/relative"),
            ("//127.0.0.1:9000/v1/x", "//127.0.0.1:9000/v1/x"),
            (
                "http://127.0.0.1:9000.evil/x",
                "http://127.0.0.1:9000.evil/x",
            ),
        ] {
            let raw =
                format!("HTTP/1.1 302 Found\r\nLocation: {location}\r\nContent-Length: 0\r\n\r\n");
            assert_eq!(
                redirected(&raw, &r),
                format!("HTTP/1.1 302 Found\r\nLocation: {want}\r\nContent-Length: 0\r\n\r\n"),
                "{location}"
            );
        }
    }

    #[test]
    fn a_refresh_url_naming_the_upstream_is_rewritten_in_place() {
        let r = Redirects::new(false, b"shop.example", [&b"127.0.0.1:9000"[..]], None);
        let raw = "HTTP/1.1 200 OK\r\nRefresh: 5; URL='http://127.0.0.1:9000/done'\r\n\
                   Refresh: 0;url=http://127.0.0.1:9000\r\nRefresh: 3\r\n\
                   X-Location: http://127.0.0.1:9000/x\r\nContent-Length: 0\r\n\r\n";
        assert_eq!(
            redirected(raw, &r),
            "HTTP/1.1 200 OK\r\nRefresh: 5; URL='http://shop.example/done'\r\n\
             Refresh: 0;url=http://shop.example\r\nRefresh: 3\r\n\
             X-Location: http://127.0.0.1:9000/x\r\nContent-Length: 0\r\n\r\n"
        );
        let mut plain = Vec::new();
        parse(raw.as_bytes(), &CTX, &mut plain).unwrap();
        assert!(String::from_utf8(plain)
            .unwrap()
            .contains("URL='http://127.0.0.1:9000/done'"));
    }

    #[test]
    fn partial_and_oversized_heads() {
        let mut out = Vec::new();
        assert_eq!(parse(b"HTTP/1.1 200 OK\r\nX: y", &CTX, &mut out), Ok(None));
        let small = ResponseContext {
            max_head: 16,
            ..CTX
        };
        assert_eq!(
            parse(b"HTTP/1.1 200 OK\r\nX: yyyyyy", &small, &mut out),
            Err(ResponseError::TooLarge)
        );
        assert!(out.is_empty());
    }
}

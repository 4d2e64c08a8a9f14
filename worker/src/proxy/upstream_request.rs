//! The request head sent upstream: re-serialised from the client's head, never
//! forwarded as raw bytes.
//!
//! Input is the client's head as received (already accepted by `http::request::parse`,
//! re-tokenised here with httparse so this module depends on no connection internals)
//! and the body framing that parse decided. Output, appended to a buffer:
//!
//! ```text
//! METHOD origin-form-target HTTP/1.1      (absolute-form becomes origin-form + Host)
//! Host: <client's Host>                   (or the target's authority, or a fallback)
//! <end-to-end fields, in the client's order>
//! X-Forwarded-For: <client's, if any>, <client address>
//! X-Forwarded-Proto: http|https           (set, the client's dropped)
//! X-Forwarded-Host: <client's Host>       (set if the client named a host; the client's dropped)
//! X-Request-Id: <client's if plain, else generated>
//! Content-Length: N | Transfer-Encoding: chunked   (exactly one, or neither)
//! Connection: close                        (only when the connection will not be pooled)
//! ```
//!
//! Dropped: `Connection` and every field it names, `Keep-Alive`, `Proxy-Connection`,
//! `TE`, `Transfer-Encoding`, `Upgrade`, `Expect` (forkd answers `100-continue`
//! itself), and the client's `Content-Length` (rewritten from the parsed framing).
//!
//! The route's [`Shaping`] changes this head where it says so:
//!
//! - `path`: the target becomes the template, its `{path}` the request's path after
//!   the route's prefix as the client encoded it (dot segments and repeated slashes
//!   resolved as routing resolved them, escapes kept: `%20` and `%3F` reach the
//!   application as the client wrote them; `%2F` and `%00` never get here, they are
//!   a 400 before routing), then the client's `?query` as received. Where the
//!   template's literal ends with `/` and the rest starts with one (a prefix without
//!   a trailing slash), one of the two is dropped.
//! - `host`: `Host` is the route's fixed name instead of the client's
//!   (`X-Forwarded-Host` still names the client's).
//! - `set_headers`: written after `X-Request-Id`, in the route's order, each
//!   replacing the client's field of that name and forkd's own `X-Forwarded-*`; a
//!   value whose expansion would hold CR, LF or NUL is not sent at all (forkd's
//!   placeholders cannot produce them: the parser refused such a `Host`, the request
//!   id is printable, the rest forkd writes itself).
//! - `remove_headers`: neither the client's field nor forkd's own of that name.

use super::request_id::{self, RequestIds};
use super::{is_hop_by_hop, push_decimal, trim, ConnectionTokens};
use crate::http::{path, request::strip_port};
use forkd_shared::config::shaping::{SentHost, Shaping, ValuePart};
use std::io::Write;
use std::net::IpAddr;
use std::ops::Range;

/// How the request body is delimited (the client's framing, as parsed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    None,
    Length(u64),
    Chunked,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
}

/// What the proxy adds about the client and this hop.
#[derive(Debug, Clone, Copy)]
pub struct Forwarding<'a> {
    pub client_ip: IpAddr,
    pub scheme: Scheme,
    /// `Host` for the upstream when the client sent none (HTTP/1.0 without Host).
    pub fallback_host: &'a [u8],
    /// Ask the upstream to close after this exchange (it will not be pooled).
    pub close: bool,
    /// What the route changes (path, `Host`, fields set and removed).
    pub shaping: &'a Shaping,
    /// The route's prefix (decoded, as routing matched it), which `{path}` leaves out.
    pub prefix: &'a str,
}

/// What was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamHead<'h> {
    /// Where the request id is in the output buffer (for the access log).
    pub request_id: Range<usize>,
    /// Bytes appended to the output buffer: the replay copy for a retry is
    /// `out[start..start + len]`.
    pub len: usize,
    /// The host the client named, port included (an absolute-form target's
    /// authority, else its `Host`), in the client's head: what a redirect naming the
    /// upstream is rewritten to (`response_head::Redirects`).
    pub client_host: Option<&'h [u8]>,
}

/// The client head could not be re-tokenised (it was accepted once, so this means the
/// caller passed the wrong bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadError {
    Malformed,
}

/// How many fields a client head may have; the same bound as the request parser.
const MAX_FIELDS: usize = crate::http::request::MAX_HEADERS;

/// Appends the upstream request head for the client head `head` to `out`.
pub fn write<'h>(
    head: &'h [u8],
    body: Framing,
    fwd: &Forwarding,
    ids: &mut RequestIds,
    out: &mut Vec<u8>,
) -> Result<UpstreamHead<'h>, HeadError> {
    let start = out.len();
    let mut fields = [const { std::mem::MaybeUninit::<httparse::Header>::uninit() }; MAX_FIELDS];
    let mut req = httparse::Request::new(&mut []);
    match req.parse_with_uninit_headers(head, &mut fields) {
        Ok(httparse::Status::Complete(_)) => {}
        _ => return Err(HeadError::Malformed),
    }
    let method = req.method.ok_or(HeadError::Malformed)?;
    let target = req.path.ok_or(HeadError::Malformed)?.as_bytes();
    let headers: &[httparse::Header] = req.headers;

    let (authority, origin) = split_absolute(target);
    let client_host = headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("host"))
        .map(|h| trim(h.value));
    // RFC 9112 §3.2.2: an absolute-form target's authority replaces Host.
    let named = authority.or(client_host);
    let host = named.unwrap_or(fwd.fallback_host);
    let tokens = ConnectionTokens::of(headers);
    let shaping = fwd.shaping;

    out.extend_from_slice(method.as_bytes());
    out.push(b' ');
    match &shaping.path {
        Some(template) => write_shaped_target(origin, template, fwd.prefix, out)?,
        None => {
            if !origin.starts_with(b"/") && authority.is_some() {
                out.push(b'/');
            }
            out.extend_from_slice(origin);
        }
    }
    out.extend_from_slice(b" HTTP/1.1\r\nHost: ");
    out.extend_from_slice(match &shaping.host {
        SentHost::Client => host,
        SentHost::Fixed(fixed) => fixed.as_bytes(),
    });
    out.extend_from_slice(b"\r\n");

    let mut forwarded_for: Vec<&[u8]> = Vec::new();
    let mut client_id: Option<&[u8]> = None;
    for h in headers {
        let name = h.name.as_bytes();
        if is_hop_by_hop(name) || tokens.contains(name) || shaping.replaces(name) {
            continue;
        }
        let value = trim(h.value);
        if name.eq_ignore_ascii_case(b"host")
            || name.eq_ignore_ascii_case(b"content-length")
            || name.eq_ignore_ascii_case(b"x-forwarded-proto")
            || name.eq_ignore_ascii_case(b"x-forwarded-host")
        {
            continue;
        }
        if name.eq_ignore_ascii_case(b"x-forwarded-for") {
            if !value.is_empty() {
                forwarded_for.push(value);
            }
            continue;
        }
        if name.eq_ignore_ascii_case(b"x-request-id") {
            if client_id.is_none() && request_id::acceptable(value) {
                client_id = Some(value);
            }
            continue;
        }
        out.extend_from_slice(name);
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }

    if !shaping.replaces(b"x-forwarded-for") {
        out.extend_from_slice(b"X-Forwarded-For: ");
        for value in &forwarded_for {
            out.extend_from_slice(value);
            out.extend_from_slice(b", ");
        }
        push_ip(out, fwd.client_ip);
        out.extend_from_slice(b"\r\n");
    }
    if !shaping.replaces(b"x-forwarded-proto") {
        out.extend_from_slice(b"X-Forwarded-Proto: ");
        out.extend_from_slice(fwd.scheme.name());
        out.extend_from_slice(b"\r\n");
    }
    // Only a host the client named: the fallback is the upstream's own address.
    if let Some(client_host) = named.filter(|_| !shaping.replaces(b"x-forwarded-host")) {
        out.extend_from_slice(b"X-Forwarded-Host: ");
        out.extend_from_slice(client_host);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"X-Request-Id: ");
    let id_start = out.len();
    match client_id {
        Some(id) => out.extend_from_slice(id),
        None => ids.push_next(out),
    }
    let request_id = id_start..out.len();
    out.extend_from_slice(b"\r\n");
    for set in &shaping.set_headers {
        let line = out.len();
        out.extend_from_slice(set.name.0.as_bytes());
        out.extend_from_slice(b": ");
        let value = out.len();
        for part in &set.value {
            match part {
                ValuePart::Literal(text) => out.extend_from_slice(text.as_bytes()),
                ValuePart::ClientIp => push_ip(out, fwd.client_ip),
                ValuePart::Host => out.extend_from_slice(strip_port(host)),
                ValuePart::Scheme => out.extend_from_slice(fwd.scheme.name()),
                ValuePart::RequestId => out.extend_from_within(request_id.clone()),
            }
        }
        if out[value..]
            .iter()
            .any(|&b| b == b'\r' || b == b'\n' || b == 0)
        {
            out.truncate(line);
            continue;
        }
        out.extend_from_slice(b"\r\n");
    }
    match body {
        Framing::Length(n) => {
            out.extend_from_slice(b"Content-Length: ");
            push_decimal(out, n);
            out.extend_from_slice(b"\r\n");
        }
        Framing::Chunked => out.extend_from_slice(b"Transfer-Encoding: chunked\r\n"),
        // RFC 9110 §8.6: a user agent should send a length for a method that expects
        // a body, so the application does not wait for one.
        Framing::None if expects_body(method) => out.extend_from_slice(b"Content-Length: 0\r\n"),
        Framing::None => {}
    }
    if fwd.close {
        out.extend_from_slice(b"Connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    Ok(UpstreamHead {
        request_id,
        len: out.len() - start,
        client_host: named,
    })
}

impl Scheme {
    pub fn name(self) -> &'static [u8] {
        match self {
            Scheme::Http => b"http",
            Scheme::Https => b"https",
        }
    }
}

/// Writes the route's `path` template for the origin-form target `origin` (`/p?q`,
/// or `?q` from an absolute-form target without a path): `{path}` is the client's
/// path after the decoded `prefix`, in the client's own encoding, normalised as
/// routing normalised it; the query follows as received.
fn write_shaped_target(
    origin: &[u8],
    template: &forkd_shared::config::shaping::PathTemplate,
    prefix: &str,
    out: &mut Vec<u8>,
) -> Result<(), HeadError> {
    let (raw_path, query) = match origin.iter().position(|&b| b == b'?') {
        Some(q) => (&origin[..q], Some(&origin[q..])),
        None => (origin, None),
    };
    let raw_path = if raw_path.is_empty() { b"/" } else { raw_path };
    out.extend_from_slice(template.before.as_bytes());
    if let Some(after) = &template.after {
        // Routing normalised this path already; it cannot fail here.
        let encoded = path::normalize_encoded(raw_path).map_err(|_| HeadError::Malformed)?;
        let mut rest = path::after_decoded(&encoded, prefix.len());
        if template.before.ends_with('/') && rest.starts_with(b"/") {
            rest = &rest[1..];
        }
        out.extend_from_slice(rest);
        out.extend_from_slice(after.as_bytes());
    }
    if let Some(query) = query {
        out.extend_from_slice(query);
    }
    Ok(())
}

fn expects_body(method: &str) -> bool {
    matches!(method, "POST" | "PUT" | "PATCH")
}

/// Splits an absolute-form target into its authority and the rest
/// (`http://a:1/p?q` -> `a:1`, `/p?q`; `http://a?q` -> `a`, `?q`, to which the caller
/// prepends the `/` origin-form needs; `http://a` -> `a`, `/`).
fn split_absolute(target: &[u8]) -> (Option<&[u8]>, &[u8]) {
    let rest = if target.len() > 7 && target[..7].eq_ignore_ascii_case(b"http://") {
        &target[7..]
    } else if target.len() > 8 && target[..8].eq_ignore_ascii_case(b"https://") {
        &target[8..]
    } else {
        return (None, target);
    };
    match rest.iter().position(|&b| b == b'/' || b == b'?') {
        Some(i) => (Some(&rest[..i]), &rest[i..]),
        None => (Some(rest), b"/"),
    }
}

/// Appends `ip` as `Display` writes it; IPv4 (most clients) without the formatter.
fn push_ip(out: &mut Vec<u8>, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            // Into a stack buffer first: one copy into `out`.
            let mut text = [0u8; 15];
            let mut n = 0;
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    text[n] = b'.';
                    n += 1;
                }
                if octet >= 100 {
                    text[n] = b'0' + octet / 100;
                    n += 1;
                }
                if octet >= 10 {
                    text[n] = b'0' + octet / 10 % 10;
                    n += 1;
                }
                text[n] = b'0' + octet % 10;
                n += 1;
            }
            out.extend_from_slice(&text[..n]);
        }
        // Writing an IpAddr into a Vec cannot fail.
        IpAddr::V6(_) => {
            let _ = write!(out, "{ip}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static NO_SHAPING: Shaping = Shaping {
        path: None,
        host: SentHost::Client,
        set_headers: Vec::new(),
        remove_headers: Vec::new(),
        timeouts: forkd_shared::config::shaping::RouteTimeouts {
            connect: None,
            send: None,
            read: None,
        },
    };

    fn fwd() -> Forwarding<'static> {
        Forwarding {
            client_ip: "192.0.2.7".parse().unwrap(),
            scheme: Scheme::Http,
            fallback_host: b"127.0.0.1:9000",
            close: false,
            shaping: &NO_SHAPING,
            prefix: "/",
        }
    }

    fn rewrite(head: &str, body: Framing, fwd: &Forwarding) -> String {
        let mut ids = RequestIds::new(0xab, 0xcd);
        let mut out = b"previous".to_vec();
        let written = write(head.as_bytes(), body, fwd, &mut ids, &mut out).unwrap();
        assert_eq!(written.len, out.len() - 8);
        String::from_utf8(out[8..].to_vec()).unwrap()
    }

    #[test]
    fn simple_get_gets_forwarding_fields_and_an_id() {
        let got = rewrite(
            "GET /api/x?y=1 HTTP/1.1\r\nHost: example.com:8080\r\nAccept: */*\r\n\r\n",
            Framing::None,
            &fwd(),
        );
        assert_eq!(
            got,
            "GET /api/x?y=1 HTTP/1.1\r\nHost: example.com:8080\r\nAccept: */*\r\n\
             X-Forwarded-For: 192.0.2.7\r\nX-Forwarded-Proto: http\r\n\
             X-Forwarded-Host: example.com:8080\r\n\
             X-Request-Id: 000000ab000000cd0000000000000001\r\n\r\n"
        );
    }

    #[test]
    fn hop_by_hop_and_connection_named_fields_are_dropped() {
        let got = rewrite(
            "POST /u HTTP/1.1\r\nHost: h\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\n\
             Keep-Alive: timeout=5\r\nProxy-Connection: close\r\nTE: trailers\r\n\
             Upgrade: websocket\r\nExpect: 100-continue\r\nTransfer-Encoding: chunked\r\n\
             X-End: 2\r\n\r\n",
            Framing::Chunked,
            &fwd(),
        );
        assert_eq!(
            got,
            "POST /u HTTP/1.1\r\nHost: h\r\nX-End: 2\r\nX-Forwarded-For: 192.0.2.7\r\n\
             X-Forwarded-Proto: http\r\nX-Forwarded-Host: h\r\n\
             X-Request-Id: 000000ab000000cd0000000000000001\r\n\
             Transfer-Encoding: chunked\r\n\r\n"
        );
    }

    #[test]
    fn exactly_one_framing_field_is_sent() {
        let got = rewrite(
            "PUT /u HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
            Framing::Length(5),
            &fwd(),
        );
        assert_eq!(got.matches("Content-Length").count(), 1, "{got}");
        assert!(got.ends_with("Content-Length: 5\r\n\r\n"), "{got}");
        let post = rewrite("POST /u HTTP/1.1\r\nHost: h\r\n\r\n", Framing::None, &fwd());
        assert!(post.ends_with("Content-Length: 0\r\n\r\n"), "{post}");
        let get = rewrite("GET /u HTTP/1.1\r\nHost: h\r\n\r\n", Framing::None, &fwd());
        assert!(!get.contains("Content-Length") && !get.contains("Transfer-Encoding"));
    }

    #[test]
    fn forwarded_for_is_appended_and_proto_host_are_replaced() {
        let f = Forwarding {
            scheme: Scheme::Https,
            ..fwd()
        };
        let got = rewrite(
            "GET / HTTP/1.1\r\nX-Forwarded-For: 10.0.0.1\r\nHost: h\r\n\
             X-Forwarded-For: 10.0.0.2, 10.0.0.3\r\nX-Forwarded-Proto: gopher\r\n\
             X-Forwarded-Host: evil\r\n\r\n",
            Framing::None,
            &f,
        );
        assert!(
            got.contains("X-Forwarded-For: 10.0.0.1, 10.0.0.2, 10.0.0.3, 192.0.2.7\r\n"),
            "{got}"
        );
        assert!(got.contains("X-Forwarded-Proto: https\r\n"), "{got}");
        assert!(got.contains("X-Forwarded-Host: h\r\n"), "{got}");
        assert!(!got.contains("gopher") && !got.contains("evil"), "{got}");
    }

    #[test]
    fn a_plain_client_request_id_is_kept_a_bad_one_replaced() {
        let mut ids = RequestIds::new(1, 2);
        let mut out = Vec::new();
        let head = b"GET / HTTP/1.1\r\nHost: h\r\nX-Request-Id: abc-42\r\n\r\n";
        let w = write(head, Framing::None, &fwd(), &mut ids, &mut out).unwrap();
        assert_eq!(&out[w.request_id.clone()], b"abc-42");
        assert_eq!(
            String::from_utf8_lossy(&out)
                .matches("X-Request-Id")
                .count(),
            1
        );
        out.clear();
        let head = b"GET / HTTP/1.1\r\nHost: h\r\nX-Request-Id: a b\r\n\r\n";
        let w = write(head, Framing::None, &fwd(), &mut ids, &mut out).unwrap();
        assert_eq!(&out[w.request_id], b"00000001000000020000000000000001");
    }

    #[test]
    fn absolute_form_becomes_origin_form_with_its_authority_as_host() {
        let got = rewrite(
            "GET http://Example.org:81/p?q HTTP/1.1\r\nHost: other\r\n\r\n",
            Framing::None,
            &fwd(),
        );
        assert!(
            got.starts_with("GET /p?q HTTP/1.1\r\nHost: Example.org:81\r\n"),
            "{got}"
        );
        assert_eq!(
            got.matches("Host: ").count(),
            2,
            "Host and X-Forwarded-Host: {got}"
        );
        let got = rewrite("GET http://a?q HTTP/1.1\r\n\r\n", Framing::None, &fwd());
        assert!(got.starts_with("GET /?q HTTP/1.1\r\nHost: a\r\n"), "{got}");
        let got = rewrite("GET http://a HTTP/1.1\r\n\r\n", Framing::None, &fwd());
        assert!(got.starts_with("GET / HTTP/1.1\r\nHost: a\r\n"), "{got}");
    }

    #[test]
    fn http10_without_host_gets_the_fallback_and_close_is_asked_when_not_pooling() {
        let f = Forwarding {
            close: true,
            ..fwd()
        };
        let got = rewrite("GET / HTTP/1.0\r\n\r\n", Framing::None, &f);
        assert!(
            got.starts_with("GET / HTTP/1.1\r\nHost: 127.0.0.1:9000\r\n"),
            "{got}"
        );
        assert!(got.ends_with("Connection: close\r\n\r\n"), "{got}");
    }

    fn shaping(
        path: Option<&str>,
        host: SentHost,
        set: &[(&str, &str)],
        remove: &[&str],
    ) -> Shaping {
        use forkd_shared::config::shaping::{FieldName, PathTemplate, SetHeader};
        Shaping {
            path: path.map(|p| PathTemplate::parse(p).unwrap()),
            host,
            set_headers: set
                .iter()
                .map(|(n, v)| SetHeader::parse(n, v).unwrap())
                .collect(),
            remove_headers: remove
                .iter()
                .map(|n| FieldName::parse(n).unwrap())
                .collect(),
            ..NO_SHAPING.clone()
        }
    }

    #[test]
    fn a_path_template_takes_the_encoded_rest_after_the_prefix_and_keeps_the_query() {
        let s = shaping(Some("/v1/{path}"), SentHost::Client, &[], &[]);
        let f = Forwarding {
            shaping: &s,
            prefix: "/api/",
            ..fwd()
        };
        for (target, sent) in [
            ("/api/items?id=1&x=%41", "/v1/items?id=1&x=%41"),
            ("/api/a%20b/%3F/c", "/v1/a%20b/%3F/c"),
            ("/%61pi/x", "/v1/x"),
            ("//api/./x/../y", "/v1/y"),
            ("/api/", "/v1/"),
            ("http://h/api/z?q", "/v1/z?q"),
        ] {
            let got = rewrite(
                &format!("GET {target} HTTP/1.1\r\nHost: h\r\n\r\n"),
                Framing::None,
                &f,
            );
            assert!(
                got.starts_with(&format!("GET {sent} HTTP/1.1\r\nHost: h\r\n")),
                "{target}: {got}"
            );
        }
        // A prefix without its slash: the seam keeps one `/`.
        let f = Forwarding {
            prefix: "/api",
            ..f
        };
        let got = rewrite("GET /api/x HTTP/1.1\r\nHost: h\r\n\r\n", Framing::None, &f);
        assert!(got.starts_with("GET /v1/x HTTP/1.1\r\n"), "{got}");
        let fixed = shaping(Some("/status"), SentHost::Client, &[], &[]);
        let f = Forwarding {
            shaping: &fixed,
            ..f
        };
        let got = rewrite(
            "GET /api/x?y HTTP/1.1\r\nHost: h\r\n\r\n",
            Framing::None,
            &f,
        );
        assert!(got.starts_with("GET /status?y HTTP/1.1\r\n"), "{got}");
    }

    #[test]
    fn host_set_and_removed_fields_shape_the_head_byte_for_byte() {
        let s = shaping(
            None,
            SentHost::Fixed("app.internal:80".into()),
            &[
                ("X-Real-IP", "{client_ip}"),
                ("X-Env", "prod"),
                ("X-Origin", "{scheme}://{host} #{request_id}"),
                ("X-Forwarded-Proto", "https"),
            ],
            &["X-Debug", "X-Forwarded-Host"],
        );
        let f = Forwarding {
            shaping: &s,
            ..fwd()
        };
        let got = rewrite(
            "GET /a HTTP/1.1\r\nHost: shop.example:8080\r\nX-Debug: 1\r\nX-Env: dev\r\n\
             x-real-ip: 6.6.6.6\r\nAccept: */*\r\nX-Forwarded-Proto: gopher\r\n\r\n",
            Framing::None,
            &f,
        );
        assert_eq!(
            got,
            "GET /a HTTP/1.1\r\nHost: app.internal:80\r\nAccept: */*\r\n\
             X-Forwarded-For: 192.0.2.7\r\n\
             X-Request-Id: 000000ab000000cd0000000000000001\r\n\
             X-Real-IP: 192.0.2.7\r\nX-Env: prod\r\n\
             X-Origin: http://shop.example #000000ab000000cd0000000000000001\r\n\
             X-Forwarded-Proto: https\r\n\r\n"
        );
    }

    #[test]
    fn a_set_value_that_would_carry_cr_or_lf_is_not_sent() {
        // Neither the parser nor the configuration lets such a host through (the
        // fallback comes from `names`); the expansion does not rely on it.
        let s = shaping(
            None,
            SentHost::Fixed("app".into()),
            &[("X-Host", "{host}"), ("X-Env", "prod")],
            &[],
        );
        let f = Forwarding {
            shaping: &s,
            fallback_host: b"evil\r\nX-Injected: 1",
            ..fwd()
        };
        let got = rewrite("GET / HTTP/1.0\r\n\r\n", Framing::None, &f);
        assert!(
            !got.contains("X-Host") && !got.contains("X-Injected"),
            "{got}"
        );
        assert!(got.ends_with("X-Env: prod\r\n\r\n"), "{got}");
    }

    #[test]
    fn client_addresses_are_written_as_display_writes_them() {
        for ip in [
            "127.0.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "10.20.3.4",
            "100.101.110.9",
            "99.50.205.199",
            "::1",
            "2001:db8::7",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            let mut out = Vec::new();
            push_ip(&mut out, ip);
            assert_eq!(out, ip.to_string().as_bytes());
        }
    }
}

//! Writing responses: status lines, header fields and the small error pages.
//!
//! Everything is appended to a byte buffer the connection later writes in one go, so a
//! batch of pipelined responses costs one `write`.

use forkd_shared::config::ErrorPage;

/// An HTTP status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status(pub u16);

impl Status {
    pub const CONTINUE: Status = Status(100);
    pub const OK: Status = Status(200);
    pub const PARTIAL_CONTENT: Status = Status(206);
    pub const MOVED_PERMANENTLY: Status = Status(301);
    pub const NOT_MODIFIED: Status = Status(304);
    pub const BAD_REQUEST: Status = Status(400);
    pub const FORBIDDEN: Status = Status(403);
    pub const NOT_FOUND: Status = Status(404);
    pub const METHOD_NOT_ALLOWED: Status = Status(405);
    pub const REQUEST_TIMEOUT: Status = Status(408);
    pub const CONTENT_TOO_LARGE: Status = Status(413);
    pub const URI_TOO_LONG: Status = Status(414);
    pub const RANGE_NOT_SATISFIABLE: Status = Status(416);
    pub const EXPECTATION_FAILED: Status = Status(417);
    pub const MISDIRECTED_REQUEST: Status = Status(421);
    pub const TOO_MANY_REQUESTS: Status = Status(429);
    pub const HEADER_FIELDS_TOO_LARGE: Status = Status(431);
    pub const INTERNAL_SERVER_ERROR: Status = Status(500);
    pub const NOT_IMPLEMENTED: Status = Status(501);
    pub const BAD_GATEWAY: Status = Status(502);
    pub const SERVICE_UNAVAILABLE: Status = Status(503);
    pub const GATEWAY_TIMEOUT: Status = Status(504);
    pub const HTTP_VERSION_NOT_SUPPORTED: Status = Status(505);

    /// The status line, without the trailing CRLF: `HTTP/1.1 200 OK`.
    pub fn line(self) -> &'static str {
        match self.0 {
            100 => "HTTP/1.1 100 Continue",
            200 => "HTTP/1.1 200 OK",
            206 => "HTTP/1.1 206 Partial Content",
            301 => "HTTP/1.1 301 Moved Permanently",
            304 => "HTTP/1.1 304 Not Modified",
            400 => "HTTP/1.1 400 Bad Request",
            403 => "HTTP/1.1 403 Forbidden",
            404 => "HTTP/1.1 404 Not Found",
            405 => "HTTP/1.1 405 Method Not Allowed",
            408 => "HTTP/1.1 408 Request Timeout",
            413 => "HTTP/1.1 413 Content Too Large",
            414 => "HTTP/1.1 414 URI Too Long",
            416 => "HTTP/1.1 416 Range Not Satisfiable",
            417 => "HTTP/1.1 417 Expectation Failed",
            421 => "HTTP/1.1 421 Misdirected Request",
            429 => "HTTP/1.1 429 Too Many Requests",
            431 => "HTTP/1.1 431 Request Header Fields Too Large",
            501 => "HTTP/1.1 501 Not Implemented",
            502 => "HTTP/1.1 502 Bad Gateway",
            503 => "HTTP/1.1 503 Service Unavailable",
            504 => "HTTP/1.1 504 Gateway Timeout",
            505 => "HTTP/1.1 505 HTTP Version Not Supported",
            _ => "HTTP/1.1 500 Internal Server Error",
        }
    }

    /// The reason phrase: `OK`, `Not Found`; empty for a code without one (RFC 9112
    /// §4 allows an empty reason).
    pub fn reason(self) -> &'static str {
        match self.0 {
            201 => "Created",
            202 => "Accepted",
            204 => "No Content",
            302 => "Found",
            303 => "See Other",
            307 => "Temporary Redirect",
            308 => "Permanent Redirect",
            401 => "Unauthorized",
            402 => "Payment Required",
            406 => "Not Acceptable",
            409 => "Conflict",
            410 => "Gone",
            412 => "Precondition Failed",
            418 => "I'm a teapot",
            422 => "Unprocessable Content",
            429 => "Too Many Requests",
            451 => "Unavailable For Legal Reasons",
            502 => "Bad Gateway",
            504 => "Gateway Timeout",
            500 => "Internal Server Error",
            code if self.line() != Status(500).line() || code == 500 => &self.line()[13..],
            _ => "",
        }
    }
}

/// `HTTP/1.1 <code> <reason>`, for any code (the table of [`Status::line`] aside).
pub fn status_line(out: &mut Vec<u8>, status: Status) {
    if status.0 == 500 || status.line() != Status(500).line() {
        out.extend_from_slice(status.line().as_bytes());
    } else {
        out.extend_from_slice(b"HTTP/1.1 ");
        push_decimal(out, u64::from(status.0));
        out.push(b' ');
        out.extend_from_slice(status.reason().as_bytes());
    }
}

/// What the `Connection` header of a response says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persistence {
    /// HTTP/1.1 default: no header needed.
    KeepAlive11,
    /// An HTTP/1.0 client asked for keep-alive: `Connection: keep-alive`.
    KeepAlive10,
    /// `Connection: close`, and the connection is closed after the response.
    Close,
}

impl Persistence {
    /// The connection stays open (`keep`) or closes after the response; an open one
    /// says so to an HTTP/1.0 client (`http10`).
    pub fn after(keep: bool, http10: bool) -> Persistence {
        match (keep, http10) {
            (false, _) => Persistence::Close,
            (true, true) => Persistence::KeepAlive10,
            (true, false) => Persistence::KeepAlive11,
        }
    }
}

/// `HTTP/1.1 200 OK`, `Server` and `Date`: the start of every response.
pub fn start(out: &mut Vec<u8>, status: Status, date: &[u8]) {
    status_line(out, status);
    out.extend_from_slice(b"\r\nServer: forkd\r\nDate: ");
    out.extend_from_slice(date);
    out.extend_from_slice(b"\r\n");
}

/// One header field.
pub fn header(out: &mut Vec<u8>, name: &str, value: &[u8]) {
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// `Content-Length`, formatted without allocating.
pub fn content_length(out: &mut Vec<u8>, len: u64) {
    out.extend_from_slice(b"Content-Length: ");
    push_decimal(out, len);
    out.extend_from_slice(b"\r\n");
}

/// The `Connection` header (if any) and the empty line that ends the head.
pub fn finish(out: &mut Vec<u8>, persistence: Persistence) {
    match persistence {
        Persistence::KeepAlive11 => out.extend_from_slice(b"\r\n"),
        Persistence::KeepAlive10 => out.extend_from_slice(b"Connection: keep-alive\r\n\r\n"),
        Persistence::Close => out.extend_from_slice(b"Connection: close\r\n\r\n"),
    }
}

/// The route's configured header lines (`Name: value\r\n` each), then [`finish`].
pub fn finish_with(out: &mut Vec<u8>, site_headers: &[u8], persistence: Persistence) {
    out.extend_from_slice(site_headers);
    finish(out, persistence);
}

/// Appends `n` in decimal.
pub fn push_decimal(out: &mut Vec<u8>, n: u64) {
    // Written in place, from the last digit: no buffer of its own to copy from.
    let mut len = 1;
    let mut rest = n / 10;
    while rest > 0 {
        len += 1;
        rest /= 10;
    }
    let start = out.len();
    out.resize(start + len, b'0');
    let mut rest = n;
    for digit in out[start..].iter_mut().rev() {
        *digit = b'0' + (rest % 10) as u8;
        rest /= 10;
    }
}

/// The body of an error page: small, HTML, naming the status.
pub fn error_body(status: Status) -> String {
    let title = format!("{} {}", status.0, status.reason());
    let title = title.trim_end();
    format!(
        "<html><head><title>{title}</title></head><body><h1>{title}</h1><hr>forkd</body></html>\n"
    )
}

/// A complete error response (with `extra` header fields). Returns the body length.
pub fn error(
    out: &mut Vec<u8>,
    status: Status,
    date: &[u8],
    persistence: Persistence,
    extra: &[(&str, &[u8])],
    head_only: bool,
) -> u64 {
    error_with(
        out,
        status,
        date,
        persistence,
        extra,
        &Site::NONE,
        head_only,
    )
}

/// What a server's configuration adds to an error response.
#[derive(Clone, Copy)]
pub struct Site<'a> {
    /// The route's header lines (`Name: value\r\n` each).
    pub headers: &'a [u8],
    /// The server's `error_pages`.
    pub pages: &'a [ErrorPage],
}

impl Site<'_> {
    pub const NONE: Site<'static> = Site {
        headers: b"",
        pages: &[],
    };
}

/// Every error response goes through here: the server's page for `status` if
/// `error_pages` names one, else the built-in page; then `extra` and the site's
/// header fields. Returns the body length.
pub fn error_with(
    out: &mut Vec<u8>,
    status: Status,
    date: &[u8],
    persistence: Persistence,
    extra: &[(&str, &[u8])],
    site: &Site,
    head_only: bool,
) -> u64 {
    let builtin;
    let (content_type, body): (&str, &[u8]) = match site.pages.iter().find(|p| p.status == status.0)
    {
        Some(page) => (page.content_type, &page.body),
        None => {
            builtin = error_body(status);
            ("text/html", builtin.as_bytes())
        }
    };
    start(out, status, date);
    out.extend_from_slice(b"Content-Type: ");
    out.extend_from_slice(content_type.as_bytes());
    out.extend_from_slice(b"\r\n");
    content_length(out, body.len() as u64);
    for (name, value) in extra {
        header(out, name, value);
    }
    finish_with(out, site.headers, persistence);
    if head_only {
        return 0;
    }
    out.extend_from_slice(body);
    body.len() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines_and_reasons() {
        assert_eq!(Status::NOT_FOUND.line(), "HTTP/1.1 404 Not Found");
        assert_eq!(Status::NOT_FOUND.reason(), "Not Found");
        assert_eq!(Status(599).line(), "HTTP/1.1 500 Internal Server Error");
        assert_eq!(Status(308).reason(), "Permanent Redirect");
        assert_eq!(Status(599).reason(), "");
        let mut out = Vec::new();
        start(&mut out, Status(599), b"d");
        assert!(out.starts_with(b"HTTP/1.1 599 \r\n"));
        out.clear();
        start(&mut out, Status(302), b"d");
        assert!(out.starts_with(b"HTTP/1.1 302 Found\r\n"));
    }

    #[test]
    fn decimal_formatting() {
        for n in [0u64, 7, 10, 99, 100, 255, 999, 1000, 1024, u64::MAX] {
            let mut v = Vec::new();
            push_decimal(&mut v, n);
            assert_eq!(v, n.to_string().as_bytes());
        }
    }

    #[test]
    fn error_response_bytes() {
        let mut out = Vec::new();
        let date = b"Sun, 29 Nov 2026 22:00:00 GMT";
        let n = error(
            &mut out,
            Status::METHOD_NOT_ALLOWED,
            date,
            Persistence::KeepAlive11,
            &[("Allow", b"GET, HEAD")],
            false,
        );
        let body = error_body(Status::METHOD_NOT_ALLOWED);
        assert_eq!(n as usize, body.len());
        let expected = format!(
            "HTTP/1.1 405 Method Not Allowed\r\nServer: forkd\r\nDate: Sun, 29 Nov 2026 22:00:00 GMT\r\nContent-Type: text/html\r\nContent-Length: {}\r\nAllow: GET, HEAD\r\n\r\n{body}",
            body.len()
        );
        assert_eq!(String::from_utf8(out).unwrap(), expected);
    }
}

//! A raw HTTP/1.1 client for talking to forkd: requests are bytes the test writes,
//! responses are parsed just enough to check them (status, fields, a body framed by
//! Content-Length).
//!
//! Two flavours: `read_response` on a plain `TcpStream` panics on an I/O error (for
//! tests of one exchange), and `Conn` reports every failure as an `Err` naming what
//! went wrong and where (for load clients, which count failures instead of stopping).

use super::process::server_side;
use nix::sys::socket::{recv, MsgFlags};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// Per-read and per-write timeout of `Conn`: an exchange that makes no progress for
/// this long failed.
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// One parsed response.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    /// The status line and header fields as received, up to and including the empty line.
    pub head: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn body_str(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    /// The server announced it closes the connection after this response.
    pub fn closes(&self) -> bool {
        self.header("Connection")
            .is_some_and(|v| v.to_ascii_lowercase().contains("close"))
    }
    pub fn content_length(&self) -> Result<usize, String> {
        self.header("Content-Length")
            .ok_or_else(|| format!("status {} without Content-Length", self.status))?
            .parse()
            .map_err(|e| format!("bad Content-Length: {e}"))
    }
}

/// Parses a response head (status line and fields, through the empty line).
pub fn parse_head(raw: &[u8]) -> Result<Response, String> {
    let head = String::from_utf8(raw.to_vec()).map_err(|_| "non-UTF-8 response head")?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .strip_prefix("HTTP/1.")
        .and_then(|r| r.get(2..5))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let mut headers = Vec::new();
    for l in lines.filter(|l| !l.is_empty()) {
        let (n, v) = l
            .split_once(':')
            .ok_or_else(|| format!("bad header line {l:?}"))?;
        headers.push((n.to_string(), v.trim().to_string()));
    }
    Ok(Response {
        status,
        head,
        headers,
        body: Vec::new(),
    })
}

/// Parses a whole response read up to EOF (a `Connection: close` exchange): the body
/// is everything after the head.
pub fn parse_response(raw: &[u8]) -> Option<Response> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let mut r = parse_head(&raw[..end]).ok()?;
    r.body = raw[end..].to_vec();
    Some(r)
}

/// A `TcpStream` whose reads interrupted by a signal are retried.
struct Retry<'a>(&'a mut TcpStream);

impl Read for Retry<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            match self.0.read(buf) {
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                other => return other,
            }
        }
    }
}

/// Reads one response from `s`: head, then a body by Content-Length (none for HEAD,
/// 1xx, 204 and 304; until EOF without a length). Interim 1xx responses are returned
/// as responses of their own. None on EOF before a head. Reads interrupted by a signal
/// are retried.
pub fn read_response(s: &mut TcpStream, head_request: bool) -> Option<Response> {
    let s = &mut Retry(s);
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(0) => return None,
            Ok(_) => head.push(byte[0]),
            Err(e) => panic!(
                "reading a response head: {e} (got {:?})",
                String::from_utf8_lossy(&head)
            ),
        }
    }
    let mut r = parse_head(&head).unwrap_or_else(|e| panic!("{e}"));
    if head_request || r.status < 200 || r.status == 204 || r.status == 304 {
        return Some(r);
    }
    match r
        .header("Content-Length")
        .map(|v| v.parse::<usize>().unwrap())
    {
        Some(n) => {
            r.body = vec![0; n];
            s.read_exact(&mut r.body).expect("the whole body");
        }
        None => {
            s.read_to_end(&mut r.body).unwrap();
        }
    }
    Some(r)
}

/// Reads until the server closes the connection (or the read timeout passes).
pub fn read_to_close(s: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = Retry(s).read_to_end(&mut out);
    out
}

pub fn is_timeout(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

/// `GET path HTTP/1.1` for `localhost`, with `Connection: close` if `close`.
pub fn get_request(path: &str, close: bool) -> Vec<u8> {
    let connection = if close { "Connection: close\r\n" } else { "" };
    format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{connection}\r\n").into_bytes()
}

/// GET `path` on a new connection with `Connection: close`; the response, once the
/// server has closed the connection after it.
pub fn get_close(port: u16, path: &str) -> Result<Response, String> {
    let mut c = Conn::connect(port)?;
    let r = c.exchange(&get_request(path, true))?;
    c.wait_close(IO_TIMEOUT)?;
    Ok(r)
}

/// The status of GET `path` on a new connection, or None (for polling).
pub fn status_of(port: u16, path: &str) -> Option<u16> {
    get_close(port, path).ok().map(|r| r.status)
}

/// Checks a response's status and (if given) its exact body; Err names the difference.
pub fn check_response(
    r: &Response,
    what: &str,
    status: u16,
    body: Option<&[u8]>,
) -> Result<(), String> {
    if r.status != status {
        return Err(format!(
            "{what}: status {} (want {status}), body {:?}",
            r.status,
            String::from_utf8_lossy(&r.body[..r.body.len().min(120)])
        ));
    }
    if let Some(body) = body {
        if r.body != body {
            let first = r.body.iter().zip(body).position(|(a, b)| a != b);
            return Err(format!(
                "{what}: body of {} bytes differs from the expected {} (first difference at {first:?})",
                r.body.len(),
                body.len()
            ));
        }
    }
    Ok(())
}

/// One client connection with its unconsumed input; every failure is an `Err`.
pub struct Conn {
    pub s: TcpStream,
    pub buf: Vec<u8>,
    /// Requests sent on it, for failure reports.
    sent: u64,
}

impl Conn {
    pub fn connect(port: u16) -> Result<Conn, String> {
        Conn::connect_timeout(port, IO_TIMEOUT)
    }

    /// A connection whose connect, reads and writes each time out after `timeout`.
    pub fn connect_timeout(port: u16, timeout: Duration) -> Result<Conn, String> {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let s = TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("connect: {e}"))?;
        s.set_read_timeout(Some(timeout))
            .map_err(|e| format!("setsockopt: {e}"))?;
        s.set_write_timeout(Some(timeout))
            .map_err(|e| format!("setsockopt: {e}"))?;
        let _ = s.set_nodelay(true);
        Ok(Conn {
            s,
            buf: Vec::new(),
            sent: 0,
        })
    }

    pub fn send(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.sent += 1;
        self.s.write_all(bytes).map_err(|e| format!("write: {e}"))
    }

    /// Where a failed request was, for the report (and, if the connection is still
    /// open, which process holds the server's end of it).
    pub fn describe(&self, since: Instant) -> String {
        let port = self.s.local_addr().map_or(0, |a| a.port());
        let server = self.s.peer_addr().map_or(0, |a| a.port());
        format!(
            "request {} on the connection from port {port}, {} ms after it began; server side: {}",
            self.sent,
            since.elapsed().as_millis(),
            server_side(server, port)
        )
    }

    /// One `read` into the buffer; EOF, errors and timeouts are failures named `what`.
    fn fill(&mut self, what: impl FnOnce(usize) -> String) -> Result<(), String> {
        let mut chunk = [0u8; 16 * 1024];
        match Retry(&mut self.s).read(&mut chunk) {
            Ok(0) => Err(format!("connection closed {}", what(self.buf.len()))),
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                Ok(())
            }
            Err(e) if is_timeout(&e) => Err(format!("timed out {}", what(self.buf.len()))),
            Err(e) => Err(format!("{e} {}", what(self.buf.len()))),
        }
    }

    /// Reads a response head (the returned response has no body yet).
    pub fn read_head(&mut self) -> Result<Response, String> {
        loop {
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let raw: Vec<u8> = self.buf.drain(..end + 4).collect();
                return parse_head(&raw);
            }
            if self.buf.len() > 64 * 1024 {
                return Err("response head over 64 KiB".into());
            }
            self.fill(|n| format!("before a complete response head ({n} bytes of it)"))?;
        }
    }

    pub fn read_body(&mut self, len: usize) -> Result<Vec<u8>, String> {
        while self.buf.len() < len {
            self.fill(|n| format!("after {n} of {len} body bytes"))?;
        }
        let rest = self.buf.split_off(len);
        Ok(std::mem::replace(&mut self.buf, rest))
    }

    /// Reads one complete response (every response of forkd has a Content-Length).
    pub fn response(&mut self) -> Result<Response, String> {
        let mut r = self.read_head()?;
        let len = r.content_length()?;
        r.body = self.read_body(len)?;
        Ok(r)
    }

    pub fn exchange(&mut self, request: &[u8]) -> Result<Response, String> {
        self.send(request)?;
        self.response()
    }

    /// Before reusing a keep-alive connection: has the server closed it after its last
    /// complete response? (One non-blocking peek; no request is at stake yet.)
    pub fn closed_by_server(&self) -> Result<bool, String> {
        if !self.buf.is_empty() {
            return Err(format!(
                "{} unexpected bytes after a complete response",
                self.buf.len()
            ));
        }
        let mut byte = [0u8; 1];
        match recv(
            self.s.as_raw_fd(),
            &mut byte,
            MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
        ) {
            Ok(0) => Ok(true),
            Ok(_) => Err("unsolicited bytes from the server between requests".into()),
            Err(nix::errno::Errno::EAGAIN) => Ok(false),
            // A reset after a complete response: closed, nothing was lost.
            Err(_) => Ok(true),
        }
    }

    /// Waits for the server to close (after a `Connection: close` answer). Ok(()) on EOF
    /// or reset; Err on a timeout or more data.
    pub fn wait_close(&mut self, timeout: Duration) -> Result<(), String> {
        if !self.buf.is_empty() {
            return Err(format!("{} bytes after the response", self.buf.len()));
        }
        let _ = self.s.set_read_timeout(Some(timeout));
        let mut chunk = [0u8; 512];
        match Retry(&mut self.s).read(&mut chunk) {
            Ok(0) => Ok(()),
            Ok(n) => Err(format!("{n} bytes after the response")),
            Err(e) if is_timeout(&e) => Err(format!("not closed within {timeout:?}")),
            Err(_) => Ok(()),
        }
    }
}

/// Reads until the server closes the connection; panics if it resets it or keeps it
/// open past the read timeout, showing what it had received.
pub fn read_until_close(s: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => panic!(
                "the server did not close the connection cleanly ({e}); received:\n{}",
                String::from_utf8_lossy(&out)
            ),
        }
    }
}

/// A PROXY protocol v2 header (PROXY command, TCP over IPv4) naming `client`:`port`
/// as the client, as a balancer puts it before the client's bytes.
pub fn proxy_v2_header(client: [u8; 4], port: u16) -> Vec<u8> {
    let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    h.extend_from_slice(&[0x21, 0x11, 0, 12]);
    h.extend_from_slice(&client);
    h.extend_from_slice(&[127, 0, 0, 1]);
    h.extend_from_slice(&port.to_be_bytes());
    h.extend_from_slice(&80u16.to_be_bytes());
    h
}

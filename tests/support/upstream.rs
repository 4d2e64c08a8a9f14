//! A test upstream: a small threaded HTTP/1.1 server on `127.0.0.1:0` whose answers,
//! and faults, each test chooses. Self-contained (std only), so any test file can
//! `mod upstream;` it.
//!
//! ```ignore
//! let up = TestUpstream::start(Settings::default(), |req| match req.path() {
//!     "/slow" => Reply::ok(b"late").delayed(Duration::from_millis(500)),
//!     "/cut" => Reply::CloseMidBody { body: noise, after: 1000 },
//!     _ => Reply::Echo,
//! });
//! // ... a forkd config with `servers: ["{up.addr()}"]` ...
//! assert_eq!(up.received()[0].header("x-forwarded-for"), Some("127.0.0.1"));
//! ```
//!
//! Every request it reads is recorded ([`TestUpstream::received`]) with the
//! connection it came on, so tests can check what forkd forwarded and whether it
//! reused connections.
#![allow(dead_code)]

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Connection-level behaviour.
#[derive(Debug, Clone, Copy, Default)]
pub struct Settings {
    /// Close a keep-alive connection that has been idle this long (the race a pooled
    /// connection meets); None: keep it open until the peer closes.
    pub idle_close: Option<Duration>,
    /// Close every connection after this many requests.
    pub max_requests: Option<usize>,
    /// Read request bytes at most this many at a time with this pause between reads:
    /// a slow upstream, whose backpressure must stop forkd reading the client.
    pub slow_read: Option<(usize, Duration)>,
}

/// Request bodies are kept up to this many bytes ([`Received::body`]); longer ones
/// are still counted and hashed whole.
pub const KEEP_BODY: usize = 1 << 20;

/// `servers` as an upstream's `servers:` list in a config: each quoted, comma-separated.
pub fn server_list<S: AsRef<str>>(servers: &[S]) -> String {
    servers
        .iter()
        .map(|s| format!("\"{}\"", s.as_ref()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// FNV-1a, to compare large bodies without keeping them.
pub fn fnv(hash: u64, data: &[u8]) -> u64 {
    data.iter().fold(hash, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// The FNV start value.
pub const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;

/// Byte `i` of a [`Reply::Large`] body.
pub fn pattern_byte(i: u64) -> u8 {
    (i % 251) as u8
}

/// The hash of a [`Reply::Large`] body of `len` bytes.
pub fn pattern_hash(len: u64) -> u64 {
    let mut h = FNV_START;
    let mut piece = Vec::with_capacity(64 * 1024);
    let mut at = 0;
    while at < len {
        piece.clear();
        let n = (len - at).min(64 * 1024);
        piece.extend((at..at + n).map(pattern_byte));
        h = fnv(h, &piece);
        at += n;
    }
    h
}

/// One request as the upstream read it.
#[derive(Debug, Clone)]
pub struct Received {
    /// Which accepted connection it came on (0, 1, ...).
    pub connection: usize,
    /// Its position on that connection (0 = first).
    pub nth: usize,
    /// The request line and fields, as received (without the final empty line).
    pub head: String,
    /// The body, decoded (chunked or Content-Length), up to [`KEEP_BODY`] bytes.
    pub body: Vec<u8>,
    /// The whole decoded body's length and FNV-1a hash.
    pub body_len: u64,
    pub body_hash: u64,
    /// Trailer field lines of a chunked body, as received.
    pub trailers: String,
}

impl Received {
    pub fn method(&self) -> &str {
        self.head.split(' ').next().unwrap_or("")
    }
    pub fn path(&self) -> &str {
        self.head.split(' ').nth(1).unwrap_or("")
    }
    /// The first field named `name` (case-insensitive), trimmed.
    pub fn header<'a>(&'a self, name: &'a str) -> Option<&'a str> {
        self.headers(name).next()
    }
    /// Every field named `name`, in order.
    pub fn headers<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.head.split("\r\n").skip(1).filter_map(move |line| {
            let (n, v) = line.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }
}

/// What to answer one request with.
#[derive(Debug, Clone)]
pub enum Reply {
    /// A complete response with `Content-Length`; `extra` fields as given.
    Full {
        status: u16,
        extra: Vec<(String, String)>,
        body: Vec<u8>,
    },
    /// A chunked body in chunks of `chunk` bytes, then these trailer fields.
    Chunked {
        body: Vec<u8>,
        chunk: usize,
        trailers: Vec<(String, String)>,
    },
    /// HTTP/1.0-style: no length, the body ends when the connection closes.
    CloseDelimited { body: Vec<u8> },
    /// Declares `Content-Length: body.len()`, sends `after` bytes of the body, closes.
    CloseMidBody { body: Vec<u8>, after: usize },
    /// Both `Transfer-Encoding: chunked` and `Content-Length` (a smuggling shape).
    BothTeAndCl { body: Vec<u8> },
    /// These bytes instead of a response, then close.
    Garbage(Vec<u8>),
    /// Close without answering (a reset before any response byte).
    Close,
    /// `103 Early Hints` (with a `Link` field), then a 200 with `body`.
    EarlyHints { body: Vec<u8> },
    /// 200 with the request head and body as the body (`text/plain`).
    Echo,
    /// 200 with `len` bytes of [`pattern_byte`]s, with `Content-Length` or chunked,
    /// written in 64 KiB pieces (never held in memory whole).
    Large { len: u64, chunked: bool },
    /// `reply`, after waiting `before_head`; the body (if any) is written in pieces of
    /// `piece` bytes with `pause` between them.
    Slow {
        reply: Box<Reply>,
        before_head: Duration,
        piece: usize,
        pause: Duration,
    },
    /// Written by the test itself on the connection, for a shape the others cannot
    /// script (a body whose parts depend on what the test sees meanwhile); the
    /// function returns whether the connection stays open.
    Written(Writer),
}

/// The function that writes a [`Reply::Written`].
#[derive(Clone)]
pub struct Writer(pub Arc<dyn Fn(&mut TcpStream) -> bool + Send + Sync>);

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Writer(..)")
    }
}

impl Reply {
    /// 200 with `body`.
    pub fn ok(body: &[u8]) -> Reply {
        Reply::Full {
            status: 200,
            extra: Vec::new(),
            body: body.to_vec(),
        }
    }
    /// This reply after `delay`, its body written at once.
    pub fn delayed(self, delay: Duration) -> Reply {
        Reply::Slow {
            reply: Box::new(self),
            before_head: delay,
            piece: usize::MAX,
            pause: Duration::ZERO,
        }
    }
    /// This reply with its bytes written `piece` at a time, `pause` apart.
    pub fn trickled(self, piece: usize, pause: Duration) -> Reply {
        Reply::Slow {
            reply: Box::new(self),
            before_head: Duration::ZERO,
            piece,
            pause,
        }
    }
}

type Responder = dyn Fn(&Received) -> Reply + Send + Sync;

struct Shared {
    received: Mutex<Vec<Received>>,
    connections: AtomicUsize,
    open: AtomicUsize,
    stop: AtomicBool,
    respond: Box<Responder>,
    settings: Settings,
}

/// A [`TestUpstream`] with the default [`Settings`], answering each request with
/// `respond(req)`.
pub fn upstream(respond: impl Fn(&Received) -> Reply + Send + Sync + 'static) -> TestUpstream {
    TestUpstream::start(Settings::default(), respond)
}

/// A running test upstream; stops (and closes its connections) on drop.
pub struct TestUpstream {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl TestUpstream {
    /// Listens on a free loopback port and answers each request with `respond(req)`.
    pub fn start(
        settings: Settings,
        respond: impl Fn(&Received) -> Reply + Send + Sync + 'static,
    ) -> TestUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind test upstream");
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            received: Mutex::new(Vec::new()),
            connections: AtomicUsize::new(0),
            open: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            respond: Box::new(respond),
            settings,
        });
        let for_thread = Arc::clone(&shared);
        let acceptor = std::thread::spawn(move || accept_loop(listener, for_thread));
        TestUpstream {
            addr,
            shared,
            acceptor: Some(acceptor),
        }
    }

    /// `127.0.0.1:PORT`, as a config's `servers` entry wants it.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every request read so far, in arrival order.
    pub fn received(&self) -> Vec<Received> {
        self.shared.received.lock().unwrap().clone()
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// Connections open right now.
    pub fn open_connections(&self) -> usize {
        self.shared.open.load(Ordering::SeqCst)
    }
}

impl Drop for TestUpstream {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the acceptor.
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.acceptor.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for stream in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = stream else { continue };
        let id = shared.connections.fetch_add(1, Ordering::SeqCst);
        let shared = Arc::clone(&shared);
        shared.open.fetch_add(1, Ordering::SeqCst);
        std::thread::spawn(move || {
            serve_connection(stream, id, &shared);
            shared.open.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

/// Reads requests and answers them until the peer closes, a reply closes, or the
/// connection has been idle for `idle_close`.
fn serve_connection(mut s: TcpStream, connection: usize, shared: &Shared) {
    let _ = s.set_nodelay(true);
    let mut buf: Vec<u8> = Vec::new();
    let mut nth = 0;
    loop {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        if shared.settings.max_requests.is_some_and(|max| nth >= max) {
            let _ = s.shutdown(Shutdown::Both);
            return;
        }
        // Idle between requests: the idle timeout applies only while nothing is buffered.
        let idle = if buf.is_empty() {
            shared.settings.idle_close
        } else {
            None
        };
        let _ = s.set_read_timeout(Some(idle.unwrap_or(Duration::from_secs(60))));
        let pace = Pace(shared.settings.slow_read);
        let Some(req) = read_request(&mut s, &mut buf, connection, nth, pace) else {
            let _ = s.shutdown(Shutdown::Both);
            return;
        };
        nth += 1;
        let reply = (shared.respond)(&req);
        shared.received.lock().unwrap().push(req.clone());
        if !write_reply(&mut s, &reply, &req) {
            let _ = s.shutdown(Shutdown::Both);
            return;
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// How request bytes are read (`Settings::slow_read`).
#[derive(Clone, Copy)]
struct Pace(Option<(usize, Duration)>);

/// Reads into `buf` until it holds `n` bytes; false on EOF, error or timeout.
fn fill(s: &mut TcpStream, buf: &mut Vec<u8>, n: usize, pace: Pace) -> bool {
    let mut chunk = [0u8; 16 * 1024];
    let limit = pace
        .0
        .map_or(chunk.len(), |(bytes, _)| bytes.clamp(1, chunk.len()));
    while buf.len() < n {
        if let Some((_, pause)) = pace.0 {
            std::thread::sleep(pause);
        }
        match s.read(&mut chunk[..limit]) {
            Ok(0) => return false,
            Ok(k) => buf.extend_from_slice(&chunk[..k]),
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return false,
        }
    }
    true
}

/// Reads until `needle` is in `buf` (from `from`); returns its offset.
fn fill_until(
    s: &mut TcpStream,
    buf: &mut Vec<u8>,
    from: usize,
    needle: &[u8],
    pace: Pace,
) -> Option<usize> {
    loop {
        if let Some(i) = find(&buf[from..], needle) {
            return Some(from + i);
        }
        let want = buf.len() + 1;
        if !fill(s, buf, want, pace) {
            return None;
        }
    }
}

fn read_request(
    s: &mut TcpStream,
    buf: &mut Vec<u8>,
    connection: usize,
    nth: usize,
    pace: Pace,
) -> Option<Received> {
    let end = fill_until(s, buf, 0, b"\r\n\r\n", pace)?;
    // Once a request started, its body may take its time.
    let _ = s.set_read_timeout(Some(Duration::from_secs(60)));
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    buf.drain(..end + 4);
    let mut req = Received {
        connection,
        nth,
        head,
        body: Vec::new(),
        body_len: 0,
        body_hash: FNV_START,
        trailers: String::new(),
    };
    let chunked = req
        .headers("transfer-encoding")
        .any(|v| v.to_ascii_lowercase().contains("chunked"));
    if chunked {
        loop {
            let line_end = fill_until(s, buf, 0, b"\r\n", pace)?;
            let line = String::from_utf8_lossy(&buf[..line_end]).into_owned();
            let size = u64::from_str_radix(line.split(';').next()?.trim(), 16).ok()?;
            buf.drain(..line_end + 2);
            if size == 0 {
                // Trailer fields up to the empty line.
                let end = fill_until(s, buf, 0, b"\r\n", pace)?;
                if end > 0 {
                    let end = fill_until(s, buf, 0, b"\r\n\r\n", pace)?;
                    req.trailers = String::from_utf8_lossy(&buf[..end + 2]).into_owned();
                    buf.drain(..end + 4);
                } else {
                    buf.drain(..2);
                }
                break;
            }
            take_body(s, buf, size, pace, &mut req)?;
            if !fill(s, buf, 2, pace) || &buf[..2] != b"\r\n" {
                return None;
            }
            buf.drain(..2);
        }
    } else if let Some(len) = req
        .header("content-length")
        .and_then(|v| v.parse::<u64>().ok())
    {
        take_body(s, buf, len, pace, &mut req)?;
    }
    Some(req)
}

/// Moves `n` body bytes from the socket (through `buf`) into `req`.
fn take_body(
    s: &mut TcpStream,
    buf: &mut Vec<u8>,
    mut n: u64,
    pace: Pace,
    req: &mut Received,
) -> Option<()> {
    while n > 0 {
        if buf.is_empty() && !fill(s, buf, 1, pace) {
            return None;
        }
        let m = (buf.len() as u64).min(n) as usize;
        let part = &buf[..m];
        req.body_hash = fnv(req.body_hash, part);
        req.body_len += m as u64;
        let keep = KEEP_BODY.saturating_sub(req.body.len()).min(m);
        req.body.extend_from_slice(&part[..keep]);
        buf.drain(..m);
        n -= m as u64;
    }
    Some(())
}

/// Writes `bytes` `piece` at a time with `pause` between pieces.
fn write_paced(s: &mut TcpStream, bytes: &[u8], piece: usize, pause: Duration) -> bool {
    for (i, part) in bytes.chunks(piece.max(1)).enumerate() {
        if i > 0 && !pause.is_zero() {
            std::thread::sleep(pause);
        }
        if s.write_all(part).is_err() {
            return false;
        }
    }
    true
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        304 => "Not Modified",
        404 => "Not Found",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Whatever",
    }
}

/// The bytes of `reply` and whether the connection stays open after it.
fn render(reply: &Reply, req: &Received) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    match reply {
        Reply::Full {
            status,
            extra,
            body,
        } => {
            out.extend_from_slice(format!("HTTP/1.1 {status} {}\r\n", reason(*status)).as_bytes());
            for (n, v) in extra {
                out.extend_from_slice(format!("{n}: {v}\r\n").as_bytes());
            }
            let no_body = *status == 204 || *status == 304 || req.method() == "HEAD";
            out.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
            if !no_body {
                out.extend_from_slice(body);
            }
            (out, true)
        }
        Reply::Chunked {
            body,
            chunk,
            trailers,
        } => {
            out.extend_from_slice(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n");
            if !trailers.is_empty() {
                let names: Vec<&str> = trailers.iter().map(|(n, _)| n.as_str()).collect();
                out.extend_from_slice(format!("Trailer: {}\r\n", names.join(", ")).as_bytes());
            }
            out.extend_from_slice(b"\r\n");
            for part in body.chunks((*chunk).max(1)) {
                out.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
                out.extend_from_slice(part);
                out.extend_from_slice(b"\r\n");
            }
            out.extend_from_slice(b"0\r\n");
            for (n, v) in trailers {
                out.extend_from_slice(format!("{n}: {v}\r\n").as_bytes());
            }
            out.extend_from_slice(b"\r\n");
            (out, true)
        }
        Reply::CloseDelimited { body } => {
            out.extend_from_slice(
                b"HTTP/1.0 200 OK\r\nContent-Type: application/octet-stream\r\n\r\n",
            );
            out.extend_from_slice(body);
            (out, false)
        }
        Reply::CloseMidBody { body, after } => {
            out.extend_from_slice(
                format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len()).as_bytes(),
            );
            out.extend_from_slice(&body[..(*after).min(body.len())]);
            (out, false)
        }
        Reply::BothTeAndCl { body } => {
            out.extend_from_slice(
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n",
                    body.len(),
                    body.len()
                )
                .as_bytes(),
            );
            out.extend_from_slice(body);
            out.extend_from_slice(b"\r\n0\r\n\r\n");
            (out, true)
        }
        Reply::Garbage(bytes) => (bytes.clone(), false),
        Reply::Close => (Vec::new(), false),
        Reply::EarlyHints { body } => {
            out.extend_from_slice(
                b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n",
            );
            out.extend_from_slice(
                format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len()).as_bytes(),
            );
            out.extend_from_slice(body);
            (out, true)
        }
        Reply::Echo => {
            let mut body = req.head.clone().into_bytes();
            body.extend_from_slice(b"\r\n\r\n");
            body.extend_from_slice(&req.body);
            out.extend_from_slice(
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n",
                    body.len()
                )
                .as_bytes(),
            );
            out.extend_from_slice(&body);
            (out, true)
        }
        Reply::Large { len, chunked } => {
            // The head only: write_reply streams the body.
            let framing = if *chunked {
                "Transfer-Encoding: chunked".to_string()
            } else {
                format!("Content-Length: {len}")
            };
            out.extend_from_slice(format!("HTTP/1.1 200 OK\r\n{framing}\r\n\r\n").as_bytes());
            (out, true)
        }
        Reply::Slow { reply, .. } => render(reply, req),
        Reply::Written(_) => (out, true), // write_reply calls the writer
    }
}

/// Writes a [`Reply::Large`] body.
fn write_large(s: &mut TcpStream, len: u64, chunked: bool) -> bool {
    let mut piece = Vec::with_capacity(64 * 1024 + 16);
    let mut at = 0;
    while at < len {
        let n = (len - at).min(64 * 1024);
        piece.clear();
        if chunked {
            piece.extend_from_slice(format!("{n:x}\r\n").as_bytes());
        }
        piece.extend((at..at + n).map(pattern_byte));
        if chunked {
            piece.extend_from_slice(b"\r\n");
        }
        if s.write_all(&piece).is_err() {
            return false;
        }
        at += n;
    }
    !chunked || s.write_all(b"0\r\n\r\n").is_ok()
}

/// Writes the reply; false when the connection must close after it.
fn write_reply(s: &mut TcpStream, reply: &Reply, req: &Received) -> bool {
    let (bytes, keep) = render(reply, req);
    let client_closes = req
        .head
        .lines()
        .next()
        .is_some_and(|l| l.ends_with("HTTP/1.0"))
        || req
            .headers("connection")
            .any(|v| v.eq_ignore_ascii_case("close"));
    let keep = keep && !client_closes;
    let ok = match reply {
        Reply::Slow {
            before_head,
            piece,
            pause,
            ..
        } => {
            std::thread::sleep(*before_head);
            write_paced(s, &bytes, *piece, *pause)
        }
        Reply::Large { len, chunked } => {
            s.write_all(&bytes).is_ok()
                && (req.method() == "HEAD" || write_large(s, *len, *chunked))
        }
        Reply::Written(writer) => (writer.0)(s),
        _ => s.write_all(&bytes).is_ok(),
    };
    ok && keep
}

#[cfg(test)]
mod tests {
    //! The fixture's own checks: each fault puts on the wire what its name says.
    use super::*;

    fn exchange(up: &TestUpstream, request: &[u8]) -> Vec<u8> {
        let mut s = TcpStream::connect(up.addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(request).unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        out
    }

    const CLOSE: &[u8] = b"GET /x HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n";

    #[test]
    fn echo_records_the_request_and_keeps_the_connection() {
        let up = TestUpstream::start(
            Settings {
                max_requests: Some(2),
                ..Settings::default()
            },
            |_| Reply::Echo,
        );
        let out = exchange(
            &up,
            b"POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-T: 1\r\n\r\n\
              GET /b HTTP/1.1\r\nHost: h\r\n\r\n",
        );
        let text = String::from_utf8_lossy(&out);
        assert_eq!(text.matches("HTTP/1.1 200 OK").count(), 2, "{text}");
        let got = up.received();
        assert_eq!(
            (
                got[0].path(),
                got[0].body.as_slice(),
                got[0].trailers.as_str()
            ),
            ("/a", &b"abc"[..], "X-T: 1\r\n")
        );
        assert_eq!((got[1].connection, got[1].nth, got[1].path()), (0, 1, "/b"));
    }

    #[test]
    fn faults_put_their_shapes_on_the_wire() {
        let up = TestUpstream::start(Settings::default(), |req| match req.path() {
            "/both" => Reply::BothTeAndCl {
                body: b"hi".to_vec(),
            },
            "/cut" => Reply::CloseMidBody {
                body: vec![b'x'; 100],
                after: 10,
            },
            "/eof" => Reply::CloseDelimited {
                body: b"until close".to_vec(),
            },
            "/hints" => Reply::EarlyHints {
                body: b"ok".to_vec(),
            },
            "/trailers" => Reply::Chunked {
                body: b"abcdef".to_vec(),
                chunk: 4,
                trailers: vec![("X-Sum".into(), "6".into())],
            },
            _ => Reply::Garbage(b"NOT HTTP\r\n\r\n".to_vec()),
        });
        let get = |path: &str| {
            let req = String::from_utf8_lossy(CLOSE).replace("/x", path);
            String::from_utf8(exchange(&up, req.as_bytes())).unwrap()
        };
        let both = get("/both");
        assert!(
            both.contains("Content-Length: 2\r\n")
                && both.contains("Transfer-Encoding: chunked\r\n"),
            "{both}"
        );
        assert!(get("/cut").ends_with("\r\n\r\nxxxxxxxxxx"));
        assert_eq!(
            get("/eof"),
            "HTTP/1.0 200 OK\r\nContent-Type: application/octet-stream\r\n\r\nuntil close"
        );
        assert!(get("/hints").starts_with("HTTP/1.1 103 Early Hints\r\n"));
        assert!(get("/trailers").ends_with("4\r\nabcd\r\n2\r\nef\r\n0\r\nX-Sum: 6\r\n\r\n"));
        assert_eq!(get("/other"), "NOT HTTP\r\n\r\n");
    }

    #[test]
    fn large_bodies_are_streamed_and_hashed_both_ways() {
        let settings = Settings {
            slow_read: Some((16 * 1024, Duration::from_millis(1))),
            ..Settings::default()
        };
        let up = TestUpstream::start(settings, |req| Reply::Large {
            len: req.body_len,
            chunked: req.path() == "/chunked",
        });
        let len = 3 * 1024 * 1024 + 7;
        let body: Vec<u8> = (0..len).map(pattern_byte).collect();
        for path in ["/length", "/chunked"] {
            let mut s = TcpStream::connect(up.addr()).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            let head = format!(
                "POST {path} HTTP/1.1\r\nHost: h\r\nConnection: close\r\nContent-Length: {len}\r\n\r\n"
            );
            let writer = {
                let mut s = s.try_clone().unwrap();
                let body = body.clone();
                std::thread::spawn(move || {
                    s.write_all(head.as_bytes()).unwrap();
                    s.write_all(&body).unwrap();
                })
            };
            let mut out = Vec::new();
            s.read_to_end(&mut out).unwrap();
            writer.join().unwrap();
            let start = find(&out, b"\r\n\r\n").unwrap() + 4;
            if path == "/length" {
                assert_eq!(fnv(FNV_START, &out[start..]), pattern_hash(len));
            } else {
                assert!(out.ends_with(b"\r\n0\r\n\r\n"));
            }
        }
        let got = up.received();
        assert_eq!(got[0].body_len, len);
        assert_eq!(got[0].body_hash, pattern_hash(len));
        assert_eq!(got[0].body.len(), KEEP_BODY);
    }

    #[test]
    fn idle_connections_are_closed_after_the_idle_timeout() {
        let settings = Settings {
            idle_close: Some(Duration::from_millis(100)),
            ..Settings::default()
        };
        let up = TestUpstream::start(settings, |_| Reply::ok(b"x"));
        let mut s = TcpStream::connect(up.addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n").unwrap();
        let mut out = Vec::new();
        // The response, then EOF once the connection sat idle: read_to_end returns.
        s.read_to_end(&mut out).unwrap();
        assert!(
            out.ends_with(b"Content-Length: 1\r\n\r\nx"),
            "{}",
            String::from_utf8_lossy(&out)
        );
    }
}

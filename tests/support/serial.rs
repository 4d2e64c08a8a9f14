//! `SerialUpstream`: an application server that serves one connection at a time and
//! closes it after one response, as a thread-per-request app server with one worker
//! (gunicorn's sync worker) does. While it writes a response a slow client holds
//! back, or reads a body a slow client dribbles, nobody else is served: the test of
//! whether forkd shields it.
//!
//! Routes: `/tiny` (`ok`), `/big/N` (N bytes of [`super::upstream::pattern_byte`]
//! with `Content-Length`), `/upload` (reads the body, answers `LEN HASH` with the FNV
//! hash of [`super::upstream::fnv`]), `/events/N` (a `text/event-stream` of N events,
//! each sent only once the test allows it with [`SerialUpstream::release`]), and
//! `/held/N` (N bytes with `X-Accel-Buffering: no`). `/gated/N` and `/gated-held/N`
//! (the latter with `X-Accel-Buffering: no`) send the head and the first
//! [`FIRST_PIECE`] bytes, then wait for one [`SerialUpstream::release`] before the
//! rest, noting ([`SerialUpstream::stalled_at`]) how far they had got when their
//! socket first had no room: a response held back by a client that reads nothing.

use super::upstream::{fnv, pattern_byte, FNV_START};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// The body bytes `/gated/N` sends before it waits for a release.
pub const FIRST_PIECE: u64 = 1024;

/// What the upstream saw: each request's head, in order.
#[derive(Debug, Default)]
struct Seen {
    heads: Vec<String>,
}

struct Shared {
    seen: Mutex<Seen>,
    /// Connections accepted.
    connections: AtomicUsize,
    /// Responses written whole.
    done: AtomicUsize,
    /// Events `/events/N` may send so far.
    released: Mutex<usize>,
    wake: Condvar,
    stop: AtomicBool,
    /// Body bytes a `/gated/N` response had written when its socket first had no
    /// room (`u64::MAX`: not yet).
    stalled_at: AtomicU64,
}

pub struct SerialUpstream {
    addr: SocketAddr,
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SerialUpstream {
    pub fn start() -> SerialUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind serial upstream");
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            seen: Mutex::new(Seen::default()),
            connections: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            released: Mutex::new(0),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            stalled_at: AtomicU64::new(u64::MAX),
        });
        let s = shared.clone();
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.stop.load(SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                s.connections.fetch_add(1, SeqCst);
                let _ = conn.set_read_timeout(Some(Duration::from_secs(60)));
                let _ = conn.set_write_timeout(Some(Duration::from_secs(60)));
                if serve(conn, &s).is_ok() {
                    s.done.fetch_add(1, SeqCst);
                }
            }
        });
        SerialUpstream {
            addr,
            shared,
            thread: Some(thread),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.shared.connections.load(SeqCst)
    }

    /// Responses written whole so far.
    pub fn responses(&self) -> usize {
        self.shared.done.load(SeqCst)
    }

    /// The request heads received, in order.
    pub fn heads(&self) -> Vec<String> {
        self.shared.seen.lock().unwrap().heads.clone()
    }

    /// How many body bytes a `/gated/N` response had written when the socket to
    /// forkd first had no room for more; None while it never lacked room.
    pub fn stalled_at(&self) -> Option<u64> {
        Some(self.shared.stalled_at.load(SeqCst)).filter(|&n| n != u64::MAX)
    }

    /// Lets `/events/N` send `n` more events, or `/gated/N` its rest.
    pub fn release(&self, n: usize) {
        *self.shared.released.lock().unwrap() += n;
        self.shared.wake.notify_all();
    }
}

impl Drop for SerialUpstream {
    fn drop(&mut self) {
        self.shared.stop.store(true, SeqCst);
        self.release(1 << 20);
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One request, one response, then the connection closes.
fn serve(conn: TcpStream, s: &Shared) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut head = String::new();
    let mut length = 0u64;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        }
        head.push_str(&line);
        if line == "\r\n" {
            break;
        }
    }
    s.seen.lock().unwrap().heads.push(head.clone());
    let path = head.split(' ').nth(1).unwrap_or("/").to_string();
    let mut out = conn;
    if path == "/upload" {
        let (mut hash, mut left) = (FNV_START, length);
        let mut buf = [0u8; 16 * 1024];
        while left > 0 {
            let want = (left as usize).min(buf.len());
            let n = reader.read(&mut buf[..want])?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            hash = fnv(hash, &buf[..n]);
            left -= n as u64;
        }
        let body = format!("{length} {hash:x}");
        return write!(
            out,
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
    }
    if let Some(n) = path.strip_prefix("/events/") {
        let n: usize = n.parse().unwrap_or(1);
        write!(
            out,
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
        )?;
        for i in 0..n {
            let mut released = s.released.lock().unwrap();
            while *released == 0 {
                released = s.wake.wait(released).unwrap();
            }
            *released -= 1;
            drop(released);
            // One write per event: `write!` on a socket writes each piece of the
            // format on its own, forkd relays what each read got as a chunk, and the
            // test looks for each event whole between chunk framings.
            out.write_all(format!("data: event {i}\n\n").as_bytes())?;
            out.flush()?;
        }
        return Ok(());
    }
    if let Some((n, extra)) = path.strip_prefix("/gated/").map(|n| (n, "")).or_else(|| {
        path.strip_prefix("/gated-held/")
            .map(|n| (n, "X-Accel-Buffering: no\r\n"))
    }) {
        return serve_gated(out, s, n.parse().unwrap_or(0), extra);
    }
    let (len, extra) = if let Some(n) = path.strip_prefix("/big/") {
        (n.parse::<u64>().unwrap_or(0), "")
    } else if let Some(n) = path.strip_prefix("/held/") {
        (n.parse::<u64>().unwrap_or(0), "X-Accel-Buffering: no\r\n")
    } else {
        return write!(
            out,
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
        );
    };
    write!(
        out,
        "HTTP/1.1 200 OK\r\nContent-Length: {len}\r\n{extra}Connection: close\r\n\r\n"
    )?;
    write_pattern(&mut out, 0, len)
}

/// Body bytes `from..to` of [`pattern_byte`], in 64 KiB pieces.
fn write_pattern(out: &mut TcpStream, from: u64, to: u64) -> std::io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut at = from;
    while at < to {
        let n = (to - at).min(buf.len() as u64) as usize;
        for (k, b) in buf[..n].iter_mut().enumerate() {
            *b = pattern_byte(at + k as u64);
        }
        out.write_all(&buf[..n])?;
        at += n as u64;
    }
    Ok(())
}

/// `/gated/N`: the head and [`FIRST_PIECE`] bytes, a wait for a release, then the
/// rest, written without blocking until the socket first has no room (noted in
/// `stalled_at`), then blocking.
fn serve_gated(mut out: TcpStream, s: &Shared, len: u64, extra: &str) -> std::io::Result<()> {
    write!(
        out,
        "HTTP/1.1 200 OK\r\nContent-Length: {len}\r\n{extra}Connection: close\r\n\r\n"
    )?;
    let first = FIRST_PIECE.min(len);
    write_pattern(&mut out, 0, first)?;
    out.flush()?;
    let mut released = s.released.lock().unwrap();
    while *released == 0 {
        released = s.wake.wait(released).unwrap();
    }
    *released -= 1;
    drop(released);
    out.set_nonblocking(true)?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut at = first;
    while at < len {
        let n = (len - at).min(buf.len() as u64) as usize;
        for (k, b) in buf[..n].iter_mut().enumerate() {
            *b = pattern_byte(at + k as u64);
        }
        match out.write(&buf[..n]) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(w) => at += w as u64,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                s.stalled_at.store(at, SeqCst);
                out.set_nonblocking(false)?;
                return write_pattern(&mut out, at, len);
            }
            Err(e) => return Err(e),
        }
    }
    out.set_nonblocking(false)?;
    Ok(())
}

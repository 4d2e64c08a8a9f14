//! A countable, killable application server for balancing and failover tests: it
//! answers every GET with the load client's files (`load::small_body`, `big_body`
//! for `BIG_PATH`), after an optional delay (a slow server), and counts what it
//! answered; each response names it (`X-Backend: PORT`).
//!
//! [`Backend::kill`] is a crash between two responses: the listener closes and every
//! connection is shut down at once, including those with a request read and not yet
//! answered (they see no response byte), but never in the middle of writing a
//! response (a crash mid-body would be a truncated response no proxy can hide).
//!
//! Self-contained (std and `load`): include it with
//! `#[path = "support/backend.rs"] mod backend;`.
#![allow(dead_code)]

use crate::support::load::{big_body, small_body, BIG_PATH};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

struct Shared {
    dead: AtomicBool,
    served: AtomicU64,
    delay_us: AtomicU64,
    /// Sent back in `X-Backend`, so a test sees which server answered.
    port: u16,
    /// Every accepted connection; a writer holds the lock while it writes.
    conns: Mutex<Vec<Arc<Mutex<TcpStream>>>>,
}

/// A running backend; killed on drop.
pub struct Backend {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl Backend {
    /// Listens on a free loopback port; every response waits `delay` first.
    pub fn start(delay: Duration) -> Backend {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind backend");
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            dead: AtomicBool::new(false),
            served: AtomicU64::new(0),
            delay_us: AtomicU64::new(delay.as_micros() as u64),
            port: addr.port(),
            conns: Mutex::new(Vec::new()),
        });
        let for_thread = Arc::clone(&shared);
        let acceptor = std::thread::spawn(move || accept_loop(listener, for_thread));
        Backend {
            addr,
            shared,
            acceptor: Some(acceptor),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Responses written whole so far (and the one being written, if any).
    pub fn served(&self) -> u64 {
        self.shared.served.load(SeqCst)
    }

    /// Crashes it (see the module doc): refused from now on.
    pub fn kill(&mut self) {
        if self.shared.dead.swap(true, SeqCst) {
            return;
        }
        let _ = TcpStream::connect(self.addr); // wakes the acceptor
        if let Some(t) = self.acceptor.take() {
            let _ = t.join();
        }
        for conn in self.shared.conns.lock().unwrap().drain(..) {
            let s = conn.lock().unwrap();
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.kill();
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for stream in listener.incoming() {
        if shared.dead.load(SeqCst) {
            return;
        }
        let Ok(stream) = stream else { continue };
        let _ = stream.set_nodelay(true);
        let Ok(reader) = stream.try_clone() else {
            continue;
        };
        let writer = Arc::new(Mutex::new(stream));
        shared.conns.lock().unwrap().push(Arc::clone(&writer));
        let shared = Arc::clone(&shared);
        std::thread::spawn(move || serve(reader, &writer, &shared));
    }
}

fn serve(mut reader: TcpStream, writer: &Mutex<TcpStream>, shared: &Shared) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            match reader.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        buf.drain(..end + 4);
        let path = head.split(' ').nth(1).unwrap_or("/");
        let body = if path == BIG_PATH {
            big_body()
        } else {
            small_body()
        };
        let delay = shared.delay_us.load(SeqCst);
        if delay > 0 {
            std::thread::sleep(Duration::from_micros(delay));
        }
        let mut out = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Backend: {}\r\nContent-Length: {}\r\n\r\n",
            shared.port,
            body.len()
        )
        .into_bytes();
        out.extend_from_slice(body);
        let mut s = writer.lock().unwrap();
        if shared.dead.load(SeqCst) {
            return;
        }
        // Counted before the write: a client may read the last byte and ask
        // `served()` before this thread runs again. A failed write takes it back.
        shared.served.fetch_add(1, SeqCst);
        if let Err(e) = s.write_all(&out) {
            shared.served.fetch_sub(1, SeqCst);
            if e.kind() != ErrorKind::Interrupted {
                return;
            }
        }
    }
}

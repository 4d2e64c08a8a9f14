//! A misbehaving test upstream: raw bytes on `127.0.0.1:0`, scripted per connection.
//! Where `upstream::TestUpstream` is a well-behaved HTTP server with faults on demand,
//! this one does exactly the steps a test lists, in order, with no HTTP knowledge
//! beyond finding the end of a request head: answer before the request body is read,
//! send bytes past a response, split a head over several writes.
//!
//! ```ignore
//! let up = ScriptedUpstream::start(vec![
//!     Script::new()
//!         .read_head()
//!         .write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
//!         .read_bytes(5)
//!         .write(b"0\r\n\r\n"),
//! ]);
//! // ... a forkd config with `servers: ["{up.addr()}"]` ...
//! assert!(up.wait_finished(0, Duration::from_secs(10)));
//! ```
//!
//! Connection `i` (in accept order) runs script `i`; a connection beyond the scripts
//! is counted and closed at once. Each connection records every byte it read
//! ([`ScriptedUpstream::received`]) and how its script ended ([`Ended`]).
#![allow(dead_code)]

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long one read step waits for its bytes before the script fails.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(30);

/// One thing a scripted connection does.
#[derive(Debug, Clone)]
pub enum Step {
    /// Read up to and including the empty line that ends a request head.
    ReadHead,
    /// Read exactly this many bytes (a request body the test knows the length of).
    ReadBytes(usize),
    /// Read until these bytes have arrived (from where the last read step stopped).
    ReadUntil(Vec<u8>),
    /// Write these bytes, in one `write_all`.
    Write(Vec<u8>),
    /// Write each piece in its own `write_all` (`TCP_NODELAY`), with `pause` between
    /// them: the reader very likely gets them in separate reads.
    WriteSplit(Vec<Vec<u8>>, Duration),
    /// Wait this long (only to make a split likely, never for readiness).
    Pause(Duration),
    /// Read (and record) until the peer closes the connection.
    AwaitClose,
    /// Close the connection (both directions) and end the script.
    Close,
}

/// The steps of one connection, built in order.
#[derive(Debug, Clone, Default)]
pub struct Script(pub Vec<Step>);

impl Script {
    pub fn new() -> Script {
        Script(Vec::new())
    }
    pub fn read_head(self) -> Script {
        self.then(Step::ReadHead)
    }
    pub fn read_bytes(self, n: usize) -> Script {
        self.then(Step::ReadBytes(n))
    }
    pub fn read_until(self, needle: &[u8]) -> Script {
        self.then(Step::ReadUntil(needle.to_vec()))
    }
    pub fn write(self, bytes: &[u8]) -> Script {
        self.then(Step::Write(bytes.to_vec()))
    }
    /// `pieces` in separate writes, `pause` apart.
    pub fn write_split(self, pieces: &[&[u8]], pause: Duration) -> Script {
        let pieces = pieces.iter().map(|p| p.to_vec()).collect();
        self.then(Step::WriteSplit(pieces, pause))
    }
    pub fn pause(self, d: Duration) -> Script {
        self.then(Step::Pause(d))
    }
    pub fn await_close(self) -> Script {
        self.then(Step::AwaitClose)
    }
    pub fn close(self) -> Script {
        self.then(Step::Close)
    }
    pub fn then(mut self, step: Step) -> Script {
        self.0.push(step);
        self
    }
}

/// How a connection's script ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// Every step ran.
    Finished,
    /// Step `step` could not run: the peer closed, or an I/O error, or a read step
    /// waited [`STEP_TIMEOUT`] (`why` says which).
    Failed { step: usize, why: String },
    /// A connection beyond the scripts: closed at once.
    Unscripted,
}

#[derive(Debug, Default)]
struct Connection {
    /// Every byte read on it, in order.
    received: Vec<u8>,
    /// None while the script runs.
    ended: Option<Ended>,
}

#[derive(Default)]
struct Shared {
    connections: Mutex<Vec<Connection>>,
    changed: Condvar,
    stop: AtomicBool,
}

/// A running scripted upstream; stops on drop (scripts still running are cut off
/// at their next step).
pub struct ScriptedUpstream {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl ScriptedUpstream {
    /// Listens on a free loopback port; connection `i` runs `scripts[i]`.
    pub fn start(scripts: Vec<Script>) -> ScriptedUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind scripted upstream");
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared::default());
        let for_thread = Arc::clone(&shared);
        let acceptor = std::thread::spawn(move || accept_loop(listener, scripts, for_thread));
        ScriptedUpstream {
            addr,
            shared,
            acceptor: Some(acceptor),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections accepted so far (scripted or not).
    pub fn connections(&self) -> usize {
        self.shared.connections.lock().unwrap().len()
    }

    /// The bytes connection `i` read so far.
    pub fn received(&self, i: usize) -> Vec<u8> {
        let conns = self.shared.connections.lock().unwrap();
        conns.get(i).map(|c| c.received.clone()).unwrap_or_default()
    }

    /// How connection `i` ended; None while it runs (or before it was accepted).
    pub fn ended(&self, i: usize) -> Option<Ended> {
        let conns = self.shared.connections.lock().unwrap();
        conns.get(i).and_then(|c| c.ended.clone())
    }

    /// Waits (at most `timeout`) until connection `i`'s script ended; how it did.
    pub fn wait_ended(&self, i: usize, timeout: Duration) -> Option<Ended> {
        let deadline = Instant::now() + timeout;
        let mut conns = self.shared.connections.lock().unwrap();
        loop {
            if let Some(ended) = conns.get(i).and_then(|c| c.ended.clone()) {
                return Some(ended);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            conns = self.shared.changed.wait_timeout(conns, left).unwrap().0;
        }
    }

    /// Whether connection `i` ran every step of its script (waits at most `timeout`).
    pub fn wait_finished(&self, i: usize, timeout: Duration) -> bool {
        self.wait_ended(i, timeout) == Some(Ended::Finished)
    }
}

impl Drop for ScriptedUpstream {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr); // wakes the acceptor
        if let Some(t) = self.acceptor.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: TcpListener, scripts: Vec<Script>, shared: Arc<Shared>) {
    let mut scripts = scripts.into_iter();
    for stream in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = stream else { continue };
        let index = {
            let mut conns = shared.connections.lock().unwrap();
            conns.push(Connection::default());
            conns.len() - 1
        };
        let script = scripts.next();
        let shared = Arc::clone(&shared);
        std::thread::spawn(move || {
            let ended = match script {
                Some(script) => run(stream, &script, index, &shared),
                None => {
                    let _ = stream.shutdown(Shutdown::Both);
                    Ended::Unscripted
                }
            };
            shared.connections.lock().unwrap()[index].ended = Some(ended);
            shared.changed.notify_all();
        });
    }
}

/// A connection running its script: the bytes read and not yet taken by a read step.
struct Runner<'a> {
    s: TcpStream,
    buf: Vec<u8>,
    index: usize,
    shared: &'a Shared,
}

fn run(s: TcpStream, script: &Script, index: usize, shared: &Shared) -> Ended {
    let _ = s.set_nodelay(true);
    let _ = s.set_read_timeout(Some(STEP_TIMEOUT));
    let mut r = Runner {
        s,
        buf: Vec::new(),
        index,
        shared,
    };
    for (i, step) in script.0.iter().enumerate() {
        if shared.stop.load(Ordering::SeqCst) {
            return Ended::Failed {
                step: i,
                why: "the upstream stopped".into(),
            };
        }
        if let Err(why) = r.step(step) {
            let _ = r.s.shutdown(Shutdown::Both);
            return Ended::Failed { step: i, why };
        }
        if matches!(step, Step::Close) {
            break;
        }
    }
    Ended::Finished
}

impl Runner<'_> {
    fn step(&mut self, step: &Step) -> Result<(), String> {
        match step {
            Step::ReadHead => self.take_until(b"\r\n\r\n"),
            Step::ReadUntil(needle) => self.take_until(needle),
            Step::ReadBytes(n) => {
                while self.buf.len() < *n {
                    self.fill()?;
                }
                self.buf.drain(..*n);
                Ok(())
            }
            Step::Write(bytes) => self.write(bytes),
            Step::WriteSplit(pieces, pause) => {
                for (i, piece) in pieces.iter().enumerate() {
                    if i > 0 {
                        std::thread::sleep(*pause);
                    }
                    self.write(piece)?;
                }
                Ok(())
            }
            Step::Pause(d) => {
                std::thread::sleep(*d);
                Ok(())
            }
            Step::AwaitClose => loop {
                match self.fill() {
                    Ok(()) => self.buf.clear(),
                    // A timeout is the script's failure; EOF or a reset is the close.
                    Err(why) if why.starts_with("no bytes") => return Err(why),
                    Err(_) => return Ok(()),
                }
            },
            Step::Close => {
                let _ = self.s.shutdown(Shutdown::Both);
                Ok(())
            }
        }
    }

    /// Reads until `needle` is buffered, then drops the buffer through it.
    fn take_until(&mut self, needle: &[u8]) -> Result<(), String> {
        loop {
            if let Some(at) = self.buf.windows(needle.len()).position(|w| w == needle) {
                self.buf.drain(..at + needle.len());
                return Ok(());
            }
            self.fill()?;
        }
    }

    /// One read, recorded; "closed" on EOF.
    fn fill(&mut self) -> Result<(), String> {
        let mut chunk = [0u8; 16 * 1024];
        loop {
            match self.s.read(&mut chunk) {
                Ok(0) => return Err("closed".into()),
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    let mut conns = self.shared.connections.lock().unwrap();
                    conns[self.index].received.extend_from_slice(&chunk[..n]);
                    return Ok(());
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Err(format!("no bytes within {STEP_TIMEOUT:?}"))
                }
                Err(e) => return Err(e.to_string()),
            }
        }
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.s.write_all(bytes).map_err(|e| format!("write: {e}"))?;
        self.s.flush().map_err(|e| format!("flush: {e}"))
    }
}

//! A WebSocket echo server for the tunnel tests: tungstenite's server side on a std
//! `TcpListener`, a thread per connection. It keeps every request head it received
//! (to see what forkd forwarded) and how each connection ended. A request without
//! `Upgrade` is answered `426 Upgrade Required` (and the connection closed), as a
//! WebSocket-only application would.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tungstenite::{Error, Message};

/// How a connection of the echo server ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// The client sent a close frame (answered).
    CloseFrame,
    /// The TCP connection ended (EOF) without a close frame.
    Eof,
    /// It was reset.
    Reset,
    /// Anything else, as text.
    Other(String),
    /// A plain HTTP request, answered 426.
    NotUpgraded,
}

#[derive(Default)]
struct Seen {
    heads: Vec<String>,
    ends: Vec<End>,
    echoed: u64,
}

pub struct WsEcho {
    addr: SocketAddr,
    seen: Arc<Mutex<Seen>>,
}

impl WsEcho {
    pub fn start() -> WsEcho {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let shared = Arc::clone(&seen);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let seen = Arc::clone(&shared);
                std::thread::spawn(move || serve(stream, &seen));
            }
        });
        WsEcho { addr, seen }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The request heads received, in order.
    pub fn heads(&self) -> Vec<String> {
        self.seen.lock().unwrap().heads.clone()
    }

    /// How the connections that ended did.
    pub fn ends(&self) -> Vec<End> {
        self.seen.lock().unwrap().ends.clone()
    }

    /// Messages echoed, all connections together.
    pub fn echoed(&self) -> u64 {
        self.seen.lock().unwrap().echoed
    }
}

/// A stream that first yields bytes already read (the request head, read here to
/// record it), then the socket's.
struct Replay {
    read: Vec<u8>,
    at: usize,
    inner: TcpStream,
}

impl Read for Replay {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.at < self.read.len() {
            let n = buf.len().min(self.read.len() - self.at);
            buf[..n].copy_from_slice(&self.read[self.at..self.at + n]);
            self.at += n;
            return Ok(n);
        }
        self.inner.read(buf)
    }
}

impl Write for Replay {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.inner.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

fn serve(mut stream: TcpStream, seen: &Mutex<Seen>) {
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    let mut read = Vec::new();
    let mut buf = [0u8; 4096];
    let head_end = loop {
        if let Some(at) = read.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => read.extend_from_slice(&buf[..n]),
        }
    };
    let head = String::from_utf8_lossy(&read[..head_end]).into_owned();
    let upgrade = head
        .lines()
        .any(|l| l.to_ascii_lowercase().starts_with("upgrade:"));
    seen.lock().unwrap().heads.push(head);
    if !upgrade {
        let _ = stream.write_all(
            b"HTTP/1.1 426 Upgrade Required\r\nUpgrade: websocket\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        );
        seen.lock().unwrap().ends.push(End::NotUpgraded);
        return;
    }
    let replay = Replay {
        read,
        at: 0,
        inner: stream,
    };
    let mut ws = match tungstenite::accept(replay) {
        Ok(ws) => ws,
        Err(e) => {
            seen.lock().unwrap().ends.push(End::Other(e.to_string()));
            return;
        }
    };
    let end = loop {
        match ws.read() {
            Ok(m @ (Message::Text(_) | Message::Binary(_))) => {
                if let Err(e) = ws.send(m) {
                    break end_of(e);
                }
                seen.lock().unwrap().echoed += 1;
            }
            Ok(Message::Close(_)) => {
                // tungstenite queues the reply; flushing sends it.
                let _ = ws.flush();
                break End::CloseFrame;
            }
            Ok(_) => {}
            Err(Error::ConnectionClosed) => break End::CloseFrame,
            Err(e) => break end_of(e),
        }
    };
    seen.lock().unwrap().ends.push(end);
}

/// What a tungstenite error says about how the connection ended.
pub fn end_of(e: Error) -> End {
    match e {
        Error::Protocol(tungstenite::error::ProtocolError::ResetWithoutClosingHandshake) => {
            End::Eof
        }
        Error::Io(e)
            if matches!(
                e.kind(),
                io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
            ) =>
        {
            End::Reset
        }
        Error::Io(e) if e.kind() == io::ErrorKind::UnexpectedEof => End::Eof,
        other => End::Other(other.to_string()),
    }
}

/// The client's side of the closing handshake: sends a close frame, reads until the
/// server's answer ends the connection (panics on anything else), and drops the
/// client's socket, so forkd sees the tunnel's client go.
pub fn close_handshake<S: Read + Write>(mut ws: tungstenite::WebSocket<S>) {
    ws.close(None).unwrap();
    loop {
        match ws.read() {
            Ok(_) => {}
            Err(Error::ConnectionClosed) => return,
            Err(e) => panic!("closing handshake failed: {e}"),
        }
    }
}

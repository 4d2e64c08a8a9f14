//! The TLS floor (forkd issue #23): the least a server does per keep-alive request over
//! TLS 1.3 with rustls on this kernel. `bench/tls` runs it beside forkd and nginx, pinned
//! to the same CPU, with the same certificate, answering with the very bytes forkd
//! answers (captured from forkd over TLS).
//!
//! ```text
//! forkd-tls-floor PORT CERT_PEM KEY_PEM RESPONSE_FILE
//! ```
//!
//! One thread, mio (epoll, edge-triggered), rustls with the ring provider as forkd
//! builds it, TLS 1.3 only, ALPN `http/1.1`. Per keep-alive request: one `recv` of
//! the encrypted request (a read shorter than the buffer has drained the socket: the
//! next bytes are a new edge), rustls decrypts it, the only parsing is finding where
//! each head ends (CRLF CRLF), and the canned response is encrypted and sent in one
//! `writev` (rustls' `write_tls`). Pipelined requests are answered in order. No
//! `Connection: close` handling: the client closes. Prints `ready` once listening.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::{env, fs, process};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ServerConfig, ServerConnection};

const LISTENER: Token = Token(usize::MAX);
/// Encrypted bytes read per `recv`: more than a client's requests between two responses.
const READ_BUF: usize = 16 * 1024;
/// Plaintext kept for one head that has not ended yet.
const MAX_HEAD: usize = 8 * 1024;

/// Why the floor could not start.
#[derive(Debug)]
enum StartError {
    Usage,
    Read(String, io::Error),
    Pem(String, rustls::pki_types::pem::Error),
    Tls(rustls::Error),
    Listen(io::Error),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Usage => write!(
                f,
                "usage: forkd-tls-floor PORT CERT_PEM KEY_PEM RESPONSE_FILE"
            ),
            StartError::Read(path, e) => write!(f, "reading {path}: {e}"),
            StartError::Pem(path, e) => write!(f, "parsing {path}: {e:?}"),
            StartError::Tls(e) => write!(f, "TLS configuration: {e}"),
            StartError::Listen(e) => write!(f, "listening: {e}"),
        }
    }
}

/// What ends a connection.
enum Closed {
    Peer,
    Io(io::Error),
    Tls(rustls::Error),
    HeadTooLarge,
}

struct Conn {
    sock: TcpStream,
    tls: ServerConnection,
    /// Plaintext of a head not ended yet.
    head: Vec<u8>,
}

struct Floor {
    config: Arc<ServerConfig>,
    response: Vec<u8>,
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    read_buf: Vec<u8>,
    plain: Vec<u8>,
}

fn main() {
    if let Err(e) = run() {
        eprintln!("forkd-tls-floor: {e}");
        process::exit(if matches!(e, StartError::Usage) { 2 } else { 1 });
    }
}

fn run() -> Result<(), StartError> {
    let args: Vec<String> = env::args().skip(1).collect();
    let [port, cert, key, response] = args.as_slice() else {
        return Err(StartError::Usage);
    };
    let port: u16 = port.parse().map_err(|_| StartError::Usage)?;
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| StartError::Pem(cert.clone(), e))?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| StartError::Pem(key.clone(), e))?;
    let response = fs::read(response).map_err(|e| StartError::Read(response.clone(), e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(StartError::Tls)?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(StartError::Tls)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];

    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut listener = TcpListener::bind(addr).map_err(StartError::Listen)?;
    let mut poll = Poll::new().map_err(StartError::Listen)?;
    poll.registry()
        .register(&mut listener, LISTENER, Interest::READABLE)
        .map_err(StartError::Listen)?;
    println!("ready");
    let mut floor = Floor {
        config: Arc::new(config),
        response,
        conns: Vec::new(),
        free: Vec::new(),
        read_buf: vec![0; READ_BUF],
        plain: vec![0; READ_BUF],
    };
    let mut events = Events::with_capacity(256);
    loop {
        if let Err(e) = poll.poll(&mut events, None) {
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(StartError::Listen(e));
        }
        for event in events.iter() {
            match event.token() {
                LISTENER => floor.accept(&listener, &poll),
                Token(i) => floor.ready(i, event.is_readable() || event.is_read_closed()),
            }
        }
    }
}

impl Floor {
    fn accept(&mut self, listener: &TcpListener, poll: &Poll) {
        loop {
            let (mut sock, _) = match listener.accept() {
                Ok(accepted) => accepted,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    eprintln!("forkd-tls-floor: accept: {e}");
                    return;
                }
            };
            let Ok(tls) = ServerConnection::new(self.config.clone()) else {
                continue;
            };
            if sock.set_nodelay(true).is_err() {
                continue;
            }
            let i = self.free.pop().unwrap_or_else(|| {
                self.conns.push(None);
                self.conns.len() - 1
            });
            let interest = Interest::READABLE | Interest::WRITABLE;
            if poll
                .registry()
                .register(&mut sock, Token(i), interest)
                .is_err()
            {
                self.free.push(i);
                continue;
            }
            self.conns[i] = Some(Conn {
                sock,
                tls,
                head: Vec::new(),
            });
        }
    }

    /// An edge on connection i: reads (when readable) and writes what is pending.
    fn ready(&mut self, i: usize, readable: bool) {
        let Some(conn) = self.conns.get_mut(i).and_then(Option::as_mut) else {
            return;
        };
        let result = match readable {
            true => serve(conn, &mut self.read_buf, &mut self.plain, &self.response),
            false => Ok(()),
        }
        .and_then(|()| flush(conn));
        if let Err(why) = result {
            match why {
                Closed::Peer => {}
                Closed::Io(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
                    ) => {}
                Closed::Io(e) => eprintln!("forkd-tls-floor: connection {i}: {e}"),
                Closed::Tls(e) => {
                    let _ = flush(conn); // the alert rustls queued
                    eprintln!("forkd-tls-floor: connection {i}: TLS: {e}");
                }
                Closed::HeadTooLarge => {
                    eprintln!("forkd-tls-floor: a request head over {MAX_HEAD} bytes")
                }
            }
            self.conns[i] = None; // dropping the socket closes it (and leaves epoll)
            self.free.push(i);
        }
    }
}

/// Reads until the socket is drained, decrypts, queues one encrypted response per
/// complete head.
fn serve(conn: &mut Conn, buf: &mut [u8], plain: &mut [u8], response: &[u8]) -> Result<(), Closed> {
    loop {
        let n = match conn.sock.read(buf) {
            Ok(0) => return Err(Closed::Peer),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Closed::Io(e)),
        };
        let mut encrypted = &buf[..n];
        while !encrypted.is_empty() {
            conn.tls.read_tls(&mut encrypted).map_err(Closed::Io)?;
            conn.tls.process_new_packets().map_err(Closed::Tls)?;
        }
        loop {
            let got = match conn.tls.reader().read(plain) {
                Ok(0) => return Err(Closed::Peer), // close_notify
                Ok(got) => got,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(Closed::Io(e)),
            };
            answer(conn, &plain[..got], response)?;
        }
        if n < buf.len() {
            return Ok(()); // a short read: the socket is drained
        }
    }
}

/// Appends plaintext to the head being read; for each head that ends, the response.
fn answer(conn: &mut Conn, mut bytes: &[u8], response: &[u8]) -> Result<(), Closed> {
    while let Some(end) = head_end(&conn.head, bytes) {
        conn.head.clear();
        bytes = &bytes[end..];
        conn.tls.writer().write_all(response).map_err(Closed::Io)?;
    }
    if conn.head.len() + bytes.len() > MAX_HEAD {
        return Err(Closed::HeadTooLarge);
    }
    conn.head.extend_from_slice(bytes);
    Ok(())
}

/// Where in `bytes` the head whose start is `kept` ends (just past its CRLF CRLF).
fn head_end(kept: &[u8], bytes: &[u8]) -> Option<usize> {
    // The CRLF CRLF may straddle the kept bytes and the new ones.
    let tail = &kept[kept.len().saturating_sub(3)..];
    let mut joined = [0u8; 6];
    let lead = bytes.len().min(3);
    joined[..tail.len()].copy_from_slice(tail);
    joined[tail.len()..tail.len() + lead].copy_from_slice(&bytes[..lead]);
    if let Some(at) = find(&joined[..tail.len() + lead], b"\r\n\r\n") {
        return Some(at + 4 - tail.len());
    }
    find(bytes, b"\r\n\r\n").map(|at| at + 4)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Sends what rustls has encrypted; the rest waits for the next writable edge.
fn flush(conn: &mut Conn) -> Result<(), Closed> {
    while conn.tls.wants_write() {
        match conn.tls.write_tls(&mut conn.sock) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Closed::Io(e)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_end_is_found_within_new_bytes_and_across_two_reads() {
        assert_eq!(head_end(b"", b"GET / HTTP/1.1\r\n\r\nGET"), Some(18));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n\r", b"\nGET"), Some(1));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n", b"\r\n"), Some(2));
        assert_eq!(head_end(b"GET / HTTP/1.1\r", b"\n"), None);
        assert_eq!(head_end(b"", b""), None);
    }
}

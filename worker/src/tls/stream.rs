//! [`Transport`]: what a connection reads and writes. Plain, it is the socket; with
//! TLS, reads take records from the socket into rustls and return plaintext, writes
//! hand plaintext to rustls and push the records it makes to the socket, all on the
//! one non-blocking socket (no thread, no async runtime).
//!
//! Records rustls made but the socket did not take yet are output still pending:
//! [`Transport::pending`] makes the connection wait for writability, and
//! [`Transport::push`] sends them. The handshake runs inside reads: a read that
//! finishes it counts it (full or resumed, version, cipher); one that fails counts
//! the failure, sends rustls' alert and ends the connection, without a log line.

use crate::out::Sink;
use crate::stats::Stats;
use forkd_shared::shm::counters;
use mio::net::TcpStream;
use rustls::{CipherSuite, HandshakeKind, ProtocolVersion, ServerConnection};
use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsFd, BorrowedFd};

/// A connection's TLS session, if its address speaks TLS: one word, so a `Conn`
/// stays small (the socket is the connection's own field; [`Transport`] joins them).
#[derive(Default)]
pub struct Tls(Option<Box<Session>>);

/// The socket and the session of one connection, borrowed together to read or write.
pub struct Transport<'a> {
    tcp: &'a mut TcpStream,
    tls: &'a mut Tls,
}

struct Session {
    conn: ServerConnection,
    state: State,
    /// The last read of the socket was short (or found it empty): nothing more is
    /// there until the next readiness event.
    drained: bool,
}

/// The socket as rustls reads it, noting whether the read was short: a short read of
/// a stream socket drained it (the same rule as a plain connection's reads).
struct Drain<'a> {
    tcp: &'a mut TcpStream,
    short: bool,
}

impl Read for Drain<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let r = self.tcp.read(buf);
        self.short = match &r {
            Ok(n) => *n < buf.len(),
            Err(e) => e.kind() == io::ErrorKind::WouldBlock,
        };
        r
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Handshaking,
    Established,
}

impl Tls {
    /// No TLS: a plain HTTP address.
    pub fn none() -> Tls {
        Tls(None)
    }

    pub fn server(conn: ServerConnection) -> Tls {
        Tls(Some(Box::new(Session {
            conn,
            state: State::Handshaking,
            drained: false,
        })))
    }

    /// The handshake is done and the client chose HTTP/2 by ALPN.
    pub fn chose_h2(&self) -> bool {
        self.0
            .as_ref()
            .is_some_and(|s| s.state == State::Established && s.conn.alpn_protocol() == Some(b"h2"))
    }

    /// Moves the session out (to an HTTP/2 connection's link), leaving none.
    pub fn take(&mut self) -> Tls {
        std::mem::take(self)
    }

    /// Whether the connection speaks TLS.
    pub fn is_tls(&self) -> bool {
        self.0.is_some()
    }

    /// TLS records are waiting for the socket to take them.
    pub fn pending(&self) -> bool {
        self.0.as_ref().is_some_and(|s| s.conn.wants_write())
    }

    /// Whether a read that returned `n` of `space` bytes may have left input unread:
    /// a full read may have (rustls may hold more plaintext, the socket more bytes);
    /// plain, a short read drained the socket; with TLS, a short read of plaintext
    /// emptied rustls' plaintext, and the socket is drained when rustls' last read of
    /// it was short. (Saying "maybe" after every TLS read cost each request a second
    /// `recvfrom` that found the socket empty.)
    pub fn may_have_more(&self, n: usize, space: usize) -> bool {
        n == space || self.0.as_ref().is_some_and(|s| !s.drained)
    }
}

impl<'a> Transport<'a> {
    pub fn new(tcp: &'a mut TcpStream, tls: &'a mut Tls) -> Transport<'a> {
        Transport { tcp, tls }
    }

    /// [`Tls::may_have_more`] of its session.
    pub fn may_have_more(&self, n: usize, space: usize) -> bool {
        self.tls.may_have_more(n, space)
    }

    /// Peeks at the socket itself (ciphertext under TLS): `Ok(0)` says the peer
    /// closed, whatever it said before (the proxy's "did the client leave?").
    pub fn peek(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.tcp.peek(buf)
    }

    /// Sends pending TLS records: `Ok(true)` when none are left.
    pub fn push(&mut self) -> io::Result<bool> {
        let Some(s) = self.tls.0.as_deref_mut() else {
            return Ok(true);
        };
        while s.conn.wants_write() {
            match s.conn.write_tls(&mut self.tcp) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Reads plaintext into `buf` (the handshake, counted in `stats`, runs inside).
    /// `Ok(0)` is the end of the stream.
    pub fn read_counted(&mut self, buf: &mut [u8], stats: &Stats) -> io::Result<usize> {
        self.read_into(buf, Some(stats))
    }

    /// Reads plaintext into `buf` once the handshake is done (an HTTP/2 connection's
    /// link, which has no stats to count a handshake in). `Ok(0)` is the end.
    pub fn read_plain(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_into(buf, None)
    }

    fn read_into(&mut self, buf: &mut [u8], stats: Option<&Stats>) -> io::Result<usize> {
        let Some(s) = self.tls.0.as_deref_mut() else {
            return self.tcp.read(buf);
        };
        loop {
            match s.conn.reader().read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            let mut socket = Drain {
                tcp: &mut *self.tcp,
                short: false,
            };
            let read = s.conn.read_tls(&mut socket);
            s.drained = socket.short;
            match read {
                Ok(0) => return Ok(0),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e), // WouldBlock: nothing more now
            }
            if let Err(e) = s.conn.process_new_packets() {
                if let Some(stats) = stats {
                    count_failure(&e, s.state, stats);
                }
                // rustls queued an alert saying why: best effort, then close.
                let _ = s.conn.write_tls(&mut self.tcp);
                return Err(io::Error::new(io::ErrorKind::InvalidData, e));
            }
            if s.state == State::Handshaking && !s.conn.is_handshaking() {
                s.state = State::Established;
                if let Some(stats) = stats {
                    count_handshake(&s.conn, stats);
                }
            }
            // Handshake messages (and tickets) go out as soon as they are made; a full
            // socket leaves them pending for the connection's next write.
            while s.conn.wants_write() {
                match s.conn.write_tls(&mut self.tcp) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(e),
                }
            }
        }
    }

    /// Before closing: with TLS, a `close_notify`, so the client knows the response
    /// was not cut short (best effort: a full socket drops it).
    pub fn close_notify(&mut self) {
        if let Some(s) = self.tls.0.as_deref_mut() {
            if s.state == State::Established {
                s.conn.send_close_notify();
                let _ = self.push();
            }
        }
    }

    /// Shuts the sending side down: with TLS, after a `close_notify`.
    pub fn shutdown_write(&mut self) -> io::Result<()> {
        if let Some(s) = self.tls.0.as_deref_mut() {
            if s.state == State::Established {
                s.conn.send_close_notify();
            }
            let _ = self.push();
        }
        self.tcp.shutdown(Shutdown::Write)
    }
}

impl Transport<'_> {
    /// Hands plaintext to rustls (`write` is given its writer) and pushes the records
    /// it makes. Records made earlier go first, so rustls' buffer stays one
    /// socket-full; what the socket does not take now stays pending.
    fn write_tls(
        &mut self,
        has_bytes: bool,
        write: impl FnOnce(&mut rustls::Writer<'_>) -> io::Result<usize>,
    ) -> io::Result<usize> {
        if !self.push()? {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let s = self.tls.0.as_deref_mut().expect("a TLS connection");
        let n = write(&mut s.conn.writer())?;
        if n == 0 && has_bytes {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        self.push()?;
        Ok(n)
    }
}

impl Write for Transport<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if !self.tls.is_tls() {
            return self.tcp.write(buf);
        }
        self.write_tls(!buf.is_empty(), |w| w.write(buf))
    }

    /// Plain, one `writev`: a response head and the body bytes after it leave in one
    /// system call and one segment (`Write`'s default would send the first slice
    /// alone). With TLS, rustls takes all the slices and makes the records at once.
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        if !self.tls.is_tls() {
            return self.tcp.write_vectored(bufs);
        }
        self.write_tls(bufs.iter().any(|b| !b.is_empty()), |w| {
            w.write_vectored(bufs)
        })
    }

    fn flush(&mut self) -> io::Result<()> {
        match self.push()? {
            true => Ok(()),
            false => Err(io::ErrorKind::WouldBlock.into()),
        }
    }
}

impl Sink for Transport<'_> {
    /// Under TLS a file's bytes go through rustls (read, then encrypted).
    fn sendfile_fd(&self) -> Option<BorrowedFd<'_>> {
        (!self.tls.is_tls()).then(|| self.tcp.as_fd())
    }
}

fn count_handshake(conn: &ServerConnection, stats: &Stats) {
    let kind = match conn.handshake_kind() {
        Some(HandshakeKind::Resumed) => counters::TLS_HANDSHAKES_RESUMED,
        _ => counters::TLS_HANDSHAKES_FULL,
    };
    stats.bump(kind, 1);
    match conn.protocol_version() {
        Some(ProtocolVersion::TLSv1_3) => stats.bump(counters::TLS_VERSION_13, 1),
        Some(ProtocolVersion::TLSv1_2) => stats.bump(counters::TLS_VERSION_12, 1),
        _ => {}
    }
    if let Some(suite) = conn.negotiated_cipher_suite() {
        let cipher = match suite.suite() {
            CipherSuite::TLS13_AES_128_GCM_SHA256
            | CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
            | CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 => {
                Some(counters::TLS_CIPHER_AES128GCM)
            }
            CipherSuite::TLS13_AES_256_GCM_SHA384
            | CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384
            | CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384 => {
                Some(counters::TLS_CIPHER_AES256GCM)
            }
            CipherSuite::TLS13_CHACHA20_POLY1305_SHA256
            | CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
            | CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256 => {
                Some(counters::TLS_CIPHER_CHACHA20)
            }
            _ => None,
        };
        if let Some(c) = cipher {
            stats.bump(c, 1);
        }
    }
}

fn count_failure(e: &rustls::Error, state: State, stats: &Stats) {
    match e {
        // Not a TLS record at all before the handshake: plain HTTP on an HTTPS port.
        rustls::Error::InvalidMessage(_) if state == State::Handshaking => {
            stats.bump(counters::TLS_NOT_TLS, 1);
        }
        rustls::Error::AlertReceived(_) => {
            stats.bump(counters::TLS_ALERTS_RECEIVED, 1);
            if state == State::Handshaking {
                stats.bump(counters::TLS_HANDSHAKES_FAILED, 1);
            }
        }
        _ if state == State::Handshaking => stats.bump(counters::TLS_HANDSHAKES_FAILED, 1),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::IoSlice;

    /// A plain connection's head and body leave in one `writev`: both slices are
    /// taken by one call, not only the first (which cost a second system call and a
    /// second segment per proxied response).
    #[test]
    fn a_plain_vectored_write_takes_every_slice_in_one_call() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        accepted.set_nonblocking(true).unwrap();
        let mut tcp = TcpStream::from_std(accepted);
        let mut tls = Tls::none();
        let (head, body) = (b"HTTP/1.1 200 OK\r\n\r\n", b"hello");
        let n = Transport::new(&mut tcp, &mut tls)
            .write_vectored(&[IoSlice::new(head), IoSlice::new(body)])
            .unwrap();
        assert_eq!(n, head.len() + body.len());
        drop(tcp);
        let mut got = Vec::new();
        let mut client = client;
        client.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"HTTP/1.1 200 OK\r\n\r\nhello");
    }
}

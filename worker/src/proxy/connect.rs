//! Upstream sockets: TCP or Unix, non-blocking, registered with the worker's `Poll`
//! like client sockets. `connect` returns at once; the first writable event says the
//! attempt ended, and [`UpstreamSocket::finish_connect`] says how.

use super::retry::Failure;
use forkd_shared::config::UpstreamAddress;
use mio::net::{TcpStream, UnixStream};
use mio::{event, Interest, Registry, Token};
use std::io::{self, Read, Write};

/// A connection to an upstream server.
#[derive(Debug)]
pub enum UpstreamSocket {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl UpstreamSocket {
    /// Starts connecting to `addr` (non-blocking). An error here is immediate (no
    /// such socket file, no route, out of descriptors).
    pub fn connect(addr: &UpstreamAddress) -> io::Result<UpstreamSocket> {
        match addr {
            UpstreamAddress::Tcp(a) => {
                let s = TcpStream::connect(*a)?;
                // Heads and small bodies go out in one write each: never wait for ACKs.
                s.set_nodelay(true)?;
                Ok(UpstreamSocket::Tcp(s))
            }
            UpstreamAddress::Unix(p) => UnixStream::connect(p).map(UpstreamSocket::Unix),
        }
    }

    /// After a writable (or error) event on a connecting socket: `Ok(true)` connected,
    /// `Ok(false)` still in progress (a spurious wake-up), `Err` the attempt failed.
    pub fn finish_connect(&self) -> io::Result<bool> {
        let (error, peer) = match self {
            UpstreamSocket::Tcp(s) => (s.take_error()?, s.peer_addr().map(|_| ())),
            UpstreamSocket::Unix(s) => (s.take_error()?, s.peer_addr().map(|_| ())),
        };
        if let Some(e) = error {
            return Err(e);
        }
        match peer {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(false),
            Err(e) => Err(e),
        }
    }
}

impl UpstreamSocket {
    /// Looks at the socket without taking anything: `Ok(0)` the peer closed, `Ok(n)`
    /// bytes are waiting, `WouldBlock` nothing has arrived.
    pub fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            UpstreamSocket::Tcp(s) => s.peek(buf),
            UpstreamSocket::Unix(s) => {
                use nix::sys::socket::{recv, MsgFlags};
                use std::os::fd::AsRawFd;
                recv(
                    s.as_raw_fd(),
                    buf,
                    MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
                )
                .map_err(io::Error::from)
            }
        }
    }
}

/// What a failed `connect` becomes for the retry rules.
pub fn connect_failure(e: &io::Error) -> Failure {
    if e.kind() == io::ErrorKind::TimedOut {
        Failure::ConnectTimeout
    } else {
        Failure::ConnectRefused
    }
}

impl Read for UpstreamSocket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            UpstreamSocket::Tcp(s) => s.read(buf),
            UpstreamSocket::Unix(s) => s.read(buf),
        }
    }
}

impl Write for UpstreamSocket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            UpstreamSocket::Tcp(s) => s.write(buf),
            UpstreamSocket::Unix(s) => s.write(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            UpstreamSocket::Tcp(s) => s.write_vectored(bufs),
            UpstreamSocket::Unix(s) => s.write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl std::os::fd::AsFd for UpstreamSocket {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        match self {
            UpstreamSocket::Tcp(s) => s.as_fd(),
            UpstreamSocket::Unix(s) => s.as_fd(),
        }
    }
}

/// A buffered request body's file part goes to the upstream by `sendfile`.
impl crate::out::Sink for UpstreamSocket {
    fn sendfile_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        Some(std::os::fd::AsFd::as_fd(self))
    }
}

impl event::Source for UpstreamSocket {
    fn register(
        &mut self,
        registry: &Registry,
        token: Token,
        interests: Interest,
    ) -> io::Result<()> {
        match self {
            UpstreamSocket::Tcp(s) => s.register(registry, token, interests),
            UpstreamSocket::Unix(s) => s.register(registry, token, interests),
        }
    }

    fn reregister(
        &mut self,
        registry: &Registry,
        token: Token,
        interests: Interest,
    ) -> io::Result<()> {
        match self {
            UpstreamSocket::Tcp(s) => s.reregister(registry, token, interests),
            UpstreamSocket::Unix(s) => s.reregister(registry, token, interests),
        }
    }

    fn deregister(&mut self, registry: &Registry) -> io::Result<()> {
        match self {
            UpstreamSocket::Tcp(s) => s.deregister(registry),
            UpstreamSocket::Unix(s) => s.deregister(registry),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mio::{Events, Poll};
    use std::time::Duration;

    /// Waits (bounded) for the connect attempt to end; returns `finish_connect`.
    fn settle(poll: &mut Poll, s: &mut UpstreamSocket) -> io::Result<bool> {
        poll.registry()
            .register(s, Token(1), Interest::WRITABLE)
            .unwrap();
        let mut events = Events::with_capacity(4);
        for _ in 0..100 {
            poll.poll(&mut events, Some(Duration::from_millis(100)))
                .unwrap();
            match s.finish_connect() {
                Ok(false) => continue,
                done => return done,
            }
        }
        Ok(false)
    }

    #[test]
    fn tcp_connects_and_carries_bytes() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = UpstreamAddress::Tcp(listener.local_addr().unwrap());
        let mut poll = Poll::new().unwrap();
        let mut s = UpstreamSocket::connect(&addr).unwrap();
        assert!(settle(&mut poll, &mut s).unwrap());
        let (mut peer, _) = listener.accept().unwrap();
        s.write_all(b"ping").unwrap();
        let mut got = [0u8; 4];
        peer.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"ping");
    }

    #[test]
    fn a_refused_connection_is_a_connect_failure() {
        // Bind then drop: nothing listens on the port now.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let mut poll = Poll::new().unwrap();
        let result = UpstreamSocket::connect(&UpstreamAddress::Tcp(port))
            .and_then(|mut s| settle(&mut poll, &mut s));
        let e = result.expect_err("nothing listens there");
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{e}");
        assert_eq!(connect_failure(&e), Failure::ConnectRefused);
        let timeout = io::Error::from(io::ErrorKind::TimedOut);
        assert_eq!(connect_failure(&timeout), Failure::ConnectTimeout);
    }

    #[test]
    fn unix_sockets_connect_too() {
        let path = std::env::temp_dir().join(format!("forkd-up-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let mut poll = Poll::new().unwrap();
        let mut s = UpstreamSocket::connect(&UpstreamAddress::Unix(path.clone())).unwrap();
        assert!(settle(&mut poll, &mut s).unwrap());
        let (mut peer, _) = listener.accept().unwrap();
        s.write_all(b"x").unwrap();
        let mut got = [0u8; 1];
        peer.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"x");
        let _ = std::fs::remove_file(&path);
        let missing = UpstreamSocket::connect(&UpstreamAddress::Unix(path));
        assert!(missing.is_err(), "no socket file: fails at once");
    }
}

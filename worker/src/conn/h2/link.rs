//! [`Link`]: the bytes of an HTTP/2 connection as the `h2` crate reads and writes
//! them (tokio's `AsyncRead`/`AsyncWrite`, polled from our loop: `Pending` means
//! "wait for the socket's next readiness event", which drives the connection again).
//!
//! It owns a duplicate of the connection's socket (the `Conn` keeps the original,
//! registered with the poll) and the TLS session moved out of the `Conn`; what was
//! read before the switch to HTTP/2 (the preface and anything after it) is handed
//! over first. Both directions pass through the frame meters (`meter.rs`).

use super::meter::{Flood, Inbound, Outbound};
use crate::tls::{Tls, Transport};
use mio::net::TcpStream;
use std::cell::RefCell;
use std::io::{self, IoSlice, Write};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

pub struct Link {
    tcp: TcpStream,
    tls: Tls,
    /// Read before the switch, not yet given to `h2`.
    early: Vec<u8>,
    early_at: usize,
    /// Shared with the session, which cannot reach the link inside `h2`'s
    /// connection (one thread: an `Rc`).
    pub metered: Rc<RefCell<Metered>>,
}

/// What the link saw, for the session: meters, flood, bytes, blocking.
pub struct Metered {
    pub inbound: Inbound,
    pub outbound: Outbound,
    /// The inbound meter found a flood: nothing more is read.
    pub flood: Option<Flood>,
    /// Plaintext bytes moved since the stats last took them.
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// A write (or a flush of TLS records) found the socket full: the connection
    /// wants writability.
    pub write_blocked: bool,
}

impl Link {
    pub fn new(tcp: TcpStream, tls: Tls, early: Vec<u8>, inbound: Inbound) -> Link {
        Link {
            tcp,
            tls,
            early,
            early_at: 0,
            metered: Rc::new(RefCell::new(Metered {
                inbound,
                outbound: Outbound::default(),
                flood: None,
                bytes_in: 0,
                bytes_out: 0,
                write_blocked: false,
            })),
        }
    }

    fn transport(&mut self) -> Transport<'_> {
        Transport::new(&mut self.tcp, &mut self.tls)
    }

    fn metered_read(&mut self, into: &mut [u8]) -> io::Result<usize> {
        if self.early_at < self.early.len() {
            let n = (self.early.len() - self.early_at).min(into.len());
            into[..n].copy_from_slice(&self.early[self.early_at..self.early_at + n]);
            self.early_at += n;
            if self.early_at == self.early.len() {
                self.early = Vec::new();
                self.early_at = 0;
            }
            return Ok(n);
        }
        loop {
            match self.transport().read_plain(into) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => return other,
            }
        }
    }

    fn wrote(&mut self, bufs: &[IoSlice<'_>], mut n: usize) {
        let mut m = self.metered.borrow_mut();
        m.bytes_out += n as u64;
        m.write_blocked = false;
        for b in bufs {
            if n == 0 {
                break;
            }
            let k = b.len().min(n);
            m.outbound.wrote(&b[..k]);
            n -= k;
        }
    }

    fn blocked(&mut self) {
        self.metered.borrow_mut().write_blocked = true;
    }
}

impl AsyncRead for Link {
    fn poll_read(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let link = self.get_mut();
        if link.metered.borrow().flood.is_some() {
            return Poll::Pending; // the connection is closing: read nothing more
        }
        let into = buf.initialize_unfilled();
        match link.metered_read(into) {
            Ok(0) => Poll::Ready(Ok(())),
            Ok(n) => {
                let mut m = link.metered.borrow_mut();
                m.bytes_in += n as u64;
                if let Some(flood) = m.inbound.read(&into[..n]) {
                    m.flood = Some(flood);
                    return Poll::Pending;
                }
                buf.advance(n);
                Poll::Ready(Ok(()))
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Poll::Pending,
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

impl AsyncWrite for Link {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let link = self.get_mut();
        loop {
            match link.transport().write_vectored(bufs) {
                Ok(n) => {
                    link.wrote(bufs, n);
                    return Poll::Ready(Ok(n));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    link.blocked();
                    return Poll::Pending;
                }
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let link = self.get_mut();
        match link.transport().push() {
            Ok(true) => {
                link.metered.borrow_mut().write_blocked = false;
                Poll::Ready(Ok(()))
            }
            Ok(false) => {
                link.blocked();
                Poll::Pending
            }
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    /// `h2` is done with the connection (GOAWAY sent, streams over): what is queued
    /// goes out, then the write side closes (`close_notify` first under TLS). The
    /// connection then lingers (`conn/io.rs`): the client's frames still in flight
    /// are read and dropped, not answered with a reset that destroys what it has
    /// not read yet.
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.as_mut().poll_flush(cx))?;
        let _ = self.get_mut().transport().shutdown_write();
        Poll::Ready(Ok(()))
    }
}

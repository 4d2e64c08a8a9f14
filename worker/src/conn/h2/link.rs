//! [`Link`]: the bytes of an HTTP/2 connection, plain or TLS, as the session reads
//! and writes them, with the frame meters on both directions (`meter.rs`).
//!
//! It owns a duplicate of the connection's socket (the `Conn` keeps the original,
//! registered with the poll) and the TLS session moved out of the `Conn`; what was
//! read before the switch to HTTP/2 (the preface and anything after it) is handed
//! over first.

use super::meter::{Flood, Inbound, Outbound};
use crate::tls::{Tls, Transport};
use mio::net::TcpStream;
use std::io::{self, Write};

pub struct Link {
    tcp: TcpStream,
    tls: Tls,
    /// Read before the switch, not yet given to the session.
    early: Vec<u8>,
    /// The last read was served from `early`, not the socket.
    read_early: bool,
    pub metered: Metered,
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
            read_early: false,
            metered: Metered {
                inbound,
                outbound: Outbound::default(),
                flood: None,
                bytes_in: 0,
                bytes_out: 0,
                write_blocked: false,
            },
        }
    }

    fn transport(&mut self) -> Transport<'_> {
        Transport::new(&mut self.tcp, &mut self.tls)
    }

    /// Reads plaintext into `into`, metered: `Ok(0)` is the client's end of the
    /// stream; a flood found by the meter stops the reading (`WouldBlock` from then
    /// on, `metered.flood` says why).
    pub fn read(&mut self, into: &mut [u8]) -> io::Result<usize> {
        if self.metered.flood.is_some() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        self.read_early = !self.early.is_empty();
        let n = if self.early.is_empty() {
            loop {
                match self.transport().read_plain(into) {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    other => break other?,
                }
            }
        } else {
            let n = self.early.len().min(into.len());
            into[..n].copy_from_slice(&self.early[..n]);
            self.early.drain(..n);
            if self.early.is_empty() {
                self.early = Vec::new();
            }
            n
        };
        let m = &mut self.metered;
        m.bytes_in += n as u64;
        if let Some(flood) = m.inbound.read(&into[..n]) {
            m.flood = Some(flood);
        }
        Ok(n)
    }

    /// Whether a read that returned `n` of `space` octets may have left input
    /// unread (`Tls::may_have_more`; a read of what came before the switch says
    /// nothing of the socket).
    pub fn may_have_more(&self, n: usize, space: usize) -> bool {
        self.read_early || n == space || self.tls.may_have_more(n, space)
    }

    /// Writes `bytes` (frames, whole or a part), metered; `Ok(n)` taken, a full
    /// socket `WouldBlock` (and `metered.write_blocked`).
    pub fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        loop {
            match self.transport().write(bytes) {
                Ok(n) => {
                    let m = &mut self.metered;
                    m.bytes_out += n as u64;
                    m.write_blocked = false;
                    m.outbound.wrote(&bytes[..n]);
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    if e.kind() == io::ErrorKind::WouldBlock {
                        self.metered.write_blocked = true;
                    }
                    return Err(e);
                }
            }
        }
    }

    /// Sends what TLS still holds: true when nothing is left.
    pub fn push(&mut self) -> io::Result<bool> {
        let done = self.transport().push()?;
        self.metered.write_blocked = !done;
        Ok(done)
    }

    /// Everything sent: the write side closes (`close_notify` first under TLS). The
    /// connection then lingers (`conn/io.rs`): the client's frames still in flight
    /// are read and dropped, not answered with a reset that destroys what it has
    /// not read yet.
    pub fn shutdown_write(&mut self) {
        let _ = self.transport().shutdown_write();
    }
}

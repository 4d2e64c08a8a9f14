//! Loopback ports reserved for a test daemon, so that tests running in parallel never
//! get the same port.
//!
//! A reservation is a TCP socket with `SO_REUSEADDR`, bound to `127.0.0.1:0` and never
//! listening. While it lives, the kernel's ephemeral allocator hands its port to no
//! other `bind(…:0)` nor `connect()`, yet forkd (which sets `SO_REUSEADDR`, and with
//! `ReusePort` also `SO_REUSEPORT`) can bind and listen on it: Linux lets two
//! `SO_REUSEADDR` sockets share a port as long as the other one is not listening.
//! A plain `bind` to the port without `SO_REUSEADDR` is refused meanwhile.

use nix::sys::socket::{
    bind, getsockname, setsockopt, socket, sockopt, AddressFamily, SockFlag, SockType, SockaddrIn,
};
use std::os::fd::OwnedFd;
use std::sync::Mutex;

/// A port held for as long as this lives.
#[derive(Debug)]
pub struct PortReservation {
    port: u16,
    _socket: OwnedFd,
}

impl PortReservation {
    /// Reserves a port nothing else on this machine uses now.
    pub fn new() -> PortReservation {
        let fd = socket(
            AddressFamily::Inet,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .expect("socket() for a port reservation");
        setsockopt(&fd, sockopt::ReuseAddr, &true).expect("setsockopt(SO_REUSEADDR)");
        bind(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            &SockaddrIn::new(127, 0, 0, 1, 0),
        )
        .expect("bind(127.0.0.1:0) for a port reservation");
        let addr: SockaddrIn =
            getsockname(std::os::fd::AsRawFd::as_raw_fd(&fd)).expect("getsockname()");
        PortReservation {
            port: addr.port(),
            _socket: fd,
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Default for PortReservation {
    fn default() -> Self {
        PortReservation::new()
    }
}

/// A port reserved for the rest of the test process (for configs written by hand;
/// a `TestDaemon` holds its own reservations and frees them when dropped).
pub fn free_port() -> u16 {
    static HELD: Mutex<Vec<PortReservation>> = Mutex::new(Vec::new());
    let r = PortReservation::new();
    let port = r.port();
    HELD.lock().unwrap_or_else(|e| e.into_inner()).push(r);
    port
}

//! Listening sockets handed to this process instead of bound by it: by the master it
//! replaces (binary upgrade, `FORKD_LISTENERS`) or by systemd (socket activation,
//! `LISTEN_FDS`). Also the upgrade's ready pipe (`FORKD_READY_FD`).
//!
//! This file turns inherited descriptor numbers into owned objects: the only `unsafe`
//! of the master besides `fork`. Every descriptor is checked before it is trusted: it
//! must be a listening TCP socket bound to the address it was described with.

use nix::sys::socket::{getsockname, getsockopt, sockopt, SockaddrStorage};
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// `fd:slot:addr;...` — the sockets a master passes to the binary it execs.
pub const LISTENERS_ENV: &str = "FORKD_LISTENERS";
/// The write end of the pipe on which the new master says `ready` (or `error: ...`).
pub const READY_FD_ENV: &str = "FORKD_READY_FD";
/// The pid of the master being upgraded from.
pub const UPGRADE_FROM_ENV: &str = "FORKD_UPGRADE_FROM";

/// One inherited listening socket.
struct Entry {
    addr: SocketAddr,
    /// The worker slot it belongs to (reuseport), or None (any slot: systemd's).
    slot: Option<usize>,
    sock: TcpListener,
}

/// Sockets this process was started with, until the listener setup takes them.
#[derive(Default)]
pub struct Inherited {
    entries: Vec<Entry>,
    /// Where they came from, for the logs.
    pub source: &'static str,
}

/// The upgrade this process is the new master of.
pub struct UpgradeChild {
    pub from: i32,
    pub ready: Option<OwnedFd>,
}

/// Takes ownership of descriptor `fd` if it is open. Each number is taken at most once
/// (the caller removes the variable that named it).
fn own(fd: RawFd) -> Option<OwnedFd> {
    if fd < 3 {
        return None;
    }
    // SAFETY: only used for checking that `fd` is open; the borrow ends here.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    nix::fcntl::fcntl(borrowed, nix::fcntl::FcntlArg::F_GETFD).ok()?;
    // SAFETY: `fd` is open (checked above) and was handed to this process by its
    // parent, named in an environment variable that is removed as it is read, so
    // nothing else in the process owns it.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A listening TCP socket and the address it is bound to, or None.
fn listener(fd: OwnedFd) -> Option<(SocketAddr, TcpListener)> {
    if !getsockopt(&fd, sockopt::AcceptConn).unwrap_or(false) {
        return None;
    }
    let addr: SockaddrStorage = getsockname(std::os::fd::AsRawFd::as_raw_fd(&fd)).ok()?;
    let addr = if let Some(v4) = addr.as_sockaddr_in() {
        SocketAddr::from((v4.ip(), v4.port()))
    } else if let Some(v6) = addr.as_sockaddr_in6() {
        SocketAddr::from((v6.ip(), v6.port()))
    } else {
        return None;
    };
    // The workers accept without blocking; make sure of it for inherited sockets too.
    let sock = TcpListener::from(fd);
    let _ = sock.set_nonblocking(true);
    Some((addr, sock))
}

impl Inherited {
    /// Reads (and removes) `FORKD_LISTENERS`, or systemd's `LISTEN_PID`/`LISTEN_FDS`.
    pub fn from_env() -> Inherited {
        if let Some(list) = take_env(LISTENERS_ENV) {
            let mut entries = Vec::new();
            for item in list.split(';').filter(|s| !s.is_empty()) {
                let mut parts = item.splitn(3, ':');
                let (Some(fd), Some(slot), Some(addr)) = (parts.next(), parts.next(), parts.next())
                else {
                    forkd_shared::warn!("{LISTENERS_ENV}: ignoring `{item}`");
                    continue;
                };
                let (Ok(fd), Ok(slot), Ok(addr)) = (
                    fd.parse::<RawFd>(),
                    slot.parse::<usize>(),
                    addr.parse::<SocketAddr>(),
                ) else {
                    forkd_shared::warn!("{LISTENERS_ENV}: ignoring `{item}`");
                    continue;
                };
                match own(fd).and_then(listener) {
                    Some((actual, sock)) if actual == addr => entries.push(Entry {
                        addr,
                        slot: Some(slot),
                        sock,
                    }),
                    _ => forkd_shared::warn!(
                        "{LISTENERS_ENV}: fd {fd} is not a socket listening on {addr}; ignored"
                    ),
                }
            }
            return Inherited {
                entries,
                source: "the previous master",
            };
        }
        let pid = take_env("LISTEN_PID");
        let count = take_env("LISTEN_FDS");
        take_env("LISTEN_FDNAMES");
        let (Some(pid), Some(count)) = (pid, count) else {
            return Inherited::default();
        };
        if pid.parse::<u32>().ok() != Some(std::process::id()) {
            return Inherited::default(); // meant for another process
        }
        let count: RawFd = count.parse().unwrap_or(0);
        let mut entries = Vec::new();
        for fd in 3..3 + count {
            match own(fd).and_then(listener) {
                Some((addr, sock)) => entries.push(Entry {
                    addr,
                    slot: None,
                    sock,
                }),
                None => forkd_shared::warn!(
                    "LISTEN_FDS: fd {fd} is not a listening TCP socket; ignored"
                ),
            }
        }
        Inherited {
            entries,
            source: "systemd",
        }
    }

    /// The inherited socket for `addr` in `slot`, if any.
    pub fn take(&mut self, addr: SocketAddr, slot: usize) -> Option<TcpListener> {
        let i = self
            .entries
            .iter()
            .position(|e| e.addr == addr && e.slot.is_none_or(|s| s == slot))?;
        Some(self.entries.swap_remove(i).sock)
    }

    /// Closes what the configuration did not use, saying so.
    pub fn close_unused(&mut self) {
        for e in self.entries.drain(..) {
            forkd_shared::warn!(
                "closing the socket for {} inherited from {}: not in the configuration",
                e.addr,
                self.source
            );
        }
    }
}

impl UpgradeChild {
    /// Reads (and removes) the upgrade variables: this process is the new master.
    pub fn from_env() -> Option<UpgradeChild> {
        let from = take_env(UPGRADE_FROM_ENV)?.parse().ok()?;
        let ready = take_env(READY_FD_ENV)
            .and_then(|fd| fd.parse().ok())
            .and_then(own);
        Some(UpgradeChild { from, ready })
    }

    /// Tells the old master this one serves.
    pub fn ready(&mut self) {
        self.send("ready\n");
    }

    /// Tells the old master why this one gives up (it then keeps serving).
    pub fn failed(&mut self, why: &str) {
        self.send(&format!("error: {}\n", why.replace('\n', " | ")));
    }

    fn send(&mut self, message: &str) {
        if let Some(fd) = self.ready.take() {
            let _ = nix::unistd::write(&fd, message.as_bytes());
        }
    }
}

fn take_env(name: &str) -> Option<String> {
    let value = std::env::var(name).ok();
    if value.is_some() {
        // The master is single-threaded: nothing reads the environment concurrently.
        std::env::remove_var(name);
    }
    value
}

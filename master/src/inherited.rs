//! Listening sockets handed to this process instead of bound by it: by the master it
//! replaces (binary upgrade, `FORKD_LISTENERS`) or by systemd (socket activation,
//! `LISTEN_FDS`). Also the upgrade's ready pipe (`FORKD_READY_FD`).
//!
//! This file turns inherited descriptor numbers into owned objects: the only `unsafe`
//! of the master besides `fork`. Every descriptor is checked before it is trusted: it
//! must be a listening TCP socket bound to the address it was described with.

use nix::sys::socket::{getsockname, getsockopt, sockopt, SockaddrStorage};
use std::fmt;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

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
    /// `ready` is the upgrade's ready pipe, already owned: no listener may be it.
    /// Every number is checked before any descriptor is owned, so none gets two owners.
    pub fn from_env(ready: Option<RawFd>) -> Result<Inherited, InheritError> {
        if let Some(list) = take_env(LISTENERS_ENV) {
            let mut entries = Vec::new();
            for (fd, slot, addr) in parse_listeners(&list, ready)? {
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
            return Ok(Inherited {
                entries,
                source: "the previous master",
            });
        }
        let pid = take_env("LISTEN_PID");
        let count = take_env("LISTEN_FDS");
        take_env("LISTEN_FDNAMES");
        let (Some(pid), Some(count)) = (pid, count) else {
            return Ok(Inherited::default());
        };
        if pid.parse::<u32>().ok() != Some(std::process::id()) {
            return Ok(Inherited::default()); // meant for another process
        }
        let mut entries = Vec::new();
        for fd in listen_fds(&count, ready, descriptor_limit())? {
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
        Ok(Inherited {
            entries,
            source: "systemd",
        })
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

    /// The ready pipe's descriptor number, which no inherited listener may have.
    pub fn ready_fd(&self) -> Option<RawFd> {
        self.ready.as_ref().map(|fd| fd.as_raw_fd())
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

/// Inherited descriptor numbers that cannot be trusted: taking them would give one
/// descriptor two owners (closed twice) or walk past the descriptor table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InheritError {
    /// `FORKD_LISTENERS` names `fd` more than once.
    RepeatedFd { fd: RawFd },
    /// A listener is the upgrade's ready pipe (`FORKD_READY_FD`).
    ReadyFdListed { var: &'static str, fd: RawFd },
    /// `LISTEN_FDS` is not a count of descriptors this process can have.
    BadCount { value: String, limit: RawFd },
}

impl fmt::Display for InheritError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InheritError::RepeatedFd { fd } => write!(
                f,
                "{LISTENERS_ENV} names fd {fd} more than once: refusing the inherited sockets"
            ),
            InheritError::ReadyFdListed { var, fd } => write!(
                f,
                "{var} names fd {fd}, which is {READY_FD_ENV} (the upgrade's ready pipe): refusing the inherited sockets"
            ),
            InheritError::BadCount { value, limit } => write!(
                f,
                "LISTEN_FDS={value:?} is not a descriptor count (0 to {}): refusing the inherited sockets",
                limit - FIRST_LISTEN_FD
            ),
        }
    }
}

/// systemd passes sockets from this descriptor on (`SD_LISTEN_FDS_START`).
const FIRST_LISTEN_FD: RawFd = 3;

/// `fd:slot:addr;...` → the entries, every fd at most once and none the ready pipe.
/// Malformed items are skipped with a warning, as before.
fn parse_listeners(
    list: &str,
    ready: Option<RawFd>,
) -> Result<Vec<(RawFd, usize, SocketAddr)>, InheritError> {
    let mut out: Vec<(RawFd, usize, SocketAddr)> = Vec::new();
    for item in list.split(';').filter(|s| !s.is_empty()) {
        let mut parts = item.splitn(3, ':');
        let parsed = match (parts.next(), parts.next(), parts.next()) {
            (Some(fd), Some(slot), Some(addr)) => (
                fd.parse::<RawFd>(),
                slot.parse::<usize>(),
                addr.parse::<SocketAddr>(),
            ),
            _ => {
                forkd_shared::warn!("{LISTENERS_ENV}: ignoring `{item}`");
                continue;
            }
        };
        let (Ok(fd), Ok(slot), Ok(addr)) = parsed else {
            forkd_shared::warn!("{LISTENERS_ENV}: ignoring `{item}`");
            continue;
        };
        if ready == Some(fd) {
            return Err(InheritError::ReadyFdListed {
                var: LISTENERS_ENV,
                fd,
            });
        }
        if out.iter().any(|&(seen, _, _)| seen == fd) {
            return Err(InheritError::RepeatedFd { fd });
        }
        out.push((fd, slot, addr));
    }
    Ok(out)
}

/// The descriptors `LISTEN_FDS=count` names: `3..3 + count`, which must stay below
/// `limit` (the descriptor table's size) and not hold the ready pipe.
fn listen_fds(
    count: &str,
    ready: Option<RawFd>,
    limit: RawFd,
) -> Result<std::ops::Range<RawFd>, InheritError> {
    let bad = || InheritError::BadCount {
        value: count.to_string(),
        limit,
    };
    let n: RawFd = count.trim().parse().map_err(|_| bad())?;
    let end = FIRST_LISTEN_FD
        .checked_add(n)
        .filter(|&end| n >= 0 && end <= limit)
        .ok_or_else(bad)?;
    let range = FIRST_LISTEN_FD..end;
    if let Some(fd) = ready.filter(|fd| range.contains(fd)) {
        return Err(InheritError::ReadyFdListed {
            var: "LISTEN_FDS",
            fd,
        });
    }
    Ok(range)
}

/// How many descriptors this process may have open (no inherited one is numbered
/// at or above it).
fn descriptor_limit() -> RawFd {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_or(1024, |(soft, _)| soft.min(RawFd::MAX as u64) as RawFd)
}

fn take_env(name: &str) -> Option<String> {
    let value = std::env::var(name).ok();
    if value.is_some() {
        // The master is single-threaded: nothing reads the environment concurrently.
        std::env::remove_var(name);
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listeners_parse_and_malformed_items_are_skipped() {
        let list = "5:0:127.0.0.1:80;junk;6:1:[::1]:8080;x:0:127.0.0.1:1;";
        assert_eq!(
            parse_listeners(list, Some(9)).unwrap(),
            vec![
                (5, 0, "127.0.0.1:80".parse().unwrap()),
                (6, 1, "[::1]:8080".parse().unwrap())
            ]
        );
    }

    #[test]
    fn a_repeated_listener_fd_is_refused() {
        let err = parse_listeners("5:0:127.0.0.1:80;5:1:127.0.0.1:80;", None).unwrap_err();
        assert_eq!(err, InheritError::RepeatedFd { fd: 5 });
        assert!(err.to_string().contains("fd 5 more than once"));
    }

    #[test]
    fn a_listener_that_is_the_ready_pipe_is_refused() {
        let err = parse_listeners("5:0:127.0.0.1:80;7:0:127.0.0.1:81;", Some(7)).unwrap_err();
        assert_eq!(
            err,
            InheritError::ReadyFdListed {
                var: LISTENERS_ENV,
                fd: 7
            }
        );
        assert!(err.to_string().contains(READY_FD_ENV));
    }

    #[test]
    fn listen_fds_is_a_range_inside_the_descriptor_table() {
        assert_eq!(listen_fds("2", None, 1024).unwrap(), 3..5);
        assert_eq!(listen_fds("0", None, 1024).unwrap(), 3..3);
        assert_eq!(listen_fds("1021", None, 1024).unwrap(), 3..1024);
        for bad in ["1022", "2147483647", "-1", "many", ""] {
            let err = listen_fds(bad, None, 1024).unwrap_err();
            assert!(
                matches!(err, InheritError::BadCount { .. }),
                "LISTEN_FDS={bad:?}"
            );
            assert!(err.to_string().contains("0 to 1021"), "{err}");
        }
        assert_eq!(
            listen_fds("3", Some(4), 1024).unwrap_err(),
            InheritError::ReadyFdListed {
                var: "LISTEN_FDS",
                fd: 4
            }
        );
    }
}

//! Listening sockets: bound by the master, inherited by the workers.
//!
//! `Shared`: one socket per address, every worker accepts from it. `ReusePort`: one
//! `SO_REUSEPORT` socket per address and worker slot; the master keeps them all, so a
//! worker that dies or is replaced hands its queue to the next one in its slot instead
//! of the kernel resetting the connections queued on it.

use crate::inherited::Inherited;
use forkd_shared::config::{AcceptMode, Config, Listener};
use nix::sys::socket::{
    bind, listen, setsockopt, socket, sockopt, AddressFamily, Backlog, SockFlag, SockType,
    SockaddrStorage,
};
use std::fmt;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, OwnedFd};

/// Why a listening socket could not be set up; names the call and the address.
#[derive(Debug)]
pub struct ListenError {
    pub call: &'static str,
    pub addr: SocketAddr,
    pub source: nix::Error,
}

impl fmt::Display for ListenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({}) failed: {}", self.call, self.addr, self.source)
    }
}

/// The sockets of one configuration: `by_slot[slot][listener]` with `ReusePort`,
/// `by_slot[0][listener]` shared by every slot with `Shared`.
pub struct Sockets {
    pub mode: AcceptMode,
    pub addrs: Vec<SocketAddr>,
    by_slot: Vec<Vec<TcpListener>>,
}

impl Sockets {
    /// Binds every socket `config` needs, reusing the ones in `old` (same mode, address
    /// and slot) so that a reload never closes a queue that stays.
    pub fn open(
        config: &Config,
        old: Option<&Sockets>,
        inherited: &mut Inherited,
    ) -> Result<Sockets, ListenError> {
        let reuseport = config.accept == AcceptMode::ReusePort;
        let slots = if reuseport { config.workers.get() } else { 1 };
        let somaxconn = somaxconn();
        let mut by_slot = Vec::with_capacity(slots);
        for slot in 0..slots {
            let mut row = Vec::with_capacity(config.listeners.len());
            for l in &config.listeners {
                let kept = old
                    .filter(|o| o.mode == config.accept)
                    .and_then(|o| o.duplicate(slot, l.addr))
                    .or_else(|| inherited.take(l.addr, slot));
                let sock = match kept {
                    Some(sock) => {
                        // listen() again on a listening socket changes its backlog in place.
                        if let Err(source) = listen(&sock, backlog_of(l)) {
                            return Err(ListenError {
                                call: "listen",
                                addr: l.addr,
                                source,
                            });
                        }
                        sock
                    }
                    None => {
                        if slot == 0 {
                            if let Some(max) = somaxconn.filter(|&m| m < l.backlog) {
                                forkd_shared::warn!(
                                    "backlog {} for {} is capped by net.core.somaxconn = {max}",
                                    l.backlog,
                                    l.addr
                                );
                            }
                        }
                        bind_listener(l, reuseport)?
                    }
                };
                row.push(sock);
            }
            by_slot.push(row);
        }
        let sockets = Sockets {
            mode: config.accept,
            addrs: config.listeners.iter().map(|l| l.addr).collect(),
            by_slot,
        };
        sockets.steer()?;
        Ok(sockets)
    }

    /// `(fd, slot, address)` of every socket, to describe them to an exec'd binary.
    pub fn describe(&self) -> Vec<(std::os::fd::RawFd, usize, SocketAddr)> {
        let mut out = Vec::new();
        for (slot, row) in self.by_slot.iter().enumerate() {
            for (sock, &addr) in row.iter().zip(&self.addrs) {
                out.push((sock.as_raw_fd(), slot, addr));
            }
        }
        out
    }

    /// Every socket's descriptor (kept open across the exec of a new master).
    pub fn fds(&self) -> Vec<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        self.by_slot.iter().flatten().map(|s| s.as_fd()).collect()
    }

    /// An empty set (what a worker leaves behind in its copy of the master's state).
    pub fn empty() -> Sockets {
        Sockets {
            mode: AcceptMode::Shared,
            addrs: Vec::new(),
            by_slot: Vec::new(),
        }
    }

    /// With `ReusePort`, makes the kernel pick among exactly this set's sockets for
    /// each address. The reuseport group may still hold sockets of slots that a reload
    /// removed: steered away from, they get no new connections, and their workers can
    /// accept what is queued on them before closing them (closing a reuseport socket
    /// resets the connections queued on it).
    fn steer(&self) -> Result<(), ListenError> {
        if self.mode != AcceptMode::ReusePort {
            return Ok(());
        }
        let slots = self.by_slot.len() as u32;
        for (i, &addr) in self.addrs.iter().enumerate() {
            let fd = self.by_slot[0][i].as_raw_fd();
            forkd_shared::sys::socket::steer_reuseport(fd, slots).map_err(|e| ListenError {
                call: "setsockopt(SO_ATTACH_REUSEPORT_CBPF)",
                addr,
                source: nix::Error::from_raw(e.raw_os_error().unwrap_or(0)),
            })?;
        }
        Ok(())
    }

    /// Gives up every socket but those of `slot` (in a worker right after `fork`: a
    /// worker must not keep another slot's socket open, or the master could never
    /// close it).
    pub fn into_slot(mut self, slot: usize) -> Vec<TcpListener> {
        let index = match self.mode {
            AcceptMode::Shared => 0,
            AcceptMode::ReusePort => slot,
        };
        if index < self.by_slot.len() {
            self.by_slot.swap_remove(index)
        } else {
            Vec::new()
        }
    }

    /// A duplicate of the socket for `addr` in `slot`, if this set has one.
    fn duplicate(&self, slot: usize, addr: SocketAddr) -> Option<TcpListener> {
        let i = self.addrs.iter().position(|&a| a == addr)?;
        self.by_slot.get(slot)?.get(i)?.try_clone().ok()
    }
}

impl Sockets {
    /// Per address: connections waiting in its accept queue(s) and the queues' limit
    /// (summed over the reuseport slots).
    pub fn queue_depths(&self) -> Vec<(SocketAddr, u32, u32)> {
        self.addrs
            .iter()
            .enumerate()
            .map(|(i, &addr)| {
                let (mut depth, mut max) = (0, 0);
                for row in &self.by_slot {
                    if let Ok((d, m)) = forkd_shared::sys::socket::listen_queue(row[i].as_raw_fd())
                    {
                        depth += d;
                        max += m;
                    }
                }
                (addr, depth, max)
            })
            .collect()
    }
}

fn backlog_of(l: &Listener) -> Backlog {
    Backlog::new(l.backlog as i32).unwrap_or(Backlog::MAXCONN)
}

fn somaxconn() -> Option<u32> {
    std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

/// socket + SO_REUSEADDR (+ SO_REUSEPORT) + bind + listen, and TCP_DEFER_ACCEPT.
fn bind_listener(l: &Listener, reuseport: bool) -> Result<TcpListener, ListenError> {
    let err = |call| {
        move |source| ListenError {
            call,
            addr: l.addr,
            source,
        }
    };
    let family = match l.addr {
        SocketAddr::V4(_) => AddressFamily::Inet,
        SocketAddr::V6(_) => AddressFamily::Inet6,
    };
    let fd: OwnedFd =
        socket(family, SockType::Stream, SockFlag::SOCK_CLOEXEC, None).map_err(err("socket"))?;
    setsockopt(&fd, sockopt::ReuseAddr, &true).map_err(err("setsockopt(SO_REUSEADDR)"))?;
    if reuseport {
        setsockopt(&fd, sockopt::ReusePort, &true).map_err(err("setsockopt(SO_REUSEPORT)"))?;
    }
    if l.addr.is_ipv6() {
        setsockopt(&fd, sockopt::Ipv6V6Only, &true).map_err(err("setsockopt(IPV6_V6ONLY)"))?;
    }
    bind(fd.as_raw_fd(), &SockaddrStorage::from(l.addr)).map_err(err("bind"))?;
    listen(&fd, backlog_of(l)).map_err(err("listen"))?;
    if let Err(e) = forkd_shared::sys::socket::set_defer_accept(fd.as_raw_fd(), 1) {
        forkd_shared::warn!("setsockopt(TCP_DEFER_ACCEPT) on {} failed: {e}", l.addr);
    }
    Ok(TcpListener::from(fd))
}

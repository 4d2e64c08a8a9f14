//! Listening sockets: bound by the master, inherited by the workers.
//!
//! `Shared`: one socket per address, every worker accepts from it. `ReusePort`: one
//! `SO_REUSEPORT` socket per address and worker slot; the master keeps them all, so a
//! worker that dies or is replaced hands its queue to the next one in its slot instead
//! of the kernel resetting the connections queued on it.

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
    pub fn open(config: &Config, old: Option<&Sockets>) -> Result<Sockets, ListenError> {
        let reuseport = config.accept == AcceptMode::ReusePort;
        let slots = if reuseport { config.workers.get() } else { 1 };
        let somaxconn = somaxconn();
        let mut by_slot = Vec::with_capacity(slots);
        for slot in 0..slots {
            let mut row = Vec::with_capacity(config.listeners.len());
            for l in &config.listeners {
                let kept = old
                    .filter(|o| o.mode == config.accept)
                    .and_then(|o| o.duplicate(slot, l.addr));
                let sock = match kept {
                    Some(sock) => sock,
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
        Ok(Sockets {
            mode: config.accept,
            addrs: config.listeners.iter().map(|l| l.addr).collect(),
            by_slot,
        })
    }

    /// A duplicate of the socket for `addr` in `slot`, if this set has one.
    fn duplicate(&self, slot: usize, addr: SocketAddr) -> Option<TcpListener> {
        let i = self.addrs.iter().position(|&a| a == addr)?;
        self.by_slot.get(slot)?.get(i)?.try_clone().ok()
    }

    /// Duplicates of the sockets the worker in `slot` accepts from.
    pub fn for_slot(&self, slot: usize) -> std::io::Result<Vec<TcpListener>> {
        let row = match self.mode {
            AcceptMode::Shared => &self.by_slot[0],
            AcceptMode::ReusePort => &self.by_slot[slot],
        };
        row.iter().map(TcpListener::try_clone).collect()
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
    let backlog = Backlog::new(l.backlog as i32).unwrap_or(Backlog::MAXCONN);
    listen(&fd, backlog).map_err(err("listen"))?;
    if let Err(e) = forkd_shared::sys::socket::set_defer_accept(fd.as_raw_fd(), 1) {
        forkd_shared::warn!("setsockopt(TCP_DEFER_ACCEPT) on {} failed: {e}", l.addr);
    }
    Ok(TcpListener::from(fd))
}

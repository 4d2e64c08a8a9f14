//! Listener registration with `EPOLLEXCLUSIVE`, which mio does not expose.
//!
//! `mio::Poll` is an epoll instance; a listener added to it directly, with the token's
//! value as the event data, is reported by mio like any other token.
//!
//! An exclusive (shared-queue) listener is also edge-triggered: level-triggered, epoll
//! re-reports a ready listener to the worker that last saw it, so a busy worker keeps
//! taking connections that a wake-up had handed to an idle one. Edge-triggered, each
//! new connection goes to the one worker it woke; a worker that stops after
//! `multi_accept` accepts remembers to come back for the rest. A reuseport listener has
//! no competitors and stays level-triggered. `EPOLLEXCLUSIVE` cannot be changed with
//! `EPOLL_CTL_MOD`: pause with [`remove`], resume with [`add`].

use std::io;
use std::os::fd::RawFd;

/// Adds `fd` to the epoll instance `epfd` for readability, reporting `token`.
/// With `exclusive`, a new connection wakes one of the waiting processes, not all.
pub fn add(epfd: RawFd, fd: RawFd, token: usize, exclusive: bool) -> io::Result<()> {
    let mut flags = libc::EPOLLIN as u32;
    if exclusive {
        flags |= (libc::EPOLLEXCLUSIVE | libc::EPOLLET) as u32;
    }
    let mut event = libc::epoll_event {
        events: flags,
        u64: token as u64,
    };
    // SAFETY: `event` is a valid, initialised epoll_event that outlives the call; the
    // kernel copies it. Bad descriptors are reported through the return value.
    let rc = unsafe { libc::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, fd, &mut event) };
    if rc == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Removes `fd` from the epoll instance `epfd`.
pub fn remove(epfd: RawFd, fd: RawFd) -> io::Result<()> {
    // SAFETY: EPOLL_CTL_DEL ignores the event pointer (null is allowed since 2.6.9).
    let rc = unsafe { libc::epoll_ctl(epfd, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut()) };
    if rc == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

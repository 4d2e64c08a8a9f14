//! A pipe for `splice(2)`: a response body relayed as is moves upstream socket →
//! pipe → client socket inside the kernel, never copied through the worker's memory
//! (HAProxy's `splice-response`). The session fills it ([`Pipe::fill`], at most the
//! body's rest, so nothing past the body leaves the upstream socket); the connection
//! code drains it to the client ([`Pipe::drain`]). [`Pipe::held`] is what it holds.
//!
//! Pipes are made with `pipe2(O_NONBLOCK | O_CLOEXEC)` and grown to [`PIPE_SIZE`]
//! when the system allows (else they keep the default 64 KiB); an empty one goes back
//! to the worker's spares when its exchange ends, one holding bytes (a client that
//! left) is closed.

use nix::errno::Errno;
use nix::fcntl::{fcntl, splice, FcntlArg, OFlag, SpliceFFlags};
use std::cell::RefCell;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

/// The size a pipe is grown to (`F_SETPIPE_SZ`): 64 splices of 4 KiB pages at most,
/// and what a loopback receive queue usually holds between two events.
const PIPE_SIZE: usize = 256 * 1024;
/// Empty pipes kept for the next exchanges (per worker thread).
const SPARE_PIPES: usize = 16;

thread_local! {
    static SPARE: RefCell<Vec<Pipe>> = const { RefCell::new(Vec::new()) };
}

/// One pipe and what it holds.
#[derive(Debug)]
pub struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    /// Its size (what `F_SETPIPE_SZ` gave, or the default).
    size: usize,
    /// Bytes spliced in and not yet out.
    held: usize,
}

impl Pipe {
    /// A spare pipe, or a new one.
    pub fn take() -> io::Result<Pipe> {
        if let Some(pipe) = SPARE.with(|s| s.borrow_mut().pop()) {
            return Ok(pipe);
        }
        let (read, write) = nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC)?;
        let grown = i32::try_from(PIPE_SIZE)
            .ok()
            .and_then(|size| fcntl(write.as_fd(), FcntlArg::F_SETPIPE_SZ(size)).ok());
        let size = grown
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(64 * 1024);
        Ok(Pipe {
            read,
            write,
            size,
            held: 0,
        })
    }

    /// Gives an empty pipe back to the spares; one that holds bytes is closed.
    pub fn give_back(self) {
        if self.held != 0 {
            return;
        }
        SPARE.with(|s| {
            let mut spare = s.borrow_mut();
            if spare.len() < SPARE_PIPES {
                spare.push(self);
            }
        });
    }

    /// Bytes in the pipe, waiting for the client.
    pub fn held(&self) -> usize {
        self.held
    }

    /// Room left (by bytes; the kernel may refuse sooner when its slots are full of
    /// partial pages, which is `WouldBlock` with bytes held).
    pub fn room(&self) -> usize {
        self.size.saturating_sub(self.held)
    }

    /// Splices at most `max` bytes from `from` into the pipe. `Ok(0)`: `from` is at
    /// its end. `WouldBlock`: `from` is empty, or (bytes held) the pipe is full.
    pub fn fill(&mut self, from: BorrowedFd<'_>, max: usize) -> io::Result<usize> {
        let want = max.min(self.room());
        if want == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = splice(from, None, self.write.as_fd(), None, want, flags()).map_err(errno)?;
        self.held += n;
        Ok(n)
    }

    /// Splices at most `max` held bytes to `to`. `WouldBlock`: `to` takes no more now.
    pub fn drain(&mut self, to: BorrowedFd<'_>, max: usize) -> io::Result<usize> {
        let want = max.min(self.held);
        if want == 0 {
            return Ok(0);
        }
        let n = splice(self.read.as_fd(), None, to, None, want, flags()).map_err(errno)?;
        self.held -= n.min(self.held);
        Ok(n)
    }
}

fn flags() -> SpliceFFlags {
    SpliceFFlags::SPLICE_F_NONBLOCK | SpliceFFlags::SPLICE_F_MOVE
}

fn errno(e: Errno) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

/// Whether a failed splice says the descriptors cannot be spliced at all (then the
/// body is copied instead).
pub fn unsupported(e: &io::Error) -> bool {
    let unsupported = [Errno::EINVAL, Errno::ENOSYS, Errno::EOPNOTSUPP];
    e.raw_os_error()
        .is_some_and(|code| unsupported.iter().any(|u| *u as i32 == code))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;

    #[test]
    fn bytes_go_through_in_order_and_never_more_than_asked() {
        let (mut a, b) = UnixStream::pair().unwrap();
        let (c, mut d) = UnixStream::pair().unwrap();
        b.set_nonblocking(true).unwrap();
        let mut pipe = Pipe::take().unwrap();
        assert!(pipe.size >= 64 * 1024);
        a.write_all(b"hello, world").unwrap();
        assert_eq!(
            pipe.fill(b.as_fd(), 5).unwrap(),
            5,
            "at most what was asked"
        );
        assert_eq!(pipe.held(), 5);
        assert_eq!(pipe.drain(c.as_fd(), usize::MAX).unwrap(), 5);
        assert_eq!(pipe.held(), 0);
        let mut got = [0u8; 5];
        d.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hello");
        // The rest stays in the socket.
        let mut rest = [0u8; 16];
        let n = (&b).read(&mut rest).unwrap();
        assert_eq!(&rest[..n], b", world");
        // Empty: `WouldBlock`, nothing held.
        let e = pipe.fill(b.as_fd(), 100).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        drop(a);
        assert_eq!(pipe.fill(b.as_fd(), 100).unwrap(), 0, "the end");
        pipe.give_back();
    }

    #[test]
    fn a_pipe_holding_bytes_is_not_kept() {
        SPARE.with(|s| s.borrow_mut().clear());
        let (mut a, b) = UnixStream::pair().unwrap();
        b.set_nonblocking(true).unwrap();
        a.write_all(b"left behind").unwrap();
        let mut pipe = Pipe::take().unwrap();
        assert!(pipe.fill(b.as_fd(), 100).unwrap() > 0);
        pipe.give_back();
        assert_eq!(SPARE.with(|s| s.borrow().len()), 0);
        Pipe::take().unwrap().give_back();
        assert_eq!(SPARE.with(|s| s.borrow().len()), 1, "an empty one is");
    }
}

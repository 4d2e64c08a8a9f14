//! A proxied body held between two sockets that move at different speeds: bytes in
//! memory up to a bound, the rest in a temporary file (see [`temp`]), written out in
//! order. The proxy uses one per direction when buffering is on:
//!
//! - a request body read whole from the client before any upstream server is chosen
//!   ([`Mode::Replay`]: nothing written out is dropped, so the body can be sent again
//!   on another connection, [`Spool::rewind`]);
//! - a response read as fast as the upstream sends it, the client fed from here
//!   ([`Mode::Fifo`]: memory is reused once written out, and a file written out whole
//!   is truncated, so a client that catches up gives the disk back).
//!
//! Order: the bytes are the memory part, then the file part. New bytes go to memory
//! only while the file holds nothing unwritten and memory has room, so they always
//! land after everything already queued.
//!
//! When the file is refused ([`Refusal`]: the body's or the worker's bound, a full
//! disk) the spool holds what it has and takes only what fits in memory: the rest of
//! the body streams, held back by the socket as without buffering (nginx's rule past
//! `proxy_max_temp_file_size`). It never fails the body.

pub mod temp;

use crate::out::{send_range, Sink};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::rc::Rc;
pub use temp::{Refusal, TempFiles};

/// Whether bytes written out are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Kept until the spool is dropped: a request body that may be sent again.
    Replay,
    /// Dropped once written out: a response on its way to a client.
    Fifo,
}

/// How much one write to a sink moved, and whether the sink is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Written {
    pub n: usize,
    /// The sink would block: wait for it to be writable.
    pub blocked: bool,
}

/// A body in memory and a temporary file.
#[derive(Debug)]
pub struct Spool {
    mode: Mode,
    mem: Vec<u8>,
    /// Bytes of `mem` written out.
    mem_at: usize,
    mem_cap: usize,
    file: Option<File>,
    /// The file's bytes written out, and its end.
    file_at: u64,
    file_end: u64,
    /// Bytes of this body that went to the file in all (against `max_temp_file_size`).
    file_total: u64,
    refused: Option<Refusal>,
    /// Bytes ever pushed (for the stats: a body that was buffered at all).
    pushed: u64,
    temp: Rc<TempFiles>,
}

impl Spool {
    /// An empty spool keeping up to `mem_cap` bytes in memory.
    pub fn new(temp: Rc<TempFiles>, mem_cap: usize, mode: Mode) -> Spool {
        Spool {
            mode,
            mem: Vec::new(),
            mem_at: 0,
            mem_cap,
            file: None,
            file_at: 0,
            file_end: 0,
            file_total: 0,
            refused: None,
            pushed: 0,
            temp,
        }
    }

    /// Nothing is left to write out.
    pub fn is_empty(&self) -> bool {
        self.mem_at == self.mem.len() && self.file_at == self.file_end
    }

    /// Bytes left to write out.
    pub fn pending(&self) -> u64 {
        (self.mem.len() - self.mem_at) as u64 + (self.file_end - self.file_at)
    }

    /// The body went (in part) to a temporary file.
    pub fn used_file(&self) -> bool {
        self.file_total > 0
    }

    /// Why the file takes no more bytes, if it does not.
    pub fn refused(&self) -> Option<Refusal> {
        self.refused
    }

    /// Whether [`Spool::push`] would take a byte now.
    pub fn has_room(&self) -> bool {
        self.mem_room() > 0 || self.refused.is_none()
    }

    /// Room in memory for new bytes (none while the file holds unwritten bytes:
    /// they come first).
    fn mem_room(&self) -> usize {
        if self.file_at < self.file_end {
            return 0;
        }
        self.mem_cap.saturating_sub(self.mem.len())
    }

    /// Takes what it can of `bytes` (memory, then the file); returns how many.
    pub fn push(&mut self, bytes: &[u8]) -> usize {
        if self.mode == Mode::Fifo && self.mem_at > 0 && self.file_at == self.file_end {
            // Written-out memory is room again.
            self.mem.drain(..self.mem_at);
            self.mem_at = 0;
        }
        let to_mem = bytes.len().min(self.mem_room());
        if to_mem > 0 {
            if self.mem.capacity() == 0 {
                self.mem.reserve_exact(self.mem_cap);
            }
            self.mem.extend_from_slice(&bytes[..to_mem]);
        }
        let rest = &bytes[to_mem..];
        let taken = if rest.is_empty() || self.refused.is_some() {
            to_mem
        } else {
            to_mem + self.push_file(rest)
        };
        self.pushed += taken as u64;
        taken
    }

    /// Bytes that went through the spool in all.
    pub fn pushed(&self) -> u64 {
        self.pushed
    }

    /// Appends what the file may take of `bytes`; a refusal is remembered.
    fn push_file(&mut self, bytes: &[u8]) -> usize {
        let allowed = match self.temp.allowance(self.file_total) {
            Ok(n) => n,
            Err(r) => {
                self.refused = Some(r);
                return 0;
            }
        };
        if self.file.is_none() {
            match self.temp.create() {
                Ok(f) => self.file = Some(f),
                Err(e) => {
                    self.refused = Some(Refusal::Disk(e.kind()));
                    return 0;
                }
            }
        }
        let Some(file) = self.file.as_ref() else {
            return 0;
        };
        let want = &bytes[..bytes
            .len()
            .min(usize::try_from(allowed).unwrap_or(usize::MAX))];
        let mut done = 0;
        while done < want.len() {
            match file.write_at(&want[done..], self.file_end + done as u64) {
                Ok(0) => {
                    self.refused = Some(Refusal::Disk(io::ErrorKind::WriteZero));
                    break;
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // ENOSPC, EDQUOT, EIO: what was written stays; the rest streams.
                    self.refused = Some(Refusal::Disk(e.kind()));
                    break;
                }
            }
        }
        let n = done as u64;
        self.file_end += n;
        self.file_total += n;
        self.temp.grew(n);
        if done < bytes.len() && self.refused.is_none() {
            // Cut at a bound: say which.
            if let Err(r) = self.temp.allowance(self.file_total) {
                self.refused = Some(r);
            }
        }
        done
    }

    /// The unwritten bytes in memory (they go before any file bytes).
    pub fn mem_pending(&self) -> &[u8] {
        &self.mem[self.mem_at..]
    }

    /// `n` bytes of [`Spool::mem_pending`] were written out.
    pub fn advance_mem(&mut self, n: usize) {
        self.mem_at = (self.mem_at + n).min(self.mem.len());
        self.settle();
    }

    /// Writes out to `sink` as much as it takes, up to about `budget` bytes: memory
    /// first, then the file (`sendfile` where the sink allows it, else through a
    /// buffer).
    pub fn write_to<S: Sink + ?Sized>(&mut self, sink: &mut S, budget: u64) -> io::Result<Written> {
        let mut w = Written::default();
        while (w.n as u64) < budget && !self.is_empty() {
            let left = budget - w.n as u64;
            let r = if self.mem_at < self.mem.len() {
                let end = self.mem.len().min(self.mem_at + left as usize);
                sink.write(&self.mem[self.mem_at..end])
            } else {
                self.write_file(sink, left)
            };
            match r {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    w.n += n;
                    if self.mem_at < self.mem.len() {
                        self.mem_at += n;
                    } else {
                        self.file_at += n as u64;
                    }
                    self.settle();
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    w.blocked = true;
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(w)
    }

    /// One write of file bytes to `sink` (`out::send_range`: `sendfile` where it can).
    fn write_file<S: Sink + ?Sized>(&self, sink: &mut S, max: u64) -> io::Result<usize> {
        match self.file.as_ref() {
            Some(file) => send_range(
                sink,
                file,
                self.file_at,
                (self.file_end - self.file_at).min(max),
            ),
            None => Ok(0),
        }
    }

    /// After bytes were written out: in `Fifo` mode, memory written out whole is
    /// emptied, and a file written out whole is truncated (its disk space and the
    /// worker's budget given back).
    fn settle(&mut self) {
        if self.mode != Mode::Fifo {
            return;
        }
        if self.mem_at == self.mem.len() && self.mem_at > 0 {
            self.mem.clear();
            self.mem_at = 0;
        }
        if self.file_at == self.file_end && self.file_end > 0 {
            if let Some(file) = self.file.as_ref() {
                if file.set_len(0).is_ok() {
                    self.temp.shrank(self.file_end);
                    self.file_at = 0;
                    self.file_end = 0;
                }
            }
        }
    }

    /// Starts writing out from the first byte again (`Replay` mode; a `Fifo` spool
    /// has dropped what it wrote).
    pub fn rewind(&mut self) {
        debug_assert_eq!(self.mode, Mode::Replay);
        if self.mode == Mode::Replay {
            self.mem_at = 0;
            self.file_at = 0;
        }
    }

    /// Bytes held in all (written out or not, in `Replay` mode: the whole body).
    pub fn held(&self) -> u64 {
        self.mem.len() as u64 + self.file_end
    }
}

impl Drop for Spool {
    fn drop(&mut self) {
        if let Some(file) = self.file.take() {
            self.temp.shrank(self.file_end);
            self.temp.closed();
            drop(file);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;

    fn temp(max_file: u64, max_total: u64) -> (Rc<TempFiles>, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!(
            "forkd-spool-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        (TempFiles::with(dir.clone(), max_file, max_total), dir)
    }

    /// A sink that takes at most `per_write` bytes a call, then blocks every other
    /// call; `sendfile` decides which path file bytes take.
    struct Slow {
        got: Vec<u8>,
        per_write: usize,
        block_next: bool,
        sendfile: bool,
        fd: File,
    }

    impl Slow {
        fn new(per_write: usize, sendfile: bool) -> Slow {
            Slow {
                got: Vec::new(),
                per_write,
                block_next: false,
                sendfile,
                fd: tempfile_fd(),
            }
        }
    }

    fn tempfile_fd() -> File {
        let dir = std::env::temp_dir();
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags_tmpfile()
            .open(dir)
            .unwrap()
    }

    trait TmpFile {
        fn custom_flags_tmpfile(&mut self) -> &mut Self;
    }
    impl TmpFile for std::fs::OpenOptions {
        fn custom_flags_tmpfile(&mut self) -> &mut Self {
            use std::os::unix::fs::OpenOptionsExt;
            self.custom_flags(nix::fcntl::OFlag::O_TMPFILE.bits())
        }
    }

    impl Write for Slow {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            let block = self.block_next;
            self.block_next = !block;
            if block {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let n = b.len().min(self.per_write);
            self.got.extend_from_slice(&b[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    impl Sink for Slow {
        fn sendfile_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
            self.sendfile.then(|| self.fd.as_fd())
        }
    }

    fn body(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 % 251) as u8).collect()
    }

    /// Drains `spool` into `sink` until empty.
    fn drain(spool: &mut Spool, sink: &mut Slow) {
        while !spool.is_empty() {
            spool.write_to(sink, 100_000).unwrap();
        }
    }

    #[test]
    fn bytes_come_out_in_order_through_memory_and_the_file_as_they_are_pushed() {
        let (t, _) = temp(1 << 30, 1 << 30);
        let data = body(300_000);
        let mut spool = Spool::new(t.clone(), 1000, Mode::Fifo);
        let mut sink = Slow::new(777, false);
        let mut at = 0;
        // Push and write out in turns, so memory and file both refill mid-way.
        while at < data.len() || !spool.is_empty() {
            if at < data.len() {
                at += spool.push(&data[at..(at + 5000).min(data.len())]);
            }
            spool.write_to(&mut sink, 3000).unwrap();
        }
        assert_eq!(sink.got, data);
        assert!(spool.used_file());
        assert_eq!(t.used(), 0, "a file written out whole is truncated");
        drop(spool);
        let c = t.take_counts();
        assert_eq!((c.opened, c.closed), (1, 1));
        assert!(c.bytes_written > 0);
    }

    #[test]
    fn file_bytes_go_out_by_sendfile_when_the_sink_allows() {
        let (t, _) = temp(1 << 30, 1 << 30);
        let data = body(200_000);
        let mut spool = Spool::new(t, 4096, Mode::Fifo);
        assert_eq!(spool.push(&data), data.len());
        let mut sink = Slow::new(usize::MAX, true);
        drain(&mut spool, &mut sink);
        // sendfile wrote the file part into the sink's descriptor, memory via write.
        let mut on_fd = vec![0u8; data.len() - 4096];
        let n = sink.fd.read_at(&mut on_fd, 0).unwrap();
        assert_eq!(sink.got, data[..4096]);
        assert_eq!(&on_fd[..n], &data[4096..]);
    }

    #[test]
    fn a_replay_spool_writes_the_same_body_again_after_rewind() {
        let (t, _) = temp(1 << 30, 1 << 30);
        let data = body(100_000);
        let mut spool = Spool::new(t, 10_000, Mode::Replay);
        assert_eq!(spool.push(&data), data.len());
        let mut first = Slow::new(999, false);
        drain(&mut spool, &mut first);
        spool.rewind();
        let mut second = Slow::new(5000, false);
        drain(&mut spool, &mut second);
        assert_eq!(first.got, data);
        assert_eq!(second.got, data);
        assert_eq!(spool.held(), data.len() as u64);
    }

    #[test]
    fn past_max_temp_file_size_only_memory_takes_bytes_and_nothing_is_lost() {
        let (t, _) = temp(50_000, 1 << 30);
        let data = body(200_000);
        let mut spool = Spool::new(t, 10_000, Mode::Fifo);
        let mut sink = Slow::new(4096, false);
        let mut at = spool.push(&data);
        assert_eq!(at, 60_000, "memory, then the file up to its bound");
        assert_eq!(spool.refused(), Some(Refusal::FileLimit));
        while at < data.len() || !spool.is_empty() {
            at += spool.push(&data[at..]);
            spool.write_to(&mut sink, 8192).unwrap();
        }
        assert_eq!(sink.got, data);
    }

    #[test]
    fn the_workers_budget_is_shared_by_its_spools_and_given_back_when_they_end() {
        let (t, _) = temp(1 << 30, 30_000);
        let data = body(50_000);
        let mut a = Spool::new(t.clone(), 1000, Mode::Fifo);
        assert_eq!(a.push(&data), 31_000);
        assert_eq!(a.refused(), Some(Refusal::WorkerLimit));
        let mut b = Spool::new(t.clone(), 1000, Mode::Fifo);
        assert_eq!(
            b.push(&data),
            1000,
            "memory only: the worker's budget is spent"
        );
        drop(a);
        assert_eq!(t.used(), 0);
        let mut c = Spool::new(t, 1000, Mode::Fifo);
        assert_eq!(c.push(&data), 31_000);
    }

    #[test]
    fn a_file_that_cannot_be_made_means_memory_only() {
        let (t, dir) = temp(1 << 30, 1 << 30);
        t.move_to(dir.join("does-not-exist"));
        let mut spool = Spool::new(t, 1000, Mode::Fifo);
        assert_eq!(spool.push(&body(5000)), 1000);
        assert!(matches!(spool.refused(), Some(Refusal::Disk(_))));
    }
}

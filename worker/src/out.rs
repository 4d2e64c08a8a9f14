//! A connection's pending output: response bytes in one buffer, interleaved with file
//! ranges sent by `sendfile`. Consecutive responses from memory are written with one
//! `write`, however many pipelined requests produced them.

use crate::file_cache::CachedFile;
use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::rc::Rc;

/// The most one `sendfile` call is asked for: about a socket buffer's worth (the
/// kernel would not take more anyway). The caller's budget may cap it lower.
const SENDFILE_CHUNK: usize = 512 * 1024;

enum Segment {
    /// Bytes of `buf` up to this offset.
    Mem { end: usize },
    /// A range of a file.
    File {
        file: Held,
        offset: u64,
        remaining: u64,
    },
}

/// A file a segment sends from: one of the open-file cache's, or one the response
/// owns (a body file of the proxy cache, closed once sent).
enum Held {
    Cached(Rc<CachedFile>),
    /// A proxy-cache entry's body file (kept open by the worker for its next hits).
    Entry(Rc<forkd_shared::cache::files::Opened>),
}

impl Held {
    fn file(&self) -> &File {
        match self {
            Held::Cached(c) => &c.file,
            Held::Entry(e) => &e.file,
        }
    }
}

#[derive(Default)]
pub struct OutQueue {
    buf: Vec<u8>,
    /// Bytes of `buf` already written.
    written: usize,
    /// End of the bytes of `buf` that belong to a sealed segment.
    sealed: usize,
    segments: VecDeque<Segment>,
}

/// Where a queue is flushed to: a socket that can take file ranges by `sendfile`,
/// or one whose bytes must pass through user space (TLS encrypts them; an HTTP/2
/// stream frames them).
pub trait Sink: Write {
    /// The descriptor `sendfile` writes to, if file ranges may go there directly.
    fn sendfile_fd(&self) -> Option<BorrowedFd<'_>>;
}

impl Sink for mio::net::TcpStream {
    fn sendfile_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.as_fd())
    }
}
impl Sink for std::fs::File {
    fn sendfile_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.as_fd())
    }
}

/// A file range copied through user space (`Sink::sendfile_fd` none) moves at most
/// this much per write: one TLS record's worth.
const COPY_CHUNK: usize = 16 * 1024;

/// How far a flush got.
#[derive(Debug, PartialEq, Eq)]
pub enum Flush {
    /// Everything was written.
    Done,
    /// The socket is full; wait for it to become writable.
    Blocked,
    /// The byte budget is spent and output is left: the socket may take more (no
    /// readiness event will say so), but other connections go first.
    Budget,
}

impl OutQueue {
    pub fn is_empty(&self) -> bool {
        self.segments.is_empty() && self.buf.len() == self.written
    }

    /// Drops whatever is queued, keeping the buffer (a connection closed mid-response).
    pub fn clear(&mut self) {
        self.buf.clear();
        self.written = 0;
        self.sealed = 0;
        self.segments.clear();
    }

    /// Whether a file range is queued (its response is large: write before adding more).
    pub fn has_file(&self) -> bool {
        self.segments
            .iter()
            .any(|s| matches!(s, Segment::File { .. }))
    }

    /// Whether this queue owns a buffer (to hand back to the pool when empty).
    pub fn has_buffer(&self) -> bool {
        self.buf.capacity() > 0
    }

    /// Installs `buf` (empty) as the memory buffer.
    pub fn attach(&mut self, buf: Vec<u8>) {
        debug_assert!(self.is_empty());
        self.buf = buf;
        self.written = 0;
        self.sealed = 0;
    }

    /// Takes the memory buffer back out, if the queue is empty.
    pub fn detach(&mut self) -> Option<Vec<u8>> {
        if !self.is_empty() || !self.has_buffer() {
            return None;
        }
        self.written = 0;
        self.sealed = 0;
        Some(std::mem::take(&mut self.buf))
    }

    /// The buffer to append response bytes to.
    pub fn bytes(&mut self) -> &mut Vec<u8> {
        &mut self.buf
    }

    /// Bytes queued so far in memory (to measure what a response appended).
    pub fn mem_len(&self) -> usize {
        self.buf.len()
    }

    /// Drops everything appended after `len` (a response replaced before it was sent).
    pub fn truncate(&mut self, len: usize) {
        if len >= self.sealed {
            self.buf.truncate(len);
        }
    }

    fn seal(&mut self) {
        if self.buf.len() > self.sealed {
            self.sealed = self.buf.len();
            match self.segments.back_mut() {
                Some(Segment::Mem { end }) => *end = self.sealed,
                _ => self.segments.push_back(Segment::Mem { end: self.sealed }),
            }
        }
    }

    /// Queues `len` bytes of `file` from `offset`, after what is queued so far.
    pub fn push_file(&mut self, file: Rc<CachedFile>, offset: u64, len: u64) {
        self.push_held(Held::Cached(file), offset, len);
    }

    /// Queues `len` bytes of a cache entry's body file from `offset`.
    pub fn push_entry(
        &mut self,
        entry: Rc<forkd_shared::cache::files::Opened>,
        offset: u64,
        len: u64,
    ) {
        self.push_held(Held::Entry(entry), offset, len);
    }

    fn push_held(&mut self, file: Held, offset: u64, len: u64) {
        self.seal();
        if len > 0 {
            self.segments.push_back(Segment::File {
                file,
                offset,
                remaining: len,
            });
        }
    }

    /// Writes as much as the socket takes, up to about `budget` bytes (a write is cut
    /// short at the budget, or a `sendfile` call; a write from memory is not). Adds
    /// the bytes written to `sent`.
    pub fn flush<S: Sink + ?Sized>(
        &mut self,
        sock: &mut S,
        sent: &mut u64,
        budget: u64,
    ) -> io::Result<Flush> {
        self.seal();
        let start = *sent;
        while let Some(front) = self.segments.front_mut() {
            if *sent - start >= budget {
                return Ok(Flush::Budget);
            }
            match front {
                Segment::Mem { end } => {
                    let end = *end;
                    while self.written < end {
                        match sock.write(&self.buf[self.written..end]) {
                            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                            Ok(n) => {
                                self.written += n;
                                *sent += n as u64;
                            }
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                                return Ok(Flush::Blocked)
                            }
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                            Err(e) => return Err(e),
                        }
                    }
                }
                Segment::File {
                    file,
                    offset,
                    remaining,
                } => {
                    while *remaining > 0 {
                        let left = budget.saturating_sub(*sent - start);
                        if left == 0 {
                            return Ok(Flush::Budget);
                        }
                        match send_range(sock, file.file(), *offset, (*remaining).min(left)) {
                            Ok(n) => {
                                *offset += n as u64;
                                *remaining -= n as u64;
                                *sent += n as u64;
                            }
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                                return Ok(Flush::Blocked)
                            }
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                            Err(e) => return Err(e),
                        }
                    }
                }
            }
            self.segments.pop_front();
        }
        self.buf.clear();
        self.written = 0;
        self.sealed = 0;
        Ok(Flush::Done)
    }
}

/// One write of up to `max` bytes of `file` from `offset` to `sock`: `sendfile` (at
/// most [`SENDFILE_CHUNK`]) where the sink allows it, else a read into a buffer and a
/// write of it ([`COPY_CHUNK`]: a short write leaves the rest to be read again next
/// time). How many bytes the sink took; a file shorter than asked is an error (it
/// shrank under us: the response cannot be completed). Static files' ranges and the
/// proxy's spooled bodies both go out through here.
pub fn send_range<S: Sink + ?Sized>(
    sock: &mut S,
    file: &File,
    offset: u64,
    max: u64,
) -> io::Result<usize> {
    use std::os::unix::fs::FileExt;
    let truncated = || {
        io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "file truncated while being sent",
        )
    };
    if let Some(fd) = sock.sendfile_fd() {
        let mut off = offset as i64;
        let count = max.min(SENDFILE_CHUNK as u64) as usize;
        return match nix::sys::sendfile::sendfile(fd, file.as_fd(), Some(&mut off), count) {
            Ok(0) => Err(truncated()),
            Ok(n) => Ok(n),
            Err(e) => Err(e.into()),
        };
    }
    let mut chunk = [0u8; COPY_CHUNK];
    let want = (max as usize).min(COPY_CHUNK);
    let n = file.read_at(&mut chunk[..want], offset)?;
    if n == 0 {
        return Err(truncated());
    }
    match sock.write(&chunk[..n])? {
        0 => Err(io::ErrorKind::WriteZero.into()),
        w => Ok(w),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;

    fn cached(len: u64) -> Rc<CachedFile> {
        let dir = std::env::temp_dir().join(format!("forkd-out-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("big.bin");
        File::create(&path).unwrap().set_len(len).unwrap();
        let file = File::open(&path).unwrap();
        let meta = file.metadata().unwrap();
        Rc::new(CachedFile::open(path, file, &meta, 0).unwrap())
    }

    /// A sink that never blocks: only the budget can stop a flush before the end.
    fn sink() -> File {
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/null")
            .unwrap()
    }

    #[test]
    fn a_flush_stops_at_its_budget_and_resumes_where_it_stopped() {
        let mut q = OutQueue::default();
        q.attach(Vec::with_capacity(64));
        q.bytes().extend_from_slice(b"head\r\n\r\n");
        q.push_file(cached(4 << 20), 0, 4 << 20);
        let mut out = sink();
        let budget = 256 * 1024;
        let (mut total, mut calls) = (0, 0);
        loop {
            let mut sent = 0;
            let result = q.flush(&mut out, &mut sent, budget).unwrap();
            calls += 1;
            assert!(sent <= budget, "wrote {sent} bytes on a budget of {budget}");
            total += sent;
            match result {
                Flush::Budget => assert!(!q.is_empty()),
                Flush::Done => break,
                Flush::Blocked => panic!("/dev/null blocked"),
            }
        }
        assert_eq!(total, 8 + (4 << 20));
        assert_eq!(calls, (total as usize).div_ceil(budget as usize));
        assert!(q.is_empty());
    }
}

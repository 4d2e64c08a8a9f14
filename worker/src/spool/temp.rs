//! The worker's temporary files: where they are made (`temp_dir`), how much of them
//! one response and the whole worker may hold (`max_temp_file_size`,
//! `temp_max_bytes`), and the counts the stats take from them.
//!
//! A file is made with `O_TMPFILE`, so it has no name: it is gone with its last
//! descriptor, and a worker killed with `kill -9` leaves nothing on disk. A file
//! system without `O_TMPFILE` gets a named file that is unlinked at once (the same
//! guarantee but for the instant between the two calls).
//!
//! Writes and reads of these files are plain `pwrite`/`pread`/`sendfile` on the event
//! loop. They reach the page cache, not the disk, unless memory is short; the calls
//! go through [`super::Spool`] only, so moving them to a file thread pool changes
//! that one module.

use forkd_shared::config::Config;
use std::cell::{Cell, RefCell};
use std::fs::File;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::rc::Rc;

/// Where temporary files go and how much of them the worker holds.
#[derive(Debug)]
pub struct TempFiles {
    dir: RefCell<PathBuf>,
    max_file: Cell<u64>,
    max_total: Cell<u64>,
    /// Bytes in this worker's temporary files now.
    used: Cell<u64>,
    /// A sequence for the names of files made without `O_TMPFILE`.
    seq: Cell<u64>,
    /// Counts not yet added to the stats (see [`TempFiles::take_counts`]).
    counts: Cell<TempCounts>,
}

/// What happened to temporary files since the stats last took the counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TempCounts {
    pub opened: u64,
    pub closed: u64,
    pub bytes_written: u64,
}

/// Why a spool takes no more bytes into its file (what then fits in memory streams).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `max_temp_file_size` for this body is reached.
    FileLimit,
    /// `temp_max_bytes` for the worker is reached.
    WorkerLimit,
    /// The file could not be made or written (a full disk, say): its error.
    Disk(io::ErrorKind),
}

impl TempFiles {
    pub fn new(config: &Config) -> Rc<TempFiles> {
        TempFiles::with(
            config.temp_dir.clone(),
            config.max_temp_file_size,
            config.temp_max_bytes,
        )
    }

    /// Files in `dir`, at most `max_file` bytes of one body, `max_total` in all.
    pub fn with(dir: PathBuf, max_file: u64, max_total: u64) -> Rc<TempFiles> {
        Rc::new(TempFiles {
            dir: RefCell::new(dir),
            max_file: Cell::new(max_file),
            max_total: Cell::new(max_total),
            used: Cell::new(0),
            seq: Cell::new(0),
            counts: Cell::new(TempCounts::default()),
        })
    }

    /// A reloaded configuration: later files follow it (files open stay where they are).
    pub fn reconfigure(&self, config: &Config) {
        self.set(
            config.temp_dir.clone(),
            config.max_temp_file_size,
            config.temp_max_bytes,
        );
    }

    fn set(&self, dir: PathBuf, max_file: u64, max_total: u64) {
        *self.dir.borrow_mut() = dir;
        self.max_file.set(max_file);
        self.max_total.set(max_total);
    }

    #[cfg(test)]
    pub fn move_to(&self, dir: PathBuf) {
        self.set(dir, self.max_file.get(), self.max_total.get());
    }

    /// Bytes in this worker's temporary files now.
    pub fn used(&self) -> u64 {
        self.used.get()
    }

    /// The counts since the last call (for the stats).
    pub fn take_counts(&self) -> TempCounts {
        self.counts.take()
    }

    /// How many more bytes a file that holds `written` bytes of its body so far may
    /// take now; `Err` says which bound stops it.
    pub(super) fn allowance(&self, written: u64) -> Result<u64, Refusal> {
        let by_file = self.max_file.get().saturating_sub(written);
        if by_file == 0 {
            return Err(Refusal::FileLimit);
        }
        let by_worker = self.max_total.get().saturating_sub(self.used.get());
        if by_worker == 0 {
            return Err(Refusal::WorkerLimit);
        }
        Ok(by_file.min(by_worker))
    }

    /// A new temporary file without a name.
    pub(super) fn create(&self) -> io::Result<File> {
        let dir = self.dir.borrow().clone();
        let file = match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .mode(0o600)
            .custom_flags(nix::fcntl::OFlag::O_TMPFILE.bits())
            .open(&dir)
        {
            Ok(file) => file,
            // No O_TMPFILE on this file system: a name, removed at once.
            Err(e) if e.raw_os_error().is_some_and(is_unsupported) => self.create_named(&dir)?,
            Err(e) => return Err(e),
        };
        self.count(|c| c.opened += 1);
        Ok(file)
    }

    fn create_named(&self, dir: &std::path::Path) -> io::Result<File> {
        loop {
            let n = self.seq.get();
            self.seq.set(n + 1);
            let path = dir.join(format!(".forkd-{}-{n}", std::process::id()));
            match std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
            {
                Ok(file) => {
                    std::fs::remove_file(&path)?;
                    return Ok(file);
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// `n` more bytes are in a temporary file.
    pub(super) fn grew(&self, n: u64) {
        self.used.set(self.used.get() + n);
        self.count(|c| c.bytes_written += n);
    }

    /// `n` bytes of a temporary file were given back (truncated or closed).
    pub(super) fn shrank(&self, n: u64) {
        self.used.set(self.used.get().saturating_sub(n));
    }

    /// A temporary file was closed.
    pub(super) fn closed(&self) {
        self.count(|c| c.closed += 1);
    }

    fn count(&self, f: impl FnOnce(&mut TempCounts)) {
        let mut c = self.counts.get();
        f(&mut c);
        self.counts.set(c);
    }
}

/// Whether `errno` from `open(O_TMPFILE)` means the file system cannot make such files.
fn is_unsupported(errno: i32) -> bool {
    use nix::errno::Errno;
    let e = Errno::from_raw(errno);
    e == Errno::EOPNOTSUPP || e == Errno::EISDIR || e == Errno::EINVAL
}

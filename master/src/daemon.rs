//! The pid file, and the lock on it that says a master runs: `flock(LOCK_EX)` held by
//! the master for its lifetime (running means locked, whatever pid the file names).
//! Locked and truncated before the master's first fork, its pid written once the
//! master owns its sockets and signals, removed when it exits. How `-s` and a second
//! `forkd` find the running master.
//!
//! The lock belongs to the open file description, which `fork` shares: a worker
//! closes its copy at once (without `LOCK_UN`, which would unlock the master's), so
//! the file stays locked exactly while the master lives, not while orphaned workers
//! drain. The descriptor is close-on-exec: a binary upgrade's new master takes its own
//! lock on a new file, while the old master's lock goes with its file to `.oldbin`.

use nix::errno::Errno;
use nix::unistd::Pid;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A starting master retries a lock that is held this many times (a `-s` command
/// holds a shared lock for an instant while it looks).
const LOCK_TRIES: usize = 5;
const LOCK_RETRY: Duration = Duration::from_millis(10);

#[derive(Debug)]
pub enum PidFileError {
    Missing(PathBuf),
    Open {
        path: PathBuf,
        source: io::Error,
    },
    Read {
        path: PathBuf,
        source: io::Error,
    },
    Lock {
        path: PathBuf,
        source: io::Error,
    },
    Garbled {
        path: PathBuf,
        content: String,
    },
    /// No master holds the file's lock (a crash left it; the pid may be reused).
    Stale {
        path: PathBuf,
        pid: Option<i32>,
    },
    /// A master holds the lock but has not written its pid yet.
    Starting(PathBuf),
    /// Another master holds the lock.
    Running {
        path: PathBuf,
        pid: Option<i32>,
    },
    Write {
        path: PathBuf,
        source: io::Error,
    },
}

impl fmt::Display for PidFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PidFileError::Missing(p) => write!(
                f,
                "pid file {} does not exist: is forkd running?",
                p.display()
            ),
            PidFileError::Open { path, source } => {
                write!(f, "cannot open pid file {}: {source}", path.display())
            }
            PidFileError::Read { path, source } => {
                write!(f, "cannot read pid file {}: {source}", path.display())
            }
            PidFileError::Lock { path, source } => {
                write!(f, "flock(pid file {}) failed: {source}", path.display())
            }
            PidFileError::Garbled { path, content } => {
                write!(
                    f,
                    "pid file {} does not hold a pid: {content:?}",
                    path.display()
                )
            }
            PidFileError::Stale { path, pid } => {
                match pid {
                    Some(pid) => write!(f, "pid file {} names process {pid}", path.display())?,
                    None => write!(f, "pid file {} names no process", path.display())?,
                }
                write!(
                    f,
                    ", but no forkd holds its lock: not running (stale pid file)"
                )
            }
            PidFileError::Starting(path) => write!(
                f,
                "forkd is starting (pid file {} is locked but holds no pid yet): try again",
                path.display()
            ),
            PidFileError::Running { path, pid } => {
                write!(f, "forkd is already running")?;
                if let Some(pid) = pid {
                    write!(f, " as process {pid}")?;
                }
                write!(f, " (pid file {} is locked)", path.display())
            }
            PidFileError::Write { path, source } => {
                write!(f, "cannot write pid file {}: {source}", path.display())
            }
        }
    }
}

/// `flock(fd, operation)`.
fn flock(file: &File, operation: libc::c_int) -> io::Result<()> {
    // SAFETY: flock only reads its two integer arguments; `file` keeps the descriptor
    // open for the call. (nix's `Flock` unlocks on drop, which a forked worker closing
    // its copy must not do; its plain `flock` is deprecated.)
    let r = unsafe { libc::flock(file.as_raw_fd(), operation) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn would_block(e: &io::Error) -> bool {
    e.raw_os_error() == Some(Errno::EWOULDBLOCK as i32)
}

/// The pid in `file`: `Ok(None)` if it is empty.
fn read_pid(path: &Path, file: &File) -> Result<Option<i32>, PidFileError> {
    let mut buf = [0u8; 64];
    let n = file
        .read_at(&mut buf, 0)
        .map_err(|source| PidFileError::Read {
            path: path.into(),
            source,
        })?;
    let content = String::from_utf8_lossy(&buf[..n]).into_owned();
    if content.trim().is_empty() {
        return Ok(None);
    }
    match content.trim().parse::<i32>() {
        Ok(pid) if pid > 0 => Ok(Some(pid)),
        _ => Err(PidFileError::Garbled {
            path: path.into(),
            content,
        }),
    }
}

/// The pid of the live master named by `path`: only if a master holds its lock.
pub fn read_live(path: &Path) -> Result<Pid, PidFileError> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(PidFileError::Missing(path.into()))
        }
        Err(source) => {
            return Err(PidFileError::Open {
                path: path.into(),
                source,
            })
        }
    };
    match flock(&file, libc::LOCK_SH | libc::LOCK_NB) {
        // Nobody holds it: whatever the file names is not a master (closing unlocks).
        Ok(()) => Err(PidFileError::Stale {
            path: path.into(),
            pid: read_pid(path, &file).ok().flatten(),
        }),
        Err(e) if would_block(&e) => match read_pid(path, &file)? {
            Some(pid) => Ok(Pid::from_raw(pid)),
            None => Err(PidFileError::Starting(path.into())),
        },
        Err(source) => Err(PidFileError::Lock {
            path: path.into(),
            source,
        }),
    }
}

/// Whether `path` names the same file as `file` (it was not replaced or removed).
fn same_file(path: &Path, file: &File) -> bool {
    match (std::fs::metadata(path), file.metadata()) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// The pid file of this master, locked; removed when dropped.
pub struct PidFile {
    path: PathBuf,
    /// Holds the lock. None in a forked worker, which closed its copy.
    file: Option<File>,
}

impl PidFile {
    /// Takes the lock on `path` (created if missing) and empties the file, or refuses
    /// because another master holds it.
    pub fn lock(path: &Path) -> Result<PidFile, PidFileError> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| PidFileError::Write {
                path: path.into(),
                source,
            })?;
        }
        let mut tries = 0;
        loop {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o644)
                .open(path)
                .map_err(|source| PidFileError::Open {
                    path: path.into(),
                    source,
                })?;
            match flock(&file, libc::LOCK_EX | libc::LOCK_NB) {
                Ok(()) => {}
                Err(e) if would_block(&e) && tries + 1 < LOCK_TRIES => {
                    tries += 1;
                    std::thread::sleep(LOCK_RETRY);
                    continue;
                }
                Err(e) if would_block(&e) => {
                    return Err(PidFileError::Running {
                        path: path.into(),
                        pid: read_pid(path, &file).ok().flatten(),
                    })
                }
                Err(source) => {
                    return Err(PidFileError::Lock {
                        path: path.into(),
                        source,
                    })
                }
            }
            // The master that held it may have removed the file before unlocking: a
            // lock on a file no longer at `path` says nothing. Open it again.
            if !same_file(path, &file) {
                continue;
            }
            file.set_len(0).map_err(|source| PidFileError::Write {
                path: path.into(),
                source,
            })?;
            return Ok(PidFile {
                path: path.into(),
                file: Some(file),
            });
        }
    }

    /// Writes our pid into the locked file.
    pub fn write_pid(&self) -> Result<(), PidFileError> {
        let err = |source| PidFileError::Write {
            path: self.path.clone(),
            source,
        };
        let file = self
            .file
            .as_ref()
            .ok_or_else(|| err(io::ErrorKind::NotFound.into()))?;
        file.set_len(0).map_err(err)?;
        file.write_all_at(format!("{}\n", std::process::id()).as_bytes(), 0)
            .map_err(err)
    }

    /// Where the file is now.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Moves the file (binary upgrade: to `.oldbin` and back); the lock goes with it.
    pub fn rename(&mut self, to: &Path) -> io::Result<()> {
        std::fs::rename(&self.path, to)?;
        self.path = to.into();
        Ok(())
    }

    /// In a forked worker: closes this process's copy of the locked descriptor (the
    /// master keeps the lock) and disowns the file.
    pub fn close_in_child(&mut self) {
        self.file = None;
    }
}

impl Drop for PidFile {
    fn drop(&mut self) {
        // Only remove it if it is still ours; then closing the descriptor unlocks.
        if let Some(file) = &self.file {
            if same_file(&self.path, file) {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_path(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("forkd-pidfile-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("forkd.pid")
    }

    #[test]
    fn a_locked_file_names_the_master_and_refuses_a_second_lock() {
        let path = temp_path("locked");
        let pid_file = PidFile::lock(&path).unwrap();
        assert!(matches!(read_live(&path), Err(PidFileError::Starting(_))));
        pid_file.write_pid().unwrap();
        assert_eq!(
            read_live(&path).unwrap().as_raw(),
            std::process::id() as i32
        );
        // A second open file description cannot take the lock, even in this process.
        match PidFile::lock(&path) {
            Err(PidFileError::Running { pid, .. }) => {
                assert_eq!(pid, Some(std::process::id() as i32))
            }
            other => panic!("second lock: {:?}", other.map(|_| ())),
        }
        drop(pid_file);
        assert!(!path.exists());
    }

    #[test]
    fn an_unlocked_file_is_stale_whatever_it_names() {
        let path = temp_path("stale");
        // Our own pid: a live process, but nobody holds the lock.
        std::fs::write(&path, format!("{}\n", std::process::id())).unwrap();
        let err = read_live(&path).unwrap_err();
        assert!(matches!(err, PidFileError::Stale { pid: Some(_), .. }));
        assert!(err.to_string().contains("not running (stale pid file)"));
        // And a new master takes it over.
        let pid_file = PidFile::lock(&path).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "");
        drop(pid_file);
    }

    #[test]
    fn the_lock_moves_with_a_renamed_file() {
        let path = temp_path("rename");
        let mut pid_file = PidFile::lock(&path).unwrap();
        pid_file.write_pid().unwrap();
        let oldbin = path.with_extension("pid.oldbin");
        pid_file.rename(&oldbin).unwrap();
        assert!(read_live(&oldbin).is_ok());
        // The path is free for a new master.
        let new = PidFile::lock(&path).unwrap();
        drop(new);
        drop(pid_file);
        assert!(!oldbin.exists());
    }
}

//! The pid file: written once the master owns its sockets, removed when it exits, and
//! how `-s` and a second `forkd` find the running master.

use nix::errno::Errno;
use nix::sys::signal::kill;
use nix::unistd::Pid;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

#[derive(Debug)]
pub enum PidFileError {
    Missing(PathBuf),
    Read {
        path: PathBuf,
        source: io::Error,
    },
    Garbled {
        path: PathBuf,
        content: String,
    },
    /// The file names a process that does not exist.
    Stale {
        path: PathBuf,
        pid: i32,
    },
    /// Another master is running.
    Running {
        path: PathBuf,
        pid: i32,
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
            PidFileError::Read { path, source } => {
                write!(f, "cannot read pid file {}: {source}", path.display())
            }
            PidFileError::Garbled { path, content } => {
                write!(
                    f,
                    "pid file {} does not hold a pid: {content:?}",
                    path.display()
                )
            }
            PidFileError::Stale { path, pid } => write!(
                f,
                "pid file {} names process {pid}, which is not running (stale pid file)",
                path.display()
            ),
            PidFileError::Running { path, pid } => write!(
                f,
                "forkd is already running as process {pid} (pid file {})",
                path.display()
            ),
            PidFileError::Write { path, source } => {
                write!(f, "cannot write pid file {}: {source}", path.display())
            }
        }
    }
}

/// The pid of the live master named by `path`.
pub fn read_live(path: &Path) -> Result<Pid, PidFileError> {
    let content = match std::fs::read_to_string(path) {
        Ok(c) => c,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(PidFileError::Missing(path.into()))
        }
        Err(source) => {
            return Err(PidFileError::Read {
                path: path.into(),
                source,
            })
        }
    };
    let pid: i32 = content.trim().parse().map_err(|_| PidFileError::Garbled {
        path: path.into(),
        content: content.clone(),
    })?;
    if pid <= 0 {
        return Err(PidFileError::Garbled {
            path: path.into(),
            content,
        });
    }
    match kill(Pid::from_raw(pid), None) {
        Ok(()) | Err(Errno::EPERM) => Ok(Pid::from_raw(pid)),
        Err(_) => Err(PidFileError::Stale {
            path: path.into(),
            pid,
        }),
    }
}

/// The pid file of this master; removed when dropped.
pub struct PidFile {
    path: PathBuf,
}

impl PidFile {
    /// Refuses when another live master owns `path`; replaces a stale file.
    pub fn check_free(path: &Path) -> Result<(), PidFileError> {
        match read_live(path) {
            Ok(pid) if pid != nix::unistd::getpid() => Err(PidFileError::Running {
                path: path.into(),
                pid: pid.as_raw(),
            }),
            _ => Ok(()),
        }
    }

    /// Writes our pid (via a temporary file and rename, so a reader never sees half).
    pub fn write(path: &Path) -> Result<PidFile, PidFileError> {
        let err = |source| PidFileError::Write {
            path: path.into(),
            source,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(err)?;
        }
        let tmp = path.with_extension("pid.tmp");
        std::fs::write(&tmp, format!("{}\n", std::process::id())).map_err(err)?;
        std::fs::rename(&tmp, path).map_err(err)?;
        Ok(PidFile { path: path.into() })
    }

    /// Where the file is now.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Moves the file (binary upgrade: to `.oldbin` and back); it stays ours.
    pub fn rename(&mut self, to: &Path) -> io::Result<()> {
        std::fs::rename(&self.path, to)?;
        self.path = to.into();
        Ok(())
    }
}

impl Drop for PidFile {
    fn drop(&mut self) {
        // Only remove it if it is still ours.
        let ours = std::fs::read_to_string(&self.path)
            .is_ok_and(|c| c.trim() == std::process::id().to_string());
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

//! The one place the region is mapped and viewed as a [`Layout`]: the only `unsafe`
//! of the shared-memory code.
//!
//! The region is a file mapped `MAP_SHARED`, created by the master before the first
//! fork, so every worker inherits the same pages (an anonymous `MAP_PRIVATE` map would
//! be copied on write, and the master would never see a worker's counters), and
//! `forkd stats` can map it read-only by path, even after the master has gone.

use super::layout::{Layout, LAYOUT_VERSION, MAGIC};
use super::report::{self, Inconsistent, Report};
use memmap2::{Mmap, MmapMut, MmapOptions};
use std::fmt;
use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;

/// Why a region could not be created or opened.
#[derive(Debug)]
pub enum ShmError {
    Io {
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    Missing(PathBuf),
    NotForkd(PathBuf),
    Version {
        path: PathBuf,
        found: u32,
    },
    TooSmall {
        path: PathBuf,
        size: u64,
    },
    /// A cell of the region names another counter than this build's of that id.
    Counters {
        path: PathBuf,
        mismatch: super::master::CounterMismatch,
    },
    /// Another live master owns the region.
    InUse {
        path: PathBuf,
        pid: i32,
    },
}

impl fmt::Display for ShmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShmError::Io { op, path, source } => {
                write!(f, "{op}({}) failed: {source}", path.display())
            }
            ShmError::Missing(p) => write!(
                f,
                "{} does not exist: has forkd run with this shm_file?",
                p.display()
            ),
            ShmError::NotForkd(p) => write!(f, "{} is not a forkd stats region", p.display()),
            ShmError::Version { path, found } => write!(
                f,
                "{} has layout version {found}, this forkd reads version {LAYOUT_VERSION}",
                path.display()
            ),
            ShmError::TooSmall { path, size } => {
                write!(
                    f,
                    "{} is {size} bytes, too small for a forkd region",
                    path.display()
                )
            }
            ShmError::Counters { path, mismatch } => write!(
                f,
                "{} counts \"{}\" in cell {} where this forkd counts \"{}\": the builds cannot share it",
                path.display(),
                mismatch.region,
                mismatch.cell,
                mismatch.ours
            ),
            ShmError::InUse { path, pid } => write!(
                f,
                "{} is in use by the forkd master {pid}: give each instance its own shm_file",
                path.display()
            ),
        }
    }
}

impl std::error::Error for ShmError {}

/// The region mapped for writing: the master's and (inherited through `fork`) its
/// workers'. The only way to a `&Layout`, whose atomics can be stored to.
pub struct Region {
    map: MmapMut,
    path: PathBuf,
}

/// The region mapped read-only (`forkd stats`, `forkd -s reload` following a reload).
/// It hands out readings, never the layout: nothing can store through it, so a reader
/// cannot fault on its read-only pages or disturb a running master.
pub struct RegionReader {
    map: Mmap,
    path: PathBuf,
}

pub const REGION_SIZE: usize = std::mem::size_of::<Layout>();

impl Region {
    /// Creates a fresh region at `path` (mode 0640) for the master `pid`. Refuses when
    /// a live master other than `pid` (or `upgrading_from`, the master it replaces)
    /// owns the existing file. The old file is unlinked, not truncated, so a reader that
    /// still maps it keeps valid pages.
    pub fn create(path: &Path, pid: i32, upgrading_from: Option<i32>) -> Result<Region, ShmError> {
        let io = |op| {
            move |source| ShmError::Io {
                op,
                path: path.to_path_buf(),
                source,
            }
        };
        if let Ok(existing) = RegionReader::open(path) {
            let owner = existing.layout().header.master_pid.load(Relaxed);
            if owner != pid
                && Some(owner) != upgrading_from
                && owner > 0
                && super::master::process_alive(owner)
            {
                return Err(ShmError::InUse {
                    path: path.to_path_buf(),
                    pid: owner,
                });
            }
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io("mkdir"))?;
        }
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("unlink")(e)),
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o640)
            .open(path)
            .map_err(io("open"))?;
        file.set_len(REGION_SIZE as u64).map_err(io("ftruncate"))?;
        // SAFETY: the file was just created by us with the exact size mapped; other
        // processes only ever access it through atomics (see `layout`).
        let map =
            unsafe { MmapOptions::new().len(REGION_SIZE).map_mut(&file) }.map_err(io("mmap"))?;
        let region = Region {
            map,
            path: path.to_path_buf(),
        };
        let h = &region.layout().header;
        h.layout_version.store(LAYOUT_VERSION, Relaxed);
        h.slot_count.store(super::layout::MAX_SLOTS as u32, Relaxed);
        h.region_size.store(REGION_SIZE as u64, Relaxed);
        h.master_pid.store(pid, Relaxed);
        h.start_time_ms.store(super::now_ms(), Relaxed);
        super::master::adopt_counter_names(h).expect("a fresh region has no names");
        h.magic.store(MAGIC, std::sync::atomic::Ordering::Release);
        Ok(region)
    }

    /// Maps the existing region at `path` for writing, to share it with the master `from`
    /// that exec'd this one (binary upgrade): counters carry over exactly. Fails when
    /// the file is not a region of this layout version, or `from` does not own it; the
    /// caller then creates a fresh region.
    pub fn attach(path: &Path, from: i32) -> Result<Region, ShmError> {
        let io = |op| {
            move |source| ShmError::Io {
                op,
                path: path.to_path_buf(),
                source,
            }
        };
        let existing = RegionReader::open(path)?;
        let owner = existing.layout().header.master_pid.load(Relaxed);
        if owner != from {
            return Err(ShmError::InUse {
                path: path.to_path_buf(),
                pid: owner,
            });
        }
        drop(existing);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(io("open"))?;
        // SAFETY: checked above to be a region of this layout and at least this size;
        // every process accesses it only through atomics.
        let map =
            unsafe { MmapOptions::new().len(REGION_SIZE).map_mut(&file) }.map_err(io("mmap"))?;
        let region = Region {
            map,
            path: path.to_path_buf(),
        };
        super::master::adopt_counter_names(&region.layout().header).map_err(|mismatch| {
            ShmError::Counters {
                path: path.to_path_buf(),
                mismatch,
            }
        })?;
        Ok(region)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The region as its layout.
    pub fn layout(&self) -> &Layout {
        // SAFETY: the mapping is `REGION_SIZE` bytes (created at that size, or checked
        // before `attach` mapped it) and page-aligned, which satisfies `Layout`'s
        // 4096-byte alignment; it lives as long as `self`. `Layout` holds only atomics
        // (and arrays and structs of them), for which every bit pattern, including all
        // zeros, is valid, and which make concurrent access from other processes
        // well-defined.
        unsafe { &*(self.map.as_ptr() as *const Layout) }
    }

    /// A consistent reading of every counter (bounded: see [`report::read`]).
    pub fn report(&self) -> Result<Report, Inconsistent> {
        report::read(self.layout())
    }
}

impl RegionReader {
    /// Maps an existing region read-only, checking that it is a forkd region of this
    /// layout version.
    pub fn open(path: &Path) -> Result<RegionReader, ShmError> {
        let io = |op| {
            move |source| ShmError::Io {
                op,
                path: path.to_path_buf(),
                source,
            }
        };
        let file = match std::fs::File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(ShmError::Missing(path.into()))
            }
            Err(e) => return Err(io("open")(e)),
        };
        let size = file.metadata().map_err(io("fstat"))?.len();
        if size < 64 {
            return Err(ShmError::NotForkd(path.into()));
        }
        // SAFETY: mapped read-only, for as many bytes as the file has; the region's
        // writers change it only through atomics.
        let map =
            unsafe { MmapOptions::new().len(size as usize).map(&file) }.map_err(io("mmap"))?;
        let magic = u64::from_le_bytes(map[..8].try_into().expect("8 bytes"));
        let version = u32::from_le_bytes(map[8..12].try_into().expect("4 bytes"));
        if magic != MAGIC {
            return Err(ShmError::NotForkd(path.into()));
        }
        if version != LAYOUT_VERSION {
            return Err(ShmError::Version {
                path: path.into(),
                found: version,
            });
        }
        if (size as usize) < REGION_SIZE {
            return Err(ShmError::TooSmall {
                path: path.into(),
                size,
            });
        }
        Ok(RegionReader {
            map,
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A consistent reading of every counter (bounded: see [`report::read`]).
    pub fn report(&self) -> Result<Report, Inconsistent> {
        report::read(self.layout())
    }

    /// The master recorded in the header (for messages: it may have exited, and its
    /// pid may since name another process).
    pub fn master_pid(&self) -> i32 {
        self.layout().header.master_pid.load(Relaxed)
    }

    /// Private: the layout is never handed out of a read-only mapping.
    fn layout(&self) -> &Layout {
        // SAFETY: checked in `open` to be at least `REGION_SIZE` bytes; page-aligned;
        // lives as long as `self`; only atomics (see `Region::layout`). The pages are
        // read-only and this type only ever loads from them: `layout` is private and
        // every caller in this file only reads.
        unsafe { &*(self.map.as_ptr() as *const Layout) }
    }
}

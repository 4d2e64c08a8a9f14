//! The one place the region is mapped and viewed as a [`Layout`]: the only `unsafe`
//! of the shared-memory code.
//!
//! The region is a file mapped `MAP_SHARED`, created by the master before the first
//! fork, so every worker inherits the same pages (an anonymous `MAP_PRIVATE` map would
//! be copied on write, and the master would never see a worker's counters), and
//! `forkd stats` can map it read-only by path, even after the master has gone.
//!
//! Also the region's lock (`flock`): which master may create, attach to, or must keep
//! out of a region (see [`Region`]).

use super::layout::{Layout, LAYOUT_VERSION, LEGACY_SIZE, MAGIC};
use super::report::{self, Inconsistent, Report};
use memmap2::{Mmap, MmapMut, MmapOptions};
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
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
        mismatch: super::cells::CounterMismatch,
    },
    /// Another instance holds the region's lock; `pid`: the master its header names
    /// (0: unknown).
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
            ShmError::InUse { path, pid: 0 } => write!(
                f,
                "{} is in use by another forkd (its lock is held): give each instance its own shm_file",
                path.display()
            ),
            ShmError::InUse { path, pid } => write!(
                f,
                "{} is in use by the forkd master {pid} or its workers (they hold its lock): give each instance its own shm_file",
                path.display()
            ),
        }
    }
}

impl std::error::Error for ShmError {}

/// The region mapped for writing: the master's and (inherited through `fork`) its
/// workers'. The only way to a `&Layout`, whose atomics can be stored to.
///
/// Locking: "a master runs on this region" means "its file is locked" (`flock`), not
/// "the pid in its header is alive" (pids are reused). Every master holds a shared
/// lock for its lifetime, through the descriptor kept here; a fresh start needs the
/// exclusive lock, so it is refused while any master holds the shared one, and two
/// masters of one binary upgrade share the region with two shared locks. The lock
/// belongs to the open file description, which `fork` shares: workers hold it with
/// their master, and it is released when the last of them exits (or closes its copy).
/// So a master killed with workers still draining keeps its region locked until they
/// are gone (they exit at most `drain_timeout` after their master dies), which is
/// right: they still write to it. The descriptor is close-on-exec, so the binary a
/// master execs takes its own lock.
pub struct Region {
    map: MmapMut,
    path: PathBuf,
    /// Open for the lock's sake (see above); never read.
    _lock: File,
}

/// The region mapped read-only (`forkd stats`, `forkd -s reload` following a reload).
/// It hands out readings, never the layout: nothing can store through it, so a reader
/// cannot fault on its read-only pages or disturb a running master.
pub struct RegionReader {
    map: Mmap,
    path: PathBuf,
    /// To ask whether any master still holds the region's lock.
    file: File,
}

pub const REGION_SIZE: usize = std::mem::size_of::<Layout>();

impl Region {
    /// Creates a fresh region at `path` (mode 0640) for the master `pid`, and holds a
    /// shared lock on it for as long as this process or a child forked with it keeps
    /// the descriptor open (see [`Region`] on locking).
    ///
    /// A fresh start (`upgrading_from` None) first takes the existing file's lock
    /// exclusively, without waiting: if any process of another instance still holds
    /// it, the start is refused ([`ShmError::InUse`]) whatever pid the header names.
    /// A master started by a binary upgrade (`upgrading_from`: the master that exec'd
    /// it, told through its environment) does not: the master it replaces holds the
    /// lock and keeps the old file's pages. The new file is written under a temporary
    /// name and renamed over the old one, so a reader that still maps the old file
    /// keeps valid pages, and a second master starting at the same moment either
    /// finds the old file locked or the new one.
    pub fn create(path: &Path, pid: i32, upgrading_from: Option<i32>) -> Result<Region, ShmError> {
        let io = |op| {
            move |source| ShmError::Io {
                op,
                path: path.to_path_buf(),
                source,
            }
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io("mkdir"))?;
        }
        // Held until the new file has replaced it: no second master can take it then.
        let _old = match upgrading_from {
            Some(_) => None,
            None => Some(lock_old(path)?),
        };
        let tmp = path.with_file_name(format!(
            "{}.new-{pid}",
            path.file_name()
                .map_or("forkd.shm".into(), |n| n.to_string_lossy())
        ));
        let _ = std::fs::remove_file(&tmp);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o640)
            .open(&tmp)
            .map_err(io("open"))?;
        let made = (|| {
            flock(&file, libc::LOCK_SH | libc::LOCK_NB).map_err(io("flock"))?;
            file.set_len(REGION_SIZE as u64).map_err(io("ftruncate"))?;
            // SAFETY: the file was just created by us with the exact size mapped; other
            // processes only ever access it through atomics (see `layout`).
            let map = unsafe { MmapOptions::new().len(REGION_SIZE).map_mut(&file) }
                .map_err(io("mmap"))?;
            std::fs::rename(&tmp, path).map_err(io("rename"))?;
            Ok(map)
        })();
        let map = match made {
            Ok(map) => map,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
        };
        let region = Region {
            map,
            path: path.to_path_buf(),
            _lock: file,
        };
        let h = &region.layout().header;
        h.layout_version.store(LAYOUT_VERSION, Relaxed);
        h.slot_count.store(super::layout::MAX_SLOTS as u32, Relaxed);
        h.region_size.store(REGION_SIZE as u64, Relaxed);
        h.master_pid.store(pid, Relaxed);
        h.start_time_ms.store(super::now_ms(), Relaxed);
        super::master::adopt_counter_names(h).expect("a fresh region has no names");
        super::upstream::adopt_counter_names(&region.layout().upstreams)
            .expect("a fresh region has no names");
        h.magic.store(MAGIC, std::sync::atomic::Ordering::Release);
        Ok(region)
    }

    /// Maps the existing region at `path` for writing, to share it with the master `from`
    /// that exec'd this one (binary upgrade): counters carry over exactly. Takes a
    /// shared lock beside `from`'s. Fails when the file is not a region of this layout
    /// version, `from` is not the master it names, or its counters differ from this
    /// build's; the caller then creates a fresh region.
    pub fn attach(path: &Path, from: i32) -> Result<Region, ShmError> {
        let io = |op| {
            move |source| ShmError::Io {
                op,
                path: path.to_path_buf(),
                source,
            }
        };
        let file = match OpenOptions::new().read(true).write(true).open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(ShmError::Missing(path.into()))
            }
            Err(e) => return Err(io("open")(e)),
        };
        match flock(&file, libc::LOCK_SH | libc::LOCK_NB) {
            Ok(()) => {}
            // Exclusive: a fresh master is replacing this file right now.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                return Err(ShmError::InUse {
                    path: path.into(),
                    pid: 0,
                })
            }
            Err(e) => return Err(io("flock")(e)),
        }
        let size = check_header(&file, path, LEGACY_SIZE)?;
        // A region of a build without the areas appended since (see `layout` on
        // growing): extended with zeros, so they start empty. The old build's master
        // and workers map only their own size and never look past it.
        if (size as usize) < REGION_SIZE {
            file.set_len(REGION_SIZE as u64).map_err(io("ftruncate"))?;
        }
        // SAFETY: checked just above to be a region of this layout version, and
        // extended to at least `REGION_SIZE` bytes (a file only grows: every build
        // maps at most its own size, and none truncates a region it shares); every
        // process accesses it only through atomics.
        let map =
            unsafe { MmapOptions::new().len(REGION_SIZE).map_mut(&file) }.map_err(io("mmap"))?;
        let region = Region {
            map,
            path: path.to_path_buf(),
            _lock: file,
        };
        let owner = region.layout().header.master_pid.load(Relaxed);
        if owner != from {
            return Err(ShmError::InUse {
                path: path.to_path_buf(),
                pid: owner,
            });
        }
        let l = region.layout();
        super::master::adopt_counter_names(&l.header)
            .and_then(|()| super::upstream::adopt_counter_names(&l.upstreams))
            .map_err(|mismatch| ShmError::Counters {
                path: path.to_path_buf(),
                mismatch,
            })?;
        let recorded = l.header.region_size.load(Relaxed);
        // After the file was extended: readers of a shorter mapping trust this.
        l.header.region_size.store(
            recorded.max(REGION_SIZE as u64),
            std::sync::atomic::Ordering::Release,
        );
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
        // A region of an older build may end before the areas appended since (the
        // upstream area): mapped at this build's full size all the same, so a master
        // of this build that attaches and extends the file later is seen through this
        // mapping. Pages past the file's end are never touched: readers look at an
        // appended area only once `header.region_size` covers it, which a master
        // stores only after extending the file (and region files never shrink).
        let size = check_header(&file, path, LEGACY_SIZE)?;
        // SAFETY: mapped read-only, at least `REGION_SIZE` bytes, of which the file
        // holds at least `LEGACY_SIZE` (checked) and the rest once `region_size` says
        // so (see above); the region's writers change it only through atomics.
        let map = unsafe {
            MmapOptions::new()
                .len((size as usize).max(REGION_SIZE))
                .map(&file)
        }
        .map_err(io("mmap"))?;
        Ok(RegionReader {
            map,
            path: path.to_path_buf(),
            file,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A consistent reading of every counter (bounded: see [`report::read`]). Its
    /// master counts as alive only while the region is locked, so a pid reused since
    /// the master stopped does not make it look running.
    pub fn report(&self) -> Result<Report, Inconsistent> {
        let mut report = report::read(self.layout())?;
        report.master_alive &= self.locked();
        Ok(report)
    }

    /// Whether a master (or its workers) holds the region's lock. Probes with the
    /// exclusive lock, released at once: a master holds the shared one for its
    /// lifetime (the probe fails at once), and a master starting fresh retries its
    /// own exclusive lock for longer than the probe holds it.
    fn locked(&self) -> bool {
        match flock(&self.file, libc::LOCK_EX | libc::LOCK_NB) {
            Ok(()) => {
                let _ = flock(&self.file, libc::LOCK_UN);
                false
            }
            Err(e) => e.kind() == io::ErrorKind::WouldBlock,
        }
    }

    /// The master recorded in the header (for messages: it may have exited, and its
    /// pid may since name another process).
    pub fn master_pid(&self) -> i32 {
        self.layout().header.master_pid.load(Relaxed)
    }

    /// Private: the layout is never handed out of a read-only mapping.
    fn layout(&self) -> &Layout {
        // SAFETY: mapped in `open` for at least `REGION_SIZE` bytes (the appended area
        // of a shorter file is read only once the file covers it: see `open`);
        // page-aligned;
        // lives as long as `self`; only atomics (see `Region::layout`). The pages are
        // read-only and this type only ever loads from them: `layout` is private and
        // every caller in this file only reads.
        unsafe { &*(self.map.as_ptr() as *const Layout) }
    }
}

/// Checks that `file` starts with a forkd region header of this layout version and is
/// at least `min` bytes; returns its size.
fn check_header(file: &File, path: &Path, min: usize) -> Result<u64, ShmError> {
    let size = file
        .metadata()
        .map_err(|source| ShmError::Io {
            op: "fstat",
            path: path.into(),
            source,
        })?
        .len();
    let mut head = [0u8; 12];
    if size < 64 || file.read_exact_at(&mut head, 0).is_err() {
        return Err(ShmError::NotForkd(path.into()));
    }
    let magic = u64::from_le_bytes(head[..8].try_into().expect("8 bytes"));
    let version = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes"));
    if magic != MAGIC {
        return Err(ShmError::NotForkd(path.into()));
    }
    if version != LAYOUT_VERSION {
        return Err(ShmError::Version {
            path: path.into(),
            found: version,
        });
    }
    if (size as usize) < min {
        return Err(ShmError::TooSmall {
            path: path.into(),
            size,
        });
    }
    Ok(size)
}

/// Opens the file at `path` (creating it empty if there is none) and takes its lock
/// exclusively without waiting. Refused while any process holds it; retried if the
/// file was replaced between the open and the lock (another master just started).
fn lock_old(path: &Path) -> Result<File, ShmError> {
    let io = |op| {
        move |source| ShmError::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    };
    for _ in 0..8 {
        let file = match OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            // Never truncated: readers may still map it.
            .truncate(false)
            .mode(0o640)
            .open(path)
        {
            Ok(f) => f,
            // A region this user may not write is still one it may lock.
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                File::open(path).map_err(io("open"))?
            }
            Err(e) => return Err(io("open")(e)),
        };
        lock_exclusive(&file).map_err(|e| match e.kind() {
            io::ErrorKind::WouldBlock => ShmError::InUse {
                path: path.into(),
                pid: RegionReader::open(path).map_or(0, |r| r.master_pid()),
            },
            _ => io("flock")(e),
        })?;
        let locked = file.metadata().map_err(io("fstat"))?;
        match std::fs::metadata(path) {
            Ok(now) if now.dev() == locked.dev() && now.ino() == locked.ino() => return Ok(file),
            _ => continue,
        }
    }
    Err(ShmError::InUse {
        path: path.into(),
        pid: 0,
    })
}

/// How long a fresh start retries the exclusive lock: a process forked by some other
/// program that has the file open holds the lock between its `fork` and `exec`
/// (microseconds); a master holds it for its lifetime.
const LOCK_RETRY: std::time::Duration = std::time::Duration::from_millis(100);

/// The exclusive lock without blocking, retried for [`LOCK_RETRY`].
fn lock_exclusive(file: &File) -> io::Result<()> {
    let started = std::time::Instant::now();
    loop {
        match flock(file, libc::LOCK_EX | libc::LOCK_NB) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && started.elapsed() < LOCK_RETRY => {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            done => return done,
        }
    }
}

/// `flock(2)`, retried on EINTR.
fn flock(file: &File, op: libc::c_int) -> io::Result<()> {
    loop {
        // SAFETY: flock only takes the descriptor number, which `file` keeps open for
        // the duration of the call; it touches no memory of ours.
        if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::testing::{dead_pid, TempRegion};

    fn in_use(r: Result<Region, ShmError>) -> i32 {
        match r {
            Err(ShmError::InUse { pid, .. }) => pid,
            Err(e) => panic!("wrong error: {e}"),
            Ok(_) => panic!("a second master was allowed on a locked region"),
        }
    }

    #[test]
    fn a_header_naming_a_live_unrelated_process_does_not_stop_a_start() {
        let tmp = TempRegion::new("pidreuse");
        let mut sleeper = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        // A master that crashed, whose pid now names an unrelated live process.
        drop(Region::create(&tmp.0, sleeper.id() as i32, None).unwrap());
        let r = Region::create(&tmp.0, 4242, None);
        let _ = sleeper.kill();
        let _ = sleeper.wait();
        let r = r.expect("the start was refused by a stale pid");
        assert_eq!(r.layout().header.master_pid.load(Relaxed), 4242);
    }

    #[test]
    fn a_reader_sees_a_master_as_running_only_while_the_region_is_locked() {
        let tmp = TempRegion::new("alive");
        let mut sleeper = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let running = Region::create(&tmp.0, sleeper.id() as i32, None).unwrap();
        let reader = RegionReader::open(&tmp.0).unwrap();
        assert!(reader.report().unwrap().master_alive);
        // The master stopped; its pid now names an unrelated live process.
        drop(running);
        // (Other tests of this process fork: a child holds a copy of the descriptor
        // until it execs, for microseconds.)
        let mut alive = true;
        for _ in 0..200 {
            alive = reader.report().unwrap().master_alive;
            if !alive {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let _ = sleeper.kill();
        let _ = sleeper.wait();
        assert!(!alive, "a stopped master looked running by its reused pid");
    }

    #[test]
    fn a_second_master_is_refused_while_the_first_holds_the_region() {
        let tmp = TempRegion::new("second");
        let first = Region::create(&tmp.0, 111, None).unwrap();
        assert_eq!(in_use(Region::create(&tmp.0, 222, None)), 111);
        // Whatever the header says: the lock decides.
        first.layout().header.master_pid.store(dead_pid(), Relaxed);
        in_use(Region::create(&tmp.0, 222, None));
        // The first master's region was not replaced.
        assert_eq!(
            RegionReader::open(&tmp.0).unwrap().master_pid(),
            first.layout().header.master_pid.load(Relaxed)
        );
        drop(first);
        Region::create(&tmp.0, 222, None).expect("free once the first has gone");
    }

    #[test]
    fn an_upgrading_master_shares_the_region_and_both_keep_others_out() {
        let tmp = TempRegion::new("upgrade");
        let old = Region::create(&tmp.0, 111, None).unwrap();
        let new = Region::attach(&tmp.0, 111).expect("the upgrade attaches");
        in_use(Region::create(&tmp.0, 333, None));
        drop(old);
        // The old master has gone: the new one still holds the region.
        in_use(Region::create(&tmp.0, 333, None));
        drop(new);
        Region::create(&tmp.0, 333, None).unwrap();
    }

    #[test]
    fn an_upgrade_that_cannot_attach_replaces_the_region_beside_the_old_master() {
        let tmp = TempRegion::new("replace");
        let old = Region::create(&tmp.0, 111, None).unwrap();
        // Attaching fails (the header names another master), so the new master
        // creates a fresh region although the old one holds the lock.
        assert_eq!(in_use(Region::attach(&tmp.0, 999)), 111);
        let new = Region::create(&tmp.0, 222, Some(111)).expect("upgrade creates");
        assert_eq!(RegionReader::open(&tmp.0).unwrap().master_pid(), 222);
        // The old master's pages are still its own.
        assert_eq!(old.layout().header.master_pid.load(Relaxed), 111);
        drop(new);
    }
}

//! The one place a zone's index file is mapped and viewed as a [`Header`] and its
//! [`Slot`]s: the only `unsafe` of the cache code.
//!
//! The file is `<zone path>/index`, mapped `MAP_SHARED` by every process that uses
//! the zone: the master makes it anew at each start (a new file renamed over the
//! old one, so processes still mapping the old one never see it shrink), workers map
//! it when they adopt a configuration naming the zone, `forkd cache` maps it by path.

use super::index::{Header, Index, Slot, HEADER_SIZE, MAGIC, VERSION};
use memmap2::{MmapMut, MmapOptions};
use std::fmt;
use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::{Relaxed, Release};

/// Why an index could not be made or mapped.
#[derive(Debug)]
pub enum MapError {
    Io {
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    /// The file is not a forkd cache index of this layout, or not of `entries` slots.
    Foreign { path: PathBuf, why: String },
}

impl fmt::Display for MapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MapError::Io { op, path, source } => {
                write!(f, "{op}({}) failed: {source}", path.display())
            }
            MapError::Foreign { path, why } => write!(f, "{}: {why}", path.display()),
        }
    }
}

impl std::error::Error for MapError {}

/// A mapped index file.
pub struct IndexFile {
    map: MmapMut,
    entries: usize,
    /// The mapped file's (device, inode): a worker maps again when the name points
    /// at another file (the master made the index anew).
    pub id: (u64, u64),
    pub path: PathBuf,
}

/// The error of system call `op` on `path`, for `map_err`.
fn failed(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> MapError {
    let path = path.to_path_buf();
    move |source| MapError::Io { op, path, source }
}

/// The index file of the zone at `dir`.
pub fn index_path(dir: &Path) -> PathBuf {
    dir.join("index")
}

fn size_for(entries: usize) -> usize {
    HEADER_SIZE + entries * std::mem::size_of::<Slot>()
}

impl IndexFile {
    /// Makes a new, empty index of `entries` slots at `dir/index` (replacing any),
    /// owned by `owner` if given.
    pub fn create(dir: &Path, entries: u32, owner: Option<(u32, u32)>) -> Result<(), MapError> {
        let path = index_path(dir);
        let tmp = dir.join(format!("index.new.{}", std::process::id()));
        let io = |op, p: &Path| failed(op, p);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io("open", &tmp))?;
        file.set_len(size_for(entries as usize) as u64)
            .map_err(io("ftruncate", &tmp))?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::fchown(&file, Some(uid), Some(gid)).map_err(io("fchown", &tmp))?;
        }
        // SAFETY: the file was just made by this process with this exact size, and
        // nobody else knows its name yet; the map lives only in this block.
        let map = unsafe {
            MmapOptions::new()
                .len(size_for(entries as usize))
                .map_mut(&file)
        }
        .map_err(io("mmap", &tmp))?;
        let header = header_of(&map);
        header.version.store(VERSION, Relaxed);
        header.entries.store(entries, Relaxed);
        header.created.store(super::unix_now(), Relaxed);
        header.magic.store(MAGIC, Release);
        drop(map);
        std::fs::rename(&tmp, &path).map_err(io("rename", &path))?;
        Ok(())
    }

    /// Maps the index at `dir/index`, which must be one of `entries` slots (any
    /// number with `None`).
    pub fn open(dir: &Path, entries: Option<u32>) -> Result<IndexFile, MapError> {
        let path = index_path(dir);
        let io = |op| failed(op, &path);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io("open"))?;
        let meta = file.metadata().map_err(io("fstat"))?;
        let foreign = |why: String| MapError::Foreign {
            path: path.clone(),
            why,
        };
        if (meta.len() as usize) < HEADER_SIZE {
            return Err(foreign(format!("{} bytes: not a cache index", meta.len())));
        }
        // SAFETY: the length mapped is the file's; the file is never shrunk while
        // mapped (a new index is a new file renamed over this one), so the pages stay
        // valid; every view of them is through atomics (`header_of`, `slots_of`).
        let map = unsafe { MmapOptions::new().len(meta.len() as usize).map_mut(&file) }
            .map_err(io("mmap"))?;
        let header = header_of(&map);
        if header.magic.load(Relaxed) != MAGIC || header.version.load(Relaxed) != VERSION {
            return Err(foreign("not a cache index of this forkd".into()));
        }
        let n = header.entries.load(Relaxed) as usize;
        if size_for(n) != meta.len() as usize {
            return Err(foreign(format!(
                "{} bytes for {n} entries: truncated",
                meta.len()
            )));
        }
        if let Some(want) = entries {
            if want as usize != n {
                return Err(foreign(format!("{n} entries, not {want}")));
            }
        }
        Ok(IndexFile {
            map,
            entries: n,
            id: (meta.dev(), meta.ino()),
            path,
        })
    }

    pub fn index(&self) -> Index<'_> {
        Index {
            header: header_of(&self.map),
            slots: slots_of(&self.map, self.entries),
        }
    }
}

/// The (device, inode) `dir/index` names now, to tell whether it was made anew.
pub fn current_id(dir: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(index_path(dir))
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

fn header_of(map: &MmapMut) -> &Header {
    assert!(map.len() >= HEADER_SIZE);
    // SAFETY: the map is page-aligned and at least HEADER_SIZE long; `Header` is
    // `repr(C)` of atomic integers and bytes, for which every bit pattern (zero
    // included) is valid; shared mutation goes through the atomics only.
    unsafe { &*(map.as_ptr() as *const Header) }
}

fn slots_of(map: &MmapMut, n: usize) -> &[Slot] {
    assert!(map.len() >= size_for(n));
    // SAFETY: `HEADER_SIZE` (256) keeps the slots 64-byte aligned in a page-aligned
    // map, the map holds `n` of them after the header, and `Slot` is `repr(C)` of
    // atomics, valid for every bit pattern.
    unsafe { std::slice::from_raw_parts(map.as_ptr().add(HEADER_SIZE) as *const Slot, n) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::KeyHash;

    #[test]
    fn an_index_made_anew_is_seen_by_those_who_map_it_and_refused_when_foreign() {
        let dir = std::env::temp_dir().join(format!("forkd-cache-map-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        IndexFile::create(&dir, 128, None).unwrap();
        let a = IndexFile::open(&dir, Some(128)).unwrap();
        let b = IndexFile::open(&dir, None).unwrap();
        let h = KeyHash::of(&[b"x"]);
        let r = a.index().reserve(h, 1, 0).unwrap();
        assert_eq!(b.index().find(h).unwrap().slot, r.slot, "one shared table");
        assert!(matches!(
            IndexFile::open(&dir, Some(64)),
            Err(MapError::Foreign { .. })
        ));
        let first = a.id;
        IndexFile::create(&dir, 128, None).unwrap();
        assert_ne!(current_id(&dir), Some(first), "a new file");
        assert!(a.index().find(h).is_some(), "the old map still reads");
        assert!(IndexFile::open(&dir, None)
            .unwrap()
            .index()
            .find(h)
            .is_none());
        std::fs::write(index_path(&dir), b"garbage garbage").unwrap();
        assert!(IndexFile::open(&dir, None).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

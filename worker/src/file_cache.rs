//! A per-worker cache of open files and their prebuilt response headers.
//!
//! Keyed by route and normalised request path (the router normalises it before
//! choosing the route, without allocating when the path is already normal), so a hit
//! costs one hash lookup: no `open`/`fstat`/`close`. Small files keep their bytes in memory and are
//! answered with one `write`; larger ones are sent with `sendfile` from the cached
//! descriptor. An entry is revalidated with one `stat` at most once a second, so an
//! edited or replaced file is served fresh within a second.
//!
//! When full, entries leave one at a time in CLOCK order (second chance): the
//! oldest goes unless it was used since the hand last passed it, so a hot file
//! stays however many cold files pass through (a walk of a large tree, say).

use rustc_hash::FxHashMap;
use std::cell::Cell;
use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

/// Files up to this size are kept in memory.
pub const MEMORY_LIMIT: u64 = 64 * 1024;
/// Entries per worker; past it the least useful go (see the CLOCK above).
const MAX_ENTRIES: usize = 4096;
/// Bytes held in memory per worker; past it, likewise.
const MAX_MEMORY: usize = 32 << 20;

/// An open file with what every response for it needs.
pub struct CachedFile {
    pub path: PathBuf,
    pub file: File,
    pub size: u64,
    /// Its bytes, when it is small enough.
    pub body: Option<Box<[u8]>>,
    pub mtime: i64,
    ino: u64,
    dev: u64,
    mtime_nsec: i64,
    /// `Content-Type`, `Last-Modified`, `ETag`, `Accept-Ranges` lines.
    pub headers: Box<[u8]>,
    pub content_type: &'static str,
    pub etag: Box<[u8]>,
    pub last_modified: Box<[u8]>,
    /// Wall-clock second of the last check against the file system.
    checked: Cell<u64>,
    /// Served since the CLOCK hand last passed it.
    used: Cell<bool>,
}

impl CachedFile {
    /// Opens `path` (a regular file) and prepares its headers.
    pub fn open(
        path: PathBuf,
        file: File,
        meta: &std::fs::Metadata,
        now_secs: u64,
    ) -> io::Result<CachedFile> {
        let size = meta.len();
        let body = if size <= MEMORY_LIMIT {
            let mut bytes = Vec::with_capacity(size as usize);
            (&file).take(size).read_to_end(&mut bytes)?;
            if bytes.len() as u64 != size {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "file changed while read",
                ));
            }
            Some(bytes.into_boxed_slice())
        } else {
            None
        };
        let content_type = mime_guess::from_path(&path)
            .first_raw()
            .unwrap_or("application/octet-stream");
        let mtime = meta.mtime();
        let etag = format!("\"{:x}-{:x}\"", mtime, size)
            .into_bytes()
            .into_boxed_slice();
        let last_modified = httpdate::fmt_http_date(
            std::time::UNIX_EPOCH + std::time::Duration::from_secs(mtime.max(0) as u64),
        )
        .into_bytes()
        .into_boxed_slice();
        let headers = build_headers(content_type, None, &last_modified, &etag);
        Ok(CachedFile {
            path,
            file,
            size,
            body,
            mtime,
            ino: meta.ino(),
            dev: meta.dev(),
            mtime_nsec: meta.mtime_nsec(),
            headers,
            content_type,
            etag,
            last_modified,
            checked: Cell::new(now_secs),
            used: Cell::new(false),
        })
    }

    /// This file as the `encoding` (`gzip`, `br`) representation of a file of
    /// `content_type`: a precompressed `X.gz` served for `X`. Its ETag is its own,
    /// marked with the encoding so no cache confuses it with another representation.
    pub fn as_encoding(mut self, content_type: &'static str, encoding: &str) -> CachedFile {
        let etag = format!("\"{:x}-{:x}-{encoding}\"", self.mtime, self.size);
        self.etag = etag.into_bytes().into_boxed_slice();
        self.content_type = content_type;
        self.headers = build_headers(
            content_type,
            Some(encoding),
            &self.last_modified,
            &self.etag,
        );
        self
    }

    /// A representation of `source` held only in memory (`body`, compressed with
    /// `encoding`), for the compressed-responses cache; `tag` (the encoding and what
    /// else decides the bytes) marks its ETag.
    pub fn encoded(
        source: &CachedFile,
        body: Vec<u8>,
        encoding: &str,
        tag: &str,
    ) -> io::Result<CachedFile> {
        let etag = format!("\"{:x}-{:x}-{tag}\"", source.mtime, source.size)
            .into_bytes()
            .into_boxed_slice();
        Ok(CachedFile {
            path: source.path.clone(),
            file: source.file.try_clone()?,
            size: body.len() as u64,
            body: Some(body.into_boxed_slice()),
            mtime: source.mtime,
            ino: source.ino,
            dev: source.dev,
            mtime_nsec: source.mtime_nsec,
            headers: build_headers(
                source.content_type,
                Some(encoding),
                &source.last_modified,
                &etag,
            ),
            content_type: source.content_type,
            etag,
            last_modified: source.last_modified.clone(),
            checked: Cell::new(source.checked.get()),
            used: Cell::new(false),
        })
    }

    fn same_as(&self, meta: &std::fs::Metadata) -> bool {
        meta.ino() == self.ino
            && meta.dev() == self.dev
            && meta.len() == self.size
            && meta.mtime() == self.mtime
            && meta.mtime_nsec() == self.mtime_nsec
    }

    fn memory(&self) -> usize {
        self.body.as_ref().map_or(0, |b| b.len())
    }
}

/// `Content-Type`, `Content-Encoding`, `Last-Modified`, `ETag`, `Accept-Ranges` lines.
fn build_headers(
    content_type: &str,
    encoding: Option<&str>,
    last_modified: &[u8],
    etag: &[u8],
) -> Box<[u8]> {
    let mut headers = Vec::with_capacity(180);
    headers.extend_from_slice(b"Content-Type: ");
    headers.extend_from_slice(content_type.as_bytes());
    if content_type.starts_with("text/") {
        headers.extend_from_slice(b"; charset=utf-8");
    }
    if let Some(encoding) = encoding {
        headers.extend_from_slice(b"\r\nContent-Encoding: ");
        headers.extend_from_slice(encoding.as_bytes());
    }
    headers.extend_from_slice(b"\r\nLast-Modified: ");
    headers.extend_from_slice(last_modified);
    headers.extend_from_slice(b"\r\nETag: ");
    headers.extend_from_slice(etag);
    headers.extend_from_slice(b"\r\nAccept-Ranges: bytes\r\n");
    headers.into_boxed_slice()
}

/// A compressed response body kept for a file, valid while the file's ETag is
/// `source_etag`.
struct Compressed {
    source_etag: Box<[u8]>,
    file: std::rc::Rc<CachedFile>,
    /// When it was last used (a counter), to drop the least recently used first.
    used: u64,
}

/// The cache: one map per route, from normalised request path to file. Keys are
/// hashed with FxHash rather than SipHash, since a lookup is on every request. Every
/// spelling of a path (`//a`, `/./a`, `/%61`) is one key. Only paths that resolve to
/// an existing file become keys and the cache holds at most `MAX_ENTRIES`.
#[derive(Default)]
pub struct FileCache {
    maps: FxHashMap<usize, FxHashMap<Box<[u8]>, std::rc::Rc<CachedFile>>>,
    entries: usize,
    memory: usize,
    /// Keys in CLOCK order, the hand at the front (a key whose entry went stale
    /// may linger here: it is skipped when the hand reaches it).
    order: VecDeque<(usize, Box<[u8]>)>,
    /// On-the-fly compressed bodies by (route, path), bounded by the `budget` each
    /// insert is given (least recently used dropped first).
    compressed: FxHashMap<(usize, Box<[u8]>), Compressed>,
    compressed_bytes: usize,
    tick: u64,
    /// (route, path) found missing, and the second it was: a precompressed sibling
    /// that is not there costs one `open` a second, not one per request.
    missing: FxHashMap<(usize, Box<[u8]>), u64>,
}

impl FileCache {
    /// The cached file for `route`/`path`, if it is still current. Checks the file
    /// system at most once a second per entry; a stale entry is dropped.
    pub fn get(
        &mut self,
        route: usize,
        path: &[u8],
        now_secs: u64,
    ) -> Option<std::rc::Rc<CachedFile>> {
        let map = self.maps.get_mut(&route)?;
        let entry = map.get_mut(path)?;
        if entry.checked.get() == now_secs {
            entry.used.set(true);
            return Some(entry.clone());
        }
        if std::fs::metadata(&entry.path).is_ok_and(|m| entry.same_as(&m)) {
            entry.checked.set(now_secs);
            entry.used.set(true);
            return Some(entry.clone());
        }
        // Changed or gone: drop it and let the caller open the file afresh.
        let removed = map.remove(path)?;
        self.entries -= 1;
        self.memory -= removed.memory();
        None
    }

    /// Whether `route`/`path` was found missing during `now_secs`.
    pub fn known_missing(&self, route: usize, path: &[u8], now_secs: u64) -> bool {
        self.missing
            .get(&(route, Box::from(path)))
            .is_some_and(|&t| t == now_secs)
    }

    pub fn note_missing(&mut self, route: usize, path: &[u8], now_secs: u64) {
        if self.missing.len() >= MAX_ENTRIES {
            self.missing.clear();
        }
        self.missing.insert((route, path.into()), now_secs);
    }

    /// The compressed body of `source` for `route`/`path`, if one is kept for the
    /// file as it is now.
    pub fn compressed(
        &mut self,
        route: usize,
        path: &[u8],
        source: &CachedFile,
    ) -> Option<std::rc::Rc<CachedFile>> {
        self.tick += 1;
        let key = (route, Box::from(path));
        let entry = self.compressed.get_mut(&key)?;
        if entry.source_etag != source.etag {
            let gone = self.compressed.remove(&key)?;
            self.compressed_bytes -= gone.file.memory();
            return None;
        }
        entry.used = self.tick;
        Some(entry.file.clone())
    }

    /// Keeps a compressed body, dropping the least recently used ones to stay within
    /// `budget` bytes (a body larger than the budget is not kept).
    pub fn insert_compressed(
        &mut self,
        route: usize,
        path: &[u8],
        source: &CachedFile,
        file: std::rc::Rc<CachedFile>,
        budget: usize,
    ) {
        let size = file.memory();
        if size > budget {
            return;
        }
        while self.compressed_bytes + size > budget {
            let Some(oldest) = self
                .compressed
                .iter()
                .min_by_key(|(_, c)| c.used)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some(gone) = self.compressed.remove(&oldest) {
                self.compressed_bytes -= gone.file.memory();
            }
        }
        self.tick += 1;
        self.compressed_bytes += size;
        let entry = Compressed {
            source_etag: source.etag.clone(),
            file,
            used: self.tick,
        };
        if let Some(old) = self.compressed.insert((route, path.into()), entry) {
            self.compressed_bytes -= old.file.memory();
        }
    }

    /// Bytes of compressed bodies kept.
    pub fn compressed_bytes(&self) -> usize {
        self.compressed_bytes
    }

    /// Adds an entry, making room first when the cache is full.
    pub fn insert(&mut self, route: usize, path: &[u8], file: std::rc::Rc<CachedFile>) {
        while self.entries > 0
            && (self.entries >= MAX_ENTRIES || self.memory + file.memory() > MAX_MEMORY)
        {
            if !self.evict_one() {
                break;
            }
        }
        self.memory += file.memory();
        self.entries += 1;
        let key: Box<[u8]> = path.into();
        if let Some(old) = self
            .maps
            .entry(route)
            .or_default()
            .insert(key.clone(), file)
        {
            self.entries -= 1;
            self.memory -= old.memory();
        } else {
            self.order.push_back((route, key));
        }
        if self.order.len() > 2 * MAX_ENTRIES {
            self.compact_order();
        }
    }

    /// Moves the CLOCK hand until one entry goes: a used one loses its mark and
    /// gets another round. False if there is nothing to evict.
    fn evict_one(&mut self) -> bool {
        // Each entry is passed at most twice (once to clear its mark).
        for _ in 0..2 * self.order.len() + 1 {
            let Some((route, path)) = self.order.pop_front() else {
                return false;
            };
            let Some(map) = self.maps.get_mut(&route) else {
                continue;
            };
            let Some(entry) = map.get(&path) else {
                continue; // went stale and was dropped
            };
            if entry.used.replace(false) {
                self.order.push_back((route, path));
                continue;
            }
            if let Some(gone) = map.remove(&path) {
                self.entries -= 1;
                self.memory -= gone.memory();
            }
            return true;
        }
        false
    }

    /// The order rebuilt from the entries (stale keys and repeats gone).
    fn compact_order(&mut self) {
        let mut seen = rustc_hash::FxHashSet::default();
        let maps = &self.maps;
        self.order.retain(|(route, path)| {
            maps.get(route).is_some_and(|m| m.contains_key(path))
                && seen.insert((*route, path.clone()))
        });
    }

    /// Entries held (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    fn temp_file(name: &str, content: &[u8]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("forkd-cache-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, content).unwrap();
        p
    }

    fn open(p: &std::path::Path, now: u64) -> Rc<CachedFile> {
        let f = File::open(p).unwrap();
        let m = f.metadata().unwrap();
        Rc::new(CachedFile::open(p.to_path_buf(), f, &m, now).unwrap())
    }

    #[test]
    fn small_file_is_held_in_memory_with_headers() {
        let p = temp_file("a.html", b"hello");
        let f = open(&p, 1);
        assert_eq!(f.body.as_deref(), Some(&b"hello"[..]));
        let h = String::from_utf8(f.headers.to_vec()).unwrap();
        assert!(
            h.starts_with("Content-Type: text/html; charset=utf-8\r\nLast-Modified: "),
            "{h}"
        );
        assert!(h.contains("ETag: \""), "{h}");
    }

    #[test]
    fn compressed_bodies_are_bounded_and_least_recently_used_go_first() {
        let p = temp_file("c.txt", b"cccc");
        let src = open(&p, 1);
        let mut cache = FileCache::default();
        let body =
            |n: usize| Rc::new(CachedFile::encoded(&src, vec![0; n], "gzip", "gzip5").unwrap());
        cache.insert_compressed(0, b"/a", &src, body(40), 100);
        cache.insert_compressed(0, b"/b", &src, body(40), 100);
        assert!(cache.compressed(0, b"/a", &src).is_some()); // /b is now the oldest
        cache.insert_compressed(0, b"/c", &src, body(40), 100);
        assert_eq!(cache.compressed_bytes(), 80);
        assert!(cache.compressed(0, b"/b", &src).is_none());
        assert!(cache.compressed(0, b"/a", &src).is_some());
        cache.insert_compressed(0, b"/d", &src, body(101), 100);
        assert!(
            cache.compressed(0, b"/d", &src).is_none(),
            "larger than the budget"
        );
        let h = String::from_utf8(body(1).headers.to_vec()).unwrap();
        assert!(
            h.contains("Content-Type: text/plain; charset=utf-8\r\nContent-Encoding: gzip\r\n"),
            "{h}"
        );
    }

    #[test]
    fn a_hot_file_stays_while_cold_ones_pass_through() {
        let p = temp_file("hot.txt", b"hot");
        let q = temp_file("cold.txt", b"cold");
        let mut cache = FileCache::default();
        cache.insert(0, b"/hot", open(&p, 1));
        let cold = open(&q, 1);
        for i in 0..3 * MAX_ENTRIES {
            let key = format!("/cold/{i}");
            cache.insert(0, key.as_bytes(), cold.clone());
            assert!(cache.len() <= MAX_ENTRIES);
            if i % 100 == 0 {
                assert!(cache.get(0, b"/hot", 1).is_some(), "evicted after {i}");
            }
        }
        assert!(cache.get(0, b"/hot", 1).is_some());
        // The oldest cold ones went, one at a time.
        assert!(cache.get(0, b"/cold/0", 1).is_none());
        let last = format!("/cold/{}", 3 * MAX_ENTRIES - 1);
        assert!(cache.get(0, last.as_bytes(), 1).is_some());
        assert_eq!(cache.len(), MAX_ENTRIES);
        assert!(cache.order.len() <= 2 * MAX_ENTRIES);
    }

    #[test]
    fn a_changed_file_is_noticed_on_the_next_second() {
        let p = temp_file("b.txt", b"one");
        let mut cache = FileCache::default();
        cache.insert(0, b"/b.txt", open(&p, 10));
        assert!(cache.get(0, b"/b.txt", 10).is_some());
        std::fs::write(&p, b"changed!").unwrap();
        // same second: not checked yet
        assert!(cache.get(0, b"/b.txt", 10).is_some());
        assert!(cache.get(0, b"/b.txt", 11).is_none());
        assert!(cache.get(0, b"/b.txt", 11).is_none());
    }
}

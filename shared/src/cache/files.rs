//! Body files on disk: where one lives (`<zone>/<last two hex digits>/<32 hex>`), how
//! one is written (without a name, `O_TMPFILE`, then linked under a temporary name
//! and renamed over the entry's, so a reader sees the old file or the new one whole,
//! and a writer killed half way leaves nothing), and how one is opened for a hit
//! (its header read and checked against its size and key).

use super::entry::{self, Corrupt, Meta};
use super::KeyHash;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// The folder of `hash`'s body file.
pub fn folder(dir: &Path, hash: KeyHash) -> PathBuf {
    dir.join(format!("{:02x}", hash.0 & 0xff))
}

/// `hash`'s body file.
pub fn body_path(dir: &Path, hash: KeyHash) -> PathBuf {
    folder(dir, hash).join(hash.hex())
}

/// Names of files written without `O_TMPFILE`, or linked before their rename, end so:
/// the loader removes any it finds (a writer died between the two calls).
pub const TEMP_SUFFIX: &str = ".tmp";

static SEQ: AtomicU64 = AtomicU64::new(0);

fn temp_name(dir: &Path, hash: KeyHash) -> PathBuf {
    let n = SEQ.fetch_add(1, Relaxed);
    folder(dir, hash).join(format!(
        "{}.{}.{n}{TEMP_SUFFIX}",
        hash.hex(),
        std::process::id()
    ))
}

/// Why an entry could not be opened.
#[derive(Debug)]
pub enum OpenError {
    Missing,
    Io(io::Error),
    Corrupt(Corrupt),
}

/// An entry opened for a hit.
#[derive(Debug)]
pub struct Opened {
    pub file: File,
    pub meta: Meta,
    /// Where the body starts in `file`.
    pub body_at: u64,
    /// The file's first bytes (header, and the body too when it is small): what one
    /// read brought, so a small entry costs no second read.
    pub prefix: Vec<u8>,
}

impl Opened {
    /// The whole body, when the first read brought it.
    pub fn small_body(&self) -> Option<&[u8]> {
        let at = self.body_at as usize;
        let end = at.checked_add(usize::try_from(self.meta.body_len).ok()?)?;
        self.prefix.get(at..end)
    }
}

/// How much of a body file one read takes: the header and a small body.
pub const FIRST_READ: usize = 16 * 1024;

/// Opens `hash`'s body file and reads its header; `key`: the key it must be for
/// (`None`: any, for the loader). A file whose size disagrees with its header, or of
/// another key, is corrupt.
pub fn open(dir: &Path, hash: KeyHash, key: Option<&[u8]>) -> Result<Opened, OpenError> {
    let path = body_path(dir, hash);
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(OpenError::Missing),
        Err(e) => return Err(OpenError::Io(e)),
    };
    open_file(file, key)
}

/// [`open`] of a file already open.
pub fn open_file(file: File, key: Option<&[u8]>) -> Result<Opened, OpenError> {
    let size = file.metadata().map_err(OpenError::Io)?.len();
    let first = usize::try_from(size).unwrap_or(FIRST_READ).min(FIRST_READ);
    let mut prefix = vec![0u8; first.max(entry::FIXED)];
    let n = read_at_most(&file, &mut prefix, 0).map_err(OpenError::Io)?;
    prefix.truncate(n);
    let len = Meta::header_len_of(&prefix).map_err(OpenError::Corrupt)?;
    if prefix.len() < len {
        let had = prefix.len();
        prefix.resize(len, 0);
        let more = read_at_most(&file, &mut prefix[had..], had as u64).map_err(OpenError::Io)?;
        prefix.truncate(had + more);
    }
    let meta = Meta::decode(&prefix).map_err(OpenError::Corrupt)?;
    meta.check_size(size).map_err(OpenError::Corrupt)?;
    if key.is_some_and(|k| k != meta.key.as_slice()) {
        return Err(OpenError::Corrupt(Corrupt::OtherKey));
    }
    Ok(Opened {
        file,
        body_at: len as u64,
        meta,
        prefix,
    })
}

fn read_at_most(file: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], at + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Removes `hash`'s body file (gone already is fine).
pub fn remove(dir: &Path, hash: KeyHash) {
    let _ = std::fs::remove_file(body_path(dir, hash));
}

/// A body file being written.
#[derive(Debug)]
pub struct Writer {
    file: File,
    /// The file has this name already (no `O_TMPFILE` on this file system).
    named: Option<PathBuf>,
    dir: PathBuf,
    hash: KeyHash,
    meta: Meta,
    header_len: u64,
    written: u64,
}

impl Writer {
    /// Starts `hash`'s file with `meta`'s header (its `body_len` is set by `finish`).
    pub fn create(dir: &Path, hash: KeyHash, meta: Meta) -> io::Result<Writer> {
        let header = meta
            .encode()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "header too large"))?;
        let folder = folder(dir, hash);
        let unnamed = |folder: &Path| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .mode(0o600)
                .custom_flags(libc::O_TMPFILE)
                .open(folder)
        };
        let file = match unnamed(&folder) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                std::fs::create_dir_all(&folder)?;
                unnamed(&folder)
            }
            other => other,
        };
        let (file, named) = match file {
            Ok(f) => (f, None),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EISDIR)) => {
                let name = temp_name(dir, hash);
                let f = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&name)?;
                (f, Some(name))
            }
            Err(e) => return Err(e),
        };
        file.write_all_at(&header, 0)?;
        Ok(Writer {
            file,
            named,
            dir: dir.to_path_buf(),
            hash,
            header_len: header.len() as u64,
            meta,
            written: 0,
        })
    }

    /// Appends body bytes.
    pub fn write(&mut self, data: &[u8]) -> io::Result<()> {
        self.file
            .write_all_at(data, self.header_len + self.written)?;
        self.written += data.len() as u64;
        Ok(())
    }

    pub fn written(&self) -> u64 {
        self.written
    }

    pub fn meta(&self) -> &Meta {
        &self.meta
    }

    /// The body is whole: its length goes into the header and the file takes the
    /// entry's name (replacing an older one whole). Returns the file's size.
    pub fn finish(mut self) -> io::Result<u64> {
        self.meta.body_len = self.written;
        self.file
            .write_all_at(&self.meta.lengths_and_times(), entry::LENGTHS_AT)?;
        let target = body_path(&self.dir, self.hash);
        let linked = match self.named.take() {
            Some(name) => name,
            None => {
                let name = temp_name(&self.dir, self.hash);
                let proc_path = format!("/proc/self/fd/{}", self.file.as_raw_fd());
                nix::unistd::linkat(
                    nix::fcntl::AT_FDCWD,
                    proc_path.as_str(),
                    nix::fcntl::AT_FDCWD,
                    &name,
                    nix::fcntl::AtFlags::AT_SYMLINK_FOLLOW,
                )
                .map_err(io::Error::from)?;
                name
            }
        };
        if let Err(e) = std::fs::rename(&linked, &target) {
            let _ = std::fs::remove_file(&linked);
            return Err(e);
        }
        Ok(self.header_len + self.written)
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // Abandoned (not finished): an unnamed file goes with its descriptor.
        if let Some(name) = self.named.take() {
            let _ = std::fs::remove_file(name);
        }
    }
}

/// Rewrites an entry's freshness in its file (a revalidation refreshed it), so a
/// restarted daemon's loader reads it.
pub fn refresh(dir: &Path, hash: KeyHash, meta: &Meta) -> io::Result<()> {
    let file = OpenOptions::new().write(true).open(body_path(dir, hash))?;
    file.write_all_at(&meta.lengths_and_times(), entry::LENGTHS_AT)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(key: &[u8]) -> Meta {
        Meta {
            status: 200,
            stored: 100,
            ttl: 10,
            key: key.to_vec(),
            head: b"Content-Type: text/plain\r\n".to_vec(),
            ..Meta::default()
        }
    }

    #[test]
    fn an_entry_is_seen_only_once_written_whole_and_checked_when_opened() {
        let dir = std::env::temp_dir().join(format!("forkd-cache-files-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let h = KeyHash::of(&[b"k"]);
        let mut w = Writer::create(&dir, h, meta(b"k")).unwrap();
        w.write(b"hello ").unwrap();
        assert!(matches!(open(&dir, h, Some(b"k")), Err(OpenError::Missing)));
        w.write(b"world").unwrap();
        let size = w.finish().unwrap();
        let o = open(&dir, h, Some(b"k")).unwrap();
        assert_eq!(o.meta.body_len, 11);
        assert_eq!(size, o.body_at + 11);
        let mut body = vec![0; 11];
        o.file.read_exact_at(&mut body, o.body_at).unwrap();
        assert_eq!(&body, b"hello world");
        assert_eq!(o.small_body(), Some(&b"hello world"[..]));
        assert!(matches!(
            open(&dir, h, Some(b"other")),
            Err(OpenError::Corrupt(Corrupt::OtherKey))
        ));
        // A truncated file is corrupt, never served short.
        let f = OpenOptions::new()
            .write(true)
            .open(body_path(&dir, h))
            .unwrap();
        f.set_len(size - 1).unwrap();
        assert!(matches!(
            open(&dir, h, Some(b"k")),
            Err(OpenError::Corrupt(Corrupt::Size { .. }))
        ));
        // An abandoned writer leaves nothing.
        let h2 = KeyHash::of(&[b"k2"]);
        let mut w = Writer::create(&dir, h2, meta(b"k2")).unwrap();
        w.write(b"part").unwrap();
        drop(w);
        assert!(matches!(open(&dir, h2, None), Err(OpenError::Missing)));
        let leftovers: Vec<_> = std::fs::read_dir(folder(&dir, h2))
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(TEMP_SUFFIX))
            .collect();
        assert!(leftovers.is_empty());
        // A refresh is read back.
        let mut w = Writer::create(&dir, h2, meta(b"k2")).unwrap();
        w.write(b"x").unwrap();
        w.finish().unwrap();
        let mut m = open(&dir, h2, None).unwrap().meta;
        m.stored = 500;
        m.ttl = 7;
        refresh(&dir, h2, &m).unwrap();
        let again = open(&dir, h2, None).unwrap().meta;
        assert_eq!((again.stored, again.ttl, again.body_len), (500, 7, 1));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! A static route's root: the route's settings ([`StaticRoute`]) and opening a file
//! below its root ([`open_regular`]: regular files only, never outside the root, and
//! never blocking on a FIFO). Used by `static_files` (the path asked for) and by
//! `representation` (the `.br` / `.gz` beside it).

use crate::file_cache::CachedFile;
use crate::http::response::Status;
use forkd_shared::config::Compress;
use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The configuration of one static route.
pub struct StaticRoute<'a> {
    /// Identifies the route in the file cache.
    pub id: usize,
    pub root: &'a Path,
    pub index: &'a [String],
    /// The path answering a request for a file that does not exist (a single-page
    /// app's entry point), if any.
    pub fallback: Option<&'a str>,
    /// Most ranges one request may list (more: the whole file); 0: ranges ignored.
    pub max_ranges: usize,
    /// Serve `X.br` / `X.gz` beside `X`.
    pub precompressed: bool,
    /// gzip on the fly, kept in the cache.
    pub compress: Option<Compress>,
    /// Bytes the worker keeps of compressed bodies.
    pub compress_cache: usize,
}

/// Why a file is not opened.
pub enum Refused {
    /// Nothing by that name.
    Missing,
    /// There, but not to be served (outside the root, no permission), or an error.
    Status(Status),
}

/// Opens `path` if it is a regular file inside `root`. `Ok(None)`: it exists but is
/// not a regular file.
pub fn open_regular(
    path: &Path,
    root: &Path,
    now_secs: u64,
) -> Result<Option<CachedFile>, Refused> {
    // O_NONBLOCK: opening a FIFO someone left in the root must not hang the worker.
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| refused(&e, path))?;
    let meta = file.metadata().map_err(|e| refused(&e, path))?;
    if !meta.is_file() {
        return Ok(None);
    }
    if !inside_root(path, root) {
        forkd_shared::warn!(
            "{} resolves outside its root {}: refused",
            path.display(),
            root.display()
        );
        return Err(Refused::Status(Status::NOT_FOUND));
    }
    CachedFile::open(path.to_path_buf(), file, &meta, now_secs)
        .map(Some)
        .map_err(|e| refused(&e, path))
}

fn refused(e: &io::Error, path: &Path) -> Refused {
    match e.kind() {
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory => Refused::Missing,
        _ => Refused::Status(io_status(e, path)),
    }
}

/// Whether `path`, with symlinks resolved, is below `root` (also resolved).
pub fn inside_root(path: &Path, root: &Path) -> bool {
    match (path.canonicalize(), root.canonicalize()) {
        (Ok(p), Ok(r)) => p.starts_with(r),
        _ => false,
    }
}

fn io_status(e: &io::Error, path: &Path) -> Status {
    match e.kind() {
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory => Status::NOT_FOUND,
        io::ErrorKind::PermissionDenied => Status::FORBIDDEN,
        _ if e.raw_os_error() == Some(nix::libc::ENAMETOOLONG) => Status::NOT_FOUND,
        _ => {
            forkd_shared::error!("open({}) failed: {e}", path.display());
            Status::INTERNAL_SERVER_ERROR
        }
    }
}

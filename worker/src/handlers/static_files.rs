//! Static files below a root: GET and HEAD, index files, directory redirects,
//! conditional requests (`If-None-Match`, `If-Modified-Since` → 304) and single byte
//! ranges (206 / 416).
//!
//! A request path is mapped to a file as nginx's `root` does (root + path), after
//! [`crate::http::path::normalize`] (called by the router, before the route is chosen)
//! has made sure it cannot climb out of the root; a symlink that points outside the
//! root is refused too.

use super::{Outcome, Reply};
use crate::file_cache::{CachedFile, FileCache};
use crate::http::path;
use crate::http::range::{self, RangeSpec};
use crate::http::request::{Method, Request};
use crate::http::response::{self, Status};
use std::ffi::OsString;
use std::fs::OpenOptions;
use std::io;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// The configuration of one static route.
pub struct StaticRoute<'a> {
    /// Identifies the route in the file cache.
    pub id: usize,
    pub root: &'a Path,
    pub index: &'a [String],
}

/// What a request path resolves to.
enum Resolved {
    File(Rc<CachedFile>),
    /// A directory requested without its trailing slash: the normalised path.
    Redirect(Vec<u8>),
    Status(Status),
}

/// GET and HEAD only.
pub fn allows(method: Method) -> bool {
    method != Method::Other
}

/// Serves `path`, the request's path as [`path::normalize`] made it (the router
/// normalises it once, before choosing the route).
pub fn serve(
    route: &StaticRoute,
    req: &Request,
    path: &[u8],
    cache: &mut FileCache,
    now_secs: u64,
    reply: &mut Reply,
) -> Outcome {
    if !allows(req.method) {
        return reply.error(Status::METHOD_NOT_ALLOWED, &[("Allow", b"GET, HEAD")]);
    }
    let file = match cache.get(route.id, path, now_secs) {
        Some(file) => file,
        None => match resolve(route, path, now_secs) {
            Resolved::File(file) => {
                cache.insert(route.id, path, file.clone());
                file
            }
            Resolved::Redirect(path) => return redirect(&path, req.query, reply),
            Resolved::Status(status) => return reply.error(status, &[]),
        },
    };
    send(req, &file, reply)
}

/// 301 to the directory with its slash. The location is built from the normalised
/// path, re-encoded, never from the raw one: `//evil.example/..` must not become a
/// protocol-relative redirect to another host.
fn redirect(normalized: &[u8], query: Option<&[u8]>, reply: &mut Reply) -> Outcome {
    let mut location = Vec::with_capacity(normalized.len() + 2);
    path::encode(normalized, &mut location);
    location.push(b'/');
    if let Some(q) = query {
        location.push(b'?');
        location.extend_from_slice(q);
    }
    reply.error(Status::MOVED_PERMANENTLY, &[("Location", &location)])
}

fn resolve(route: &StaticRoute, normalized: &[u8], now_secs: u64) -> Resolved {
    let mut full = route.root.as_os_str().to_os_string().into_vec();
    full.extend_from_slice(normalized);
    let full = PathBuf::from(OsString::from_vec(full));
    if normalized.ends_with(b"/") {
        for name in route.index {
            match open_regular(&full.join(name), route.root, now_secs) {
                Ok(Some(file)) => return Resolved::File(Rc::new(file)),
                Ok(None) => continue,
                Err(status) if status == Status::NOT_FOUND => continue,
                Err(status) => return Resolved::Status(status),
            }
        }
        return Resolved::Status(if full.is_dir() && inside_root(&full, route.root) {
            Status::FORBIDDEN // a directory without an index: no listings
        } else {
            Status::NOT_FOUND
        });
    }
    match open_regular(&full, route.root, now_secs) {
        Ok(Some(file)) => Resolved::File(Rc::new(file)),
        Ok(None) if full.is_dir() && inside_root(&full, route.root) => {
            Resolved::Redirect(normalized.to_vec())
        }
        Ok(None) => Resolved::Status(Status::NOT_FOUND),
        Err(status) => Resolved::Status(status),
    }
}

/// Opens `path` if it is a regular file inside `root`. `Ok(None)`: it exists but is
/// not a regular file.
fn open_regular(path: &Path, root: &Path, now_secs: u64) -> Result<Option<CachedFile>, Status> {
    // O_NONBLOCK: opening a FIFO someone left in the root must not hang the worker.
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| io_status(&e, path))?;
    let meta = file.metadata().map_err(|e| io_status(&e, path))?;
    if !meta.is_file() {
        return Ok(None);
    }
    if !inside_root(path, root) {
        forkd_shared::warn!(
            "{} resolves outside its root {}: refused",
            path.display(),
            root.display()
        );
        return Err(Status::NOT_FOUND);
    }
    CachedFile::open(path.to_path_buf(), file, &meta, now_secs)
        .map(Some)
        .map_err(|e| io_status(&e, path))
}

/// Whether `path`, with symlinks resolved, is below `root` (also resolved).
fn inside_root(path: &Path, root: &Path) -> bool {
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

/// Whether an `If-None-Match` list matches `etag` (weak comparison, RFC 9110 §13.1.2).
fn etag_matches(header: &[u8], etag: &[u8]) -> bool {
    let strip = |t: &[u8]| -> Vec<u8> {
        let t = t.trim_ascii();
        t.strip_prefix(b"W/").unwrap_or(t).to_vec()
    };
    let etag = strip(etag);
    header
        .split(|&b| b == b',')
        .any(|t| t.trim_ascii() == b"*" || strip(t) == etag)
}

fn not_modified(req: &Request, file: &CachedFile) -> bool {
    if let Some(inm) = req.if_none_match {
        return etag_matches(inm, &file.etag);
    }
    if let Some(ims) = req.if_modified_since {
        let since = std::str::from_utf8(ims)
            .ok()
            .and_then(|s| httpdate::parse_http_date(s).ok());
        if let Some(since) = since {
            let since = since
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            return file.mtime <= since as i64;
        }
    }
    false
}

fn range_spec(req: &Request, file: &CachedFile) -> RangeSpec {
    let Some(value) = req.range else {
        return RangeSpec::Full;
    };
    if req.method != Method::Get {
        return RangeSpec::Full;
    }
    if let Some(validator) = req.if_range {
        let validator = validator.trim_ascii();
        if validator != &file.etag[..] && validator != &file.last_modified[..] {
            return RangeSpec::Full; // the client's copy is stale: send it all
        }
    }
    range::parse(value, file.size)
}

fn send(req: &Request, file: &Rc<CachedFile>, reply: &mut Reply) -> Outcome {
    let date = reply.date;
    if not_modified(req, file) {
        let out = reply.out.bytes();
        response::start(out, Status::NOT_MODIFIED, date);
        response::header(out, "Last-Modified", &file.last_modified);
        response::header(out, "ETag", &file.etag);
        response::finish(out, reply.persistence);
        return Outcome {
            status: Status::NOT_MODIFIED,
            body_bytes: 0,
            logged: true,
        };
    }
    let (status, start, len) = match range_spec(req, file) {
        RangeSpec::Full => (Status::OK, 0, file.size),
        RangeSpec::Partial { start, end } => (Status::PARTIAL_CONTENT, start, end - start + 1),
        RangeSpec::Unsatisfiable => {
            let mut content_range = b"bytes */".to_vec();
            response::push_decimal(&mut content_range, file.size);
            return reply.error(
                Status::RANGE_NOT_SATISFIABLE,
                &[("Content-Range", &content_range)],
            );
        }
    };
    let out = reply.out.bytes();
    response::start(out, status, date);
    out.extend_from_slice(&file.headers);
    if status == Status::PARTIAL_CONTENT {
        out.extend_from_slice(b"Content-Range: bytes ");
        response::push_decimal(out, start);
        out.push(b'-');
        response::push_decimal(out, start + len - 1);
        out.push(b'/');
        response::push_decimal(out, file.size);
        out.extend_from_slice(b"\r\n");
    }
    response::content_length(out, len);
    response::finish(out, reply.persistence);
    if reply.head_only {
        return Outcome {
            status,
            body_bytes: 0,
            logged: true,
        };
    }
    match &file.body {
        Some(bytes) => out.extend_from_slice(&bytes[start as usize..(start + len) as usize]),
        None => reply.out.push_file(file.clone(), start, len),
    }
    Outcome {
        status,
        body_bytes: len,
        logged: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etag_comparison_is_weak() {
        assert!(etag_matches(b"\"a-1\"", b"\"a-1\""));
        assert!(etag_matches(b"W/\"a-1\"", b"\"a-1\""));
        assert!(etag_matches(b"\"x\", \"a-1\"", b"\"a-1\""));
        assert!(etag_matches(b"*", b"\"a-1\""));
        assert!(!etag_matches(b"\"a-2\"", b"\"a-1\""));
    }
}

//! Static files below a root: GET and HEAD, index files, directory redirects,
//! conditional requests (`If-None-Match`, `If-Modified-Since` → 304) and single byte
//! ranges (206 / 416).
//!
//! A request path is mapped to a file as nginx's `root` does (root + path), after
//! [`crate::http::path::normalize`] (called by the router, before the route is chosen)
//! has made sure it cannot climb out of the root; a symlink that points outside the
//! root is refused too.

use super::reply::{Outcome, Reply};
use super::representation;
pub use super::root::StaticRoute;
use super::root::{inside_root, open_regular, Refused};
use crate::file_cache::{CachedFile, FileCache};
use crate::http::path;
use crate::http::range::{self, RangeSet};
use crate::http::request::{Method, Request};
use crate::http::response::{self, Status};
use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// What a request path resolves to: `F` is the file, owned ([`CachedFile`], as a
/// file-pool thread makes it) or shared (`Rc<CachedFile>`, on the event loop).
#[derive(Clone)]
pub enum Resolved<F = Rc<CachedFile>> {
    File(F),
    /// A directory requested without its trailing slash: the normalised path.
    Redirect(Vec<u8>),
    /// Nothing is there (what `fallback` answers).
    Missing,
    /// Something is there but may not be served, or opening it failed.
    Status(Status),
}

impl Resolved<CachedFile> {
    /// The loop's form of what a file-pool thread found.
    pub fn shared(self) -> Resolved {
        match self {
            Resolved::File(f) => Resolved::File(Rc::new(f)),
            Resolved::Redirect(p) => Resolved::Redirect(p),
            Resolved::Missing => Resolved::Missing,
            Resolved::Status(s) => Resolved::Status(s),
        }
    }
}

/// What a file-pool job found for a route's path (see `file_pool`): handed to
/// [`serve`] in place of opening the file on the loop.
#[derive(Clone)]
pub struct Landed {
    /// The route (`StaticRoute::id`) and normalised path it is for.
    pub route: usize,
    pub path: Box<[u8]>,
    pub found: Resolved,
    /// The route's `fallback` resolved too, when `found` is `Missing`.
    pub fallback: Option<Resolved>,
}

impl Landed {
    fn for_path(&self, route: usize, path: &[u8]) -> bool {
        self.route == route && &*self.path == path
    }
}

/// GET and HEAD only.
pub fn allows(method: Method) -> bool {
    method != Method::Other
}

/// Serves `path`, the request's path as [`path::normalize`] made it (the router
/// normalises it once, before choosing the route). `landed`: what a file-pool job
/// found for it, used instead of opening the file here.
pub fn serve(
    route: &StaticRoute,
    req: &Request,
    path: &[u8],
    cache: &mut FileCache,
    now_secs: u64,
    reply: &mut Reply,
    landed: Option<&Landed>,
) -> Outcome {
    if !allows(req.method) {
        return reply.error(Status::METHOD_NOT_ALLOWED, &[("Allow", b"GET, HEAD")]);
    }
    let landed = landed.filter(|l| l.for_path(route.id, path));
    let file = match cache.get(route.id, path, now_secs) {
        Some(file) => file,
        None => {
            match landed.map_or_else(|| resolve_route(route, path, now_secs), |l| l.found.clone()) {
                Resolved::File(file) => {
                    cache.insert(route.id, path, file.clone());
                    file
                }
                Resolved::Redirect(path) => return redirect(&path, req.query, reply),
                Resolved::Missing => match route.fallback {
                    // Only a path with nothing behind it: a forbidden one stays 403.
                    Some(fallback) => match fallback_file(
                        route,
                        fallback,
                        cache,
                        now_secs,
                        landed.and_then(|l| l.fallback.clone()),
                    ) {
                        Ok(file) => file,
                        Err(status) => return reply.error(status, &[]),
                    },
                    None => return reply.error(Status::NOT_FOUND, &[]),
                },
                Resolved::Status(status) => return reply.error(status, &[]),
            }
        }
    };
    let vary = route.precompressed || route.compress.is_some();
    let file = if vary {
        representation::choose(route, req, path, file, cache, now_secs)
    } else {
        file
    };
    send(req, &file, route.max_ranges, vary, reply)
}

/// The fallback's file, cached under its own path (a miss is never cached, so any
/// number of missing paths cost no cache entries).
fn fallback_file(
    route: &StaticRoute,
    fallback: &str,
    cache: &mut FileCache,
    now_secs: u64,
    landed: Option<Resolved>,
) -> Result<Rc<CachedFile>, Status> {
    let path = fallback.as_bytes();
    if let Some(file) = cache.get(route.id, path, now_secs) {
        return Ok(file);
    }
    match landed.unwrap_or_else(|| resolve_route(route, path, now_secs)) {
        Resolved::File(file) => {
            cache.insert(route.id, path, file.clone());
            Ok(file)
        }
        Resolved::Missing | Resolved::Redirect(_) => Err(Status::NOT_FOUND),
        Resolved::Status(status) => Err(status),
    }
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

/// [`resolve`] on the event loop (no file pool, or a pool result that was not for
/// this configuration).
fn resolve_route(route: &StaticRoute, normalized: &[u8], now_secs: u64) -> Resolved {
    resolve(route.root, route.index, normalized, now_secs).shared()
}

/// What `normalized` below `root` is: the blocking part of serving a file (`open`,
/// `fstat`, the bytes of a small one, the index files of a directory), done by a
/// file-pool thread or, without one, on the event loop.
pub fn resolve(
    root: &Path,
    index: &[String],
    normalized: &[u8],
    now_secs: u64,
) -> Resolved<CachedFile> {
    let mut full = root.as_os_str().to_os_string().into_vec();
    full.extend_from_slice(normalized);
    let full = PathBuf::from(OsString::from_vec(full));
    if normalized.ends_with(b"/") {
        for name in index {
            match open_regular(&full.join(name), root, now_secs) {
                Ok(Some(file)) => return Resolved::File(file),
                Ok(None) | Err(Refused::Missing) => continue,
                Err(Refused::Status(status)) => return Resolved::Status(status),
            }
        }
        return if full.is_dir() && inside_root(&full, root) {
            Resolved::Status(Status::FORBIDDEN) // a directory without an index: no listings
        } else if full.exists() {
            Resolved::Status(Status::NOT_FOUND)
        } else {
            Resolved::Missing
        };
    }
    match open_regular(&full, root, now_secs) {
        Ok(Some(file)) => Resolved::File(file),
        Ok(None) if full.is_dir() && inside_root(&full, root) => {
            Resolved::Redirect(normalized.to_vec())
        }
        // A FIFO, a socket, a device: there, but not served.
        Ok(None) => Resolved::Status(Status::NOT_FOUND),
        Err(Refused::Missing) => Resolved::Missing,
        Err(Refused::Status(status)) => Resolved::Status(status),
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

fn range_spec(req: &Request, file: &CachedFile, max_ranges: usize) -> RangeSet {
    let Some(value) = req.range else {
        return RangeSet::Full;
    };
    if req.method != Method::Get {
        return RangeSet::Full;
    }
    if let Some(validator) = req.if_range {
        let validator = validator.trim_ascii();
        if validator != &file.etag[..] && validator != &file.last_modified[..] {
            return RangeSet::Full; // the client's copy is stale: send it all
        }
    }
    range::parse_set(value, file.size, max_ranges)
}

const VARY: &[u8] = b"Vary: Accept-Encoding\r\n";

fn send(
    req: &Request,
    file: &Rc<CachedFile>,
    max_ranges: usize,
    vary: bool,
    reply: &mut Reply,
) -> Outcome {
    let vary: &[u8] = if vary { VARY } else { b"" };
    let date = reply.date;
    if not_modified(req, file) {
        let out = reply.out.bytes();
        response::start(out, Status::NOT_MODIFIED, date);
        response::header(out, "Last-Modified", &file.last_modified);
        response::header(out, "ETag", &file.etag);
        out.extend_from_slice(vary);
        response::finish_with(out, reply.site.headers, reply.persistence);
        return Outcome {
            status: Status::NOT_MODIFIED,
            body_bytes: 0,
            logged: true,
        };
    }
    let (status, start, len) = match range_spec(req, file, max_ranges) {
        RangeSet::Full => (Status::OK, 0, file.size),
        RangeSet::Parts(parts) if parts.len() == 1 => {
            let (start, end) = parts[0];
            (Status::PARTIAL_CONTENT, start, end - start + 1)
        }
        RangeSet::Parts(parts) => return send_multipart(file, &parts, vary, reply),
        RangeSet::Unsatisfiable => {
            let mut content_range = b"bytes */".to_vec();
            response::push_decimal(&mut content_range, file.size);
            // The size is the chosen representation's: the 416 varies as the 200 does.
            let content_range = ("Content-Range", &content_range[..]);
            let extra: &[(&str, &[u8])] = if vary.is_empty() {
                &[content_range]
            } else {
                &[content_range, ("Vary", b"Accept-Encoding")]
            };
            return reply.error(Status::RANGE_NOT_SATISFIABLE, extra);
        }
    };
    let out = reply.out.bytes();
    response::start(out, status, date);
    out.extend_from_slice(&file.headers);
    out.extend_from_slice(vary);
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
    response::finish_with(out, reply.site.headers, reply.persistence);
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

/// A `multipart/byteranges` response (RFC 9110 §14.6) of `parts` (sorted, disjoint:
/// see [`range::parse_set`]), each with its own `Content-Type` and `Content-Range`.
fn send_multipart(
    file: &Rc<CachedFile>,
    parts: &[(u64, u64)],
    vary: &[u8],
    reply: &mut Reply,
) -> Outcome {
    let boundary = boundary(file);
    let mut part_type = file.content_type.as_bytes().to_vec();
    if file.content_type.starts_with("text/") {
        part_type.extend_from_slice(b"; charset=utf-8");
    }
    let part_head = |out: &mut Vec<u8>, start: u64, end: u64| {
        out.extend_from_slice(b"\r\n--");
        out.extend_from_slice(&boundary);
        out.extend_from_slice(b"\r\nContent-Type: ");
        out.extend_from_slice(&part_type);
        out.extend_from_slice(b"\r\nContent-Range: bytes ");
        response::push_decimal(out, start);
        out.push(b'-');
        response::push_decimal(out, end);
        out.push(b'/');
        response::push_decimal(out, file.size);
        out.extend_from_slice(b"\r\n\r\n");
    };
    let closing_len = 2 + 2 + boundary.len() + 4; // CRLF -- boundary -- CRLF
    let mut scratch = Vec::with_capacity(128);
    let mut length = closing_len as u64;
    for &(start, end) in parts {
        scratch.clear();
        part_head(&mut scratch, start, end);
        length += scratch.len() as u64 + (end - start + 1);
    }
    let status = Status::PARTIAL_CONTENT;
    let out = reply.out.bytes();
    response::start(out, status, reply.date);
    out.extend_from_slice(b"Content-Type: multipart/byteranges; boundary=");
    out.extend_from_slice(&boundary);
    out.extend_from_slice(b"\r\n");
    response::header(out, "Last-Modified", &file.last_modified);
    response::header(out, "ETag", &file.etag);
    out.extend_from_slice(b"Accept-Ranges: bytes\r\n");
    if file.headers.windows(18).any(|w| w == b"Content-Encoding: ") {
        // The parts are ranges of the encoded representation.
        let at = file
            .headers
            .windows(18)
            .position(|w| w == b"Content-Encoding: ")
            .unwrap_or(0);
        let end = file.headers[at..]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(file.headers.len(), |e| at + e + 1);
        out.extend_from_slice(&file.headers[at..end]);
    }
    out.extend_from_slice(vary);
    response::content_length(out, length);
    response::finish_with(out, reply.site.headers, reply.persistence);
    if reply.head_only {
        return Outcome {
            status,
            body_bytes: 0,
            logged: true,
        };
    }
    for &(start, end) in parts {
        part_head(reply.out.bytes(), start, end);
        match &file.body {
            Some(bytes) => reply
                .out
                .bytes()
                .extend_from_slice(&bytes[start as usize..=end as usize]),
            None => reply.out.push_file(file.clone(), start, end - start + 1),
        }
    }
    let out = reply.out.bytes();
    out.extend_from_slice(b"\r\n--");
    out.extend_from_slice(&boundary);
    out.extend_from_slice(b"--\r\n");
    Outcome {
        status,
        body_bytes: length,
        logged: true,
    }
}

/// A boundary that is not in the parts: 20 hex digits from the file's validator and a
/// per-worker counter, checked against the bytes of a file held in memory.
fn boundary(file: &CachedFile) -> Vec<u8> {
    use std::cell::Cell;
    thread_local!(static COUNTER: Cell<u64> = const { Cell::new(0) });
    loop {
        let n = COUNTER.with(|c| {
            c.set(c.get().wrapping_add(1));
            c.get()
        });
        let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        for &b in file.etag.iter() {
            h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
        let text = format!("{:016x}{:04x}", h, n & 0xffff).into_bytes();
        let clash = file
            .body
            .as_deref()
            .is_some_and(|body| body.windows(text.len()).any(|w| w == text));
        if !clash {
            return text;
        }
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

//! Which representation of a static file to send: the file, a precompressed `X.br`
//! / `X.gz` beside it (`precompressed`), or a gzip body made on the fly once and kept
//! in the worker's cache (`compress`), by the client's `Accept-Encoding`. Ranges and
//! conditionals then apply to the representation chosen (each has its own ETag).

use super::root::{open_regular, StaticRoute};
use crate::file_cache::{CachedFile, FileCache};
use crate::http::accept_encoding::{self, Coding};
use crate::http::request::Request;
use std::io;
use std::path::Path;
use std::rc::Rc;

/// Files above this are not compressed on the fly (they are read whole to be).
const COMPRESS_MAX: u64 = 1 << 20;

/// The representation of `file` to send: a precompressed sibling, a gzip body made
/// (once, then cached) on the fly, or the file itself, by the client's
/// `Accept-Encoding`. When the client accepts none of them, the file itself (as nginx).
pub(super) fn choose(
    route: &StaticRoute,
    req: &Request,
    path: &[u8],
    file: Rc<CachedFile>,
    cache: &mut FileCache,
    now_secs: u64,
) -> Rc<CachedFile> {
    let header = req.accept_encoding;
    if accept_encoding::choose(header, &[Coding::Br, Coding::Gzip]).is_none() {
        return file; // no coding wanted: no sibling looked for
    }
    let br = route
        .precompressed
        .then(|| sibling(route, path, &file, "br", cache, now_secs))
        .flatten();
    let gz = route
        .precompressed
        .then(|| sibling(route, path, &file, "gzip", cache, now_secs))
        .flatten();
    let can_compress = route.compress.is_some_and(|c| {
        file.size >= c.min_size && file.size <= COMPRESS_MAX && compressible(file.content_type)
    });
    let mut available = Vec::with_capacity(3);
    if br.is_some() {
        available.push(Coding::Br);
    }
    if gz.is_some() || can_compress {
        available.push(Coding::Gzip);
    }
    available.push(Coding::Identity);
    match accept_encoding::choose(header, &available) {
        Some(Coding::Br) => br.unwrap_or(file),
        Some(Coding::Gzip) => match gz {
            Some(gz) => gz,
            None => compressed(route, path, &file, cache).unwrap_or(file),
        },
        _ => file,
    }
}

/// `X.br` or `X.gz` beside the file `X`, as a representation of it; looked for at
/// most once a second when it is not there.
fn sibling(
    route: &StaticRoute,
    path: &[u8],
    file: &CachedFile,
    encoding: &str,
    cache: &mut FileCache,
    now_secs: u64,
) -> Option<Rc<CachedFile>> {
    let suffix = if encoding == "br" { ".br" } else { ".gz" };
    // NUL cannot be in a request path: these keys never meet a request's own.
    let mut key = vec![0u8];
    key.extend_from_slice(suffix.as_bytes());
    key.extend_from_slice(path);
    if let Some(found) = cache.get(route.id, &key, now_secs) {
        return Some(found);
    }
    if cache.known_missing(route.id, &key, now_secs) {
        return None;
    }
    let mut name = file.path.clone().into_os_string();
    name.push(suffix);
    match open_regular(Path::new(&name), route.root, now_secs) {
        Ok(Some(found)) => {
            let found = Rc::new(found.as_encoding(file.content_type, encoding));
            cache.insert(route.id, &key, found.clone());
            Some(found)
        }
        _ => {
            cache.note_missing(route.id, &key, now_secs);
            None
        }
    }
}

/// The gzip body of `file`, from the cache or compressed now and kept.
fn compressed(
    route: &StaticRoute,
    path: &[u8],
    file: &CachedFile,
    cache: &mut FileCache,
) -> Option<Rc<CachedFile>> {
    if let Some(found) = cache.compressed(route.id, path, file) {
        return Some(found);
    }
    let level = route.compress?.level;
    let read;
    let bytes: &[u8] = match &file.body {
        Some(body) => body,
        None => {
            use std::os::unix::fs::FileExt;
            let mut buf = vec![0; file.size as usize];
            file.file.read_exact_at(&mut buf, 0).ok()?;
            read = buf;
            &read
        }
    };
    let mut gz = flate2::write::GzEncoder::new(
        Vec::with_capacity(bytes.len() / 3 + 64),
        flate2::Compression::new(level),
    );
    io::Write::write_all(&mut gz, bytes).ok()?;
    let body = gz.finish().ok()?;
    // The level is in the ETag: a strong validator names exact bytes, and another
    // level (after a reload) writes other bytes for the same file.
    let tag = format!("gzip{level}");
    let made = Rc::new(CachedFile::encoded(file, body, "gzip", &tag).ok()?);
    cache.insert_compressed(route.id, path, file, made.clone(), route.compress_cache);
    Some(made)
}

/// Types worth compressing: text, and the text formats under other top types.
fn compressible(content_type: &str) -> bool {
    content_type.starts_with("text/")
        || matches!(
            content_type,
            "application/javascript"
                | "application/json"
                | "application/xml"
                | "application/manifest+json"
                | "image/svg+xml"
        )
}

//! Request paths: percent-decoding and normalisation that can never leave the root.
//!
//! The decoded path is resolved segment by segment: `.` is dropped, `..` removes the
//! previous segment, and a `..` with nothing left to remove is an error rather than
//! being clamped, because it can only come from a client probing for files outside the
//! root. Encoded slashes and NUL bytes are refused outright: a static server has no
//! legitimate use for them and they are classic ways to confuse path handling.

use std::borrow::Cow;

/// Why a request path was refused. Each maps to 400 Bad Request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathError {
    /// `%` not followed by two hex digits, or a path not starting with `/`.
    Malformed,
    /// `%00` or a raw NUL byte.
    Nul,
    /// `%2F`: an encoded slash.
    EncodedSlash,
    /// More `..` segments than there are segments to remove.
    Escapes,
}

/// Decodes and normalises `raw` (the path part of the target, without the query).
/// The result starts with `/`, has no empty, `.` or `..` segments, and keeps a
/// trailing slash when the request had one.
pub fn normalize(raw: &[u8]) -> Result<Vec<u8>, PathError> {
    if raw.first() != Some(&b'/') {
        return Err(PathError::Malformed);
    }
    let decoded = percent_decode(raw)?;
    // An escape never decodes to `/` (refused above): the decoded path splits where
    // the raw one does.
    resolve(
        decoded
            .split(|&b| b == b'/')
            .skip(1)
            .map(|s| Ok((Cow::Borrowed(s), s))),
        decoded.len(),
    )
}

/// [`normalize`] keeping the client's spelling: the same segments in the same
/// order, each as the client encoded it (`%41` stays `%41`, `%3F` stays `%3F`), so
/// `percent_decode(normalize_encoded(raw)) == normalize(raw)`. What a proxy sends
/// upstream when it rewrites the path: the application decodes it as the client
/// meant, and no `..` or `%2e%2e` reaches it. Refuses what [`normalize`] refuses.
pub fn normalize_encoded(raw: &[u8]) -> Result<Vec<u8>, PathError> {
    if raw.first() != Some(&b'/') {
        return Err(PathError::Malformed);
    }
    resolve(
        raw.split(|&b| b == b'/')
            .skip(1)
            .map(|segment| Ok((Cow::Owned(percent_decode(segment)?), segment))),
        raw.len(),
    )
}

/// Resolves a path's segments (each as decoded, which says what it is, and as it is
/// written out) into a path that starts with `/`, has no empty, `.` or `..`
/// segments, and keeps a trailing slash; a `..` with nothing left to remove is
/// [`PathError::Escapes`].
fn resolve<'s>(
    segments: impl Iterator<Item = Result<(Cow<'s, [u8]>, &'s [u8]), PathError>>,
    capacity: usize,
) -> Result<Vec<u8>, PathError> {
    let mut out: Vec<u8> = Vec::with_capacity(capacity);
    let mut trailing_slash = false;
    for segment in segments {
        let (decoded, written) = segment?;
        trailing_slash = false;
        match decoded.as_ref() {
            b"" | b"." => trailing_slash = true,
            b".." => {
                let cut = out
                    .iter()
                    .rposition(|&b| b == b'/')
                    .ok_or(PathError::Escapes)?;
                out.truncate(cut);
                trailing_slash = true;
            }
            _ => {
                out.push(b'/');
                out.extend_from_slice(written);
            }
        }
    }
    if out.is_empty() || trailing_slash {
        out.push(b'/');
    }
    Ok(out)
}

/// What of `encoded` (a path from [`normalize_encoded`]) follows its first `decoded`
/// decoded bytes: the part after a route's prefix, which was matched on the decoded
/// path. An escape counts as the one byte it decodes to.
pub fn after_decoded(encoded: &[u8], decoded: usize) -> &[u8] {
    let mut at = 0;
    for _ in 0..decoded {
        if at >= encoded.len() {
            break;
        }
        at += if encoded[at] == b'%' { 3 } else { 1 };
    }
    &encoded[at.min(encoded.len())..]
}

/// Percent-encodes a decoded path for a header such as `Location`: everything but
/// unreserved characters, `/` and the sub-delimiters RFC 3986 allows in a path.
pub fn encode(path: &[u8], out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in path {
        let keep = b.is_ascii_alphanumeric() || b"/-._~!$&'()*+,;=:@".contains(&b);
        if keep {
            out.push(b);
        } else {
            out.extend_from_slice(&[b'%', HEX[(b >> 4) as usize], HEX[(b & 15) as usize]]);
        }
    }
}

fn percent_decode(raw: &[u8]) -> Result<Vec<u8>, PathError> {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let b = raw[i];
        if b == 0 {
            // Not from a request line (httparse refuses it), but nothing here may
            // hand a NUL to the file system, however it is spelled.
            return Err(PathError::Nul);
        }
        if b != b'%' {
            out.push(b);
            i += 1;
            continue;
        }
        let (hi, lo) = match (raw.get(i + 1), raw.get(i + 2)) {
            (Some(&h), Some(&l)) => (hex(h), hex(l)),
            _ => return Err(PathError::Malformed),
        };
        let (Some(hi), Some(lo)) = (hi, lo) else {
            return Err(PathError::Malformed);
        };
        match hi << 4 | lo {
            0 => return Err(PathError::Nul),
            b'/' => return Err(PathError::EncodedSlash),
            v => out.push(v),
        }
        i += 3;
    }
    Ok(out)
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(s: &str) -> Result<String, PathError> {
        normalize(s.as_bytes()).map(|v| String::from_utf8(v).unwrap())
    }

    #[test]
    fn plain_paths_are_kept() {
        assert_eq!(norm("/"), Ok("/".into()));
        assert_eq!(norm("/index.html"), Ok("/index.html".into()));
        assert_eq!(norm("/a/b/"), Ok("/a/b/".into()));
        assert_eq!(norm("/a%20b.txt"), Ok("/a b.txt".into()));
    }

    #[test]
    fn dots_and_empty_segments_resolve() {
        assert_eq!(norm("//a///b"), Ok("/a/b".into()));
        assert_eq!(norm("/a/./b"), Ok("/a/b".into()));
        assert_eq!(norm("/a/b/../c"), Ok("/a/c".into()));
        assert_eq!(norm("/a/.."), Ok("/".into()));
        assert_eq!(norm("/a/b/.."), Ok("/a/".into()));
        assert_eq!(norm("/a/%2e%2e/b"), Ok("/b".into()));
    }

    #[test]
    fn escaping_the_root_is_refused() {
        assert_eq!(norm("/.."), Err(PathError::Escapes));
        assert_eq!(norm("/../etc/passwd"), Err(PathError::Escapes));
        assert_eq!(norm("/a/../../etc/passwd"), Err(PathError::Escapes));
        assert_eq!(norm("/%2e%2e/etc/passwd"), Err(PathError::Escapes));
        assert_eq!(norm("/%2E%2E/%2E%2E/x"), Err(PathError::Escapes));
    }

    #[test]
    fn encoding_round_trips_through_normalize() {
        let mut out = Vec::new();
        encode(b"/a b/%x/\xc3\xa9?#", &mut out);
        assert_eq!(out, b"/a%20b/%25x/%C3%A9%3F%23");
        assert_eq!(normalize(&out).unwrap(), b"/a b/%x/\xc3\xa9?#");
    }

    #[test]
    fn normalize_encoded_keeps_the_clients_escapes_and_resolves_like_normalize() {
        for (raw, want) in [
            ("/api/x", "/api/x"),
            ("/%61pi/a%20b/%3F", "/%61pi/a%20b/%3F"),
            ("//api///x/", "/api/x/"),
            ("/api/a/../b/./c", "/api/b/c"),
            ("/api/a/%2e%2e/b", "/api/b"),
            ("/a/..", "/"),
            ("/", "/"),
        ] {
            let got = normalize_encoded(raw.as_bytes()).unwrap();
            assert_eq!(String::from_utf8_lossy(&got), want, "{raw}");
            assert_eq!(
                percent_decode(&got).unwrap(),
                normalize(raw.as_bytes()).unwrap(),
                "{raw}"
            );
        }
        for raw in ["/..", "/a/%2F", "/a%00", "/a%zz", "a"] {
            assert_eq!(
                normalize_encoded(raw.as_bytes()),
                normalize(raw.as_bytes()),
                "{raw}"
            );
        }
    }

    #[test]
    fn after_decoded_counts_an_escape_as_one_byte() {
        assert_eq!(after_decoded(b"/api/x%20y", 5), b"x%20y");
        assert_eq!(after_decoded(b"/%61pi/x", 5), b"x");
        assert_eq!(after_decoded(b"/api", 4), b"");
        assert_eq!(after_decoded(b"/api/x", 4), b"/x");
        assert_eq!(after_decoded(b"/a", 9), b"");
    }

    #[test]
    fn encoded_slash_nul_and_bad_escapes_are_refused() {
        assert_eq!(norm("/..%2fetc/passwd"), Err(PathError::EncodedSlash));
        assert_eq!(norm("/a%2Fb"), Err(PathError::EncodedSlash));
        assert_eq!(norm("/a%00.html"), Err(PathError::Nul));
        // Found by fuzz_parsers::path: a raw NUL passed through.
        assert_eq!(norm("/a\0.html"), Err(PathError::Nul));
        assert_eq!(norm("/a%zz"), Err(PathError::Malformed));
        assert_eq!(norm("/a%2"), Err(PathError::Malformed));
        assert_eq!(norm("a"), Err(PathError::Malformed));
    }
}

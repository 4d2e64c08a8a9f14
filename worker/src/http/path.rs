//! Request paths: percent-decoding and normalisation that can never leave the root.
//!
//! The decoded path is resolved segment by segment: `.` is dropped, `..` removes the
//! previous segment, and a `..` with nothing left to remove is an error rather than
//! being clamped, because it can only come from a client probing for files outside the
//! root. Encoded slashes and NUL bytes are refused outright: a static server has no
//! legitimate use for them and they are classic ways to confuse path handling.

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
    let mut out: Vec<u8> = Vec::with_capacity(decoded.len());
    let mut trailing_slash = false;
    for segment in decoded.split(|&b| b == b'/').skip(1) {
        trailing_slash = false;
        match segment {
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
                out.extend_from_slice(segment);
            }
        }
    }
    if out.is_empty() || trailing_slash {
        out.push(b'/');
    }
    Ok(out)
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

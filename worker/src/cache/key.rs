//! A request's cache key, from its route's template (`{scheme}{host}{uri}`), and the
//! header fields of a head as `(name, value)` pairs for the policy.

use forkd_shared::config::cache::{KeyPart, KeyTemplate};

/// What a key is made of, from the request.
pub struct KeyInput<'a> {
    pub tls: bool,
    /// The host the request named, without its port.
    pub host: Option<&'a [u8]>,
    /// The server's first name, for a request that named none.
    pub fallback_host: &'a [u8],
    /// The normalised path routing used.
    pub path: &'a [u8],
    pub query: Option<&'a [u8]>,
}

pub fn expand(t: &KeyTemplate, r: &KeyInput) -> Vec<u8> {
    let mut k = Vec::with_capacity(64 + r.path.len());
    for part in &t.0 {
        match part {
            KeyPart::Literal(s) => k.extend_from_slice(s.as_bytes()),
            KeyPart::Scheme => k.extend_from_slice(if r.tls { b"https" } else { b"http" }),
            KeyPart::Host => {
                let h = r.host.unwrap_or(r.fallback_host);
                k.extend(h.iter().map(u8::to_ascii_lowercase));
            }
            KeyPart::Uri => {
                k.extend_from_slice(r.path);
                if let Some(q) = r.query {
                    k.push(b'?');
                    k.extend_from_slice(q);
                }
            }
            KeyPart::Path => k.extend_from_slice(r.path),
            KeyPart::Query => k.extend_from_slice(r.query.unwrap_or_default()),
        }
    }
    k
}

/// The header fields of `head` (a request or a response head, parsed once already),
/// in order.
pub fn fields(head: &[u8]) -> Vec<(&[u8], &[u8])> {
    let mut slots = [httparse::EMPTY_HEADER; 128];
    // The line before the fields is a request or a status line: skip it by hand so
    // one parse serves both.
    let Some(line_end) = head.windows(2).position(|w| w == b"\r\n") else {
        return Vec::new();
    };
    let rest = &head[line_end + 2..];
    match httparse::parse_headers(rest, &mut slots) {
        Ok(httparse::Status::Complete((_, parsed))) => parsed
            .iter()
            .map(|h| (h.name.as_bytes(), h.value))
            .collect(),
        _ => Vec::new(),
    }
}

/// The fields of a stored head (`Name: value\r\n` lines, as `cache::fill` writes
/// them: no start line, no final empty line).
pub fn stored_fields(lines: &[u8]) -> Vec<(&[u8], &[u8])> {
    lines
        .split(|&b| b == b'\n')
        .filter_map(|line| {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let colon = line.iter().position(|&b| b == b':')?;
            let value = &line[colon + 1..];
            let start = value
                .iter()
                .position(|b| !b.is_ascii_whitespace())
                .unwrap_or(value.len());
            Some((&line[..colon], &value[start..]))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_key_is_scheme_host_and_uri() {
        let t = KeyTemplate::parse("{scheme}{host}{uri}").unwrap();
        let r = KeyInput {
            tls: false,
            host: Some(b"Example.COM"),
            fallback_host: b"localhost",
            path: b"/a b",
            query: Some(b"x=1"),
        };
        assert_eq!(expand(&t, &r), b"httpexample.com/a b?x=1");
        let r = KeyInput {
            tls: true,
            host: None,
            query: None,
            ..r
        };
        assert_eq!(expand(&t, &r), b"httpslocalhost/a b");
        let t = KeyTemplate::parse("{path}|{query}").unwrap();
        assert_eq!(expand(&t, &r), b"/a b|");
    }

    #[test]
    fn fields_of_a_head_keep_their_order_and_repeats() {
        let h = b"GET / HTTP/1.1\r\nHost: a\r\nVary: x\r\nvary: y\r\n\r\n";
        let f = fields(h);
        assert_eq!(f.len(), 3);
        assert_eq!(f[2], (&b"vary"[..], &b"y"[..]));
        let r = b"HTTP/1.1 200 OK\r\nETag: \"1\"\r\n\r\n";
        assert_eq!(fields(r), vec![(&b"ETag"[..], &b"\"1\""[..])]);
        assert!(fields(b"garbage").is_empty());
        let stored = stored_fields(b"ETag: \"1\"\r\nX-A:b\r\n");
        assert_eq!(
            stored,
            vec![(&b"ETag"[..], &b"\"1\""[..]), (&b"X-A"[..], &b"b"[..])]
        );
    }
}

//! `Redirect(to, status)`: a `Location` built from the configured target with its
//! placeholders expanded from the normalised request.
//!
//! The target can never be turned into a redirect to another host by the request:
//! expansions are percent-encoded (no `\`, `#`, space or CR/LF gets through), a local
//! target's leading slashes are collapsed to one (so `//evil` cannot appear), and the
//! host of the expanded URL is compared with the configured one before it is sent.

use super::reply::{Outcome, Reply};
use crate::http::path;
use crate::http::request::Request;
use crate::http::response::Status;
use forkd_shared::config::site::{Part, RedirectTarget, TargetHost};

/// What a redirect is answered from.
pub struct Redirect<'a> {
    pub to: &'a RedirectTarget,
    pub status: u16,
    /// The route's prefix, which `{path}` leaves out.
    pub prefix: &'a str,
}

pub fn serve(redirect: &Redirect, req: &Request, path: &[u8], reply: &mut Reply) -> Outcome {
    match location(redirect, req.host, path, req.query) {
        Ok(location) => reply.error(Status(redirect.status), &[("Location", &location)]),
        Err(status) => reply.error(status, &[]),
    }
}

/// The expanded target, or the error status to answer instead.
pub fn location(
    redirect: &Redirect,
    host: Option<&[u8]>,
    path: &[u8],
    query: Option<&[u8]>,
) -> Result<Vec<u8>, Status> {
    let to = redirect.to;
    let mut out = Vec::with_capacity(to.text.len() + path.len());
    let mut request_host = None;
    for part in &to.parts {
        match part {
            Part::Literal(text) => out.extend_from_slice(text.as_bytes()),
            Part::Host => {
                let host = host.filter(|h| is_host(h)).ok_or(Status::BAD_REQUEST)?;
                request_host = Some(host);
                out.extend_from_slice(host);
            }
            Part::Uri => path::encode(path, &mut out),
            Part::Path => {
                let rest = path.strip_prefix(redirect.prefix.as_bytes()).unwrap_or(b"");
                path::encode(rest, &mut out);
            }
            Part::Query => encode_query(query.unwrap_or(b""), &mut out),
        }
    }
    let expected: Option<Vec<u8>> = match &to.host {
        TargetHost::Local => {
            let slashes = out.iter().take_while(|&&b| b == b'/' || b == b'\\').count();
            if slashes > 1 {
                out.drain(1..slashes);
            }
            None
        }
        TargetHost::Fixed(host) => Some(host.as_bytes().to_vec()),
        TargetHost::Request => Some(request_host.unwrap_or(b"").to_ascii_lowercase()),
    };
    if authority(&out).map(|a| a.to_ascii_lowercase()) != expected {
        forkd_shared::error!(
            "redirect target `{}` expanded to a URL with another host: refused",
            to.text
        );
        return Err(Status::INTERNAL_SERVER_ERROR);
    }
    Ok(out)
}

/// The host part of a URL (`scheme://host/...` or `//host/...`); None for a path.
fn authority(url: &[u8]) -> Option<&[u8]> {
    let rest = match url.windows(3).position(|w| w == b"://") {
        Some(i)
            if url[..i]
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(b)) =>
        {
            &url[i + 3..]
        }
        _ => url.strip_prefix(b"//")?,
    };
    let end = rest
        .iter()
        .position(|b| b"/?#\\".contains(b))
        .unwrap_or(rest.len());
    Some(&rest[..end])
}

/// A host as the request parser lets it through, with nothing that could end the
/// authority early (`/`, `@`, `\`, `?`, `#`).
fn is_host(host: &[u8]) -> bool {
    !host.is_empty()
        && host
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b"-._~[]:".contains(&b))
}

/// Copies a query, percent-encoding what may not appear in one (keeping `%`, so an
/// escape already there stays as the client wrote it).
fn encode_query(query: &[u8], out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in query {
        if b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/?%".contains(&b) {
            out.push(b);
        } else {
            out.extend_from_slice(&[b'%', HEX[(b >> 4) as usize], HEX[(b & 15) as usize]]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand(to: &str, prefix: &str, path: &str, query: Option<&str>) -> Result<String, Status> {
        let to = RedirectTarget::parse(to).unwrap();
        let r = Redirect {
            to: &to,
            status: 301,
            prefix,
        };
        location(
            &r,
            Some(b"example.org"),
            path.as_bytes(),
            query.map(str::as_bytes),
        )
        .map(|v| String::from_utf8(v).unwrap())
    }

    #[test]
    fn placeholders_expand_from_the_normalised_request() {
        assert_eq!(
            expand("/new/{path}", "/old/", "/old/a/b c", Some("x=1")).unwrap(),
            "/new/a/b%20c"
        );
        assert_eq!(
            expand("/new{uri}?{query}", "/", "/p", Some("a=1&b=%41")).unwrap(),
            "/new/p?a=1&b=%41"
        );
        assert_eq!(
            expand("https://{host}{uri}", "/", "/p", None).unwrap(),
            "https://example.org/p"
        );
        assert_eq!(
            expand("https://example.com/{query}", "/", "/", Some("#\\\"<")).unwrap(),
            "https://example.com/%23%5C%22%3C"
        );
    }

    #[test]
    fn a_local_target_never_becomes_protocol_relative() {
        // Prefix `/old` (no slash): `{path}` of `/old//evil.example` normalised is
        // `/evil.example`, and `/{path}` would be `//evil.example`.
        assert_eq!(
            expand("/{path}", "/old", "/old/evil.example/x", None).unwrap(),
            "/evil.example/x"
        );
    }

    #[test]
    fn a_bad_host_is_refused() {
        let to = RedirectTarget::parse("https://{host}/").unwrap();
        let r = Redirect {
            to: &to,
            status: 301,
            prefix: "/",
        };
        for host in [&b"evil.com/x"[..], b"a@b", b""] {
            assert_eq!(
                location(&r, Some(host), b"/", None),
                Err(Status::BAD_REQUEST)
            );
        }
        assert_eq!(location(&r, None, b"/", None), Err(Status::BAD_REQUEST));
    }
}

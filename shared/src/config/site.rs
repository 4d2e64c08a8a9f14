//! Site options checked while deserializing, so that a bad value is reported at the
//! line and column it was written: redirect targets and statuses, `Return` statuses,
//! response header fields, CIDR blocks for `allow`/`deny`, error-page statuses.
//!
//! What they mean at run time is the worker's business (handlers::redirect, ret,
//! access); this module owns only their validated shape.

use serde::de::{self, Deserializer};
use serde::Deserialize;
use std::net::IpAddr;

/// One part of a redirect target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    Literal(String),
    /// `{host}`: the request's `Host` (validated as a host name).
    Host,
    /// `{uri}`: the normalised request path.
    Uri,
    /// `{path}`: the normalised path after the route's prefix.
    Path,
    /// `{query}`: the query string, without `?` (empty if none).
    Query,
}

/// Where a redirect target points, which decides what its expansion may become.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetHost {
    /// A path on this server (`/new/{path}`): the expansion can never start with `//`.
    Local,
    /// A host written in the configuration (`https://example.com/...`, `//cdn/...`):
    /// the authority is literal and no placeholder is next to it.
    Fixed(String),
    /// `scheme://{host}/...`: the request's own host, validated.
    Request,
}

/// A redirect target: `to` split into literals and placeholders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedirectTarget {
    pub text: String,
    pub parts: Vec<Part>,
    pub host: TargetHost,
}

impl RedirectTarget {
    pub fn parse(text: &str) -> Result<RedirectTarget, String> {
        if text.bytes().any(|b| b <= b' ' || b == 0x7f) {
            return Err(format!(
                "redirect target `{}` has a space or control character",
                text.escape_debug()
            ));
        }
        let mut parts = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                parts.push(Part::Literal(rest[..open].into()));
            }
            let close = rest[open..]
                .find('}')
                .ok_or_else(|| format!("redirect target `{text}`: `{{` without `}}`"))?;
            let part = match &rest[open + 1..open + close] {
                "host" => Part::Host,
                "uri" => Part::Uri,
                "path" => Part::Path,
                "query" => Part::Query,
                other => {
                    return Err(format!(
                        "redirect target `{text}`: unknown placeholder `{{{other}}}` (known: {{host}} {{uri}} {{path}} {{query}})"
                    ))
                }
            };
            parts.push(part);
            rest = &rest[open + close + 1..];
        }
        if !rest.is_empty() {
            parts.push(Part::Literal(rest.into()));
        }
        if text.contains('}')
            && parts
                .iter()
                .any(|p| matches!(p, Part::Literal(l) if l.contains('}')))
        {
            return Err(format!("redirect target `{text}`: `}}` without `{{`"));
        }
        let host = target_host(text)?;
        Ok(RedirectTarget {
            text: text.into(),
            parts,
            host,
        })
    }
}

/// Classifies `to` and refuses a target whose host a placeholder could change.
fn target_host(text: &str) -> Result<TargetHost, String> {
    let after_scheme = match text.find("://") {
        Some(i)
            if i > 0
                && text[..i]
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b)) =>
        {
            Some(&text[i + 3..])
        }
        _ => text.strip_prefix("//"),
    };
    let Some(rest) = after_scheme else {
        if !text.starts_with('/') {
            return Err(format!(
                "redirect target `{text}` must be a path (`/...`) or an absolute URL (`https://host/...`)"
            ));
        }
        if text.starts_with("/\\") {
            return Err(format!("redirect target `{text}` starts with `/\\`"));
        }
        return Ok(TargetHost::Local);
    };
    // `{uri}` always starts with `/`, so it ends the host like a literal `/`.
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let end = rest.find("{uri}").filter(|&u| u < end).unwrap_or(end);
    let authority = &rest[..end];
    if rest[end..].is_empty() && rest.contains('{') && authority != "{host}" {
        return Err(format!(
            "redirect target `{text}`: a placeholder right after the host could change the host; put `/` after it"
        ));
    }
    if authority == "{host}" {
        return Ok(TargetHost::Request);
    }
    if authority.is_empty() || authority.contains(['{', '}', '@', '\\']) {
        return Err(format!(
            "redirect target `{text}`: the host must be written out (or be exactly {{host}}), without placeholders or user info"
        ));
    }
    Ok(TargetHost::Fixed(authority.to_ascii_lowercase()))
}

impl<'de> Deserialize<'de> for RedirectTarget {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        RedirectTarget::parse(&text).map_err(de::Error::custom)
    }
}

/// A status a `Redirect` may answer with: 301, 302, 303, 307 or 308.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedirectStatus(pub u16);

impl<'de> Deserialize<'de> for RedirectStatus {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let code = u16::deserialize(deserializer)?;
        match code {
            301 | 302 | 303 | 307 | 308 => Ok(RedirectStatus(code)),
            _ => Err(de::Error::custom(format!(
                "redirect status {code} is not one of 301, 302, 303, 307, 308"
            ))),
        }
    }
}

/// A status a `Return` may answer with: 200..=599.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReturnStatus(pub u16);

impl<'de> Deserialize<'de> for ReturnStatus {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let code = u16::deserialize(deserializer)?;
        if (200..=599).contains(&code) {
            Ok(ReturnStatus(code))
        } else {
            Err(de::Error::custom(format!(
                "status {code} is out of range 200..=599"
            )))
        }
    }
}

/// An error-page status: 400..=599.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ErrorStatus(pub u16);

impl<'de> Deserialize<'de> for ErrorStatus {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let code = u16::deserialize(deserializer)?;
        if (400..=599).contains(&code) {
            Ok(ErrorStatus(code))
        } else {
            Err(de::Error::custom(format!(
                "error page status {code} is out of range 400..=599"
            )))
        }
    }
}

/// A response header field: a token name, a value without CR, LF or NUL. An empty
/// value (in a route) removes the server's field of that name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderField {
    pub name: String,
    pub value: String,
}

/// Fields forkd writes itself: adding them would send them twice.
const OWN_FIELDS: &[&str] = &[
    "content-length",
    "transfer-encoding",
    "connection",
    "date",
    "server",
    "content-range",
];

impl<'de> Deserialize<'de> for HeaderField {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let (name, value) = <(String, String)>::deserialize(deserializer)?;
        let tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
        if name.is_empty() || !name.bytes().all(tchar) {
            return Err(de::Error::custom(format!(
                "header name `{}` is not a token (letters, digits, !#$%&'*+-.^_`|~)",
                name.escape_debug()
            )));
        }
        if OWN_FIELDS.contains(&name.to_ascii_lowercase().as_str()) {
            return Err(de::Error::custom(format!(
                "header `{name}` is written by forkd itself and cannot be added"
            )));
        }
        if value.bytes().any(|b| (b < b' ' && b != b'\t') || b == 0x7f)
            || value.starts_with([' ', '\t'])
            || value.ends_with([' ', '\t'])
        {
            return Err(de::Error::custom(format!(
                "header `{name}`: value `{}` has a control character (CR, LF, NUL) or surrounding blanks",
                value.escape_debug()
            )));
        }
        Ok(HeaderField { name, value })
    }
}

pub use super::cidr::Cidr;

/// Who may use a route. `deny` is checked first, then `allow`: an address in a
/// `deny` block is refused; when `allow` is not empty, only addresses in one of its
/// blocks are let in; an empty `Access` lets everyone in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Access {
    pub allow: Vec<Cidr>,
    pub deny: Vec<Cidr>,
}

impl Access {
    pub fn is_open(&self) -> bool {
        self.allow.is_empty() && self.deny.is_empty()
    }

    pub fn permits(&self, ip: IpAddr) -> bool {
        if self.deny.iter().any(|c| c.contains(ip)) {
            return false;
        }
        self.allow.is_empty() || self.allow.iter().any(|c| c.contains(ip))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidr_blocks_match_v4_v6_and_mapped() {
        let net = Cidr::parse("10.0.0.0/8").unwrap();
        assert!(net.contains("10.1.2.3".parse().unwrap()));
        assert!(net.contains("::ffff:10.1.2.3".parse().unwrap()));
        assert!(!net.contains("11.0.0.1".parse().unwrap()));
        let one = Cidr::parse("::1").unwrap();
        assert!(one.contains("::1".parse().unwrap()));
        assert!(!one.contains("127.0.0.1".parse().unwrap()));
        let all = Cidr::parse("0.0.0.0/0").unwrap();
        assert!(all.contains("1.2.3.4".parse().unwrap()));
        let mapped = Cidr::parse("::ffff:127.0.0.0/104").unwrap();
        assert!(mapped.contains("127.0.0.1".parse().unwrap()));
        for bad in ["10.0.0.0/33", "10.0.0/8", "::1/129", "x", "10.0.0.0/+8"] {
            assert!(Cidr::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn deny_wins_then_allow_restricts() {
        let access = Access {
            allow: vec![Cidr::parse("10.0.0.0/8").unwrap()],
            deny: vec![Cidr::parse("10.0.0.1").unwrap()],
        };
        assert!(access.permits("10.0.0.2".parse().unwrap()));
        assert!(!access.permits("10.0.0.1".parse().unwrap()));
        assert!(!access.permits("192.168.0.1".parse().unwrap()));
    }

    #[test]
    fn targets_that_could_change_host_are_refused() {
        assert_eq!(
            RedirectTarget::parse("/new/{path}").unwrap().host,
            TargetHost::Local
        );
        assert_eq!(
            RedirectTarget::parse("https://Example.com/{path}?{query}")
                .unwrap()
                .host,
            TargetHost::Fixed("example.com".into())
        );
        assert_eq!(
            RedirectTarget::parse("https://example.com{uri}")
                .unwrap()
                .host,
            TargetHost::Fixed("example.com".into())
        );
        assert_eq!(
            RedirectTarget::parse("https://{host}{uri}").unwrap().host,
            TargetHost::Request
        );
        for bad in [
            "https://example.com{path}",
            "https://{path}/",
            "https://a@{host}/",
            "new/{path}",
            "/{nope}",
            "/a b",
            "/\\evil",
            "/{path",
        ] {
            assert!(RedirectTarget::parse(bad).is_err(), "{bad}");
        }
    }
}

//! How a `Proxy` route shapes the request it sends upstream: the path (`path`), the
//! `Host` (`host`), fields set and removed (`set_headers`, `remove_headers`), and the
//! route's own upstream timeouts (`connect_timeout`, `send_timeout`, `read_timeout`).
//!
//! Every value is checked while deserializing, so a bad template, an unknown
//! placeholder or a field forkd must write itself is reported at the line and column
//! where it was written. What they become at run time is `worker/src/proxy/
//! upstream_request.rs`'s business; this module owns their validated shape.

use super::units::ConfDuration;
use serde::de::{self, Deserializer};
use serde::Deserialize;
use std::time::Duration;

/// A route's shaping of the proxied request, validated. The default changes nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Shaping {
    /// The path sent upstream; None: the target as received.
    pub path: Option<PathTemplate>,
    /// The `Host` sent upstream.
    pub host: SentHost,
    /// Sent in this order after the client's fields, each replacing the client's
    /// field (and forkd's `X-Forwarded-*`) of that name.
    pub set_headers: Vec<SetHeader>,
    /// Not forwarded, whoever wrote them (the client, or forkd's `X-Forwarded-*`).
    pub remove_headers: Vec<FieldName>,
    /// The route's own values for its upstream's timeouts.
    pub timeouts: RouteTimeouts,
}

impl Shaping {
    /// Whether `name` is set or removed by the route (so neither the client's field
    /// nor forkd's own of that name is sent).
    pub fn replaces(&self, name: &[u8]) -> bool {
        let is = |n: &FieldName| n.0.as_bytes().eq_ignore_ascii_case(name);
        self.set_headers.iter().any(|h| is(&h.name)) || self.remove_headers.iter().any(is)
    }
}

/// A `Proxy` route's overrides of its upstream's `connect_timeout`, `send_timeout`
/// and `read_timeout`; None: the upstream's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RouteTimeouts {
    pub connect: Option<Duration>,
    pub send: Option<Duration>,
    pub read: Option<Duration>,
}

impl RouteTimeouts {
    pub(super) fn of(
        connect: Option<ConfDuration>,
        send: Option<ConfDuration>,
        read: Option<ConfDuration>,
    ) -> RouteTimeouts {
        RouteTimeouts {
            connect: connect.map(|d| d.0),
            send: send.map(|d| d.0),
            read: read.map(|d| d.0),
        }
    }
}

/// `path: Some("/v1/{path}")`: literal text with at most one `{path}` (the request's
/// path after the route's prefix, as the client encoded it). The query is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathTemplate {
    pub text: String,
    /// The literal before `{path}` (all of the template without one); starts with `/`.
    pub before: String,
    /// The literal after `{path}`; None: the template has no `{path}`.
    pub after: Option<String>,
}

impl PathTemplate {
    pub fn parse(text: &str) -> Result<PathTemplate, String> {
        let bad = |why: &str| format!("path template `{}`: {why}", text.escape_debug());
        if !text.starts_with('/') {
            return Err(bad("must start with `/` (e.g. \"/v1/{path}\")"));
        }
        let (before, after) = match text.split_once("{path}") {
            Some((before, after)) => (before, Some(after)),
            None => (text, None),
        };
        for literal in std::iter::once(before).chain(after) {
            if let Some(open) = literal.find('{') {
                let name = literal[open + 1..].split('}').next().unwrap_or("");
                return Err(if literal[open..].contains('}') {
                    bad(&format!(
                        "unknown placeholder `{{{name}}}` (known: {{path}}, once)"
                    ))
                } else {
                    bad("`{` without `}`")
                });
            }
            if literal.contains('}') {
                return Err(bad("`}` without `{`"));
            }
            check_path_literal(literal).map_err(|why| bad(&why))?;
        }
        Ok(PathTemplate {
            text: text.into(),
            before: before.into(),
            after: after.map(String::from),
        })
    }
}

/// A path's literal text: RFC 3986 path characters (`pchar` and `/`), `%` only as an
/// escape; no `?` or `#` (the client's query is appended as it came).
fn check_path_literal(literal: &str) -> Result<(), String> {
    let bytes = literal.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' {
            let hex = |j: usize| bytes.get(j).is_some_and(u8::is_ascii_hexdigit);
            if !hex(i + 1) || !hex(i + 2) {
                return Err("`%` must start an escape such as %20".into());
            }
            i += 3;
            continue;
        }
        if !(b.is_ascii_alphanumeric() || b"/-._~!$&'()*+,;=:@".contains(&b)) {
            return Err(format!(
                "`{}` may not appear in a path (write it as an escape; the query is kept from the request)",
                (b as char).escape_debug()
            ));
        }
        i += 1;
    }
    Ok(())
}

impl<'de> Deserialize<'de> for PathTemplate {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        PathTemplate::parse(&text).map_err(de::Error::custom)
    }
}

/// `host:` as written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub enum RawHost {
    /// The client's `Host` (what it is today; an absolute-form target's authority).
    #[default]
    Client,
    /// The upstream's server as written (`127.0.0.1:9000`, `app.internal:80`;
    /// `localhost` for a unix socket); only for an upstream of one server.
    Upstream,
    /// This name, `host[:port]`.
    Fixed(HostValue),
}

/// The `Host` sent upstream, validated (`RawHost::Upstream` is resolved to the
/// server's address by `validate`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum SentHost {
    #[default]
    Client,
    Fixed(String),
}

/// A `Host` value: a reg-name, IPv4 or bracketed IPv6 address, and an optional port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostValue(pub String);

impl HostValue {
    pub fn parse(text: &str) -> Result<HostValue, String> {
        let bad = || {
            format!(
                "`{}` is not a host (a name, IPv4 or [IPv6] address and an optional port, e.g. \"app.internal\", \"10.0.0.5:8080\")",
                text.escape_debug()
            )
        };
        let (host, port) = if let Some(rest) = text.strip_prefix('[') {
            let (addr, after) = rest.split_once(']').ok_or_else(bad)?;
            addr.parse::<std::net::Ipv6Addr>().map_err(|_| bad())?;
            (&text[..addr.len() + 2], after.strip_prefix(':'))
        } else {
            match text.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (text, None),
            }
        };
        let reg_name = |h: &str| {
            !h.is_empty()
                && h.len() <= 253
                && h.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
        };
        let port_ok =
            port.is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.parse::<u16>().is_ok());
        if !(host.starts_with('[') || reg_name(host)) || !port_ok {
            return Err(bad());
        }
        Ok(HostValue(text.into()))
    }
}

impl<'de> Deserialize<'de> for HostValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        HostValue::parse(&text).map_err(de::Error::custom)
    }
}

/// A field name a route may set or remove: a token, and not one whose value forkd
/// decides (framing, hop-by-hop, `Host`, `X-Request-Id`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldName(pub String);

impl FieldName {
    pub fn parse(name: &str) -> Result<FieldName, String> {
        let tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
        if name.is_empty() || !name.bytes().all(tchar) {
            return Err(format!(
                "header name `{}` is not a token (letters, digits, !#$%&'*+-.^_`|~)",
                name.escape_debug()
            ));
        }
        let lower = name.to_ascii_lowercase();
        let why = match lower.as_str() {
            "content-length" | "transfer-encoding" => "frames the body, which forkd writes from the request's framing",
            "connection" | "keep-alive" | "proxy-connection" | "te" | "upgrade" | "trailer"
            | "expect" => "is hop-by-hop: forkd never forwards it",
            "host" => "is set with the route's `host:` key",
            "x-request-id" => "is the request's id, which forkd writes and logs (use {request_id} in another field)",
            _ => return Ok(FieldName(name.into())),
        };
        Err(format!("header `{name}` {why}"))
    }
}

impl<'de> Deserialize<'de> for FieldName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        FieldName::parse(&name).map_err(de::Error::custom)
    }
}

/// One part of a `set_headers` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValuePart {
    Literal(String),
    /// `{client_ip}`: the client's address (after `real_ip_header`, if trusted).
    ClientIp,
    /// `{host}`: the host the request named, without its port (the server's first
    /// name when it named none).
    Host,
    /// `{scheme}`: `http` or `https`, as the client spoke to forkd.
    Scheme,
    /// `{request_id}`: the `X-Request-Id` sent upstream.
    RequestId,
}

/// Placeholders a `set_headers` value may hold, for the error message.
const KNOWN: &str = "{client_ip} {host} {scheme} {request_id}";

/// `set_headers: [("X-Real-IP", "{client_ip}")]`: a field name and a value template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetHeader {
    pub name: FieldName,
    pub value: Vec<ValuePart>,
}

impl SetHeader {
    pub fn parse(name: &str, value: &str) -> Result<SetHeader, String> {
        let name = FieldName::parse(name)?;
        let bad = |why: &str| {
            format!(
                "header `{}`: value `{}` {why}",
                name.0,
                value.escape_debug()
            )
        };
        if value.bytes().any(|b| (b < b' ' && b != b'\t') || b == 0x7f) {
            return Err(bad("has a control character (CR, LF, NUL)"));
        }
        if value.starts_with([' ', '\t']) || value.ends_with([' ', '\t']) {
            return Err(bad("has surrounding blanks"));
        }
        let mut parts = Vec::new();
        let mut rest = value;
        while let Some(open) = rest.find(['{', '}']) {
            if rest.as_bytes()[open] == b'}' {
                return Err(bad("has `}` without `{`"));
            }
            if open > 0 {
                parts.push(ValuePart::Literal(rest[..open].into()));
            }
            let close = rest[open..]
                .find('}')
                .ok_or_else(|| bad("has `{` without `}`"))?;
            parts.push(match &rest[open + 1..open + close] {
                "client_ip" => ValuePart::ClientIp,
                "host" => ValuePart::Host,
                "scheme" => ValuePart::Scheme,
                "request_id" => ValuePart::RequestId,
                other => {
                    return Err(bad(&format!(
                        "has an unknown placeholder `{{{other}}}` (known: {KNOWN})"
                    )))
                }
            });
            rest = &rest[open + close + 1..];
        }
        if !rest.is_empty() {
            parts.push(ValuePart::Literal(rest.into()));
        }
        Ok(SetHeader { name, value: parts })
    }
}

impl<'de> Deserialize<'de> for SetHeader {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let (name, value) = <(String, String)>::deserialize(deserializer)?;
        SetHeader::parse(&name, &value).map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_templates_hold_at_most_one_path_and_path_characters() {
        let t = PathTemplate::parse("/v1/{path}").unwrap();
        assert_eq!((t.before.as_str(), t.after.as_deref()), ("/v1/", Some("")));
        let t = PathTemplate::parse("/fixed%20x").unwrap();
        assert_eq!((t.before.as_str(), t.after), ("/fixed%20x", None));
        let t = PathTemplate::parse("/a/{path}/b").unwrap();
        assert_eq!(t.after.as_deref(), Some("/b"));
        for bad in [
            "v1/{path}",
            "/v1/{uri}",
            "/{path}/{path}",
            "/v1?x=1",
            "/a b",
            "/a%2",
            "/a#b",
            "/{path",
            "/a}",
            "/\u{e9}",
        ] {
            assert!(PathTemplate::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn host_values_are_hosts() {
        for good in [
            "app.internal",
            "app.internal:80",
            "10.0.0.5:8080",
            "[::1]:9000",
            "[::1]",
            "my_app",
        ] {
            assert_eq!(HostValue::parse(good), Ok(HostValue(good.into())), "{good}");
        }
        for bad in [
            "",
            "a b",
            "a/b",
            "a@b",
            "a:",
            "a:99999",
            "a:x",
            "[zz]",
            "a\r\nX: y",
            ":80",
        ] {
            assert!(HostValue::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn set_header_values_split_into_known_placeholders() {
        let h = SetHeader::parse(
            "X-Real-IP",
            "ip={client_ip}; {scheme}://{host} {request_id}",
        )
        .unwrap();
        assert_eq!(
            h.value,
            [
                ValuePart::Literal("ip=".into()),
                ValuePart::ClientIp,
                ValuePart::Literal("; ".into()),
                ValuePart::Scheme,
                ValuePart::Literal("://".into()),
                ValuePart::Host,
                ValuePart::Literal(" ".into()),
                ValuePart::RequestId,
            ]
        );
        for (name, value, words) in [
            (
                "X-A",
                "{remote_addr}",
                "unknown placeholder `{remote_addr}`",
            ),
            ("X-A", "{host", "`{` without `}`"),
            ("X-A", "a}", "`}` without `{`"),
            ("X-A", "a\r\nX-B: 1", "control character"),
            ("X-A", " a", "surrounding blanks"),
            ("X A", "a", "not a token"),
            ("Content-Length", "1", "frames the body"),
            ("connection", "close", "hop-by-hop"),
            ("Host", "x", "`host:` key"),
            ("X-Request-Id", "x", "request's id"),
        ] {
            let err = SetHeader::parse(name, value).unwrap_err();
            assert!(err.contains(words), "{name}: {value:?}: {err}");
        }
    }
}

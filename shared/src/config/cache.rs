//! The shared proxy cache's settings: `caches` (named zones: where the bodies live,
//! how large the zone may grow, how many entries its index holds) and a `Proxy`
//! route's `cache` (which zone, the key, how long responses that say nothing are
//! kept, the stale windows, the lock for concurrent misses).

use super::units::{ConfDuration, ConfSize};
use serde::de::{self, Deserializer};
use serde::Deserialize;
use std::path::PathBuf;
use std::time::Duration;

/// One entry of `caches`, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCacheZone {
    /// The folder of the zone's body files and index (relative: to the prefix).
    pub path: String,
    /// The most body bytes the zone keeps; the least recently used go first.
    pub max_size: ConfSize,
    /// Entries the shared index holds (each 64 bytes of shared memory).
    #[serde(default = "default_index_entries")]
    pub index_entries: u32,
    /// An entry not used for this long is removed, fresh or not.
    #[serde(default = "default_inactive")]
    pub inactive: ConfDuration,
}

fn default_index_entries() -> u32 {
    100_000
}

fn default_inactive() -> ConfDuration {
    ConfDuration(Duration::from_secs(600))
}

/// A validated zone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheZone {
    pub name: String,
    /// Absolute.
    pub path: PathBuf,
    pub max_size: u64,
    pub index_entries: u32,
    pub inactive: Duration,
}

/// The fewest and most entries a zone's index may have.
pub const MIN_INDEX_ENTRIES: u32 = 64;
pub const MAX_INDEX_ENTRIES: u32 = 16 << 20;

/// `caches: { "name": (...), ... }` in file order; a name defined twice is an error.
#[derive(Debug, Default)]
pub struct CacheMap(pub Vec<(String, RawCacheZone)>);

impl<'de> Deserialize<'de> for CacheMap {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MapVisitor;
        impl<'de> de::Visitor<'de> for MapVisitor {
            type Value = CacheMap;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a map from cache zone names to zones")
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<CacheMap, A::Error> {
                let mut entries: Vec<(String, RawCacheZone)> = Vec::new();
                while let Some(name) = map.next_key::<String>()? {
                    if entries.iter().any(|(n, _)| *n == name) {
                        return Err(de::Error::custom(format!(
                            "cache zone `{name}` is defined twice"
                        )));
                    }
                    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_graphic()) {
                        return Err(de::Error::custom(format!(
                            "cache zone name `{name}` must be printable ASCII without blanks"
                        )));
                    }
                    entries.push((name, map.next_value()?));
                }
                Ok(CacheMap(entries))
            }
        }
        deserializer.deserialize_map(MapVisitor)
    }
}

/// A `Proxy` route's `cache: Some((...))`, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRouteCache {
    pub zone: String,
    #[serde(default = "default_key")]
    pub key: KeyTemplate,
    /// `(status, duration)`: how long a response of that status is fresh when it
    /// says nothing itself (no `Cache-Control` freshness, no `Expires`).
    #[serde(default)]
    pub valid: Vec<(u16, ConfDuration)>,
    /// A stale entry answers while the application fails (5xx, timeouts, every
    /// server down) for this long past its freshness.
    #[serde(default = "zero")]
    pub stale_if_error: ConfDuration,
    /// A stale entry answers for this long past its freshness while one request
    /// refreshes it in the background.
    #[serde(default = "zero")]
    pub stale_while_revalidate: ConfDuration,
    #[serde(default = "default_lock_timeout")]
    pub lock_timeout: ConfDuration,
}

pub(super) fn default_key() -> KeyTemplate {
    KeyTemplate::parse("{scheme}{host}{uri}").expect("the default key parses")
}

fn zero() -> ConfDuration {
    ConfDuration(Duration::ZERO)
}

fn default_lock_timeout() -> ConfDuration {
    ConfDuration(Duration::from_secs(5))
}

/// A validated route cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteCache {
    /// Index into `Config::caches`.
    pub zone: usize,
    pub key: KeyTemplate,
    /// `(status, seconds)`.
    pub valid: Vec<(u16, u64)>,
    pub stale_if_error: Duration,
    pub stale_while_revalidate: Duration,
    pub lock_timeout: Duration,
}

/// One part of a cache key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPart {
    Literal(String),
    /// `{scheme}`: `http` or `https`, as the client spoke to forkd.
    Scheme,
    /// `{host}`: the host the request named, without its port (the server's first
    /// name when it named none), lowercased.
    Host,
    /// `{uri}`: the normalised path and the query as the client sent it.
    Uri,
    /// `{path}`: the normalised path alone.
    Path,
    /// `{query}`: the query alone (without `?`).
    Query,
}

/// Placeholders a key may hold, for the error message.
const KNOWN: &str = "{scheme} {host} {uri} {path} {query}";

/// `key: "{scheme}{host}{uri}"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyTemplate(pub Vec<KeyPart>);

impl KeyTemplate {
    pub fn parse(text: &str) -> Result<KeyTemplate, String> {
        let bad = |why: &str| format!("cache key `{}` {why}", text.escape_debug());
        if text.bytes().any(|b| b < b' ' || b == 0x7f) {
            return Err(bad("has a control character"));
        }
        let mut parts = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find(['{', '}']) {
            if rest.as_bytes()[open] == b'}' {
                return Err(bad("has `}` without `{`"));
            }
            if open > 0 {
                parts.push(KeyPart::Literal(rest[..open].into()));
            }
            let close = rest[open..]
                .find('}')
                .ok_or_else(|| bad("has `{` without `}`"))?;
            parts.push(match &rest[open + 1..open + close] {
                "scheme" => KeyPart::Scheme,
                "host" => KeyPart::Host,
                "uri" => KeyPart::Uri,
                "path" => KeyPart::Path,
                "query" => KeyPart::Query,
                other => {
                    return Err(bad(&format!(
                        "has an unknown placeholder `{{{other}}}` (known: {KNOWN})"
                    )))
                }
            });
            rest = &rest[open + close + 1..];
        }
        if !rest.is_empty() {
            parts.push(KeyPart::Literal(rest.into()));
        }
        if !parts
            .iter()
            .any(|p| matches!(p, KeyPart::Uri | KeyPart::Path))
        {
            return Err(bad(
                "names neither {uri} nor {path}: every URL of the route would share one entry",
            ));
        }
        Ok(KeyTemplate(parts))
    }
}

impl<'de> Deserialize<'de> for KeyTemplate {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        KeyTemplate::parse(&text).map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_hold_known_placeholders_and_a_path() {
        let k = KeyTemplate::parse("{scheme}://{host}{uri}").unwrap();
        assert_eq!(
            k.0,
            vec![
                KeyPart::Scheme,
                KeyPart::Literal("://".into()),
                KeyPart::Host,
                KeyPart::Uri
            ]
        );
        assert!(KeyTemplate::parse("{host}{cookie}")
            .unwrap_err()
            .contains("unknown placeholder `{cookie}`"));
        assert!(KeyTemplate::parse("{host}")
            .unwrap_err()
            .contains("neither {uri} nor {path}"));
        assert!(KeyTemplate::parse("{path")
            .unwrap_err()
            .contains("without `}`"));
        assert!(KeyTemplate::parse("a}{path}")
            .unwrap_err()
            .contains("without `{`"));
        assert!(KeyTemplate::parse("{path}\n").is_err());
    }

    #[test]
    fn a_zone_map_refuses_a_name_twice() {
        let e = ron::from_str::<CacheMap>(
            r#"{"a": (path: "x", max_size: "1MiB"), "a": (path: "y", max_size: 1)}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("defined twice"), "{e}");
        let m = ron::from_str::<CacheMap>(r#"{"a": (path: "x", max_size: "1MiB")}"#).unwrap();
        assert_eq!(m.0[0].1.index_entries, 100_000);
        assert_eq!(m.0[0].1.inactive.0, Duration::from_secs(600));
    }
}

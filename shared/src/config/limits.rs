//! Per-client limits as written and as used (they need no cross-checks, so the serde
//! types are the validated ones): `limits: (conn_per_ip: Some(100), rates: [(key:
//! ClientIp, rate: "100/s", burst: 50)], mode: Enforce)`, on a server and, overriding
//! it, on a route.
//!
//! A `ClientIp` rate of an IPv6 client is kept per `ipv6_prefix` (default /64, the
//! block one subscriber is given), not per address: a client with a /64 would
//! otherwise have 2^64 buckets to spread its requests over.

use serde::de::{self, Deserializer};
use serde::Deserialize;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Concurrent connections per client address, over every worker.
    #[serde(default)]
    pub conn_per_ip: Option<u32>,
    /// Token buckets; a request must find a token in each.
    #[serde(default)]
    pub rates: Vec<RateLimit>,
    #[serde(default)]
    pub mode: LimitMode,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub enum LimitMode {
    /// Over a limit: 429 (rate) or 503 and close (connections).
    #[default]
    Enforce,
    /// Over a limit: counted and logged, never rejected.
    DryRun,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "RateFields")]
pub struct RateLimit {
    pub key: LimitKey,
    pub rate: ReqRate,
    /// Requests admitted at once from a full bucket (at least 1).
    pub burst: u32,
    /// `ClientIp`: an IPv6 client is keyed by its address masked to this many
    /// leading bits (1..=128); IPv4 clients by the whole address.
    pub ipv6_prefix: u8,
}

/// The default `ipv6_prefix`: the /64 a subscriber (or a cloud VM) is commonly given.
pub const DEFAULT_IPV6_PREFIX: u8 = 64;

/// A rate as written: `ipv6_prefix` is kept optional to refuse it on a `Header` rule.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RateFields {
    key: LimitKey,
    rate: ReqRate,
    #[serde(deserialize_with = "burst")]
    burst: u32,
    #[serde(default, deserialize_with = "ipv6_prefix")]
    ipv6_prefix: Option<u8>,
}

impl TryFrom<RateFields> for RateLimit {
    type Error = String;
    fn try_from(f: RateFields) -> Result<RateLimit, String> {
        if let (LimitKey::Header(name), Some(_)) = (&f.key, f.ipv6_prefix) {
            return Err(format!(
                "ipv6_prefix applies to key: ClientIp, not to Header(\"{name}\")"
            ));
        }
        Ok(RateLimit {
            key: f.key,
            rate: f.rate,
            burst: f.burst,
            ipv6_prefix: f.ipv6_prefix.unwrap_or(DEFAULT_IPV6_PREFIX),
        })
    }
}

/// What a bucket is kept per.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub enum LimitKey {
    /// The client address (after PROXY protocol and trusted proxies).
    ClientIp,
    /// A request header's value (a request without it is not limited by this rule).
    Header(String),
}

/// Requests per period, `"100/s"`, `"30/m"`, `"1000/h"`: kept as the interval
/// between two tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReqRate {
    /// Microseconds per token.
    pub interval_us: u64,
}

impl ReqRate {
    pub fn parse(text: &str) -> Result<ReqRate, String> {
        let (count, per) = text.trim().split_once('/').ok_or_else(|| {
            format!("rate `{text}` must be requests per period, such as \"100/s\"")
        })?;
        let count: u64 = count
            .trim()
            .parse()
            .map_err(|_| format!("rate `{text}` must start with a whole number of requests"))?;
        let period_us: u64 = match per.trim() {
            "s" => 1_000_000,
            "m" | "min" => 60_000_000,
            "h" => 3_600_000_000,
            other => {
                return Err(format!(
                    "rate `{text}` has unknown period `{other}`: use s, m or h"
                ))
            }
        };
        if count == 0 || count > period_us {
            return Err(format!(
                "rate `{text}`: between 1 and one a microsecond, please"
            ));
        }
        Ok(ReqRate {
            interval_us: period_us / count,
        })
    }
}

impl<'de> Deserialize<'de> for ReqRate {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        ReqRate::parse(&text).map_err(de::Error::custom)
    }
}

fn ipv6_prefix<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<u8>, D::Error> {
    match u64::deserialize(deserializer)? {
        n @ 1..=128 => Ok(Some(n as u8)),
        n => Err(de::Error::custom(format!(
            "ipv6_prefix {n} is out of range 1..=128"
        ))),
    }
}

fn burst<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u32, D::Error> {
    match u32::deserialize(deserializer)? {
        0 => Err(de::Error::custom("burst 0 would admit nothing: at least 1")),
        n => Ok(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_read_as_intervals() {
        assert_eq!(ReqRate::parse("100/s").unwrap().interval_us, 10_000);
        assert_eq!(ReqRate::parse("1/s").unwrap().interval_us, 1_000_000);
        assert_eq!(ReqRate::parse("30/m").unwrap().interval_us, 2_000_000);
        assert!(ReqRate::parse("0/s").is_err());
        assert!(ReqRate::parse("100").is_err());
        assert!(ReqRate::parse("5/d").is_err());
    }

    #[test]
    fn limits_parse_with_defaults() {
        let l: Limits = ron::from_str(
            r#"(rates: [(key: ClientIp, rate: "100/s", burst: 50), (key: Header("X-Api-Key"), rate: "10/m", burst: 1)], mode: DryRun)"#,
        )
        .unwrap();
        assert_eq!(l.conn_per_ip, None);
        assert_eq!(l.mode, LimitMode::DryRun);
        assert_eq!(l.rates[1].key, LimitKey::Header("X-Api-Key".into()));
        assert!(
            ron::from_str::<Limits>(r#"(rates: [(key: ClientIp, rate: "1/s", burst: 0)])"#)
                .is_err()
        );
        assert_eq!(l.rates[0].ipv6_prefix, DEFAULT_IPV6_PREFIX);
    }

    #[test]
    fn ipv6_prefix_is_1_to_128_and_for_client_ip_only() {
        let rate = |extra: &str| {
            ron::Options::default().from_str::<Limits>(&format!(
                "(rates: [(key: ClientIp, rate: \"1/s\", burst: 1{extra})])"
            ))
        };
        assert_eq!(rate(", ipv6_prefix: 48").unwrap().rates[0].ipv6_prefix, 48);
        assert_eq!(
            rate(", ipv6_prefix: 128").unwrap().rates[0].ipv6_prefix,
            128
        );
        for bad in [0, 129, 300] {
            let e = rate(&format!(", ipv6_prefix: {bad}")).unwrap_err();
            assert_eq!((e.span.start.line, e.span.start.col), (1, 62), "{bad}: {e}");
            assert!(
                e.code.to_string().contains("out of range 1..=128"),
                "{bad}: {e}"
            );
        }
        let header = ron::Options::default().from_str::<Limits>(
            r#"(rates: [(key: Header("X-Key"), rate: "1/s", burst: 1, ipv6_prefix: 48)])"#,
        );
        let e = header.unwrap_err();
        assert!(
            e.code
                .to_string()
                .contains("ipv6_prefix applies to key: ClientIp"),
            "{e}"
        );
        let e = rate(", ipv6_prefx: 48").unwrap_err();
        assert_eq!((e.span.start.line, e.span.start.col), (1, 49), "{e}");
    }
}

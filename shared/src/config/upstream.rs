//! Validated `upstreams`: `raw::RawUpstream -> Upstream`, addresses resolved.
//!
//! A server given by name is one server with every address the name resolves to
//! (`UpstreamServer::resolved`): the worker owning the checks re-resolves it every
//! `resolve_every` and publishes the new set in the region (`shm::health`), so the
//! server keeps its stats cell, its pool and its check state while its addresses move.
//!
//! Locating errors: serde keeps no positions, so an error about an upstream is placed
//! at its key (`"app": (`) or at the first matching text after it.

use super::raw::{Balance, RawHealthCheck, RawUpstream, UpstreamAddr};
use crate::capacity::{SERVER_LABEL_BYTES, UPSTREAM_CELLS, UPSTREAM_NAME_BYTES};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

/// Resolves a server name: host and port to every address, or why not.
pub type Resolver<'a> = dyn Fn(&str, u16) -> Result<Vec<std::net::SocketAddr>, String> + 'a;

/// One entry of `upstreams`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    pub name: String,
    /// Never empty.
    pub servers: Vec<UpstreamServer>,
    /// Idle connections kept per worker and server; 0 = none.
    pub keepalive: usize,
    pub keepalive_timeout: Duration,
    /// At least 1.
    pub keepalive_requests: u64,
    pub connect_timeout: Duration,
    pub send_timeout: Duration,
    pub read_timeout: Duration,
    /// Attempts beyond the first.
    pub retries: u32,
    // -- active checks and name re-resolution --
    pub health_check: Option<HealthCheck>,
    /// Names are resolved again this often.
    pub resolve_every: Duration,
    /// An upgraded connection idle (no bytes either way) this long is closed.
    pub tunnel_idle_timeout: Duration,
    /// The adaptive concurrency limit, if any.
    pub overload: Option<super::overload::Overload>,
    // -- balancing and passive health (issue #12, part A) --
    pub balance: Balance,
    /// 0: failures never mark a server down.
    pub max_fails: u32,
    /// More than zero.
    pub fail_timeout: Duration,
    pub slow_start: Duration,
    // -- end of balancing and passive health --
}

/// The timeouts of one proxied exchange: its upstream's, or a route's own
/// (`shaping::RouteTimeouts`) where it has them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    pub connect: Duration,
    pub send: Duration,
    pub read: Duration,
}

impl Upstream {
    /// The upstream's timeouts, with the route's own values in their place.
    pub fn timeouts(&self, route: &super::shaping::RouteTimeouts) -> Timeouts {
        Timeouts {
            connect: route.connect.unwrap_or(self.connect_timeout),
            send: route.send.unwrap_or(self.send_timeout),
            read: route.read.unwrap_or(self.read_timeout),
        }
    }
}

/// A validated `health_check` block.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HealthCheck {
    /// Starts with `/`; no spaces or control characters.
    pub path: String,
    /// The `Host` sent; None: the server's label.
    pub host: Option<String>,
    pub interval: Duration,
    /// At most `interval`.
    pub timeout: Duration,
    /// At least 1.
    pub rise: u32,
    /// At least 1.
    pub fall: u32,
    /// Inclusive, within 100..=599.
    pub expect_status: (u16, u16),
}

/// One server of an upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamServer {
    pub addr: UpstreamAddress,
    /// The address as written in the file (`app.internal:9000`), for logs and stats.
    pub label: String,
    /// A server given by name: the name and port, re-resolved every `resolve_every`.
    pub name: Option<(String, u16)>,
    /// Every address the name resolved to when the configuration was loaded (`addr`
    /// is the first); for an address written as such, just that one.
    pub resolved: Vec<SocketAddr>,
    /// 1 to `raw::ServerWeight::MAX`.
    pub weight: u32,
    /// Used only while no other server is usable.
    pub backup: bool,
}

/// Where an upstream server listens.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum UpstreamAddress {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl std::fmt::Display for UpstreamAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UpstreamAddress::Tcp(addr) => write!(f, "{addr}"),
            UpstreamAddress::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

/// A problem with one upstream, located by `validate`.
pub(super) enum UpstreamProblem {
    /// `servers: []`.
    NoServers,
    /// `keepalive_requests: 0`.
    ZeroKeepaliveRequests,
    /// A host name that does not resolve (the address as written, and why).
    Unresolved(String, String),
    /// A bad `health_check` value: the key it is about, and why.
    Check(&'static str, String),
    /// `overload`'s `min_limit` above its `max_limit`.
    OverloadBounds { min: u32, max: u32 },
    /// Every server is a `backup`.
    OnlyBackups,
    /// `fail_timeout: "0s"` with `max_fails` above 0.
    ZeroFailTimeout,
}

/// Validates one upstream; returns it, or every problem found.
pub(super) fn validate_upstream(
    name: &str,
    raw: RawUpstream,
    resolve: &Resolver<'_>,
) -> Result<Upstream, Vec<UpstreamProblem>> {
    let mut problems = Vec::new();
    if raw.servers.is_empty() {
        problems.push(UpstreamProblem::NoServers);
    }
    if raw.keepalive_requests == 0 {
        problems.push(UpstreamProblem::ZeroKeepaliveRequests);
    }
    if !raw.servers.is_empty() && raw.servers.iter().all(|s| s.backup) {
        problems.push(UpstreamProblem::OnlyBackups);
    }
    if raw.max_fails > 0 && raw.fail_timeout.0.is_zero() {
        problems.push(UpstreamProblem::ZeroFailTimeout);
    }
    let mut servers = Vec::with_capacity(raw.servers.len());
    for entry in raw.servers {
        let (weight, backup) = (entry.weight.0, entry.backup);
        match entry.addr {
            UpstreamAddr::Ip(a) => servers.push(UpstreamServer {
                addr: UpstreamAddress::Tcp(a),
                label: a.to_string(),
                name: None,
                resolved: vec![a],
                weight,
                backup,
            }),
            UpstreamAddr::Unix(p) => servers.push(UpstreamServer {
                label: format!("unix:{}", p.display()),
                addr: UpstreamAddress::Unix(p),
                name: None,
                resolved: Vec::new(),
                weight,
                backup,
            }),
            UpstreamAddr::Name(host, port) => {
                let label = format!("{host}:{port}");
                match resolve(&host, port) {
                    Ok(resolved) => servers.push(UpstreamServer {
                        addr: UpstreamAddress::Tcp(resolved[0]),
                        label,
                        name: Some((host, port)),
                        resolved,
                        weight,
                        backup,
                    }),
                    Err(why) => problems.push(UpstreamProblem::Unresolved(label, why)),
                }
            }
        }
    }
    let health_check = match raw.health_check {
        Some(check) => match validate_check(check) {
            Ok(c) => Some(c),
            Err(p) => {
                problems.extend(p);
                None
            }
        },
        None => None,
    };
    if raw.resolve_every.0 < Duration::from_secs(1) {
        problems.push(UpstreamProblem::Check(
            "resolve_every",
            "must be at least 1s".into(),
        ));
    }
    if let Some(o) = &raw.overload {
        if o.min_limit > o.max_limit {
            problems.push(UpstreamProblem::OverloadBounds {
                min: o.min_limit,
                max: o.max_limit,
            });
        }
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    Ok(Upstream {
        name: name.to_string(),
        servers,
        keepalive: raw.keepalive,
        keepalive_timeout: raw.keepalive_timeout.0,
        keepalive_requests: raw.keepalive_requests,
        connect_timeout: raw.connect_timeout.0,
        send_timeout: raw.send_timeout.0,
        read_timeout: raw.read_timeout.0,
        retries: raw.retries,
        health_check,
        resolve_every: raw.resolve_every.0,
        tunnel_idle_timeout: raw.tunnel_idle_timeout.0,
        overload: raw.overload,
        balance: raw.balance,
        max_fails: raw.max_fails,
        fail_timeout: raw.fail_timeout.0,
        slow_start: raw.slow_start.0,
    })
}

/// Why a server would find no room in the region's upstream label table (and so be
/// neither counted nor health-checked: a server without a cell is always usable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum CapacityProblem {
    /// The upstream's name is longer than [`UPSTREAM_NAME_BYTES`].
    LongName,
    /// The server's label (its address as written) is longer than
    /// [`SERVER_LABEL_BYTES`].
    LongLabel(String),
    /// The first server beyond the region's [`UPSTREAM_CELLS`], and how many there are.
    TooMany { label: String, total: usize },
}

/// What of `upstreams` the region has no room for: each problem with the index of
/// its upstream. Counted as `shm::upstream::publish_labels` takes cells: one per
/// distinct (upstream, label), all upstreams together.
pub(super) fn over_capacity(upstreams: &[Upstream]) -> Vec<(usize, CapacityProblem)> {
    let mut problems = Vec::new();
    let mut cells: Vec<(&str, &str)> = Vec::new();
    let mut first_over: Option<(usize, &str)> = None;
    for (ui, u) in upstreams.iter().enumerate() {
        if u.name.len() > UPSTREAM_NAME_BYTES {
            problems.push((ui, CapacityProblem::LongName));
            continue;
        }
        for s in &u.servers {
            if s.label.len() > SERVER_LABEL_BYTES {
                problems.push((ui, CapacityProblem::LongLabel(s.label.clone())));
            } else if !cells.contains(&(&u.name, &s.label)) {
                cells.push((&u.name, &s.label));
                if cells.len() == UPSTREAM_CELLS + 1 {
                    first_over = Some((ui, &s.label));
                }
            }
        }
    }
    if let Some((ui, label)) = first_over {
        problems.push((
            ui,
            CapacityProblem::TooMany {
                label: label.to_string(),
                total: cells.len(),
            },
        ));
    }
    problems
}

/// Every address `host:port` resolves to (at most [`MAX_RESOLVED`], in the resolver's
/// order, duplicates dropped), or why it does not resolve.
pub fn resolve_name(host: &str, port: u16) -> Result<Vec<SocketAddr>, String> {
    let mut out: Vec<SocketAddr> = Vec::new();
    for a in (host, port).to_socket_addrs().map_err(|e| e.to_string())? {
        if !out.contains(&a) && out.len() < MAX_RESOLVED {
            out.push(a);
        }
    }
    if out.is_empty() {
        return Err("no addresses".into());
    }
    Ok(out)
}

pub use crate::capacity::MAX_RESOLVED;

/// Checks a `health_check` block; every problem with the key it is about.
fn validate_check(raw: RawHealthCheck) -> Result<HealthCheck, Vec<UpstreamProblem>> {
    let mut problems = Vec::new();
    let mut bad = |key, why: &str| problems.push(UpstreamProblem::Check(key, why.to_string()));
    if !raw.path.starts_with('/') || raw.path.bytes().any(|b| b <= b' ' || b == 0x7f) {
        bad(
            "path",
            "must start with `/` and hold no spaces or control characters (e.g. \"/healthz\")",
        );
    }
    if let Some(host) = &raw.host {
        if host.is_empty() || host.bytes().any(|b| b <= b' ' || b == 0x7f) {
            bad(
                "host",
                "must be a non-empty name without spaces or control characters",
            );
        }
    }
    if raw.interval.0 < Duration::from_millis(10) {
        bad("interval", "must be at least 10ms");
    }
    if raw.timeout.0.is_zero() || raw.timeout.0 > raw.interval.0 {
        bad("timeout", "must be more than 0 and at most `interval`");
    }
    if raw.rise == 0 {
        bad("rise", "must be at least 1");
    }
    if raw.fall == 0 {
        bad("fall", "must be at least 1");
    }
    let (lo, hi) = raw.expect_status;
    if !(100..=599).contains(&lo) || !(100..=599).contains(&hi) || lo > hi {
        bad(
            "expect_status",
            "must be (LOW, HIGH) with 100 <= LOW <= HIGH <= 599 (e.g. (200, 399))",
        );
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    Ok(HealthCheck {
        path: raw.path,
        host: raw.host,
        interval: raw.interval.0,
        timeout: raw.timeout.0,
        rise: raw.rise,
        fall: raw.fall,
        expect_status: raw.expect_status,
    })
}

#[cfg(test)]
mod tests {
    use super::super::{Balance, Config, HashKey, HeaderName};
    use std::path::Path;

    fn parse(upstream: &str) -> Result<Config, String> {
        let text = format!(
            "(\n    upstreams: {{\n        \"app\": (\n{upstream}\n        ),\n    }},\n    servers: [(listen: [\"127.0.0.1:8080\"], routes: [(prefix: \"/\", handler: Proxy(upstream: \"app\"))])],\n)"
        );
        Config::parse(Path::new("/etc/forkd/forkd.ron"), &text).map_err(|e| e.to_string())
    }

    #[test]
    fn servers_are_plain_addresses_or_entries_with_weight_and_backup() {
        let c = parse(
            r#"            servers: [
                "127.0.0.1:9000",
                (addr: "127.0.0.1:9001", weight: 3),
                (addr: "127.0.0.1:9100", backup: true),
            ],
            balance: Hash(Header("X-User")),
            max_fails: 3, fail_timeout: "5s", slow_start: "10s","#,
        )
        .unwrap();
        let u = &c.upstreams[0];
        let got: Vec<(&str, u32, bool)> = u
            .servers
            .iter()
            .map(|s| (s.label.as_str(), s.weight, s.backup))
            .collect();
        assert_eq!(
            got,
            [
                ("127.0.0.1:9000", 1, false),
                ("127.0.0.1:9001", 3, false),
                ("127.0.0.1:9100", 1, true)
            ]
        );
        assert_eq!(
            u.balance,
            Balance::Hash(HashKey::Header(HeaderName("X-User".into())))
        );
        assert_eq!((u.max_fails, u.fail_timeout.as_secs()), (3, 5));
        assert_eq!(u.slow_start.as_secs(), 10);
    }

    #[test]
    fn balancing_defaults_are_nginx_s() {
        let c = parse(r#"            servers: ["127.0.0.1:9000"],"#).unwrap();
        let u = &c.upstreams[0];
        assert_eq!(u.balance, Balance::RoundRobin);
        assert_eq!((u.max_fails, u.fail_timeout.as_secs()), (1, 10));
        assert!(u.slow_start.is_zero());
        for b in ["LeastConn", "TwoChoices", "Hash(ClientIp)", "Hash(Path)"] {
            let c = parse(&format!(
                "            servers: [\"127.0.0.1:9000\"], balance: {b},"
            ))
            .unwrap_or_else(|e| panic!("{b}: {e}"));
            assert_ne!(c.upstreams[0].balance, Balance::RoundRobin, "{b}");
        }
    }

    #[test]
    fn bad_entries_are_located_where_written() {
        // (what is written, the line:col it must be reported at, words of the message)
        let cases = [
            (
                r#"            servers: [(addr: "127.0.0.1:9000", weight: 0)],"#,
                "forkd.ron:4:",
                "weight 0 is out of range",
            ),
            (
                r#"            servers: [(addr: "127.0.0.1:9000", wieght: 2)],"#,
                "forkd.ron:4:",
                "wieght",
            ),
            (
                r#"            servers: [(addr: "nope nope", weight: 2)],"#,
                "forkd.ron:4:",
                "nope nope",
            ),
            (
                r#"            servers: ["127.0.0.1:9000"], balance: Hash(Header("X User")),"#,
                "forkd.ron:4:",
                "not a header field name",
            ),
            (
                r#"            servers: ["127.0.0.1:9000"], balance: Random,"#,
                "forkd.ron:4:",
                "Random",
            ),
            (
                r#"            servers: [(addr: "127.0.0.1:9000", backup: true)],"#,
                "forkd.ron:4:13: upstreams.\"app\".servers",
                "every server is a backup",
            ),
            (
                "            servers: [\"127.0.0.1:9000\"],\n            fail_timeout: \"0s\",",
                "forkd.ron:5:13: upstreams.\"app\".fail_timeout",
                "must be more than 0",
            ),
        ];
        for (text, at, words) in cases {
            let err = parse(text).unwrap_err();
            assert!(err.contains(at), "{text}: {err}");
            assert!(err.contains(words), "{text}: {err}");
        }
        parse("            servers: [\"127.0.0.1:9000\"],\n            max_fails: 0, fail_timeout: \"0s\",")
            .expect("max_fails: 0 needs no window");
    }

    /// A config with upstreams `a` (servers 127.0.0.1:10000.., `in_a` of them) and `b`
    /// (127.0.0.2:10000.., `in_b`), one server a line.
    fn upstreams(in_a: usize, in_b: usize, extra_b: &str) -> String {
        let servers = |host: &str, n: usize| -> String {
            (0..n)
                .map(|i| format!("\n                \"{host}:{}\",", 10000 + i))
                .collect()
        };
        format!(
            "(\n    upstreams: {{\n        \"a\": (servers: [{}]),\n        \"b\": (servers: [{}{extra_b}]),\n    }},\n    servers: [(listen: [\"127.0.0.1:8080\"], routes: [(prefix: \"/\", handler: Proxy(upstream: \"a\"))])],\n)",
            servers("127.0.0.1", in_a),
            servers("127.0.0.2", in_b)
        )
    }

    #[test]
    fn servers_beyond_the_region_s_cells_are_an_error_at_the_first_one_over() {
        let cells = crate::capacity::UPSTREAM_CELLS;
        let file = Path::new("/etc/forkd/forkd.ron");
        let ok = upstreams(40, cells - 40, "");
        Config::parse(file, &ok).expect("exactly as many servers as cells");
        // The same server twice in one upstream takes one cell.
        let twice = upstreams(40, cells - 40, "\"127.0.0.2:10000\"");
        Config::parse(file, &twice).expect("a repeated server takes no second cell");
        let text = upstreams(40, cells - 40 + 2, "");
        let err = Config::parse(file, &text).unwrap_err().to_string();
        // Line 1 `(`, 2 `upstreams`, 3 `"a": (servers: [`, 40 lines of a's servers,
        // 44 `"b": (servers: [`; b's 25th server (10024) is the 65th.
        let want = format!(
            "forkd.ron:{}:17: upstreams.\"b\".servers: `127.0.0.2:{}` is upstream server 65 of 66",
            44 + cells - 40 + 1,
            10000 + cells - 40
        );
        assert!(err.contains(&want), "want {want}\ngot {err}");
        assert_eq!(
            err.lines().count(),
            1,
            "one error, at the first over: {err}"
        );
    }

    #[test]
    fn names_and_labels_too_long_for_the_label_table_are_errors() {
        let file = Path::new("/etc/forkd/forkd.ron");
        let name = "n".repeat(crate::capacity::UPSTREAM_NAME_BYTES + 1);
        let text = upstreams(1, 1, "").replace("\"b\": (", &format!("\"{name}\": ("));
        let err = Config::parse(file, &text).unwrap_err().to_string();
        assert!(
            err.contains(&format!(
                "forkd.ron:5:9: upstreams.\"{name}\": the name is 65 bytes"
            )),
            "{err}"
        );
        let path = format!("unix:/{}", "p".repeat(crate::capacity::SERVER_LABEL_BYTES));
        let err = Config::parse(file, &upstreams(1, 1, &format!("\"{path}\"")))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!(
                "forkd.ron:6:35: upstreams.\"b\".servers: `{path}` is 190 bytes"
            )),
            "{err}"
        );
    }
}

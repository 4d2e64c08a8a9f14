//! The configuration file as written: a serde mirror of the RON text.
//!
//! Every struct and every struct-like enum variant rejects unknown keys, so a typo is
//! an error with its position rather than a silently ignored setting. serde's
//! `deny_unknown_fields` is a container attribute: on `RawRoute` it covers the route's
//! own keys and nothing inside `handler`, so an enum with struct variants (`Static(root:
//! ...)`) needs it too (`shared/tests/unknown_keys.rs` walks every one). Values that can be checked on their own (durations,
//! sizes, addresses, prefixes) are checked while deserializing, so that ron reports them
//! at the line and column where they were written. Checks that relate several values
//! live in `validate`.

use super::limits::Limits;
use super::site::{Cidr, ErrorStatus, HeaderField, RedirectStatus, RedirectTarget, ReturnStatus};
use super::units::{ConfDuration, ConfSize};
use serde::de::{self, Deserializer};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::PathBuf;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    #[serde(default)]
    pub workers: Workers,
    #[serde(default)]
    pub cpu_affinity: CpuAffinity,
    #[serde(default)]
    pub accept: AcceptMode,
    #[serde(default = "default_worker_connections")]
    pub worker_connections: NonZeroUsize,
    #[serde(default = "default_multi_accept")]
    pub multi_accept: NonZeroUsize,
    #[serde(default = "default_rlimit_nofile")]
    pub rlimit_nofile: Option<u64>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub group: Option<String>,
    #[serde(default = "default_pid_file")]
    pub pid_file: String,
    #[serde(default = "default_shm_file")]
    pub shm_file: String,
    #[serde(default)]
    pub error_log: RawLogTarget,
    #[serde(default)]
    pub log_level: LogLevel,
    #[serde(default = "default_drain_timeout")]
    pub drain_timeout: ConfDuration,
    #[serde(default = "default_shutdown_delay")]
    pub shutdown_delay: ConfDuration,
    #[serde(default = "default_upgrade_timeout")]
    pub upgrade_timeout: ConfDuration,
    /// Bytes of compressed responses each worker keeps (least recently used dropped).
    #[serde(default = "default_compress_cache")]
    pub compress_cache: ConfSize,
    /// Threads per worker that open and read files off the event loop (0: the loop
    /// does it itself).
    #[serde(default = "default_file_threads")]
    pub file_threads: usize,
    /// Where proxied bodies that do not fit in memory are spooled (files without a
    /// name: nothing is left on disk after a crash).
    #[serde(default = "default_temp_dir")]
    pub temp_dir: String,
    /// The most of one proxied response kept in a temporary file; the rest streams.
    #[serde(default = "default_max_temp_file_size")]
    pub max_temp_file_size: ConfSize,
    /// The most temporary-file bytes one worker holds at once; past it, bodies stream.
    #[serde(default = "default_temp_max_bytes")]
    pub temp_max_bytes: ConfSize,
    /// Named groups of application servers that `Proxy` routes send requests to.
    #[serde(default)]
    pub upstreams: UpstreamMap,
    /// Named shared caches that `Proxy` routes keep responses in.
    #[serde(default)]
    pub caches: super::cache::CacheMap,
    pub servers: Vec<RawServer>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawServer {
    pub listen: Vec<ListenAddr>,
    #[serde(default = "default_backlog")]
    pub backlog: u32,
    #[serde(default)]
    pub names: Vec<String>,
    /// HTTPS on every address of `listen`: certificates, versions, session tickets.
    #[serde(default)]
    pub tls: Option<super::tls::RawTls>,
    #[serde(default)]
    pub access_log: Option<RawLogTarget>,
    #[serde(default)]
    pub access_log_format: AccessLogFormat,
    #[serde(default = "default_keepalive_timeout")]
    pub keepalive_timeout: ConfDuration,
    #[serde(default = "default_keepalive_requests")]
    pub keepalive_requests: u64,
    #[serde(default = "default_header_timeout")]
    pub header_timeout: ConfDuration,
    #[serde(default = "default_body_timeout")]
    pub body_timeout: ConfDuration,
    #[serde(default = "default_send_timeout")]
    pub send_timeout: ConfDuration,
    #[serde(default = "default_max_header_bytes")]
    pub max_header_bytes: ConfSize,
    /// HTTP/2 (on `http2` addresses): streams a client may open at once.
    #[serde(default = "default_h2_max_concurrent_streams")]
    pub h2_max_concurrent_streams: u32,
    /// HTTP/2: each stream's receive window (the connection's is raised to
    /// `h2_max_concurrent_streams` of them, as nginx does).
    #[serde(default = "default_h2_initial_window")]
    pub h2_initial_window: ConfSize,
    /// HTTP/2: the largest decoded header list (None: `max_header_bytes`).
    #[serde(default)]
    pub h2_max_header_list: Option<ConfSize>,
    /// HTTP/2: a connection with no stream open is closed (GOAWAY) after this.
    #[serde(default = "default_h2_idle_timeout")]
    pub h2_idle_timeout: ConfDuration,
    /// HTTP/2: streams per connection, then GOAWAY (the client opens another).
    #[serde(default = "default_h2_max_requests")]
    pub h2_max_requests: u64,
    #[serde(default = "default_max_body_bytes")]
    pub max_body_bytes: ConfSize,
    #[serde(default = "default_min_rate")]
    pub min_body_rate: ConfRate,
    #[serde(default = "default_min_rate")]
    pub min_send_rate: ConfRate,
    #[serde(default = "default_min_rate_grace")]
    pub min_rate_grace: ConfDuration,
    /// Per-client limits of the server's routes (a route may override them).
    #[serde(default)]
    pub limits: Option<Limits>,
    /// Peers whose `real_ip_header` is believed: `["10.0.0.0/8"]`.
    #[serde(default)]
    pub trusted_proxies: Vec<super::cidr::Cidr>,
    #[serde(default)]
    pub real_ip_header: Option<String>,
    /// Added to every response of the server (probes aside).
    #[serde(default)]
    pub headers: Vec<HeaderField>,
    /// Files (below the config folder) replacing the built-in page of a status.
    #[serde(default)]
    pub error_pages: BTreeMap<ErrorStatus, String>,
    /// Address blocks let in / refused, for routes without rules of their own.
    #[serde(default)]
    pub allow: Vec<Cidr>,
    #[serde(default)]
    pub deny: Vec<Cidr>,
    pub routes: Vec<RawRoute>,
}

/// A transfer rate in bytes per second: a size per second, `"1KiB/s"`; `0` is off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConfRate(pub u64);

impl<'de> Deserialize<'de> for ConfRate {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct RateVisitor;
        impl de::Visitor<'_> for RateVisitor {
            type Value = ConfRate;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a rate such as \"1KiB/s\", or 0 for none")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ConfRate, E> {
                match v {
                    0 => Ok(ConfRate(0)),
                    _ => Err(E::custom(format!(
                        "rate {v}: write it with a unit, such as \"{v}B/s\""
                    ))),
                }
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ConfRate, E> {
                let size = v.trim().strip_suffix("/s").ok_or_else(|| {
                    E::custom(format!("rate `{v}` must end in /s, such as \"1KiB/s\""))
                })?;
                super::units::parse_size(size)
                    .map(ConfRate)
                    .map_err(E::custom)
            }
        }
        deserializer.deserialize_any(RateVisitor)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRoute {
    pub prefix: RoutePrefix,
    pub handler: RawHandler,
    /// Replaces the server's `limits` for this route.
    #[serde(default)]
    pub limits: Option<Limits>,
    /// Added after the server's; an empty value removes the server's field.
    #[serde(default)]
    pub headers: Vec<HeaderField>,
    /// When either is given, these replace the server's rules for this route.
    #[serde(default)]
    pub allow: Vec<Cidr>,
    #[serde(default)]
    pub deny: Vec<Cidr>,
    /// The route's share of an overloaded upstream (`Proxy` routes).
    #[serde(default)]
    pub priority: super::overload::Priority,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub enum RawHandler {
    /// Answers 200 while the process runs: for liveness probes.
    Liveness,
    /// Answers 200 while the server accepts work, 503 while it drains: for readiness probes.
    Readiness,
    /// The shared-memory stats as JSON (what `forkd stats --json` prints).
    Status,
    /// The shared-memory stats in Prometheus text format.
    Metrics,
    /// `PURGE` requests remove the entry of their key from a cache zone (the key
    /// made with this route's `key` from the request, as a cached route makes it).
    Purge {
        zone: String,
        #[serde(default = "super::cache::default_key")]
        key: super::cache::KeyTemplate,
    },
    /// Serves files below `root` (the request path is appended to it, as nginx's `root`).
    Static {
        root: String,
        #[serde(default = "default_index")]
        index: Vec<String>,
        /// A missing file is answered by this path (a single-page app's entry point).
        #[serde(default)]
        fallback: Option<String>,
        /// Most ranges one request may list (more: the whole file, 200); 0: no ranges.
        #[serde(default = "default_max_ranges")]
        max_ranges: usize,
        /// Serve `X.br` / `X.gz` beside `X` when the client accepts that encoding.
        #[serde(default)]
        precompressed: bool,
        /// gzip text-like files of at least `min_size` on the fly (cached).
        #[serde(default)]
        compress: Option<RawCompress>,
    },
    /// Answers with a redirect to `to`, its placeholders expanded.
    Redirect {
        to: RedirectTarget,
        #[serde(default = "default_redirect_status")]
        status: RedirectStatus,
    },
    /// Answers with a fixed status and body.
    Return {
        status: ReturnStatus,
        #[serde(default)]
        body: String,
        #[serde(default = "default_return_type")]
        content_type: String,
    },
    /// Hands the request to a server of the named entry of `upstreams`; `upgrade`:
    /// a request asking for `Upgrade` (WebSocket) is forwarded with it, and a 101
    /// turns the connection into a byte tunnel.
    Proxy {
        upstream: String,
        #[serde(default)]
        upgrade: bool,
        /// The upstream's response is read as fast as it comes (memory, then a
        /// temporary file) and the client fed from there.
        #[serde(default = "default_true")]
        buffering: bool,
        /// The client's body is read whole before an upstream server is chosen.
        #[serde(default = "default_true")]
        request_buffering: bool,
        /// The path sent upstream (`{path}`: the part after the prefix, as the client
        /// encoded it; the query is kept); None: the target as received.
        #[serde(default)]
        path: Option<super::shaping::PathTemplate>,
        /// The `Host` sent upstream.
        #[serde(default)]
        host: super::shaping::RawHost,
        /// Fields sent upstream instead of the client's of the same name.
        #[serde(default)]
        set_headers: Vec<super::shaping::SetHeader>,
        /// Fields not sent upstream.
        #[serde(default)]
        remove_headers: Vec<super::shaping::FieldName>,
        /// The route's own values for its upstream's timeouts (a long poll).
        #[serde(default)]
        connect_timeout: Option<ConfDuration>,
        #[serde(default)]
        send_timeout: Option<ConfDuration>,
        #[serde(default)]
        read_timeout: Option<ConfDuration>,
        /// Responses are kept in a zone of `caches` and answered from there.
        #[serde(default)]
        cache: Option<Box<super::cache::RawRouteCache>>,
    },
}

#[derive(Debug, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RawCompress {
    #[serde(default = "default_min_size")]
    pub min_size: ConfSize,
    #[serde(default = "default_level")]
    pub level: u32,
}

/// One entry of `upstreams`: its servers, and how this worker talks to them.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstream {
    pub servers: Vec<RawUpstreamServer>,
    /// Idle connections kept per worker and server (most recently used first); 0 = none.
    #[serde(default = "default_upstream_keepalive")]
    pub keepalive: usize,
    /// An idle pooled connection is closed after this.
    #[serde(default = "default_upstream_keepalive_timeout")]
    pub keepalive_timeout: ConfDuration,
    /// A pooled connection is retired after this many requests.
    #[serde(default = "default_upstream_keepalive_requests")]
    pub keepalive_requests: u64,
    #[serde(default = "default_upstream_connect_timeout")]
    pub connect_timeout: ConfDuration,
    /// Between two writes to the upstream that make progress.
    #[serde(default = "default_upstream_send_timeout")]
    pub send_timeout: ConfDuration,
    /// Between two reads of the response.
    #[serde(default = "default_upstream_read_timeout")]
    pub read_timeout: ConfDuration,
    /// Attempts beyond the first.
    #[serde(default = "default_upstream_retries")]
    pub retries: u32,
    // -- active checks and name re-resolution (issue #12 part B) --
    /// Active health checks, run by one worker for the whole daemon.
    #[serde(default)]
    pub health_check: Option<RawHealthCheck>,
    /// How often a server given by name is resolved again (off the event loop).
    #[serde(default = "default_upstream_resolve_every")]
    pub resolve_every: ConfDuration,
    /// An upgraded connection (WebSocket tunnel) with no bytes either way for this
    /// long is closed.
    #[serde(default = "default_tunnel_idle_timeout")]
    pub tunnel_idle_timeout: ConfDuration,
    /// The adaptive concurrency limit (`None`: no limit).
    #[serde(default)]
    pub overload: Option<super::overload::Overload>,
    // -- balancing and passive health (issue #12, part A) --
    /// How a server is chosen for a request.
    #[serde(default)]
    pub balance: Balance,
    /// Failures (all workers together) within `fail_timeout` that mark a server down;
    /// 0: never marked down by failures.
    #[serde(default = "default_upstream_max_fails")]
    pub max_fails: u32,
    /// The window `max_fails` counts in, and how long a server stays down before one
    /// request tries it again.
    #[serde(default = "default_upstream_fail_timeout")]
    pub fail_timeout: ConfDuration,
    /// A server that comes back ramps its weight up from 1 over this; 0: at once.
    #[serde(default = "default_upstream_slow_start")]
    pub slow_start: ConfDuration,
    // -- end of balancing and passive health --
}

/// `health_check: Some((path: "/healthz", interval: "2s", timeout: "1s", rise: 2,
/// fall: 3, expect_status: (200, 399)))`.
#[derive(Debug, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct RawHealthCheck {
    pub path: String,
    /// The `Host` of the check request (default: the server's address as written).
    #[serde(default)]
    pub host: Option<String>,
    #[serde(default = "default_check_interval")]
    pub interval: ConfDuration,
    #[serde(default = "default_check_timeout")]
    pub timeout: ConfDuration,
    /// Consecutive passes that bring a Down server back.
    #[serde(default = "default_check_rise")]
    pub rise: u32,
    /// Consecutive failures that take a server Down.
    #[serde(default = "default_check_fall")]
    pub fall: u32,
    /// The statuses that pass, inclusive.
    #[serde(default = "default_check_expect_status")]
    pub expect_status: (u16, u16),
}

/// One entry of an upstream's `servers`: a plain address (`"10.0.0.1:9000"`, weight
/// 1), or `(addr: "10.0.0.1:9000", weight: 3, backup: true)`.
///
/// Either form, like `#[serde(untagged)]`, but by hand: an untagged enum reports only
/// "did not match any variant", while this keeps ron's position and the real message
/// (a bad address, an unknown key, a zero weight).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawUpstreamServer {
    pub addr: UpstreamAddr,
    pub weight: ServerWeight,
    pub backup: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ServerFields {
    addr: UpstreamAddr,
    #[serde(default)]
    weight: ServerWeight,
    #[serde(default)]
    backup: bool,
}

impl<'de> Deserialize<'de> for RawUpstreamServer {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ServerVisitor;
        impl<'de> de::Visitor<'de> for ServerVisitor {
            type Value = RawUpstreamServer;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(
                    "an address (\"127.0.0.1:9000\") or (addr: \"127.0.0.1:9000\", weight: 3, backup: true)",
                )
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<RawUpstreamServer, E> {
                Ok(RawUpstreamServer {
                    addr: UpstreamAddr::parse(text).map_err(E::custom)?,
                    weight: ServerWeight::default(),
                    backup: false,
                })
            }
            fn visit_map<A: de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<RawUpstreamServer, A::Error> {
                let f = ServerFields::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(RawUpstreamServer {
                    addr: f.addr,
                    weight: f.weight,
                    backup: f.backup,
                })
            }
        }
        deserializer.deserialize_any(ServerVisitor)
    }
}

/// A server's `weight`: 1 to [`ServerWeight::MAX`], checked where it is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerWeight(pub u32);

impl ServerWeight {
    pub const MAX: u32 = 1000;
}

impl Default for ServerWeight {
    fn default() -> Self {
        ServerWeight(1)
    }
}

impl<'de> Deserialize<'de> for ServerWeight {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let w = u64::deserialize(deserializer)?;
        if w == 0 || w > u64::from(ServerWeight::MAX) {
            return Err(de::Error::custom(format!(
                "weight {w} is out of range: 1 to {}",
                ServerWeight::MAX
            )));
        }
        Ok(ServerWeight(w as u32))
    }
}

/// `balance`: how an upstream picks a server.
#[derive(Debug, Default, Deserialize, Clone, PartialEq, Eq)]
pub enum Balance {
    /// Smooth weighted round robin (nginx's).
    #[default]
    RoundRobin,
    /// The fewest requests in flight, all workers together (weighted).
    LeastConn,
    /// The less loaded of two servers drawn at random (weighted), on the same global
    /// in-flight counts.
    TwoChoices,
    /// Consistent hashing of a request key: a key keeps its server while the set of
    /// usable servers stays, and moves off only a removed server.
    Hash(HashKey),
}

/// What `Balance::Hash` hashes.
#[derive(Debug, Deserialize, Clone, PartialEq, Eq)]
pub enum HashKey {
    /// The client address (after `real_ip_header`, if trusted).
    ClientIp,
    /// A request header field's value (absent: hashed as empty).
    Header(HeaderName),
    /// The request path, without the query.
    Path,
}

/// A header field name, checked (RFC 9110 token) where it is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderName(pub String);

impl<'de> Deserialize<'de> for HeaderName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
        if name.is_empty() || !name.bytes().all(token) {
            return Err(de::Error::custom(format!(
                "`{name}` is not a header field name"
            )));
        }
        Ok(HeaderName(name))
    }
}

/// `upstreams: { "name": (...), ... }` in file order; a name defined twice is an error
/// (a map would silently keep the last).
#[derive(Debug, Default)]
pub struct UpstreamMap(pub Vec<(String, RawUpstream)>);

impl<'de> Deserialize<'de> for UpstreamMap {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MapVisitor;
        impl<'de> de::Visitor<'de> for MapVisitor {
            type Value = UpstreamMap;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a map from upstream names to upstreams")
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<UpstreamMap, A::Error> {
                let mut entries: Vec<(String, RawUpstream)> = Vec::new();
                while let Some(name) = map.next_key::<String>()? {
                    if entries.iter().any(|(n, _)| *n == name) {
                        return Err(de::Error::custom(format!(
                            "upstream `{name}` is defined twice"
                        )));
                    }
                    if name.is_empty() {
                        return Err(de::Error::custom("an upstream name cannot be empty"));
                    }
                    entries.push((name, map.next_value()?));
                }
                Ok(UpstreamMap(entries))
            }
        }
        deserializer.deserialize_map(MapVisitor)
    }
}

/// An upstream server's address: `"127.0.0.1:9000"`, `"[::1]:9000"`,
/// `"localhost:9000"` (resolved when the configuration is loaded), or
/// `"unix:/run/app.sock"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamAddr {
    Ip(SocketAddr),
    /// A host name and port, resolved by `validate`.
    Name(String, u16),
    Unix(PathBuf),
}

impl UpstreamAddr {
    /// Parses an address as written in `servers`.
    pub fn parse(text: &str) -> Result<UpstreamAddr, String> {
        if let Some(path) = text.strip_prefix("unix:") {
            if !path.starts_with('/') {
                return Err(format!(
                    "upstream address `{text}`: a unix socket path must be absolute (e.g. \"unix:/run/app.sock\")"
                ));
            }
            return Ok(UpstreamAddr::Unix(PathBuf::from(path)));
        }
        if let Ok(addr) = text.parse::<SocketAddr>() {
            return Ok(UpstreamAddr::Ip(addr));
        }
        let bad = || {
            format!(
                "upstream address `{text}` is not HOST:PORT or unix:/PATH (e.g. \"127.0.0.1:9000\", \"app.internal:9000\", \"unix:/run/app.sock\")"
            )
        };
        let (host, port) = text.rsplit_once(':').ok_or_else(bad)?;
        let port: u16 = port.parse().map_err(|_| bad())?;
        let host_ok = !host.is_empty()
            && host.len() <= 253
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
        if !host_ok || port == 0 {
            return Err(bad());
        }
        Ok(UpstreamAddr::Name(host.to_ascii_lowercase(), port))
    }
}

impl<'de> Deserialize<'de> for UpstreamAddr {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        UpstreamAddr::parse(&text).map_err(de::Error::custom)
    }
}

#[derive(Debug, Default, Deserialize, Clone, Copy, PartialEq, Eq)]
pub enum Workers {
    /// One worker per CPU this process may run on.
    #[default]
    Auto,
    Count(NonZeroUsize),
}

#[derive(Debug, Default, Deserialize, Clone, Copy, PartialEq, Eq)]
pub enum CpuAffinity {
    /// Worker i is pinned to the i-th CPU this process may run on.
    #[default]
    Auto,
    Off,
}

#[derive(Debug, Default, Deserialize, Clone, Copy, PartialEq, Eq)]
pub enum AcceptMode {
    /// One listening socket per address, shared by every worker (EPOLLEXCLUSIVE).
    #[default]
    Shared,
    /// One `SO_REUSEPORT` socket per address and worker slot.
    ReusePort,
}

#[derive(Debug, Default, Deserialize, Clone, PartialEq, Eq)]
pub enum RawLogTarget {
    #[default]
    Stderr,
    Stdout,
    File(String),
    Syslog,
}

#[derive(Debug, Default, Deserialize, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Debug,
    #[default]
    Info,
    Notice,
    Warn,
    Error,
    Crit,
    Alert,
    Emerg,
}

/// A listen address: `"127.0.0.1:8080"`, `"[::1]:8080"`, or `"*:8080"` for every IPv4 address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenAddr {
    pub addr: SocketAddr,
    /// The address as written (`"*:8080"`), to locate errors about the entry.
    pub written: String,
    pub proxy: ProxyProtocol,
    pub http2: Http2Listen,
}

/// Whether connections to a listen address start with a PROXY protocol header, and
/// from which peers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProxyProtocol {
    pub on: bool,
    /// `proxy_protocol_from`: the peers that may send the header; `None` when not
    /// written (any peer may).
    pub from: Option<Vec<Cidr>>,
}

/// A listen entry as written: `"127.0.0.1:80"`, or `(addr: "0.0.0.0:80",
/// proxy_protocol: true, proxy_protocol_from: ["10.0.0.0/8"])`.
///
/// Either form by hand, as `RawUpstreamServer`: an untagged enum would lose ron's
/// position and message, and would take an unknown key in the long form silently.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListenFields {
    addr: String,
    #[serde(default)]
    proxy_protocol: bool,
    /// Strings, parsed below, so a bad block is reported with its text. A list as
    /// written (`[...]`, not `Some([...])`); `None`: not written.
    #[serde(default, deserialize_with = "written_list")]
    proxy_protocol_from: Option<Vec<String>>,
    #[serde(default)]
    http2: Http2Listen,
}

/// Whether a plain address also speaks HTTP/2 without TLS (h2c).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub enum Http2Listen {
    /// HTTP/1.1 only.
    #[default]
    Off,
    /// A connection that starts with the HTTP/2 preface (a client that knows, as
    /// `curl --http2-prior-knowledge`) speaks HTTP/2; any other speaks HTTP/1.1.
    /// RFC 9113 removed `Upgrade: h2c`, so it is not offered.
    PriorKnowledge,
}

/// A list that is `Some` when written at all (an empty one included).
fn written_list<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    Vec::<String>::deserialize(d).map(Some)
}

impl<'de> Deserialize<'de> for ListenAddr {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        type Entry = (String, bool, Option<Vec<String>>, Http2Listen);
        struct ListenVisitor;
        impl<'de> de::Visitor<'de> for ListenVisitor {
            type Value = Entry;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("\"IP:PORT\" or (addr: \"IP:PORT\", proxy_protocol: true, proxy_protocol_from: [\"CIDR\", ...], http2: PriorKnowledge)")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Entry, E> {
                Ok((text.to_string(), false, None, Http2Listen::Off))
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<Entry, A::Error> {
                let f = ListenFields::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok((f.addr, f.proxy_protocol, f.proxy_protocol_from, f.http2))
            }
        }
        let (text, on, from, http2) = deserializer.deserialize_any(ListenVisitor)?;
        let from = from
            .map(|blocks| {
                blocks
                    .iter()
                    .map(|b| Cidr::parse(b))
                    .collect::<Result<Vec<_>, _>>()
            })
            .transpose()
            .map_err(|e| de::Error::custom(format!("proxy_protocol_from: {e}")))?;
        let normalized = match text.strip_prefix("*:") {
            Some(port) => format!("0.0.0.0:{port}"),
            None => text.clone(),
        };
        let addr = normalized.parse().map_err(|_| {
            de::Error::custom(format!(
                "listen address `{text}` is not IP:PORT (e.g. \"127.0.0.1:8080\", \"[::1]:8080\", \"*:8080\")"
            ))
        })?;
        Ok(ListenAddr {
            addr,
            written: text,
            proxy: ProxyProtocol { on, from },
            http2,
        })
    }
}

/// A route prefix: must start with `/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutePrefix(pub String);

impl<'de> Deserialize<'de> for RoutePrefix {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        if !text.starts_with('/') {
            return Err(de::Error::custom(format!(
                "route prefix `{text}` must start with `/`"
            )));
        }
        Ok(RoutePrefix(text))
    }
}

fn default_worker_connections() -> NonZeroUsize {
    NonZeroUsize::new(10240).expect("non-zero")
}
fn default_multi_accept() -> NonZeroUsize {
    NonZeroUsize::new(64).expect("non-zero")
}
fn default_rlimit_nofile() -> Option<u64> {
    Some(65536)
}
fn default_pid_file() -> String {
    "run/forkd.pid".into()
}
fn default_shm_file() -> String {
    "run/forkd.shm".into()
}
fn default_drain_timeout() -> ConfDuration {
    ConfDuration(std::time::Duration::from_secs(25))
}
fn default_shutdown_delay() -> ConfDuration {
    ConfDuration(std::time::Duration::ZERO)
}
fn default_upgrade_timeout() -> ConfDuration {
    ConfDuration(std::time::Duration::from_secs(10))
}
fn default_backlog() -> u32 {
    4096
}
fn default_keepalive_timeout() -> ConfDuration {
    ConfDuration(std::time::Duration::from_secs(15))
}
fn default_keepalive_requests() -> u64 {
    10000
}
fn default_h2_max_concurrent_streams() -> u32 {
    128
}
fn default_h2_initial_window() -> ConfSize {
    ConfSize(64 * 1024)
}
fn default_h2_idle_timeout() -> ConfDuration {
    ConfDuration(std::time::Duration::from_secs(180))
}
fn default_h2_max_requests() -> u64 {
    1000
}
fn default_header_timeout() -> ConfDuration {
    ConfDuration(std::time::Duration::from_secs(10))
}
fn default_body_timeout() -> ConfDuration {
    ConfDuration(std::time::Duration::from_secs(30))
}
fn default_send_timeout() -> ConfDuration {
    ConfDuration(std::time::Duration::from_secs(30))
}
fn default_max_header_bytes() -> ConfSize {
    ConfSize(16 * 1024)
}
fn default_max_body_bytes() -> ConfSize {
    ConfSize(1024 * 1024)
}
fn default_upstream_keepalive() -> usize {
    32
}
fn default_upstream_keepalive_timeout() -> ConfDuration {
    ConfDuration(std::time::Duration::from_secs(4))
}
fn default_upstream_keepalive_requests() -> u64 {
    1000
}
fn default_upstream_connect_timeout() -> ConfDuration {
    ConfDuration(std::time::Duration::from_secs(1))
}
fn default_upstream_send_timeout() -> ConfDuration {
    ConfDuration(std::time::Duration::from_secs(30))
}
fn default_upstream_read_timeout() -> ConfDuration {
    ConfDuration(std::time::Duration::from_secs(60))
}
fn default_upstream_retries() -> u32 {
    1
}
fn default_upstream_resolve_every() -> ConfDuration {
    ConfDuration(std::time::Duration::from_secs(30))
}
fn default_check_interval() -> ConfDuration {
    ConfDuration(std::time::Duration::from_secs(2))
}
fn default_check_timeout() -> ConfDuration {
    ConfDuration(std::time::Duration::from_secs(1))
}
fn default_check_rise() -> u32 {
    2
}
fn default_check_fall() -> u32 {
    3
}
fn default_check_expect_status() -> (u16, u16) {
    (200, 399)
}
fn default_tunnel_idle_timeout() -> ConfDuration {
    ConfDuration(std::time::Duration::from_secs(3600))
}
fn default_upstream_max_fails() -> u32 {
    1
}
fn default_upstream_fail_timeout() -> ConfDuration {
    ConfDuration(std::time::Duration::from_secs(10))
}
fn default_upstream_slow_start() -> ConfDuration {
    ConfDuration(std::time::Duration::ZERO)
}
fn default_min_rate() -> ConfRate {
    ConfRate(1024)
}
fn default_min_rate_grace() -> ConfDuration {
    ConfDuration(std::time::Duration::from_secs(10))
}
fn default_index() -> Vec<String> {
    vec!["index.html".into()]
}
fn default_redirect_status() -> RedirectStatus {
    RedirectStatus(302)
}
fn default_return_type() -> String {
    "text/plain".into()
}
fn default_max_ranges() -> usize {
    16
}
fn default_min_size() -> ConfSize {
    ConfSize(1024)
}
fn default_level() -> u32 {
    5
}
fn default_compress_cache() -> ConfSize {
    ConfSize(16 << 20)
}
fn default_file_threads() -> usize {
    4
}
fn default_true() -> bool {
    true
}
fn default_temp_dir() -> String {
    "run/tmp".into()
}
fn default_max_temp_file_size() -> ConfSize {
    ConfSize(1 << 30)
}
fn default_temp_max_bytes() -> ConfSize {
    ConfSize(2 << 30)
}

/// `access_log_format`: the line format of a server's access log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
pub enum AccessLogFormat {
    /// nginx's `combined` (the default).
    #[default]
    Combined,
    /// One JSON object per line (see `worker/src/access_log.rs` for the fields).
    Json,
}

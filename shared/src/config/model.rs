//! The validated configuration every other module reads: [`Config`], its servers,
//! routes, handlers and listeners, with every path absolute and every value in range.
//! Made by `validate.rs` from `raw.rs`; read, never changed, by master and workers.

use super::raw::{self, AcceptMode, AccessLogFormat, LogLevel};
use super::upstream::Upstream;
use super::{cidr, limits, overload, shaping, site, tls};
use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A validated configuration: every path absolute, every value in range.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file this was read from (absolute).
    pub file: PathBuf,
    /// `workers` as written (`Auto` is resolved into `workers` by whoever parses).
    pub workers_setting: raw::Workers,
    /// `cpu_affinity` as written (resolved into `cpus`).
    pub cpu_affinity: raw::CpuAffinity,
    pub workers: NonZeroUsize,
    /// CPUs to pin workers to, worker i to `cpus[i % len]`; empty = no pinning.
    pub cpus: Vec<usize>,
    pub accept: AcceptMode,
    pub worker_connections: NonZeroUsize,
    pub multi_accept: NonZeroUsize,
    pub rlimit_nofile: Option<u64>,
    /// Workers switch to this user after starting; None: stay as is.
    pub user: Option<String>,
    /// Workers switch to this group (default: `user`'s primary group).
    pub group: Option<String>,
    pub pid_file: PathBuf,
    pub shm_file: PathBuf,
    pub error_log: LogTarget,
    pub log_level: LogLevel,
    pub drain_timeout: Duration,
    pub shutdown_delay: Duration,
    /// How long a binary upgrade waits for the new master to serve before rolling back.
    pub upgrade_timeout: Duration,
    /// Bytes of compressed responses a worker keeps.
    pub compress_cache: usize,
    /// Threads per worker opening and reading files for static routes (0: none,
    /// the event loop does it). See `worker/src/file_pool`.
    pub file_threads: usize,
    /// Where proxied bodies that do not fit in memory are spooled.
    pub temp_dir: PathBuf,
    /// The most of one proxied response kept in a temporary file.
    pub max_temp_file_size: u64,
    /// The most temporary-file bytes one worker holds at once.
    pub temp_max_bytes: u64,
    pub servers: Vec<Server>,
    /// `upstreams`, in file order; `Handler::Proxy` holds an index into it.
    pub upstreams: Vec<Upstream>,
    /// `caches`, in file order; a route's `cache` holds an index into it.
    pub caches: Vec<super::cache::CacheZone>,
    /// Every distinct listen address with the largest backlog any server asked for.
    pub listeners: Vec<Listener>,
    /// Problems that do not stop it from running (a certificate expiring soon), as
    /// `FILE:LINE:COL: warning: ...` lines.
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogTarget {
    Stderr,
    Stdout,
    File(PathBuf),
    Syslog,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    pub addr: SocketAddr,
    pub backlog: u32,
    /// Connections start with a PROXY protocol header (v1 or v2) naming the client.
    pub proxy_protocol: bool,
    /// `proxy_protocol_from`: the peers that may send it (empty: any peer).
    pub proxy_protocol_from: Vec<cidr::Cidr>,
    /// A plain address that also takes the HTTP/2 preface (h2c, prior knowledge).
    pub http2: bool,
}

/// What a listener expects of a new connection from a given peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyHeader {
    /// A plain address: the request (or the TLS handshake) comes first.
    Off,
    /// A PROXY protocol header, before anything else.
    Expected,
    /// A PROXY protocol address, but the peer is not in `proxy_protocol_from`: it
    /// may not name a client, and the connection is refused.
    Untrusted,
}

impl Listener {
    /// What a connection from `peer` (the socket's address) must start with.
    pub fn proxy_header(&self, peer: IpAddr) -> ProxyHeader {
        if !self.proxy_protocol {
            ProxyHeader::Off
        } else if self.proxy_protocol_from.is_empty()
            || self.proxy_protocol_from.iter().any(|c| c.contains(peer))
        {
            ProxyHeader::Expected
        } else {
            ProxyHeader::Untrusted
        }
    }
}

#[derive(Debug, Clone)]
pub struct Server {
    pub listen: Vec<SocketAddr>,
    /// Host names, lower-cased, without port.
    pub names: Vec<String>,
    /// HTTPS: every address in `listen` speaks TLS (an address is all TLS or all
    /// plain), and SNI picks among its servers' certificates.
    pub tls: Option<tls::Tls>,
    pub access_log: Option<LogTarget>,
    /// How `access_log` lines are written.
    pub access_log_format: AccessLogFormat,
    pub keepalive_timeout: Duration,
    pub keepalive_requests: u64,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub send_timeout: Duration,
    pub max_header_bytes: usize,
    pub max_body_bytes: u64,
    /// Bytes per second a request body must arrive at, measured over each
    /// `min_rate_grace` (0: no minimum).
    pub min_body_rate: u64,
    /// Bytes per second a response must be taken at, likewise (0: no minimum).
    pub min_send_rate: u64,
    /// The period both rates are measured over: a transfer is first checked after it.
    pub min_rate_grace: Duration,
    /// Per-client limits of the server's routes (a route's own replace them).
    pub limits: Option<limits::Limits>,
    /// Peers whose `real_ip_header` is believed.
    pub trusted_proxies: Vec<cidr::Cidr>,
    /// The header a trusted peer names the client in (`X-Forwarded-For`).
    pub real_ip_header: Option<String>,
    /// Sorted longest prefix first, so the first match is the longest.
    pub routes: Vec<Route>,
    /// Pages replacing the built-in error pages, by status.
    pub error_pages: Vec<ErrorPage>,
    /// HTTP/2 connections: those of an address's first server apply (SETTINGS are
    /// sent before any request names a server, as in nginx).
    pub h2: H2Settings,
}

/// A server's HTTP/2 settings (`h2_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct H2Settings {
    pub max_concurrent_streams: u32,
    /// Each stream's receive window, in bytes.
    pub initial_window: u32,
    /// The largest decoded header list, in bytes.
    pub max_header_list: u32,
    pub idle_timeout: Duration,
    /// Streams per connection before GOAWAY.
    pub max_requests: u64,
}

#[derive(Debug, Clone)]
pub struct Route {
    pub prefix: String,
    pub handler: Handler,
    /// The route's share of an overloaded upstream (used by `Proxy` routes).
    pub priority: overload::Priority,
    pub limits: Option<limits::Limits>,
    /// The server's header fields then the route's, a route's empty value removing
    /// the server's field; none on probe and stats (`Status`, `Metrics`) routes.
    pub headers: Vec<site::HeaderField>,
    /// `headers` as header lines, `Name: value\r\n` each, ready to append.
    pub header_block: Vec<u8>,
    /// The route's `allow`/`deny`, or the server's when the route has none (probe
    /// routes only follow their own).
    pub access: site::Access,
}

/// On-the-fly gzip of a static route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compress {
    /// Smaller files are sent as they are.
    pub min_size: u64,
    /// gzip level 1..=9.
    pub level: u32,
}

/// A file replacing forkd's built-in page for `status`, read when the configuration
/// is loaded (a reload reads it again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorPage {
    pub status: u16,
    pub path: PathBuf,
    pub content_type: &'static str,
    pub body: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handler {
    Liveness,
    Readiness,
    Status,
    Metrics,
    /// `PURGE` removes the request's key from zone `zone` (index into
    /// `Config::caches`).
    Purge {
        zone: usize,
        key: super::cache::KeyTemplate,
    },
    Static {
        root: PathBuf,
        index: Vec<String>,
        /// Answers a missing file (normalised, starting with `/`).
        fallback: Option<String>,
        /// Most ranges per request (more: 200 with the whole file); 0: no ranges.
        max_ranges: usize,
        /// Serve `X.br` / `X.gz` beside `X` to clients that accept them.
        precompressed: bool,
        /// gzip text-like files on the fly, cached per worker.
        compress: Option<Compress>,
    },
    Redirect {
        to: site::RedirectTarget,
        status: u16,
    },
    Return {
        status: u16,
        body: String,
        content_type: String,
    },
    /// Hands the request to `Config::upstreams[upstream]`; `upgrade`: `Upgrade`
    /// requests are forwarded with it and a 101 becomes a byte tunnel.
    Proxy {
        upstream: usize,
        upgrade: bool,
        /// The response is read from the upstream as fast as it comes and the client
        /// fed from memory and a temporary file (`buffering`).
        buffering: bool,
        /// The client's body is read whole before a server is chosen
        /// (`request_buffering`).
        request_buffering: bool,
        /// What the route changes in the request sent upstream.
        shaping: shaping::Shaping,
        /// The shared cache the route's responses are kept in.
        cache: Option<Box<super::cache::RouteCache>>,
    },
}

impl Handler {
    /// Whether the route may hold proxied bodies in temporary files (`temp_dir`).
    pub fn spools(&self) -> bool {
        matches!(
            self,
            Handler::Proxy {
                buffering: true,
                ..
            } | Handler::Proxy {
                request_buffering: true,
                ..
            }
        )
    }
}

impl Config {
    /// Whether any route may hold proxied bodies in temporary files.
    pub fn spools(&self) -> bool {
        self.servers
            .iter()
            .any(|s| s.routes.iter().any(|r| r.handler.spools()))
    }
}

impl Server {
    /// The configured page for `status`, if any.
    pub fn error_page(&self, status: u16) -> Option<&ErrorPage> {
        self.error_pages.iter().find(|p| p.status == status)
    }
}

impl Config {
    /// What in `new` cannot be applied by the running workers, if anything: such a
    /// change needs new worker processes (a new generation).
    pub fn needs_new_workers(&self, new: &Config) -> Option<&'static str> {
        if self.listeners != new.listeners {
            Some("listen addresses, backlogs or PROXY protocol settings changed")
        } else if self.workers_setting != new.workers_setting {
            Some("the number of workers changed")
        } else if self.cpu_affinity != new.cpu_affinity {
            Some("cpu_affinity changed")
        } else if self.workers != new.workers {
            Some("the number of workers changed")
        } else if self.accept != new.accept {
            Some("the accept mode changed")
        } else if self.cpus != new.cpus {
            Some("cpu_affinity changed")
        } else if self.rlimit_nofile != new.rlimit_nofile {
            Some("rlimit_nofile changed")
        } else if self.file_threads != new.file_threads {
            Some("file_threads changed")
        } else if self.user != new.user {
            Some("user changed")
        } else if self.group != new.group {
            Some("group changed")
        } else if self.user.is_some() && self.certificates().ne(new.certificates()) {
            // Workers that gave up root may not read the new keys: new workers,
            // forked from the master that read them, serve the new certificates.
            Some("TLS certificates changed and the workers run as `user`")
        } else {
            None
        }
    }

    /// Every certificate in force, by file and chain, in server order.
    fn certificates(
        &self,
    ) -> impl Iterator<Item = (&Path, &[rustls::pki_types::CertificateDer<'static>])> {
        self.servers
            .iter()
            .filter_map(|s| s.tls.as_ref())
            .flat_map(|t| &t.certificates)
            .map(|c| (c.cert_path.as_path(), c.key.cert.as_slice()))
    }

    /// Takes the master's resolution of `Auto` settings: `workers: Auto` and
    /// `cpu_affinity: Auto` depend on the CPUs the parsing process may use, and a
    /// pinned worker sees only its own.
    pub fn resolve_like(&mut self, master: &Config) {
        if self.workers_setting == master.workers_setting {
            self.workers = master.workers;
        }
        if self.cpu_affinity == master.cpu_affinity
            && self.workers_setting == master.workers_setting
        {
            self.cpus = master.cpus.clone();
        }
    }
}

impl Server {
    /// The route whose prefix is the longest one `path` starts with.
    pub fn route(&self, path: &[u8]) -> Option<&Route> {
        self.route_index(path).map(|i| &self.routes[i])
    }

    /// The index in `routes` of [`Server::route`]'s answer.
    pub fn route_index(&self, path: &[u8]) -> Option<usize> {
        self.routes
            .iter()
            .position(|r| path.starts_with(r.prefix.as_bytes()))
    }
}

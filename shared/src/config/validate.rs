//! Cross-checks and path resolution: `raw::RawConfig -> Config`.
//!
//! Unlike ron, which stops at the first error, this collects every problem it finds.
//! serde does not keep positions, so an error here is located by finding the value it
//! is about in the source text (the n-th occurrence of the key or literal).

use super::cache::{
    CacheZone, RawCacheZone, RawRouteCache, RouteCache, MAX_INDEX_ENTRIES, MIN_INDEX_ENTRIES,
};
use super::error::{ConfigError, ConfigErrorKind, ConfigErrors};
use super::locate::locate;
use super::raw::{self, RawConfig, RawHandler, RawLogTarget, Workers};
use super::shaping::{FieldName, RawHost, RouteTimeouts, SentHost, Shaping};
use super::site::{Access, HeaderField};
use super::upstream::{over_capacity, validate_upstream, CapacityProblem, UpstreamProblem};
use super::{
    Config, ErrorPage, Handler, Listener, LogTarget, Route, Server, Upstream, UpstreamAddress,
};
use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// Half the region's worker slots: a reload runs two generations side by side.
const MAX_WORKERS: usize = crate::capacity::MAX_SLOTS / 2;

struct Checker<'a> {
    file: &'a Path,
    text: &'a str,
    errors: Vec<ConfigError>,
}

impl Checker<'_> {
    /// Records an error located at the `nth` (0-based) occurrence of `needle`; if the
    /// file does not spell it that way (a literal written with escapes), at the first
    /// occurrence of the field's key; at 1:1 if neither is there.
    fn error(&mut self, needle: &str, nth: usize, field: String, message: String) {
        let key = field.rsplit('.').next().unwrap_or(&field);
        let key = key.split('[').next().unwrap_or(key);
        let (line, col) = locate(self.text, needle, nth)
            .or_else(|| locate(self.text, key, 0))
            .unwrap_or((1, 1));
        self.errors.push(ConfigError {
            file: self.file.to_path_buf(),
            line,
            col,
            kind: ConfigErrorKind::Invalid { field, message },
        });
    }

    /// Records an error located at byte `offset` of the text.
    fn error_at(&mut self, offset: usize, field: String, message: String) {
        let (line, col) = line_col(self.text, offset);
        self.errors.push(ConfigError {
            file: self.file.to_path_buf(),
            line,
            col,
            kind: ConfigErrorKind::Invalid { field, message },
        });
    }
}

/// Byte offset of `"key"` written as a map key (followed by `:`), if any.
fn key_offset(text: &str, key: &str) -> Option<usize> {
    let quoted = format!("\"{key}\"");
    text.match_indices(&quoted)
        .map(|(offset, _)| offset)
        .find(|&offset| text[offset + quoted.len()..].trim_start().starts_with(':'))
}

/// Byte offset of the first `needle` at or after `from`, or `from` when there is none.
fn find_after(text: &str, from: usize, needle: &str) -> usize {
    text[from..].find(needle).map_or(from, |i| from + i)
}

/// 1-based line and column of byte `offset` of `text`.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let col = before.rfind('\n').map_or(offset, |nl| offset - nl - 1) + 1;
    (line, col)
}

/// `caches`: each zone's folder resolved and checked (it must be, or be made,
/// writable, as `temp_dir`), its bounds in range, no two zones in one folder.
fn cache_zones(
    check: &mut Checker,
    base: &Path,
    raw: Vec<(String, RawCacheZone)>,
) -> Vec<CacheZone> {
    let mut zones: Vec<CacheZone> = Vec::with_capacity(raw.len());
    for (name, z) in raw {
        let field = format!("caches.{name}");
        let path = resolve(base, &z.path);
        let quoted = format!("\"{}\"", z.path);
        if let Some(other) = zones.iter().find(|o| o.path == path) {
            check.error(
                &quoted,
                0,
                format!("{field}.path"),
                format!(
                    "{} is already the folder of cache zone `{}`: each zone needs its own",
                    path.display(),
                    other.name
                ),
            );
        } else if let Err(why) = crate::temp_dir::check(&path) {
            check.error(
                &quoted,
                0,
                format!("{field}.path"),
                format!("{}: {why}", path.display()),
            );
        }
        if z.max_size.0 == 0 {
            check.error(
                "max_size",
                0,
                format!("{field}.max_size"),
                "a cache zone of 0 bytes keeps nothing: remove the route's `cache` instead".into(),
            );
        }
        if !(MIN_INDEX_ENTRIES..=MAX_INDEX_ENTRIES).contains(&z.index_entries) {
            check.error(
                "index_entries",
                0,
                format!("{field}.index_entries"),
                format!(
                    "{} entries: a zone's index holds from {MIN_INDEX_ENTRIES} to {MAX_INDEX_ENTRIES}",
                    z.index_entries
                ),
            );
        }
        if z.inactive.0.as_secs() == 0 {
            check.error(
                "inactive",
                0,
                format!("{field}.inactive"),
                "`inactive` must be at least 1s".into(),
            );
        }
        zones.push(CacheZone {
            name,
            path,
            max_size: z.max_size.0,
            index_entries: z.index_entries,
            inactive: z.inactive.0,
        });
    }
    zones
}

/// Request fields a cached route does not forward (the cache answers them).
const CACHE_REMOVES: &[&str] = &["If-None-Match", "If-Modified-Since", "If-Range", "Range"];

/// A `Proxy` route's `cache`: its zone exists, its `valid` statuses can be stored.
fn route_cache(
    check: &mut Checker,
    zones: &[CacheZone],
    raw: RawRouteCache,
    literal: &str,
    nth: usize,
    rfield: &str,
) -> Option<Box<RouteCache>> {
    let field = format!("{rfield}.handler.cache");
    let Some(zone) = zones.iter().position(|z| z.name == raw.zone) else {
        let known: Vec<&str> = zones.iter().map(|z| z.name.as_str()).collect();
        check.error(
            literal,
            nth,
            format!("{field}.zone"),
            if known.is_empty() {
                format!("no cache zone named `{}`: `caches` is empty", raw.zone)
            } else {
                format!(
                    "no cache zone named `{}` (known: {})",
                    raw.zone,
                    known.join(", ")
                )
            },
        );
        return None;
    };
    let mut valid = Vec::with_capacity(raw.valid.len());
    for (status, d) in &raw.valid {
        let why = match *status {
            206 => Some(
                "partial content is never stored (a full response is, and ranges are cut from it)",
            ),
            304 => Some("a 304 refreshes a stored entry; it is not stored itself"),
            s if s != 0 && !(200..=599).contains(&s) => {
                Some("only final statuses (200 to 599, or 0 for any other) are stored")
            }
            s if valid.iter().any(|(v, _)| *v == s) => Some("is listed twice"),
            _ => None,
        };
        if let Some(why) = why {
            check.error(
                &status.to_string(),
                0,
                format!("{field}.valid"),
                format!("status {status}: {why}"),
            );
        }
        valid.push((*status, d.0.as_secs()));
    }
    Some(Box::new(RouteCache {
        zone,
        key: raw.key,
        valid,
        stale_if_error: raw.stale_if_error.0,
        stale_while_revalidate: raw.stale_while_revalidate.0,
        lock_timeout: raw.lock_timeout.0,
    }))
}

fn resolve(base: &Path, path: &str) -> PathBuf {
    let path = Path::new(path);
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        base.join(path)
    }
}

fn resolve_log(base: &Path, target: &RawLogTarget) -> LogTarget {
    match target {
        RawLogTarget::Stderr => LogTarget::Stderr,
        RawLogTarget::Stdout => LogTarget::Stdout,
        RawLogTarget::File(p) => LogTarget::File(resolve(base, p)),
        RawLogTarget::Syslog => LogTarget::Syslog,
    }
}

/// What a listen entry says of the PROXY protocol, as a `Listener` (its backlog left
/// 0); `refuse` is told what is wrong with it.
fn listen_proxy(entry: &raw::ListenAddr, refuse: &mut dyn FnMut(String)) -> Listener {
    let proxy = &entry.proxy;
    match &proxy.from {
        Some(_) if !proxy.on => refuse(format!(
            "{}: `proxy_protocol_from` without `proxy_protocol: true` has no effect",
            entry.written
        )),
        Some(from) if from.is_empty() => refuse(format!(
            "{}: `proxy_protocol_from: []` lets no peer connect (leave it out to accept the header from any peer)",
            entry.written
        )),
        _ => {}
    }
    Listener {
        addr: entry.addr,
        backlog: 0,
        proxy_protocol: proxy.on,
        proxy_protocol_from: proxy.from.clone().unwrap_or_default(),
        http2: entry.http2 == raw::Http2Listen::PriorKnowledge,
    }
}

/// A server's `h2_*` settings, each checked against what RFC 9113 allows and what
/// makes sense; `refuse` is told the key and what is wrong.
fn h2_settings(
    s: &raw::RawServer,
    max_header: u64,
    refuse: &mut dyn FnMut(&str, String),
) -> super::model::H2Settings {
    if !(1..=65_536).contains(&s.h2_max_concurrent_streams) {
        refuse(
            "h2_max_concurrent_streams",
            format!("{} is out of range 1..=65536", s.h2_max_concurrent_streams),
        );
    }
    let window = s.h2_initial_window.0;
    if !(1024..=(1 << 31) - 1).contains(&window) {
        refuse(
            "h2_initial_window",
            format!("{window} bytes is out of range 1KiB..=2GiB-1 (RFC 9113 §6.9.2)"),
        );
    }
    let list = s.h2_max_header_list.map_or(max_header, |l| l.0);
    if !(1024..=16 << 20).contains(&list) {
        refuse(
            "h2_max_header_list",
            format!("{list} bytes is out of range 1KiB..=16MiB"),
        );
    }
    if s.h2_idle_timeout.0.is_zero() {
        refuse(
            "h2_idle_timeout",
            "must be more than 0s (an idle connection would close at once)".into(),
        );
    }
    if s.h2_max_requests == 0 {
        refuse("h2_max_requests", "must be at least 1".into());
    }
    super::model::H2Settings {
        max_concurrent_streams: s.h2_max_concurrent_streams.clamp(1, 65_536),
        initial_window: window.clamp(1024, (1 << 31) - 1) as u32,
        max_header_list: list.clamp(1024, 16 << 20) as u32,
        idle_timeout: s.h2_idle_timeout.0,
        max_requests: s.h2_max_requests.max(1),
    }
}

/// Why `wanted` (a later server's entry) cannot share `l`'s address, first listed by
/// servers[`first`]: the PROXY header is read before the request (and before TLS), so
/// before the `Host` or SNI that would say which server's setting applies.
fn proxy_disagreement(l: &Listener, wanted: &Listener, first: usize) -> Option<String> {
    let addr = l.addr;
    if l.proxy_protocol != wanted.proxy_protocol {
        let (with, without) = match l.proxy_protocol {
            true => (format!("servers[{first}]"), "this one".to_string()),
            false => ("this one".to_string(), format!("servers[{first}]")),
        };
        return Some(format!(
            "{addr} has `proxy_protocol: true` in {with} and not in {without}: the header comes before the request, so every server on an address must say the same"
        ));
    }
    if l.http2 != wanted.http2 {
        return Some(format!(
            "{addr} has another `http2` in servers[{first}]: a connection speaks HTTP/2 before its request names a server, so every server on an address must say the same"
        ));
    }
    let same = |a: &[super::cidr::Cidr], b: &[super::cidr::Cidr]| a.iter().all(|c| b.contains(c));
    let (a, b) = (&l.proxy_protocol_from, &wanted.proxy_protocol_from);
    if !(same(a, b) && same(b, a)) {
        return Some(format!(
            "{addr} has another `proxy_protocol_from` in servers[{first}]: the header comes before the request, so every server on an address must list the same peers"
        ));
    }
    None
}

/// The certificate `running` loaded from the same two files, if any.
fn running_certificate(
    running: &Config,
    base: &Path,
    raw: &super::tls::RawCertificate,
) -> Option<super::tls::Certificate> {
    let (cert, key) = (base.join(&raw.cert), base.join(&raw.key));
    running
        .servers
        .iter()
        .filter_map(|s| s.tls.as_ref())
        .flat_map(|t| &t.certificates)
        .find(|c| c.cert_path == cert && c.key_path == key)
        .cloned()
}

/// The CPUs this process may run on, in ascending order.
fn allowed_cpus() -> Vec<usize> {
    use nix::sched::{sched_getaffinity, CpuSet};
    use nix::unistd::Pid;
    match sched_getaffinity(Pid::from_raw(0)) {
        Ok(set) => (0..CpuSet::count())
            .filter(|&cpu| set.is_set(cpu).unwrap_or(false))
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// The server's fields, then the route's: a route field replaces the server's of the
/// same name (case-insensitively), and one with an empty value only removes it.
fn merge_headers(server: &[HeaderField], route: &[HeaderField]) -> Vec<HeaderField> {
    let mut out: Vec<HeaderField> = server
        .iter()
        .filter(|h| {
            !h.value.is_empty() && !route.iter().any(|r| r.name.eq_ignore_ascii_case(&h.name))
        })
        .cloned()
        .collect();
    out.extend(route.iter().filter(|h| !h.value.is_empty()).cloned());
    out
}

/// Reads an error page, which must be a file below the configuration's folder.
fn load_error_page(base: &Path, page: &str) -> Result<(PathBuf, Vec<u8>), String> {
    let path = resolve(base, page);
    let inside = match (path.canonicalize(), base.canonicalize()) {
        (Ok(p), Ok(b)) => p.starts_with(b),
        (Err(e), _) => return Err(format!("`{}`: {e}", path.display())),
        (_, Err(e)) => return Err(format!("`{}`: {e}", base.display())),
    };
    if !inside {
        return Err(format!(
            "`{}` is not below the configuration's folder {}",
            path.display(),
            base.display()
        ));
    }
    if !path.is_file() {
        return Err(format!("`{}` is not a file", path.display()));
    }
    const MAX_PAGE: u64 = 1 << 20;
    if path.metadata().map_or(0, |m| m.len()) > MAX_PAGE {
        return Err(format!("`{}` is larger than 1MiB", path.display()));
    }
    std::fs::read(&path)
        .map(|body| (path.clone(), body))
        .map_err(|e| format!("`{}`: {e}", path.display()))
}

/// The media type of an error page, from its extension.
fn page_type(path: &Path) -> &'static str {
    match path.extension().and_then(|e| e.to_str()) {
        Some("html" | "htm") => "text/html; charset=utf-8",
        Some("json") => "application/json",
        Some("txt") => "text/plain; charset=utf-8",
        _ => "text/html",
    }
}

pub(super) fn validate(
    file: &Path,
    text: &str,
    mut raw: RawConfig,
    resolve_names: &super::Resolver<'_>,
    running: Option<&Config>,
) -> Result<Config, ConfigErrors> {
    let base = file.parent().unwrap_or(Path::new("/")).to_path_buf();
    let mut check = Checker {
        file,
        text,
        errors: Vec::new(),
    };

    let allowed = allowed_cpus();
    let workers = match raw.workers {
        Workers::Count(n) => n,
        Workers::Auto => NonZeroUsize::new(allowed.len()).unwrap_or(NonZeroUsize::MIN),
    };
    if workers.get() > MAX_WORKERS {
        check.error(
            "workers",
            0,
            "workers".into(),
            format!(
                "{workers} is more than the {MAX_WORKERS} workers the stats region has room for"
            ),
        );
    }
    let cpus = match raw.cpu_affinity {
        raw::CpuAffinity::Auto => allowed,
        raw::CpuAffinity::Off => Vec::new(),
    };
    if raw.rlimit_nofile == Some(0) {
        check.error(
            "rlimit_nofile",
            0,
            "rlimit_nofile".into(),
            "must be at least 1, or None to keep the inherited limit".into(),
        );
    }
    if let Some(user) = &raw.user {
        match nix::unistd::User::from_name(user) {
            Ok(Some(_)) => {}
            Ok(None) => check.error(
                &format!("\"{user}\""),
                0,
                "user".into(),
                format!("no user named `{user}` on this system"),
            ),
            Err(e) => check.error(
                &format!("\"{user}\""),
                0,
                "user".into(),
                format!("looking up user `{user}` failed: {e}"),
            ),
        }
    }
    if let Some(group) = &raw.group {
        match nix::unistd::Group::from_name(group) {
            Ok(Some(_)) => {}
            Ok(None) => check.error(
                &format!("\"{group}\""),
                0,
                "group".into(),
                format!("no group named `{group}` on this system"),
            ),
            Err(e) => check.error(
                &format!("\"{group}\""),
                0,
                "group".into(),
                format!("looking up group `{group}` failed: {e}"),
            ),
        }
        if raw.user.is_none() {
            check.error(
                "group:",
                0,
                "group".into(),
                "`group` needs `user`: workers only switch credentials when `user` is set".into(),
            );
        }
    }
    if raw.servers.is_empty() {
        check.error(
            "servers",
            0,
            "servers".into(),
            "at least one server is needed".into(),
        );
    }

    let mut upstreams: Vec<Upstream> = Vec::with_capacity(raw.upstreams.0.len());
    for (name, u) in raw.upstreams.0 {
        let key = key_offset(text, &name).unwrap_or(0);
        let field = |name: &str, key: &str| format!("upstreams.\"{name}\".{key}");
        match validate_upstream(&name, u, resolve_names) {
            Ok(u) => upstreams.push(u),
            Err(problems) => {
                for p in problems {
                    match p {
                        UpstreamProblem::NoServers => check.error_at(
                            find_after(text, key, "servers"),
                            field(&name, "servers"),
                            "at least one server is needed".into(),
                        ),
                        UpstreamProblem::ZeroKeepaliveRequests => check.error_at(
                            find_after(text, key, "keepalive_requests"),
                            field(&name, "keepalive_requests"),
                            "must be at least 1".into(),
                        ),
                        UpstreamProblem::Unresolved(addr, why) => check.error_at(
                            find_after(text, key, &format!("\"{addr}")),
                            field(&name, "servers"),
                            format!("cannot resolve `{addr}`: {why}"),
                        ),
                        UpstreamProblem::Check(what, why) => {
                            let block = match what {
                                "resolve_every" => key,
                                _ => find_after(text, key, "health_check"),
                            };
                            let path = match what {
                                "resolve_every" => what.to_string(),
                                _ => format!("health_check.{what}"),
                            };
                            check.error_at(find_after(text, block, what), field(&name, &path), why)
                        }
                        UpstreamProblem::OverloadBounds { min, max } => check.error_at(
                            find_after(text, find_after(text, key, "overload"), "min_limit"),
                            field(&name, "overload.min_limit"),
                            format!("min_limit {min} is above max_limit {max}"),
                        ),
                        UpstreamProblem::OnlyBackups => check.error_at(
                            find_after(text, key, "servers"),
                            field(&name, "servers"),
                            "every server is a backup: at least one must not be".into(),
                        ),
                        UpstreamProblem::ZeroFailTimeout => check.error_at(
                            find_after(text, key, "fail_timeout"),
                            field(&name, "fail_timeout"),
                            "must be more than 0 while max_fails is above 0".into(),
                        ),
                    }
                }
                // Keeps later indices right, so routes to it are not reported as unknown.
                upstreams.push(Upstream {
                    name,
                    servers: Vec::new(),
                    keepalive: 0,
                    keepalive_timeout: std::time::Duration::ZERO,
                    keepalive_requests: 1,
                    connect_timeout: std::time::Duration::ZERO,
                    send_timeout: std::time::Duration::ZERO,
                    read_timeout: std::time::Duration::ZERO,
                    retries: 0,
                    health_check: None,
                    resolve_every: std::time::Duration::ZERO,
                    tunnel_idle_timeout: std::time::Duration::ZERO,
                    overload: None,
                    balance: raw::Balance::RoundRobin,
                    max_fails: 0,
                    fail_timeout: std::time::Duration::ZERO,
                    slow_start: std::time::Duration::ZERO,
                });
            }
        }
    }

    for (ui, problem) in over_capacity(&upstreams) {
        let name = &upstreams[ui].name;
        let key = key_offset(text, name).unwrap_or(0);
        let server = |label: &str| find_after(text, key, &format!("\"{label}\""));
        match problem {
            CapacityProblem::LongName => check.error_at(
                key,
                format!("upstreams.\"{name}\""),
                format!(
                    "the name is {} bytes; the stats region's label table holds {}",
                    name.len(),
                    crate::capacity::UPSTREAM_NAME_BYTES
                ),
            ),
            CapacityProblem::LongLabel(label) => check.error_at(
                server(&label),
                format!("upstreams.\"{name}\".servers"),
                format!(
                    "`{label}` is {} bytes; the stats region's label table holds {}",
                    label.len(),
                    crate::capacity::SERVER_LABEL_BYTES
                ),
            ),
            CapacityProblem::TooMany { label, total } => check.error_at(
                server(&label),
                format!("upstreams.\"{name}\".servers"),
                format!(
                    "`{label}` is upstream server {} of {total}: the stats region has cells for {} (all upstreams together), and a server without one would be neither counted nor health-checked",
                    crate::capacity::UPSTREAM_CELLS + 1,
                    crate::capacity::UPSTREAM_CELLS
                ),
            ),
        }
    }

    let caches = cache_zones(&mut check, &base, std::mem::take(&mut raw.caches.0));

    let mut servers = Vec::with_capacity(raw.servers.len());
    let mut warnings: Vec<String> = Vec::new();
    let mut listeners: Vec<Listener> = Vec::new();
    // address -> index of the first server that listens on it
    let mut first_on: HashMap<std::net::SocketAddr, usize> = HashMap::new();
    // (address, name) -> index of the server that claimed it first
    let mut claimed: HashMap<(std::net::SocketAddr, String), usize> = HashMap::new();
    // How often each quoted literal has been met so far, to locate the n-th one.
    let mut literals: HashMap<String, usize> = HashMap::new();
    // `host: Upstream` routes met so far, to locate the n-th.
    let mut upstream_hosts = 0usize;
    let mut occurrence = |literal: &str| -> (String, usize) {
        let quoted = format!("\"{literal}\"");
        let count = literals.entry(quoted.clone()).or_default();
        *count += 1;
        (quoted, *count - 1)
    };
    for (si, s) in raw.servers.into_iter().enumerate() {
        let field = |name: &str| format!("servers[{si}].{name}");
        if s.listen.is_empty() {
            check.error(
                "listen",
                si,
                field("listen"),
                "at least one address is needed".into(),
            );
        }
        if s.backlog == 0 || s.backlog > 65535 {
            check.error(
                "backlog",
                si,
                field("backlog"),
                format!("{} is out of range 1..=65535", s.backlog),
            );
        }
        let max_header = s.max_header_bytes.0;
        if !(1024..=1 << 20).contains(&max_header) {
            check.error(
                "max_header_bytes",
                si,
                field("max_header_bytes"),
                format!("{max_header} bytes is out of range 1KiB..=1MiB"),
            );
        }
        let h2 = h2_settings(&s, max_header, &mut |key, why| {
            check.error(key, si, field(key), why)
        });
        let rated = s.min_body_rate.0 > 0 || s.min_send_rate.0 > 0;
        if rated && s.min_rate_grace.0 < std::time::Duration::from_secs(1) {
            // A rate measured over less than a second would close clients for a TCP
            // hiccup (and a zero period would never end).
            check.error(
                "min_rate_grace",
                si,
                field("min_rate_grace"),
                format!(
                    "{:?} is too short: a minimum rate is measured over at least 1s",
                    s.min_rate_grace.0
                ),
            );
        }
        let names: Vec<String> = s.names.iter().map(|n| n.to_ascii_lowercase()).collect();
        for name in &names {
            if name.is_empty() || name.contains(['/', ' ', ':']) {
                check.error(
                    &format!("\"{name}\""),
                    0,
                    field("names"),
                    format!("`{name}` is not a host name (no port, no path)"),
                );
            }
        }
        for entry in &s.listen {
            let addr = entry.addr;
            let (literal, nth) = occurrence(&entry.written);
            let wanted = listen_proxy(entry, &mut |message| {
                check.error(&literal, nth, field("listen"), message)
            });
            match listeners.iter_mut().find(|l| l.addr == addr) {
                Some(l) => {
                    l.backlog = l.backlog.max(s.backlog);
                    let first = first_on.get(&addr).copied().unwrap_or(si);
                    if let Some(message) = proxy_disagreement(l, &wanted, first) {
                        check.error(&literal, nth, field("listen"), message);
                    }
                }
                None => {
                    first_on.insert(addr, si);
                    // Loopback: only this host's processes (a local balancer) reach it.
                    let open = !addr.ip().is_loopback();
                    if open && wanted.proxy_protocol && wanted.proxy_protocol_from.is_empty() {
                        let (line, col) = locate(text, &literal, nth).unwrap_or((1, 1));
                        warnings.push(format!(
                            "{}:{line}:{col}: warning: {}: {addr} takes a PROXY protocol header from any peer, which may then name any client: list the balancers in proxy_protocol_from",
                            file.display(),
                            field("listen"),
                        ));
                    }
                    listeners.push(Listener {
                        addr,
                        backlog: s.backlog,
                        ..wanted
                    });
                }
            }
            for name in &names {
                if let Some(first) = claimed.insert((addr, name.clone()), si) {
                    check.error(
                        &format!("\"{name}\""),
                        1,
                        field("names"),
                        format!("`{name}` on {addr} is already served by servers[{first}]"),
                    );
                }
            }
        }

        // Before the routes: literals are located in the order they are written.
        let tls = s.tls.as_ref().map(|raw| {
            let mut certificates = Vec::with_capacity(raw.certificates.len());
            if raw.certificates.is_empty() {
                check.error(
                    "certificates",
                    0,
                    field("tls.certificates"),
                    "at least one (cert, key) is needed".into(),
                );
            }
            if raw.versions.is_empty() {
                check.error(
                    "versions",
                    0,
                    field("tls.versions"),
                    "at least one version is needed (Tls12, Tls13)".into(),
                );
            }
            for (ci, c) in raw.certificates.iter().enumerate() {
                let (literal, nth) = occurrence(&c.cert);
                let (key_literal, key_nth) = occurrence(&c.key);
                let at = locate(text, &literal, nth).unwrap_or((1, 1));
                let entry = format!("{}[{ci}]", field("tls.certificates"));
                let loaded = super::tls::load_certificate(&base, c).or_else(|problem| {
                    match (&problem, running) {
                        (super::tls::CertProblem::Read { source, .. }, Some(running))
                            if source.kind() == std::io::ErrorKind::PermissionDenied =>
                        {
                            running_certificate(running, &base, c).ok_or(problem)
                        }
                        _ => Err(problem),
                    }
                });
                match loaded {
                    Ok(cert) => {
                        if let Some(w) = super::tls::expiry_warning(&cert, SystemTime::now()) {
                            warnings.push(format!(
                                "{}:{}:{}: warning: {entry}: {w}",
                                file.display(),
                                at.0,
                                at.1
                            ));
                        }
                        certificates.push(cert);
                    }
                    Err(problem) => {
                        let (needle, n) = match &problem {
                            super::tls::CertProblem::Read { path, .. }
                            | super::tls::CertProblem::NoneFound { path, .. }
                            | super::tls::CertProblem::Pem { path, .. }
                            | super::tls::CertProblem::BadKey { path, .. }
                                if path.ends_with(&c.key) && !path.ends_with(&c.cert) =>
                            {
                                (&key_literal, key_nth)
                            }
                            _ => (&literal, nth),
                        };
                        check.error(needle, n, entry, problem.to_string());
                    }
                }
            }
            super::tls::Tls {
                certificates,
                versions: raw.versions.clone(),
                session_tickets: raw.session_tickets,
                http2: raw.http2,
            }
        });
        let mut error_pages = Vec::new();
        for (status, page) in &s.error_pages {
            let (literal, nth) = occurrence(page);
            match load_error_page(&base, page) {
                Ok((path, body)) => error_pages.push(ErrorPage {
                    status: status.0,
                    content_type: page_type(&path),
                    path,
                    body,
                }),
                Err(message) => check.error(
                    &literal,
                    nth,
                    format!("{}[{}]", field("error_pages"), status.0),
                    message,
                ),
            }
        }
        if s.routes.is_empty() {
            check.error(
                "routes",
                si,
                field("routes"),
                "at least one route is needed".into(),
            );
        }
        let mut routes: Vec<Route> = Vec::with_capacity(s.routes.len());
        for (ri, r) in s.routes.into_iter().enumerate() {
            let rfield = format!("servers[{si}].routes[{ri}]");
            let (prefix_literal, prefix_nth) = occurrence(&r.prefix.0);
            if routes.iter().any(|seen| seen.prefix == r.prefix.0) {
                check.error(
                    &prefix_literal,
                    prefix_nth,
                    format!("{rfield}.prefix"),
                    format!("prefix `{}` is routed twice", r.prefix.0),
                );
            }
            let handler = match r.handler {
                RawHandler::Liveness => Handler::Liveness,
                RawHandler::Readiness => Handler::Readiness,
                RawHandler::Status => Handler::Status,
                RawHandler::Metrics => Handler::Metrics,
                RawHandler::Purge { zone, key } => {
                    let found = caches.iter().position(|z| z.name == zone);
                    if found.is_none() {
                        let (literal, nth) = occurrence(&zone);
                        check.error(
                            &literal,
                            nth,
                            format!("{rfield}.handler.zone"),
                            format!("no cache zone named `{zone}`"),
                        );
                    }
                    Handler::Purge {
                        zone: found.unwrap_or(0),
                        key,
                    }
                }
                RawHandler::Static {
                    root,
                    index,
                    fallback,
                    max_ranges,
                    precompressed,
                    compress,
                } => {
                    if let Some(c) = compress {
                        if !(1..=9).contains(&c.level) {
                            check.error(
                                "level",
                                0,
                                format!("{rfield}.handler.compress.level"),
                                format!("gzip level {} is out of range 1..=9", c.level),
                            );
                        }
                    }
                    let dir = resolve(&base, &root);
                    let (root_literal, root_nth) = occurrence(&root);
                    if !dir.is_dir() {
                        check.error(
                            &root_literal,
                            root_nth,
                            format!("{rfield}.handler.root"),
                            format!("`{}` is not a directory", dir.display()),
                        );
                    }
                    for name in &index {
                        if name.is_empty() || name.contains('/') {
                            check.error(
                                &format!("\"{name}\""),
                                0,
                                format!("{rfield}.handler.index"),
                                format!("`{name}` must be a plain file name"),
                            );
                        }
                    }
                    if let Some(f) = &fallback {
                        let clean = f.starts_with('/')
                            && !f.ends_with('/')
                            && f.split('/')
                                .skip(1)
                                .all(|s| !s.is_empty() && s != "." && s != "..")
                            && !f.contains(['%', '\\', '?', '#', '\0']);
                        if !clean {
                            check.error(
                                &format!("\"{f}\""),
                                0,
                                format!("{rfield}.handler.fallback"),
                                format!(
                                    "`{f}` must be a normalised file path such as \"/index.html\""
                                ),
                            );
                        } else if !dir.join(&f[1..]).is_file() {
                            check.error(
                                &format!("\"{f}\""),
                                0,
                                format!("{rfield}.handler.fallback"),
                                format!("`{}` is not a file", dir.join(&f[1..]).display()),
                            );
                        }
                    }
                    Handler::Static {
                        root: dir,
                        index,
                        fallback,
                        max_ranges,
                        precompressed,
                        compress: compress.map(|c| super::Compress {
                            min_size: c.min_size.0,
                            level: c.level,
                        }),
                    }
                }
                RawHandler::Redirect { to, status } => Handler::Redirect {
                    to,
                    status: status.0,
                },
                RawHandler::Return {
                    status,
                    body,
                    content_type,
                } => {
                    if matches!(status.0, 204 | 304) && !body.is_empty() {
                        check.error(
                            "body",
                            0,
                            format!("{rfield}.handler.body"),
                            format!("a {} response has no body", status.0),
                        );
                    }
                    if content_type.is_empty()
                        || content_type.bytes().any(|b| b < b' ' || b == 0x7f)
                    {
                        check.error(
                            "content_type",
                            0,
                            format!("{rfield}.handler.content_type"),
                            format!("`{}` is not a media type", content_type.escape_debug()),
                        );
                    }
                    Handler::Return {
                        status: status.0,
                        body,
                        content_type,
                    }
                }
                RawHandler::Proxy {
                    upstream,
                    upgrade,
                    buffering,
                    request_buffering,
                    path,
                    host,
                    set_headers,
                    remove_headers,
                    connect_timeout,
                    send_timeout,
                    read_timeout,
                    cache,
                } => {
                    let cache = cache.and_then(|c| {
                        let (literal, nth) = occurrence(&c.zone);
                        route_cache(&mut check, &caches, *c, &literal, nth, &rfield)
                    });
                    // The cache answers the client's conditional and range requests
                    // from whole responses: the application is asked for those
                    // (revalidations carry the entry's own validators).
                    let mut remove_headers = remove_headers;
                    if cache.is_some() {
                        for name in CACHE_REMOVES {
                            let named = remove_headers
                                .iter()
                                .chain(set_headers.iter().map(|h| &h.name))
                                .any(|n| n.0.eq_ignore_ascii_case(name));
                            if !named {
                                remove_headers.push(FieldName((*name).into()));
                            }
                        }
                    }
                    let (literal, nth) = occurrence(&upstream);
                    let found = upstreams.iter().position(|u| u.name == upstream);
                    if found.is_none() {
                        let known: Vec<&str> = upstreams.iter().map(|u| u.name.as_str()).collect();
                        check.error(
                            &literal,
                            nth,
                            format!("{rfield}.handler.upstream"),
                            if known.is_empty() {
                                format!("no upstream named `{upstream}`: `upstreams` is empty")
                            } else {
                                format!(
                                    "no upstream named `{upstream}` (known: {})",
                                    known.join(", ")
                                )
                            },
                        );
                    }
                    let host = match host {
                        RawHost::Client => SentHost::Client,
                        RawHost::Fixed(h) => SentHost::Fixed(h.0),
                        RawHost::Upstream => {
                            upstream_hosts += 1;
                            let servers = found.map_or(&[][..], |i| &upstreams[i].servers[..]);
                            match servers {
                                [one] => SentHost::Fixed(match one.addr {
                                    // nginx's `$proxy_host` for a unix socket.
                                    UpstreamAddress::Unix(_) => "localhost".into(),
                                    UpstreamAddress::Tcp(_) => one.label.clone(),
                                }),
                                _ => {
                                    if found.is_some() {
                                        check.error(
                                            "Upstream",
                                            upstream_hosts - 1,
                                            format!("{rfield}.handler.host"),
                                            format!(
                                                "`host: Upstream` names the upstream's server, and `{upstream}` has {}: write the name with Fixed(\"...\")",
                                                servers.len()
                                            ),
                                        );
                                    }
                                    SentHost::Client
                                }
                            }
                        }
                    };
                    let mut seen: Vec<String> = Vec::new();
                    let names = set_headers
                        .iter()
                        .map(|h| (&h.name, "set_headers"))
                        .chain(remove_headers.iter().map(|n| (n, "remove_headers")));
                    for (name, key) in names {
                        let (literal, nth) = occurrence(&name.0);
                        let lower = name.0.to_ascii_lowercase();
                        if seen.contains(&lower) {
                            check.error(
                                &literal,
                                nth,
                                format!("{rfield}.handler.{key}"),
                                format!(
                                    "header `{}` is set or removed twice by this route",
                                    name.0
                                ),
                            );
                        }
                        seen.push(lower);
                    }
                    Handler::Proxy {
                        upstream: found.unwrap_or(0),
                        upgrade,
                        buffering,
                        request_buffering,
                        shaping: Shaping {
                            path,
                            host,
                            set_headers,
                            remove_headers,
                            timeouts: RouteTimeouts::of(
                                connect_timeout,
                                send_timeout,
                                read_timeout,
                            ),
                        },
                        cache,
                    }
                }
            };
            let probe = matches!(handler, Handler::Liveness | Handler::Readiness);
            // Probes and stats are for machines: no site header fields on them.
            let monitoring = probe
                || matches!(
                    handler,
                    Handler::Status | Handler::Metrics | Handler::Purge { .. }
                );
            let headers = if monitoring {
                Vec::new()
            } else {
                merge_headers(&s.headers, &r.headers)
            };
            let own = Access {
                allow: r.allow,
                deny: r.deny,
            };
            let access = if own.is_open() && !probe {
                Access {
                    allow: s.allow.clone(),
                    deny: s.deny.clone(),
                }
            } else {
                own
            };
            let mut header_block = Vec::new();
            for h in &headers {
                header_block.extend_from_slice(h.name.as_bytes());
                header_block.extend_from_slice(b": ");
                header_block.extend_from_slice(h.value.as_bytes());
                header_block.extend_from_slice(b"\r\n");
            }
            routes.push(Route {
                prefix: r.prefix.0,
                handler,
                priority: r.priority,
                limits: r.limits,
                headers,
                header_block,
                access,
            });
        }
        routes.sort_by_key(|r| std::cmp::Reverse(r.prefix.len()));

        servers.push(Server {
            listen: s.listen.iter().map(|l| l.addr).collect(),
            names,
            tls,
            access_log: s.access_log.as_ref().map(|t| resolve_log(&base, t)),
            access_log_format: s.access_log_format,
            keepalive_timeout: s.keepalive_timeout.0,
            keepalive_requests: s.keepalive_requests,
            header_timeout: s.header_timeout.0,
            body_timeout: s.body_timeout.0,
            send_timeout: s.send_timeout.0,
            max_header_bytes: max_header as usize,
            max_body_bytes: s.max_body_bytes.0,
            min_body_rate: s.min_body_rate.0,
            min_send_rate: s.min_send_rate.0,
            min_rate_grace: s.min_rate_grace.0,
            limits: s.limits,
            trusted_proxies: s.trusted_proxies,
            real_ip_header: s.real_ip_header,
            routes,
            error_pages,
            h2,
        });
    }

    for l in &listeners {
        let on: Vec<&Server> = servers
            .iter()
            .filter(|s| s.listen.contains(&l.addr))
            .collect();
        let tls = on.iter().filter(|s| s.tls.is_some()).count();
        if tls > 0 && tls < on.len() {
            let addr = l.addr.to_string();
            check.error(
                &format!("\"{addr}\""),
                0,
                "servers.listen".into(),
                format!("{addr} is served with `tls` by some servers and without by others: an address is all HTTPS or all plain HTTP"),
            );
        }
        if tls > 0 && l.http2 {
            let addr = l.addr.to_string();
            check.error(
                &format!("\"{addr}\""),
                0,
                "servers.listen".into(),
                format!("{addr}: `http2: PriorKnowledge` is for plain addresses; over TLS, HTTP/2 is offered by ALPN (`tls: Some((..., http2: true))`)"),
            );
        }
    }

    let temp_dir = resolve(&base, &raw.temp_dir);
    // Only a configuration that buffers proxied bodies uses it: a site without
    // `Proxy` routes does not depend on a folder it never writes.
    let spools = servers
        .iter()
        .any(|s| s.routes.iter().any(|r| r.handler.spools()));
    let usable = if spools {
        crate::temp_dir::check(&temp_dir).and_then(|()| {
            match workers_credentials(raw.user.as_deref(), raw.group.as_deref()) {
                Some((uid, gid)) => crate::temp_dir::check_reachable(&temp_dir, uid, gid),
                None => Ok(()),
            }
        })
    } else {
        Ok(())
    };
    if let Err(why) = usable {
        check.error(
            "temp_dir",
            0,
            "temp_dir".into(),
            format!("{}: {why}", temp_dir.display()),
        );
    }

    if raw.file_threads > MAX_FILE_THREADS {
        check.error(
            "file_threads",
            0,
            "file_threads".into(),
            format!(
                "{} threads per worker: at most {MAX_FILE_THREADS} (0: files are opened on the event loop)",
                raw.file_threads
            ),
        );
    }

    if !check.errors.is_empty() {
        check.errors.sort_by_key(|e| (e.line, e.col));
        return Err(ConfigErrors(check.errors));
    }
    Ok(Config {
        file: file.to_path_buf(),
        workers_setting: raw.workers,
        cpu_affinity: raw.cpu_affinity,
        workers,
        cpus,
        accept: raw.accept,
        worker_connections: raw.worker_connections,
        multi_accept: raw.multi_accept,
        rlimit_nofile: raw.rlimit_nofile,
        user: raw.user,
        group: raw.group,
        pid_file: resolve(&base, &raw.pid_file),
        shm_file: resolve(&base, &raw.shm_file),
        error_log: resolve_log(&base, &raw.error_log),
        log_level: raw.log_level,
        drain_timeout: raw.drain_timeout.0,
        shutdown_delay: raw.shutdown_delay.0,
        upgrade_timeout: raw.upgrade_timeout.0,
        compress_cache: raw.compress_cache.0 as usize,
        file_threads: raw.file_threads,
        temp_dir,
        max_temp_file_size: raw.max_temp_file_size.0,
        temp_max_bytes: raw.temp_max_bytes.0,
        servers,
        upstreams,
        caches,
        listeners,
        warnings,
    })
}

/// The most `file_threads` a worker may start: file work is a few system calls
/// per job, and a disk queue saturates long before this.
const MAX_FILE_THREADS: usize = 64;

/// The uid and gid workers drop to (`worker/src/setup.rs`) when this process can
/// switch to them (root); `None`: they keep this process's credentials, or the
/// names do not resolve (reported on their own keys).
fn workers_credentials(user: Option<&str>, group: Option<&str>) -> Option<(u32, u32)> {
    if !nix::unistd::geteuid().is_root() {
        return None;
    }
    let user = nix::unistd::User::from_name(user?).ok()??;
    let gid = match group {
        None => user.gid,
        Some(g) => nix::unistd::Group::from_name(g).ok()??.gid,
    };
    Some((user.uid.as_raw(), gid.as_raw()))
}

#[cfg(test)]
mod tests {
    use super::super::{AcceptMode, Config, ConfigErrorKind, Handler};
    use std::path::Path;

    fn site() -> tempdir::Dir {
        tempdir::Dir::new()
    }

    /// A throwaway directory for configs whose `root` must exist.
    mod tempdir {
        pub struct Dir(pub std::path::PathBuf);
        impl Dir {
            pub fn new() -> Dir {
                use std::sync::atomic::{AtomicUsize, Ordering};
                static N: AtomicUsize = AtomicUsize::new(0);
                let p = std::env::temp_dir().join(format!(
                    "forkd-config-test-{}-{}",
                    std::process::id(),
                    N.fetch_add(1, Ordering::Relaxed)
                ));
                std::fs::create_dir_all(p.join("www")).unwrap();
                Dir(p)
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    fn parse(dir: &Path, text: &str) -> Result<Config, String> {
        Config::parse(&dir.join("forkd.ron"), text).map_err(|e| e.to_string())
    }

    const MINIMAL: &str = r#"(
    servers: [(
        listen: ["127.0.0.1:8080"],
        routes: [(prefix: "/", handler: Static(root: "www"))],
    )],
)"#;

    #[test]
    fn minimal_config_gets_documented_defaults() {
        let d = site();
        let c = parse(&d.0, MINIMAL).unwrap();
        assert_eq!(c.accept, AcceptMode::Shared);
        assert_eq!(c.worker_connections.get(), 10240);
        assert_eq!(c.file_threads, 4);
        assert_eq!(c.pid_file, d.0.join("run/forkd.pid"));
        let s = &c.servers[0];
        assert_eq!(s.max_header_bytes, 16384);
        assert_eq!(s.max_body_bytes, 1 << 20);
        assert_eq!(s.keepalive_timeout.as_secs(), 15);
        assert_eq!((s.min_body_rate, s.min_send_rate), (1024, 1024));
        assert_eq!(s.min_rate_grace.as_secs(), 10);
        assert_eq!(
            s.routes[0].handler,
            Handler::Static {
                root: d.0.join("www"),
                index: vec!["index.html".into()],
                fallback: None,
                max_ranges: 16,
                precompressed: false,
                compress: None,
            }
        );
    }

    #[test]
    fn file_threads_is_bounded() {
        let d = site();
        let off = parse(&d.0, &MINIMAL.replacen("(", "(file_threads: 0,", 1)).unwrap();
        assert_eq!(off.file_threads, 0);
        let err = parse(&d.0, &MINIMAL.replacen("(", "(\n    file_threads: 65,", 1)).unwrap_err();
        assert!(err.contains("forkd.ron:2:"), "{err}");
        assert!(err.contains("file_threads"), "{err}");
    }

    #[test]
    fn unknown_key_is_rejected_with_position() {
        let d = site();
        let text = MINIMAL.replace("listen:", "lisen: [], listen:");
        let err = parse(&d.0, &text).unwrap_err();
        assert!(err.contains("forkd.ron:3:"), "{err}");
        assert!(err.contains("lisen"), "{err}");
    }

    #[test]
    fn bad_duration_points_at_its_line() {
        let d = site();
        let text = MINIMAL.replace(
            "listen:",
            "keepalive_timeout: \"15 parsecs\",\n        listen:",
        );
        let err = parse(&d.0, &text).unwrap_err();
        assert!(err.contains("forkd.ron:3:"), "{err}");
        assert!(err.contains("unknown unit"), "{err}");
    }

    #[test]
    fn http2_settings_take_nginx_like_defaults_and_bounds_are_located() {
        let d = site();
        let c = parse(&d.0, MINIMAL).unwrap();
        let h2 = c.servers[0].h2;
        assert_eq!(
            (
                h2.max_concurrent_streams,
                h2.initial_window,
                h2.max_header_list
            ),
            (128, 64 * 1024, 16384),
            "the header list bound defaults to max_header_bytes"
        );
        assert_eq!((h2.idle_timeout.as_secs(), h2.max_requests), (180, 1000));
        assert!(!c.listeners[0].http2, "h2c is off unless asked for");
        let text = MINIMAL.replace(
            "listen: [\"127.0.0.1:8080\"],",
            "listen: [(addr: \"127.0.0.1:8080\", http2: PriorKnowledge)],\n        h2_max_concurrent_streams: 0,\n        h2_initial_window: \"4GiB\",\n        h2_max_requests: 0,",
        );
        let err = parse(&d.0, &text).unwrap_err();
        for (line, key) in [
            (4, "h2_max_concurrent_streams"),
            (5, "h2_initial_window"),
            (6, "h2_max_requests"),
        ] {
            assert!(
                err.contains(&format!("forkd.ron:{line}:")) && err.contains(key),
                "{key}: {err}"
            );
        }
        let text = MINIMAL.replace(
            "listen: [\"127.0.0.1:8080\"],",
            "listen: [(addr: \"127.0.0.1:8080\", http2: PriorKnowledge)],",
        );
        let c = parse(&d.0, &text).unwrap();
        assert!(c.listeners[0].http2);
    }

    #[test]
    fn every_semantic_error_is_reported() {
        let d = site();
        let text = r#"(
    servers: [(
        listen: ["127.0.0.1:8080"],
        backlog: 0,
        routes: [
            (prefix: "/", handler: Static(root: "missing")),
            (prefix: "/", handler: Liveness),
        ],
    )],
)"#;
        let err = parse(&d.0, text).unwrap_err();
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 3, "{err}");
        assert!(
            lines[0].contains("forkd.ron:4:9: servers[0].backlog"),
            "{err}"
        );
        assert!(
            lines[1].contains(":6:") && lines[1].contains("not a directory"),
            "{err}"
        );
        assert!(
            lines[2].contains(":7:") && lines[2].contains("routed twice"),
            "{err}"
        );
    }

    #[test]
    fn routes_are_matched_longest_prefix_first() {
        let d = site();
        let text = MINIMAL.replace(
            "routes: [",
            "routes: [(prefix: \"/healthz\", handler: Liveness),",
        );
        let c = parse(&d.0, &text).unwrap();
        let s = &c.servers[0];
        assert_eq!(s.route(b"/healthz").unwrap().handler, Handler::Liveness);
        assert!(matches!(
            s.route(b"/index.html").unwrap().handler,
            Handler::Static { .. }
        ));
    }

    #[test]
    fn listen_addresses_are_merged_with_largest_backlog() {
        let d = site();
        let text = r#"(
    servers: [
        (listen: ["127.0.0.1:8080"], backlog: 100, names: ["a"], routes: [(prefix: "/", handler: Liveness)]),
        (listen: ["127.0.0.1:8080", "*:9090"], backlog: 200, names: ["b"], routes: [(prefix: "/", handler: Liveness)]),
    ],
)"#;
        let c = parse(&d.0, text).unwrap();
        assert_eq!(c.listeners.len(), 2);
        assert_eq!(c.listeners[0].backlog, 200);
        assert_eq!(c.listeners[1].addr, "0.0.0.0:9090".parse().unwrap());
    }

    #[test]
    fn proxy_protocol_from_is_kept_per_address_and_its_absence_warned_off_loopback() {
        use super::super::ProxyHeader;
        let d = site();
        let text = r#"(
    servers: [
        (listen: [(addr: "*:9090", proxy_protocol: true, proxy_protocol_from: ["10.0.0.0/8", "::1"])], names: ["a"], routes: [(prefix: "/", handler: Liveness)]),
        (listen: [(addr: "0.0.0.0:9090", proxy_protocol: true, proxy_protocol_from: ["::1", "10.0.0.0/8"])], names: ["b"], routes: [(prefix: "/", handler: Liveness)]),
        (listen: ["127.0.0.1:8080", (addr: "127.0.0.1:8081", proxy_protocol: true), (addr: "0.0.0.0:8082", proxy_protocol: true)], routes: [(prefix: "/", handler: Liveness)]),
    ],
)"#;
        let c = parse(&d.0, text).unwrap();
        let header = |l: usize, peer: &str| c.listeners[l].proxy_header(peer.parse().unwrap());
        assert_eq!(header(0, "10.1.2.3"), ProxyHeader::Expected);
        assert_eq!(header(0, "::ffff:10.1.2.3"), ProxyHeader::Expected);
        assert_eq!(header(0, "127.0.0.1"), ProxyHeader::Untrusted);
        assert_eq!(header(1, "10.1.2.3"), ProxyHeader::Off);
        assert_eq!(header(2, "192.0.2.1"), ProxyHeader::Expected);
        // Only the address others can reach is warned of, at its entry.
        assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
        assert!(c.warnings[0].contains("forkd.ron:5:"), "{:?}", c.warnings);
        assert!(c.warnings[0].contains("0.0.0.0:8082"), "{:?}", c.warnings);
        let none = text.replace(r#"["::1", "10.0.0.0/8"]"#, "[]");
        let err = parse(&d.0, &none).unwrap_err();
        assert!(
            err.contains("forkd.ron:4:") && err.contains("lets no peer connect"),
            "{err}"
        );
    }

    const PROXY: &str = r#"(
    upstreams: {
        "app": (
            servers: ["127.0.0.1:9000", "unix:/run/app.sock"],
            keepalive: 8,
            read_timeout: "5s",
        ),
    },
    servers: [(
        listen: ["127.0.0.1:8080"],
        routes: [
            (prefix: "/api/", handler: Proxy(upstream: "app")),
            (prefix: "/", handler: Static(root: "www")),
        ],
    )],
)"#;

    #[test]
    fn cache_zones_and_route_caches_are_checked_with_their_location() {
        let d = site();
        let with = |top: &str, cache: &str| {
            PROXY
                .replace("    upstreams: {", &format!("    {top}\n    upstreams: {{"))
                .replace(
                    "Proxy(upstream: \"app\")",
                    &format!("Proxy(upstream: \"app\", cache: {cache})"),
                )
        };
        let zone = r#"caches: { "pages": (path: "cache/pages", max_size: "1GiB") },"#;
        let c = parse(
            &d.0,
            &with(
                zone,
                r#"Some((zone: "pages", valid: [(200, "10m"), (0, "1m")]))"#,
            ),
        )
        .unwrap();
        assert_eq!(c.caches.len(), 1);
        assert_eq!(c.caches[0].index_entries, 100_000);
        assert!(c.caches[0].path.ends_with("cache/pages"));
        let Handler::Proxy {
            cache: Some(rc),
            shaping,
            ..
        } = &c.servers[0].route(b"/api/x").unwrap().handler
        else {
            panic!("a cached proxy route");
        };
        assert_eq!(rc.valid, vec![(200, 600), (0, 60)]);
        assert_eq!(rc.lock_timeout.as_secs(), 5);
        assert_eq!(rc.stale_if_error.as_secs(), 0);
        let removed: Vec<&str> = shaping
            .remove_headers
            .iter()
            .map(|n| n.0.as_str())
            .collect();
        assert_eq!(
            removed,
            ["If-None-Match", "If-Modified-Since", "If-Range", "Range"]
        );

        let e = parse(&d.0, &with(zone, r#"Some((zone: "page"))"#)).unwrap_err();
        assert!(
            e.contains("no cache zone named `page` (known: pages)"),
            "{e}"
        );
        assert!(
            e.contains("forkd.ron:13:82:"),
            "located at the zone it names: {e}"
        );
        let e = parse(
            &d.0,
            &with(zone, r#"Some((zone: "pages", valid: [(206, "1m")]))"#),
        )
        .unwrap_err();
        assert!(
            e.contains("status 206: partial content is never stored"),
            "{e}"
        );
        let e = parse(&d.0, &with(zone, r#"Some((zone: "pages", key: "{host}"))"#)).unwrap_err();
        assert!(e.contains("neither {uri} nor {path}"), "{e}");
        let two = r#"caches: { "a": (path: "c", max_size: "1MiB"), "b": (path: "c", max_size: "1MiB", index_entries: 10) },"#;
        let e = parse(&d.0, &with(two, "None")).unwrap_err();
        assert!(e.contains("already the folder of cache zone `a`"), "{e}");
        assert!(
            e.contains("10 entries: a zone's index holds from 64"),
            "{e}"
        );
        let e = parse(
            &d.0,
            &with(r#"caches: { "a": (path: "c", max_size: 0) },"#, "None"),
        )
        .unwrap_err();
        assert!(e.contains("a cache zone of 0 bytes keeps nothing"), "{e}");
    }

    #[test]
    fn proxy_routes_name_an_upstream_with_documented_defaults() {
        let d = site();
        let c = parse(&d.0, PROXY).unwrap();
        assert_eq!(c.upstreams.len(), 1);
        let u = &c.upstreams[0];
        assert_eq!(u.name, "app");
        assert_eq!(
            u.servers
                .iter()
                .map(|s| s.label.as_str())
                .collect::<Vec<_>>(),
            ["127.0.0.1:9000", "unix:/run/app.sock"]
        );
        assert_eq!(u.keepalive, 8);
        assert_eq!(u.keepalive_timeout.as_secs(), 4);
        assert_eq!(u.keepalive_requests, 1000);
        assert_eq!(u.connect_timeout.as_secs(), 1);
        assert_eq!(u.send_timeout.as_secs(), 30);
        assert_eq!(u.read_timeout.as_secs(), 5);
        assert_eq!(u.retries, 1);
        assert_eq!(u.tunnel_idle_timeout.as_secs(), 3600);
        assert_eq!(
            c.servers[0].route(b"/api/x").unwrap().handler,
            Handler::Proxy {
                upstream: 0,
                upgrade: false,
                buffering: true,
                request_buffering: true,
                shaping: Default::default(),
                cache: None,
            }
        );
        let off = PROXY.replace(
            "Proxy(upstream: \"app\")",
            "Proxy(upstream: \"app\", buffering: false, request_buffering: false)",
        );
        assert_eq!(
            parse(&d.0, &off).unwrap().servers[0]
                .route(b"/api/x")
                .unwrap()
                .handler,
            Handler::Proxy {
                upstream: 0,
                upgrade: false,
                buffering: false,
                request_buffering: false,
                shaping: Default::default(),
                cache: None,
            }
        );
        assert_eq!(c.max_temp_file_size, 1 << 30);
        assert!(c.temp_dir.ends_with("run/tmp"));
    }

    #[test]
    fn a_proxy_route_may_allow_upgrades_and_the_upstream_bounds_idle_tunnels() {
        let d = site();
        let text = PROXY
            .replace(
                "Proxy(upstream: \"app\")",
                "Proxy(upstream: \"app\", upgrade: true)",
            )
            .replace(
                "keepalive: 8,",
                "keepalive: 8, tunnel_idle_timeout: \"90s\",",
            );
        let c = parse(&d.0, &text).unwrap();
        assert_eq!(c.upstreams[0].tunnel_idle_timeout.as_secs(), 90);
        assert_eq!(
            c.servers[0].route(b"/api/x").unwrap().handler,
            Handler::Proxy {
                upstream: 0,
                upgrade: true,
                buffering: true,
                request_buffering: true,
                shaping: Default::default(),
                cache: None,
            }
        );
        let bad = PROXY.replace("keepalive: 8,", "tunnel_idle_timeout: \"soon\",");
        assert!(parse(&d.0, &bad).is_err());
    }

    #[test]
    fn a_proxy_route_shapes_its_request_and_overrides_timeouts() {
        use crate::config::shaping::{SentHost, ValuePart};
        let d = site();
        let text = PROXY.replace(
            "Proxy(upstream: \"app\")",
            "Proxy(upstream: \"app\", path: Some(\"/v1/{path}\"), host: Fixed(\"app.internal\"), set_headers: [(\"X-Real-IP\", \"{client_ip}\")], remove_headers: [\"X-Debug\"], read_timeout: Some(\"300s\"))",
        );
        let c = parse(&d.0, &text).unwrap();
        let Handler::Proxy { shaping, .. } = &c.servers[0].route(b"/api/x").unwrap().handler else {
            panic!("not a proxy route");
        };
        assert_eq!(shaping.path.as_ref().unwrap().before, "/v1/");
        assert_eq!(shaping.host, SentHost::Fixed("app.internal".into()));
        assert_eq!(shaping.set_headers[0].value, [ValuePart::ClientIp]);
        assert_eq!(shaping.remove_headers[0].0, "X-Debug");
        let t = c.upstreams[0].timeouts(&shaping.timeouts);
        assert_eq!(
            (t.connect.as_secs(), t.send.as_secs(), t.read.as_secs()),
            (1, 30, 300)
        );
        // One server: `Upstream` is its address as written.
        let one = text
            .replace(
                "[\"127.0.0.1:9000\", \"unix:/run/app.sock\"]",
                "[\"127.0.0.1:9000\"]",
            )
            .replace("Fixed(\"app.internal\")", "Upstream");
        let c = parse(&d.0, &one).unwrap();
        let Handler::Proxy { shaping, .. } = &c.servers[0].route(b"/api/x").unwrap().handler else {
            panic!("not a proxy route");
        };
        assert_eq!(shaping.host, SentHost::Fixed("127.0.0.1:9000".into()));
    }

    #[test]
    fn bad_shaping_is_located_where_written() {
        let d = site();
        // (the route's keys, where the error must be reported, words of the message)
        let cases = [
            (r#"path: Some("/v1/{uri}")"#, "forkd.ron:12:", "unknown placeholder `{uri}`"),
            (r#"path: Some("v1/{path}")"#, "forkd.ron:12:", "must start with `/`"),
            (r#"host: Fixed("a b")"#, "forkd.ron:12:", "is not a host"),
            (r#"set_headers: [("X-A", "{remote_addr}")]"#, "forkd.ron:12:", "unknown placeholder `{remote_addr}` (known: {client_ip} {host} {scheme} {request_id})"),
            (r#"set_headers: [("Content-Length", "1")]"#, "forkd.ron:12:", "frames the body"),
            (r#"remove_headers: ["Connection"]"#, "forkd.ron:12:", "hop-by-hop"),
            (r#"remove_headers: ["Host"]"#, "forkd.ron:12:", "`host:` key"),
            (r#"read_timeout: Some("soon")"#, "forkd.ron:12:", "soon"),
            (
                r#"host: Upstream"#,
                "forkd.ron:12:69: servers[0].routes[0].handler.host",
                "`app` has 2",
            ),
            (
                r#"set_headers: [("X-A", "1")], remove_headers: ["x-a"]"#,
                "forkd.ron:12:109: servers[0].routes[0].handler.remove_headers",
                "set or removed twice",
            ),
        ];
        for (keys, at, words) in cases {
            let text = PROXY.replace(
                "Proxy(upstream: \"app\")",
                &format!("Proxy(upstream: \"app\", {keys})"),
            );
            let err = parse(&d.0, &text).unwrap_err();
            assert!(err.contains(at), "{keys}: {err}");
            assert!(err.contains(words), "{keys}: {err}");
        }
    }

    #[test]
    fn unknown_upstream_is_located_at_the_route() {
        let d = site();
        let text = PROXY.replace("upstream: \"app\"", "upstream: \"ap\"");
        let err = parse(&d.0, &text).unwrap_err();
        assert!(err.contains("forkd.ron:12:56: servers[0].routes[0].handler.upstream: no upstream named `ap` (known: app)"), "{err}");
    }

    #[test]
    fn empty_server_list_is_located_in_its_upstream() {
        let d = site();
        let text = PROXY.replace("[\"127.0.0.1:9000\", \"unix:/run/app.sock\"]", "[]");
        let err = parse(&d.0, &text).unwrap_err();
        assert!(
            err.contains(
                "forkd.ron:4:13: upstreams.\"app\".servers: at least one server is needed"
            ),
            "{err}"
        );
    }

    #[test]
    fn an_upstream_defined_twice_is_an_error_at_the_second() {
        let d = site();
        let text = PROXY.replace(
            "    },\n    servers",
            "        \"app\": (servers: [\"127.0.0.1:1\"]),\n    },\n    servers",
        );
        let err = parse(&d.0, &text).unwrap_err();
        assert!(err.contains("forkd.ron:8:"), "{err}");
        assert!(err.contains("upstream `app` is defined twice"), "{err}");
    }

    #[test]
    fn bad_upstream_addresses_are_located_where_written() {
        let d = site();
        for bad in [
            "127.0.0.1",
            "unix:run/app.sock",
            "127.0.0.1:http",
            "a b:80",
            ":80",
        ] {
            let text = PROXY.replace("127.0.0.1:9000", bad);
            let err = parse(&d.0, &text).unwrap_err();
            assert!(err.contains("forkd.ron:4:"), "{bad}: {err}");
            assert!(err.contains(bad), "{bad}: {err}");
        }
    }
    #[test]
    fn rates_take_a_size_per_second_or_zero() {
        let d = site();
        let with = |rate: &str| {
            let text = format!(
                r#"(servers: [(listen: ["127.0.0.1:8080"], min_body_rate: {rate}, routes: [(prefix: "/", handler: Liveness)])])"#
            );
            parse(&d.0, &text).map(|c| c.servers[0].min_body_rate)
        };
        assert_eq!(with(r#""1KiB/s""#), Ok(1024));
        assert_eq!(with(r#""512B/s""#), Ok(512));
        assert_eq!(with("0"), Ok(0));
        for bad in [r#""1KiB""#, "100", r#""1KB/s""#, r#""fast/s""#] {
            let err = with(bad).unwrap_err();
            assert!(err.contains(":1:"), "{bad}: {err}");
        }
        let text = r#"(servers: [(listen: ["127.0.0.1:8080"], min_rate_grace: "0s", routes: [(prefix: "/", handler: Liveness)])])"#;
        let err = parse(&d.0, text).unwrap_err();
        assert!(
            err.contains("min_rate_grace") && err.contains(":1:"),
            "{err}"
        );
        let text = text.replace(
            "min_rate_grace",
            r#"min_body_rate: 0, min_send_rate: 0, min_rate_grace"#,
        );
        assert!(parse(&d.0, &text).is_ok(), "no rate, no period needed");
    }

    #[test]
    fn a_health_check_takes_documented_defaults_and_is_checked_where_written() {
        let d = site();
        let text = PROXY.replace(
            "read_timeout: \"5s\",",
            "read_timeout: \"5s\",\n            health_check: Some((path: \"/healthz\")),",
        );
        let c = parse(&d.0, &text).unwrap();
        let u = &c.upstreams[0];
        let check = u.health_check.as_ref().expect("a check");
        assert_eq!(check.path, "/healthz");
        assert_eq!(check.host, None);
        assert_eq!(check.interval, std::time::Duration::from_secs(2));
        assert_eq!(check.timeout, std::time::Duration::from_secs(1));
        assert_eq!((check.rise, check.fall), (2, 3));
        assert_eq!(check.expect_status, (200, 399));
        assert_eq!(u.resolve_every, std::time::Duration::from_secs(30));
        assert_eq!(u.servers[0].resolved, ["127.0.0.1:9000".parse().unwrap()]);
        assert!(u.servers[0].name.is_none());

        let text = PROXY.replace(
            "read_timeout: \"5s\",",
            "read_timeout: \"5s\",\n            resolve_every: \"10ms\",\n            health_check: Some((path: \"/h\", interval: \"1s\", timeout: \"2s\", fall: 0)),",
        );
        let err = parse(&d.0, &text).unwrap_err();
        assert!(
            err.contains("forkd.ron:7:13: upstreams.\"app\".resolve_every: must be at least 1s"),
            "{err}"
        );
        assert!(
            err.contains("forkd.ron:8:61: upstreams.\"app\".health_check.timeout: must be more than 0 and at most `interval`"),
            "{err}"
        );
        assert!(
            err.contains("forkd.ron:8:76: upstreams.\"app\".health_check.fall: must be at least 1"),
            "{err}"
        );
    }

    #[test]
    fn a_name_is_one_server_with_every_address_it_resolves_to() {
        let d = site();
        let text = PROXY.replace("\"127.0.0.1:9000\"", "\"localhost:9000\"");
        let c = parse(&d.0, &text).unwrap();
        let s = &c.upstreams[0].servers[0];
        assert_eq!(s.label, "localhost:9000");
        assert_eq!(s.name, Some(("localhost".to_string(), 9000)));
        assert!(!s.resolved.is_empty());
        assert_eq!(s.addr, super::super::UpstreamAddress::Tcp(s.resolved[0]));
        assert_eq!(
            c.upstreams[0].servers.len(),
            2,
            "the name and the unix socket"
        );
    }

    #[test]
    fn a_worker_adopting_a_reload_keeps_the_addresses_of_names_it_knows() {
        let d = site();
        let text = PROXY.replace("\"127.0.0.1:9000\"", "\"app.internal:9000\"");
        let file = d.0.join("forkd.ron");
        let fixed = |host: &str, port: u16| match host {
            "app.internal" => Ok(vec![std::net::SocketAddr::from(([10, 0, 0, 7], port))]),
            _ => Err("unknown".to_string()),
        };
        let old = Config::parse_with(&file, &text, &fixed).unwrap();
        assert_eq!(
            old.upstreams[0].servers[0].resolved,
            ["10.0.0.7:9000".parse().unwrap()]
        );
        // The name does not resolve here, yet the worker's parse keeps what it had.
        let again = Config::parse_like(&file, &text, &old).unwrap();
        assert_eq!(again.upstreams[0].servers, old.upstreams[0].servers);
        let other = text.replace("app.internal:9000", "nope.invalid:9000");
        let err = Config::parse_with(&file, &other, &fixed)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("cannot resolve `nope.invalid:9000`: unknown"),
            "{err}"
        );
    }

    #[test]
    fn overload_and_priority_are_read_and_bounds_located() {
        use super::super::overload::{OverloadMode, Priority};
        let d = site();
        let text = PROXY
            .replace(
                "read_timeout: \"5s\",",
                "read_timeout: \"5s\",\n            overload: Some((mode: DryRun, min_limit: 2)),",
            )
            .replace(
                "handler: Proxy(upstream: \"app\")",
                "handler: Proxy(upstream: \"app\"), priority: Low",
            );
        let c = parse(&d.0, &text).unwrap();
        let o = c.upstreams[0].overload.unwrap();
        assert_eq!(
            (o.mode, o.min_limit, o.max_limit),
            (OverloadMode::DryRun, 2, 1000)
        );
        assert_eq!(
            c.servers[0].route(b"/api/x").unwrap().priority,
            Priority::Low
        );
        assert_eq!(
            c.servers[0].route(b"/x").unwrap().priority,
            Priority::Normal
        );
        let err = parse(
            &d.0,
            &text.replace("min_limit: 2", "min_limit: 20, max_limit: 10"),
        )
        .unwrap_err();
        assert!(
            err.contains("forkd.ron:7:43: upstreams.\"app\".overload.min_limit: min_limit 20 is above max_limit 10"),
            "{err}"
        );
        let err = parse(&d.0, &text.replace("min_limit: 2", "cpu_high: 3.0")).unwrap_err();
        assert!(
            err.contains("forkd.ron:7:") && err.contains("cpu_high 3"),
            "{err}"
        );
        let err = parse(&d.0, &text.replace("priority: Low", "priority: Urgent")).unwrap_err();
        assert!(
            err.contains("forkd.ron:13:") && err.contains("Urgent"),
            "{err}"
        );
    }

    #[test]
    fn unreadable_file_is_an_error() {
        let err = Config::load(Path::new("/nonexistent/forkd.ron")).unwrap_err();
        assert!(matches!(err.0[0].kind, ConfigErrorKind::Read(_)));
    }
}

//! From a parsed request to a queued response: choose the server by `Host` and the
//! route by path, frame the body, call the route's handler, count and log what it
//! sent. Never touches the socket: the connection's I/O (`io.rs`) feeds it requests
//! and writes what it queues.
//!
//! A handler returns a finished response ([`Outcome`]); a `Proxy` route returns
//! "proxy this" instead ([`Next::Proxy`], a [`Proxied`] exchange built here), which
//! `proxied.rs` drives over the upstream socket. A static file not in the open-file
//! cache, with `file_threads`, is "wait for the file pool" ([`Next::File`]): the
//! connection waits for the job, then [`answer_after_file`] answers with its result.

use crate::access_log::{self, KeptLine, RequestLine};
use crate::busy::{Body, PendingBody};
use crate::cache::fill::{self, Plan};
use crate::cache::hit;
use crate::cache::key::KeyInput;
use crate::cache::lookup::{self, Asked, Decision};
use crate::cache::upkeep::Refresh;
use crate::cache::{self, CacheStatus};
use crate::file_pool::JobId;
use crate::handlers::health::{self, Probe};
use crate::handlers::redirect::{self, Redirect};
use crate::handlers::ret::{self, Fixed};
use crate::handlers::static_files::{self, Landed, StaticRoute};
use crate::handlers::status::{self, Format};
use crate::handlers::{self, Outcome, Reply};
use crate::http::chunked::ChunkedDecoder;
use crate::http::path::{self, PathError};
use crate::http::request::{self, BodyKind, Method, Request, RequestError, Version};
use crate::http::response::{self, Persistence, Status};
use crate::out::OutQueue;
use crate::proxy::response_head::{Redirects, ResponseContext};
use crate::proxy::session::Session;
use crate::proxy::upgrade;
use crate::proxy::upstream_request::{self, Forwarding, Framing, Scheme};
use crate::services::Services;
use crate::spool::{self, Spool};
use crate::timers::Micros;
use crate::upstream_health;
use crate::upstreams::{ClientRequest, Proxied};
use forkd_shared::config::cache::KeyTemplate;
use forkd_shared::config::names::name_matches;
use forkd_shared::config::overload::Priority;
use forkd_shared::config::shaping::SentHost;
use forkd_shared::config::{Handler, Server, UpstreamAddress};
use std::borrow::Cow;
use std::net::IpAddr;

/// What the connection does once the queued output is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    ReadHead,
    Close,
    /// Close our side, then drain the client's input for a while before closing.
    Linger,
}

/// What answering one parsed request led to.
pub enum Next {
    /// Answered: look for another request in the buffer.
    Continue,
    /// A body follows: read it, then [`answer_after_body`].
    Body(PendingBody),
    /// The connection ends after the queued output.
    Finish(After),
    /// The request breaks a limit of the server its `Host` selected: answered by the
    /// connection like a malformed request (error page, then close).
    Reject(RequestError),
    /// A `Proxy` route: the exchange to drive (its body, if any, follows the head in
    /// the input and goes upstream as it is read).
    Proxy(Box<Proxied>),
    /// A static file the file pool is opening (job `JobId`): the head stays in the
    /// input, unconsumed, and is answered by [`answer_after_file`] once the job's
    /// result is in (`Files::arrived`). Nothing was counted or logged yet.
    File(JobId),
    /// A cached route's key is being fetched by another request (on any worker):
    /// the head stays in the input, unconsumed, and is dispatched again shortly
    /// ([`CACHE_WAIT_POLL`]), until the entry is there or `lock_timeout` passes.
    CacheWait,
}

/// How often a request waiting for another's fetch of its key looks again (µs).
pub const CACHE_WAIT_POLL: Micros = lookup::WAIT_POLL_US;

/// What of a connection answering a request touches, borrowed apart from the input
/// buffer the request itself borrows.
pub struct Exchange<'c> {
    pub out: &'c mut OutQueue,
    /// Requests answered on the connection so far (for `keepalive_requests`).
    pub requests: &'c mut u32,
    /// The connection's current server: set to the one this request's `Host` selects.
    pub server: &'c mut u16,
    pub peer: IpAddr,
    pub listener: usize,
    /// When the request's first byte arrived.
    pub started: Micros,
    /// The connection is being rotated out at `worker_connections`: close after this.
    pub rotate: bool,
    /// The connection speaks TLS (`X-Forwarded-Proto: https`; an upgrade tunnel's
    /// client side decrypts and encrypts, `conn::tunnel`).
    pub tls: bool,
}

/// Where a request comes from, the same for every request a connection (or an HTTP/2
/// stream) hands to dispatch while it is answered: what [`Exchange::new`] copies.
#[derive(Debug, Clone, Copy)]
pub struct Origin {
    pub peer: IpAddr,
    pub listener: usize,
    /// When the request's first byte arrived.
    pub started: Micros,
    /// The connection is being rotated out at `worker_connections`.
    pub rotate: bool,
    /// The connection speaks TLS.
    pub tls: bool,
}

impl<'c> Exchange<'c> {
    pub fn new(
        out: &'c mut OutQueue,
        requests: &'c mut u32,
        server: &'c mut u16,
        from: Origin,
    ) -> Exchange<'c> {
        Exchange {
            out,
            requests,
            server,
            peer: from.peer,
            listener: from.listener,
            started: from.started,
            rotate: from.rotate,
            tls: from.tls,
        }
    }
}

/// Picks the server for `host` among those on the connection's listener: a name
/// written out first, then a `*.example.com` one (as SNI picks certificates).
fn select_server(svc: &Services, listener: usize, host: Option<&[u8]>) -> usize {
    let routing = &svc.routing[listener];
    if let Some(host) = host {
        for &s in &routing.servers {
            if svc.config.servers[s]
                .names
                .iter()
                .any(|n| n.as_bytes().eq_ignore_ascii_case(host))
            {
                return s;
            }
        }
        for &s in &routing.servers {
            if svc.config.servers[s]
                .names
                .iter()
                .any(|n| n.starts_with("*.") && name_matches(n, host))
            {
                return s;
            }
        }
    }
    routing.default
}

/// Answers one parsed request: frames its body, or responds right away.
pub fn answer(mut x: Exchange, svc: &mut Services, req: &Request, head: &[u8]) -> Next {
    let server = select_server(svc, x.listener, req.host);
    *x.server = server as u16;
    x.peer = client_of(svc, server, x.peer, head);
    let max_header = svc.config.servers[server].max_header_bytes;
    if req.head_len > max_header {
        // Read under the largest limit on the address; this server's is smaller.
        // Parsing the head again under it tells 414 from 431 as the parser does.
        let e = match request::parse(head, max_header) {
            Err(e) => e,
            Ok(_) => RequestError::HeadersTooLarge,
        };
        return Next::Reject(e);
    }
    // Normalised once, here: the rate check, the proxy route and the response all
    // route by it.
    let routed = route_path(req.path);
    let path = routed.as_deref().map_err(|&e| e);
    if let Some(retry_after) = over_rate(svc, server, path, head, x.peer) {
        let status = Status::TOO_MANY_REQUESTS;
        return refuse_now(&mut x, svc, req, server, status, retry_after);
    }
    let limit = svc.config.servers[server].max_body_bytes;
    let body = match req.body {
        BodyKind::None => None,
        BodyKind::Length(n) if n > limit => {
            *x.requests = x.requests.saturating_add(1);
            too_large(&mut x, svc, req, server);
            return Next::Finish(After::Linger);
        }
        BodyKind::Length(n) => Some(Body::Length(n)),
        BodyKind::Chunked => Some(Body::Chunked(ChunkedDecoder::new(
            limit,
            svc.config.servers[server].max_header_bytes,
        ))),
    };
    if let Some((upstream, upgrade, priority, route)) = proxy_route(svc, server, path, x.peer) {
        // Admitted under the upstream's adaptive limit when the request goes
        // upstream (`conn/proxied.rs`), not now: a body buffered first holds no place.
        let to = ProxyTo {
            upstream,
            upgrade,
            priority,
            route,
        };
        if req.body == BodyKind::None {
            if let Some(decision) = cache_lookup(&x, svc, req, head, server, route, path) {
                return cached(x, svc, req, head, server, to, decision);
            }
        }
        return proxy(x, svc, req, head, server, to, None, None);
    }
    if let Some(body) = body {
        if req.expect_continue && refused_from_head(svc, server, req, path, x.peer) {
            // RFC 9110 §10.1.1: the final answer instead of `100 Continue`. The client
            // may or may not send the body now, so the connection cannot tell where
            // the next request starts: it closes (lingering, so the answer is read).
            respond(x, svc, req, path, server, Close::Now, None);
            return Next::Finish(After::Linger);
        }
        ensure_out(x.out);
        if req.expect_continue {
            x.out
                .bytes()
                .extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
            svc.stats.response(100, None);
        }
        return Next::Body(PendingBody {
            head: Box::from(head),
            body,
            server,
        });
    }
    if let Some(job) = file_job(svc, server, path, req, x.peer) {
        return Next::File(job);
    }
    match respond(x, svc, req, path, server, Close::IfAsked, None) {
        Persistence::Close => Next::Finish(After::Close),
        _ => Next::Continue,
    }
}

/// The file-pool job a request for a static file waits for, if it is for a file
/// not in the open-file cache and the worker has file threads. A request the
/// route refuses anyway (its method, `allow`/`deny`) is answered at once.
fn file_job(
    svc: &mut Services,
    server: usize,
    path: RoutePath<'_>,
    req: &Request,
    peer: IpAddr,
) -> Option<JobId> {
    if !svc.files.enabled() || !static_files::allows(req.method) {
        return None;
    }
    let path = path.ok()?;
    let s = &svc.config.servers[server];
    let index = s.route_index(path)?;
    let route = &s.routes[index];
    let Handler::Static {
        root,
        index: names,
        fallback,
        ..
    } = &route.handler
    else {
        return None;
    };
    if !route.access.permits(peer) {
        return None;
    }
    let id = server << 16 | index;
    let now = svc.clock.unix_secs;
    if svc.cache.get(id, path, now).is_some() {
        return None;
    }
    let job = svc.files.request(
        id,
        path,
        root,
        names,
        fallback.as_deref(),
        svc.clock.now_us,
        now,
        &svc.stats,
    );
    Some(job)
}

/// Answers a request that waited for file-pool job `job` ([`Next::File`]), with
/// what the job found. `Some` if the connection then closes.
pub fn answer_after_file(
    mut x: Exchange,
    svc: &mut Services,
    req: &Request,
    head: &[u8],
    job: JobId,
) -> Option<After> {
    let landed = svc.files.take(job, svc.clock.now_us, &svc.stats);
    let server = select_server(svc, x.listener, req.host);
    *x.server = server as u16;
    x.peer = client_of(svc, server, x.peer, head);
    let routed = route_path(req.path);
    let path = routed.as_deref().map_err(|&e| e);
    match respond(x, svc, req, path, server, Close::IfAsked, landed.as_ref()) {
        Persistence::Close => Some(After::Close),
        _ => None,
    }
}

/// Answers a request whose body has been read. `Some` if the connection then closes.
pub fn answer_after_body(
    mut x: Exchange,
    svc: &mut Services,
    req: &Request,
    head: &[u8],
    server: usize,
) -> Option<After> {
    x.peer = client_of(svc, server, x.peer, head);
    let routed = route_path(req.path);
    let path = routed.as_deref().map_err(|&e| e);
    match respond(x, svc, req, path, server, Close::IfAsked, None) {
        Persistence::Close => Some(After::Close),
        _ => None,
    }
}

fn too_large(x: &mut Exchange, svc: &mut Services, req: &Request, server: usize) {
    ensure_out(x.out);
    let pages = &svc.config.servers[server].error_pages;
    let mut reply = Reply {
        out: x.out,
        date: svc.clock.http_date(),
        persistence: Persistence::Close,
        head_only: req.method == Method::Head,
        site: response::Site {
            headers: b"",
            pages,
        },
    };
    let outcome = reply.error(Status::CONTENT_TOO_LARGE, &[]);
    let latency = svc.clock.precise_us().saturating_sub(x.started);
    svc.stats.response(outcome.status.0, Some(latency));
    log_request(svc, server, x.peer, req, &outcome, latency);
}

/// The client of a request from `peer`: `peer` itself unless it is one of the
/// server's `trusted_proxies` and the request carries its `real_ip_header`. What the
/// limits, the access log and the proxy's `X-Forwarded-For` use.
fn client_of(svc: &Services, server: usize, peer: IpAddr, head: &[u8]) -> IpAddr {
    let s = svc.server(server);
    match &s.real_ip_header {
        Some(name) if !s.trusted_proxies.is_empty() => crate::real_ip::client(
            peer,
            &s.trusted_proxies,
            crate::http::fields::headers(head, name.as_bytes()),
        ),
        _ => peer,
    }
}

/// The rate limits of the route `path` goes to: `Some(Retry-After seconds)` if over.
fn over_rate(
    svc: &mut Services,
    server: usize,
    path: RoutePath<'_>,
    head: &[u8],
    peer: IpAddr,
) -> Option<u64> {
    let s = &svc.config.servers[server];
    if s.limits.is_none() && s.routes.iter().all(|r| r.limits.is_none()) {
        return None; // no limits: no routing twice
    }
    let route = path.ok().and_then(|p| s.route_index(p));
    crate::limits::admit::request(svc, server, route, head, peer)
}

/// Answers `status` (429 over a rate, 503 over an upstream's adaptive limit) with
/// `Retry-After`, before any body is read: a body not read yet cannot be skipped
/// reliably, so the connection then closes (lingering) after the answer.
fn refuse_now(
    x: &mut Exchange,
    svc: &mut Services,
    req: &Request,
    server: usize,
    status: Status,
    retry_after: u64,
) -> Next {
    *x.requests = x.requests.saturating_add(1);
    let s = &svc.config.servers[server];
    let unread_body = req.body != BodyKind::None;
    let persistence = keep_alive(x, svc, req, s, !unread_body);
    ensure_out(x.out);
    let mut reply = Reply {
        out: x.out,
        date: svc.clock.http_date(),
        persistence,
        head_only: req.method == Method::Head,
        site: response::Site {
            headers: b"",
            pages: &s.error_pages,
        },
    };
    let mut digits = Vec::with_capacity(20);
    response::push_decimal(&mut digits, retry_after);
    let outcome = reply.error(status, &[("Retry-After", &digits)]);
    let latency = svc.clock.precise_us().saturating_sub(x.started);
    svc.stats.response(outcome.status.0, Some(latency));
    log_request(svc, server, x.peer, req, &outcome, latency);
    match persistence {
        Persistence::Close if unread_body => Next::Finish(After::Linger),
        Persistence::Close => Next::Finish(After::Close),
        _ => Next::Continue,
    }
}

/// How the answer to `req` leaves the connection: open when the client asked (its
/// version says how to say so), `may_keep` allows it, forkd is neither draining nor
/// rotating the connection out, and the server's `keepalive_requests` is not reached.
fn keep_alive(
    x: &Exchange,
    svc: &Services,
    req: &Request,
    server: &Server,
    may_keep: bool,
) -> Persistence {
    let keep = may_keep && stays_open(x, svc, req, server);
    Persistence::after(keep, req.version == Version::Http10)
}

/// Whether the connection may stay open after the answer to `req`, whatever the
/// handler: the client asked, forkd is neither draining nor rotating the connection
/// out, and the server's `keepalive_requests` is not reached. Static and proxied
/// answers both go through here.
fn stays_open(x: &Exchange, svc: &Services, req: &Request, server: &Server) -> bool {
    req.keep_alive
        && !svc.draining
        && !x.rotate
        && (server.keepalive_requests == 0 || u64::from(*x.requests) < server.keepalive_requests)
}

/// The upstream of the route `path` goes to, whether it allows upgrades, the
/// route's priority and its index, if that route is a `Proxy` the client `peer` may
/// use (a refused one is answered 403 by `respond`, like any route).
fn proxy_route(
    svc: &Services,
    server: usize,
    path: RoutePath<'_>,
    peer: IpAddr,
) -> Option<(usize, bool, Priority, usize)> {
    let server = &svc.config.servers[server];
    let index = server.route_index(path.ok()?)?;
    let route = &server.routes[index];
    if !route.access.permits(peer) {
        return None;
    }
    match route.handler {
        Handler::Proxy {
            upstream, upgrade, ..
        } => Some((upstream, upgrade, route.priority, index)),
        _ => None,
    }
}

/// Per direction, the bytes a proxied exchange buffers between the two sockets.
const PROXY_BUFFER: usize = 64 * 1024;
/// The largest response head accepted from an upstream (more is a 502).
const MAX_UPSTREAM_HEAD: usize = 32 * 1024;

/// Where a proxied request goes: its upstream, whether the route allows an upgrade,
/// its priority under the upstream's adaptive limit and its route.
struct ProxyTo {
    upstream: usize,
    upgrade: bool,
    priority: Priority,
    /// The route's index in its server's `routes` (its prefix, shaping, buffering).
    route: usize,
}

/// "Proxy this": the upstream head written, the exchange built; `cache`: fetched
/// for the cache with this plan (its stale entry's validators sent along).
#[allow(clippy::too_many_arguments)]
fn proxy(
    x: Exchange,
    svc: &mut Services,
    req: &Request,
    head: &[u8],
    server: usize,
    to: ProxyTo,
    cache: Option<Box<Plan>>,
    cache_status: Option<CacheStatus>,
) -> Next {
    let ProxyTo {
        upstream: upstream_index,
        upgrade: allow_upgrade,
        priority,
        route,
    } = to;
    *x.requests = x.requests.saturating_add(1);
    let srv = &svc.config.servers[server];
    let route = &srv.routes[route];
    let Handler::Proxy {
        shaping,
        buffering,
        request_buffering,
        ..
    } = &route.handler
    else {
        // `proxy_route` found this route a `Proxy` in this same configuration.
        return Next::Reject(RequestError::Malformed("not a proxy route"));
    };
    let keep = stays_open(&x, svc, req, srv);
    let upstream = &svc.config.upstreams[upstream_index];
    let framing = match req.body {
        BodyKind::None => Framing::None,
        BodyKind::Length(n) => Framing::Length(n),
        BodyKind::Chunked => Framing::Chunked,
    };
    // An upgrade the route allows: forwarded with `Upgrade` (see `proxy::upgrade`);
    // otherwise both fields are dropped as hop-by-hop and the request is plain HTTP.
    let protocol = match framing {
        Framing::None if allow_upgrade => upgrade::requested(head),
        _ => None,
    };
    // `Connection: upgrade` instead of `close`: a switched connection is never pooled.
    let close = upstream.keepalive == 0 && protocol.is_none();
    let fwd = forwarding(srv, route, shaping, x.peer, x.tls, close);
    let mut out = Vec::with_capacity(head.len() + 192);
    let written =
        match upstream_request::write(head, framing, &fwd, &mut svc.upstreams.ids, &mut out) {
            Ok(w) => w,
            // The head was parsed once already; re-tokenising it cannot fail.
            Err(_) => return Next::Reject(RequestError::Malformed("unparseable head")),
        };
    if let Some(protocol) = protocol {
        upgrade::add_request_fields(&mut out, protocol);
    }
    if let Some(stale) = cache.as_ref().and_then(|p| p.stale.as_ref()) {
        add_fields(&mut out, &fill::revalidation_fields(&stale.meta));
    }
    // Kept on the stack until the exchange holds it (`Proxied` keeps 32 bytes).
    let mut id = [0u8; 32];
    let sent_id = &out[written.request_id.clone()];
    let id_len = sent_id.len().min(id.len());
    id[..id_len].copy_from_slice(&sent_id[..id_len]);
    let redirects = redirects(&fwd, written.client_host, upstream, route);
    let context = ResponseContext {
        head_request: req.method == Method::Head,
        client_http10: req.version == Version::Http10,
        client_keep_alive: keep,
        upstream_requests: 0,
        keepalive_requests: upstream.keepalive_requests,
        max_head: MAX_UPSTREAM_HEAD,
        upgrade: protocol.is_some(),
    };
    let mut session = Session::new(
        out,
        framing,
        req.method_name,
        upstream.servers.len(),
        upstream.retries,
        context,
        PROXY_BUFFER,
    );
    session.limit_client_body(srv.max_body_bytes);
    session.rewrite_redirects(redirects);
    if *request_buffering && framing != Framing::None {
        let spool = Spool::new(svc.temp.clone(), PROXY_BUFFER, spool::Mode::Replay);
        session.buffer_request(spool);
    }
    if let Some(plan) = cache {
        session.fetch_for_cache(plan);
    }
    let expect = req.expect_continue && framing != Framing::None;
    let client = ClientRequest {
        line: KeptLine::new(RequestLine::of(req)),
        peer: x.peer,
        hash_key: upstream_health::request_key(&upstream.balance, req, head, x.peer),
    };
    let mut proxied = Box::new(Proxied::new(
        session,
        upstream_index,
        server,
        expect,
        x.started,
        svc.clock.now_us,
        keep,
        client,
        &id[..id_len],
    ));
    proxied.priority = priority;
    // A switched protocol is a tunnel, never held back.
    proxied.buffering = *buffering && protocol.is_none();
    proxied.timeouts = shaping.timeouts;
    proxied.cache_status = cache_status;
    Next::Proxy(proxied)
}

/// The `Host` a request that named none is sent upstream with, and keyed by: the
/// server's first name.
fn fallback_host(server: &Server) -> &[u8] {
    server
        .names
        .first()
        .map_or(&b"localhost"[..], |n| n.as_bytes())
}

/// `req`'s cache key by `template` (a cached route's, or a `Purge` route's).
fn cache_key(
    template: &KeyTemplate,
    server: &Server,
    tls: bool,
    req: &Request,
    path: &[u8],
) -> Vec<u8> {
    let input = KeyInput {
        tls,
        host: req.host,
        fallback_host: fallback_host(server),
        path,
        query: req.query,
    };
    cache::key::expand(template, &input)
}

/// What `upstream_request::write` needs of the route and the client.
fn forwarding<'a>(
    server: &'a Server,
    route: &'a forkd_shared::config::Route,
    shaping: &'a forkd_shared::config::shaping::Shaping,
    client_ip: IpAddr,
    tls: bool,
    close: bool,
) -> Forwarding<'a> {
    Forwarding {
        client_ip,
        scheme: if tls { Scheme::Https } else { Scheme::Http },
        fallback_host: fallback_host(server),
        close,
        shaping,
        prefix: &route.prefix,
    }
}

/// Appends header field lines to a request head that ends in its empty line.
fn add_fields(head: &mut Vec<u8>, fields: &[u8]) {
    if fields.is_empty() || !head.ends_with(b"\r\n\r\n") {
        return;
    }
    head.truncate(head.len() - 2);
    head.extend_from_slice(fields);
    head.extend_from_slice(b"\r\n");
}

/// The cache's decision for a request on a `Proxy` route with `cache`, if it has
/// one and its zone is mapped.
fn cache_lookup(
    x: &Exchange,
    svc: &mut Services,
    req: &Request,
    head: &[u8],
    server: usize,
    route: usize,
    path: RoutePath<'_>,
) -> Option<Decision> {
    let srv = &svc.config.servers[server];
    let Handler::Proxy {
        cache: Some(rc), ..
    } = &srv.routes[route].handler
    else {
        return None;
    };
    let (zone, remembered) = svc.caches.with_remembered(rc.zone)?;
    let key = cache_key(&rc.key, srv, x.tls, req, path.ok()?);
    let fields = cache::key::fields(head);
    let asked = Asked {
        method: req.method,
        head,
        fields: &fields,
        key,
    };
    let unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let now = lookup::Now {
        unix: svc.clock.unix_secs,
        unix_ms,
        ms: forkd_shared::shm::monotonic_ms(),
        waited_us: svc.clock.now_us.saturating_sub(x.started),
    };
    Some(lookup::decide(zone, remembered, rc, asked, now))
}

/// Acts on the cache's decision: an answer from the zone (and a background refresh
/// it started), a fetch, a wait, or a plain exchange.
fn cached(
    x: Exchange,
    svc: &mut Services,
    req: &Request,
    head: &[u8],
    server: usize,
    to: ProxyTo,
    decision: Decision,
) -> Next {
    let (zone, entry, status, age, not_modified, refresh) = match decision {
        Decision::Fetch(plan) => {
            return proxy(
                x,
                svc,
                req,
                head,
                server,
                to,
                Some(plan),
                Some(CacheStatus::Miss),
            )
        }
        Decision::Bypass(status) => {
            return proxy(x, svc, req, head, server, to, None, Some(status))
        }
        Decision::Wait => return Next::CacheWait,
        Decision::Answer {
            zone,
            entry,
            status,
            age,
            not_modified,
            refresh,
        } => (zone, entry, status, age, not_modified, refresh),
    };
    if let Some(plan) = refresh {
        refresh_in_background(svc, req, head, server, &to, plan, x.peer, x.tls);
    }
    *x.requests = x.requests.saturating_add(1);
    let srv = &svc.config.servers[server];
    let persistence = keep_alive(&x, svc, req, srv, true);
    ensure_out(x.out);
    let answer = hit::Answer {
        date: svc.clock.http_date(),
        age,
        persistence,
        head_only: req.method == Method::Head,
        not_modified,
    };
    let sent = hit::write(x.out, &zone, &entry, &answer);
    let outcome = Outcome {
        status: Status(sent.status),
        body_bytes: sent.body_bytes,
        logged: true,
    };
    let latency = svc.clock.precise_us().saturating_sub(x.started);
    svc.stats.response(sent.status, Some(latency));
    let line = RequestLine::of(req);
    log_entry(
        svc,
        server,
        x.peer,
        line,
        &outcome,
        latency,
        None,
        None,
        Some(status),
    );
    match persistence {
        Persistence::Close => Next::Finish(After::Close),
        _ => Next::Continue,
    }
}

/// The cache zones' lines for `/metrics`.
fn cache_metrics(svc: &Services) -> String {
    let reports: Vec<_> = svc
        .caches
        .all()
        .map(|z| forkd_shared::cache::report::zone_report(&z.name, &z.index(), z.max_size))
        .collect();
    forkd_shared::cache::report::prometheus(&reports)
}

/// Hands a stale entry's refresh to the cache thread: the request the route would
/// send upstream (its shaping applied), with the entry's validators.
#[allow(clippy::too_many_arguments)]
fn refresh_in_background(
    svc: &mut Services,
    req: &Request,
    head: &[u8],
    server: usize,
    to: &ProxyTo,
    plan: Box<Plan>,
    peer: IpAddr,
    tls: bool,
) {
    if !svc.cache_upkeep.running() {
        return; // the plan, dropped, gives the lock back
    }
    let srv = &svc.config.servers[server];
    let route = &srv.routes[to.route];
    let Handler::Proxy { shaping, .. } = &route.handler else {
        return;
    };
    let upstream = &svc.config.upstreams[to.upstream];
    let fwd = forwarding(srv, route, shaping, peer, tls, true);
    let mut out = Vec::with_capacity(head.len() + 256);
    let written =
        upstream_request::write(head, Framing::None, &fwd, &mut svc.upstreams.ids, &mut out);
    if written.is_err() || req.method != Method::Get {
        return;
    }
    if let Some(stale) = plan.stale.as_ref() {
        add_fields(&mut out, &fill::revalidation_fields(&stale.meta));
    }
    let addrs = upstream
        .servers
        .iter()
        .enumerate()
        .map(|(i, s)| svc.checks.address(to.upstream, i, &s.addr))
        .collect();
    let timeouts = shaping.timeouts;
    svc.cache_upkeep.refresh(Refresh {
        plan,
        head: out,
        addrs,
        connect_timeout: timeouts.connect.unwrap_or(upstream.connect_timeout),
        read_timeout: timeouts.read.unwrap_or(upstream.read_timeout),
    });
}

/// How the response's `Location` and `Refresh` naming the upstream are rewritten
/// for this request: to the scheme and host the client used (the host it named,
/// else the upstream's fallback `Host`), from any of the upstream's servers as
/// written or the `Host` sent; the route's `path` literal before a final `{path}`
/// back to its prefix when both end alike (with or without `/`).
fn redirects(
    fwd: &Forwarding,
    client_host: Option<&[u8]>,
    upstream: &forkd_shared::config::Upstream,
    route: &forkd_shared::config::Route,
) -> Redirects {
    let client_host = client_host.unwrap_or(fwd.fallback_host);
    let sent = match &fwd.shaping.host {
        SentHost::Client => client_host,
        SentHost::Fixed(host) => host.as_bytes(),
    };
    let servers = upstream
        .servers
        .iter()
        .filter(|s| matches!(s.addr, UpstreamAddress::Tcp(_)))
        .map(|s| s.label.as_bytes());
    let paths = fwd.shaping.path.as_ref().and_then(|t| {
        let literal = &t.before;
        let alike = literal.ends_with('/') == route.prefix.ends_with('/');
        (t.after.as_deref() == Some("") && alike)
            .then_some((literal.as_bytes(), route.prefix.as_bytes()))
    });
    Redirects::new(
        fwd.scheme == Scheme::Https,
        client_host,
        servers.chain([sent]),
        paths,
    )
}

/// Whether the answer to `req` is an error known from its head alone (a path that
/// cannot be normalised, no route, a method the route's handler refuses).
fn refused_from_head(
    svc: &Services,
    server: usize,
    req: &Request,
    path: RoutePath<'_>,
    peer: IpAddr,
) -> bool {
    let server = &svc.config.servers[server];
    let Ok(path) = path else {
        return true;
    };
    match server.route_index(path) {
        None => true,
        Some(route) => {
            let route = &server.routes[route];
            !handlers::allows(&route.handler, req.method) || !route.access.permits(peer)
        }
    }
}

/// Whether a response must close the connection whatever the request asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Close {
    /// The request, the server's `keepalive_requests` and draining decide.
    IfAsked,
    /// Close after this response.
    Now,
}

/// Runs the route's handler and queues its response. Returns the persistence used.
/// `landed`: what the file pool found, for a static route.
fn respond(
    x: Exchange,
    svc: &mut Services,
    req: &Request,
    path: RoutePath<'_>,
    server_index: usize,
    close: Close,
    landed: Option<&Landed>,
) -> Persistence {
    *x.requests = x.requests.saturating_add(1);
    // A body may have been read across a configuration change: fall back to the first
    // server if this one is gone.
    let server_index = server_index.min(svc.config.servers.len() - 1);
    let server: &Server = &svc.config.servers[server_index];
    let persistence = keep_alive(&x, svc, req, server, close == Close::IfAsked);
    ensure_out(x.out);
    let route_index = path.ok().and_then(|p| server.route_index(p));
    let route = route_index.map(|i| &server.routes[i]);
    let mut reply = Reply {
        out: x.out,
        date: svc.clock.http_date(),
        persistence,
        head_only: req.method == Method::Head,
        site: response::Site {
            headers: route.map_or(&[][..], |r| &r.header_block),
            pages: &server.error_pages,
        },
    };
    let outcome = match path.map(|p| (p, route_index)) {
        Err(_) => reply.error(Status::BAD_REQUEST, &[]),
        Ok((_, None)) => reply.error(Status::NOT_FOUND, &[]),
        // allow/deny: on the connection's peer (behind a balancer, the balancer's).
        Ok((_, Some(i))) if !server.routes[i].access.permits(x.peer) => {
            reply.error(Status::FORBIDDEN, &[])
        }
        Ok((path, Some(route_index))) => match &server.routes[route_index].handler {
            Handler::Liveness => {
                health::serve(Probe::Liveness, req.method, svc.draining, &mut reply)
            }
            Handler::Readiness => {
                health::serve(Probe::Readiness, req.method, svc.not_ready, &mut reply)
            }
            Handler::Status => {
                status::serve(Format::Json, req.method, svc.stats.region(), &mut reply)
            }
            Handler::Metrics => {
                let caches = cache_metrics(svc);
                status::serve_with(
                    Format::Prometheus,
                    req.method,
                    svc.stats.region(),
                    &caches,
                    &mut reply,
                )
            }
            Handler::Purge { zone, key } => {
                let zone = svc.caches.get(*zone);
                let key = cache_key(key, server, x.tls, req, path);
                cache::purge::serve(req.method_name, zone.map(|z| &**z), &key, &mut reply)
            }
            Handler::Static {
                root,
                index,
                fallback,
                max_ranges,
                precompressed,
                compress,
            } => {
                let id = server_index << 16 | route_index;
                let fallback = fallback.as_deref();
                let route = StaticRoute {
                    id,
                    root,
                    index,
                    fallback,
                    max_ranges: *max_ranges,
                    precompressed: *precompressed,
                    compress: *compress,
                    compress_cache: svc.config.compress_cache,
                };
                let now = svc.clock.unix_secs;
                static_files::serve(&route, req, path, &mut svc.cache, now, &mut reply, landed)
            }
            Handler::Redirect { to, status } => {
                let prefix = &server.routes[route_index].prefix;
                let redirect = Redirect {
                    to,
                    status: *status,
                    prefix,
                };
                redirect::serve(&redirect, req, path, &mut reply)
            }
            Handler::Return {
                status,
                body,
                content_type,
            } => {
                let fixed = Fixed {
                    status: *status,
                    body: body.as_bytes(),
                    content_type,
                };
                ret::serve(&fixed, &mut reply)
            }
            // A body read across a reload that made this route a proxy: the
            // exchange was not started for it, so nothing can be forwarded now.
            Handler::Proxy { .. } => reply.error(Status::SERVICE_UNAVAILABLE, &[]),
        },
    };
    let latency = svc.clock.precise_us().saturating_sub(x.started);
    svc.stats.response(outcome.status.0, Some(latency));
    if outcome.logged {
        log_request(svc, server_index, x.peer, req, &outcome, latency);
    }
    persistence
}

/// A request's path as [`route_path`] made it, or why it could not.
type RoutePath<'a> = Result<&'a [u8], PathError>;

/// The path a request is routed and served by: decoded and normalised by
/// [`path::normalize`], so that `//api`, `/%61pi` and `/x/../api` all reach the route
/// of `/api`. A path already in normal form (the common case) is borrowed as is.
fn route_path(raw: &[u8]) -> Result<Cow<'_, [u8]>, PathError> {
    if is_normal(raw) {
        Ok(Cow::Borrowed(raw))
    } else {
        path::normalize(raw).map(Cow::Owned)
    }
}

/// Whether `normalize(raw)` is `raw` itself: it starts with `/` and has no escape and
/// no empty, `.` or `..` segment, a trailing slash aside.
fn is_normal(raw: &[u8]) -> bool {
    let Some((&b'/', rest)) = raw.split_first() else {
        return false;
    };
    // On every request, so one compare per ordinary byte: `%`, `.` and `/` are all
    // at or below `/`. `len` and `dots` count the current segment's bytes and dots
    // (a segment of dots only, one or two, is `.` or `..`).
    let (mut len, mut dots) = (0usize, 0usize);
    for &b in rest {
        if b > b'/' {
            len += 1;
            continue;
        }
        match b {
            b'/' if len == dots && len <= 2 => return false, // empty, `.` or `..`
            b'/' => (len, dots) = (0, 0),
            b'%' => return false,
            b'.' => (len, dots) = (len + 1, dots + 1),
            _ => len += 1,
        }
    }
    !(len == dots && (len == 1 || len == 2))
}

/// Queues a refusal that closes the connection before any request was read (over
/// `conn_per_ip`), with `extra` header fields; counts and logs it.
pub fn refusal_page(
    out: &mut OutQueue,
    svc: &mut Services,
    status: Status,
    extra: &[(&str, &[u8])],
    server: usize,
    peer: IpAddr,
    started: Micros,
) {
    let date = *svc.clock.http_date_array();
    ensure_out(out);
    let body_bytes = response::error(out.bytes(), status, &date, Persistence::Close, extra, false);
    let latency = svc.clock.precise_us().saturating_sub(started);
    svc.stats.response(status.0, Some(latency));
    log_unread(svc, server, peer, status, body_bytes, latency);
}

/// The access-log line of an answer to no request (one that could not be read, or a
/// refusal before the first): nginx's `"-"`.
fn log_unread(
    svc: &mut Services,
    server: usize,
    peer: IpAddr,
    status: Status,
    body_bytes: u64,
    latency: u64,
) {
    if !svc.logs.enabled(server) {
        return;
    }
    let entry = access_log::Entry {
        peer,
        method: "-",
        target: b"",
        version: Version::Http11,
        status: status.0,
        body_bytes,
        referer: None,
        user_agent: None,
        request_time_us: Some(latency),
        request_id: None,
        upstream: None,
        cache: None,
    };
    svc.logs
        .record(server, &entry, svc.clock.log_time(), svc.clock.unix_secs);
}

/// Queues an error page that closes the connection (no request could be answered:
/// a bad head, a timeout, a broken body), counts and logs it.
pub fn error_page(
    out: &mut OutQueue,
    svc: &mut Services,
    status: Status,
    server: usize,
    peer: IpAddr,
    started: Micros,
) {
    error_page_with(
        out,
        svc,
        status,
        server,
        peer,
        started,
        None,
        Persistence::Close,
        &[],
    );
}

/// [`error_page`] for a request whose head is known (a proxied request the upstream
/// failed: 502, 503, 504), logged with its method and target (no body for HEAD), with
/// the connection's `persistence` after it (kept open after forkd's own 502 or 504
/// when the request was read whole) and `extra` header fields (a 503's
/// `Retry-After`).
#[allow(clippy::too_many_arguments)]
pub fn error_page_with(
    out: &mut OutQueue,
    svc: &mut Services,
    status: Status,
    server: usize,
    peer: IpAddr,
    started: Micros,
    req: Option<RequestLine>,
    persistence: Persistence,
    extra: &[(&str, &[u8])],
) {
    let date = *svc.clock.http_date_array();
    ensure_out(out);
    let head_only = req.is_some_and(|r| r.is_head());
    let site = response::Site {
        headers: b"",
        pages: &svc.config.servers[server.min(svc.config.servers.len() - 1)].error_pages,
    };
    let body_bytes = response::error_with(
        out.bytes(),
        status,
        &date,
        persistence,
        extra,
        &site,
        head_only,
    );
    let latency = svc.clock.precise_us().saturating_sub(started);
    svc.stats.response(status.0, Some(latency));
    match req {
        Some(req) => {
            let outcome = Outcome {
                status,
                body_bytes,
                logged: true,
            };
            log_entry(svc, server, peer, req, &outcome, latency, None, None, None);
        }
        None => log_unread(svc, server, peer, status, body_bytes, latency),
    }
}

pub fn log_request(
    svc: &mut Services,
    server: usize,
    peer: IpAddr,
    req: &Request,
    outcome: &Outcome,
    latency_us: u64,
) {
    let line = RequestLine::of(req);
    log_entry(
        svc, server, peer, line, outcome, latency_us, None, None, None,
    );
}

/// The access-log line of the request `req`, with the request id and upstream part
/// of a proxied request.
#[allow(clippy::too_many_arguments)]
pub fn log_entry(
    svc: &mut Services,
    server: usize,
    peer: IpAddr,
    req: RequestLine,
    outcome: &Outcome,
    latency_us: u64,
    request_id: Option<&[u8]>,
    upstream: Option<access_log::UpstreamEntry>,
    cache: Option<CacheStatus>,
) {
    if !svc.logs.enabled(server) {
        return;
    }
    let entry = access_log::Entry {
        peer,
        method: req.method,
        target: req.target,
        version: req.version,
        status: outcome.status.0,
        body_bytes: outcome.body_bytes,
        referer: req.referer,
        user_agent: req.user_agent,
        request_time_us: Some(latency_us),
        request_id,
        upstream,
        cache: cache.map(CacheStatus::name),
    };
    svc.logs
        .record(server, &entry, svc.clock.log_time(), svc.clock.unix_secs);
}

/// Output buffers stay with their `Busy` (which is pooled), so this allocates only for
/// a fresh one.
pub(crate) fn ensure_out(out: &mut OutQueue) {
    if !out.has_buffer() {
        out.attach(Vec::with_capacity(OUT_CAPACITY));
    }
}

/// Initial size of an output buffer: a few responses' heads and small bodies.
const OUT_CAPACITY: usize = 16 * 1024;

#[cfg(test)]
mod tests {
    use super::*;

    /// The shortcut must agree with the normaliser it stands in for.
    #[test]
    fn a_path_is_normal_exactly_when_normalize_keeps_it() {
        let cases: &[&[u8]] = &[
            b"/",
            b"/a",
            b"/a/",
            b"/a/b.txt",
            b"/a/b/",
            b"//",
            b"//a",
            b"/a//b",
            b"/a/./b",
            b"/a/.",
            b"/a/..",
            b"/..",
            b"/.",
            b"/a/../b",
            b"/%61",
            b"/a%20b",
            b"/.a/b..",
            b"/...",
            b"a",
            b"",
            b"*",
            b"/a/b//",
        ];
        for &raw in cases {
            let kept = path::normalize(raw).is_ok_and(|n| n == raw);
            assert_eq!(is_normal(raw), kept, "{:?}", String::from_utf8_lossy(raw));
        }
    }

    #[test]
    fn every_spelling_of_a_path_routes_the_same() {
        for raw in [
            &b"/api/x"[..],
            b"//api/x",
            b"/%61pi/x",
            b"/x/../api/x",
            b"/./api//x",
        ] {
            assert_eq!(&*route_path(raw).unwrap(), b"/api/x");
        }
        assert_eq!(&*route_path(b"/healthz/../1kb.txt").unwrap(), b"/1kb.txt");
        assert!(route_path(b"/../x").is_err());
        assert!(route_path(b"/a%2fb").is_err());
    }
}

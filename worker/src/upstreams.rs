//! The worker's upstream side: its connection pools, the tokens of its upstream
//! sockets in the event loop's `Poll`, and [`Proxied`], one client's exchange with an
//! upstream (the `Session` and what the connection code needs around it).
//!
//! Tokens say what they point at: a listener, the signalfd, a client connection (its
//! slab key), or an upstream connection (`UPSTREAM_BIT | key` of the slab here). An
//! upstream token's entry says who owns the socket now: a client connection (an event
//! drives that client) or a pool (an event means the upstream closed an idle
//! connection, or sent bytes nobody asked for: it is removed at once). The token of a
//! connection does not change when it moves in or out of a pool, so that costs no
//! `epoll_ctl`.
//!
//! Knows nothing of client connections beyond their slab keys.

use crate::access_log::KeptLine;
use crate::http::request::Version;
use crate::proxy::balance::Balancer;
use crate::proxy::connect::UpstreamSocket;
use crate::proxy::exchange::State;
use crate::proxy::pool::{Pools, ServerId};
use crate::proxy::request_id::RequestIds;
use crate::proxy::session::Session;
use crate::timers::Micros;
use forkd_shared::config::{Upstream, UpstreamAddress};
use mio::{Interest, Registry, Token};
use slab::Slab;
use std::io;

/// Set in the token of every upstream connection (listeners and the signalfd use the
/// top of the range, with bit 63 set; client connections are small slab keys).
pub const UPSTREAM_BIT: usize = 1 << 62;

/// Whether `token` is an upstream connection's, and its key here.
pub fn upstream_key(token: usize) -> Option<usize> {
    (token & (1 << 63) == 0 && token & UPSTREAM_BIT != 0).then_some(token & !UPSTREAM_BIT)
}

/// Who holds an upstream connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// The client connection with this slab key (its exchange uses it).
    Client(usize),
    /// Idle in a pool.
    Pooled,
}

/// An idle connection in a pool.
#[derive(Debug)]
pub struct Pooled {
    pub socket: UpstreamSocket,
    pub token: usize,
}

/// The worker's upstream connections.
pub struct Upstreams {
    registry: Registry,
    owners: Slab<Owner>,
    pub pools: Pools<Pooled>,
    pub ids: RequestIds,
    /// Connections to close, collected by the pool operations (reused allocation).
    closing: Vec<Pooled>,
    /// Per upstream (`Config::upstreams` order): its balancer.
    pub balancers: Vec<Balancer>,
    pub scratch: crate::upstream_health::Scratch,
}

/// Each upstream's balancer for a configuration (round-robin scores start over).
fn balancers(upstreams: &[Upstream]) -> Vec<Balancer> {
    let seed = u64::from(std::process::id()) << 32
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos().into());
    upstreams
        .iter()
        .enumerate()
        .map(|(i, u)| {
            Balancer::new(
                &u.balance,
                u.servers.iter().map(|s| (s.label.as_str(), s.weight)),
                seed.wrapping_add(i as u64),
            )
        })
        .collect()
}

impl Upstreams {
    pub fn new(registry: Registry, upstreams: &[Upstream]) -> Upstreams {
        Upstreams {
            registry,
            owners: Slab::new(),
            pools: Pools::new(upstreams),
            ids: RequestIds::for_this_process(),
            closing: Vec::new(),
            balancers: balancers(upstreams),
            scratch: Default::default(),
        }
    }

    /// Connects to `addr` for client `client`, registered under a new token.
    pub fn connect(
        &mut self,
        addr: &UpstreamAddress,
        client: usize,
    ) -> io::Result<(UpstreamSocket, usize)> {
        let mut socket = UpstreamSocket::connect(addr)?;
        let key = self.owners.insert(Owner::Client(client));
        let interest = Interest::READABLE | Interest::WRITABLE;
        if let Err(e) = self
            .registry
            .register(&mut socket, Token(UPSTREAM_BIT | key), interest)
        {
            self.owners.remove(key);
            return Err(e);
        }
        Ok((socket, key))
    }

    /// A pooled connection to `id` for client `client`: (socket, requests it served,
    /// token key). `can_resend`: the request may be sent again on a new connection if
    /// this one fails; if not, a connection the upstream may be closing is not taken
    /// (`Pool::take_safe`).
    pub fn take(
        &mut self,
        id: ServerId,
        now: Micros,
        client: usize,
        can_resend: bool,
    ) -> Option<(UpstreamSocket, u64, usize)> {
        let pool = self.pools.pool(id)?;
        let reused = if can_resend {
            pool.take(now, &mut self.closing)
        } else {
            pool.take_safe(now, &mut self.closing)
        };
        self.close_collected();
        let reused = reused?;
        if let Some(owner) = self.owners.get_mut(reused.conn.token) {
            *owner = Owner::Client(client);
        }
        Some((reused.conn.socket, reused.requests, reused.conn.token))
    }

    /// An exchange is done with its connection: pool it (if `id`'s server is still
    /// configured and its pool has room) or close it.
    pub fn put(
        &mut self,
        id: ServerId,
        socket: UpstreamSocket,
        token: usize,
        requests: u64,
        now: Micros,
    ) {
        let conn = Pooled { socket, token };
        let refused = match self.pools.pool(id) {
            Some(pool) => pool.put(conn, requests, now).err(),
            None => Some(conn),
        };
        match refused {
            Some(conn) => self.forget(conn.token),
            None => {
                if let Some(owner) = self.owners.get_mut(token) {
                    *owner = Owner::Pooled;
                }
            }
        }
    }

    /// The token of a connection that was closed (dropped) is free again.
    pub fn forget(&mut self, token: usize) {
        self.owners.try_remove(token);
    }

    pub fn owner(&self, key: usize) -> Option<Owner> {
        self.owners.get(key).copied()
    }

    /// An event on an idle pooled connection at `now`: the upstream closed it or sent
    /// bytes nobody asked for. It is closed before a request can meet it.
    pub fn evict(&mut self, key: usize, now: Micros) {
        drop(self.pools.evict(|c| c.token == key, now));
        self.forget(key);
    }

    /// Closes the idle connections of `id`'s pool connected to an address not in
    /// `addrs` (its name resolves elsewhere now).
    pub fn retire_not_in(&mut self, id: ServerId, addrs: &[std::net::SocketAddr]) {
        let Some(pool) = self.pools.pool(id) else {
            return;
        };
        let stale = |c: &Pooled| match &c.socket {
            UpstreamSocket::Tcp(s) => s.peer_addr().map_or(true, |a| !addrs.contains(&a)),
            UpstreamSocket::Unix(_) => false,
        };
        while let Some(conn) = pool.remove(stale) {
            self.closing.push(conn);
        }
        self.close_collected();
    }

    /// Closes the idle connections whose `keepalive_timeout` passed.
    pub fn expire(&mut self, now: Micros) {
        if self.pools.next_expiry().is_some_and(|at| at <= now) {
            self.pools.expire(now, &mut self.closing);
            self.close_collected();
        }
    }

    /// When the next idle connection expires.
    pub fn next_expiry(&self) -> Option<Micros> {
        self.pools.next_expiry()
    }

    /// Drain: every idle connection closes now.
    pub fn drain(&mut self) {
        self.pools.drain(&mut self.closing);
        self.close_collected();
    }

    /// Reload: pools of servers that stay keep their connections (with the new
    /// limits); those of removed servers close.
    pub fn reconfigure(&mut self, upstreams: &[Upstream]) {
        self.pools.reconfigure(upstreams, &mut self.closing);
        self.close_collected();
        self.balancers = balancers(upstreams);
    }

    fn close_collected(&mut self) {
        for conn in std::mem::take(&mut self.closing) {
            self.owners.try_remove(conn.token);
        }
    }
}

/// What a proxied exchange keeps of the client's parsed request, taken when it is
/// built: the head sent upstream says something else (forkd's `X-Forwarded-*` and
/// `X-Request-Id` added, the route's shaping applied), and may have more fields than
/// the request parser takes. One allocation (the [`KeptLine`]'s bytes).
#[derive(Debug)]
pub struct ClientRequest {
    /// What the access log writes of the request (and whether it is a `HEAD`).
    pub line: KeptLine,
    /// The client: the connection's peer, or the address `real_ip_header` gave
    /// (what the access log and the limits name).
    pub peer: std::net::IpAddr,
    /// The request's key for a `Hash` upstream (`upstream_health::request_key`).
    pub hash_key: u64,
}

/// What a proxied exchange waits on its client for, when it does (the connection's
/// rate window, `Busy::rate`, measures that): the request body (wanted, none
/// buffered) or the response (bytes for the client it has not taken). A client
/// waiting for the upstream has neither, and is not judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transfer {
    Body,
    Response,
}

/// One client's proxied exchange: the [`Session`] (upstream socket, both bounded
/// streams, the state machine), which upstream and server it uses, its token, and
/// the times its deadlines and the logs need. Owned by the client connection's
/// `Busy`, so an idle keep-alive connection stays as small as before.
///
/// The plain accessors are what a stats or access-log hook needs.
#[derive(Debug)]
pub struct Proxied {
    pub session: Box<Session>,
    /// Index into `Config::upstreams`.
    pub upstream: usize,
    /// The server of the current (or last) attempt, and its pool.
    pub server: Option<(usize, ServerId)>,
    /// The current upstream socket's token key.
    pub token: Option<usize>,
    /// The forkd server (`Config::servers`) that routed the request.
    pub client_server: usize,
    /// `Expect: 100-continue` not answered yet.
    pub expect_continue: bool,
    /// When the request's first byte arrived.
    pub started: Micros,
    /// When the exchange entered its current state, and its last upstream progress.
    pub state_since: Micros,
    pub upstream_progress: Micros,
    /// The upstream's deadline was held (forkd waited on the client) at the last
    /// look, and when a hold last ended: forkd went back to waiting on the upstream
    /// (`conn::proxied_deadlines::note_client`).
    pub held: bool,
    pub resumed: Micros,
    /// The exchange state `state_since` is for (to notice a change).
    pub state_tag: Option<std::mem::Discriminant<State>>,
    /// The failure of the current attempt was logged.
    pub failure_logged: bool,
    /// When the final response head arrived.
    pub head_at: Option<Micros>,
    /// The response head's status.
    pub status: Option<u16>,
    /// The upstream side finished (its connection pooled or closed).
    pub upstream_done: bool,
    /// The deadline fired: tell the session before the next pump.
    pub fired: bool,
    /// The client's socket reported a hang-up: see whether the client left before
    /// the next pump.
    pub client_hung_up: bool,
    /// The upstream failed after the response head: what was received goes out,
    /// then the client connection closes (a truncated response, never a wrong one).
    pub truncated: bool,
    /// Bytes written to the client.
    pub sent: u64,
    /// The client connection may be kept after the response.
    pub client_keep_alive: bool,
    pub http10: bool,
    /// The upstream switched protocols (101): its socket and the bytes after the
    /// head, for the tunnel the client connection becomes once the 101 is written.
    pub upgraded: Option<(UpstreamSocket, Vec<u8>)>,
    /// Its place under the upstream group's adaptive limit, taken when the request
    /// goes upstream (not while its body is buffered), given back when dropped.
    pub overload: Option<crate::overload::admission::Ticket>,
    /// The route's priority, for that admission.
    pub priority: forkd_shared::config::overload::Priority,
    /// What the exchange waited on the client for at the last look: the rate window
    /// (`Busy::rate`) measures it, and starts again when it changes.
    pub rated: Option<Transfer>,
    /// The current attempt, counted in flight in the region while it lasts.
    pub in_flight: Option<crate::stats::InFlight>,
    /// Response buffering: the route asks for it and the response did not refuse it
    /// (`X-Accel-Buffering: no`, an event stream).
    pub buffering: bool,
    /// The response bytes the client has not taken yet, read from the upstream as
    /// fast as it sends them (memory, then a temporary file). Made when the client
    /// first falls behind.
    pub spool: Option<crate::spool::Spool>,
    /// When the upstream side ended (its response read whole, or failed), precise:
    /// the access log's `upstream_response_time` and the held-time stats.
    pub upstream_done_at: Option<Micros>,
    /// When the first upstream attempt began (the request went upstream).
    pub upstream_started_at: Option<Micros>,
    /// The client's part, once forkd had the response whole: when the last byte
    /// went out. Counted once.
    pub transfer_counted: bool,
    /// The route's own upstream timeouts (`Upstream::timeouts` puts them in place).
    pub timeouts: forkd_shared::config::shaping::RouteTimeouts,
    /// What the access log, an error page and the balancer read of the client's
    /// request.
    pub client: ClientRequest,
    /// What the cache did (the access log's `cache`); `None` off a cached route.
    pub cache_status: Option<crate::cache::CacheStatus>,
    /// The cache answered instead of the upstream (a stale or revalidated entry): the
    /// status and body bytes it sent.
    pub cache_answer: Option<(u16, u64)>,
    /// The `X-Request-Id` sent upstream.
    request_id: [u8; 32],
    request_id_len: u8,
}

impl Proxied {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        session: Session,
        upstream: usize,
        client_server: usize,
        expect_continue: bool,
        started: Micros,
        now: Micros,
        client_keep_alive: bool,
        client: ClientRequest,
        request_id: &[u8],
    ) -> Proxied {
        let mut id = [0u8; 32];
        let len = request_id.len().min(32);
        id[..len].copy_from_slice(&request_id[..len]);
        Proxied {
            session: Box::new(session),
            upstream,
            server: None,
            token: None,
            client_server,
            expect_continue,
            started,
            state_since: now,
            upstream_progress: now,
            held: false,
            resumed: now,
            state_tag: None,
            failure_logged: false,
            head_at: None,
            status: None,
            upstream_done: false,
            fired: false,
            client_hung_up: false,
            truncated: false,
            sent: 0,
            client_keep_alive,
            http10: client.line.line().version == Version::Http10,
            upgraded: None,
            overload: None,
            priority: Default::default(),
            rated: None,
            in_flight: None,
            buffering: false,
            spool: None,
            upstream_done_at: None,
            upstream_started_at: None,
            transfer_counted: false,
            timeouts: Default::default(),
            client,
            cache_status: None,
            cache_answer: None,
            request_id: id,
            request_id_len: len as u8,
        }
    }

    /// Index of the upstream in `Config::upstreams`.
    pub fn upstream_index(&self) -> usize {
        self.upstream
    }

    /// Index of the server (in its upstream's `servers`) of the last attempt.
    pub fn server_index(&self) -> Option<usize> {
        self.server.map(|(s, _)| s)
    }

    /// The upstream's response status, once its head arrived.
    pub fn upstream_status(&self) -> Option<u16> {
        self.status
    }

    /// Microseconds from the request going upstream (its body read first, with
    /// request buffering) to the upstream's response head (nginx's
    /// `$upstream_header_time`).
    pub fn time_to_head_us(&self) -> Option<Micros> {
        let from = self.upstream_started_at.unwrap_or(self.started);
        self.head_at.map(|at| at.saturating_sub(from))
    }

    /// Microseconds from the request going upstream to the upstream's response read
    /// whole (nginx's `$upstream_response_time`): what the upstream spent on it, the
    /// client's own pace aside when the response was buffered.
    pub fn upstream_time_us(&self) -> Option<Micros> {
        let from = self.upstream_started_at.unwrap_or(self.started);
        self.upstream_done_at.map(|at| at.saturating_sub(from))
    }

    /// The last attempt used a pooled connection (else a new one).
    pub fn reused_connection(&self) -> bool {
        self.session.exchange().reused()
    }

    /// Response bytes wait in the exchange's spool for the client.
    pub fn spooled(&self) -> bool {
        self.spool.as_ref().is_some_and(|s| !s.is_empty())
    }

    /// The `X-Request-Id` sent upstream (the client's, or generated).
    pub fn request_id(&self) -> &[u8] {
        &self.request_id[..usize::from(self.request_id_len)]
    }
}

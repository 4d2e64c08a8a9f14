//! A client connection's state machine: which phase it is in and what each step does
//! (keep-alive, pipelining, lingering close). What a request is answered with is
//! `dispatch.rs`'s business.
//!
//! ```text
//!             ┌──────────── response(s) queued ─────────────┐
//!             ▼                                             │
//!  accept ─▶ ReadHead ──head with body──▶ ReadBody ──body done─┤
//!             ▲  │ bad request / timeout                    │
//!             │  ▼                                          ▼
//!             └─ Write{then: ReadHead} ◀─────────────── Write{then}
//!                  then: Close ──▶ closed
//!                  then: Linger ─▶ Linger (drain input, then closed)
//!
//!  ReadHead ──file not cached, file_threads──▶ FileWait ──job done: answered──▶ ReadHead
//!  ReadHead ──Proxy route──▶ Proxy ──response written──▶ ReadHead (or closed)
//!                              ├── upstream failed before the head ─▶ Write{then: Linger}
//!                              └── 101 written (an upgrade) ─▶ Tunnel ──both ends shut──▶ closed
//! ```
//!
//! In `Proxy` the exchange (`Busy::proxy`) is driven by `proxied.rs`: the client is
//! read only for its body, as the upstream takes it.
//!
//! Beside it: `io/accept.rs` (a connection before its first request: `conn_per_ip`,
//! the PROXY header), `io/requests.rs` (heads parsed and dispatched, bodies
//! consumed), `io/socket.rs` (reads and writes through the `Transport`),
//! `io/deadlines.rs` (its one deadline and what it becomes: timeouts, minimum
//! rates), `io/room.rs` (drain, and room at `worker_connections`) and
//! `io/h2_start.rs` (the switch to HTTP/2) and `io/file_wait.rs` (a request waiting
//! for the file pool).
//!
//! Requests are answered in order; a buffer full of pipelined requests produces one
//! batch of responses and one `write`. Input is only read while nothing is waiting
//! to be written, so a client that does not read its responses stops being read.

mod accept;
mod deadlines;
mod file_wait;
mod h2_start;
mod requests;
mod room;
mod socket;

use super::dispatch::{self, After, Exchange, Next};
use super::h2;
use super::proxied::{self, Client, Progress};
use super::tunnel::{Client as TunnelClient, Moved, Pumped, Tunnel};
use crate::busy::{Body, Busy, RateWindow};
use crate::http::head_scan;
use crate::http::request::{self, RequestError};
use crate::http::response::Status;
use crate::limits::rotation::Candidate;
use crate::limits::table::Held;
use crate::out::Flush;
use crate::proxy_protocol::{self, Parsed};
use crate::services::Services;
use crate::timers::{Deadline, Micros};
use crate::tls::{Tls, Transport};
use crate::upstreams::Transfer;
use forkd_shared::config::Server;
use forkd_shared::shm::counters;
use mio::net::TcpStream;
use nix::sys::socket::sockopt;
use std::io::{self, Read};
use std::net::IpAddr;
use std::time::Duration;

/// Whether a connection's first bytes ask for HTTP/2.
enum H2Start {
    No,
    /// Part of the h2c preface: read on.
    Wait,
    Yes,
}

/// How long a closing connection's input is drained so the client reads the response
/// instead of a reset.
const LINGER: Micros = 2_000_000;
/// While draining, an idle keep-alive connection is closed after this much idleness.
const DRAIN_IDLE_GRACE: Micros = 500_000;
/// Stop answering pipelined requests and write once this much output is queued.
const BATCH_BYTES: usize = 64 * 1024;
/// What one connection may do in one turn of the event loop before the others get
/// theirs: steps of its state machine (a read, a batch of answers, a write) and bytes
/// written (like nginx's `sendfile_max_chunk`, but per turn). A connection that stops
/// on its budget rather than on EAGAIN is driven again next turn without an event.
const STEPS_PER_TURN: u32 = 16;
const BYTES_PER_TURN: u64 = 256 * 1024;

/// A connection's small state in one `u16`: three flags, and where `conn_per_ip`
/// counted it (its table index plus one, 0: not counted; the table has fewer than
/// 2^13 entries).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Bits(u16);

impl Bits {
    /// The last drive stopped on its budget, not on EAGAIN: edge-triggered readiness
    /// will not report it again, so the event loop must drive it next turn.
    const YIELDED: u16 = 1 << 15;
    /// `TCP_NODELAY` is set (once per connection, when it turns keep-alive).
    const NODELAY: u16 = 1 << 14;
    /// Told to close after its next response, to make room at `worker_connections`
    /// (see `limits::rotation`).
    const ROTATE: u16 = 1 << 13;
    const HELD: u16 = (1 << 13) - 1;

    fn has(self, flag: u16) -> bool {
        self.0 & flag != 0
    }

    fn set(&mut self, flag: u16, on: bool) {
        if on {
            self.0 |= flag;
        } else {
            self.0 &= !flag;
        }
    }

    fn set_held(&mut self, held: Option<Held>) {
        let v = held.map_or(0, |h| h.index as u16 + 1);
        self.0 = (self.0 & !Self::HELD) | (v & Self::HELD);
    }

    fn take_held(&mut self) -> Option<Held> {
        let v = self.0 & Self::HELD;
        self.0 &= !Self::HELD;
        (v != 0).then(|| Held {
            index: u32::from(v - 1),
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// On a `proxy_protocol` listener: waiting for the PROXY header that names the
    /// client, before any request.
    ProxyHeader,
    /// Waiting for (the rest of) a request head.
    ReadHead,
    /// Reading a request body (see `Busy::body`).
    ReadBody,
    /// The request at the input's start waits for a file-pool job
    /// (`Busy::file_wait`); earlier pipelined answers are written meanwhile.
    FileWait,
    /// The request at the input's start waits for another request's fetch of its
    /// cache key (`conn::dispatch::Next::CacheWait`): dispatched again at the
    /// deadline; earlier pipelined answers are written meanwhile.
    CacheWait,
    /// Writing queued responses.
    Write(After),
    /// Response sent and our side shut down: discarding input until EOF or timeout.
    Linger,
    /// A proxied exchange (`Busy::proxy`) under way.
    Proxy,
    /// Upgraded (a 101 from the upstream): a byte tunnel (`Busy::tunnel`) until both
    /// sides end, it idles out, or the drain ends.
    Tunnel,
    /// HTTP/2 (`Busy::h2`): the connection's framing and its streams (`conn/h2`).
    H2,
}

/// What a connection is doing, for the stats gauges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activity {
    Reading,
    Writing,
    Idle,
}

/// What the event loop should do with the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Keep,
    Close,
}

/// Where a connection's socket is with the poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registration {
    None,
    /// Waits a turn (`Conn::waits_on_upstream_only`): the event loop listed it, and
    /// registers it then unless it closed first.
    Deferred,
    Registered,
}

pub struct Conn {
    stream: TcpStream,
    /// Its TLS session on an HTTPS address (`Transport` joins the two).
    tls: Tls,
    /// The listener it came through: selects the servers it may be routed to.
    listener: u16,
    /// The server the latest request's `Host` selected (the listener's default server
    /// before the first): its timeouts and limits apply from then on.
    server: u16,
    phase: Phase,
    /// The socket may have input we have not read (edge-triggered readiness).
    pub readable: bool,
    /// Registered with the poll for writability too.
    pub write_interest: bool,
    /// Registered with the poll at all, or listed to be.
    pub registration: Registration,

    /// In the event loop's ready list (so it is queued once).
    pub queued: bool,
    requests: u32,
    /// Small state packed in one word, so an idle `Conn` stays small: see [`Bits`].
    bits: Bits,
    /// The client address: the socket's peer, or what a PROXY protocol header or a
    /// trusted proxy said. Limits, the access log and error messages read it here.
    peer: IpAddr,
    pub deadline: Deadline,
    /// When the connection became idle (or was accepted).
    idle_since: Micros,
    /// When the first byte of the current head arrived.
    head_since: Micros,
    /// Last time a read or write made progress.
    progress: Micros,
    busy: Option<Box<Busy>>,
}

impl Conn {
    /// A connection accepted on `listener`, whose default server is `server`.
    pub fn new(
        stream: TcpStream,
        tls: Tls,
        peer: IpAddr,
        listener: usize,
        server: usize,
        now: Micros,
    ) -> Conn {
        let mut bits = Bits(0);
        // A handshake is flights of small writes each waiting on the other side: as
        // nginx does for TLS, no Nagle delay from the first one.
        if tls.is_tls() && stream.set_nodelay(true).is_ok() {
            bits.set(Bits::NODELAY, true);
        }
        Conn {
            stream,
            tls,
            listener: listener as u16,
            server: server as u16,
            phase: Phase::ReadHead,
            readable: true,
            write_interest: false,
            registration: Registration::None,
            queued: false,
            requests: 0,
            bits,
            peer,
            deadline: Deadline::default(),
            idle_since: now,
            head_since: now,
            progress: now,
            busy: None,
        }
    }

    pub fn stream(&mut self) -> &mut TcpStream {
        &mut self.stream
    }

    /// Idle: between requests, with nothing buffered either way.
    pub fn is_idle(&self) -> bool {
        self.phase == Phase::ReadHead && self.busy.as_ref().is_none_or(|b| b.idle())
    }

    pub fn activity(&self) -> Activity {
        match self.phase {
            Phase::Write(_) | Phase::Proxy | Phase::Tunnel | Phase::FileWait | Phase::CacheWait => {
                Activity::Writing
            }
            Phase::H2 => match self
                .busy
                .as_ref()
                .and_then(|b| b.h2.as_ref().and_then(|h| h.downcast_ref::<h2::Session>()))
            {
                Some(s) if s.open_streams() > 0 => Activity::Writing,
                _ => Activity::Idle,
            },
            _ if self.is_idle() => Activity::Idle,
            _ => Activity::Reading,
        }
    }

    /// The client is leaving with a request under way: its body unread, or its
    /// response not fully sent (nginx's 499).
    pub fn abandoned(&self) -> bool {
        match self.phase {
            Phase::ReadBody | Phase::Proxy | Phase::FileWait | Phase::CacheWait => true,
            Phase::Write(After::ReadHead) => self.wants_write(),
            _ => false,
        }
    }

    /// Output is waiting for the socket to take it.
    pub fn wants_write(&self) -> bool {
        self.tls.pending()
            || self.busy.as_ref().is_some_and(|b| {
                !b.out.is_empty()
                    || b.proxy
                        .as_ref()
                        .is_some_and(|p| p.session.has_client_output() || p.spooled())
                    || b.tunnel.as_ref().is_some_and(|t| t.wants_client_write())
                    || b.h2
                        .as_ref()
                        .and_then(|h| h.downcast_ref::<h2::Session>())
                        .is_some_and(|s| s.wants_write())
            })
    }

    /// Proxying, with nothing to write to the client and no request body to read
    /// from it: only the upstream's answer moves it on. Such a connection need not be
    /// registered yet: its response usually arrives in the next turn, and a
    /// `Connection: close` client is then answered and closed without one `epoll_ctl`
    /// (see `EventLoop::register_deferred`).
    pub fn waits_on_upstream_only(&self) -> bool {
        self.phase == Phase::Proxy
            && !self.wants_write()
            && self.busy.as_ref().is_some_and(|b| {
                !b.has_input()
                    && b.proxy
                        .as_ref()
                        .is_some_and(|p| !p.session.wants_client_body())
            })
    }

    /// Upgraded: a tunnel (for the `tunnels_open` gauge).
    pub fn is_tunnel(&self) -> bool {
        self.phase == Phase::Tunnel
    }

    /// The upstream and server a tunnel's upstream connection goes to (for the
    /// upstream's open-connections gauge).
    pub fn tunnel_server(&self) -> Option<(usize, usize)> {
        self.busy.as_ref()?.tunnel.as_ref()?.server()
    }

    /// The drain ended with the tunnel still open: shut both sides down cleanly (the
    /// caller closes the connection).
    pub fn shut_tunnel(&mut self, svc: &Services) {
        if let Some(t) = self.busy.as_mut().and_then(|b| b.tunnel.as_mut()) {
            t.shut(&mut TunnelClient {
                transport: Transport::new(&mut self.stream, &mut self.tls),
                stats: &svc.stats,
            });
        }
    }

    /// Where this connection's requests come from, for dispatch.
    fn origin(&self) -> dispatch::Origin {
        dispatch::Origin {
            peer: self.peer,
            listener: usize::from(self.listener),
            started: self.head_since,
            rotate: self.bits.has(Bits::ROTATE),
            tls: self.tls.is_tls(),
        }
    }

    /// The client address (see `peer`).
    pub fn client(&self) -> IpAddr {
        self.peer
    }

    /// Gives the buffers back to the pool (the connection is closing).
    pub fn release(&mut self, svc: &mut Services) {
        if let Some(held) = self.bits.take_held() {
            crate::limits::admit::release(svc, held);
        }
        if let Some(mut busy) = self.busy.take() {
            if let Some(token) = busy.proxy.take().and_then(|p| p.token) {
                svc.upstreams.forget(token); // the session's socket closes with it
            }
            if let Some(tunnel) = busy.tunnel.take() {
                tunnel.close(&mut svc.upstreams, &mut svc.stats);
            }
            Self::end_session(&mut busy, svc);
            svc.give_busy(busy);
        }
    }

    /// The buffers, taken from the pool if the connection has none.
    fn busy(&mut self, svc: &mut Services) -> &mut Busy {
        self.busy.get_or_insert_with(|| svc.take_busy())
    }

    /// Advances the connection as far as it can go without blocking.
    pub fn drive(&mut self, key: usize, svc: &mut Services) -> Verdict {
        self.bits.set(Bits::YIELDED, false);
        let verdict = self.step(key, svc);
        if verdict == Verdict::Keep {
            self.park(svc);
            self.arm(key, svc);
        }
        verdict
    }

    /// The upstream socket of the exchange under way (or of the tunnel, or of
    /// HTTP/2 stream `stream`) reported readable, or (`hung_up`) a hang-up or an
    /// error: the next drive reads it.
    pub fn upstream_readable(&mut self, stream: Option<usize>, hung_up: bool) {
        let Some(b) = self.busy.as_mut() else {
            return;
        };
        if let (Some(s), Some(slot)) = (
            b.h2.as_mut().and_then(|h| h.downcast_mut::<h2::Session>()),
            stream,
        ) {
            s.upstream_readable(slot, hung_up);
        } else if let Some(t) = b.tunnel.as_mut() {
            t.upstream_ready(hung_up);
        } else if let Some(p) = b.proxy.as_mut() {
            p.session.upstream_readable(hung_up);
        }
    }

    /// The client's socket reported a hang-up (or an error), before `drive`: a
    /// tunnel reads the client on to its EOF; during a proxied exchange, the next
    /// drive looks whether the client left (nginx's 499).
    pub fn client_hung_up(&mut self) {
        let Some(b) = self.busy.as_mut() else {
            return;
        };
        b.hung_up = true;
        if let Some(t) = b.tunnel.as_mut() {
            t.client_hung_up();
        } else if self.phase == Phase::Proxy {
            if let Some(p) = b.proxy.as_mut() {
                p.client_hung_up = true;
            }
        }
    }

    /// The proxied exchange under way, if any (for the upstream gauges).
    pub fn proxied(&self) -> Option<&crate::upstreams::Proxied> {
        self.busy.as_ref()?.proxy.as_deref()
    }

    /// Stopped on its budget with work left: drive it again next turn.
    pub fn yielded(&self) -> bool {
        self.bits.has(Bits::YIELDED)
    }

    fn step(&mut self, key: usize, svc: &mut Services) -> Verdict {
        let mut steps = STEPS_PER_TURN;
        let mut bytes = BYTES_PER_TURN;
        loop {
            if steps == 0 {
                self.bits.set(Bits::YIELDED, true);
                return Verdict::Keep;
            }
            steps -= 1;
            match self.phase {
                Phase::ProxyHeader => {
                    if let Some(verdict) = self.proxy_header(svc) {
                        return verdict;
                    }
                }
                Phase::Write(then) => match self.flush(svc, &mut bytes) {
                    Err(_) => return Verdict::Close,
                    Ok(Flush::Blocked) => return Verdict::Keep,
                    Ok(Flush::Budget) => {
                        self.bits.set(Bits::YIELDED, true);
                        return Verdict::Keep;
                    }
                    Ok(Flush::Done) => match then {
                        After::ReadHead => {
                            self.phase = Phase::ReadHead;
                            self.idle_since = svc.clock.now_us;
                            if !self.bits.has(Bits::NODELAY) {
                                // Keep-alive from here on: a small last segment must not
                                // wait for a delayed ACK. Once per connection.
                                self.bits.set(Bits::NODELAY, true);
                                let _ = self.stream.set_nodelay(true);
                            }
                        }
                        After::Close => {
                            Transport::new(&mut self.stream, &mut self.tls).close_notify();
                            return Verdict::Close;
                        }
                        After::Linger => {
                            let _ =
                                Transport::new(&mut self.stream, &mut self.tls).shutdown_write();
                            self.phase = Phase::Linger;
                            self.idle_since = svc.clock.now_us;
                        }
                    },
                },
                Phase::ReadHead => {
                    match self.speaks_h2(svc) {
                        H2Start::Yes => {
                            if !self.start_h2(svc) {
                                return Verdict::Close;
                            }
                            continue;
                        }
                        H2Start::Wait => match self.fill(svc) {
                            Ok(true) => continue,
                            Ok(false) => return Verdict::Keep,
                            Err(_) => return Verdict::Close,
                        },
                        H2Start::No => {}
                    }
                    match self.answer_buffered(key, svc) {
                        Some(after) => {
                            self.start_writing(after, svc);
                            continue;
                        }
                        None if matches!(
                            self.phase,
                            Phase::ReadBody | Phase::Proxy | Phase::FileWait | Phase::CacheWait
                        ) =>
                        {
                            continue
                        }
                        None => {}
                    }
                    if self.wants_write() {
                        self.start_writing(After::ReadHead, svc);
                        continue;
                    }
                    match self.fill(svc) {
                        Ok(true) => continue,
                        Ok(false) => return Verdict::Keep,
                        Err(_) => return Verdict::Close,
                    }
                }
                Phase::CacheWait => {
                    if self.wants_write() {
                        match self.flush(svc, &mut bytes) {
                            Err(_) => return Verdict::Close,
                            Ok(Flush::Budget) => {
                                self.bits.set(Bits::YIELDED, true);
                                return Verdict::Keep;
                            }
                            Ok(Flush::Blocked | Flush::Done) => {}
                        }
                    }
                    return Verdict::Keep;
                }
                Phase::FileWait => match self.file_arrived(svc) {
                    Some(Some(after)) => {
                        self.start_writing(after, svc);
                        continue;
                    }
                    Some(None) => continue, // ReadHead: the rest of the input
                    None if self.wants_write() => match self.flush(svc, &mut bytes) {
                        Err(_) => return Verdict::Close,
                        Ok(Flush::Budget) => {
                            self.bits.set(Bits::YIELDED, true);
                            return Verdict::Keep;
                        }
                        Ok(Flush::Blocked | Flush::Done) => return Verdict::Keep,
                    },
                    None => return Verdict::Keep,
                },
                Phase::ReadBody => {
                    if self.wants_write() {
                        // `100 Continue`: send it before waiting for the body.
                        match self.flush(svc, &mut bytes) {
                            Err(_) => return Verdict::Close,
                            Ok(Flush::Blocked) => return Verdict::Keep,
                            Ok(Flush::Budget) => {
                                self.bits.set(Bits::YIELDED, true);
                                return Verdict::Keep;
                            }
                            Ok(Flush::Done) => {}
                        }
                    }
                    match self.discard_body(svc) {
                        Some(after) => {
                            self.start_writing(after, svc);
                            continue;
                        }
                        None if self.phase == Phase::ReadHead => continue,
                        None => {}
                    }
                    match self.fill(svc) {
                        Ok(true) => continue,
                        Ok(false) => return Verdict::Keep,
                        Err(_) => return Verdict::Close,
                    }
                }
                Phase::Proxy => {
                    let Some(busy) = self.busy.as_deref_mut() else {
                        return Verdict::Close;
                    };
                    let Some(mut p) = busy.proxy.take() else {
                        return Verdict::Close;
                    };
                    let mut transport = Transport::new(&mut self.stream, &mut self.tls);
                    let mut client = Client {
                        key,
                        stream: &mut transport,
                        peer: self.peer,
                        progress: &mut self.progress,
                    };
                    let progress = proxied::advance(&mut p, &mut client, busy, svc, &mut bytes);
                    let mut upgraded = None;
                    match progress {
                        Progress::Again
                        | Progress::ReadClient
                        | Progress::Wait
                        | Progress::Budget => {
                            busy.proxy = Some(p);
                        }
                        Progress::Upgraded => upgraded = Some(p),
                        _ => {
                            if let Some(token) = p.token {
                                svc.upstreams.forget(token);
                            }
                        }
                    }
                    match progress {
                        Progress::Again => continue,
                        Progress::ReadClient => match self.fill_body(svc) {
                            Ok(true) => continue,
                            Ok(false) => return Verdict::Keep,
                            Err(_) => {
                                // The client left while its body was read.
                                if let Some(mut p) = busy_proxy(&mut self.busy) {
                                    proxied::abandon(&mut p, self.peer, svc);
                                }
                                return Verdict::Close;
                            }
                        },
                        Progress::Wait => return Verdict::Keep,
                        Progress::Budget => {
                            self.bits.set(Bits::YIELDED, true);
                            return Verdict::Keep;
                        }
                        Progress::Finished { keep: true } => {
                            self.phase = Phase::ReadHead;
                            self.idle_since = svc.clock.now_us;
                            if !self.bits.has(Bits::NODELAY) {
                                self.bits.set(Bits::NODELAY, true);
                                let _ = self.stream.set_nodelay(true);
                            }
                        }
                        // Under TLS the response's last records may still be waiting.
                        Progress::Finished { keep: false } | Progress::Truncated
                            if self.tls.pending() =>
                        {
                            self.phase = Phase::ReadHead;
                            self.start_writing(After::Close, svc);
                        }
                        Progress::Finished { keep: false } | Progress::Truncated => {
                            // Not a client that left (`abandoned`: 499).
                            self.phase = Phase::ReadHead;
                            return Verdict::Close;
                        }
                        Progress::Close => return Verdict::Close,
                        Progress::Failed { keep } => {
                            self.phase = Phase::ReadHead;
                            let after = if keep { After::ReadHead } else { After::Linger };
                            self.start_writing(after, svc);
                        }
                        Progress::Upgraded => {
                            let p = upgraded.take().expect("kept above");
                            let Some(tunnel) = open_tunnel(*p, busy, svc) else {
                                return Verdict::Close;
                            };
                            busy.tunnel = Some(Box::new(tunnel));
                            self.phase = Phase::Tunnel;
                            // Client bytes may have arrived while the upstream answered.
                            self.readable = true;
                        }
                    }
                }
                Phase::Tunnel => {
                    let Some(tunnel) = self.busy.as_mut().and_then(|b| b.tunnel.as_mut()) else {
                        return Verdict::Close;
                    };
                    let mut moved = Moved::default();
                    let now = svc.clock.now_us;
                    let mut client = TunnelClient {
                        transport: Transport::new(&mut self.stream, &mut self.tls),
                        stats: &svc.stats,
                    };
                    let pumped =
                        tunnel.pump(&mut client, &mut self.readable, now, &mut bytes, &mut moved);
                    if moved.from_client > 0 {
                        svc.stats.bytes_in(moved.from_client);
                    }
                    if moved.to_client > 0 {
                        svc.stats.bytes_out(moved.to_client);
                    }
                    return match pumped {
                        Pumped::Wait => Verdict::Keep,
                        Pumped::Budget => {
                            self.bits.set(Bits::YIELDED, true);
                            Verdict::Keep
                        }
                        Pumped::Ended => Verdict::Close,
                    };
                }
                Phase::H2 => {
                    let rotate = self.bits.has(Bits::ROTATE);
                    let Some(s) = self
                        .busy
                        .as_mut()
                        .and_then(|b| b.h2.as_mut().and_then(|h| h.downcast_mut::<h2::Session>()))
                    else {
                        return Verdict::Close;
                    };
                    if svc.draining || rotate {
                        s.drain(svc.clock.now_us);
                    }
                    let peer = h2::Peer {
                        key,
                        peer: self.peer,
                        listener: usize::from(self.listener),
                        tls: s.tls,
                    };
                    match s.drive(&peer, svc, &mut bytes) {
                        h2::Driven::Wait => return Verdict::Keep,
                        h2::Driven::Budget => {
                            self.bits.set(Bits::YIELDED, true);
                            return Verdict::Keep;
                        }
                        h2::Driven::Closed => self.linger_after_h2(svc),
                    }
                }
                Phase::Linger => {
                    // Read and drop until the client closes or the socket is empty.
                    self.busy(svc).discard_input();
                    match self.fill(svc) {
                        Ok(true) => continue,
                        Ok(false) => return Verdict::Keep,
                        Err(_) => return Verdict::Close,
                    }
                }
            }
        }
    }

    /// Queued output is to be written, then `after`: a new response, a new rate period.
    fn start_writing(&mut self, after: After, svc: &Services) {
        if let Some(busy) = self.busy.as_deref_mut() {
            busy.rate = RateWindow::starting(svc.clock.now_us);
        }
        self.phase = Phase::Write(after);
    }

    /// Gives the buffers back to the pool when they hold nothing, so an idle
    /// connection holds none.
    fn park(&mut self, svc: &mut Services) {
        if self.phase == Phase::Linger {
            return;
        }
        if self.busy.as_ref().is_some_and(|b| b.idle()) {
            let busy = self.busy.take().expect("checked");
            svc.give_busy(busy);
        }
    }

    /// Queues the answer to an unparseable request.
    fn reject(&mut self, svc: &mut Services, status: Status, e: RequestError) {
        forkd_shared::info!("client {} sent a bad request: {}", self.peer, e.reason());
        let busy = self.busy(svc);
        busy.in_start = busy.in_end; // nothing after it can be trusted
        self.simple_error(svc, status, usize::from(self.server));
    }

    /// Queues an error page that closes the connection, and logs it.
    fn simple_error(&mut self, svc: &mut Services, status: Status, server: usize) {
        let busy = self.busy.get_or_insert_with(|| svc.take_busy());
        dispatch::error_page(
            &mut busy.out,
            svc,
            status,
            server,
            self.peer,
            self.head_since,
        );
    }
}

/// Turns a proxied exchange that ended in a 101 into a tunnel: its upstream socket
/// and token, the upstream's bytes after the head, the client's after its request.
/// None if the exchange holds no switched socket (then the connection closes).
fn open_tunnel(
    mut p: crate::upstreams::Proxied,
    busy: &mut crate::busy::Busy,
    svc: &mut Services,
) -> Option<Tunnel> {
    let (Some((socket, rest)), Some(token)) = (p.upgraded.take(), p.token) else {
        if let Some(token) = p.token {
            svc.upstreams.forget(token);
        }
        return None;
    };
    let idle = svc
        .config
        .upstreams
        .get(p.upstream)
        .map_or(std::time::Duration::from_secs(3600), |u| {
            u.tunnel_idle_timeout
        });
    let server = p.server_index().map(|s| (p.upstream, s));
    let tunnel = Tunnel::open(
        socket,
        token,
        server,
        &busy.inbuf[busy.in_start..busy.in_end],
        &rest,
        idle,
        svc.clock.now_us,
    );
    svc.stats.bump(counters::TUNNELS_OPENED, 1);
    busy.discard_input();
    Some(tunnel)
}

/// Takes the proxied exchange out of the connection's buffers.
fn busy_proxy(busy: &mut Option<Box<Busy>>) -> Option<Box<crate::upstreams::Proxied>> {
    busy.as_mut()?.proxy.take()
}
/// The build that serves keeps an idle connection's `Conn` within 96 bytes (with its
/// TLS session pointer): a release build that grows it does not compile.
#[cfg(not(debug_assertions))]
const _: () = assert!(std::mem::size_of::<Conn>() <= 96);

#[cfg(test)]
mod tests {
    /// An idle keep-alive connection costs its `Conn` in the slab and nothing else: keep
    /// it small (issue: at most 256 bytes of memory per idle connection).
    #[test]
    fn an_idle_connection_is_small() {
        // mio's `TcpStream` carries a selector id in debug builds only (16 bytes
        // there, 4 in release): the release bound is checked when compiling, below.
        let bound = if cfg!(debug_assertions) { 104 } else { 96 };
        assert!(
            std::mem::size_of::<super::Conn>() <= bound,
            "{}",
            std::mem::size_of::<super::Conn>()
        );
    }
}

//! One client connection: its state machine and its I/O.
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
//! ```
//!
//! Requests are answered in order; a buffer full of pipelined requests produces one
//! batch of responses and one `write`. Input is only read while nothing is waiting
//! to be written, so a client that does not read its responses stops being read.

use crate::access_log;
use crate::event_loop::Services;
use crate::handlers::health::{self, Probe};
use crate::handlers::static_files::{self, StaticRoute};
use crate::handlers::status::{self, Format};
use crate::handlers::{Outcome, Reply};
use crate::http::chunked::{ChunkedDecoder, ChunkedError};
use crate::http::request::{self, BodyKind, Method, Request, RequestError, Version};
use crate::http::response::{self, Persistence, Status};
use crate::out::{Flush, OutQueue};
use crate::timers::{Deadline, Micros};
use forkd_shared::config::{Handler, Server};
use mio::net::TcpStream;
use std::io::{self, Read};
use std::net::{IpAddr, Shutdown};
use std::time::Duration;

/// How long a closing connection's input is drained so the client reads the response
/// instead of a reset.
const LINGER: Micros = 2_000_000;
/// While draining, an idle keep-alive connection is closed after this much idleness.
const DRAIN_IDLE_GRACE: Micros = 500_000;
/// Stop answering pipelined requests and write once this much output is queued.
const BATCH_BYTES: usize = 64 * 1024;

/// What to do once the queued output is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    ReadHead,
    Close,
    /// Close our side, then drain the client's input for a while before closing.
    Linger,
}

/// A request body being read and discarded.
enum Body {
    Length(u64),
    Chunked(ChunkedDecoder),
}

/// A request whose body is being read: answered once the body is in.
struct PendingBody {
    /// A copy of the request head, parsed again to answer.
    head: Box<[u8]>,
    body: Body,
    server: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for (the rest of) a request head.
    ReadHead,
    /// Reading a request body (see `Busy::body`).
    ReadBody,
    /// Writing queued responses.
    Write(After),
    /// Response sent and our side shut down: discarding input until EOF or timeout.
    Linger,
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

/// What a connection holds only while it has work: buffers and a body under way.
/// Taken from a pool when bytes arrive and given back when the connection is idle
/// again, so an idle keep-alive connection is just its `Conn` (about 80 bytes).
pub struct Busy {
    inbuf: Vec<u8>,
    in_start: usize,
    in_end: usize,
    out: OutQueue,
    body: Option<PendingBody>,
}

impl Busy {
    /// A fresh one, with an input buffer of `in_capacity` bytes.
    pub fn new(in_capacity: usize) -> Box<Busy> {
        Box::new(Busy {
            inbuf: vec![0; in_capacity],
            in_start: 0,
            in_end: 0,
            out: OutQueue::default(),
            body: None,
        })
    }

    /// The size of its input buffer (to drop it when the configuration wants another).
    pub fn in_capacity(&self) -> usize {
        self.inbuf.len()
    }

    fn idle(&self) -> bool {
        self.in_start == self.in_end && self.out.is_empty() && self.body.is_none()
    }

    /// Empties it for reuse by another connection (the buffers stay allocated).
    pub fn reset(&mut self) {
        self.in_start = 0;
        self.in_end = 0;
        self.body = None;
        self.out.clear();
    }
}

pub struct Conn {
    stream: TcpStream,
    /// The listener it came through: selects the servers it may be routed to.
    listener: u16,
    phase: Phase,
    /// The socket may have input we have not read (edge-triggered readiness).
    pub readable: bool,
    /// Registered with the poll for writability too.
    pub write_interest: bool,
    /// Registered with the poll at all.
    pub registered: bool,
    nodelay: bool,
    requests: u32,
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

/// Result of answering one parsed request.
enum Next {
    /// Look for another request in the buffer.
    Continue,
    /// A body follows; the phase is now `ReadBody`.
    Body,
    /// The connection ends after the queued output.
    Finish(After),
}

impl Conn {
    pub fn new(stream: TcpStream, peer: IpAddr, listener: usize, now: Micros) -> Conn {
        Conn {
            stream,
            listener: listener as u16,
            phase: Phase::ReadHead,
            readable: true,
            write_interest: false,
            registered: false,
            nodelay: false,
            requests: 0,
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

    fn listener(&self) -> usize {
        usize::from(self.listener)
    }

    /// Idle: between requests, with nothing buffered either way.
    pub fn is_idle(&self) -> bool {
        self.phase == Phase::ReadHead && self.busy.as_ref().is_none_or(|b| b.idle())
    }

    pub fn activity(&self) -> Activity {
        match self.phase {
            Phase::Write(_) => Activity::Writing,
            _ if self.is_idle() => Activity::Idle,
            _ => Activity::Reading,
        }
    }

    /// The client is leaving with a request under way: its body unread, or its
    /// response not fully sent (nginx's 499).
    pub fn abandoned(&self) -> bool {
        match self.phase {
            Phase::ReadBody => true,
            Phase::Write(After::ReadHead) => self.wants_write(),
            _ => false,
        }
    }

    /// Output is waiting for the socket to take it.
    pub fn wants_write(&self) -> bool {
        self.busy.as_ref().is_some_and(|b| !b.out.is_empty())
    }

    /// Gives the buffers back to the pool (the connection is closing).
    pub fn release(&mut self, svc: &mut Services) {
        if let Some(busy) = self.busy.take() {
            svc.give_busy(busy);
        }
    }

    /// The buffers, taken from the pool if the connection has none.
    fn busy(&mut self, svc: &mut Services) -> &mut Busy {
        self.busy.get_or_insert_with(|| svc.take_busy())
    }

    /// Advances the connection as far as it can go without blocking.
    pub fn drive(&mut self, key: usize, svc: &mut Services) -> Verdict {
        let verdict = self.step(svc);
        if verdict == Verdict::Keep {
            self.park(svc);
            self.arm(key, svc);
        }
        verdict
    }

    fn step(&mut self, svc: &mut Services) -> Verdict {
        loop {
            match self.phase {
                Phase::Write(then) => match self.flush(svc) {
                    Err(_) => return Verdict::Close,
                    Ok(Flush::Blocked) => return Verdict::Keep,
                    Ok(Flush::Done) => match then {
                        After::ReadHead => {
                            self.phase = Phase::ReadHead;
                            self.idle_since = svc.clock.now_us;
                            if !self.nodelay {
                                // Keep-alive from here on: a small last segment must not
                                // wait for a delayed ACK. Once per connection.
                                self.nodelay = true;
                                let _ = self.stream.set_nodelay(true);
                            }
                        }
                        After::Close => return Verdict::Close,
                        After::Linger => {
                            let _ = self.stream.shutdown(Shutdown::Write);
                            self.phase = Phase::Linger;
                            self.idle_since = svc.clock.now_us;
                        }
                    },
                },
                Phase::ReadHead => {
                    match self.answer_buffered(svc) {
                        Some(after) => {
                            self.phase = Phase::Write(after);
                            continue;
                        }
                        None if self.phase == Phase::ReadBody => continue,
                        None => {}
                    }
                    if self.wants_write() {
                        self.phase = Phase::Write(After::ReadHead);
                        continue;
                    }
                    match self.fill(svc) {
                        Ok(true) => continue,
                        Ok(false) => return Verdict::Keep,
                        Err(_) => return Verdict::Close,
                    }
                }
                Phase::ReadBody => {
                    if self.wants_write() {
                        // `100 Continue`: send it before waiting for the body.
                        match self.flush(svc) {
                            Err(_) => return Verdict::Close,
                            Ok(Flush::Blocked) => return Verdict::Keep,
                            Ok(Flush::Done) => {}
                        }
                    }
                    match self.discard_body(svc) {
                        Some(after) => {
                            self.phase = Phase::Write(after);
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
                Phase::Linger => {
                    // Read and drop until the client closes or the socket is empty.
                    loop {
                        let busy = self.busy(svc);
                        busy.in_start = 0;
                        busy.in_end = 0;
                        match self.fill(svc) {
                            Ok(true) => continue,
                            Ok(false) => return Verdict::Keep,
                            Err(_) => return Verdict::Close,
                        }
                    }
                }
            }
        }
    }

    /// Answers every complete request in the input buffer. Returns `Some(after)` when
    /// the connection must stop reading requests (it closes after the output);
    /// `None` when it needs more input or has entered `ReadBody`, or when a batch of
    /// output should be written first.
    fn answer_buffered(&mut self, svc: &mut Services) -> Option<After> {
        let busy = self.busy.as_deref_mut()?;
        let default_server = svc.routing[usize::from(self.listener)].default;
        let max_header = svc.config.servers[default_server].max_header_bytes;
        loop {
            if busy.in_start == busy.in_end {
                return None;
            }
            if busy.out.mem_len() >= BATCH_BYTES || busy.out.has_file() {
                return None; // write this batch first
            }
            // Borrow the input buffer and the rest separately: the parsed request
            // points into the buffer while its answer is queued.
            let Busy {
                inbuf,
                in_start,
                in_end,
                out,
                body,
            } = &mut *busy;
            let buf = &inbuf[*in_start..*in_end];
            let step = match request::parse(buf, max_header) {
                Ok(Some(req)) => {
                    let parts = Parts {
                        out,
                        body,
                        phase: &mut self.phase,
                        requests: &mut self.requests,
                        peer: self.peer,
                        listener: usize::from(self.listener),
                        started: self.head_since,
                    };
                    let next = answer(parts, svc, &req, &buf[..req.head_len]);
                    Ok(Some((req.head_len, next)))
                }
                Ok(None) => Ok(None),
                Err(e) => Err(e),
            };
            match step {
                Ok(Some((head_len, next))) => {
                    busy.in_start += head_len;
                    if busy.in_start == busy.in_end {
                        busy.in_start = 0;
                        busy.in_end = 0;
                    }
                    match next {
                        Next::Continue => continue,
                        Next::Body => return None,
                        Next::Finish(after) => return Some(after),
                    }
                }
                Ok(None) => {
                    if busy.in_start > 0 {
                        // Make room at the end of the buffer for the rest of the head.
                        busy.inbuf.copy_within(busy.in_start..busy.in_end, 0);
                        busy.in_end -= busy.in_start;
                        busy.in_start = 0;
                    }
                    return None;
                }
                Err(e) => {
                    self.reject(svc, e.status(), e);
                    return Some(After::Linger);
                }
            }
        }
    }

    /// Consumes body bytes from the input buffer. When the body is complete, answers
    /// the request (`Some` if the connection then closes).
    fn discard_body(&mut self, svc: &mut Services) -> Option<After> {
        let busy = self.busy.as_deref_mut()?;
        let pending = busy.body.as_mut()?;
        let server = pending.server;
        let available = &busy.inbuf[busy.in_start..busy.in_end];
        let (used, done) = match &mut pending.body {
            Body::Length(remaining) => {
                let used = (*remaining).min(available.len() as u64);
                *remaining -= used;
                (used as usize, *remaining == 0)
            }
            Body::Chunked(decoder) => match decoder.decode(available) {
                Ok(used) => (used, decoder.is_done()),
                Err(e) => {
                    let status = match e {
                        ChunkedError::BadFraming => Status::BAD_REQUEST,
                        ChunkedError::TooLarge => Status::CONTENT_TOO_LARGE,
                    };
                    busy.body = None;
                    busy.in_start = busy.in_end; // the rest cannot be trusted
                    self.phase = Phase::ReadHead;
                    self.simple_error(svc, status, server);
                    return Some(After::Linger);
                }
            },
        };
        busy.in_start += used;
        if busy.in_start == busy.in_end {
            busy.in_start = 0;
            busy.in_end = 0;
        }
        if !done {
            return None;
        }
        let head = busy.body.take().expect("checked above").head;
        self.phase = Phase::ReadHead;
        match request::parse(&head, head.len()) {
            Ok(Some(req)) => {
                let parts = Parts {
                    out: &mut busy.out,
                    body: &mut busy.body,
                    phase: &mut self.phase,
                    requests: &mut self.requests,
                    peer: self.peer,
                    listener: usize::from(self.listener),
                    started: self.head_since,
                };
                match respond(parts, svc, &req, server) {
                    Persistence::Close => Some(After::Close),
                    _ => None,
                }
            }
            // It parsed before being copied; parsing it again cannot fail.
            _ => Some(After::Close),
        }
    }

    /// Reads what the socket has into the input buffer. `Ok(true)`: got bytes;
    /// `Ok(false)`: nothing more now; `Err`: EOF or error (close).
    fn fill(&mut self, svc: &mut Services) -> io::Result<bool> {
        if !self.readable {
            return Ok(false);
        }
        let now = svc.clock.now_us;
        let starts_head = self.phase == Phase::ReadHead;
        let busy = self.busy.get_or_insert_with(|| svc.take_busy());
        if busy.in_end == busy.inbuf.len() {
            if busy.in_start == 0 {
                // A full buffer that holds no complete head: the parser reports
                // 414/431 before this; a body is consumed as it arrives.
                return Err(io::ErrorKind::OutOfMemory.into());
            }
            busy.inbuf.copy_within(busy.in_start..busy.in_end, 0);
            busy.in_end -= busy.in_start;
            busy.in_start = 0;
        }
        let space = busy.inbuf.len() - busy.in_end;
        loop {
            match self.stream.read(&mut busy.inbuf[busy.in_end..]) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    if busy.in_start == busy.in_end && starts_head {
                        self.head_since = now;
                    }
                    busy.in_end += n;
                    self.progress = now;
                    svc.stats.bytes_in(n as u64);
                    // A short read drained the socket: the next edge will tell us of more.
                    self.readable = n == space;
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.readable = false;
                    return Ok(false);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    fn flush(&mut self, svc: &Services) -> io::Result<Flush> {
        let Some(busy) = self.busy.as_deref_mut() else {
            return Ok(Flush::Done);
        };
        let mut sent = 0;
        let result = busy.out.flush(&mut self.stream, &mut sent);
        if sent > 0 {
            self.progress = svc.clock.now_us;
            svc.stats.bytes_out(sent);
        }
        result
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

    /// Sets the deadline for the phase the connection waits in.
    fn arm(&mut self, key: usize, svc: &mut Services) {
        let server = &svc.config.servers[svc.routing[self.listener()].default];
        let us = |d: Duration| d.as_micros() as Micros;
        let has_input = self.busy.as_ref().is_some_and(|b| b.in_start != b.in_end);
        let at = match self.phase {
            Phase::ReadHead if !has_input => {
                if self.requests == 0 {
                    self.idle_since + us(server.header_timeout)
                } else if svc.draining {
                    self.idle_since + us(server.keepalive_timeout).min(DRAIN_IDLE_GRACE)
                } else {
                    self.idle_since + us(server.keepalive_timeout)
                }
            }
            Phase::ReadHead => self.head_since + us(server.header_timeout),
            Phase::ReadBody => {
                let s = self
                    .busy
                    .as_ref()
                    .and_then(|b| b.body.as_ref())
                    .map_or(0, |p| p.server);
                self.progress + us(svc.server(s).body_timeout)
            }
            Phase::Write(_) => self.progress + us(server.send_timeout),
            Phase::Linger => self.idle_since + LINGER,
        };
        svc.timers.set(key, &mut self.deadline, at);
    }

    /// The deadline passed: answer 408 where a request was under way, or close.
    pub fn on_timeout(&mut self, key: usize, svc: &mut Services) -> Verdict {
        let has_input = self.busy.as_ref().is_some_and(|b| b.in_start != b.in_end);
        match self.phase {
            Phase::ReadHead if !has_input => self.close_if_quiet(key, svc),
            Phase::ReadHead | Phase::ReadBody => {
                let busy = self.busy(svc);
                let server = busy.body.take().map(|p| p.server);
                busy.in_start = 0;
                busy.in_end = 0;
                let server = server.unwrap_or(svc.routing[self.listener()].default);
                self.phase = Phase::ReadHead;
                self.simple_error(svc, Status::REQUEST_TIMEOUT, server);
                // Linger: input that arrived unread must not turn the close into a reset
                // that destroys the 408 before the client reads it.
                self.phase = Phase::Write(After::Linger);
                self.drive(key, svc)
            }
            Phase::Write(_) => {
                forkd_shared::info!("client {} timed out reading its response", self.peer);
                Verdict::Close
            }
            Phase::Linger => Verdict::Close,
        }
    }

    /// Drain began: an idle connection that has been idle for the grace closes now;
    /// one that just finished a response gets the rest of the grace (its client is
    /// likely about to send, and will get `Connection: close`); a busy one closes after
    /// its current response.
    pub fn on_drain(&mut self, key: usize, svc: &mut Services) -> Verdict {
        if self.is_idle() && self.idle_since + DRAIN_IDLE_GRACE <= svc.clock.now_us {
            return self.close_if_quiet(key, svc);
        }
        self.arm(key, svc);
        Verdict::Keep
    }

    /// An idle connection is about to be closed: first look at the socket once more.
    /// A request may have arrived that the event loop has not reported yet (it is
    /// behind in its events, or the worker was not scheduled for a while); closing now
    /// would reset it. If one did, it is answered (with `Connection: close` while
    /// draining) instead.
    fn close_if_quiet(&mut self, key: usize, svc: &mut Services) -> Verdict {
        self.readable = true;
        match self.drive(key, svc) {
            Verdict::Keep if self.is_idle() => Verdict::Close,
            verdict => verdict,
        }
    }

    /// Queues the answer to an unparseable request.
    fn reject(&mut self, svc: &mut Services, status: Status, e: RequestError) {
        forkd_shared::info!("client {} sent a bad request: {}", self.peer, e.reason());
        let busy = self.busy(svc);
        busy.in_start = busy.in_end; // nothing after it can be trusted
        let server = svc.routing[self.listener()].default;
        self.simple_error(svc, status, server);
    }

    /// Queues an error page that closes the connection, and logs it.
    fn simple_error(&mut self, svc: &mut Services, status: Status, server: usize) {
        let date = *svc.clock.http_date_array();
        let busy = self.busy.get_or_insert_with(|| svc.take_busy());
        ensure_out(&mut busy.out);
        let body_bytes = response::error(
            busy.out.bytes(),
            status,
            &date,
            Persistence::Close,
            &[],
            false,
        );
        let latency = svc.clock.precise_us().saturating_sub(self.head_since);
        svc.stats.response(status.0, Some(latency));
        if svc.logs.enabled(server) {
            let entry = access_log::Entry {
                peer: self.peer,
                method: "-",
                target: b"",
                http10: false,
                status: status.0,
                body_bytes,
                referer: None,
                user_agent: None,
            };
            svc.logs.record(server, &entry, svc.clock.log_time());
        }
    }
}

/// Output buffers stay with their `Busy` (which is pooled), so this allocates only for
/// a fresh one.
fn ensure_out(out: &mut OutQueue) {
    if !out.has_buffer() {
        out.attach(Vec::with_capacity(OUT_CAPACITY));
    }
}

/// Initial size of an output buffer: a few responses' heads and small bodies.
const OUT_CAPACITY: usize = 16 * 1024;

/// The fields of a connection that answering a request touches, borrowed apart from
/// the input buffer the request itself borrows.
struct Parts<'c> {
    out: &'c mut OutQueue,
    body: &'c mut Option<PendingBody>,
    phase: &'c mut Phase,
    requests: &'c mut u32,
    peer: IpAddr,
    listener: usize,
    /// When the request's first byte arrived.
    started: Micros,
}

/// Picks the server for `host` among those on the connection's listener.
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
    }
    routing.default
}

/// Answers one parsed request: frames its body, or responds right away.
fn answer(mut c: Parts, svc: &mut Services, req: &Request, head: &[u8]) -> Next {
    let server = select_server(svc, c.listener, req.host);
    let limit = svc.config.servers[server].max_body_bytes;
    let body = match req.body {
        BodyKind::None => None,
        BodyKind::Length(n) if n > limit => {
            *c.requests = c.requests.saturating_add(1);
            too_large(&mut c, svc, req, server);
            return Next::Finish(After::Linger);
        }
        BodyKind::Length(n) => Some(Body::Length(n)),
        BodyKind::Chunked => Some(Body::Chunked(ChunkedDecoder::new(limit))),
    };
    if let Some(body) = body {
        ensure_out(c.out);
        if req.expect_continue {
            c.out
                .bytes()
                .extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
            svc.stats.response(100, None);
        }
        *c.body = Some(PendingBody {
            head: Box::from(head),
            body,
            server,
        });
        *c.phase = Phase::ReadBody;
        return Next::Body;
    }
    match respond(c, svc, req, server) {
        Persistence::Close => Next::Finish(After::Close),
        _ => Next::Continue,
    }
}

fn too_large(c: &mut Parts, svc: &mut Services, req: &Request, server: usize) {
    ensure_out(c.out);
    let mut reply = Reply {
        out: c.out,
        date: svc.clock.http_date(),
        persistence: Persistence::Close,
        head_only: req.method == Method::Head,
    };
    let outcome = reply.error(Status::CONTENT_TOO_LARGE, &[]);
    let latency = svc.clock.precise_us().saturating_sub(c.started);
    svc.stats.response(outcome.status.0, Some(latency));
    log_request(svc, server, c.peer, req, &outcome);
}

/// Runs the route's handler and queues its response. Returns the persistence used.
fn respond(c: Parts, svc: &mut Services, req: &Request, server_index: usize) -> Persistence {
    *c.requests = c.requests.saturating_add(1);
    // A body may have been read across a configuration change: fall back to the first
    // server if this one is gone.
    let server_index = server_index.min(svc.config.servers.len() - 1);
    let server: &Server = &svc.config.servers[server_index];
    let keep = req.keep_alive
        && !svc.draining
        && (server.keepalive_requests == 0 || u64::from(*c.requests) < server.keepalive_requests);
    let persistence = match (keep, req.version) {
        (false, _) => Persistence::Close,
        (true, Version::Http10) => Persistence::KeepAlive10,
        (true, Version::Http11) => Persistence::KeepAlive11,
    };
    ensure_out(c.out);
    let mut reply = Reply {
        out: c.out,
        date: svc.clock.http_date(),
        persistence,
        head_only: req.method == Method::Head,
    };
    let outcome = match server.route_index(req.path) {
        None => reply.error(Status::NOT_FOUND, &[]),
        Some(route_index) => match &server.routes[route_index].handler {
            Handler::Liveness => {
                health::serve(Probe::Liveness, req.method, svc.draining, &mut reply)
            }
            Handler::Readiness => {
                health::serve(Probe::Readiness, req.method, svc.not_ready, &mut reply)
            }
            Handler::Status => {
                status::serve(Format::Json, req.method, svc.stats.region(), &mut reply)
            }
            Handler::Metrics => status::serve(
                Format::Prometheus,
                req.method,
                svc.stats.region(),
                &mut reply,
            ),
            Handler::Static { root, index } => {
                let id = server_index << 16 | route_index;
                let route = StaticRoute { id, root, index };
                static_files::serve(&route, req, &mut svc.cache, svc.clock.unix_secs, &mut reply)
            }
            // Interim, until the proxy is integrated into the event loop (proxy/).
            Handler::Proxy { .. } => reply.error(Status::NOT_IMPLEMENTED, &[]),
        },
    };
    let latency = svc.clock.precise_us().saturating_sub(c.started);
    svc.stats.response(outcome.status.0, Some(latency));
    if outcome.logged {
        log_request(svc, server_index, c.peer, req, &outcome);
    }
    persistence
}

fn log_request(svc: &mut Services, server: usize, peer: IpAddr, req: &Request, outcome: &Outcome) {
    if !svc.logs.enabled(server) {
        return;
    }
    let entry = access_log::Entry {
        peer,
        method: req.method_name,
        target: req.target,
        http10: req.version == Version::Http10,
        status: outcome.status.0,
        body_bytes: outcome.body_bytes,
        referer: req.referer,
        user_agent: req.user_agent,
    };
    svc.logs.record(server, &entry, svc.clock.log_time());
}
#[cfg(test)]
mod tests {
    /// An idle keep-alive connection costs its `Conn` in the slab and nothing else: keep
    /// it small (issue: at most 256 bytes of memory per idle connection).
    #[test]
    fn an_idle_connection_is_small() {
        assert!(
            std::mem::size_of::<super::Conn>() <= 96,
            "{}",
            std::mem::size_of::<super::Conn>()
        );
    }
}

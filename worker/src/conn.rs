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
use crate::timers::Deadline;
use forkd_shared::config::{Handler, Server};
use mio::net::TcpStream;
use std::io::{self, Read};
use std::net::{Shutdown, SocketAddr};
use std::time::{Duration, Instant};

/// How long a closing connection's input is drained so the client reads the response
/// instead of a reset.
const LINGER: Duration = Duration::from_secs(2);
/// While draining, an idle keep-alive connection is closed after this much idleness.
const DRAIN_IDLE_GRACE: Duration = Duration::from_millis(500);
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

enum Phase {
    /// Waiting for (the rest of) a request head.
    ReadHead,
    /// Reading a request body; `head` is a copy of the request head, answered once the
    /// body is in.
    ReadBody {
        head: Box<[u8]>,
        body: Body,
        server: usize,
    },
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

pub struct Conn {
    stream: TcpStream,
    peer: SocketAddr,
    /// The listener it came through: selects the servers it may be routed to.
    listener: usize,
    phase: Phase,
    inbuf: Vec<u8>,
    in_start: usize,
    in_end: usize,
    out: OutQueue,
    requests: u64,
    pub deadline: Deadline,
    /// When the connection became idle (or was accepted).
    idle_since: Instant,
    /// When the first byte of the current head arrived.
    head_since: Instant,
    /// Last time a read or write made progress.
    progress: Instant,
    /// The socket may have input we have not read (edge-triggered readiness).
    pub readable: bool,
    /// Registered with the poll for writability too.
    pub write_interest: bool,
    /// Registered with the poll at all.
    pub registered: bool,
    nodelay: bool,
    /// Bytes written, for the stats.
    pub bytes_out: u64,
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
    pub fn new(stream: TcpStream, peer: SocketAddr, listener: usize, now: Instant) -> Conn {
        Conn {
            stream,
            peer,
            listener,
            phase: Phase::ReadHead,
            inbuf: Vec::new(),
            in_start: 0,
            in_end: 0,
            out: OutQueue::default(),
            requests: 0,
            deadline: Deadline::default(),
            idle_since: now,
            head_since: now,
            progress: now,
            readable: true,
            write_interest: false,
            registered: false,
            nodelay: false,
            bytes_out: 0,
        }
    }

    pub fn stream(&mut self) -> &mut TcpStream {
        &mut self.stream
    }

    /// Idle: between requests, with nothing buffered either way.
    pub fn is_idle(&self) -> bool {
        matches!(self.phase, Phase::ReadHead) && self.in_start == self.in_end && self.out.is_empty()
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
            Phase::ReadBody { .. } => true,
            Phase::Write(After::ReadHead) => !self.out.is_empty(),
            _ => false,
        }
    }

    /// Output is waiting for the socket to take it.
    pub fn wants_write(&self) -> bool {
        !self.out.is_empty()
    }

    /// Gives the buffers back to the pools (the connection is closing).
    pub fn release(&mut self, svc: &mut Services) {
        if self.inbuf.capacity() > 0 {
            svc.in_pool.give(std::mem::take(&mut self.inbuf));
        }
        if let Some(buf) = self.out.detach() {
            svc.out_pool.give(buf);
        }
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
                            self.idle_since = svc.clock.now;
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
                            self.idle_since = svc.clock.now;
                        }
                    },
                },
                Phase::ReadHead => {
                    match self.answer_buffered(svc) {
                        Some(after) => {
                            self.phase = Phase::Write(after);
                            continue;
                        }
                        None if matches!(self.phase, Phase::ReadBody { .. }) => continue,
                        None => {}
                    }
                    if !self.out.is_empty() {
                        self.phase = Phase::Write(After::ReadHead);
                        continue;
                    }
                    match self.fill(svc) {
                        Ok(true) => continue,
                        Ok(false) => return Verdict::Keep,
                        Err(_) => return Verdict::Close,
                    }
                }
                Phase::ReadBody { .. } => {
                    if !self.out.is_empty() {
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
                        None if matches!(self.phase, Phase::ReadHead) => continue,
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
                        self.in_start = 0;
                        self.in_end = 0;
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
        loop {
            if self.in_start == self.in_end {
                return None;
            }
            if self.out.mem_len() >= BATCH_BYTES || self.out.has_file() {
                return None; // write this batch first
            }
            let default_server = svc.routing[self.listener].default;
            let max_header = svc.config.servers[default_server].max_header_bytes;
            // Borrow the input buffer and the rest of the connection separately: the
            // parsed request points into the buffer while its answer is queued.
            let Conn {
                inbuf,
                in_start,
                in_end,
                out,
                phase,
                requests,
                peer,
                listener,
                head_since,
                ..
            } = self;
            let buf = &inbuf[*in_start..*in_end];
            let step = match request::parse(buf, max_header) {
                Ok(Some(req)) => {
                    let parts = Parts {
                        out,
                        phase,
                        requests,
                        peer: *peer,
                        listener: *listener,
                        started: *head_since,
                    };
                    let next = answer(parts, svc, &req, &buf[..req.head_len]);
                    Ok(Some((req.head_len, next)))
                }
                Ok(None) => Ok(None),
                Err(e) => Err(e),
            };
            match step {
                Ok(Some((head_len, next))) => {
                    self.in_start += head_len;
                    if self.in_start == self.in_end {
                        self.in_start = 0;
                        self.in_end = 0;
                    }
                    match next {
                        Next::Continue => continue,
                        Next::Body => return None,
                        Next::Finish(after) => return Some(after),
                    }
                }
                Ok(None) => {
                    if self.in_start > 0 {
                        // Make room at the end of the buffer for the rest of the head.
                        self.inbuf.copy_within(self.in_start..self.in_end, 0);
                        self.in_end -= self.in_start;
                        self.in_start = 0;
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
        let Phase::ReadBody { body, server, .. } = &mut self.phase else {
            return None;
        };
        let server = *server;
        let available = &self.inbuf[self.in_start..self.in_end];
        let (used, done) = match body {
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
                    self.phase = Phase::ReadHead;
                    self.in_start = self.in_end; // the rest cannot be trusted
                    self.simple_error(svc, status, server);
                    return Some(After::Linger);
                }
            },
        };
        self.in_start += used;
        if self.in_start == self.in_end {
            self.in_start = 0;
            self.in_end = 0;
        }
        if !done {
            return None;
        }
        let Phase::ReadBody { head, .. } = std::mem::replace(&mut self.phase, Phase::ReadHead)
        else {
            unreachable!("checked above");
        };
        let max_header = head.len();
        match request::parse(&head, max_header) {
            Ok(Some(req)) => match respond(self.parts(), svc, &req, server) {
                Persistence::Close => Some(After::Close),
                _ => None,
            },
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
        if self.inbuf.capacity() == 0 {
            self.inbuf = svc.in_pool.take();
        }
        if self.in_end == self.inbuf.len() {
            if self.in_start == 0 {
                // A full buffer that holds no complete head: the parser reports
                // 414/431 before this; a body is consumed as it arrives.
                return Err(io::ErrorKind::OutOfMemory.into());
            }
            self.inbuf.copy_within(self.in_start..self.in_end, 0);
            self.in_end -= self.in_start;
            self.in_start = 0;
        }
        let space = self.inbuf.len() - self.in_end;
        loop {
            match self.stream.read(&mut self.inbuf[self.in_end..]) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    if self.in_start == self.in_end && matches!(self.phase, Phase::ReadHead) {
                        self.head_since = svc.clock.now;
                    }
                    self.in_end += n;
                    self.progress = svc.clock.now;
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
        let before = self.bytes_out;
        let result = self.out.flush(&mut self.stream, &mut self.bytes_out);
        if self.bytes_out != before {
            self.progress = svc.clock.now;
            svc.stats.bytes_out(self.bytes_out - before);
        }
        result
    }

    /// Returns buffers to the pools when they are empty, so an idle connection holds none.
    fn park(&mut self, svc: &mut Services) {
        if self.in_start == self.in_end
            && self.inbuf.capacity() > 0
            && !matches!(self.phase, Phase::Linger)
        {
            self.in_start = 0;
            self.in_end = 0;
            svc.in_pool.give(std::mem::take(&mut self.inbuf));
        }
        if let Some(buf) = self.out.detach() {
            svc.out_pool.give(buf);
        }
    }

    /// Sets the deadline for the phase the connection waits in.
    fn arm(&mut self, key: usize, svc: &mut Services) {
        let server = &svc.config.servers[svc.routing[self.listener].default];
        let at = match self.phase {
            Phase::ReadHead if self.in_start == self.in_end => {
                if self.requests == 0 {
                    self.idle_since + server.header_timeout
                } else if svc.draining {
                    self.idle_since + server.keepalive_timeout.min(DRAIN_IDLE_GRACE)
                } else {
                    self.idle_since + server.keepalive_timeout
                }
            }
            Phase::ReadHead => self.head_since + server.header_timeout,
            Phase::ReadBody { server: s, .. } => self.progress + svc.server(s).body_timeout,
            Phase::Write(_) => self.progress + server.send_timeout,
            Phase::Linger => self.idle_since + LINGER,
        };
        svc.timers.set(key, &mut self.deadline, at);
    }

    /// The deadline passed: answer 408 where a request was under way, or close.
    pub fn on_timeout(&mut self, key: usize, svc: &mut Services) -> Verdict {
        match self.phase {
            Phase::ReadHead if self.in_start == self.in_end => Verdict::Close,
            Phase::ReadHead | Phase::ReadBody { .. } => {
                let server = match self.phase {
                    Phase::ReadBody { server, .. } => server,
                    _ => svc.routing[self.listener].default,
                };
                self.phase = Phase::ReadHead;
                self.in_start = 0;
                self.in_end = 0;
                self.simple_error(svc, Status::REQUEST_TIMEOUT, server);
                self.phase = Phase::Write(After::Close);
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
        if self.is_idle() && self.idle_since + DRAIN_IDLE_GRACE <= svc.clock.now {
            return Verdict::Close;
        }
        self.arm(key, svc);
        Verdict::Keep
    }

    /// Queues the answer to an unparseable request.
    fn reject(&mut self, svc: &mut Services, status: Status, e: RequestError) {
        forkd_shared::info!("client {} sent a bad request: {}", self.peer, e.reason());
        self.in_start = self.in_end; // nothing after it can be trusted
        let server = svc.routing[self.listener].default;
        self.simple_error(svc, status, server);
    }

    /// Queues an error page that closes the connection, and logs it.
    fn simple_error(&mut self, svc: &mut Services, status: Status, server: usize) {
        self.ensure_out(svc);
        let body_bytes = response::error(
            self.out.bytes(),
            status,
            svc.clock.http_date(),
            Persistence::Close,
            &[],
            false,
        );
        svc.stats.response(status.0, None);
        if svc.logs.enabled(server) {
            let entry = access_log::Entry {
                peer: self.peer.ip(),
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

    fn ensure_out(&mut self, svc: &mut Services) {
        if !self.out.has_buffer() {
            self.out.attach(svc.out_pool.take());
        }
    }
}

/// The fields of a connection that answering a request touches, borrowed apart from
/// the input buffer the request itself borrows.
struct Parts<'c> {
    out: &'c mut OutQueue,
    phase: &'c mut Phase,
    requests: &'c mut u64,
    peer: SocketAddr,
    listener: usize,
    /// When the request's first byte arrived.
    started: Instant,
}

/// Microseconds since `start`, read from the clock now (not the loop turn's reading),
/// so time spent queued behind other connections in the same turn counts.
fn elapsed_us(start: Instant) -> u64 {
    Instant::now().saturating_duration_since(start).as_micros() as u64
}

impl Conn {
    fn parts(&mut self) -> Parts<'_> {
        Parts {
            out: &mut self.out,
            phase: &mut self.phase,
            requests: &mut self.requests,
            peer: self.peer,
            listener: self.listener,
            started: self.head_since,
        }
    }
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
            *c.requests += 1;
            too_large(&mut c, svc, req, server);
            return Next::Finish(After::Linger);
        }
        BodyKind::Length(n) => Some(Body::Length(n)),
        BodyKind::Chunked => Some(Body::Chunked(ChunkedDecoder::new(limit))),
    };
    if let Some(body) = body {
        if !c.out.has_buffer() {
            c.out.attach(svc.out_pool.take());
        }
        if req.expect_continue {
            c.out
                .bytes()
                .extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
        }
        *c.phase = Phase::ReadBody {
            head: Box::from(head),
            body,
            server,
        };
        return Next::Body;
    }
    match respond(c, svc, req, server) {
        Persistence::Close => Next::Finish(After::Close),
        _ => Next::Continue,
    }
}

fn too_large(c: &mut Parts, svc: &mut Services, req: &Request, server: usize) {
    if !c.out.has_buffer() {
        c.out.attach(svc.out_pool.take());
    }
    let mut reply = Reply {
        out: c.out,
        date: svc.clock.http_date(),
        persistence: Persistence::Close,
        head_only: req.method == Method::Head,
    };
    let outcome = reply.error(Status::CONTENT_TOO_LARGE, &[]);
    svc.stats
        .response(outcome.status.0, Some(elapsed_us(c.started)));
    log_request(svc, server, c.peer, req, &outcome);
}

/// Runs the route's handler and queues its response. Returns the persistence used.
fn respond(c: Parts, svc: &mut Services, req: &Request, server_index: usize) -> Persistence {
    *c.requests += 1;
    // A body may have been read across a configuration change: fall back to the first
    // server if this one is gone.
    let server_index = server_index.min(svc.config.servers.len() - 1);
    let server: &Server = &svc.config.servers[server_index];
    let keep = req.keep_alive
        && !svc.draining
        && (server.keepalive_requests == 0 || *c.requests < server.keepalive_requests);
    let persistence = match (keep, req.version) {
        (false, _) => Persistence::Close,
        (true, Version::Http10) => Persistence::KeepAlive10,
        (true, Version::Http11) => Persistence::KeepAlive11,
    };
    if !c.out.has_buffer() {
        c.out.attach(svc.out_pool.take());
    }
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
        },
    };
    svc.stats
        .response(outcome.status.0, Some(elapsed_us(c.started)));
    if outcome.logged {
        log_request(svc, server_index, c.peer, req, &outcome);
    }
    persistence
}

fn log_request(
    svc: &mut Services,
    server: usize,
    peer: SocketAddr,
    req: &Request,
    outcome: &Outcome,
) {
    if !svc.logs.enabled(server) {
        return;
    }
    let entry = access_log::Entry {
        peer: peer.ip(),
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

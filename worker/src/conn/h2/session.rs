//! One HTTP/2 connection: its protocol state (`connection.rs`) over our [`Link`],
//! and its streams (`stream.rs`), driven from the event loop.
//!
//! `drive` reads what the socket has (through the inbound flood meter), takes the
//! connection's events (new requests, body bytes, resets, window changes) to the
//! streams, pumps every stream (dispatch, the proxy, framing its response within
//! the windows), and writes every frame made in that round in one write, again
//! and again until nothing moves.
//!
//! Lifecycle: `-s quit`, a retiring reload and `-s upgrade` call [`Session::drain`],
//! the two-step GOAWAY (2^31-1 with a PING, then the last stream id once the PING
//! returns); open streams finish, then the connection closes. `h2_max_requests` and
//! `h2_idle_timeout` end it the same way.

use super::connection::{Connection, Event};
use super::frame::Code;
use super::link::Link;
use super::meter::Flood;
use super::stream::{Ended, On, Stream};
use crate::services::Services;
use crate::timers::Micros;
use forkd_shared::config::H2Settings;
use forkd_shared::shm::counters;
use std::io;
use std::net::IpAddr;

/// Rounds of read, streams, write per turn of the event loop before other
/// connections get theirs.
const ROUNDS_PER_TURN: u32 = 64;

/// Frames waiting for the socket past which the client's bytes are not read: a
/// client that sends without reading (PINGs, SETTINGS, streams to be refused, each
/// answered by a frame) cannot make the output grow without bound; its next bytes
/// are read once the socket has taken ours (the writability that drives the
/// connection again).
const OUT_READ_LIMIT: usize = 256 * 1024;

/// How long the graceful close waits for its PING to come back before it sends
/// the final GOAWAY anyway (a client that does not answer is not waited for).
const PING_WAIT: Micros = 2_000_000;

/// How long a connection stays idle before it gives its buffers back: long
/// enough that a client between two batches of requests keeps them (giving them
/// back and growing them again cost a few allocations per request under load),
/// short beside any idle timeout.
const SHRINK_AFTER: Micros = 100_000;

/// Octets read from the socket at once.
const READ_CHUNK: usize = 16 * 1024;

thread_local! {
    /// The worker's one read buffer for its HTTP/2 connections (one thread, one
    /// read at a time): made once, not zeroed per read, and no connection keeps
    /// one while idle.
    static READ_BUF: std::cell::RefCell<Box<[u8]>> =
        std::cell::RefCell::new(vec![0u8; READ_CHUNK].into_boxed_slice());
}

/// Frames waiting for the socket past which streams are not pumped (they would only
/// add to it): a few DATA frames' worth.
const OUT_HIGH: usize = 64 * 1024;

/// What [`Session::drive`] leaves the connection in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driven {
    /// Waits for an event.
    Wait,
    /// Stopped on its budget with work left.
    Budget,
    /// Over: close the socket.
    Closed,
}

/// What a connection's drive needs to know of it.
pub struct Peer {
    /// The connection's slot in the event loop (stream keys are made from it).
    pub key: usize,
    pub peer: IpAddr,
    pub listener: usize,
    pub tls: bool,
}

impl Peer {
    /// What stream `slot` of this connection is passed.
    fn on<'a>(&self, slot: usize, conn: &'a mut Connection) -> On<'a> {
        On {
            key: super::stream_key(self.key, slot),
            peer: self.peer,
            listener: self.listener,
            tls: self.tls,
            conn,
        }
    }
}

pub struct Session {
    link: Link,
    conn: Connection,
    /// Of `conn.out`, the octets already written.
    written: usize,
    streams: Vec<Option<Stream>>,
    /// Of `streams`, the ones that are there.
    live: usize,
    /// Streams accepted (for `h2_max_requests`).
    accepted: u64,
    settings: H2Settings,
    /// When the graceful close began (its PING's wait is measured from it).
    drain_since: Option<Micros>,
    /// The client closed its side (or the socket failed): nothing more is read.
    read_closed: bool,
    /// A read of this drive emptied the socket: later rounds of it do not read
    /// again (the next bytes come with a readiness event, and a drive of their own).
    drained: bool,
    /// When the last stream ended (or the connection opened).
    pub idle_since: Micros,
    /// The buffers were given back since the connection was last busy.
    shrunk: bool,
    /// The connection came over TLS (its session is in the link now).
    pub tls: bool,
}

impl Session {
    pub fn new(link: Link, settings: H2Settings, now: Micros, tls: bool) -> Session {
        Session {
            link,
            conn: Connection::new(settings),
            written: 0,
            streams: Vec::new(),
            live: 0,
            accepted: 0,
            settings,
            drain_since: None,
            read_closed: false,
            drained: false,
            idle_since: now,
            shrunk: false,
            tls,
        }
    }

    /// Streams under way.
    pub fn open_streams(&self) -> usize {
        self.live
    }

    /// Output is waiting for the socket to take it (a write that blocked, TLS
    /// records): the connection wants writability.
    pub fn wants_write(&self) -> bool {
        self.link.metered.write_blocked
    }

    /// Starts the graceful close: GOAWAY, open streams finish.
    pub fn drain(&mut self, now: Micros) {
        if self.drain_since.is_some() {
            return;
        }
        self.drain_since = Some(now);
        self.conn.drain();
    }

    /// An upstream socket of stream `slot` reported readable (or `hung_up`).
    pub fn upstream_readable(&mut self, slot: usize, hung_up: bool) {
        if let Some(Some(s)) = self.streams.get_mut(slot) {
            if let Some(p) = s.proxied() {
                p.session.upstream_readable(hung_up);
            }
        }
    }

    /// The earliest deadline of the connection: its idle end, a stream's send
    /// timeout (a client that does not open its window), a proxied exchange's.
    pub fn deadline(&self, svc: &Services, server: usize) -> Micros {
        let s = svc.server(server);
        let us = |d: std::time::Duration| d.as_micros() as Micros;
        let mut at = Micros::MAX;
        let mut open = false;
        for st in self.streams.iter().flatten() {
            open = true;
            if st.stalled() {
                at = at.min(st.progress + us(s.send_timeout));
            }
            if let Some((upstream, client)) = st.deadlines(svc) {
                at = at.min(upstream).min(client);
            }
            if let Some(look) = st.cache_wait() {
                at = at.min(look);
            }
            if let Some(body) = st.body_deadline(svc) {
                at = at.min(body);
            }
        }
        match self.drain_since {
            // The final GOAWAY, if the PING has not brought it yet.
            Some(since) if !self.conn.closing() => at = at.min(since + PING_WAIT),
            Some(_) => {}
            None if !open => at = at.min(self.idle_since + us(self.settings.idle_timeout)),
            None => {}
        }
        if !open && !self.shrunk {
            at = at.min(self.idle_since + SHRINK_AFTER);
        }
        at
    }

    /// The deadline passed: an idle connection starts its graceful close (GOAWAY),
    /// a proxied stream's upstream deadline is handed to its exchange (the next
    /// drive acts on it). True if a client left a stream stalled on its window for
    /// `send_timeout`: the connection is closed (nginx's `send_timeout`).
    pub fn on_deadline(&mut self, peer: IpAddr, svc: &mut Services, server: usize) -> bool {
        let now = svc.clock.now_us;
        let send_timeout = svc.server(server).send_timeout.as_micros() as Micros;
        let mut stalled = false;
        for st in self.streams.iter_mut().flatten() {
            if st.stalled() && st.progress + send_timeout <= now {
                stalled = true;
            }
            if let Some((upstream, client)) = st.deadlines(svc) {
                if upstream <= now {
                    st.upstream_fired();
                }
                if client <= now && st.client_late(svc, now) {
                    st.too_slow(peer, svc);
                }
            }
            if st.body_deadline(svc).is_some_and(|at| at <= now) {
                st.body_timed_out(peer, svc);
            }
        }
        if self
            .drain_since
            .is_some_and(|since| now >= since + PING_WAIT)
        {
            self.conn.finish_drain();
        }
        if stalled {
            forkd_shared::info!(
                "HTTP/2 client {peer} did not open its window within send_timeout: closing"
            );
            return true;
        }
        if self.open_streams() == 0 && !self.shrunk && now >= self.idle_since + SHRINK_AFTER {
            self.shrink();
        }
        if self.open_streams() == 0
            && self.drain_since.is_none()
            && now >= self.idle_since + self.settings.idle_timeout.as_micros() as Micros
        {
            self.drain(now);
        }
        false
    }

    /// An idle connection keeps no buffers: its input, output, streams and
    /// decoded fields are freed until it is used again.
    fn shrink(&mut self) {
        if self.pending_out() > 0 {
            return;
        }
        self.conn.shrink();
        self.streams = Vec::new();
        self.shrunk = true;
    }

    /// Moves the connection and its streams as far as they go now.
    pub fn drive(&mut self, p: &Peer, svc: &mut Services, budget: &mut u64) -> Driven {
        self.drained = false;
        for _ in 0..ROUNDS_PER_TURN {
            let mut moved = self.read(p);
            if let Some(flood) = self.flood() {
                self.close_flooded(flood, p, svc);
                return Driven::Closed;
            }
            moved |= self.events(p, svc);
            if self.pending_out() < OUT_HIGH {
                moved |= self.pump(p, svc, budget);
            }
            // Logged once: the connection goes on only to write its GOAWAY.
            if let Some((code, why)) = self.conn.failure.take() {
                forkd_shared::debug!(
                    "HTTP/2 connection of {} failed: {why} (error {:#x})",
                    p.peer,
                    code.0
                );
            }
            match self.write() {
                Ok(wrote) => moved |= wrote,
                Err(e) => {
                    forkd_shared::debug!("HTTP/2 connection of {} failed: {e}", p.peer);
                    self.flush_stats(svc);
                    return Driven::Closed;
                }
            }
            self.flush_stats(svc);
            let flushed = self.pending_out() == 0 && !self.link.metered.write_blocked;
            if flushed && (self.conn.done() || (self.read_closed && self.open_streams() == 0)) {
                self.link.shutdown_write();
                return Driven::Closed;
            }
            if self.read_closed && self.conn.failed() {
                return Driven::Closed;
            }
            if !moved {
                return Driven::Wait;
            }
            if *budget == 0 {
                return Driven::Budget;
            }
        }
        Driven::Budget
    }

    /// Frames made and not yet written.
    fn pending_out(&self) -> usize {
        self.conn.out.len() - self.written
    }

    /// Reads what the socket has into the connection; true if anything came.
    fn read(&mut self, p: &Peer) -> bool {
        if self.read_closed || self.drained || self.conn.failed() {
            return false;
        }
        if self.pending_out() > OUT_READ_LIMIT {
            return false;
        }
        READ_BUF.with_borrow_mut(|buf| self.read_into(&mut buf[..], p))
    }

    fn read_into(&mut self, buf: &mut [u8], p: &Peer) -> bool {
        let mut moved = false;
        // A few reads per round: the streams of what was read run before more is
        // read, and a client cannot keep the round to itself.
        for _ in 0..4 {
            match self.link.read(buf) {
                Ok(0) => {
                    self.read_closed = true;
                    return true;
                }
                Ok(n) => {
                    moved = true;
                    if self.link.metered.flood.is_some() {
                        return true;
                    }
                    self.conn.input(&buf[..n]);
                    if !self.link.may_have_more(n, buf.len()) {
                        self.drained = true;
                        return true;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return moved,
                Err(e) => {
                    forkd_shared::debug!("HTTP/2 connection of {} failed: {e}", p.peer);
                    self.read_closed = true;
                    return true;
                }
            }
        }
        moved
    }

    /// Writes the frames made; true if any went. Under TLS, the records made are
    /// pushed too: records left over (a full socket) make the connection wait for
    /// writability like a write that blocked.
    fn write(&mut self) -> io::Result<bool> {
        let mut wrote = false;
        if !self.link.push()? {
            return Ok(false);
        }
        let mut blocked = false;
        while self.written < self.conn.out.len() {
            match self.link.write(&self.conn.out[self.written..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.written += n;
                    wrote = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    blocked = true;
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        if !blocked {
            self.link.push()?;
        }
        if self.written == self.conn.out.len() {
            self.conn.out.clear();
            self.written = 0;
            if self.conn.out.capacity() > 4 * OUT_HIGH {
                self.conn.out = Vec::new();
            }
        }
        Ok(wrote)
    }

    /// The connection's events to the streams; true if there were any.
    fn events(&mut self, p: &Peer, svc: &mut Services) -> bool {
        let mut moved = false;
        while let Some(event) = self.conn.poll() {
            moved = true;
            match event {
                Event::Request { id, end } => self.start(id, end, p, svc),
                Event::Data { id, end } => match self.slot_of(id) {
                    Some(slot) => {
                        let data = self.conn.data();
                        let ignored = match self.streams[slot].as_mut() {
                            Some(s) => s.received(data, end),
                            None => data.len(),
                        };
                        self.conn.release(id, ignored);
                    }
                    None => {
                        // A stream the session has let go of (answered early):
                        // its bytes are given back at once.
                        let n = self.conn.data().len();
                        self.conn.release(id, n);
                    }
                },
                Event::Trailers { id } => {
                    if let Some(s) = self.stream_mut(id) {
                        s.received(&[], true);
                    }
                }
                Event::Reset { id } => {
                    if let Some(s) = self.stream_mut(id) {
                        s.client_left(p.peer, svc);
                    }
                }
                Event::Window => {}
                // The connection takes no new stream from now on (`closing`).
                Event::GoAway => {}
            }
        }
        moved
    }

    fn slot_of(&self, id: u32) -> Option<usize> {
        self.streams
            .iter()
            .position(|s| s.as_ref().is_some_and(|s| s.id == id))
    }

    fn stream_mut(&mut self, id: u32) -> Option<&mut Stream> {
        let slot = self.slot_of(id)?;
        self.streams[slot].as_mut()
    }

    /// A new stream: its request dispatched.
    fn start(&mut self, id: u32, end: bool, p: &Peer, svc: &mut Services) {
        self.accepted += 1;
        self.shrunk = false;
        svc.stats.bump(counters::H2_STREAMS, 1);
        let slot = match self.streams.iter().position(|s| s.is_none()) {
            Some(i) => i,
            None => {
                self.streams.push(None);
                self.streams.len() - 1
            }
        };
        let mut on = p.on(slot, &mut self.conn);
        let stream = Stream::start(id, end, &mut on, svc);
        self.streams[slot] = Some(stream);
        self.live += 1;
        if self.accepted >= self.settings.max_requests {
            self.drain(svc.clock.now_us);
        }
    }

    /// Every stream moved as far as it goes; true if any moved.
    fn pump(&mut self, p: &Peer, svc: &mut Services, budget: &mut u64) -> bool {
        let mut moved = false;
        for slot in 0..self.streams.len() {
            let Some(stream) = self.streams[slot].as_mut() else {
                continue;
            };
            let mut on = p.on(slot, &mut self.conn);
            moved |= stream.pump(&mut on, svc, budget);
            if let Some(ended) = stream.ended() {
                let code = match ended {
                    Ended::Complete => Code::NO_ERROR,
                    Ended::Reset(code) => {
                        forkd_shared::debug!("HTTP/2 stream of {} reset", p.peer);
                        code
                    }
                };
                let stream = self.streams[slot].take().expect("checked");
                self.live -= 1;
                self.conn.finish(stream.id, code);
                // What the client sent and the stream never used: back to its window.
                self.conn.release(stream.id, stream.unread());
                stream.release(svc);
                moved = true;
                if self.open_streams() == 0 {
                    self.idle_since = svc.clock.now_us;
                }
            }
        }
        moved
    }

    fn flood(&self) -> Option<Flood> {
        self.link.metered.flood
    }

    /// A flood: GOAWAY(ENHANCE_YOUR_CALM), written as far as the socket takes it
    /// now, and counted; the caller closes the connection.
    fn close_flooded(&mut self, flood: Flood, p: &Peer, svc: &mut Services) {
        count_flood(flood, Some(p.peer), svc);
        self.conn.fail(Code::ENHANCE_YOUR_CALM, "a flood");
        let _ = self.write();
        self.flush_stats(svc);
    }

    /// What the link counted, into the worker's stats.
    fn flush_stats(&mut self, svc: &mut Services) {
        let m = &mut self.link.metered;
        if m.bytes_in > 0 {
            svc.stats.bytes_in(std::mem::take(&mut m.bytes_in));
        }
        if m.bytes_out > 0 {
            svc.stats.bytes_out(std::mem::take(&mut m.bytes_out));
        }
        let sent = m.outbound.take();
        for (counter, n) in [
            (counters::H2_REFUSED_STREAMS, sent.refused),
            (counters::H2_STREAM_ERRORS, sent.stream_errors),
            (counters::H2_GOAWAY_SENT, sent.goaway),
            (counters::H2_PROTOCOL_ERRORS, sent.connection_errors),
        ] {
            if n > 0 {
                svc.stats.bump(counter, n);
            }
        }
    }

    /// Gives every stream's buffers back (the connection is closing).
    pub fn release(&mut self, svc: &mut Services) {
        self.live = 0;
        for s in self.streams.drain(..).flatten() {
            s.release(svc);
        }
        self.flush_stats(svc);
    }
}

/// Counts a flood in the stats and logs it.
fn count_flood(flood: Flood, peer: Option<IpAddr>, svc: &mut Services) {
    let (counter, what) = match flood {
        Flood::RapidReset => (
            counters::H2_FLOOD_RAPID_RESET,
            "reset its own streams again and again (rapid reset)",
        ),
        Flood::StreamsPerRead => (
            counters::H2_FLOOD_RAPID_RESET,
            "opened more streams at once than allowed",
        ),
        Flood::Control => (
            counters::H2_FLOOD_CONTROL,
            "sent control frames far beyond its requests",
        ),
        Flood::HeaderBlock => (
            counters::H2_FLOOD_HEADERS,
            "sent a header block past h2_max_header_list",
        ),
    };
    svc.stats.bump(counter, 1);
    let peer = peer.map_or_else(|| "-".to_string(), |p| p.to_string());
    forkd_shared::warn!("HTTP/2 client {peer} {what}: closing with ENHANCE_YOUR_CALM");
}

//! One HTTP/2 connection: the `h2` crate's server connection over our [`Link`],
//! and its streams (`stream.rs`), driven from the event loop.
//!
//! No task and no runtime: `drive` polls the connection (reading and writing frames
//! until the socket blocks) and every stream, again and again until nothing moves.
//! The waker is a no-op: what wakes an HTTP/2 connection is its socket's readiness
//! (or an upstream socket's, or a deadline), and every such event drives it whole.
//!
//! Lifecycle: `-s quit`, a retiring reload and `-s upgrade` call [`Session::drain`],
//! the two-step GOAWAY (2^31-1 with a PING, then the last stream id, which `h2`
//! sends once the PING returns); open streams finish, then the connection closes.
//! `h2_max_requests` and `h2_idle_timeout` end it the same way.

use super::link::{Link, Metered};
use super::meter::Flood;
use super::stream::{Ended, On, Stream};
use crate::services::Services;
use crate::timers::Micros;
use bytes::Bytes;
use forkd_shared::config::H2Settings;
use forkd_shared::shm::counters;
use h2::server::{Connection, Handshake};
use std::cell::RefCell;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

/// Streams driven at most per turn of the event loop before others get theirs.
const ROUNDS_PER_TURN: u32 = 64;

enum State {
    Handshaking(Pin<Box<Handshake<Link, Bytes>>>),
    Open(Box<Connection<Link, Bytes>>),
}

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

pub struct Session {
    state: State,
    /// What the link inside `h2`'s connection saw.
    metered: Rc<RefCell<Metered>>,
    streams: Vec<Option<Stream>>,
    /// Streams accepted (for `h2_max_requests`).
    accepted: u64,
    settings: H2Settings,
    /// GOAWAY has been sent (or is on its way).
    draining: bool,
    /// When the last stream ended (or the connection opened).
    pub idle_since: Micros,
    /// The connection came over TLS (its session is in the link now).
    pub tls: bool,
}

/// The `h2` server as a server's `h2_*` settings make it (also what the property
/// tests of `fuzz.rs` drive).
pub(super) fn builder(settings: &H2Settings) -> h2::server::Builder {
    let mut b = h2::server::Builder::new();
    // The connection window is raised to a window per stream the client may open at
    // once, as nginx does: one slow stream does not stall the others.
    let window = settings.initial_window;
    let conn_window = u64::from(window) * u64::from(settings.max_concurrent_streams);
    b.initial_window_size(window)
        .initial_connection_window_size(conn_window.clamp(65_535, (1 << 31) - 1) as u32)
        .max_concurrent_streams(settings.max_concurrent_streams)
        .max_header_list_size(settings.max_header_list)
        .max_send_buffer_size(64 * 1024)
        .max_pending_accept_reset_streams(64)
        .max_local_error_reset_streams(Some(256));
    b
}

impl Session {
    pub fn new(link: Link, settings: H2Settings, now: Micros, tls: bool) -> Session {
        let metered = Rc::clone(&link.metered);
        Session {
            metered,
            state: State::Handshaking(Box::pin(builder(&settings).handshake(link))),
            streams: Vec::new(),
            accepted: 0,
            settings,
            draining: false,
            idle_since: now,
            tls,
        }
    }

    /// Streams under way.
    pub fn open_streams(&self) -> usize {
        self.streams.iter().filter(|s| s.is_some()).count()
    }

    /// Output is waiting for the socket to take it (a write that blocked, TLS
    /// records): the connection wants writability.
    pub fn wants_write(&self) -> bool {
        self.metered.borrow().write_blocked
    }

    /// Starts the graceful close: GOAWAY, open streams finish.
    pub fn drain(&mut self) {
        if self.draining {
            return;
        }
        self.draining = true;
        if let State::Open(c) = &mut self.state {
            c.graceful_shutdown();
        }
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
        }
        if !open {
            at = at.min(self.idle_since + us(self.settings.idle_timeout));
        }
        at
    }

    /// The deadline passed: an idle connection starts its graceful close (GOAWAY),
    /// a proxied stream's upstream deadline is handed to its exchange (the next
    /// drive acts on it). True if a client left a stream stalled on its window for
    /// `send_timeout`: the connection is closed (nginx's `send_timeout`).
    pub fn on_deadline(&mut self, peer: IpAddr, svc: &Services, server: usize) -> bool {
        let now = svc.clock.now_us;
        let send_timeout = svc.server(server).send_timeout.as_micros() as Micros;
        let mut stalled = false;
        for st in self.streams.iter_mut().flatten() {
            if st.stalled() && st.progress + send_timeout <= now {
                stalled = true;
            }
            if let Some((upstream, _)) = st.deadlines(svc) {
                if upstream <= now {
                    st.upstream_fired();
                }
            }
        }
        if stalled {
            forkd_shared::info!(
                "HTTP/2 client {peer} did not open its window within send_timeout: closing"
            );
            return true;
        }
        if self.open_streams() == 0
            && now >= self.idle_since + self.settings.idle_timeout.as_micros() as Micros
        {
            self.drain();
        }
        false
    }

    /// Moves the connection and its streams as far as they go now.
    pub fn drive(&mut self, p: &Peer, svc: &mut Services, budget: &mut u64) -> Driven {
        let waker = Waker::noop();
        let mut cx = Context::from_waker(waker);
        for _ in 0..ROUNDS_PER_TURN {
            let mut moved = false;
            let conn = match &mut self.state {
                State::Handshaking(hs) => match hs.as_mut().poll(&mut cx) {
                    Poll::Ready(Ok(conn)) => {
                        self.state = State::Open(Box::new(conn));
                        if self.draining {
                            self.draining = false;
                            self.drain();
                        }
                        continue;
                    }
                    Poll::Ready(Err(e)) => {
                        forkd_shared::debug!("HTTP/2 handshake with {} failed: {e}", p.peer);
                        return Driven::Closed;
                    }
                    Poll::Pending => return Driven::Wait,
                },
                State::Open(conn) => conn,
            };
            loop {
                match conn.poll_accept(&mut cx) {
                    Poll::Ready(Some(Ok((request, respond)))) => {
                        moved = true;
                        self.accepted += 1;
                        svc.stats.bump(counters::H2_STREAMS, 1);
                        let slot = match self.streams.iter().position(|s| s.is_none()) {
                            Some(i) => i,
                            None => {
                                self.streams.push(None);
                                self.streams.len() - 1
                            }
                        };
                        let mut on = On {
                            key: super::stream_key(p.key, slot),
                            peer: p.peer,
                            listener: p.listener,
                            tls: p.tls,
                            cx: &mut cx,
                        };
                        self.streams[slot] = Some(Stream::start(request, respond, &mut on, svc));
                        if self.accepted >= self.settings.max_requests && !self.draining {
                            self.draining = true;
                            conn.graceful_shutdown();
                        }
                    }
                    Poll::Ready(Some(Err(e))) => {
                        forkd_shared::debug!("HTTP/2 connection of {} failed: {e}", p.peer);
                        self.count_flood_stopped(p, svc);
                        self.flush_stats(Some(p.peer), svc);
                        return Driven::Closed;
                    }
                    Poll::Ready(None) => {
                        self.count_flood_stopped(p, svc);
                        self.flush_stats(Some(p.peer), svc);
                        return Driven::Closed;
                    }
                    Poll::Pending => break,
                }
            }
            for slot in 0..self.streams.len() {
                let Some(stream) = self.streams[slot].as_mut() else {
                    continue;
                };
                let mut on = On {
                    key: super::stream_key(p.key, slot),
                    peer: p.peer,
                    listener: p.listener,
                    tls: p.tls,
                    cx: &mut cx,
                };
                moved |= stream.pump(&mut on, svc, budget);
                if let Some(ended) = stream.ended() {
                    if ended == Ended::Reset {
                        forkd_shared::debug!("HTTP/2 stream of {} reset", p.peer);
                    }
                    let stream = self.streams[slot].take().expect("checked");
                    stream.release(svc);
                    moved = true;
                    if self.open_streams() == 0 {
                        self.idle_since = svc.clock.now_us;
                    }
                }
            }
            if let Some(flood) = self.flood() {
                self.close_flooded(flood, p, svc, &mut cx);
                return Driven::Closed;
            }
            self.flush_stats(Some(p.peer), svc);
            if !moved {
                return Driven::Wait;
            }
            if *budget == 0 {
                return Driven::Budget;
            }
        }
        Driven::Budget
    }

    fn flood(&self) -> Option<Flood> {
        self.metered.borrow().flood
    }

    /// A flood: GOAWAY(ENHANCE_YOUR_CALM), flushed as far as the socket takes it
    /// now, and counted; the caller closes the connection.
    fn close_flooded(&mut self, flood: Flood, p: &Peer, svc: &mut Services, cx: &mut Context) {
        count_flood(flood, Some(p.peer), svc);
        if let State::Open(c) = &mut self.state {
            c.abrupt_shutdown(h2::Reason::ENHANCE_YOUR_CALM);
            for _ in 0..4 {
                if !matches!(c.poll_accept(cx), Poll::Ready(Some(Ok(_)))) {
                    break;
                }
            }
        }
        self.flush_stats(Some(p.peer), svc);
    }

    /// The `h2` crate ended the connection (on an error of the client's, say) in
    /// the read where the meter found a flood: it is counted as one all the same.
    fn count_flood_stopped(&mut self, p: &Peer, svc: &mut Services) {
        if let Some(flood) = self.flood() {
            count_flood(flood, Some(p.peer), svc);
        }
    }

    /// What the link counted, into the worker's stats.
    fn flush_stats(&mut self, peer: Option<IpAddr>, svc: &mut Services) {
        let mut m = self.metered.borrow_mut();
        if m.bytes_in > 0 {
            svc.stats.bytes_in(std::mem::take(&mut m.bytes_in));
        }
        if m.bytes_out > 0 {
            svc.stats.bytes_out(std::mem::take(&mut m.bytes_out));
        }
        let sent = m.outbound.take();
        // A flood the meter found is counted where it was found; the ones the
        // `h2` crate stopped on its own limits are counted here.
        if m.flood.is_none() {
            for &flood in &sent.floods {
                count_flood(flood, peer, svc);
            }
        }
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
        for s in self.streams.drain(..).flatten() {
            s.release(svc);
        }
        self.flush_stats(None, svc);
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

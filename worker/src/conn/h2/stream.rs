//! One HTTP/2 stream: one exchange, answered by the same dispatch, handlers and
//! proxy as an HTTP/1.1 request.
//!
//! ```text
//!  HEADERS ─▶ request.rs: the HTTP/1.1 head ─▶ dispatch::answer ─┬─ Answered (busy.out)
//!                                                                ├─ File: the file pool's job, then answered
//!                                                                ├─ Body: DATA counted, then answered
//!                                                                └─ Proxy: proxied::advance
//!  DATA ─▶ busy.inbuf (chunked if no content-length) ─▶ the proxy's request body
//!  busy.out / the proxy's writes ─▶ Pipe (HTTP/1.1 bytes) ─▶ response.rs ─▶ HEADERS, DATA
//!                                                           (within the stream's window)
//! ```
//!
//! The handlers and the proxy write an HTTP/1.1 response into the [`Pipe`], a bounded
//! buffer: when it is full they see a full socket and wait, exactly as for a slow
//! HTTP/1.1 client; the pipe drains as the client's flow-control window allows.

use super::connection::Connection;
use super::frame::Code;
use super::request::{self, Framing};
use super::response::{Part, Reader};
use crate::busy::{Busy, PendingBody};
use crate::conn::dispatch::{self, Exchange, Next};
use crate::conn::proxied::{self, Client, ClientStream, Progress};
use crate::http::request as h1;
use crate::http::response::Status;
use crate::out::{Flush, Sink};
use crate::services::Services;
use crate::timers::Micros;
use bytes::{Buf, BytesMut};
use std::io::{self, IoSlice, Write};
use std::net::IpAddr;
use std::os::fd::BorrowedFd;

/// HTTP/1.1 response bytes a stream holds before its writer sees a full socket.
const PIPE_BYTES: usize = 64 * 1024;

/// The most a chunk's framing adds to its data: the size in hex (8 digits for a
/// DATA frame's 24-bit length, with room to spare) and two CRLFs.
const CHUNK_FRAMING: usize = 8 + 4;

/// A stream's HTTP/1.1 response as written so far, not yet framed.
#[derive(Default)]
pub struct Pipe {
    pub bytes: BytesMut,
    /// The writer is done: nothing more will come.
    pub closed: bool,
    /// The client reset the stream: writes fail, and `peek` says it left.
    pub left: bool,
}

impl Write for Pipe {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        if self.left {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        let room = PIPE_BYTES.saturating_sub(self.bytes.len());
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if room == 0 && total > 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        if self.bytes.capacity() == 0 {
            // The first write (the head, often the whole small response) sizes the
            // pipe once instead of growing it write by write.
            self.bytes.reserve(total.clamp(2048, PIPE_BYTES));
        }
        let mut taken = 0;
        for b in bufs {
            let n = b.len().min(room - taken);
            self.bytes.extend_from_slice(&b[..n]);
            taken += n;
            if taken == room {
                break;
            }
        }
        Ok(taken)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Sink for Pipe {
    /// A file's bytes are read into DATA frames: no descriptor to `sendfile` to.
    fn sendfile_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }
}

impl ClientStream for Pipe {
    fn peek(&mut self, _buf: &mut [u8]) -> io::Result<usize> {
        match self.left {
            true => Ok(0),
            false => Err(io::ErrorKind::WouldBlock.into()),
        }
    }
}

thread_local! {
    /// Where a new stream's request is written as an HTTP/1.1 head before it goes
    /// into the stream's input: one per worker, reused.
    static HEAD_SCRATCH: std::cell::RefCell<Vec<u8>> =
        std::cell::RefCell::new(Vec::with_capacity(1024));
}

/// What the stream's exchange is doing.
enum Work {
    /// A request with a body on a route that does not proxy: the body is counted
    /// (and dropped) to its end, then the request answered.
    Body { pending: PendingBody, received: u64 },
    /// The head (in `busy.inbuf`) waits for the file pool's job; the connection's
    /// other streams run meanwhile.
    File(crate::file_pool::JobId),
    /// The head (in `busy.inbuf`) waits for another request's fetch of its cache
    /// key: dispatched again at this time.
    CacheWait(Micros),
    /// The answer is in `busy.out`, going into the pipe.
    Answered,
    /// A proxied exchange (`busy.proxy`).
    Proxy,
    /// Everything is in the pipe.
    Written,
}

/// What the connection passes to each stream.
pub struct On<'a> {
    /// The stream's key for the upstream sockets it registers (see `super::key`).
    pub key: usize,
    pub peer: IpAddr,
    pub listener: usize,
    pub tls: bool,
    /// The connection's protocol state: the request's fields, the windows, the
    /// frames written.
    pub conn: &'a mut Connection,
}

/// How a stream ended, for the connection's stats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    Complete,
    /// Reset by us (with this code) or by the client.
    Reset(Code),
}

pub struct Stream {
    /// The HTTP/2 stream id.
    pub id: u32,
    busy: Box<Busy>,
    pipe: Pipe,
    reader: Reader,
    work: Work,
    framing: Framing,
    /// The request's `content-length`, which its DATA must add up to (§8.1.1).
    length: Option<u64>,
    /// Body octets the client sent.
    body_read: u64,
    /// The client's END_STREAM has been read.
    body_ended: bool,
    /// A chunked body's last chunk is still to go into the input.
    last_chunk_due: bool,
    /// DATA read from the stream not yet in `busy.inbuf` (from `held_at`).
    held: Vec<u8>,
    held_at: usize,
    /// The client broke a rule of the stream's own (its body against its
    /// `content-length`): reset with this code at the next pump.
    violation: Option<Code>,
    /// The final response head went out.
    head_sent: bool,
    /// Body octets at the front of the pipe the reader has passed, not yet
    /// accepted by the windows.
    unsent: usize,
    /// The last part of the response to send: `unsent` ends the stream.
    last: bool,
    /// Last time bytes moved either way (its timeouts).
    pub progress: Micros,
    pub started: Micros,
    server: usize,
    ended: Option<Ended>,
}

impl Stream {
    /// A new stream: its request (the connection's fields of the last HEADERS)
    /// read into the HTTP/1.1 form and dispatched. `ended`: the HEADERS ended the
    /// stream.
    pub fn start(id: u32, ended: bool, on: &mut On, svc: &mut Services) -> Stream {
        let now = svc.clock.now_us;
        let mut s = Stream {
            id,
            busy: svc.take_busy(),
            pipe: Pipe::default(),
            reader: Reader::new(false),
            work: Work::Answered,
            framing: Framing::None,
            length: None,
            body_read: 0,
            body_ended: ended,
            last_chunk_due: false,
            held: Vec::new(),
            held_at: 0,
            violation: None,
            head_sent: false,
            unsent: 0,
            last: false,
            progress: now,
            started: now,
            server: svc.routing[on.listener].default,
            ended: None,
        };
        let fields = on.conn.fields();
        if fields.over() {
            // Past the header list the server takes: as HTTP/1.1 would answer.
            s.error(svc, Status::HEADER_FIELDS_TOO_LARGE, on.peer);
            return s;
        }
        let mut head = HEAD_SCRATCH.with_borrow_mut(std::mem::take);
        head.clear();
        let translated = request::head(fields, ended, &mut head);
        let fits = head.len() <= s.busy.inbuf.len();
        if translated.is_ok() && fits {
            s.busy.inbuf[..head.len()].copy_from_slice(&head);
            s.busy.in_start = 0;
            s.busy.in_end = head.len();
        }
        HEAD_SCRATCH.with_borrow_mut(|h| *h = head);
        match translated {
            Ok(h) => {
                s.framing = h.framing;
                s.length = h.length;
                s.reader = Reader::new(h.head_request);
            }
            Err(e) => {
                forkd_shared::info!(
                    "client {} sent a malformed HTTP/2 request: {}",
                    on.peer,
                    e.why()
                );
                s.reset(Code::PROTOCOL_ERROR);
                return s;
            }
        }
        if !fits {
            // Past the largest head the address reads: as HTTP/1.1 would answer.
            s.error(svc, Status::HEADER_FIELDS_TOO_LARGE, on.peer);
            return s;
        }
        s.dispatch(on, svc);
        s
    }

    /// Body bytes of the stream arrived (`end`: the client's END_STREAM, or its
    /// trailers).
    /// Returns how many of them it did not keep (to be given back to the client's
    /// window at once).
    pub fn received(&mut self, data: &[u8], end: bool) -> usize {
        if self.ended.is_some() || self.violation.is_some() {
            return data.len();
        }
        self.body_read += data.len() as u64;
        let past = self.length.is_some_and(|l| self.body_read > l);
        let short = end && self.length.is_some_and(|l| self.body_read != l);
        if past || short {
            self.violation = Some(Code::PROTOCOL_ERROR);
            return data.len();
        }
        if self.held_at == self.held.len() {
            self.held.clear();
            self.held_at = 0;
        }
        self.held.extend_from_slice(data);
        if end {
            self.body_ended = true;
            self.last_chunk_due = self.framing == Framing::Chunked;
        }
        0
    }

    /// Body octets received and not yet used (given back when the stream goes).
    pub fn unread(&self) -> usize {
        self.held.len() - self.held_at
    }

    /// The client reset the stream (or the connection ended it on an error): an
    /// HTTP/2 reset is final, so a proxied exchange ends here (logged 499, its
    /// upstream connection closed), whatever it still expected of the client.
    pub fn client_left(&mut self, peer: IpAddr, svc: &mut Services) {
        self.pipe.left = true;
        self.body_ended = true;
        if let Some(mut p) = self.busy.proxy.take() {
            proxied::abandon(&mut p, peer, svc);
            forget(&mut p, svc);
        }
        self.ended = Some(Ended::Reset(Code::CANCEL));
    }

    /// When a stream that waits for its request body (not proxied: a proxied one
    /// has its exchange's deadlines) gives up on it: `body_timeout` after the last
    /// progress.
    pub fn body_deadline(&self, svc: &Services) -> Option<Micros> {
        let waits = matches!(self.work, Work::Body { .. }) && !self.body_ended;
        waits.then(|| self.progress + svc.server(self.server).body_timeout.as_micros() as Micros)
    }

    /// The request body did not come within `body_timeout`: answered 408, as for
    /// HTTP/1.1.
    pub fn body_timed_out(&mut self, peer: IpAddr, svc: &mut Services) {
        forkd_shared::info!("HTTP/2 client {peer} did not send its request body in time");
        self.body_ended = true;
        self.error(svc, Status::REQUEST_TIMEOUT, peer);
    }

    /// The proxied exchange's client deadline passed (`now`): a rate period in
    /// which the client kept its minimum rate starts a new one; true if the
    /// client is still late (too slow, or silent past its timeout).
    pub fn client_late(&mut self, svc: &Services, now: Micros) -> bool {
        let Some(p) = self.busy.proxy.as_deref() else {
            return false;
        };
        let server = svc.server(p.client_server);
        let rate = p
            .rated
            .map_or(0, |t| crate::conn::proxied_deadlines::min_rate(t, server));
        if rate > 0 && self.busy.rate.kept(rate, now) {
            self.busy.rate = crate::busy::RateWindow::starting(now);
        }
        self.deadlines(svc).is_some_and(|(_, client)| client <= now)
    }

    /// The client was too slow for the proxied exchange: it ends (`proxied::too_slow`),
    /// with a 408 if nothing of the response was sent, else with a reset.
    pub fn too_slow(&mut self, peer: IpAddr, svc: &mut Services) {
        let Some(mut p) = self.busy.proxy.take() else {
            return;
        };
        svc.stats.slow_client();
        forkd_shared::info!("HTTP/2 client {peer} was below the minimum rate: ending its stream");
        let progress = proxied::too_slow(&mut p, &mut self.busy, svc);
        forget(&mut p, svc);
        match progress {
            Progress::Failed { .. } => self.work = Work::Answered,
            _ => self.reset(Code::CANCEL),
        }
    }

    /// The stream is over on our side (and its buffers can go back).
    pub fn ended(&self) -> Option<Ended> {
        self.ended
    }

    /// The buffers back to the pool, the exchange's upstream socket forgotten.
    pub fn release(mut self, svc: &mut Services) {
        if let Some(token) = self.busy.proxy.take().and_then(|p| p.token) {
            svc.upstreams.forget(token);
        }
        svc.give_busy(self.busy);
    }

    /// The proxied exchange under way, if any (its upstream socket's events).
    pub fn proxied(&mut self) -> Option<&mut crate::upstreams::Proxied> {
        self.busy.proxy.as_deref_mut()
    }

    /// Waits on the client's window with response bytes to send.
    pub fn stalled(&self) -> bool {
        self.ended.is_none() && (self.unsent > 0 || self.pipe.bytes.len() >= PIPE_BYTES)
    }

    /// When a stream waiting for a cache fetch looks again.
    pub fn cache_wait(&self) -> Option<Micros> {
        match self.work {
            Work::CacheWait(at) => Some(at),
            _ => None,
        }
    }

    /// The proxied exchange's deadlines (upstream, client), if it proxies.
    pub fn deadlines(&self, svc: &Services) -> Option<(Micros, Micros)> {
        let p = self.busy.proxy.as_deref()?;
        Some(proxied::deadlines(p, &self.busy, svc, self.progress))
    }

    /// Where the stream's request comes from, for dispatch (a stream is never
    /// rotated: its connection is, with GOAWAY).
    fn origin(&self, on: &On) -> dispatch::Origin {
        dispatch::Origin {
            peer: on.peer,
            listener: on.listener,
            started: self.started,
            rotate: false,
            tls: on.tls,
        }
    }

    /// The upstream's deadline passed: the next pump tells the session so.
    pub fn upstream_fired(&mut self) {
        if let Some(p) = self.busy.proxy.as_deref_mut() {
            p.fired = true;
        }
    }

    fn dispatch(&mut self, on: &mut On, svc: &mut Services) {
        let from = self.origin(on);
        let max_header = svc.routing[on.listener].max_header_bytes;
        let busy = &mut *self.busy;
        let buf = &busy.inbuf[busy.in_start..busy.in_end];
        let mut requests = 0u32;
        let mut server = self.server as u16;
        let step = match parse(buf, max_header) {
            Ok(Some(req)) => {
                let x = Exchange::new(&mut busy.out, &mut requests, &mut server, from);
                Ok((
                    req.head_len,
                    dispatch::answer(x, svc, &req, &buf[..req.head_len]),
                ))
            }
            Ok(None) => Err(h1::RequestError::HeadersTooLarge),
            Err(e) => Err(e),
        };
        self.server = usize::from(server);
        match step {
            Ok((_, Next::File(job))) => {
                // The head stays in the input until the file is in.
                svc.files.wait(job, super::split_key(on.key).0);
                self.work = Work::File(job);
            }
            Ok((_, Next::CacheWait)) => {
                self.work = Work::CacheWait(svc.clock.now_us + dispatch::CACHE_WAIT_POLL);
            }
            Ok((len, next)) => {
                busy.consume(len);
                match next {
                    Next::Continue | Next::Finish(_) => self.work = Work::Answered,
                    Next::Body(pending) => {
                        self.work = Work::Body {
                            pending,
                            received: 0,
                        }
                    }
                    Next::Proxy(p) => {
                        busy.proxy = Some(p);
                        self.work = Work::Proxy;
                    }
                    Next::Reject(e) => {
                        busy.discard_input();
                        self.error(svc, e.status(), on.peer);
                    }
                    Next::File(_) | Next::CacheWait => unreachable!("matched above"),
                }
            }
            Err(e) => {
                busy.discard_input();
                forkd_shared::info!("client {} sent a bad request: {}", on.peer, e.reason());
                self.error(svc, e.status(), on.peer);
            }
        }
    }

    /// Queues an error page as the answer.
    fn error(&mut self, svc: &mut Services, status: Status, peer: IpAddr) {
        dispatch::error_page(
            &mut self.busy.out,
            svc,
            status,
            self.server,
            peer,
            self.started,
        );
        self.work = Work::Answered;
    }

    /// Resets the stream (nothing more is sent or read): the session writes the
    /// RST_STREAM with `code` when it lets the stream go.
    fn reset(&mut self, code: Code) {
        self.ended = Some(Ended::Reset(code));
    }

    /// Moves the stream as far as it goes now; true if anything moved.
    pub fn pump(&mut self, on: &mut On, svc: &mut Services, budget: &mut u64) -> bool {
        if self.ended.is_some() {
            return false;
        }
        if let Some(code) = self.violation.take() {
            forkd_shared::info!(
                "client {} sent an HTTP/2 body that disagrees with its content-length",
                on.peer
            );
            on.conn.finish(self.id, code);
            self.client_left(on.peer, svc);
            return true;
        }
        let mut moved = self.read_body(on, svc);
        moved |= self.run(on, svc, budget);
        moved |= self.frame(on);
        if moved {
            self.progress = svc.clock.now_us;
        }
        moved
    }

    /// Moves the DATA held into the exchange: counted for a `Body`, into
    /// `busy.inbuf` (as chunks, if no `content-length`) for the proxy, dropped once
    /// the request is answered; each octet used is given back to the client's
    /// window.
    fn read_body(&mut self, on: &mut On, svc: &mut Services) -> bool {
        let had = self.held.len() - self.held_at;
        if !self.place_held(on, svc) {
            return had != self.held.len() - self.held_at;
        }
        if self.body_ended && matches!(self.work, Work::Body { .. }) {
            self.answer_after_body(on, svc);
            return true;
        }
        had > 0
    }

    /// Gives the DATA held to the exchange; false if it must wait for room.
    fn place_held(&mut self, on: &mut On, svc: &mut Services) -> bool {
        let n = self.held.len() - self.held_at;
        match &mut self.work {
            Work::Proxy => {
                // As much as the input has room for: a DATA frame may be larger
                // than the whole input buffer (with chunk framing, or a small
                // `max_header_bytes`), so waiting for room for all of it would
                // wait forever.
                while self.held_at < self.held.len() {
                    let placed = put_body(&mut self.busy, self.framing, &self.held[self.held_at..]);
                    if placed == 0 {
                        return false;
                    }
                    on.conn.release(self.id, placed);
                    self.held_at += placed;
                }
                if self.last_chunk_due && self.body_ended {
                    if !self.put(request::LAST_CHUNK) {
                        return false;
                    }
                    self.last_chunk_due = false;
                }
                return true;
            }
            Work::Body { received, .. } => {
                *received += n as u64;
                if *received > svc.server(self.server).max_body_bytes {
                    self.release_held(on, n);
                    self.error(svc, Status::CONTENT_TOO_LARGE, on.peer);
                    return true;
                }
            }
            Work::File(_) | Work::CacheWait(_) | Work::Answered | Work::Written => {}
        }
        self.release_held(on, n);
        true
    }

    /// The held DATA is consumed: the client may send as much again.
    fn release_held(&mut self, on: &mut On, n: usize) {
        if n > 0 {
            on.conn.release(self.id, n);
            self.held.clear();
            self.held_at = 0;
        }
    }

    /// Appends `bytes` to the input whole, if they fit.
    fn put(&mut self, bytes: &[u8]) -> bool {
        let busy = &mut *self.busy;
        if busy.inbuf.len() - busy.in_end < bytes.len() {
            busy.compact();
        }
        if busy.inbuf.len() - busy.in_end < bytes.len() {
            return false;
        }
        busy.inbuf[busy.in_end..busy.in_end + bytes.len()].copy_from_slice(bytes);
        busy.in_end += bytes.len();
        true
    }

    fn answer_after_body(&mut self, on: &mut On, svc: &mut Services) {
        let from = self.origin(on);
        let Work::Body { pending, .. } = std::mem::replace(&mut self.work, Work::Answered) else {
            return;
        };
        let server = pending.server;
        let mut requests = 0u32;
        let mut current = server as u16;
        if let Ok(Some(req)) = parse(&pending.head, pending.head.len()) {
            let x = Exchange::new(&mut self.busy.out, &mut requests, &mut current, from);
            dispatch::answer_after_body(x, svc, &req, &pending.head, server);
        }
    }

    /// The file pool's job is done: the request answered with what it found (false:
    /// still waiting).
    fn answer_after_file(
        &mut self,
        job: crate::file_pool::JobId,
        on: &On,
        svc: &mut Services,
    ) -> bool {
        if !svc.files.arrived(job) {
            return false;
        }
        self.work = Work::Answered;
        let from = self.origin(on);
        let max_header = svc.routing[on.listener].max_header_bytes;
        let busy = &mut *self.busy;
        let buf = &busy.inbuf[busy.in_start..busy.in_end];
        let mut requests = 0u32;
        let mut server = self.server as u16;
        let len = match parse(buf, max_header) {
            Ok(Some(req)) => {
                let x = Exchange::new(&mut busy.out, &mut requests, &mut server, from);
                let head = &buf[..req.head_len];
                dispatch::answer_after_file(x, svc, &req, head, job);
                req.head_len
            }
            // It parsed when it was dispatched, and the input was not touched since.
            _ => busy.in_end - busy.in_start,
        };
        self.server = usize::from(server);
        busy.consume(len);
        true
    }

    /// Runs the exchange: the proxy, or the answer into the pipe.
    fn run(&mut self, on: &mut On, svc: &mut Services, budget: &mut u64) -> bool {
        let mut moved = false;
        loop {
            match self.work {
                Work::Written => return moved,
                Work::File(job) => {
                    if !self.answer_after_file(job, on, svc) {
                        return moved;
                    }
                    moved = true;
                }
                Work::CacheWait(at) => {
                    if svc.clock.now_us < at {
                        return moved;
                    }
                    self.dispatch(on, svc);
                    moved = true;
                }
                Work::Body { .. } if self.busy.out.is_empty() => return moved,
                Work::Body { .. } | Work::Answered => {
                    let mut sent = 0;
                    let flushed = self.busy.out.flush(&mut self.pipe, &mut sent, *budget);
                    *budget = budget.saturating_sub(sent);
                    moved |= sent > 0;
                    match flushed {
                        Ok(Flush::Done) if matches!(self.work, Work::Body { .. }) => return moved,
                        Ok(Flush::Done) => {
                            self.work = Work::Written;
                            self.pipe.closed = true;
                            return true;
                        }
                        Ok(_) => return moved,
                        Err(_) => {
                            self.reset(Code::INTERNAL_ERROR);
                            return true;
                        }
                    }
                }
                Work::Proxy => {
                    let Some(mut p) = self.busy.proxy.take() else {
                        self.work = Work::Answered;
                        continue;
                    };
                    let mut progress_at = self.progress;
                    let mut client = Client {
                        key: on.key,
                        stream: &mut self.pipe,
                        peer: on.peer,
                        progress: &mut progress_at,
                    };
                    let progress =
                        proxied::advance(&mut p, &mut client, &mut self.busy, svc, budget);
                    self.progress = progress_at;
                    match progress {
                        Progress::Again => {
                            self.busy.proxy = Some(p);
                            moved = true;
                        }
                        Progress::ReadClient | Progress::Wait | Progress::Budget => {
                            self.busy.proxy = Some(p);
                            return moved;
                        }
                        Progress::Finished { .. } | Progress::Failed { .. } => {
                            forget(&mut p, svc);
                            self.work = Work::Answered;
                            moved = true;
                        }
                        Progress::Truncated | Progress::Close | Progress::Upgraded => {
                            forget(&mut p, svc);
                            // What was sent stays cut short: the client sees a reset.
                            let _ = self.frame(on);
                            self.reset(Code::INTERNAL_ERROR);
                            return true;
                        }
                    }
                }
            }
        }
    }

    /// Frames what the pipe holds: heads, DATA within the window, trailers.
    fn frame(&mut self, on: &mut On) -> bool {
        let mut moved = false;
        loop {
            if self.ended.is_some() {
                return moved;
            }
            if self.unsent > 0 || self.last {
                if !self.head_sent {
                    return moved;
                }
                if !on.conn.is_open(self.id) {
                    // Reset by the client while its answer was going out.
                    self.ended = Some(Ended::Reset(Code::CANCEL));
                    return true;
                }
                let data = &self.pipe.bytes[..self.unsent];
                let n = on.conn.send_data(self.id, data, self.last);
                if n == 0 && self.unsent > 0 {
                    return moved;
                }
                moved = true;
                self.pipe.bytes.advance(n);
                self.unsent -= n;
                if self.last && self.unsent == 0 {
                    self.ended = Some(Ended::Complete);
                    return true;
                }
                continue;
            }
            let part = match self.reader.next(&mut self.pipe.bytes, self.pipe.closed) {
                Ok(Some(part)) => part,
                Ok(None) => return moved,
                Err(bad) => {
                    forkd_shared::error!("an HTTP/2 response could not be framed: {}", bad.0);
                    self.reset(Code::INTERNAL_ERROR);
                    return true;
                }
            };
            moved = true;
            match part {
                Part::Informational(block) => {
                    if !self.head_sent {
                        on.conn.send_headers(self.id, &block, false);
                    }
                }
                Part::Head(block, body) => {
                    if self.head_sent {
                        return moved;
                    }
                    self.head_sent = true;
                    on.conn.send_headers(self.id, &block, !body);
                    if !body {
                        self.ended = Some(Ended::Complete);
                        return true;
                    }
                }
                Part::Data(n) => {
                    self.unsent = n;
                    self.last = self.reader.done();
                }
                Part::Trailers(block) => {
                    on.conn.send_headers(self.id, &block, true);
                    self.ended = Some(Ended::Complete);
                    return true;
                }
                Part::End => {
                    self.last = true;
                }
            }
        }
    }
}

/// The exchange's upstream socket, still registered, is forgotten with it.
fn forget(p: &mut crate::upstreams::Proxied, svc: &mut Services) {
    if let Some(token) = p.token.take() {
        svc.upstreams.forget(token);
    }
}

/// Appends as much of the request body bytes `data` as `busy`'s input has room for
/// (as one chunk of them, if the body is chunked); how many of them went in.
fn put_body(busy: &mut Busy, framing: Framing, data: &[u8]) -> usize {
    if busy.inbuf.len() - busy.in_end < data.len() + CHUNK_FRAMING {
        busy.compact();
    }
    let room = busy.inbuf.len() - busy.in_end;
    let n = match framing {
        Framing::Chunked => data.len().min(room.saturating_sub(CHUNK_FRAMING)),
        _ => data.len().min(room),
    };
    if n == 0 {
        return 0;
    }
    let mut framed = Vec::new();
    let piece = match framing {
        Framing::Chunked => {
            request::chunk(&mut framed, &data[..n]);
            &framed[..]
        }
        _ => &data[..n],
    };
    busy.inbuf[busy.in_end..busy.in_end + piece.len()].copy_from_slice(piece);
    busy.in_end += piece.len();
    n
}

/// The stream's request, written as an HTTP/1.1 head, parsed as one and marked as
/// HTTP/2's (the access log says so).
fn parse(head: &[u8], max_header: usize) -> Result<Option<h1::Request<'_>>, h1::RequestError> {
    h1::parse(head, max_header).map(|parsed| {
        parsed.map(|mut req| {
            req.version = h1::Version::Http2;
            req
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Puts all of `data` through an input of `capacity` bytes, the reader taking
    /// what is there whenever nothing more fits; what it read.
    fn through(capacity: usize, framing: Framing, data: &[u8]) -> Vec<u8> {
        let mut busy = Busy::new(capacity);
        let mut read = Vec::new();
        let mut at = 0;
        while at < data.len() {
            let n = put_body(&mut busy, framing, &data[at..]);
            if n == 0 {
                assert!(busy.has_input(), "no room in an empty input of {capacity}");
                read.extend_from_slice(&busy.inbuf[busy.in_start..busy.in_end]);
                busy.discard_input();
            }
            at += n;
        }
        read.extend_from_slice(&busy.inbuf[busy.in_start..busy.in_end]);
        read
    }

    #[test]
    fn a_data_frame_larger_than_the_input_goes_in_pieces() {
        // A full DATA frame (16384) into a 16 KiB input: chunk framing does not
        // fit beside it, so it goes in as two chunks, never waits for room forever.
        let data = vec![b'x'; 16384];
        let read = through(16384, Framing::Chunked, &data);
        let mut first = Vec::new();
        request::chunk(&mut first, &data[..16384 - CHUNK_FRAMING]);
        let mut second = Vec::new();
        request::chunk(&mut second, &data[16384 - CHUNK_FRAMING..]);
        assert_eq!(read, [first, second].concat());
        // With a length, as it is, in as many pieces as the input needs.
        assert_eq!(through(4096, Framing::Length, &data), data);
    }
}

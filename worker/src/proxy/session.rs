//! One proxied exchange with its upstream socket: the glue the client connection
//! holds. It moves bytes between the upstream socket and the two streams, turns
//! what happened into [`Event`]s for the [`Exchange`], and turns the exchange's
//! [`Action`]s into a [`Step`] the connection code acts on.
//!
//! The caller registers the socket readable and writable (edge-triggered), calls
//! [`Session::upstream_readable`] for every readable (or hang-up, or error) event on
//! it and [`Session::pump`] after every event, after feeding client body bytes, and
//! after writing client output: `pump` writes until the socket would block and reads
//! until a short read (the edge-triggered socket is then empty until the next event)
//! or a full buffer, so no edge is lost and no read is spent on an empty socket.
//! Which pool, which server, the tokens and the timers stay with the caller.

use super::body::BodyError;
use super::connect::{connect_failure, UpstreamSocket};
use super::exchange::{Action, Event, Exchange};
use super::response_head::{Redirects, ResponseContext};
use super::retry::Failure;
use super::splice::{self, Pipe};
use super::stream::{RequestStream, ResponseStream, StreamError};
use super::upstream_request::Framing;
use std::cell::RefCell;
use std::io::{self, IoSlice, Read, Write};
use std::os::fd::{AsFd, BorrowedFd};

/// Upstream bytes read at once.
const READ_CHUNK: usize = 16 * 1024;
/// Read buffers of ended sessions kept for the next ones (per worker thread).
const SPARE_INBOXES: usize = 32;

thread_local! {
    /// The read buffers of ended sessions: a new session takes one instead of
    /// allocating and zeroing `READ_CHUNK` bytes per exchange. At most
    /// `SPARE_INBOXES` are kept (512 KiB).
    static SPARE: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// A read buffer of `READ_CHUNK` bytes: a spare one, or a new one.
fn take_inbox() -> Vec<u8> {
    SPARE
        .with(|s| s.borrow_mut().pop())
        .unwrap_or_else(|| vec![0; READ_CHUNK])
}

/// What the connection code does next.
#[derive(Debug)]
pub enum Step {
    /// Nothing to do but wait for the next event (or the deadline).
    Pending,
    /// Get a new connection to `server` (not from the pool) and [`Session::attach`] it.
    NeedFreshConnection { server: usize },
    /// Pick the next untried server (`upstream_health::choose` with `tried()`), get a
    /// connection to it and attach it; none left: answer 502.
    NeedNextServer,
    /// Answer the client with this status; nothing of the response was sent.
    Respond(u16),
    /// No server may take the request (all marked down): 503 with `Retry-After`.
    /// Made by the connection code's choice of server, never by the session.
    Unavailable { retry_after_secs: u64 },
    /// Part of the response was sent: close the client connection.
    CloseClient,
    /// The upstream side is finished; `pool` is the upstream connection and its
    /// request count if it may be pooled (else it was closed). The end of the response
    /// may still be in [`Session::client_output`]: write it out, then the exchange is
    /// over (and the client connection closes if not [`Session::request_complete`]).
    Done { pool: Option<(UpstreamSocket, u64)> },
    /// The upstream switched protocols (a 101 to an upgrade request): the 101 head is
    /// in [`Session::client_output`]; after it, the connection is a byte tunnel over
    /// `socket` (never pooled), starting with the upstream bytes that followed the
    /// head (`rest`).
    Upgraded {
        socket: UpstreamSocket,
        rest: Vec<u8>,
    },
}

/// One proxied exchange.
#[derive(Debug)]
pub struct Session {
    exchange: Exchange,
    request: RequestStream,
    response: ResponseStream,
    /// The response context without the per-connection request count.
    context: ResponseContext,
    capacity: usize,
    socket: Option<UpstreamSocket>,
    connecting: bool,
    /// Requests on the current connection, this one included.
    conn_requests: u64,
    /// Upstream bytes read but not yet taken by the response stream.
    /// Allocated once per session (READ_CHUNK); `inbox[inbox_at..inbox_end]` unread.
    inbox: Vec<u8>,
    inbox_at: usize,
    inbox_end: usize,
    /// The socket may hold bytes not read yet: an event said so, and no short read
    /// or `EAGAIN` has emptied it since. A pooled socket starts empty (an idle
    /// one that turns readable is evicted from its pool), a new one too (its events
    /// come).
    readable: bool,
    /// A hang-up or an error was reported: the edge for it came with the data before
    /// it, so read until EOF (or the error) whatever the reads' sizes.
    hung_up: bool,
    /// A pooled connection, and a request that could not be sent again once bytes of
    /// it left (a body, or a method that is not idempotent): look at the socket once
    /// before the first write. The upstream may have closed it in this very loop turn
    /// (its event not handled yet); found now, the request goes to a fresh connection.
    check_stale: bool,
    head_reported: bool,
    body_reported: bool,
    progressed: bool,
    /// Whether the response body goes to the client through a pipe (`splice`).
    splicing: Splicing,
    /// Body bytes spliced from the upstream so far.
    spliced: u64,
    /// Whether the request body comes from the client through a pipe (`splice`).
    upload: Splicing,
    /// Request body bytes spliced from the client so far.
    uploaded: u64,
}

/// Whether a response body is spliced ([`Session::allow_splice`]).
#[derive(Debug)]
enum Splicing {
    /// Copied through the response stream (the default).
    Off,
    /// The connection code allows it: it begins once the response stream has splice
    /// room (a body relayed as is, its head and what came with it written).
    Allowed,
    /// Under way, through this pipe.
    Piped(Pipe),
    /// Not possible here (no pipe, or `splice` refused the descriptors at first
    /// use): copied.
    Refused,
}

impl Session {
    /// A session for `head` (from `upstream_request::write`) with the client's body
    /// `framing`, `method`, the upstream's server count and `retries`, the response
    /// context (its `upstream_requests` is set per connection), and `capacity` bytes
    /// per direction.
    pub fn new(
        head: Vec<u8>,
        framing: Framing,
        method: &str,
        servers: usize,
        retries: u32,
        context: ResponseContext,
        capacity: usize,
    ) -> Session {
        Session {
            exchange: Exchange::new(method, servers, retries),
            request: RequestStream::new(head, framing, capacity),
            response: ResponseStream::new(context, capacity),
            context,
            capacity,
            socket: None,
            connecting: false,
            conn_requests: 0,
            inbox: Vec::new(),
            inbox_at: 0,
            inbox_end: 0,
            readable: false,
            hung_up: false,
            check_stale: false,
            head_reported: false,
            body_reported: false,
            progressed: false,
            splicing: Splicing::Off,
            spliced: 0,
            upload: Splicing::Off,
            uploaded: 0,
        }
    }

    /// Starts an attempt on `server` over `socket`: a pooled one (`pooled` = the
    /// requests it already served) or a new, connecting one (`None`).
    pub fn attach(&mut self, server: usize, socket: UpstreamSocket, pooled: Option<u64>) {
        self.exchange.start(server, pooled.is_some());
        self.exchange.hold_whole_copy(self.request.held_whole());
        self.connecting = pooled.is_none();
        self.conn_requests = pooled.unwrap_or(0) + 1;
        // The redirect rewriting moves on to the attempt's new stream (no copy).
        let redirects = self.response.take_redirects();
        let cache = self.response.take_cache_plan();
        self.response = ResponseStream::new(
            ResponseContext {
                upstream_requests: self.conn_requests,
                ..self.context
            },
            self.capacity,
        );
        self.response.rewrite_redirects(redirects);
        self.response.fetch_for_cache(cache);
        self.inbox_end = 0;
        self.inbox_at = 0;
        self.readable = false;
        self.hung_up = false;
        self.check_stale = pooled.is_some() && !self.can_resend();
        self.head_reported = false;
        self.body_reported = false;
        self.socket = Some(socket);
    }

    /// Whether the request may be sent again on a new connection if the one it is on
    /// fails before the response: no body (body bytes are not kept) and an idempotent
    /// method. One that may not is checked before it goes on a pooled connection, and
    /// kept off those the upstream may be closing (`Pool::take_safe`).
    pub fn can_resend(&self) -> bool {
        (self.request.framing() == Framing::None || self.request.held_whole())
            && self.exchange.idempotent()
    }

    /// Request buffering: the body is held in `spool` until it was read whole (or
    /// the spool takes no more), and no server is chosen before
    /// [`Session::ready_to_send`].
    pub fn buffer_request(&mut self, spool: crate::spool::Spool) {
        self.request.buffer_into(spool);
    }

    /// Whether the request may go upstream: it streams, or its buffered body was
    /// read whole (or the buffer is full: the rest streams).
    pub fn ready_to_send(&self) -> bool {
        self.request.ready_to_send()
    }

    /// The request's body spool, once buffering was asked for.
    pub fn request_spool(&self) -> Option<&crate::spool::Spool> {
        self.request.spool()
    }

    /// Fetches the response for the cache (see `cache::fill`).
    pub fn fetch_for_cache(&mut self, plan: Box<crate::cache::fill::Plan>) {
        self.response.fetch_for_cache(Some(plan));
    }

    /// The cache plan, if the response did not take it (see
    /// [`ResponseStream::take_cache_plan`]).
    pub fn take_cache_plan(&mut self) -> Option<Box<crate::cache::fill::Plan>> {
        self.response.take_cache_plan()
    }

    /// The response the cache answers for instead, once read whole.
    pub fn take_intercepted(&mut self) -> Option<super::stream::Intercepted> {
        self.response.take_intercepted()
    }

    /// Rewrites a `Location` or `Refresh` naming the upstream in every attempt's
    /// final head (`response_head::Redirects`).
    pub fn rewrite_redirects(&mut self, redirects: Redirects) {
        self.response.rewrite_redirects(Some(redirects));
    }

    /// A connect attempt failed before there was a socket (`connect` itself failed).
    pub fn connect_failed(&mut self, server: usize, e: &io::Error) -> Step {
        self.exchange.start(server, false);
        self.fail(connect_failure(e))
    }

    pub fn exchange(&self) -> &Exchange {
        &self.exchange
    }

    /// The upstream socket, to register or re-register.
    pub fn socket_mut(&mut self) -> Option<&mut UpstreamSocket> {
        self.socket.as_mut()
    }

    /// The failure that ended the last attempt, for the error log: the exchange's,
    /// so one it found itself (an event its state did not expect) is named too.
    pub fn last_failure(&self) -> Option<Failure> {
        self.exchange.last_failure()
    }

    /// Whether bytes moved since the last call (re-arm a `rearm_on_progress` deadline).
    pub fn take_progress(&mut self) -> bool {
        std::mem::take(&mut self.progressed)
    }

    /// Client body bytes; returns how many were taken (the rest: the client's next
    /// request, or no room yet). Call [`Session::pump`] afterwards. A badly framed
    /// body is `Err(Step::Respond(400))`; close both connections after it.
    pub fn feed_client_body(&mut self, input: &[u8]) -> Result<usize, Step> {
        self.request.feed(input).map_err(|e| match e {
            BodyError::TooLarge => Step::Respond(413),
            _ => Step::Respond(400),
        })
    }

    /// Where client body bytes can be read straight into the request stream, sparing
    /// the copy out of the connection's input buffer (a streamed `Content-Length` body,
    /// at most its rest, as much as the stream has room for: 64 KiB reads, as a
    /// response body's). None: read into the input buffer and
    /// [`Session::feed_client_body`]. Then [`Session::commit_client_body`].
    pub fn client_body_room(&mut self) -> Option<&mut [u8]> {
        if !self.request.wants_input() || self.upload_piped() {
            return None;
        }
        self.request.direct_room()
    }

    /// `n` bytes were read into [`Session::client_body_room`]. Call `pump` afterwards.
    pub fn commit_client_body(&mut self, n: usize) -> Result<(), Step> {
        self.request
            .commit_direct(n)
            .map_err(|_| Step::Respond(400))
    }

    /// The client's chunked body may carry at most `limit` bytes (`max_body_bytes`).
    pub fn limit_client_body(&mut self, limit: u64) {
        self.request.limit_body(limit);
    }

    /// The upstream connection is established: the moment to answer a client's
    /// `Expect: 100-continue` (once), so the client sends its body only when it can
    /// go somewhere.
    pub fn ready_for_body(&self) -> bool {
        (self.socket.is_some() && !self.connecting)
            || (self.request.spool().is_some() && !self.request.ready_to_send())
    }

    /// The client's body was read (and sent) whole. When the response ended first
    /// (an application may answer before reading the body), the rest of the client's
    /// body is still on its connection: close it after the response.
    pub fn request_complete(&self) -> bool {
        self.request.is_complete()
    }

    /// The client's body was read whole (there is none, or its last byte was taken):
    /// what follows on the client connection is its next request.
    pub fn client_body_read(&self) -> bool {
        self.request.body_read()
    }

    /// The client left: the upstream connection closes (it is never pooled with a
    /// response still coming).
    pub fn abandon(&mut self) {
        self.socket = None;
    }

    /// Whether the client should be read for body bytes (with the body spliced, while
    /// the pipe has room).
    pub fn wants_client_body(&self) -> bool {
        match &self.upload {
            Splicing::Piped(pipe) => self.request.wants_input() && pipe.room() > 0,
            _ => self.request.wants_input(),
        }
    }

    /// The request body may come from the client by `splice` (a plain socket): it
    /// does when the request stream allows (a streamed `Content-Length` body, nothing
    /// of it in the relay), through a pipe written upstream after the head and the
    /// relayed bytes.
    pub fn allow_upload_splice(&mut self) {
        if matches!(self.upload, Splicing::Off) {
            self.upload = Splicing::Allowed;
        }
    }

    /// Whether the request body goes through the pipe: then it is never read into
    /// memory ([`Session::client_body_room`], [`Session::feed_client_body`]) again.
    pub fn upload_piped(&self) -> bool {
        matches!(self.upload, Splicing::Piped(_))
    }

    /// How many client body bytes may be spliced now, if the body is spliced (a
    /// pipe is made the first time). Then [`Session::splice_from_client`].
    pub fn client_splice_room(&mut self) -> Option<usize> {
        if !matches!(self.upload, Splicing::Allowed | Splicing::Piped(_)) {
            return None;
        }
        if !self.request.wants_input() {
            return None;
        }
        let room = self.request.splice_room()?;
        if matches!(self.upload, Splicing::Allowed) {
            self.upload = match Pipe::take() {
                Ok(pipe) => Splicing::Piped(pipe),
                Err(_) => Splicing::Refused,
            };
        }
        match &self.upload {
            Splicing::Piped(pipe) => Some(room.min(pipe.room())).filter(|n| *n > 0),
            _ => None,
        }
    }

    /// Splices at most `max` body bytes ([`Session::client_splice_room`]) from the
    /// client socket `from` into the pipe. `Ok(0)`: the client closed. A splice
    /// refused at first use (`EINVAL`) turns splicing off: the body is read instead
    /// (`WouldBlock` then, and [`Session::upload_piped`] is false). Call `pump`
    /// afterwards.
    pub fn splice_from_client(&mut self, from: BorrowedFd<'_>, max: usize) -> io::Result<usize> {
        let Splicing::Piped(pipe) = &mut self.upload else {
            return Err(io::ErrorKind::WouldBlock.into());
        };
        match pipe.fill(from, max) {
            Ok(n) => {
                self.uploaded += n as u64;
                self.request.commit_spliced(n);
                Ok(n)
            }
            Err(e) if splice::unsupported(&e) && self.uploaded == 0 => {
                if let Splicing::Piped(pipe) =
                    std::mem::replace(&mut self.upload, Splicing::Refused)
                {
                    pipe.give_back();
                }
                Err(io::ErrorKind::WouldBlock.into())
            }
            Err(e) => Err(e),
        }
    }

    /// Request body bytes in the pipe, not yet written upstream.
    pub fn upload_held(&self) -> usize {
        match &self.upload {
            Splicing::Piped(pipe) => pipe.held(),
            _ => 0,
        }
    }

    /// The final response head, once it arrived.
    pub fn response_head(&self) -> Option<&super::response_head::ResponseHead> {
        self.response.head()
    }

    /// The upstream socket reported readable, or (`hung_up`) a hang-up or an error:
    /// the next [`Session::pump`] reads it.
    pub fn upstream_readable(&mut self, hung_up: bool) {
        self.readable = true;
        self.hung_up |= hung_up;
    }

    /// The response body may go to the client by `splice` (the client is a plain
    /// socket, the response is not buffered): it does when the stream allows (a body
    /// relayed as is), and [`Session::spliced_held`] bytes then wait in a pipe for
    /// [`Session::splice_to_client`], after [`Session::client_output`].
    pub fn allow_splice(&mut self) {
        if matches!(self.splicing, Splicing::Off) {
            self.splicing = Splicing::Allowed;
        }
    }

    /// Response bytes spliced from the upstream that wait in the pipe for the client.
    pub fn spliced_held(&self) -> usize {
        match &self.splicing {
            Splicing::Piped(pipe) => pipe.held(),
            _ => 0,
        }
    }

    /// Whether anything waits for the client: [`Session::client_output`] or bytes in
    /// the pipe.
    pub fn has_client_output(&self) -> bool {
        !self.response.pending().is_empty() || self.spliced_held() > 0
    }

    /// Splices at most `max` bytes of the pipe to the client socket `to`; call it
    /// once [`Session::client_output`] is empty. `WouldBlock`: the client takes no
    /// more now. Call `pump` afterwards.
    pub fn splice_to_client(&mut self, to: BorrowedFd<'_>, max: usize) -> io::Result<usize> {
        match &mut self.splicing {
            Splicing::Piped(pipe) => pipe.drain(to, max),
            _ => Ok(0),
        }
    }

    /// Bytes for the client (the first part of [`Session::client_output_parts`]).
    pub fn client_output(&self) -> &[u8] {
        self.response.pending()
    }

    /// Bytes for the client as head bytes then body bytes, for one `writev`.
    pub fn client_output_parts(&self) -> [&[u8]; 2] {
        self.response.pending_parts()
    }

    /// `n` bytes of [`Session::client_output`] were written. Call `pump` afterwards.
    pub fn client_wrote(&mut self, n: usize) {
        self.response.advance(n);
    }

    /// The deadline of the current state fired.
    pub fn timed_out(&mut self) -> Step {
        match self.exchange.timeout_failure() {
            Some(failure) => self.fail(failure),
            None => Step::Pending,
        }
    }

    /// Does all the I/O the upstream socket allows now.
    pub fn pump(&mut self) -> Step {
        if self.socket.is_none() {
            return Step::Pending;
        }
        if self.connecting {
            match self.socket.as_ref().map(UpstreamSocket::finish_connect) {
                Some(Ok(true)) => {
                    self.connecting = false;
                    self.progressed = true;
                    if let Some(step) = self.apply(Event::Connected) {
                        return step;
                    }
                }
                Some(Ok(false)) | None => return Step::Pending,
                Some(Err(e)) => return self.fail(connect_failure(&e)),
            }
        }
        if let Some(step) = self.write_upstream() {
            return step;
        }
        if let Some(step) = self.read_upstream() {
            return step;
        }
        Step::Pending
    }

    /// Writes the request; Some(step) when the exchange moved on.
    fn write_upstream(&mut self) -> Option<Step> {
        if std::mem::take(&mut self.check_stale) {
            let mut byte = [0u8; 1];
            match self.socket.as_ref()?.peek(&mut byte) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                // Closed, or bytes nobody asked for: not a connection to send on.
                Ok(_) | Err(_) => return Some(self.fail(Failure::Reset)),
            }
        }
        loop {
            let [head, body] = self.request.pending_parts();
            if head.is_empty() && body.is_empty() && self.upload_held() > 0 {
                // Spliced body bytes: after the head and whatever the relay had.
                let (Some(socket), Splicing::Piped(pipe)) =
                    (self.socket.as_ref(), &mut self.upload)
                else {
                    break;
                };
                match pipe.drain(socket.as_fd(), usize::MAX) {
                    Ok(0) => break,
                    Ok(n) => {
                        self.request.spliced_out(n);
                        self.progressed = true;
                        self.exchange.body_not_replayable();
                        if let Some(step) = self.apply(Event::Wrote { n }) {
                            return Some(step);
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(_) => return Some(self.fail(Failure::Reset)),
                }
                continue;
            }
            if head.is_empty() && body.is_empty() {
                if !self.request.file_pending() {
                    break;
                }
                // A buffered body's file part: `sendfile`.
                let socket = self.socket.as_mut()?;
                match self.request.write_spooled_file(socket) {
                    Ok(w) => {
                        if w.n > 0 {
                            self.progressed = true;
                            if let Some(step) = self.apply(Event::Wrote { n: w.n }) {
                                return Some(step);
                            }
                        }
                        if w.blocked || w.n == 0 {
                            break;
                        }
                    }
                    Err(_) => return Some(self.fail(Failure::Reset)),
                }
                continue;
            }
            let socket = self.socket.as_mut()?;
            let written = if head.is_empty() {
                socket.write(body)
            } else if body.is_empty() {
                socket.write(head)
            } else {
                socket.write_vectored(&[IoSlice::new(head), IoSlice::new(body)])
            };
            match written {
                Ok(0) => return Some(self.fail(Failure::Reset)),
                Ok(n) => {
                    self.request.advance(n);
                    self.progressed = true;
                    if !self.request.replayable() {
                        self.exchange.body_not_replayable();
                    }
                    if let Some(step) = self.apply(Event::Wrote { n }) {
                        return Some(step);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return Some(self.fail(Failure::Reset)),
            }
        }
        if self.request.head_written() && !self.head_reported {
            self.head_reported = true;
            if let Some(step) = self.apply(Event::HeadWritten) {
                return Some(step);
            }
        }
        if self.request.is_complete() && !self.body_reported {
            self.body_reported = true;
            if let Some(step) = self.apply(Event::RequestBodyDone) {
                return Some(step);
            }
        }
        None
    }

    /// Reads the response as far as the client side has room; Some(step) when the
    /// exchange moved on.
    fn read_upstream(&mut self) -> Option<Step> {
        loop {
            // Also pushes through bytes the stream holds back (an empty inbox).
            if let Some(step) = self.deliver() {
                return Some(step);
            }
            if self.inbox_at < self.inbox_end {
                return None; // the client side is full
            }
            if !self.response.wants_input() || !self.readable {
                return None;
            }
            if let Some(step) = self.read_spliced() {
                match step {
                    Direct::Read => continue,
                    Direct::Stop => return None,
                    Direct::Step(step) => return Some(step),
                }
            }
            if matches!(self.splicing, Splicing::Piped(_)) {
                return None; // nothing goes through memory after spliced bytes
            }
            if let Some(step) = self.read_direct() {
                match step {
                    Direct::Read => continue,
                    Direct::Stop => return None,
                    Direct::Step(step) => return Some(step),
                }
            }
            self.inbox_end = 0;
            self.inbox_at = 0;
            if self.inbox.len() < READ_CHUNK {
                self.inbox = take_inbox(); // once per session, reused after it
            }
            let socket = self.socket.as_mut()?;
            match socket.read(&mut self.inbox) {
                Ok(0) => {
                    return Some(self.upstream_closed());
                }
                Ok(n) => {
                    // A short read emptied the socket: the next edge says when more came.
                    self.readable = self.hung_up || n == self.inbox.len();
                    self.inbox_end = n;
                    self.progressed = true;
                    if let Some(step) = self.apply(Event::ResponseBytes) {
                        return Some(step);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.readable = self.hung_up;
                    return None;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    return Some(self.fail(Failure::Reset));
                }
            }
        }
    }

    /// A splice of body bytes from the upstream socket into the pipe, at most the
    /// body's rest (bytes past it stay in the socket). None when the body is not
    /// spliced: copy it. The socket counts as empty only when a splice into an empty
    /// pipe would block (with bytes held, the pipe may be what is full); a short
    /// splice stops the reads until the pipe was drained.
    fn read_spliced(&mut self) -> Option<Direct> {
        if !matches!(self.splicing, Splicing::Allowed | Splicing::Piped(_)) {
            return None;
        }
        let room = self.response.splice_room()?;
        if matches!(self.splicing, Splicing::Allowed) {
            self.splicing = match Pipe::take() {
                Ok(pipe) => Splicing::Piped(pipe),
                Err(_) => Splicing::Refused,
            };
        }
        let Splicing::Piped(pipe) = &mut self.splicing else {
            return None;
        };
        let socket = self.socket.as_ref()?;
        let want = room.min(pipe.room());
        Some(match pipe.fill(socket.as_fd(), room) {
            Ok(0) => Direct::Step(self.upstream_closed()),
            Ok(n) => {
                self.progressed = true;
                self.spliced += n as u64;
                self.response.commit_spliced(n);
                match self.apply(Event::ResponseBytes) {
                    Some(step) => Direct::Step(step),
                    None if n < want => Direct::Stop,
                    None => Direct::Read,
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if pipe.held() == 0 {
                    self.readable = self.hung_up;
                }
                Direct::Stop
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Direct::Read,
            Err(e) if splice::unsupported(&e) && self.spliced == 0 => {
                if let Splicing::Piped(pipe) =
                    std::mem::replace(&mut self.splicing, Splicing::Refused)
                {
                    pipe.give_back();
                }
                return None;
            }
            Err(_) => Direct::Step(self.fail(Failure::Reset)),
        })
    }

    /// A read of body bytes straight into the response stream's relay, sparing the
    /// copy out of the inbox: for a body relayed as is, its bytes are its data. None
    /// when the stream has no such room (a head, a chunked body): read the inbox.
    fn read_direct(&mut self) -> Option<Direct> {
        let socket = self.socket.as_mut()?;
        let room = self.response.direct_room()?;
        let want = room.len();
        Some(match socket.read(room) {
            Ok(0) => Direct::Step(self.upstream_closed()),
            Ok(n) => {
                // A short read emptied the socket: the next edge says when more came.
                self.readable = self.hung_up || n == want;
                self.progressed = true;
                if let Err(e) = self.response.commit_direct(n) {
                    return Some(Direct::Step(self.fail(stream_failure(e, true))));
                }
                match self.apply(Event::ResponseBytes) {
                    Some(step) => Direct::Step(step),
                    None => Direct::Read,
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                self.readable = self.hung_up;
                Direct::Stop
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Direct::Read,
            Err(_) => Direct::Step(self.fail(Failure::Reset)),
        })
    }

    /// Feeds inbox bytes to the response stream.
    fn deliver(&mut self) -> Option<Step> {
        if self.response.is_read_whole() && self.inbox_at == self.inbox_end {
            let clean = self.nothing_past_response();
            return Some(self.complete(clean));
        }
        let fed = match self
            .response
            .feed(&self.inbox[self.inbox_at..self.inbox_end])
        {
            Ok(fed) => fed,
            Err(e) => return Some(self.fail(stream_failure(e, self.response.head().is_some()))),
        };
        self.inbox_at += fed.consumed;
        for i in 0..fed.interim {
            let forwarded = i < fed.interim_forwarded;
            if let Some(step) = self.apply(Event::InterimHead { forwarded }) {
                return Some(step);
            }
        }
        if let Some(head) = fed.head {
            if head.status == 101 {
                // `response_head` returns a final 101 only to an upgrade forkd forwarded.
                return Some(self.switched());
            }
            let has_body = head.upstream_body != super::response_head::UpstreamBody::None;
            // Without a body the response ends here: pooled only if nothing follows
            // it (else the next request on the connection would read those bytes as
            // its response).
            let reusable = head.upstream_reusable && (has_body || self.nothing_past_response());
            let event = Event::FinalHead { has_body, reusable };
            if let Some(step) = self.apply(event) {
                return Some(step);
            }
        }
        if self.response.is_read_whole() {
            let clean = self.nothing_past_response();
            return Some(self.complete(clean));
        }
        None
    }

    /// Whether nothing came past the response just read whole: no bytes left in the
    /// inbox or held back by the stream, and none in the socket. Bytes nobody asked
    /// for mean the connection must not be pooled. The socket is looked at only
    /// when the last read did not empty it (a full read, or an edge since); bytes
    /// that come later raise an edge on the idle pooled connection, which evicts it.
    fn nothing_past_response(&mut self) -> bool {
        if self.inbox_at < self.inbox_end || self.response.has_excess() || self.hung_up {
            return false;
        }
        if !self.readable {
            return true;
        }
        let mut byte = [0u8; 1];
        match self.socket.as_ref().map(|s| s.peek(&mut byte)) {
            Some(Err(e)) if e.kind() == io::ErrorKind::WouldBlock => {
                self.readable = false;
                true
            }
            // Bytes, the close, or an error: not a connection to pool.
            _ => false,
        }
    }

    /// The exchange ends in a switch: the socket and the bytes read past the 101 head
    /// go to the tunnel.
    fn switched(&mut self) -> Step {
        // No body and not reusable: the exchange ends (`Release`, which is not acted on).
        self.exchange.on(Event::FinalHead {
            has_body: false,
            reusable: false,
        });
        let mut rest = self.response.take_leftover();
        rest.extend_from_slice(&self.inbox[self.inbox_at..self.inbox_end]);
        self.inbox_at = self.inbox_end;
        match self.socket.take() {
            Some(socket) => Step::Upgraded { socket, rest },
            None => Step::CloseClient,
        }
    }

    fn upstream_closed(&mut self) -> Step {
        match self.response.eof() {
            // A close-delimited body ended (or one whose bytes were all read).
            Ok(()) if self.response.is_read_whole() => self.complete(false),
            // Bytes that came with the head still wait for room: they go through as
            // the client drains (`pump` feeds them), then the close ends the body.
            Ok(()) => Step::Pending,
            Err(e) => self.fail(stream_failure(e, self.response.head().is_some())),
        }
    }

    fn complete(&mut self, reusable: bool) -> Step {
        let reusable = reusable && self.response.head().is_some_and(|h| h.upstream_reusable);
        if let super::exchange::State::Done { .. } = self.exchange.state {
            // Ended already (a response without a body): the release was returned.
            return Step::Pending;
        }
        let action = self.exchange.on(Event::ResponseDone { reusable });
        self.act(action)
    }

    /// Applies an event; Some(step) unless the exchange just goes on.
    fn apply(&mut self, event: Event) -> Option<Step> {
        match self.exchange.on(event) {
            Action::Continue => None,
            action => Some(self.act(action)),
        }
    }

    fn fail(&mut self, failure: Failure) -> Step {
        let action = self.exchange.on(Event::Failed(failure));
        self.act(action)
    }

    fn act(&mut self, action: Action) -> Step {
        match action {
            Action::Continue => Step::Pending,
            Action::Release { reusable } => {
                let socket = self.socket.take();
                Step::Done {
                    pool: socket.filter(|_| reusable).map(|s| (s, self.conn_requests)),
                }
            }
            Action::Connect { server } => {
                self.socket = None;
                self.request.rewind();
                Step::NeedFreshConnection { server }
            }
            Action::ConnectNext => {
                self.socket = None;
                self.request.rewind();
                Step::NeedNextServer
            }
            Action::Respond(status) => {
                self.socket = None;
                Step::Respond(status)
            }
            Action::CloseClient => {
                self.socket = None;
                Step::CloseClient
            }
        }
    }
}

impl Drop for Session {
    /// The read buffer and an empty pipe go back to the spares.
    fn drop(&mut self) {
        for splicing in [&mut self.splicing, &mut self.upload] {
            if let Splicing::Piped(pipe) = std::mem::replace(splicing, Splicing::Off) {
                pipe.give_back();
            }
        }
        let inbox = std::mem::take(&mut self.inbox);
        if inbox.len() == READ_CHUNK {
            SPARE.with(|s| {
                let mut spare = s.borrow_mut();
                if spare.len() < SPARE_INBOXES {
                    spare.push(inbox);
                }
            });
        }
    }
}

/// What a direct read did ([`Session::read_direct`]).
enum Direct {
    /// Bytes went in: deliver them and read on.
    Read,
    /// The socket is empty.
    Stop,
    /// The exchange moved on.
    Step(Step),
}

fn stream_failure(e: StreamError, head_seen: bool) -> Failure {
    match e {
        StreamError::Head(_) => Failure::BadResponse,
        StreamError::ClosedBeforeHead => Failure::Reset,
        StreamError::Body(_) if head_seen => Failure::BadBody,
        StreamError::Body(_) => Failure::BadResponse,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use forkd_shared::config::UpstreamAddress;
    use mio::{Events, Interest, Poll, Token};
    use std::net::{SocketAddr, TcpListener, TcpStream};
    use std::sync::mpsc;
    use std::time::Duration;

    const CTX: ResponseContext = ResponseContext {
        head_request: false,
        client_http10: false,
        client_keep_alive: true,
        upstream_requests: 0,
        keepalive_requests: 100,
        max_head: 8192,
        upgrade: false,
    };

    const GET: &[u8] = b"GET /x HTTP/1.1\r\nHost: h\r\n\r\n";

    /// Reads one request head (no body) from `s`.
    fn read_head(s: &mut TcpStream) -> Option<Vec<u8>> {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            match s.read(&mut byte) {
                Ok(1) => head.push(byte[0]),
                _ => return None,
            }
        }
        Some(head)
    }

    /// An upstream that, per accepted connection, answers the requests with the
    /// listed responses, then closes once told (a message on the sender it returns,
    /// or its drop) and reports it on the channel. A connection the upstream closed
    /// is never pooled, so a test that wants one pooled holds the sender.
    fn upstream(
        per_connection: Vec<Vec<&'static [u8]>>,
    ) -> (SocketAddr, mpsc::Receiver<usize>, mpsc::Sender<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = mpsc::channel();
        let (close, close_rx) = mpsc::channel::<()>();
        std::thread::spawn(move || {
            for (i, responses) in per_connection.into_iter().enumerate() {
                let Ok((mut s, _)) = listener.accept() else {
                    return;
                };
                for r in responses {
                    if read_head(&mut s).is_none() {
                        break;
                    }
                    s.write_all(r).unwrap();
                }
                let _ = close_rx.recv();
                drop(s);
                let _ = tx.send(i);
            }
        });
        (addr, rx, close)
    }

    fn session(capacity: usize, servers: usize) -> Session {
        Session::new(
            GET.to_vec(),
            Framing::None,
            "GET",
            servers,
            1,
            CTX,
            capacity,
        )
    }

    /// Drives `s` like the event loop would until the upstream side is done; the
    /// client takes at most `client_chunk` bytes per turn. Returns the client bytes
    /// and the final step.
    fn drive(s: &mut Session, addr: SocketAddr, client_chunk: usize) -> (Vec<u8>, Step) {
        let mut poll = Poll::new().unwrap();
        let mut events = Events::with_capacity(8);
        let mut client = Vec::new();
        let register = |s: &mut Session, poll: &Poll| {
            if let Some(sock) = s.socket_mut() {
                poll.registry()
                    .register(sock, Token(0), Interest::READABLE | Interest::WRITABLE)
                    .unwrap();
            }
        };
        register(s, &poll);
        for _ in 0..2000 {
            let step = s.pump();
            let n = s.client_output().len().min(client_chunk);
            client.extend_from_slice(&s.client_output()[..n]);
            s.client_wrote(n);
            match step {
                Step::Pending if n > 0 => continue,
                Step::Pending => {
                    poll.poll(&mut events, Some(Duration::from_millis(20)))
                        .unwrap();
                    mark_readable(s, &events);
                }
                Step::NeedFreshConnection { server } => {
                    let sock = UpstreamSocket::connect(&UpstreamAddress::Tcp(addr)).unwrap();
                    s.attach(server, sock, None);
                    register(s, &poll);
                }
                done => {
                    // A test's poll is dropped here: take the socket off it (in forkd
                    // a pooled socket stays registered and only changes token).
                    let done = match done {
                        Step::Done {
                            pool: Some((mut sock, n)),
                        } => {
                            poll.registry().deregister(&mut sock).unwrap();
                            Step::Done {
                                pool: Some((sock, n)),
                            }
                        }
                        other => other,
                    };
                    while !s.client_output().is_empty() {
                        let n = s.client_output().len();
                        client.extend_from_slice(s.client_output());
                        s.client_wrote(n);
                    }
                    return (client, done);
                }
            }
        }
        panic!(
            "the exchange did not end; client got {:?}",
            String::from_utf8_lossy(&client)
        );
    }

    /// As the event loop does: a readable, hang-up or error event lets `pump` read.
    fn mark_readable(s: &mut Session, events: &Events) {
        for e in events.iter() {
            if e.is_readable() || e.is_read_closed() || e.is_error() {
                s.upstream_readable(e.is_read_closed() || e.is_error());
            }
        }
    }

    fn connect(addr: SocketAddr) -> UpstreamSocket {
        UpstreamSocket::connect(&UpstreamAddress::Tcp(addr)).unwrap()
    }

    /// A connection that one exchange ended with, ready for its pool, and the
    /// requests it has carried.
    fn pooled_connection(addr: std::net::SocketAddr) -> (UpstreamSocket, u64) {
        let mut first = session(1024, 1);
        first.attach(0, connect(addr), None);
        match drive(&mut first, addr, usize::MAX).1 {
            Step::Done { pool: Some(pooled) } => pooled,
            other => panic!("first exchange did not pool its connection: {other:?}"),
        }
    }

    #[test]
    fn a_get_on_a_new_connection_ends_with_the_connection_poolable() {
        let (addr, _, _open) = upstream(vec![vec![
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
        ]]);
        let mut s = session(1024, 1);
        assert!(!s.ready_for_body());
        s.attach(0, connect(addr), None);
        assert!(!s.ready_for_body(), "still connecting");
        let (client, step) = drive(&mut s, addr, usize::MAX);
        assert_eq!(client, b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello");
        match step {
            Step::Done { pool: Some((_, 1)) } => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_pooled_connection_the_upstream_closed_is_replaced_transparently() {
        let ok: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
        let (addr, closed, close) = upstream(vec![vec![ok], vec![ok]]);
        let (pooled, requests) = pooled_connection(addr);
        // The upstream closes the idle connection (its idle timeout).
        close.send(()).unwrap();
        assert_eq!(closed.recv_timeout(Duration::from_secs(10)), Ok(0));
        let mut second = session(1024, 1);
        second.attach(0, pooled, Some(requests));
        let (client, step) = drive(&mut second, addr, usize::MAX);
        assert_eq!(client, ok);
        assert!(matches!(step, Step::Done { .. }), "{step:?}");
        assert_eq!(second.last_failure(), Some(Failure::Reset));
        assert!(
            !second.exchange().reused(),
            "answered on the fresh connection"
        );
    }

    #[test]
    fn a_post_meeting_a_pooled_connection_the_upstream_closed_goes_to_a_fresh_one() {
        let ok: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
        let (addr, closed, close) = upstream(vec![vec![ok], vec![ok]]);
        let (pooled, requests) = pooled_connection(addr);
        // The upstream closes the idle connection before its close is handled here.
        close.send(()).unwrap();
        assert_eq!(closed.recv_timeout(Duration::from_secs(10)), Ok(0));
        std::thread::sleep(Duration::from_millis(50)); // the FIN is in
        let head = b"POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\n\r\n".to_vec();
        let mut post = Session::new(head, Framing::Length(4), "POST", 1, 1, CTX, 1024);
        assert_eq!(post.feed_client_body(b"abcd").ok(), Some(4));
        post.attach(0, pooled, Some(requests));
        let (client, step) = drive(&mut post, addr, usize::MAX);
        assert_eq!(
            client, ok,
            "not a 502: nothing had been sent on the stale one"
        );
        assert!(matches!(step, Step::Done { .. }), "{step:?}");
        assert_eq!(post.last_failure(), Some(Failure::Reset));
        assert!(
            !post.exchange().reused(),
            "answered on the fresh connection"
        );
    }

    #[test]
    fn a_refused_connection_moves_on_or_is_a_502() {
        let addr = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        for (servers, want) in [(2, "NeedNextServer"), (1, "Respond(502)")] {
            let mut s = session(1024, servers);
            let step = match UpstreamSocket::connect(&UpstreamAddress::Tcp(addr)) {
                Err(e) => s.connect_failed(0, &e),
                Ok(sock) => {
                    s.attach(0, sock, None);
                    drive(&mut s, addr, usize::MAX).1
                }
            };
            assert_eq!(format!("{step:?}"), want);
        }
    }

    #[test]
    fn a_close_delimited_body_reaches_a_slow_client_whole_through_a_small_buffer() {
        static BODY: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
        let body = BODY.get_or_init(|| (0..100_000u32).map(|i| (i % 251) as u8).collect());
        let response: &'static [u8] = Box::leak(
            [b"HTTP/1.0 200 OK\r\n\r\n".as_slice(), body.as_slice()]
                .concat()
                .into_boxed_slice(),
        );
        let (addr, _, close) = upstream(vec![vec![response]]);
        close.send(()).unwrap(); // the close ends the body
        let mut s = session(4096, 1);
        s.attach(0, connect(addr), None);
        let (client, step) = drive(&mut s, addr, 1000);
        assert!(matches!(step, Step::Done { pool: None }), "{step:?}");
        let head_end = client.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        assert_eq!(
            &client[..head_end],
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        );
        let mut d = super::super::body::Decoder::chunked();
        let mut data = Vec::new();
        let mut at = head_end;
        while !d.is_done() {
            let step = d.decode(&client[at..]).unwrap();
            data.extend_from_slice(&client[at + step.data.start..at + step.data.end]);
            at += step.consumed;
        }
        assert_eq!(&data, body);
    }

    #[test]
    fn a_101_to_an_upgrade_hands_over_the_socket_and_the_bytes_after_the_head() {
        let switch: &[u8] = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
            Connection: Upgrade\r\n\r\n\x81\x02hi";
        let (addr, _, _open) = upstream(vec![vec![switch]]);
        let ctx = ResponseContext {
            upgrade: true,
            ..CTX
        };
        let mut s = Session::new(GET.to_vec(), Framing::None, "GET", 1, 1, ctx, 1024);
        s.attach(0, connect(addr), None);
        let (client, step) = drive(&mut s, addr, usize::MAX);
        assert_eq!(
            client,
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n"
        );
        match step {
            Step::Upgraded { rest, .. } => assert_eq!(rest, b"\x81\x02hi"),
            other => panic!("{other:?}"),
        }
        assert!(s.socket_mut().is_none(), "the socket left the session");
        assert!(matches!(s.pump(), Step::Pending));

        // The same 101 to a request forkd did not upgrade.
        let (addr, _, _open) = upstream(vec![vec![switch]]);
        let mut s = session(1024, 1);
        s.attach(0, connect(addr), None);
        let (client, step) = drive(&mut s, addr, usize::MAX);
        assert!(client.is_empty());
        assert!(matches!(step, Step::Respond(502)), "{step:?}");
    }

    /// An upstream for one request on one connection: reads its head, writes
    /// `pieces` apart (a pause between them, so they likely come in separate
    /// reads), then holds the connection open until told or dropped.
    fn raw_upstream(pieces: Vec<&'static [u8]>) -> (SocketAddr, mpsc::Sender<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (close, close_rx) = mpsc::channel::<()>();
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            s.set_nodelay(true).unwrap();
            read_head(&mut s).unwrap();
            for (i, piece) in pieces.into_iter().enumerate() {
                if i > 0 {
                    std::thread::sleep(Duration::from_millis(100));
                }
                s.write_all(piece).unwrap();
            }
            let _ = close_rx.recv();
        });
        (addr, close)
    }

    #[test]
    fn bytes_past_a_response_end_it_and_keep_its_connection_out_of_the_pool() {
        // A 204 and a response nobody asked for, in one write.
        let (addr, _open) = raw_upstream(vec![
            b"HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\npoison",
        ]);
        let mut s = session(1024, 1);
        s.attach(0, connect(addr), None);
        let (client, step) = drive(&mut s, addr, usize::MAX);
        assert_eq!(client, b"HTTP/1.1 204 No Content\r\n\r\n");
        assert!(matches!(step, Step::Done { pool: None }), "{step:?}");

        // A head in two reads, the second with the body and bytes past it: the
        // exchange ends (it used to wait for more, which never came).
        let (addr, _open) = raw_upstream(vec![
            b"HTTP/1.1 200 OK\r\nContent-",
            b"Length: 2\r\n\r\nokJUNK",
        ]);
        let mut s = session(1024, 1);
        s.attach(0, connect(addr), None);
        let (client, step) = drive(&mut s, addr, usize::MAX);
        assert_eq!(client, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
        assert!(matches!(step, Step::Done { pool: None }), "{step:?}");

        // The same without bytes past it is pooled.
        let (addr, _open) =
            raw_upstream(vec![b"HTTP/1.1 200 OK\r\nContent-", b"Length: 2\r\n\r\nok"]);
        let mut s = session(1024, 1);
        s.attach(0, connect(addr), None);
        let (_, step) = drive(&mut s, addr, usize::MAX);
        assert!(matches!(step, Step::Done { pool: Some(_) }), "{step:?}");
    }

    #[test]
    fn a_garbage_response_is_a_502() {
        let (addr, _, _open) = upstream(vec![vec![b"SSH-2.0-OpenSSH\r\n\r\n"]]);
        let mut s = session(1024, 1);
        s.attach(0, connect(addr), None);
        let (client, step) = drive(&mut s, addr, usize::MAX);
        assert!(client.is_empty());
        assert!(matches!(step, Step::Respond(502)), "{step:?}");
        assert_eq!(s.last_failure(), Some(Failure::BadResponse));
    }

    #[test]
    fn a_large_request_body_is_streamed_and_a_slow_upstream_stops_the_client_side() {
        const LEN: u64 = 32 << 20;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let reader = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let head = read_head(&mut s).unwrap();
            // Slow to start reading: the bytes in flight pile up in the kernel.
            std::thread::sleep(Duration::from_millis(200));
            let mut buf = vec![0u8; 64 * 1024];
            let mut got = 0u64;
            let mut sum = 0u64;
            while got < LEN {
                let n = s.read(&mut buf).unwrap();
                assert!(n > 0, "body cut short at {got}");
                sum = buf[..n]
                    .iter()
                    .fold(sum, |a, &b| a.wrapping_mul(31).wrapping_add(u64::from(b)));
                got += n as u64;
            }
            s.write_all(b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n")
                .unwrap();
            // The connection stays open (returned): one the upstream closed is not pooled.
            (String::from_utf8(head).unwrap(), got, sum, s)
        });
        let head = format!("PUT /big HTTP/1.1\r\nHost: h\r\nContent-Length: {LEN}\r\n\r\n");
        let mut s = Session::new(
            head.into_bytes(),
            Framing::Length(LEN),
            "PUT",
            1,
            1,
            CTX,
            16 * 1024,
        );
        s.attach(0, connect(addr), None);
        let mut poll = Poll::new().unwrap();
        poll.registry()
            .register(
                s.socket_mut().unwrap(),
                Token(0),
                Interest::READABLE | Interest::WRITABLE,
            )
            .unwrap();
        let mut events = Events::with_capacity(8);
        let piece: Vec<u8> = (0..64 * 1024u32).map(|i| (i % 253) as u8).collect();
        let (mut offered, mut sum, mut refused) = (0u64, 0u64, 0u32);
        let mut client = Vec::new();
        let step = loop {
            if offered < LEN && s.wants_client_body() {
                let want = (LEN - offered).min(piece.len() as u64) as usize;
                let took = s.feed_client_body(&piece[..want]).unwrap();
                sum = piece[..took]
                    .iter()
                    .fold(sum, |a, &b| a.wrapping_mul(31).wrapping_add(u64::from(b)));
                offered += took as u64;
            } else if offered < LEN {
                refused += 1;
            }
            let step = s.pump();
            let n = s.client_output().len();
            client.extend_from_slice(s.client_output());
            s.client_wrote(n);
            match step {
                Step::Pending => {
                    if offered == LEN || !s.wants_client_body() {
                        poll.poll(&mut events, Some(Duration::from_millis(50)))
                            .unwrap();
                        mark_readable(&mut s, &events);
                    }
                }
                other => break other,
            }
        };
        let (upstream_head, got, upstream_sum, _open) = reader.join().unwrap();
        assert!(
            upstream_head.contains(&format!("Content-Length: {LEN}\r\n")),
            "{upstream_head}"
        );
        assert_eq!((got, upstream_sum), (LEN, sum), "every body byte, in order");
        assert!(
            refused > 0,
            "the client side was paused while the upstream did not read"
        );
        assert!(matches!(step, Step::Done { pool: Some(_) }), "{step:?}");
        while !s.client_output().is_empty() {
            let n = s.client_output().len();
            client.extend_from_slice(s.client_output());
            s.client_wrote(n);
        }
        assert_eq!(client, b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n");
    }
}

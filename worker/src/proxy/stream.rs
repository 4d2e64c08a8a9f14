//! Both directions of an exchange as byte streams, composed from the other modules so
//! the connection code only moves bytes between sockets and these:
//!
//! - [`RequestStream`]: the re-serialised head (kept as the replay copy for a retry),
//!   then the client's body through a [`Relay`].
//! - [`ResponseStream`]: upstream bytes in; interim heads, the final head and the body
//!   out, framed for the client.
//!
//! Both are bounded: `feed` takes only what fits, `pending` is what to write next, and
//! `advance` says how much was written.
//!
//! A head that arrives in pieces is parsed again only when a piece may have brought
//! its end (`http::head_scan::head_may_end` over the new bytes and the 3 before them) or it reached
//! `max_head`: a head in one-byte pieces costs one scan, not one parse per byte.
//! Bytes past the end of a response (after a body-less head, or after the body that
//! came with a head read in pieces) are never taken: the response is still read
//! whole, and [`ResponseStream::has_excess`] says the connection must not be pooled.

use super::body::{BodyError, Decoder, Encoder, Relay};
use super::response_head::{
    self, ClientBody, Parsed, Redirects, ResponseContext, ResponseError, ResponseHead, UpstreamBody,
};
use super::upstream_request::Framing;
use crate::http::head_scan::head_may_end;
use crate::spool::{Spool, Written};

/// The request on its way upstream.
#[derive(Debug)]
pub struct RequestStream {
    /// The head as written by `upstream_request::write`: also the replay copy.
    head: Vec<u8>,
    head_sent: usize,
    framing: Framing,
    relay: Relay,
    capacity: usize,
    /// Body bytes written upstream (after the head) from the relay.
    body_sent: u64,
    /// Request buffering: the body as the relay framed it, held whole (memory, then a
    /// temporary file) before anything goes upstream, and kept for a resend. `None`:
    /// the body streams through the relay.
    spool: Option<Spool>,
    /// Body bytes spliced from the client into the session's pipe and not yet written
    /// upstream ([`RequestStream::commit_spliced`], [`RequestStream::spliced_out`]).
    in_pipe: u64,
}

impl RequestStream {
    /// `head`: the upstream head; `framing`: the client's body framing (the head
    /// announces the same one).
    pub fn new(head: Vec<u8>, framing: Framing, capacity: usize) -> RequestStream {
        RequestStream {
            relay: relay_for(framing, capacity),
            head,
            head_sent: 0,
            framing,
            capacity,
            body_sent: 0,
            spool: None,
            in_pipe: 0,
        }
    }

    /// The body is held in `spool` (a `Replay` one) until it was read whole, or
    /// until the spool takes no more (then the rest streams through the relay).
    pub fn buffer_into(&mut self, spool: Spool) {
        if self.framing != Framing::None {
            self.spool = Some(spool);
        }
    }

    /// Takes client body bytes; returns how many (the rest is the client's next
    /// request, or does not fit yet).
    pub fn feed(&mut self, input: &[u8]) -> Result<usize, BodyError> {
        let mut taken = 0;
        loop {
            let n = self.relay.feed(&input[taken..])?;
            taken += n;
            let moved = self.spill();
            if taken == input.len() || (n == 0 && moved == 0) {
                return Ok(taken);
            }
        }
    }

    /// Moves what the relay framed into the spool while it takes bytes and nothing
    /// of the relay was sent yet (after that, the relay's bytes follow the spool's).
    fn spill(&mut self) -> usize {
        let Some(spool) = self.spool.as_mut() else {
            return 0;
        };
        if self.body_sent > 0 {
            return 0;
        }
        let n = spool.push(self.relay.pending());
        self.relay.advance(n);
        n
    }

    /// Whether the request may go upstream now: it streams, or its body was read
    /// whole into the spool, or the spool takes no more (the rest streams).
    pub fn ready_to_send(&self) -> bool {
        match &self.spool {
            None => true,
            Some(spool) => self.relay.is_finished() || !spool.has_room(),
        }
    }

    /// The body is held whole (read to its end into the spool): it can be sent again
    /// on any connection, whatever was sent of it before.
    pub fn held_whole(&self) -> bool {
        self.spool.is_some() && self.relay.is_complete() && self.body_sent == 0
    }

    /// The request spool, for the stats once the exchange ends.
    pub fn spool(&self) -> Option<&Spool> {
        self.spool.as_ref()
    }

    /// The client closed its side.
    pub fn eof(&mut self) -> Result<(), BodyError> {
        self.relay.eof()
    }

    /// Whether the client should be read for body bytes.
    pub fn wants_input(&self) -> bool {
        self.relay.wants_input()
    }

    /// Where the client's next body bytes can be read straight into the relay (see
    /// [`Relay::direct_room`]): a `Content-Length` body that streams (no spool), at
    /// most its rest, so the client's next request stays on its connection. Then
    /// [`RequestStream::commit_direct`].
    pub fn direct_room(&mut self) -> Option<&mut [u8]> {
        match self.spool {
            None => self.relay.direct_room(),
            Some(_) => None,
        }
    }

    /// How many client body bytes may be spliced past the relay (client socket → pipe
    /// → upstream socket): a streamed `Content-Length` body with nothing of it in the
    /// relay (see [`Relay::splice_room`]), at most its rest. Then
    /// [`RequestStream::commit_spliced`].
    pub fn splice_room(&self) -> Option<usize> {
        match self.spool {
            None if self.framing != Framing::Chunked => self.relay.splice_room(),
            _ => None,
        }
    }

    /// `n` body bytes were spliced from the client into the pipe.
    pub fn commit_spliced(&mut self, n: usize) {
        self.relay.commit_spliced(n);
        self.in_pipe += n as u64;
    }

    /// `n` spliced body bytes were written upstream (after the head).
    pub fn spliced_out(&mut self, n: usize) {
        debug_assert!(n as u64 <= self.in_pipe);
        self.in_pipe -= (n as u64).min(self.in_pipe);
        self.body_sent += n as u64;
    }

    /// `n` client bytes were read into [`RequestStream::direct_room`].
    pub fn commit_direct(&mut self, n: usize) -> Result<(), BodyError> {
        self.relay.commit_direct(n)
    }

    /// The client's body was taken whole (some may still wait to be written).
    pub fn body_read(&self) -> bool {
        self.relay.is_finished()
    }

    /// What to write upstream next: the rest of the head, then body bytes.
    pub fn pending(&self) -> &[u8] {
        let [head, body] = self.pending_parts();
        if head.is_empty() {
            body
        } else {
            head
        }
    }

    /// What to write upstream next, as the rest of the head and the body bytes after
    /// it: one `writev` sends both. With a spool, its bytes in memory; once they are
    /// written, its file part goes by [`RequestStream::write_spooled_file`] (both
    /// parts empty here while it is not through), then the relay's bytes.
    pub fn pending_parts(&self) -> [&[u8]; 2] {
        let body = match &self.spool {
            Some(spool) if !spool.mem_pending().is_empty() => spool.mem_pending(),
            Some(spool) if !spool.is_empty() => &[],
            _ => self.relay.pending(),
        };
        [&self.head[self.head_sent..], body]
    }

    /// Whether the spool's file part is what goes upstream next.
    pub fn file_pending(&self) -> bool {
        self.head_sent == self.head.len()
            && self
                .spool
                .as_ref()
                .is_some_and(|s| s.mem_pending().is_empty() && !s.is_empty())
    }

    /// Writes spooled file bytes to `sink` (`sendfile`).
    pub fn write_spooled_file<S: crate::out::Sink>(
        &mut self,
        sink: &mut S,
    ) -> std::io::Result<Written> {
        match self.spool.as_mut() {
            Some(spool) => spool.write_to(sink, u64::MAX),
            None => Ok(Written::default()),
        }
    }

    /// `n` bytes of [`RequestStream::pending_parts`] (or of `pending`) were written:
    /// the head's first, then the body's.
    pub fn advance(&mut self, mut n: usize) {
        let head_left = self.head.len() - self.head_sent;
        if head_left > 0 {
            let h = n.min(head_left);
            self.head_sent += h;
            n -= h;
        }
        if n == 0 {
            return;
        }
        if let Some(spool) = self.spool.as_mut() {
            if !spool.mem_pending().is_empty() {
                spool.advance_mem(n);
                return;
            }
        }
        self.body_sent += n as u64;
        self.relay.advance(n);
    }

    /// The head was written whole.
    pub fn head_written(&self) -> bool {
        self.head_sent == self.head.len()
    }

    /// Head and body were written whole.
    pub fn is_complete(&self) -> bool {
        self.head_written()
            && self.spool.as_ref().is_none_or(Spool::is_empty)
            && self.relay.is_complete()
            && self.in_pipe == 0
    }

    /// Whether the request can be sent again from the start: no body byte has been
    /// written from the relay (the head is kept, and so is a spooled body; bytes the
    /// relay sent are not).
    pub fn replayable(&self) -> bool {
        self.body_sent == 0
    }

    /// Starts over for a retry on a new connection. False (and nothing changes) when
    /// body bytes were already written.
    pub fn rewind(&mut self) -> bool {
        if !self.replayable() {
            return false;
        }
        self.head_sent = 0;
        if let Some(spool) = self.spool.as_mut() {
            spool.rewind();
        }
        true
    }

    pub fn framing(&self) -> Framing {
        self.framing
    }

    /// The replay copy of the head.
    pub fn head(&self) -> &[u8] {
        &self.head
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// A chunked body may carry at most `limit` bytes of data (`max_body_bytes`; a
    /// declared length is checked before the exchange starts).
    pub fn limit_body(&mut self, limit: u64) {
        if self.framing == Framing::Chunked {
            self.relay = Relay::new(
                Decoder::chunked_within(limit),
                Encoder::Chunked,
                self.capacity,
            );
        }
    }
}

fn relay_for(framing: Framing, capacity: usize) -> Relay {
    match framing {
        Framing::None => Relay::new(Decoder::length(0), Encoder::Identity, capacity),
        Framing::Length(n) => Relay::new(Decoder::length(n), Encoder::Identity, capacity),
        Framing::Chunked => Relay::new(Decoder::chunked(), Encoder::Chunked, capacity),
    }
}

/// Why a response could not be relayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamError {
    Head(ResponseError),
    Body(BodyError),
    /// The upstream closed before a complete head.
    ClosedBeforeHead,
}

/// What one `feed` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Fed {
    /// Upstream bytes taken.
    pub consumed: usize,
    /// Interim (1xx) heads read, and how many of them were forwarded.
    pub interim: usize,
    pub interim_forwarded: usize,
    /// The final head, when it was read in this call.
    pub head: Option<ResponseHead>,
}

#[derive(Debug)]
enum Phase {
    /// Upstream head bytes so far (only when a head arrives in pieces); the first
    /// `scanned` of them hold no end of a head.
    Head { partial: Vec<u8>, scanned: usize },
    Body {
        head: ResponseHead,
        relay: Relay,
        /// Body bytes that came with the head but did not fit the relay yet; once the
        /// relay finished, bytes past the response.
        leftover: Vec<u8>,
    },
}

/// The response on its way to the client.
#[derive(Debug)]
pub struct ResponseStream {
    ctx: ResponseContext,
    phase: Phase,
    /// Client-bound head bytes (interim and final heads) not written yet.
    heads: Vec<u8>,
    heads_sent: usize,
    capacity: usize,
    /// The upstream closed; delivered to the relay once `leftover` is through.
    upstream_closed: bool,
    /// Calls of `response_head::parse`, for the test that a head in pieces is not
    /// parsed once per piece.
    #[cfg(test)]
    parses: usize,
    /// How a final head's `Location` and `Refresh` naming the upstream are rewritten.
    redirects: Option<Redirects>,
    /// The response is fetched for the cache: decided at the final head.
    cache: Option<Box<crate::cache::fill::Plan>>,
    /// The cache answers instead of this response (its head is not sent, its body
    /// is read and dropped): the plan, and the upstream's head.
    intercepted: Option<Intercepted>,
}

/// A response the cache answers for (see [`ResponseStream::take_intercepted`]).
#[derive(Debug)]
pub struct Intercepted {
    pub why: Why,
    pub plan: Box<crate::cache::fill::Plan>,
    /// The upstream's head (a 304's fields refresh the entry).
    pub upstream_head: Vec<u8>,
}

/// Why the cache answers instead of the upstream's response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// The application confirmed the stale entry (304).
    NotModified,
    /// The application failed (5xx) and `stale-if-error` allows the stale entry.
    StaleOnError,
}

impl ResponseStream {
    pub fn new(ctx: ResponseContext, capacity: usize) -> ResponseStream {
        ResponseStream {
            ctx,
            phase: Phase::Head {
                partial: Vec::new(),
                scanned: 0,
            },
            heads: Vec::new(),
            heads_sent: 0,
            capacity,
            upstream_closed: false,
            #[cfg(test)]
            parses: 0,
            redirects: None,
            cache: None,
            intercepted: None,
        }
    }

    /// Fetches the response for the cache with `plan`.
    pub fn fetch_for_cache(&mut self, plan: Option<Box<crate::cache::fill::Plan>>) {
        self.cache = plan;
    }

    /// The cache plan, for the next attempt's stream or for a failure's answer
    /// (a stale entry): from before the head, from an interception, or from a
    /// body being stored (which is then not stored).
    pub fn take_cache_plan(&mut self) -> Option<Box<crate::cache::fill::Plan>> {
        if let Some(p) = self.cache.take() {
            return Some(p);
        }
        if let Some(i) = self.intercepted.take() {
            return Some(i.plan);
        }
        None
    }

    /// The response the cache answers for, once read whole.
    pub fn take_intercepted(&mut self) -> Option<Intercepted> {
        self.intercepted.take()
    }

    pub fn is_intercepted(&self) -> bool {
        self.intercepted.is_some()
    }

    /// Rewrites the final head's `Location` and `Refresh` with `redirects`.
    pub fn rewrite_redirects(&mut self, redirects: Option<Redirects>) {
        self.redirects = redirects;
    }

    /// The redirect rewriting, for the next attempt's stream.
    pub fn take_redirects(&mut self) -> Option<Redirects> {
        self.redirects.take()
    }

    /// The final head, once read.
    pub fn head(&self) -> Option<&ResponseHead> {
        match &self.phase {
            Phase::Body { head, .. } => Some(head),
            Phase::Head { .. } => None,
        }
    }

    /// Takes upstream bytes. Once the response is complete it takes no more: bytes
    /// left over then are ones nobody asked for, and the connection must not be pooled.
    pub fn feed(&mut self, input: &[u8]) -> Result<Fed, StreamError> {
        let mut fed = Fed::default();
        loop {
            match &mut self.phase {
                Phase::Head { partial, scanned } => {
                    let from_partial = !partial.is_empty();
                    if from_partial {
                        // Every input byte joins the head so far.
                        partial.extend_from_slice(&input[fed.consumed..]);
                        fed.consumed = input.len();
                        if partial.len() < self.ctx.max_head && !head_may_end(partial, *scanned) {
                            *scanned = partial.len();
                            return Ok(fed);
                        }
                    }
                    let owned = if from_partial {
                        std::mem::take(partial)
                    } else {
                        Vec::new()
                    };
                    let buf: &[u8] = if from_partial {
                        &owned
                    } else {
                        &input[fed.consumed..]
                    };
                    if buf.is_empty() {
                        return Ok(fed);
                    }
                    #[cfg(test)]
                    {
                        self.parses += 1;
                    }
                    let heads_before = self.heads.len();
                    let parsed = response_head::parse_with(
                        buf,
                        &self.ctx,
                        self.redirects.as_ref(),
                        &mut self.heads,
                    )
                    .map_err(StreamError::Head)?;
                    let Some(parsed) = parsed else {
                        // Incomplete: keep what there is, all of it is consumed. (The
                        // first piece of a head is parsed at once: garbage is found
                        // without waiting for an end that may never come.)
                        let scanned = buf.len();
                        let keep = if from_partial { owned } else { buf.to_vec() };
                        self.phase = Phase::Head {
                            partial: keep,
                            scanned,
                        };
                        fed.consumed = input.len();
                        return Ok(fed);
                    };
                    let head_len = match parsed {
                        Parsed::Interim { head_len, .. } => head_len,
                        Parsed::Final(h) => h.head_len,
                    };
                    // From a partial head, every input byte is now in `owned`; what
                    // follows the head moves on with the next phase.
                    let rest = if from_partial {
                        owned[head_len..].to_vec()
                    } else {
                        fed.consumed += head_len;
                        Vec::new()
                    };
                    match parsed {
                        Parsed::Interim { forwarded, .. } => {
                            fed.interim += 1;
                            fed.interim_forwarded += usize::from(forwarded);
                            self.phase = Phase::Head {
                                partial: rest,
                                scanned: 0,
                            };
                        }
                        Parsed::Final(head) => {
                            fed.head = Some(head);
                            let mut relay = relay_to_client(&head, self.capacity);
                            if let Some(plan) = self.cache.take() {
                                let upstream_head = &buf[..head.head_len];
                                let client_head = &self.heads[heads_before..];
                                let now = forkd_shared::cache::unix_now();
                                use crate::cache::fill::AtHead;
                                let why = match plan.at_head(
                                    head.status,
                                    upstream_head,
                                    client_head,
                                    now,
                                ) {
                                    AtHead::Store(fill) => {
                                        relay.tee = Some(fill);
                                        None
                                    }
                                    AtHead::Pass => None,
                                    AtHead::NotModified(p) => Some((Why::NotModified, p)),
                                    AtHead::StaleOnError(p) => Some((Why::StaleOnError, p)),
                                };
                                if let Some((why, plan)) = why {
                                    self.heads.truncate(heads_before);
                                    relay.discard = true;
                                    self.intercepted = Some(Intercepted {
                                        why,
                                        plan,
                                        upstream_head: upstream_head.to_vec(),
                                    });
                                }
                            }
                            self.phase = Phase::Body {
                                head,
                                relay,
                                leftover: rest,
                            };
                        }
                    }
                }
                Phase::Body {
                    relay, leftover, ..
                } => {
                    if !leftover.is_empty() {
                        if relay.is_finished() {
                            return Ok(fed); // past the response: never taken
                        }
                        let n = relay.feed(leftover).map_err(StreamError::Body)?;
                        leftover.drain(..n);
                        if !leftover.is_empty() {
                            return Ok(fed);
                        }
                        if self.upstream_closed {
                            relay.eof().map_err(StreamError::Body)?;
                        }
                    }
                    let n = relay
                        .feed(&input[fed.consumed..])
                        .map_err(StreamError::Body)?;
                    fed.consumed += n;
                    return Ok(fed);
                }
            }
        }
    }

    /// The upstream closed its side. Bytes that came with the head and are still
    /// waiting for room go through first (keep calling `feed(&[])` as the client
    /// drains); the body's end is then taken from the close.
    pub fn eof(&mut self) -> Result<(), StreamError> {
        self.upstream_closed = true;
        match &mut self.phase {
            Phase::Head { .. } => Err(StreamError::ClosedBeforeHead),
            Phase::Body { leftover, .. } if !leftover.is_empty() => Ok(()),
            Phase::Body { relay, .. } => relay.eof().map_err(StreamError::Body),
        }
    }

    /// After a final head without a body (a 101 switch): the upstream bytes that
    /// came with the head and that the stream held back.
    pub fn take_leftover(&mut self) -> Vec<u8> {
        match &mut self.phase {
            Phase::Body { leftover, .. } => std::mem::take(leftover),
            Phase::Head { .. } => Vec::new(),
        }
    }

    /// Where the next upstream bytes can be read straight into the body relay (see
    /// [`Relay::direct_room`]): in the body of a response relayed as is, once the
    /// bytes that came with the head went through. Then [`ResponseStream::commit_direct`].
    pub fn direct_room(&mut self) -> Option<&mut [u8]> {
        match &mut self.phase {
            Phase::Body {
                relay, leftover, ..
            } if leftover.is_empty() && !self.upstream_closed => relay.direct_room(),
            _ => None,
        }
    }

    /// `n` upstream bytes were read into [`ResponseStream::direct_room`].
    pub fn commit_direct(&mut self, n: usize) -> Result<(), StreamError> {
        match &mut self.phase {
            Phase::Body { relay, .. } => relay.commit_direct(n).map_err(StreamError::Body),
            Phase::Head { .. } => Ok(()),
        }
    }

    /// How many upstream bytes may be spliced past the stream to the client now (see
    /// [`Relay::splice_room`]): in the body of a response relayed as is, once its head
    /// was written and the bytes that came with the head went through, not intercepted
    /// by the cache. Then [`ResponseStream::commit_spliced`].
    pub fn splice_room(&self) -> Option<usize> {
        match &self.phase {
            Phase::Body {
                relay, leftover, ..
            } if leftover.is_empty()
                && !self.upstream_closed
                && self.heads.is_empty()
                && self.intercepted.is_none() =>
            {
                relay.splice_room()
            }
            _ => None,
        }
    }

    /// `n` upstream bytes were spliced (within [`ResponseStream::splice_room`]).
    pub fn commit_spliced(&mut self, n: usize) {
        if let Phase::Body { relay, .. } = &mut self.phase {
            relay.commit_spliced(n);
        }
    }

    /// Whether the upstream should be read.
    pub fn wants_input(&self) -> bool {
        match &self.phase {
            Phase::Head { .. } => self.heads.len() - self.heads_sent < self.capacity,
            Phase::Body {
                relay, leftover, ..
            } => leftover.is_empty() && relay.wants_input(),
        }
    }

    /// What to write to the client next.
    pub fn pending(&self) -> &[u8] {
        if self.heads_sent < self.heads.len() {
            return &self.heads[self.heads_sent..];
        }
        match &self.phase {
            Phase::Body { relay, .. } => relay.pending(),
            Phase::Head { .. } => &[],
        }
    }

    /// What to write to the client next, as head bytes and the body bytes after them:
    /// one `writev` sends a head with its body.
    pub fn pending_parts(&self) -> [&[u8]; 2] {
        let body = match &self.phase {
            Phase::Body { relay, .. } => relay.pending(),
            Phase::Head { .. } => &[],
        };
        [&self.heads[self.heads_sent..], body]
    }

    /// `n` bytes of [`ResponseStream::pending_parts`] (or of `pending`) were written:
    /// the heads' first, then the body's.
    pub fn advance(&mut self, mut n: usize) {
        let heads_left = self.heads.len() - self.heads_sent;
        if heads_left > 0 {
            let h = n.min(heads_left);
            self.heads_sent += h;
            n -= h;
            if self.heads_sent == self.heads.len() {
                self.heads.clear();
                self.heads_sent = 0;
            }
        }
        if n > 0 {
            if let Phase::Body { relay, .. } = &mut self.phase {
                relay.advance(n);
            }
        }
    }

    /// The whole response was read from the upstream (some may still be pending
    /// for the client): the upstream connection is free (to pool unless
    /// [`ResponseStream::has_excess`]).
    pub fn is_read_whole(&self) -> bool {
        match &self.phase {
            Phase::Body { relay, .. } => relay.is_finished(),
            Phase::Head { .. } => false,
        }
    }

    /// Bytes came past the end of the response (read with its head or its body):
    /// nobody asked for them, the connection must not be pooled. A 101's are the
    /// tunnel's ([`ResponseStream::take_leftover`]).
    pub fn has_excess(&self) -> bool {
        match &self.phase {
            Phase::Body {
                relay, leftover, ..
            } => relay.is_finished() && !leftover.is_empty(),
            Phase::Head { .. } => false,
        }
    }

    /// The whole response was read and written to the client.
    pub fn is_complete(&self) -> bool {
        self.heads.is_empty()
            && match &self.phase {
                Phase::Body { relay, .. } => relay.is_complete(),
                Phase::Head { .. } => false,
            }
    }
}

fn relay_to_client(head: &ResponseHead, capacity: usize) -> Relay {
    let decoder = match head.upstream_body {
        UpstreamBody::None => Decoder::length(0),
        UpstreamBody::Length(n) => Decoder::length(n),
        UpstreamBody::Chunked => Decoder::chunked(),
        UpstreamBody::UntilClose => Decoder::until_close(),
    };
    let encoder = match head.client_body {
        ClientBody::Chunked => Encoder::Chunked,
        ClientBody::None | ClientBody::Length(_) | ClientBody::UntilClose => Encoder::Identity,
    };
    Relay::new(decoder, encoder, capacity)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CTX: ResponseContext = response_head::TEST_CONTEXT;

    /// Feeds `upstream` in pieces of `piece` bytes, then EOF if `close`; the client
    /// takes everything at once. Returns the client's bytes and the stream.
    fn through(
        upstream: &[u8],
        ctx: ResponseContext,
        piece: usize,
        close: bool,
    ) -> (Vec<u8>, ResponseStream) {
        let mut s = ResponseStream::new(ctx, 64);
        let mut client = Vec::new();
        let mut at = 0;
        let mut stalls = 0;
        while at < upstream.len() {
            let end = upstream.len().min(at + piece);
            let fed = s.feed(&upstream[at..end]).unwrap();
            at += fed.consumed;
            let n = drain(&mut s, &mut client);
            if fed.consumed == 0 && n == 0 {
                stalls += 1;
                if stalls > 3 {
                    break; // the response ended: the rest is not part of it
                }
            }
        }
        if close {
            s.eof().unwrap();
        }
        drain(&mut s, &mut client);
        (client, s)
    }

    /// Writes everything pending to `client`; returns how many bytes.
    fn drain(s: &mut ResponseStream, client: &mut Vec<u8>) -> usize {
        let mut total = 0;
        while !s.pending().is_empty() {
            let n = s.pending().len();
            client.extend_from_slice(s.pending());
            s.advance(n);
            total += n;
        }
        total
    }

    #[test]
    fn every_framing_byte_for_byte_at_any_split() {
        let close_delimited =
            b"HTTP/1.0 200 OK\r\nServer: SimpleHTTP/0.6 Python/3\r\n\r\nhello, world";
        let cases: [(&[u8], bool, &[u8]); 4] = [
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
                false,
                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n3;x=y\r\nabc\r\n2\r\nde\r\n0\r\nX-Sum: 5\r\n\r\n",
                false,
                b"HTTP/1.1 200 OK\r\nTrailer: X-Sum\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\nX-Sum: 5\r\n\r\n",
            ),
            (
                close_delimited,
                true,
                b"HTTP/1.1 200 OK\r\nServer: SimpleHTTP/0.6 Python/3\r\nTransfer-Encoding: chunked\r\n\r\nc\r\nhello, world\r\n0\r\n\r\n",
            ),
            (
                b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
                false,
                b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
            ),
        ];
        for (upstream, close, want) in cases {
            // Whole, or split: data chunks are then re-chunked per piece, so compare
            // the unsplit output exactly and the split ones after decoding.
            let (got, s) = through(upstream, CTX, upstream.len(), close);
            assert_eq!(String::from_utf8_lossy(&got), String::from_utf8_lossy(want));
            assert!(s.is_complete());
            for piece in [1, 5, 13] {
                let (got, s) = through(upstream, CTX, piece, close);
                assert!(s.is_complete(), "piece {piece}");
                let head_end = got.windows(4).rposition(|w| w == b"\r\n\r\n").is_some();
                assert!(head_end);
                if want.windows(17).any(|w| w == b"Transfer-Encoding") {
                    assert_eq!(
                        decode_chunked_body(&got),
                        decode_chunked_body(want),
                        "piece {piece}"
                    );
                } else {
                    assert_eq!(got, want, "piece {piece}");
                }
            }
        }
    }

    /// The data and trailers of a chunked message (head skipped).
    fn decode_chunked_body(message: &[u8]) -> (Vec<u8>, Vec<u8>) {
        let start = message.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        let mut d = Decoder::chunked();
        let mut data = Vec::new();
        let mut at = start;
        while !d.is_done() {
            let s = d.decode(&message[at..]).unwrap();
            data.extend_from_slice(&message[at + s.data.start..at + s.data.end]);
            at += s.consumed;
        }
        (data, d.trailers().to_vec())
    }

    /// Bytes `python3 -m http.server` (Python 3.11) sent, captured once: an HTTP/1.0
    /// server with a length, and `Connection: close` on errors.
    #[test]
    fn python_http_server_responses_are_relayed_as_11() {
        let file = b"HTTP/1.0 200 OK\r\nServer: SimpleHTTP/0.6 Python/3.11.7\r\n\
            Date: Tue, 01 Dec 2026 10:02:47 GMT\r\nContent-type: text/plain\r\n\
            Content-Length: 18\r\nLast-Modified: Tue, 01 Dec 2026 10:02:46 GMT\r\n\r\n\
            hello from python\n";
        let (got, s) = through(file, CTX, 7, true);
        assert_eq!(
            String::from_utf8(got).unwrap(),
            "HTTP/1.1 200 OK\r\nServer: SimpleHTTP/0.6 Python/3.11.7\r\n\
             Date: Tue, 01 Dec 2026 10:02:47 GMT\r\nContent-type: text/plain\r\n\
             Last-Modified: Tue, 01 Dec 2026 10:02:46 GMT\r\nContent-Length: 18\r\n\r\n\
             hello from python\n"
        );
        let head = s.head().unwrap();
        assert!(!head.upstream_reusable, "HTTP/1.0: never pooled");
        assert!(!head.client_close, "the client keeps its connection");

        let missing = b"HTTP/1.0 404 File not found\r\nServer: SimpleHTTP/0.6 Python/3.11.7\r\n\
            Connection: close\r\nContent-Type: text/html;charset=utf-8\r\n\
            Content-Length: 8\r\n\r\n<h1>404\n";
        let (got, s) = through(missing, CTX, missing.len(), true);
        let got = String::from_utf8(got).unwrap();
        assert!(got.starts_with("HTTP/1.1 404 File not found\r\n"), "{got}");
        assert!(!got.contains("Connection"), "{got}");
        assert!(got.ends_with("Content-Length: 8\r\n\r\n<h1>404\n"), "{got}");
        assert!(!s.head().unwrap().upstream_reusable);
    }

    #[test]
    fn close_delimited_to_a_10_client_stays_close_delimited() {
        let ctx = ResponseContext {
            client_http10: true,
            ..CTX
        };
        let (got, s) = through(b"HTTP/1.0 200 OK\r\n\r\nabc", ctx, 2, true);
        assert_eq!(got, b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nabc");
        assert!(s.head().unwrap().client_close);
    }

    #[test]
    fn a_truncated_body_and_an_early_close_are_errors() {
        let mut s = ResponseStream::new(CTX, 64);
        s.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
            .unwrap();
        assert_eq!(s.eof(), Err(StreamError::Body(BodyError::Truncated)));
        let mut s = ResponseStream::new(CTX, 64);
        s.feed(b"HTTP/1.1 200 OK\r\n").unwrap();
        assert_eq!(s.eof(), Err(StreamError::ClosedBeforeHead));
        let mut s = ResponseStream::new(CTX, 64);
        assert_eq!(
            s.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n"),
            Err(StreamError::Head(ResponseError::LengthAndChunked))
        );
        assert!(s.pending().is_empty(), "nothing reaches the client");
    }

    #[test]
    fn feed_reports_interim_and_final_heads_once() {
        let mut s = ResponseStream::new(CTX, 64);
        let input = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
        let fed = s.feed(input).unwrap();
        assert_eq!((fed.interim, fed.interim_forwarded), (1, 1));
        assert_eq!(fed.head.map(|h| h.status), Some(200));
        assert_eq!(fed.consumed, input.len());
        assert!(s.is_complete() || !s.pending().is_empty());
        let fed = s.feed(b"").unwrap();
        assert_eq!((fed.interim, fed.head), (0, None));
    }

    #[test]
    fn a_close_delimited_body_larger_than_the_buffer_ends_after_its_leftover() {
        // Head and body arrive in one read, the upstream closes, the client is slow.
        let mut upstream = b"HTTP/1.0 200 OK\r\n\r\n".to_vec();
        upstream.extend_from_slice(&[b'z'; 50]);
        let mut s = ResponseStream::new(CTX, 16);
        let mut partial = b"HTTP/1.0 200 OK\r\n".to_vec();
        s.feed(&partial).unwrap();
        partial.clear();
        assert_eq!(
            s.feed(&upstream[17..]).unwrap().consumed,
            upstream.len() - 17
        );
        s.eof().unwrap();
        let mut client = Vec::new();
        for _ in 0..1000 {
            if s.is_complete() {
                break;
            }
            s.feed(&[]).unwrap();
            let n = s.pending().len().min(5);
            client.extend_from_slice(&s.pending()[..n]);
            s.advance(n);
        }
        assert!(
            s.is_complete(),
            "the close ends the body once the leftover is through"
        );
        let (data, _) = decode_chunked_body(&client);
        assert_eq!(data, [b'z'; 50]);
    }

    #[test]
    fn a_slow_client_stops_the_upstream_being_read() {
        let mut s = ResponseStream::new(CTX, 16);
        let body = [b'x'; 100];
        let mut upstream = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n".to_vec();
        upstream.extend_from_slice(&body);
        let fed = s.feed(&upstream).unwrap();
        assert!(fed.consumed < upstream.len());
        // The client takes nothing: feeding more takes nothing.
        assert!(!s.wants_input());
        assert_eq!(s.feed(&upstream[fed.consumed..]).unwrap().consumed, 0);
    }

    #[test]
    fn a_head_in_one_byte_pieces_is_parsed_a_few_times_not_once_a_byte() {
        let mut head = b"HTTP/1.1 200 OK\r\n".to_vec();
        for i in 0..90 {
            head.extend_from_slice(format!("X-Field-{i:03}: value\r\n").as_bytes());
        }
        head.extend_from_slice(b"Content-Length: 2\r\n\r\nok");
        let ctx = ResponseContext {
            max_head: 64 * 1024,
            ..CTX
        };
        let mut s = ResponseStream::new(ctx, 64);
        let mut client = Vec::new();
        for b in head.chunks(1) {
            assert_eq!(s.feed(b).unwrap().consumed, 1);
            drain(&mut s, &mut client);
        }
        assert!(s.is_complete());
        assert!(client.ends_with(b"Content-Length: 2\r\n\r\nok"));
        // The first piece (garbage is found at once), then the piece with the end.
        assert_eq!(s.parses, 2, "a head of {} bytes", head.len());
        // A head over `max_head` that never ends is refused on the byte that crosses.
        let mut s = ResponseStream::new(CTX, 64);
        let endless = [b'a'; 9000];
        let mut result = s.feed(b"HTTP/1.1 200 OK\r\nX: ").map(|_| ());
        let mut fed = 0;
        while result.is_ok() && fed < endless.len() {
            result = s.feed(&endless[fed..fed + 1]).map(|_| ());
            fed += 1;
        }
        assert_eq!(result, Err(StreamError::Head(ResponseError::TooLarge)));
        assert_eq!(
            fed + 20,
            CTX.max_head,
            "refused when the head reached max_head"
        );
    }

    #[test]
    fn bytes_past_a_response_are_never_taken_and_say_so() {
        // A head in two pieces, the second with the body and more.
        let mut s = ResponseStream::new(CTX, 64);
        s.feed(b"HTTP/1.1 200 OK\r\nContent-").unwrap();
        let second = b"Length: 2\r\n\r\nokJUNK";
        let fed = s.feed(second).unwrap();
        assert_eq!(fed.consumed, second.len(), "every byte joined the head's");
        assert!(s.is_read_whole() && s.has_excess());
        let mut client = Vec::new();
        drain(&mut s, &mut client);
        assert_eq!(client, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
        assert!(s.is_complete());
        assert_eq!(s.feed(b"more").unwrap().consumed, 0);
        // Whole, in one read: the stream takes the response only.
        let mut s = ResponseStream::new(CTX, 64);
        let input = b"HTTP/1.1 204 No Content\r\n\r\nJUNK";
        assert_eq!(s.feed(input).unwrap().consumed, input.len() - 4);
        assert!(s.is_read_whole() && !s.has_excess());
        // None past it.
        let mut s = ResponseStream::new(CTX, 64);
        s.feed(b"HTTP/1.1 200 OK\r\nContent-").unwrap();
        s.feed(b"Length: 2\r\n\r\nok").unwrap();
        assert!(s.is_read_whole() && !s.has_excess());
    }

    #[test]
    fn the_request_head_is_replayed_until_body_bytes_leave() {
        let head = b"PUT /x HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\n\r\n".to_vec();
        let mut r = RequestStream::new(head.clone(), Framing::Length(4), 64);
        assert_eq!(r.pending(), &head[..]);
        r.advance(10);
        assert!(r.rewind());
        assert_eq!(r.pending(), &head[..]);
        r.advance(head.len());
        assert!(r.head_written() && !r.is_complete());
        assert_eq!(r.feed(b"bodyGET").unwrap(), 4);
        assert_eq!(r.pending(), b"body");
        r.advance(2);
        assert!(!r.rewind() && !r.replayable());
        r.advance(2);
        assert!(r.is_complete());
        let mut get = RequestStream::new(b"GET / HTTP/1.1\r\n\r\n".to_vec(), Framing::None, 64);
        get.advance(18);
        assert!(get.is_complete());
        let mut chunked = RequestStream::new(Vec::new(), Framing::Chunked, 64);
        chunked.feed(b"2;e\r\nhi\r\n0\r\n\r\n").unwrap();
        assert_eq!(chunked.pending(), b"2\r\nhi\r\n0\r\n\r\n");
    }

    #[test]
    fn a_spliced_request_body_is_complete_only_once_the_pipe_was_written() {
        let head = b"PUT /x HTTP/1.1\r\nContent-Length: 10\r\n\r\n".to_vec();
        let mut r = RequestStream::new(head.clone(), Framing::Length(10), 64);
        // Bytes that came with the head go through the relay first.
        assert_eq!(r.feed(b"abc").unwrap(), 3);
        assert_eq!(r.splice_room(), None, "nothing spliced past relayed bytes");
        r.advance(head.len() + 3);
        assert_eq!(r.splice_room(), Some(7), "at most the body's rest");
        r.commit_spliced(7);
        assert!(r.body_read() && !r.wants_input());
        assert_eq!(r.splice_room(), None);
        assert!(!r.is_complete(), "the pipe still holds them");
        r.spliced_out(4);
        assert!(!r.is_complete());
        r.spliced_out(3);
        assert!(r.is_complete());
        // Spliced bytes not yet written keep the request replayable.
        let mut r = RequestStream::new(head.clone(), Framing::Length(10), 64);
        r.advance(head.len());
        r.commit_spliced(10);
        assert!(r.replayable(), "none left: they can go on a new connection");
        r.spliced_out(1);
        assert!(!r.replayable());
        // A chunked or buffered body is never spliced.
        let chunked = RequestStream::new(Vec::new(), Framing::Chunked, 64);
        assert_eq!(chunked.splice_room(), None);
        let none = RequestStream::new(Vec::new(), Framing::None, 64);
        assert_eq!(none.splice_room(), None);
    }
}

//! What happens to a connection at `accept`, before its first request: where
//! `conn_per_ip` counted it, the 503 over that limit, and the PROXY protocol header
//! (a peer outside `proxy_protocol_from` refused, the header read before TLS).

use super::*;

impl Conn {
    /// Counted under `conn_per_ip` there: uncounted when the connection closes.
    pub fn hold(&mut self, held: Option<Held>) {
        self.bits.set_held(held);
    }

    /// The listener speaks PROXY protocol: the connection starts with its header.
    pub fn expect_proxy_header(&mut self) {
        self.phase = Phase::ProxyHeader;
    }

    /// Over `conn_per_ip`: 503 with `Retry-After`, then close (lingering, so the
    /// client reads it rather than a reset).
    pub fn refuse_over_limit(&mut self, key: usize, svc: &mut Services) -> Verdict {
        self.queue_refusal(svc);
        self.readable = true;
        self.drive(key, svc)
    }

    pub(super) fn queue_refusal(&mut self, svc: &mut Services) {
        let busy = self.busy.get_or_insert_with(|| svc.take_busy());
        dispatch::refusal_page(
            &mut busy.out,
            svc,
            Status::SERVICE_UNAVAILABLE,
            &[("Retry-After", b"1")],
            usize::from(self.server),
            self.peer,
            self.head_since,
        );
        self.phase = Phase::Write(After::Linger);
    }

    /// The listener speaks PROXY protocol, but the peer is not in its
    /// `proxy_protocol_from`: it may not name a client. Closed unread (counted with
    /// the refused headers; logged at most once a second).
    pub fn refuse_untrusted_peer(&self, svc: &mut Services) -> Verdict {
        svc.stats.bump(counters::PROXY_HEADER_REFUSED, 1);
        let addr = svc.config.listeners.get(usize::from(self.listener));
        let addr = addr.map(|l| l.addr.to_string()).unwrap_or_default();
        let peer = self.peer;
        svc.proxy_log.note(svc.clock.now_us, || {
            format!(
                "connection from {peer} to {addr}, a peer not in its proxy_protocol_from: closing"
            )
        });
        Verdict::Close
    }

    /// Reads the PROXY header from the socket itself, not the transport: on an HTTPS
    /// address it comes before the TLS handshake, and rustls must not see it. The
    /// socket is peeked at until the header is complete, then exactly its bytes are
    /// read, so what follows (a request, or a ClientHello) is left for the transport.
    /// `None` when it is done (the client address set, the connection counted under
    /// `conn_per_ip`); `Some` when the drive stops here.
    pub(super) fn proxy_header(&mut self, svc: &mut Services) -> Option<Verdict> {
        if !self.readable {
            return Some(Verdict::Keep);
        }
        // Any complete header fits: a v1 line is at most 107 bytes.
        let mut buf = [0u8; proxy_protocol::V2_MAX];
        let seen = loop {
            match self.stream.peek(&mut buf) {
                Ok(0) => return Some(Verdict::Close),
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.readable = false;
                    return Some(Verdict::Keep);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return Some(Verdict::Close),
            }
        };
        match proxy_protocol::parse(&buf[..seen]) {
            Ok(Parsed::Incomplete) => {
                // Everything the socket holds was seen: the next edge says more came.
                self.readable = false;
                Some(Verdict::Keep)
            }
            Ok(Parsed::Done { len, client }) => {
                if self.stream.read_exact(&mut buf[..len]).is_err() {
                    return Some(Verdict::Close);
                }
                let now = svc.clock.now_us;
                svc.stats.bytes_in(len as u64);
                self.progress = now;
                if let Some(client) = client {
                    self.peer = client.ip();
                }
                self.phase = Phase::ReadHead;
                self.idle_since = now;
                // The bytes after the header are still in the socket.
                self.readable = true;
                let server = usize::from(self.server);
                match crate::limits::admit::connection(svc, server, self.peer) {
                    crate::limits::admit::Connection::Admit(held) => self.hold(held),
                    crate::limits::admit::Connection::Refuse => self.queue_refusal(svc),
                }
                None
            }
            Err(e) => {
                svc.stats.bump(counters::PROXY_HEADER_REFUSED, 1);
                let peer = self.peer;
                svc.proxy_log.note(svc.clock.now_us, || {
                    format!("connection from {peer} without a valid PROXY header ({e:?}): closing")
                });
                Some(Verdict::Close)
            }
        }
    }
}

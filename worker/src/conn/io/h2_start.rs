//! The switch to HTTP/2: whether a connection's first bytes (or TLS's ALPN) ask for
//! it, and the hand-over of its socket, TLS session and early bytes to a
//! `conn::h2::Session`.

use super::*;

impl Conn {
    /// Whether the connection speaks HTTP/2: TLS chose `h2` by ALPN, or a plain
    /// `http2: PriorKnowledge` address read the preface (`Wait`: a part of it).
    pub(super) fn speaks_h2(&self, svc: &Services) -> H2Start {
        if self.requests > 0 {
            return H2Start::No;
        }
        if self.tls.chose_h2() {
            return H2Start::Yes;
        }
        let listener = usize::from(self.listener);
        if self.tls.is_tls() || !svc.config.listeners.get(listener).is_some_and(|l| l.http2) {
            return H2Start::No;
        }
        let Some(input) = self.busy.as_ref().map(|b| &b.inbuf[b.in_start..b.in_end]) else {
            return H2Start::No;
        };
        let n = input.len().min(h2::PREFACE.len());
        match (input[..n] == h2::PREFACE[..n], n == h2::PREFACE.len()) {
            (false, _) => H2Start::No,
            (true, true) => H2Start::Yes,
            (true, false) if n == 0 => H2Start::No,
            (true, false) => H2Start::Wait,
        }
    }

    /// Hands the connection to an HTTP/2 session: a duplicate of its socket and its
    /// TLS session go to the link, with what was read so far. False if the socket
    /// cannot be duplicated (out of descriptors: the connection closes).
    pub(super) fn start_h2(&mut self, svc: &mut Services) -> bool {
        use std::os::fd::AsFd;
        let dup = match self.stream.as_fd().try_clone_to_owned() {
            Ok(fd) => TcpStream::from_std(std::net::TcpStream::from(fd)),
            Err(e) => {
                forkd_shared::warn!("cannot serve HTTP/2 to {}: dup failed: {e}", self.peer);
                return false;
            }
        };
        let tls = self.tls.is_tls();
        let settings = svc
            .server(svc.routing[usize::from(self.listener)].default)
            .h2;
        let now = svc.clock.now_us;
        let busy = self.busy.get_or_insert_with(|| svc.take_busy());
        let early = busy.inbuf[busy.in_start..busy.in_end].to_vec();
        busy.discard_input();
        // The session reads the socket through its link and each stream has buffers
        // of its own while it runs: the connection's input buffer (the largest
        // head, 16 KiB by default) is not kept for the connection's life. A busy
        // without it is not pooled again (`BusyPool::give`).
        busy.inbuf = Vec::new();
        let inbound = h2::Inbound::new(settings.max_concurrent_streams, settings.max_header_list);
        let link = h2::Link::new(dup, self.tls.take(), early, inbound);
        busy.h2 = Some(Box::new(h2::Session::new(link, settings, now, tls)));
        self.phase = Phase::H2;
        if !self.bits.has(Bits::NODELAY) {
            self.bits.set(Bits::NODELAY, true);
            let _ = self.stream.set_nodelay(true);
        }
        svc.stats.bump(counters::H2_CONNECTIONS, 1);
        true
    }

    /// The session is over (it has written what was queued and shut the write
    /// side): the streams' resources go back, and the connection lingers as an
    /// HTTP/1.1 one does, reading and dropping what the client still sends
    /// (WINDOW_UPDATE, PING) until it closes or `LINGER` passes, so the kernel does
    /// not answer those bytes with a reset that destroys the end of a response and
    /// the GOAWAY.
    pub(super) fn linger_after_h2(&mut self, svc: &mut Services) {
        if let Some(mut busy) = self.busy.take() {
            Self::end_session(&mut busy, svc);
            // Without its input buffer (`start_h2`): lingering reads into a fresh one.
            svc.give_busy(busy);
        }
        let _ = self.stream.shutdown(std::net::Shutdown::Write);
        self.phase = Phase::Linger;
        self.idle_since = svc.clock.now_us;
    }

    /// The HTTP/2 session `busy` holds, if any, ends: its streams give back what
    /// they hold (upstream connections, counts).
    pub(super) fn end_session(busy: &mut Busy, svc: &mut Services) {
        if let Some(mut session) = busy
            .h2
            .take()
            .and_then(|h| h.downcast::<h2::Session>().ok())
        {
            session.release(svc);
        }
    }
}

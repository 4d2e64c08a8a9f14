//! A connection's one deadline and what it becomes when it passes: the phase's
//! timeout (408 for a request under way, close when idle), the end of a minimum-rate
//! period (`min_body_rate`, `min_send_rate`: 408, or a reset for a slow reader),
//! a tunnel's idle end, and a proxied exchange's deadlines (the upstream's or the
//! client's, see `conn/proxied_deadlines.rs`).

use super::*;

impl Conn {
    /// Sets the deadline for the phase the connection waits in.
    pub(super) fn arm(&mut self, key: usize, svc: &mut Services) {
        let server = svc.server(usize::from(self.server));
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
                let server = svc.server(s);
                let idle = self.progress + us(server.body_timeout);
                idle.min(self.rate_due(server.min_body_rate, server))
            }
            Phase::Write(_) => {
                let idle = self.progress + us(server.send_timeout);
                idle.min(self.rate_due(server.min_send_rate, server))
            }
            // The file pool is forkd's own: as long as a response may take to go.
            Phase::FileWait => self.progress + us(server.send_timeout),
            Phase::CacheWait => svc.clock.now_us + crate::conn::dispatch::CACHE_WAIT_POLL,
            Phase::Linger => self.idle_since + LINGER,
            Phase::ProxyHeader => self.idle_since + us(server.header_timeout),
            Phase::Tunnel => match self.busy.as_ref().and_then(|b| b.tunnel.as_ref()) {
                Some(t) => t.deadline(),
                None => self.progress,
            },
            Phase::H2 => match self
                .busy
                .as_ref()
                .and_then(|b| b.h2.as_ref().and_then(|h| h.downcast_ref::<h2::Session>()))
            {
                Some(h2) => h2.deadline(svc, usize::from(self.server)),
                None => self.progress,
            },
            Phase::Proxy => match self.busy.as_deref() {
                Some(b) => match b.proxy.as_deref() {
                    Some(p) => {
                        let (upstream, client) = proxied::deadlines(p, b, svc, self.progress);
                        upstream.min(client)
                    }
                    None => self.progress + us(server.send_timeout),
                },
                None => self.progress + us(server.send_timeout),
            },
        };
        svc.timers.set(key, &mut self.deadline, at);
    }

    /// The deadline passed: answer 408 where a request was under way, or close.
    /// When the current rate period ends (never, without a minimum rate).
    pub(super) fn rate_due(&self, rate: u64, server: &Server) -> Micros {
        match (rate, self.busy.as_deref()) {
            (0, _) | (_, None) => Micros::MAX,
            (_, Some(busy)) => busy.rate.since + server.min_rate_grace.as_micros() as Micros,
        }
    }

    /// The idle timeout and the minimum rate of the transfer under way (a body or a
    /// response; in `Proxy`, what the exchange waits on the client for), if one is.
    pub(super) fn transfer_limits(&self, svc: &Services) -> Option<(Duration, u64)> {
        match self.phase {
            Phase::Proxy => {
                let p = self.busy.as_ref()?.proxy.as_ref()?;
                let server = svc.server(p.client_server);
                let timeout = match p.rated? {
                    Transfer::Body => server.body_timeout,
                    Transfer::Response => server.send_timeout,
                };
                Some((timeout, proxied::min_rate(p.rated?, server)))
            }
            Phase::ReadBody => {
                let s = self.busy.as_ref().and_then(|b| b.body.as_ref());
                let server = svc.server(s.map_or(usize::from(self.server), |p| p.server));
                Some((server.body_timeout, server.min_body_rate))
            }
            Phase::Write(_) => {
                let server = svc.server(usize::from(self.server));
                Some((server.send_timeout, server.min_send_rate))
            }
            _ => None,
        }
    }

    /// A deadline passed while a body or a response was under way, before its idle
    /// timeout: a rate period ended. Judges the client's pace, after first moving
    /// what the socket allows now: the worker itself may have been kept from the
    /// socket (a loaded machine), and that is not the client's doing.
    pub(super) fn on_rate_period(&mut self, key: usize, svc: &mut Services) -> Verdict {
        let (phase, since) = (self.phase, self.busy.as_ref().map(|b| b.rate.since));
        self.readable = true;
        if self.drive(key, svc) == Verdict::Close {
            return Verdict::Close;
        }
        if self.phase != phase || self.busy.as_ref().map(|b| b.rate.since) != since {
            return Verdict::Keep; // the transfer ended or moved on (and is armed)
        }
        let now = svc.clock.now_us;
        let rate = self.transfer_limits(svc).map_or(0, |(_, rate)| rate);
        if let Some(busy) = self.busy.as_deref_mut() {
            if busy.rate.kept(rate, now) {
                busy.rate = RateWindow::starting(now);
                self.arm(key, svc);
                return Verdict::Keep;
            }
        }
        svc.stats.slow_client();
        let rated = self.proxied().and_then(|p| p.rated);
        let what = match (self.phase, rated) {
            (Phase::ReadBody, _) | (Phase::Proxy, Some(Transfer::Body)) => "sent its request body",
            _ => "read its response",
        };
        forkd_shared::info!(
            "client {} {what} below the minimum rate: closing",
            self.peer
        );
        match self.phase {
            Phase::ReadBody => self.request_timeout(key, svc),
            Phase::Proxy => self.proxy_too_slow(key, svc),
            _ => self.abort(),
        }
    }

    /// A proxied exchange's client was below its minimum rate: the exchange ends
    /// (`proxied::too_slow`), with a 408 for a body if nothing of the response was
    /// sent, else with a reset, as `abort` does.
    pub(super) fn proxy_too_slow(&mut self, key: usize, svc: &mut Services) -> Verdict {
        let Some(busy) = self.busy.as_deref_mut() else {
            return Verdict::Close;
        };
        let Some(mut p) = busy.proxy.take() else {
            return Verdict::Close;
        };
        match proxied::too_slow(&mut p, busy, svc) {
            Progress::Failed { .. } => {
                self.phase = Phase::ReadHead;
                self.start_writing(After::Linger, svc);
                self.drive(key, svc)
            }
            _ => self.abort(),
        }
    }

    /// A client that does not read its response is dropped with a reset: a plain
    /// close would leave the unsent response in the kernel's send buffer, still
    /// trickling out to the slow reader (slowhttptest -X sees its connections open
    /// long after forkd let go of them). nginx's `reset_timedout_connection`.
    pub(super) fn abort(&mut self) -> Verdict {
        let reset = nix::libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        if let Err(e) = nix::sys::socket::setsockopt(&self.stream, sockopt::Linger, &reset) {
            forkd_shared::debug!("setsockopt(SO_LINGER) failed: {e}");
        }
        Verdict::Close
    }

    pub fn on_timeout(&mut self, key: usize, svc: &mut Services) -> Verdict {
        // In `Proxy` the deadline may be the upstream's: `proxy_timeout` tells.
        if let Some((timeout, _)) = self
            .transfer_limits(svc)
            .filter(|_| self.phase != Phase::Proxy)
        {
            if svc.clock.now_us < self.progress + timeout.as_micros() as Micros {
                return self.on_rate_period(key, svc);
            }
        }
        let has_input = self.busy.as_ref().is_some_and(|b| b.in_start != b.in_end);
        match self.phase {
            Phase::ReadHead if !has_input => self.close_if_quiet(key, svc),
            Phase::ReadHead | Phase::ReadBody => self.request_timeout(key, svc),
            Phase::Write(_) => {
                forkd_shared::info!("client {} timed out reading its response", self.peer);
                self.abort()
            }
            Phase::Linger => Verdict::Close,
            Phase::FileWait => {
                forkd_shared::warn!(
                    "a file for client {} was not opened within send_timeout \
                     (file_threads busy, or a stuck file system): closing",
                    self.peer
                );
                self.abort()
            }
            Phase::CacheWait => {
                // Look again: the entry may be there, the lock free, or the wait over.
                self.phase = Phase::ReadHead;
                if let Some(busy) = self.busy.as_deref_mut() {
                    busy.head_scanned = 0;
                }
                self.drive(key, svc)
            }
            Phase::ProxyHeader => {
                svc.stats.bump(counters::PROXY_HEADER_REFUSED, 1);
                let peer = self.peer;
                svc.proxy_log.note(svc.clock.now_us, || {
                    format!("connection from {peer} sent no PROXY header within header_timeout: closing")
                });
                Verdict::Close
            }
            Phase::Proxy => self.proxy_timeout(key, svc),
            Phase::Tunnel => self.tunnel_timeout(key, svc),
            Phase::H2 => self.h2_timeout(key, svc),
        }
    }

    /// An HTTP/2 connection's deadline passed (`h2::Session::on_deadline`).
    pub(super) fn h2_timeout(&mut self, key: usize, svc: &mut Services) -> Verdict {
        let server = usize::from(self.server);
        let Some(s) = self
            .busy
            .as_mut()
            .and_then(|b| b.h2.as_mut().and_then(|h| h.downcast_mut::<h2::Session>()))
        else {
            return Verdict::Close;
        };
        if s.on_deadline(self.peer, svc, server) {
            return self.abort();
        }
        self.drive(key, svc)
    }

    /// The tunnel's deadline passed: closed if it has been idle for its
    /// `tunnel_idle_timeout` (both sides shut down first, so each reads an EOF).
    pub(super) fn tunnel_timeout(&mut self, key: usize, svc: &mut Services) -> Verdict {
        let Some(tunnel) = self.busy.as_mut().and_then(|b| b.tunnel.as_mut()) else {
            return Verdict::Close;
        };
        if svc.clock.now_us < tunnel.deadline() {
            self.arm(key, svc);
            return Verdict::Keep;
        }
        forkd_shared::info!("tunnel of client {} idle: closing", self.peer);
        tunnel.shut(&mut TunnelClient {
            transport: Transport::new(&mut self.stream, &mut self.tls),
            stats: &svc.stats,
        });
        Verdict::Close
    }

    /// The deadline of a proxied exchange passed: the upstream's (the session decides
    /// what it becomes: a retry, 502/504, a truncated response) or the client's.
    pub(super) fn proxy_timeout(&mut self, key: usize, svc: &mut Services) -> Verdict {
        let now = svc.clock.now_us;
        let Some(busy) = self.busy.as_deref_mut() else {
            return Verdict::Close;
        };
        let Some(mut p) = busy.proxy.take() else {
            return Verdict::Close;
        };
        let (upstream, client) = proxied::deadlines(&p, busy, svc, self.progress);
        let fired_upstream = upstream <= now;
        p.fired = fired_upstream;
        busy.proxy = Some(p);
        if fired_upstream {
            return self.drive(key, svc);
        }
        if client <= now {
            // Before the idle timeout: a rate period ended.
            if let Some((timeout, _)) = self.transfer_limits(svc) {
                if now < self.progress + timeout.as_micros() as Micros {
                    return self.on_rate_period(key, svc);
                }
            }
            forkd_shared::info!("client {} timed out during a proxied exchange", self.peer);
            return Verdict::Close;
        }
        self.arm(key, svc);
        Verdict::Keep
    }

    /// A request under way is answered 408 and the connection closes.
    pub(super) fn request_timeout(&mut self, key: usize, svc: &mut Services) -> Verdict {
        let busy = self.busy(svc);
        let server = busy.body.take().map(|p| p.server);
        busy.discard_input();
        let server = server.unwrap_or(usize::from(self.server));
        self.phase = Phase::ReadHead;
        self.simple_error(svc, Status::REQUEST_TIMEOUT, server);
        // Linger: input that arrived unread must not turn the close into a reset that
        // destroys the 408 before the client reads it.
        self.phase = Phase::Write(After::Linger);
        self.drive(key, svc)
    }
}

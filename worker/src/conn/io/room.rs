//! Drain and room at `worker_connections`: an idle connection closed after one more
//! look at its socket (a request that arrived is answered, not reset), and the
//! connections `limits::rotation` chooses to close or rotate.

use super::*;

impl Conn {
    /// Drain began: an idle connection that has been idle for the grace closes now;
    /// one that just finished a response gets the rest of the grace (its client is
    /// likely about to send, and will get `Connection: close`); a busy one closes after
    /// its current response.
    pub fn on_drain(&mut self, key: usize, svc: &mut Services) -> Verdict {
        if self.phase == Phase::H2 {
            return self.drive(key, svc); // GOAWAY: its streams finish
        }
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
    pub(super) fn close_if_quiet(&mut self, key: usize, svc: &mut Services) -> Verdict {
        self.readable = true;
        match self.drive(key, svc) {
            Verdict::Keep if self.is_idle() => Verdict::Close,
            verdict => verdict,
        }
    }

    /// At `worker_connections` with clients waiting: what the choice of whom to free
    /// needs to know of this connection.
    pub fn candidate(&self, key: usize, now: Micros) -> Candidate {
        Candidate {
            key,
            idle_for: self.is_idle().then(|| now.saturating_sub(self.idle_since)),
            requests: self.requests,
            rotating: self.bits.has(Bits::ROTATE),
        }
    }

    /// Answer the next request with `Connection: close`, then close.
    pub fn rotate(&mut self) {
        self.bits.set(Bits::ROTATE, true);
    }

    /// Closes the connection to make room if it is idle, after one more look at the
    /// socket (as drain does): a request that already arrived is answered, with
    /// `Connection: close`, instead of being reset.
    pub fn close_if_idle(&mut self, key: usize, svc: &mut Services) -> Verdict {
        if !self.is_idle() {
            return Verdict::Keep;
        }
        self.bits.set(Bits::ROTATE, true);
        self.close_if_quiet(key, svc)
    }
}

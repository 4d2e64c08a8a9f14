//! What a connection holds only while it has work — its input buffer, its output
//! queue, a request body under way — and the pool those come from.
//!
//! Taken from the pool when bytes arrive and given back when the connection is idle
//! again, so an idle keep-alive connection is just its `Conn` (about 80 bytes).

use crate::conn::Tunnel;
use crate::http::chunked::ChunkedDecoder;
use crate::out::OutQueue;
use crate::timers::Micros;
use crate::upstreams::Proxied;

/// How a request body being read is framed, and how much of it is left.
pub enum Body {
    Length(u64),
    Chunked(ChunkedDecoder),
}

/// A request whose body is being read: answered once the body is in.
pub struct PendingBody {
    /// A copy of the request head, parsed again to answer.
    pub head: Box<[u8]>,
    pub body: Body,
    /// The server the request's `Host` selected.
    pub server: usize,
}

/// The bytes a body or a response moved in the current period of `min_rate_grace`,
/// to hold them against `min_body_rate` / `min_send_rate`. Measured per period rather
/// than since the start, so that what the socket buffers took at once does not buy a
/// slow reader minutes.
#[derive(Debug, Default, Clone, Copy)]
pub struct RateWindow {
    pub since: Micros,
    pub bytes: u64,
}

impl RateWindow {
    pub fn starting(now: Micros) -> RateWindow {
        RateWindow {
            since: now,
            bytes: 0,
        }
    }

    /// Whether the period that began at `since` and ends at `now` moved at least `rate`
    /// bytes per second.
    pub fn kept(&self, rate: u64, now: Micros) -> bool {
        let elapsed = now.saturating_sub(self.since);
        u128::from(self.bytes) * 1_000_000 >= u128::from(rate) * u128::from(elapsed)
    }
}

/// A connection's buffers and the request body under way.
pub struct Busy {
    pub inbuf: Vec<u8>,
    /// The unread input is `inbuf[in_start..in_end]`.
    pub in_start: usize,
    pub in_end: usize,
    /// Bytes of the partial head at `in_start` already looked at for its end
    /// (`http::head_scan`); 0 when a new head starts.
    pub head_scanned: usize,
    pub out: OutQueue,
    pub body: Option<PendingBody>,
    /// The transfer rate of the body being read or the response being written.
    pub rate: RateWindow,
    /// A proxied exchange under way.
    pub proxy: Option<Box<Proxied>>,
    /// The connection was upgraded (a 101 from the upstream): the byte tunnel.
    pub tunnel: Option<Box<Tunnel>>,
    /// The connection speaks HTTP/2: its session and streams (`conn::H2Session`,
    /// held type-erased: the session's streams hold `Busy`s of their own, and a
    /// named type here would make the two modules import each other).
    pub h2: Option<Box<dyn std::any::Any>>,
    /// An event said the client closed its side (or the socket failed) while these
    /// buffers were the connection's: reads go on to the EOF whatever their sizes,
    /// since a FIN that came with the last bytes raises no further edge. Kept here,
    /// not in `Conn`, so an idle connection stays small (an idle one reads its EOF
    /// in the one read its event starts).
    pub hung_up: bool,
    /// The file-pool job the request at the input's start waits for (`Next::File`).
    pub file_wait: Option<crate::file_pool::JobId>,
}

impl Busy {
    /// A fresh one, with an input buffer of `in_capacity` bytes.
    pub fn new(in_capacity: usize) -> Box<Busy> {
        Box::new(Busy {
            inbuf: vec![0; in_capacity],
            in_start: 0,
            head_scanned: 0,
            in_end: 0,
            out: OutQueue::default(),
            body: None,
            rate: RateWindow::default(),
            proxy: None,
            hung_up: false,
            file_wait: None,
            tunnel: None,
            h2: None,
        })
    }

    /// The size of its input buffer (to drop it when the configuration wants another).
    pub fn in_capacity(&self) -> usize {
        self.inbuf.len()
    }

    /// Nothing buffered either way and no body under way.
    pub fn idle(&self) -> bool {
        self.in_start == self.in_end
            && self.out.is_empty()
            && self.body.is_none()
            && self.proxy.is_none()
            && self.tunnel.is_none()
            && self.h2.is_none()
            && self.file_wait.is_none()
    }

    /// Input bytes not consumed yet.
    pub fn has_input(&self) -> bool {
        self.in_start != self.in_end
    }

    /// Drops the unread input.
    pub fn discard_input(&mut self) {
        self.in_start = 0;
        self.in_end = 0;
        self.head_scanned = 0;
    }

    /// Marks `n` input bytes as consumed.
    pub fn consume(&mut self, n: usize) {
        self.in_start += n;
        self.head_scanned = 0;
        if self.in_start == self.in_end {
            self.discard_input();
        }
    }

    /// Moves the unread input to the start of the buffer, to make room at its end.
    pub fn compact(&mut self) {
        if self.in_start > 0 {
            self.inbuf.copy_within(self.in_start..self.in_end, 0);
            self.in_end -= self.in_start;
            self.in_start = 0;
        }
    }

    /// Empties it for reuse by another connection (the buffers stay allocated).
    pub fn reset(&mut self) {
        self.discard_input();
        self.body = None;
        self.proxy = None;
        self.tunnel = None;
        self.h2 = None;
        self.rate = RateWindow::default();
        self.hung_up = false;
        self.file_wait = None;
        self.out.clear();
    }
}

/// Spare buffers kept for reuse.
const POOL_MAX: usize = 64;

/// Buffers not in use. Boxed because a connection holds them as `Option<Box<Busy>>`:
/// handing one over moves a pointer.
pub struct BusyPool {
    #[allow(clippy::vec_box)]
    spare: Vec<Box<Busy>>,
    /// Input buffer size: room for the largest head any server accepts.
    in_capacity: usize,
}

impl BusyPool {
    pub fn new(in_capacity: usize) -> BusyPool {
        BusyPool {
            spare: Vec::new(),
            in_capacity,
        }
    }

    /// Buffers for a connection that has work.
    pub fn take(&mut self) -> Box<Busy> {
        self.spare
            .pop()
            .unwrap_or_else(|| Busy::new(self.in_capacity))
    }

    /// Buffers back from a connection that is idle or closed.
    pub fn give(&mut self, mut busy: Box<Busy>) {
        if self.spare.len() < POOL_MAX && busy.in_capacity() == self.in_capacity {
            busy.reset();
            self.spare.push(busy);
        }
    }

    /// A configuration with another largest head: new buffers from now on.
    pub fn resize(&mut self, in_capacity: usize) {
        if in_capacity != self.in_capacity {
            self.in_capacity = in_capacity;
            self.spare.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::RateWindow;

    #[test]
    fn a_period_keeps_the_rate_when_enough_bytes_moved() {
        let w = RateWindow {
            since: 1_000_000,
            bytes: 2048,
        };
        assert!(w.kept(1024, 3_000_000)); // 2 KiB in 2 s
        assert!(!w.kept(1024, 3_000_001));
        assert!(!RateWindow { bytes: 2, ..w }.kept(1024, 3_000_000));
        assert!(RateWindow { bytes: 0, ..w }.kept(0, 9_000_000));
    }
}

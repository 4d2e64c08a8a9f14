//! An upgraded connection (a 101 from the upstream, `proxy/upgrade.rs`): from then on a
//! byte tunnel between the client socket and the upstream socket, in both directions.
//!
//! ```text
//!  client ──read──▶ up   (bounded) ──write──▶ upstream
//!  client ◀─write── down (bounded) ◀──read─── upstream
//! ```
//!
//! - **Backpressure:** a side is read only while its pipe has room, so a reader that
//!   does not keep up stops the other side being read (its kernel buffers fill and
//!   TCP flow control slows the sender).
//! - **Half-close:** EOF from one side is passed on as `shutdown(Write)` to the other
//!   once the pipe is empty; the other direction goes on. Both shut: the tunnel ends.
//! - **Idle:** no byte either way for the upstream's `tunnel_idle_timeout`: both
//!   sides are shut down and the connection closes.
//! - **Drain:** a tunnel keeps going until the worker's `drain_timeout`, then is shut
//!   the same way (`event_loop`); the worker exits after that.
//!
//! - **TLS:** the client side is the connection's [`Transport`] (through
//!   [`ClientSide`]): reads decrypt, writes encrypt, records the socket did not take
//!   yet are sent before anything else (and keep the connection waiting for
//!   writability), and the client's half-close is a `close_notify` then a TCP
//!   shutdown, once every record before it is out. So `wss://` tunnels as `ws://`.
//!
//! The tunnel starts with the bytes already read past both heads (the client's
//! pipelined after its request, the upstream's after its 101). Its upstream socket
//! keeps the token (and `Owner::Client`) the exchange registered, and never goes back
//! to a pool: its token is forgotten when the connection closes.

use crate::proxy::connect::UpstreamSocket;
use crate::stats::Stats;
use crate::timers::Micros;
use crate::tls::Transport;
use crate::upstreams::Upstreams;
use forkd_shared::shm::counters;
use std::io::{self, Read, Write};
use std::net::Shutdown;

/// What a tunnel reads from and writes to on the client's side: plaintext both
/// ways, whatever the connection speaks underneath.
pub trait ClientSide: Read + Write {
    /// Sends output made earlier and still pending below the plaintext (TLS
    /// records): `Ok(true)` when none is left.
    fn push(&mut self) -> io::Result<bool>;
    /// Whether a read that returned `n` of `space` bytes may have left input unread
    /// (no further readiness edge would say so).
    fn may_have_more(&self, n: usize, space: usize) -> bool;
    /// Ends the sending side (with TLS: a `close_notify` first).
    fn shutdown_write(&mut self) -> io::Result<()>;
}

/// The connection's [`Transport`] as a tunnel's client side; its reads count TLS
/// alerts in `stats`.
pub struct Client<'t, 'a> {
    pub transport: Transport<'a>,
    pub stats: &'t Stats,
}

impl Read for Client<'_, '_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.transport.read_counted(buf, self.stats)
    }
}

impl Write for Client<'_, '_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.transport.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.transport.flush()
    }
}

impl ClientSide for Client<'_, '_> {
    fn push(&mut self) -> io::Result<bool> {
        self.transport.push()
    }

    fn may_have_more(&self, n: usize, space: usize) -> bool {
        self.transport.may_have_more(n, space)
    }

    fn shutdown_write(&mut self) -> io::Result<()> {
        self.transport.shutdown_write()
    }
}

/// Bytes buffered per direction.
pub const PIPE_BYTES: usize = 16 * 1024;
/// Input read and dropped per socket when a tunnel is shut, so the close is a FIN
/// rather than a reset (unread input turns `close` into RST).
const DISCARD_MAX: usize = 256 * 1024;

/// One direction's bytes between reading one socket and writing the other.
#[derive(Debug)]
struct Pipe {
    /// At least `capacity` bytes (more if the seed was larger).
    buf: Vec<u8>,
    /// It takes input only while it holds less than this.
    capacity: usize,
    start: usize,
    end: usize,
    /// The side it reads from sent EOF.
    eof: bool,
    /// The EOF was passed on: the side it writes to is shut down for writing.
    shut: bool,
}

impl Pipe {
    /// A pipe of `capacity` bytes holding `seed` (larger if `seed` is).
    fn new(capacity: usize, seed: &[u8]) -> Pipe {
        let mut buf = vec![0; capacity.max(seed.len())];
        buf[..seed.len()].copy_from_slice(seed);
        Pipe {
            buf,
            capacity,
            start: 0,
            end: seed.len(),
            eof: false,
            shut: false,
        }
    }

    fn pending(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    fn advance(&mut self, n: usize) {
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Free space at the end, moving what is pending to the front if it must.
    fn room(&mut self) -> &mut [u8] {
        if self.end == self.buf.len() && self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        &mut self.buf[self.end..]
    }

    fn has_room(&self) -> bool {
        self.end - self.start < self.capacity
    }

    /// Reads what `from` has into the free space: `Ok(Some(n))` bytes (0: EOF),
    /// `Ok(None)`: nothing now.
    fn fill(&mut self, from: &mut impl Read) -> io::Result<Option<usize>> {
        loop {
            let room = self.room();
            match from.read(room) {
                Ok(0) => {
                    self.eof = true;
                    return Ok(Some(0));
                }
                Ok(n) => {
                    self.end += n;
                    return Ok(Some(n));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Writes what is pending to `to`, at most `budget` bytes: how many it took.
    fn drain(&mut self, to: &mut impl Write, budget: u64) -> io::Result<usize> {
        let mut sent = 0;
        while self.start < self.end && (sent as u64) < budget {
            let max =
                (self.end - self.start).min(usize::try_from(budget).unwrap_or(usize::MAX) - sent);
            match to.write(&self.buf[self.start..self.start + max]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.advance(n);
                    sent += n;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(sent)
    }
}

/// Client bytes a [`Tunnel::pump`] moved, for the stats.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Moved {
    pub from_client: u64,
    pub to_client: u64,
}

/// What [`Tunnel::pump`] left the tunnel in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pumped {
    /// Both sockets would block (or their pipes are full): wait for an event.
    Wait,
    /// The turn's byte budget is spent with bytes still moving.
    Budget,
    /// Both directions ended, or a socket failed: close the connection.
    Ended,
}

/// An upgraded connection's upstream side and both pipes.
#[derive(Debug)]
pub struct Tunnel {
    upstream: UpstreamSocket,
    /// The upstream socket's token key (`Upstreams`), forgotten when it closes.
    token: usize,
    /// The upstream (`Config::upstreams`) and server the socket is connected to, for
    /// the upstream's open-connections gauge.
    server: Option<(usize, usize)>,
    /// Client to upstream.
    up: Pipe,
    /// Upstream to client.
    down: Pipe,
    /// The upstream socket may have input we have not read (edge-triggered: set by
    /// its readable events, cleared on EAGAIN).
    upstream_readable: bool,
    /// An event said the peer closed (or failed): read such a side until EOF, not
    /// just until a short read, since a FIN that came with the last bytes raises no
    /// further edge. Cleared on EAGAIN (a later close raises an edge of its own).
    client_hup: bool,
    upstream_hup: bool,
    idle_timeout: Micros,
    /// The last time a byte moved either way (or the tunnel opened).
    last: Micros,
}

impl Tunnel {
    /// Opens a tunnel over `upstream` (registered under `token`), starting with the
    /// client's bytes after its request (`client_rest`) and the upstream's after its
    /// 101 (`upstream_rest`), at `now`.
    pub fn open(
        upstream: UpstreamSocket,
        token: usize,
        server: Option<(usize, usize)>,
        client_rest: &[u8],
        upstream_rest: &[u8],
        idle_timeout: std::time::Duration,
        now: Micros,
    ) -> Tunnel {
        Tunnel {
            upstream,
            token,
            server,
            up: Pipe::new(PIPE_BYTES, client_rest),
            down: Pipe::new(PIPE_BYTES, upstream_rest),
            // Its edges may have been consumed while the exchange ran.
            upstream_readable: true,
            // Those edges may have said so, too (until the first EAGAIN).
            client_hup: true,
            upstream_hup: true,
            idle_timeout: idle_timeout.as_micros() as Micros,
            last: now,
        }
    }

    /// The upstream and server index of its upstream connection.
    pub fn server(&self) -> Option<(usize, usize)> {
        self.server
    }

    /// When it closes for idleness.
    pub fn deadline(&self) -> Micros {
        self.last.saturating_add(self.idle_timeout)
    }

    /// A readable event arrived for the upstream socket; `hup`: it said the peer
    /// closed (or the socket failed).
    pub fn upstream_ready(&mut self, hup: bool) {
        self.upstream_readable = true;
        self.upstream_hup |= hup;
    }

    /// An event for the client socket said the peer closed (or the socket failed).
    pub fn client_hung_up(&mut self) {
        self.client_hup = true;
    }

    /// Bytes for the client are waiting for its socket.
    pub fn wants_client_write(&self) -> bool {
        !self.down.pending().is_empty()
    }

    /// Moves bytes both ways until both sockets would block, `budget` bytes are
    /// written, or the tunnel ends. `client_readable`: the client socket may have
    /// input (edge-triggered readiness); the upstream's is kept here
    /// ([`Tunnel::upstream_ready`]). `now` is the time of any byte moved; `moved`
    /// counts the client's bytes (for the stats).
    pub fn pump(
        &mut self,
        client: &mut impl ClientSide,
        client_readable: &mut bool,
        now: Micros,
        budget: &mut u64,
        moved: &mut Moved,
    ) -> Pumped {
        match self.pump_io(client, client_readable, now, budget, moved) {
            Ok(pumped) => pumped,
            Err(e) => {
                forkd_shared::debug!("tunnel ended by a socket error: {e}");
                Pumped::Ended
            }
        }
    }

    fn pump_io(
        &mut self,
        client: &mut impl ClientSide,
        client_readable: &mut bool,
        now: Micros,
        budget: &mut u64,
        meter: &mut Moved,
    ) -> io::Result<Pumped> {
        loop {
            let mut moved = false;
            // Records made earlier go out first (a writable event may be all that
            // woke the tunnel); while some are left, no more is written.
            let flushed = client.push()?;
            let to_client = if flushed {
                self.down.drain(client, *budget)?
            } else {
                0
            };
            if to_client > 0 {
                meter.to_client += to_client as u64;
                *budget = budget.saturating_sub(to_client as u64);
                moved = true;
            }
            let to_upstream = self.up.drain(&mut self.upstream, *budget)?;
            if to_upstream > 0 {
                *budget = budget.saturating_sub(to_upstream as u64);
                moved = true;
            }
            if self.up.eof && !self.up.shut && self.up.pending().is_empty() {
                self.up.shut = true;
                shutdown_upstream(&self.upstream)?;
            }
            if self.down.eof
                && !self.down.shut
                && self.down.pending().is_empty()
                && client.push()?
            {
                self.down.shut = true;
                client.shutdown_write()?;
            }
            if self.up.shut && self.down.shut {
                return Ok(Pumped::Ended);
            }
            if !self.up.eof && *client_readable && self.up.has_room() {
                let space = self.up.room().len();
                match self.up.fill(client)? {
                    Some(n) => {
                        moved = true;
                        meter.from_client += n as u64;
                        // A short read drained the socket: the next edge tells of
                        // more (unless the peer closed: then read on to the EOF).
                        *client_readable = client.may_have_more(n, space) || self.client_hup;
                    }
                    None => {
                        // Drained: a close from now on raises an edge of its own.
                        *client_readable = false;
                        self.client_hup = false;
                    }
                }
            }
            if !self.down.eof && self.upstream_readable && self.down.has_room() {
                let space = self.down.room().len();
                match self.down.fill(&mut self.upstream)? {
                    Some(n) => {
                        moved = true;
                        self.upstream_readable = n == space || self.upstream_hup;
                    }
                    None => {
                        self.upstream_readable = false;
                        self.upstream_hup = false;
                    }
                }
            }
            if !moved {
                return Ok(Pumped::Wait);
            }
            self.last = now;
            if *budget == 0 {
                return Ok(Pumped::Budget);
            }
        }
    }

    /// Ends the tunnel cleanly (idle, or the drain's end): both sides are shut down
    /// for writing and their unread input dropped, so each peer reads an EOF (a
    /// WebSocket client: the connection closed, not reset).
    pub fn shut(&mut self, client: &mut impl ClientSide) {
        let _ = client.push();
        let _ = client.shutdown_write();
        let _ = shutdown_upstream(&self.upstream);
        discard(client);
        discard(&mut self.upstream);
    }

    /// The connection closed: the upstream socket closes with the tunnel, its token
    /// is free, and the tunnel is counted in `tunnels_closed` (`tunnels_opened` is
    /// counted by the caller of [`Tunnel::open`]). Takes the worker's upstream tokens
    /// and stats rather than all its services: `busy` holds a tunnel, and the services
    /// hold the busy pool.
    pub fn close(self, upstreams: &mut Upstreams, stats: &mut Stats) {
        upstreams.forget(self.token);
        stats.bump(counters::TUNNELS_CLOSED, 1);
    }
}

fn shutdown_upstream(socket: &UpstreamSocket) -> io::Result<()> {
    let result = match socket {
        UpstreamSocket::Tcp(s) => s.shutdown(Shutdown::Write),
        UpstreamSocket::Unix(s) => s.shutdown(Shutdown::Write),
    };
    match result {
        // The peer is gone already: nothing to tell it.
        Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(()),
        other => other,
    }
}

/// Reads and drops what `from` has now (bounded).
fn discard(from: &mut impl Read) {
    let mut scratch = [0u8; 4096];
    let mut total = 0;
    while total < DISCARD_MAX {
        match from.read(&mut scratch) {
            Ok(0) | Err(_) => return,
            Ok(n) => total += n,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{ClientSide, Moved, Pipe, Pumped, Tunnel};
    use crate::proxy::connect::UpstreamSocket;
    use mio::{Events, Interest, Poll, Token};
    use std::io::{self, Read, Write};
    use std::net::{Shutdown, TcpListener};
    use std::time::Duration;

    /// A plain socket as the client side, as `Client` over a plain `Transport` is.
    impl ClientSide for mio::net::TcpStream {
        fn push(&mut self) -> io::Result<bool> {
            Ok(true)
        }

        fn may_have_more(&self, n: usize, space: usize) -> bool {
            n == space
        }

        fn shutdown_write(&mut self) -> io::Result<()> {
            self.shutdown(Shutdown::Write)
        }
    }

    /// A connected pair on loopback: the peer (blocking, std) and our side (mio).
    fn pair() -> (std::net::TcpStream, mio::net::TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let peer = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let (ours, _) = listener.accept().unwrap();
        ours.set_nonblocking(true).unwrap();
        (peer, mio::net::TcpStream::from_std(ours))
    }

    /// Waits for an event on `token` that says the peer closed.
    fn wait_closed(poll: &mut Poll, token: Token) {
        let mut events = Events::with_capacity(8);
        for _ in 0..500 {
            poll.poll(&mut events, Some(Duration::from_millis(10)))
                .unwrap();
            if events
                .iter()
                .any(|e| e.token() == token && e.is_read_closed())
            {
                return;
            }
        }
        panic!("no close event");
    }

    /// The event loop's part: an event that says the peer closed makes the tunnel
    /// read that side on to its EOF, though the bytes before the FIN came in a short
    /// read (a FIN that comes with data raises no edge of its own).
    #[test]
    fn a_close_that_came_with_the_last_bytes_is_passed_on_both_ways() {
        let (mut client_peer, mut client) = pair();
        let (mut upstream_peer, mut upstream) = pair();
        let mut poll = Poll::new().unwrap();
        poll.registry()
            .register(&mut client, Token(0), Interest::READABLE)
            .unwrap();
        poll.registry()
            .register(&mut upstream, Token(1), Interest::READABLE)
            .unwrap();
        let mut t = Tunnel::open(
            UpstreamSocket::Tcp(upstream),
            7,
            None,
            b"early;",
            b"hello;",
            Duration::from_secs(3600),
            0,
        );
        let (mut readable, mut budget, mut moved) = (true, u64::MAX, Moved::default());
        // The seeds go out; both sockets are drained (EAGAIN).
        assert_eq!(
            t.pump(&mut client, &mut readable, 1, &mut budget, &mut moved),
            Pumped::Wait
        );
        assert!(!readable);
        let mut got = [0u8; 6];
        client_peer.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hello;");

        client_peer.write_all(b"late").unwrap();
        client_peer.shutdown(Shutdown::Write).unwrap();
        wait_closed(&mut poll, Token(0));
        readable = true;
        t.client_hung_up();
        assert_eq!(
            t.pump(&mut client, &mut readable, 2, &mut budget, &mut moved),
            Pumped::Wait
        );
        let mut up = Vec::new();
        upstream_peer.read_to_end(&mut up).unwrap();
        assert_eq!(up, b"early;late", "then the client's EOF, as a half-close");

        upstream_peer.write_all(b"bye").unwrap();
        upstream_peer.shutdown(Shutdown::Write).unwrap();
        wait_closed(&mut poll, Token(1));
        t.upstream_ready(true);
        assert_eq!(
            t.pump(&mut client, &mut readable, 3, &mut budget, &mut moved),
            Pumped::Ended,
            "both directions closed"
        );
        let mut down = Vec::new();
        client_peer.read_to_end(&mut down).unwrap();
        assert_eq!(down, b"bye");
        assert_eq!(
            moved,
            Moved {
                from_client: 4,
                to_client: 9
            }
        );
        assert_eq!(t.deadline(), 3 + 3_600_000_000, "from the last byte moved");
    }

    #[test]
    fn a_pump_writes_no_more_than_its_budget_and_a_full_pipe_reads_nothing() {
        let (mut client_peer, mut client) = pair();
        let (mut upstream_peer, upstream) = pair();
        let seed = vec![7u8; 40_000]; // more than the pipe holds
        let mut t = Tunnel::open(
            UpstreamSocket::Tcp(upstream),
            7,
            None,
            &seed,
            b"",
            Duration::from_secs(1),
            0,
        );
        client_peer.write_all(b"not yet").unwrap();
        let (mut readable, mut moved) = (true, Moved::default());
        let mut budget = 1000;
        assert_eq!(
            t.pump(&mut client, &mut readable, 1, &mut budget, &mut moved),
            Pumped::Budget
        );
        assert_eq!(budget, 0);
        assert_eq!(moved.from_client, 0, "no room: the client is not read");
        assert!(readable, "its input is still there");
        let mut budget = u64::MAX;
        t.pump(&mut client, &mut readable, 2, &mut budget, &mut moved);
        assert_eq!(moved.from_client, 7, "read once the pipe had room");
        let mut got = vec![0u8; seed.len() + 7];
        upstream_peer.read_exact(&mut got).unwrap();
        assert_eq!(&got[..seed.len()], &seed[..]);
        assert_eq!(&got[seed.len()..], b"not yet");
    }

    #[test]
    fn a_pipe_holds_its_seed_and_takes_no_more_than_its_capacity() {
        let mut p = Pipe::new(8, b"abc");
        assert_eq!(p.pending(), b"abc");
        let mut src: &[u8] = b"defghijklmn";
        assert_eq!(p.fill(&mut src).unwrap(), Some(5));
        assert!(!p.has_room(), "full: the source is not read");
        let mut sink = Vec::new();
        assert_eq!(
            p.drain(&mut sink, 2).unwrap(),
            2,
            "the budget bounds a write"
        );
        assert!(p.has_room());
        assert_eq!(p.fill(&mut src).unwrap(), Some(2), "room moved to the end");
        assert_eq!(p.drain(&mut sink, u64::MAX).unwrap(), 8);
        assert_eq!(sink, b"abcdefghij");
        let mut empty: &[u8] = b"";
        assert_eq!(p.fill(&mut empty).unwrap(), Some(0));
        assert!(p.eof);
        let big = Pipe::new(4, b"0123456789");
        assert_eq!(big.pending(), b"0123456789", "a larger seed is kept whole");
    }
}

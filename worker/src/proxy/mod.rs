//! The reverse proxy, sans-io: everything a `Proxy` route needs except the sockets.
//!
//! The event loop owns the upstream sockets ([`connect::UpstreamSocket`]) and their
//! tokens; the other modules decide what to write, how to read what comes back, when
//! a connection may be pooled, and what to do when something fails. Each of those is
//! unit-tested on byte slices.
//!
//! - [`upstream_request`]: the client's request head re-serialised for the upstream.
//! - [`response_head`]: the upstream's response head parsed, framed (RFC 9112 §6.3)
//!   and re-serialised for the client; whether the upstream connection is reusable.
//! - [`body`]: streaming body decoding (yields the data) and re-encoding, with a
//!   bounded buffer between the two sides.
//! - [`connect`]: upstream sockets (TCP or Unix), non-blocking, a `mio` source.
//! - [`balance`]: which server takes a request (round robin, least in flight, two
//!   choices, consistent hashing) from each server's usability, weight and in-flight
//!   count.
//! - [`pool`]: per-worker, per-server idle connection pools (LIFO), generic over the
//!   connection type; no knowledge of clients.
//! - [`retry`]: which failures are retried where, and which status a failure becomes.
//! - [`stream`]: both directions as byte streams composed from the above
//!   (`RequestStream`: head + body; `ResponseStream`: heads + body), bounded.
//! - [`exchange`]: the state machine of one proxied exchange.
//! - [`session`]: an exchange with its upstream socket: moves the bytes, feeds the
//!   state machine, tells the connection code what to do next ([`session::Step`]).
//! - [`splice`]: the pipe a body relayed as is goes through, upstream socket → pipe
//!   → client socket, with `splice(2)`.
//! - [`request_id`]: `X-Request-Id` values unique per worker.
//! - [`upgrade`]: `Upgrade` requests (WebSocket): the fields forwarded both ways
//!   around a 101; the tunnel itself is `conn/tunnel.rs`.

pub mod balance;
pub mod body;
pub mod connect;
pub mod exchange;
pub mod pool;
pub mod request_id;
pub mod response_head;
pub mod retry;
pub mod session;
pub mod splice;
pub mod stream;
pub mod upgrade;
pub mod upstream_request;

/// Hop-by-hop fields (RFC 9110 §7.6.1) a proxy never forwards, in either direction,
/// besides those a `Connection` field names. `Transfer-Encoding` and `Content-Length`
/// are rewritten by the proxy itself.
pub(crate) fn is_hop_by_hop(name: &[u8]) -> bool {
    const FIELDS: [&[u8]; 7] = [
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"te",
        b"transfer-encoding",
        b"upgrade",
        b"expect",
    ];
    FIELDS.iter().any(|f| name.eq_ignore_ascii_case(f))
}

/// The field names a message's `Connection` fields list, looked up in place (no
/// allocation: most messages have no `Connection` field, or one with one token).
#[derive(Clone, Copy)]
pub(crate) struct ConnectionTokens<'a, 'h> {
    /// The message's fields, or none when it has no `Connection` field.
    headers: &'a [httparse::Header<'h>],
}

impl<'a, 'h> ConnectionTokens<'a, 'h> {
    pub(crate) fn of(headers: &'a [httparse::Header<'h>]) -> Self {
        let any = headers
            .iter()
            .any(|h| h.name.eq_ignore_ascii_case("connection"));
        ConnectionTokens {
            headers: if any { headers } else { &[] },
        }
    }

    /// Whether `name` is listed (case-insensitive).
    pub(crate) fn contains(&self, name: &[u8]) -> bool {
        self.headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case("connection"))
            .flat_map(|h| h.value.split(|&b| b == b','))
            .map(trim)
            .any(|t| !t.is_empty() && t.eq_ignore_ascii_case(name))
    }
}

/// `value` without leading and trailing spaces and tabs.
pub(crate) fn trim(value: &[u8]) -> &[u8] {
    let start = value.iter().position(|&b| b != b' ' && b != b'\t');
    let Some(start) = start else { return &[] };
    let end = value
        .iter()
        .rposition(|&b| b != b' ' && b != b'\t')
        .unwrap_or(start);
    &value[start..=end]
}

/// Parses a decimal `Content-Length` value: digits only, no sign, no overflow.
pub(crate) fn parse_decimal(value: &[u8]) -> Option<u64> {
    if value.is_empty() || value.len() > 19 {
        return None;
    }
    value.iter().try_fold(0u64, |n, &b| {
        b.is_ascii_digit().then(|| n * 10 + u64::from(b - b'0'))
    })
}

pub(crate) use crate::http::response::push_decimal;

/// Appends `n` in lower-case hex, without leading zeros.
pub(crate) fn push_hex(out: &mut Vec<u8>, n: u64) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut digits = [0u8; 16];
    let mut i = digits.len();
    let mut n = n;
    loop {
        i -= 1;
        digits[i] = HEX[(n & 15) as usize];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The modules together, as the connection code will drive them: a request meets
    /// a stale pooled connection, is replayed on a new one, and the new connection
    /// goes back to the pool. Sockets are scripted.
    #[test]
    fn a_stale_pooled_connection_costs_a_reconnect_not_a_request() {
        use exchange::{Action, Event, Exchange};
        use pool::{Pool, PoolSettings};
        use response_head::ResponseContext;
        use stream::{RequestStream, ResponseStream};
        use upstream_request::{Forwarding, Framing, Scheme};

        #[derive(Debug, PartialEq)]
        struct FakeConn {
            id: u32,
            stale: bool,
            written: Vec<u8>,
            requests: u64,
        }

        let mut pool = Pool::new(PoolSettings {
            keepalive: 4,
            keepalive_timeout: 1_000_000,
            keepalive_requests: 100,
        });
        let stale = FakeConn {
            id: 1,
            stale: true,
            written: Vec::new(),
            requests: 3,
        };
        pool.put(stale, 3, 0).unwrap();

        let client_head =
            b"GET /api/items HTTP/1.1\r\nHost: shop\r\nConnection: keep-alive\r\n\r\n";
        let mut ids = request_id::RequestIds::new(7, 7);
        let mut head = Vec::new();
        let fwd = Forwarding {
            client_ip: "10.1.2.3".parse().unwrap(),
            scheme: Scheme::Http,
            fallback_host: b"app",
            close: false,
            shaping: &Default::default(),
            prefix: "/",
        };
        upstream_request::write(client_head, Framing::None, &fwd, &mut ids, &mut head).unwrap();
        let mut request = RequestStream::new(head, Framing::None, 1024);
        let mut x = Exchange::new("GET", 1, 0);

        let mut close = Vec::new();
        let reused = pool.take(10, &mut close).unwrap();
        let mut conn = reused.conn;
        x.start(0, true);
        // The write "succeeds" (the kernel took it), then the upstream's FIN arrives.
        let n = request.pending().len();
        conn.written.extend_from_slice(request.pending());
        request.advance(n);
        x.on(Event::Wrote { n });
        x.on(Event::HeadWritten);
        x.on(Event::RequestBodyDone);
        assert!(conn.stale);
        let action = x.on(Event::Failed(retry::Failure::Reset));
        assert_eq!(
            action,
            Action::Connect { server: 0 },
            "retried, though retries is 0"
        );
        drop(conn);

        assert!(request.rewind());
        let mut fresh = FakeConn {
            id: 2,
            stale: false,
            written: Vec::new(),
            requests: 0,
        };
        x.on(Event::Connected);
        let n = request.pending().len();
        fresh.written.extend_from_slice(request.pending());
        request.advance(n);
        x.on(Event::Wrote { n });
        x.on(Event::HeadWritten);
        x.on(Event::RequestBodyDone);
        assert!(request.is_complete());
        let sent = String::from_utf8(fresh.written.clone()).unwrap();
        assert!(
            sent.starts_with("GET /api/items HTTP/1.1\r\nHost: shop\r\n"),
            "{sent}"
        );
        assert!(!sent.contains("keep-alive"), "{sent}");

        fresh.requests += 1;
        let ctx = ResponseContext {
            head_request: false,
            client_http10: false,
            client_keep_alive: true,
            upstream_requests: fresh.requests,
            keepalive_requests: 100,
            max_head: 8192,
            upgrade: false,
        };
        let mut response = ResponseStream::new(ctx, 1024);
        let upstream = b"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5\r\nContent-Length: 2\r\n\r\n[]";
        x.on(Event::ResponseBytes);
        let fed = response.feed(upstream).unwrap();
        assert_eq!(fed.consumed, upstream.len());
        let head = fed.head.unwrap();
        x.on(Event::FinalHead {
            has_body: true,
            reusable: head.upstream_reusable,
        });
        let mut client = Vec::new();
        while !response.pending().is_empty() {
            let n = response.pending().len();
            client.extend_from_slice(response.pending());
            response.advance(n);
        }
        assert!(response.is_complete());
        assert_eq!(client, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n[]");
        let action = x.on(Event::ResponseDone {
            reusable: head.upstream_reusable,
        });
        assert_eq!(action, Action::Release { reusable: true });
        let requests = fresh.requests;
        pool.put(fresh, requests, 20).unwrap();
        assert_eq!(
            pool.take(30, &mut close).map(|r| (r.conn.id, r.requests)),
            Some((2, 1))
        );
        assert!(close.is_empty());
    }

    #[test]
    fn numbers_are_written_and_read_exactly() {
        let mut out = Vec::new();
        push_decimal(&mut out, 0);
        out.push(b' ');
        push_decimal(&mut out, u64::MAX);
        out.push(b' ');
        push_hex(&mut out, 0);
        out.push(b' ');
        push_hex(&mut out, 0x1f40);
        assert_eq!(out, b"0 18446744073709551615 0 1f40");
        assert_eq!(parse_decimal(b"0"), Some(0));
        assert_eq!(parse_decimal(b"1234"), Some(1234));
        for bad in [
            &b""[..],
            b"+1",
            b"-1",
            b"1 2",
            b"0x10",
            b"99999999999999999999",
        ] {
            assert_eq!(parse_decimal(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn hop_by_hop_fields_and_connection_tokens() {
        assert!(is_hop_by_hop(b"Keep-Alive"));
        assert!(is_hop_by_hop(b"TE"));
        assert!(!is_hop_by_hop(b"Host"));
        let headers = [
            httparse::Header {
                name: "Connection",
                value: b"keep-alive, X-Secret ",
            },
            httparse::Header {
                name: "connection",
                value: b"Foo",
            },
            httparse::Header {
                name: "X-Secret",
                value: b"1",
            },
        ];
        let tokens = ConnectionTokens::of(&headers);
        assert!(tokens.contains(b"x-secret"));
        assert!(tokens.contains(b"FOO"));
        assert!(!tokens.contains(b"host"));
        assert!(!ConnectionTokens::of(&headers[2..]).contains(b"x-secret"));
    }
}

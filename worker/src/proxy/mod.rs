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
//! - [`pool`]: per-worker, per-server idle connection pools (LIFO), generic over the
//!   connection type; no knowledge of clients.
//! - [`retry`]: which failures are retried where, and which status a failure becomes.
//! - [`stream`]: both directions as byte streams composed from the above
//!   (`RequestStream`: head + body; `ResponseStream`: heads + body), bounded.
//! - [`exchange`]: the state machine of one proxied exchange.
//! - [`request_id`]: `X-Request-Id` values unique per worker.

pub mod body;
pub mod connect;
pub mod exchange;
pub mod pool;
pub mod request_id;
pub mod response_head;
pub mod retry;
pub mod stream;
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

/// The field names listed in every `Connection` field of `headers` (lower-case
/// comparison is left to the caller).
pub(crate) fn connection_tokens<'h>(headers: &[httparse::Header<'h>]) -> Vec<&'h [u8]> {
    let mut tokens = Vec::new();
    for h in headers {
        if h.name.eq_ignore_ascii_case("connection") {
            tokens.extend(
                h.value
                    .split(|&b| b == b',')
                    .map(trim)
                    .filter(|t| !t.is_empty()),
            );
        }
    }
    tokens
}

/// Whether `name` is one of `tokens` (case-insensitive).
pub(crate) fn named_in(tokens: &[&[u8]], name: &[u8]) -> bool {
    tokens.iter().any(|t| t.eq_ignore_ascii_case(name))
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

/// Appends `n` in decimal.
pub(crate) fn push_decimal(out: &mut Vec<u8>, n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    let mut n = n;
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

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
        let tokens = connection_tokens(&headers);
        assert!(named_in(&tokens, b"x-secret"));
        assert!(named_in(&tokens, b"FOO"));
        assert!(!named_in(&tokens, b"host"));
    }
}

//! Protocol upgrades through the proxy (`Upgrade`, RFC 9110 §7.8; WebSocket, RFC 6455
//! §4), sans-io: whether a client's head asks for one, the fields the upstream head
//! then carries, and those of the 101 head forwarded to the client.
//!
//! ```text
//! client: GET /ws HTTP/1.1, Connection: Upgrade, Upgrade: websocket
//!   route without `upgrade: true`  ─▶ proxied as plain HTTP (both fields dropped)
//!   route with `upgrade: true`     ─▶ upstream head + `Upgrade: websocket`,
//!                                     `Connection: upgrade`
//! upstream: 101 + Upgrade          ─▶ 101 to the client, then a byte tunnel
//!                                     (`conn/tunnel.rs`); any other status: a response
//! ```
//!
//! Only an HTTP/1.1 request without a body is upgraded: a server must ignore
//! `Upgrade` in HTTP/1.0 (§7.8), and a body would have to be relayed whole before the
//! switch, which no upgrading client sends.

use super::{trim, ConnectionTokens};

/// How many fields a client head may have; the same bound as the request parser.
const MAX_FIELDS: usize = crate::http::request::MAX_HEADERS;

/// The protocol(s) the client's `head` asks to switch to (its first non-empty
/// `Upgrade` value), when it is an HTTP/1.1 request whose `Connection` lists
/// `upgrade`.
pub fn requested(head: &[u8]) -> Option<&[u8]> {
    let mut fields = [const { std::mem::MaybeUninit::<httparse::Header>::uninit() }; MAX_FIELDS];
    let mut req = httparse::Request::new(&mut []);
    match req.parse_with_uninit_headers(head, &mut fields) {
        Ok(httparse::Status::Complete(_)) if req.version == Some(1) => {}
        _ => return None,
    }
    let headers: &[httparse::Header] = req.headers;
    if !ConnectionTokens::of(headers).contains(b"upgrade") {
        return None;
    }
    upgrade_value(headers)
}

fn upgrade_value<'h>(headers: &[httparse::Header<'h>]) -> Option<&'h [u8]> {
    headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("upgrade"))
        .map(|h| trim(h.value))
        .find(|v| !v.is_empty())
}

/// Adds `Upgrade: <protocol>` and `Connection: upgrade` to the upstream head just
/// written at the end of `out` (by `upstream_request::write`, which drops both as
/// hop-by-hop and was told not to ask for `Connection: close`).
pub fn add_request_fields(out: &mut Vec<u8>, protocol: &[u8]) {
    debug_assert!(out.ends_with(b"\r\n\r\n"));
    out.truncate(out.len() - 2);
    out.extend_from_slice(b"Upgrade: ");
    out.extend_from_slice(protocol);
    out.extend_from_slice(b"\r\nConnection: upgrade\r\n\r\n");
}

/// The 101's own hop-by-hop fields for the client: the upstream's `Upgrade` and
/// `Connection: upgrade`. None when the upstream named no protocol (a 502).
pub(super) fn write_switch_fields(out: &mut Vec<u8>, headers: &[httparse::Header]) -> Option<()> {
    let protocol = upgrade_value(headers)?;
    out.extend_from_slice(b"Upgrade: ");
    out.extend_from_slice(protocol);
    out.extend_from_slice(b"\r\nConnection: upgrade\r\n");
    Some(())
}

#[cfg(test)]
mod tests {
    use super::super::response_head::{self, ClientBody, Parsed, ResponseContext, ResponseError};
    use super::*;

    const WS: &[u8] = b"GET /chat HTTP/1.1\r\nHost: h\r\nConnection: keep-alive, Upgrade\r\n\
        Upgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
        Sec-WebSocket-Version: 13\r\n\r\n";

    #[test]
    fn an_upgrade_needs_the_connection_token_and_http_1_1() {
        assert_eq!(requested(WS), Some(&b"websocket"[..]));
        let no_token = b"GET / HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\n\r\n";
        assert_eq!(requested(no_token), None);
        let http10 = b"GET / HTTP/1.0\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n";
        assert_eq!(requested(http10), None);
        let empty = b"GET / HTTP/1.1\r\nConnection: upgrade\r\nUpgrade: \r\n\r\n";
        assert_eq!(requested(empty), None);
        assert_eq!(requested(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n"), None);
    }

    #[test]
    fn the_upstream_head_carries_the_upgrade_and_the_101_is_forwarded_with_it() {
        let mut out = b"GET /chat HTTP/1.1\r\nHost: h\r\nX-Request-Id: 1\r\n\r\n".to_vec();
        add_request_fields(&mut out, b"websocket");
        assert_eq!(
            out,
            b"GET /chat HTTP/1.1\r\nHost: h\r\nX-Request-Id: 1\r\n\
              Upgrade: websocket\r\nConnection: upgrade\r\n\r\n"
        );

        let ctx = ResponseContext {
            upgrade: true,
            ..response_head::TEST_CONTEXT
        };
        let switch = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
            Connection: Upgrade\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n\x81\x02hi";
        let mut client = Vec::new();
        let head = match response_head::parse(switch, &ctx, &mut client) {
            Ok(Some(Parsed::Final(h))) => h,
            other => panic!("{other:?}"),
        };
        assert_eq!(head.status, 101);
        assert_eq!(head.client_body, ClientBody::None);
        assert!(!head.upstream_reusable);
        assert_eq!(
            &switch[head.head_len..],
            b"\x81\x02hi",
            "frames after the head"
        );
        assert_eq!(
            String::from_utf8(client).unwrap(),
            "HTTP/1.1 101 Switching Protocols\r\n\
             Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\
             Upgrade: websocket\r\nConnection: upgrade\r\n\r\n"
        );

        let nameless = b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\n\r\n";
        assert_eq!(
            response_head::parse(nameless, &ctx, &mut Vec::new()),
            Err(ResponseError::SwitchWithoutUpgrade)
        );
        let unasked = ResponseContext {
            upgrade: false,
            ..ctx
        };
        assert_eq!(
            response_head::parse(switch, &unasked, &mut Vec::new()),
            Err(ResponseError::UnexpectedSwitch)
        );
    }
}

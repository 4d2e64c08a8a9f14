//! The client address behind trusted proxies: when the socket's peer is in a server's
//! `trusted_proxies`, its `real_ip_header` (e.g. `X-Forwarded-For`) is read from the
//! right, and the right-most address that is not itself a trusted proxy is the client
//! (each proxy appends the address it received from; only the entries our own proxies
//! wrote can be believed). Every entry trusted: the left-most. An unparseable entry
//! stops the walk at the last address believed.

use forkd_shared::config::cidr::Cidr;
use std::net::IpAddr;

/// The client for a request from `peer` whose `real_ip_header` fields are `values`.
pub fn client<'h>(
    peer: IpAddr,
    trusted: &[Cidr],
    values: impl Iterator<Item = &'h [u8]>,
) -> IpAddr {
    let is_trusted = |ip: IpAddr| trusted.iter().any(|c| c.contains(ip));
    if !is_trusted(peer) {
        return peer;
    }
    let entries: Vec<&[u8]> = values.flat_map(|v| v.split(|&b| b == b',')).collect();
    let mut client = peer;
    for entry in entries.iter().rev() {
        let Some(ip) = std::str::from_utf8(entry)
            .ok()
            .and_then(|s| parse_entry(s.trim()))
        else {
            break;
        };
        client = ip;
        if !is_trusted(ip) {
            break;
        }
    }
    client
}

/// `192.0.2.1`, `2001:db8::1`, `[2001:db8::1]:443` or `192.0.2.1:80`.
fn parse_entry(s: &str) -> Option<IpAddr> {
    if let Ok(ip) = s.parse() {
        return Some(ip);
    }
    s.parse::<std::net::SocketAddr>().ok().map(|a| a.ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trusted() -> Vec<Cidr> {
        vec![
            Cidr::parse("10.0.0.0/8").unwrap(),
            Cidr::parse("127.0.0.1").unwrap(),
        ]
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_right_most_untrusted_address_wins() {
        let xff: &[&[u8]] = &[b"198.51.100.1, 203.0.113.5, 10.1.1.1"];
        assert_eq!(
            client(ip("10.0.0.2"), &trusted(), xff.iter().copied()),
            ip("203.0.113.5")
        );
        // Several header lines are one list, in order.
        let lines: &[&[u8]] = &[b"198.51.100.1", b"203.0.113.5:4433,10.1.1.1"];
        assert_eq!(
            client(ip("127.0.0.1"), &trusted(), lines.iter().copied()),
            ip("203.0.113.5")
        );
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_says() {
        let xff: &[&[u8]] = &[b"1.2.3.4"];
        assert_eq!(
            client(ip("192.0.2.9"), &trusted(), xff.iter().copied()),
            ip("192.0.2.9")
        );
    }

    #[test]
    fn all_trusted_gives_the_left_most_and_garbage_stops_the_walk() {
        let xff: &[&[u8]] = &[b"10.9.9.9, 10.1.1.1"];
        assert_eq!(
            client(ip("10.0.0.2"), &trusted(), xff.iter().copied()),
            ip("10.9.9.9")
        );
        let bad: &[&[u8]] = &[b"203.0.113.7, nonsense, 10.1.1.1"];
        assert_eq!(
            client(ip("10.0.0.2"), &trusted(), bad.iter().copied()),
            ip("10.1.1.1")
        );
        assert_eq!(
            client(ip("10.0.0.2"), &trusted(), std::iter::empty()),
            ip("10.0.0.2")
        );
    }
}

//! Applying a server's (or route's) `limits` to a request or a new connection: which
//! rules apply, the key each is kept per, the verdict in `Enforce` and `DryRun` mode,
//! the counters, and the throttled log line. The table and the bucket do the counting.

use super::bucket::{self, Take};
use super::table::{Held, Refused, Table};
use crate::http::fields::header;
use crate::services::Services;
use forkd_shared::config::limits::{LimitKey, LimitMode, Limits, RateLimit};
use forkd_shared::shm::counters;
use std::net::IpAddr;

/// CLOCK_MONOTONIC in µs: the same clock in every worker, so buckets shared through
/// the region age alike whoever updates them.
pub fn monotonic_us() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |t| {
        t.tv_sec() as u64 * 1_000_000 + t.tv_nsec() as u64 / 1000
    })
}

/// The limits in force for a request to `route` of `server`: the route's, or else
/// the server's; with the scope their buckets are kept under (a server's rules are
/// shared by all its routes that have none of their own).
fn in_force(svc: &Services, server: usize, route: Option<usize>) -> Option<(&Limits, u64)> {
    let s = svc.config.servers.get(server)?;
    if let Some(r) = route {
        if let Some(l) = s.routes.get(r).and_then(|r| r.limits.as_ref()) {
            return Some((l, (server as u64) << 32 | (r as u64) << 16));
        }
    }
    s.limits
        .as_ref()
        .map(|l| (l, (server as u64) << 32 | 0xffff << 16))
}

/// The value a request is keyed by under `rule`, if it has one: for `ClientIp`, the
/// client's address as [`client_ip_key`] masks it, in `ip` (which it borrows).
fn key_value<'h>(
    rule: &RateLimit,
    peer: IpAddr,
    ip: &'h mut [u8; 16],
    head: &'h [u8],
) -> Option<&'h [u8]> {
    match &rule.key {
        LimitKey::ClientIp => {
            let len;
            (*ip, len) = ip_bytes(client_ip_key(peer, rule.ipv6_prefix));
            Some(&ip[..len])
        }
        LimitKey::Header(name) => header(head, name.as_bytes()),
    }
}

/// The address a `ClientIp` rate keeps its bucket per: an IPv6 client's address
/// masked to `ipv6_prefix` leading bits, so that a client holding a whole /64 has one
/// bucket and not 2^64; an IPv4 client's whole address, also when it comes
/// IPv4-mapped (`::ffff:a.b.c.d`, as a dual-stack listener sees IPv4 clients), so
/// that masking never puts every IPv4 client into one /64.
fn client_ip_key(peer: IpAddr, ipv6_prefix: u8) -> IpAddr {
    match peer.to_canonical() {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => {
            let bits = u32::from(ipv6_prefix.min(128));
            let mask = u128::MAX.checked_shl(128 - bits).unwrap_or(0);
            IpAddr::V6((u128::from(v6) & mask).into())
        }
    }
}

fn ip_bytes(ip: IpAddr) -> ([u8; 16], usize) {
    let mut out = [0u8; 16];
    match ip {
        IpAddr::V4(v4) => {
            out[..4].copy_from_slice(&v4.octets());
            (out, 4)
        }
        IpAddr::V6(v6) => {
            out.copy_from_slice(&v6.octets());
            (out, 16)
        }
    }
}

/// The rate limits of the request: `Some(seconds)` for `Retry-After` when it is to be
/// answered 429. In `DryRun` mode a request over a rate is counted and logged, and
/// admitted.
pub fn request(
    svc: &mut Services,
    server: usize,
    route: Option<usize>,
    head: &[u8],
    peer: IpAddr,
) -> Option<u64> {
    let (limits, scope) = in_force(svc, server, route)?;
    if limits.rates.is_empty() {
        return None;
    }
    let table = Table::of(svc.stats.region().layout(), svc.stats.row());
    let now = monotonic_us();
    let mut ip = [0u8; 16];
    let mut over: Option<u64> = None;
    for (i, rule) in limits.rates.iter().enumerate() {
        let Some(value) = key_value(rule, peer, &mut ip, head) else {
            continue;
        };
        let key = table.key(scope | i as u64, value);
        if let Take::Over { retry_after_us } =
            table.take(key, now, rule.rate.interval_us, rule.burst)
        {
            over = Some(over.map_or(retry_after_us, |o| o.max(retry_after_us)));
        }
    }
    let retry = bucket::retry_after_secs(over?);
    let mode = limits.mode;
    let now_us = svc.clock.now_us;
    match mode {
        LimitMode::Enforce => {
            svc.stats.bump(counters::RATE_LIMITED, 1);
            svc.limit_log.note(now_us, || {
                format!("client {peer} over a rate limit: 429, retry after {retry}s")
            });
            Some(retry)
        }
        LimitMode::DryRun => {
            svc.stats.bump(counters::LIMITS_DRY_RUN_HITS, 1);
            svc.limit_log.note(now_us, || {
                format!("client {peer} over a rate limit (DryRun: admitted)")
            });
            None
        }
    }
}

/// What `conn_per_ip` says of a new connection from `peer` to `server`.
pub enum Connection {
    /// Admitted; counted under `Held` if there is a limit (uncount it on close).
    Admit(Option<Held>),
    /// Over the limit: answer 503 and close.
    Refuse,
}

/// `conn_per_ip` of the server a listener's connections start with (a connection's
/// `Host` is not known yet when it is accepted).
pub fn connection(svc: &mut Services, server: usize, peer: IpAddr) -> Connection {
    let Some((limits, scope)) = in_force(svc, server, None) else {
        return Connection::Admit(None);
    };
    let Some(limit) = limits.conn_per_ip else {
        return Connection::Admit(None);
    };
    let table = Table::of(svc.stats.region().layout(), svc.stats.row());
    let (ip, ip_len) = ip_bytes(peer);
    let key = table.key(scope | 0xffff, &ip[..ip_len]);
    let now_s = (monotonic_us() / 1_000_000) as u32;
    let mode = limits.mode;
    let now_us = svc.clock.now_us;
    let refused = match table.hold(key, limit, now_s) {
        Ok(held) => return Connection::Admit(Some(held)),
        Err(refused) => refused,
    };
    let why = match refused {
        Refused::TooMany(open) => {
            format!("client {peer} has {open} connections open, conn_per_ip {limit}")
        }
        Refused::TableFull => format!(
            "client {peer}: every limits-table entry it may use holds other clients' \
             connections, so its conn_per_ip cannot be counted"
        ),
    };
    match mode {
        LimitMode::Enforce => {
            svc.stats.bump(
                match refused {
                    Refused::TooMany(_) => counters::CONN_LIMITED,
                    Refused::TableFull => counters::CONN_TABLE_FULL,
                },
                1,
            );
            svc.limit_log.note(now_us, || format!("{why}: 503"));
            Connection::Refuse
        }
        LimitMode::DryRun => {
            svc.stats.bump(counters::LIMITS_DRY_RUN_HITS, 1);
            svc.limit_log
                .note(now_us, || format!("{why} (DryRun: admitted)"));
            Connection::Admit(None)
        }
    }
}

/// Uncounts a connection `connection` counted.
pub fn release(svc: &Services, held: Held) {
    Table::of(svc.stats.region().layout(), svc.stats.row()).release(held);
}

/// At the worker's start: releases what its row's previous worker left counted.
pub fn adopt_row(svc: &Services) {
    let released = super::table::adopt_row(svc.stats.region().layout(), svc.stats.row());
    if released > 0 {
        forkd_shared::warn!(
            "released {released} conn_per_ip connection(s) still counted by the previous \
             worker of stats row {}",
            svc.stats.row()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(ipv6_prefix: u8) -> RateLimit {
        RateLimit {
            key: LimitKey::ClientIp,
            rate: forkd_shared::config::limits::ReqRate::parse("1/s").unwrap(),
            burst: 1,
            ipv6_prefix,
        }
    }

    /// The bytes `rule` keys a request from `peer` by.
    fn key_of(rule: &RateLimit, peer: &str) -> Vec<u8> {
        let mut ip = [0u8; 16];
        key_value(
            rule,
            peer.parse().unwrap(),
            &mut ip,
            b"GET / HTTP/1.1\r\n\r\n",
        )
        .unwrap()
        .to_vec()
    }

    #[test]
    fn ipv6_clients_of_one_prefix_share_a_key() {
        let r = rule(64);
        assert_eq!(
            key_of(&r, "2001:db8:1:2::1"),
            key_of(&r, "2001:db8:1:2:ffff::9")
        );
        assert_ne!(key_of(&r, "2001:db8:1:2::1"), key_of(&r, "2001:db8:1:3::1"));
        assert_eq!(
            key_of(&r, "2001:db8:1:2:aaaa:bbbb:cccc:dddd"),
            "2001:db8:1:2::"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets()
        );
        let r = rule(48);
        assert_eq!(
            key_of(&r, "2001:db8:1:2::1"),
            key_of(&r, "2001:db8:1:ffff::1")
        );
        assert_ne!(key_of(&r, "2001:db8:1::1"), key_of(&r, "2001:db8:2::1"));
        let whole = rule(128);
        assert_ne!(key_of(&whole, "2001:db8::1"), key_of(&whole, "2001:db8::2"));
        let one = rule(1);
        assert_eq!(key_of(&one, "2001:db8::1"), key_of(&one, "3fff::1"));
        assert_ne!(key_of(&one, "2001:db8::1"), key_of(&one, "8000::1"));
    }

    #[test]
    fn ipv4_clients_keep_their_whole_address_also_when_mapped() {
        let r = rule(64);
        assert_eq!(key_of(&r, "192.0.2.1"), [192, 0, 2, 1]);
        assert_ne!(key_of(&r, "192.0.2.1"), key_of(&r, "192.0.2.2"));
        // A dual-stack listener sees IPv4 clients as ::ffff:a.b.c.d: a /64 of those
        // would be every IPv4 client at once.
        assert_eq!(key_of(&r, "::ffff:192.0.2.1"), [192, 0, 2, 1]);
        assert_ne!(
            key_of(&r, "::ffff:192.0.2.1"),
            key_of(&r, "::ffff:192.0.2.2")
        );
    }
}

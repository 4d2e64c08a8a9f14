//! The worker's side of the region's upstream state (`shm::upstream_state`): which
//! server an attempt goes to ([`choose`]), and the request key a `Hash` upstream
//! hashes ([`request_key`]).
//!
//! Choosing, in this order:
//!
//! 1. a server due for its one trial after `fail_timeout` (down, and the first worker
//!    to claim the trial): the way a down server comes back;
//! 2. the upstream's `balance` over the primary servers that are usable (not down,
//!    per the passive state and the active verdict) and not tried yet by this
//!    request, each with its weight now (`slow_start`) and the in-flight count of
//!    every worker;
//! 3. the same over the `backup` servers, only when no primary is usable;
//! 4. none: [`Choice::AllDown`] (503 with `Retry-After`: until the first down server
//!    may be tried again) if this request tried none, else [`Choice::NoneLeft`] (the
//!    last failure's answer).
//!
//! A server the region does not count (beyond its 64 cells) is balanced as always up,
//! with nothing in flight.

use crate::http::request::Request;
use crate::proxy::balance::{hash_key, Balancer, Candidate};
use forkd_shared::config::{Balance, HashKey, Upstream};
use forkd_shared::shm::upstream_state::{
    usability, ActiveChecks, FailPolicy, UpstreamStateArea, Usability,
};
use std::net::IpAddr;

/// Where an attempt goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    Server(usize),
    /// No server may take the request now; the client may try again after this.
    AllDown {
        retry_after_secs: u64,
    },
    /// Every usable server was tried by this request.
    NoneLeft,
}

/// Buffers [`choose`] reuses (one per worker), so choosing allocates nothing.
#[derive(Debug, Default)]
pub struct Scratch {
    states: Vec<(Usability, Candidate)>,
    candidates: Vec<Candidate>,
}

/// The passive-health settings of `upstream`.
pub fn fail_policy(upstream: &Upstream) -> FailPolicy {
    FailPolicy {
        max_fails: upstream.max_fails,
        fail_timeout_ms: upstream.fail_timeout.as_millis() as u64,
    }
}

/// Chooses the server of the next attempt (see the module doc). `cell_of(server)`:
/// its region cell; `tried`: bit i = server i tried by this request; `key`: the
/// request's hash key (for `Hash` upstreams); `scratch`: a reused buffer.
#[allow(clippy::too_many_arguments)]
pub fn choose(
    balancer: &mut Balancer,
    upstream: &Upstream,
    cell_of: impl Fn(usize) -> Option<usize>,
    area: &UpstreamStateArea,
    active: &dyn ActiveChecks,
    tried: u64,
    key: u64,
    now_ms: u64,
    scratch: &mut Scratch,
) -> Choice {
    let Scratch { states, candidates } = scratch;
    let policy = fail_policy(upstream);
    let was_tried = |s: usize| s < 64 && tried & (1 << s) != 0;
    states.clear();
    for (i, server) in upstream.servers.iter().enumerate() {
        let (usable, weight, in_flight) = match cell_of(i) {
            Some(cell) => {
                let state = area.server(cell);
                let u = usability(state.passive(now_ms), active.verdict(i, cell));
                (u, state.weight_now(now_ms), area.in_flight(cell))
            }
            None => (Usability::Usable, server.weight, 0),
        };
        states.push((
            usable,
            Candidate {
                usable: false,
                weight,
                in_flight,
            },
        ));
    }
    // 1. A due trial, primaries first.
    for backup in [false, true] {
        for (i, server) in upstream.servers.iter().enumerate() {
            if server.backup != backup || was_tried(i) || states[i].0 != Usability::Trial {
                continue;
            }
            if let Some(cell) = cell_of(i) {
                if area.server(cell).claim_trial(now_ms, policy) {
                    return Choice::Server(i);
                }
            }
        }
    }
    // 2, 3. The balance over the usable primaries, else the usable backups.
    for backup in [false, true] {
        candidates.clear();
        let mut any = false;
        for (i, server) in upstream.servers.iter().enumerate() {
            let (u, mut c) = states[i];
            c.usable = server.backup == backup && u == Usability::Usable;
            if c.usable && was_tried(i) {
                // Usable, so the tier is not empty, but this request had it.
                any = true;
                c.usable = false;
            }
            any |= c.usable;
            candidates.push(c);
        }
        if let Some(s) = balancer.pick(candidates, key) {
            return Choice::Server(s);
        }
        if any {
            return Choice::NoneLeft;
        }
    }
    if tried != 0 {
        return Choice::NoneLeft;
    }
    let next_ms = states
        .iter()
        .filter_map(|(u, _)| match u {
            Usability::Unusable {
                retry_at_ms: Some(at),
            } => Some(*at),
            _ => None,
        })
        .min();
    let retry_after_secs = next_ms.map_or(1, |at| at.saturating_sub(now_ms).div_ceil(1000).max(1));
    Choice::AllDown { retry_after_secs }
}

/// The key a `Hash` upstream hashes for the client's request `req` (parsed from
/// `head`) from client `peer` (after `real_ip_header`); 0 for the other policies
/// (never looked at). Read from the client's head as it came, not the one sent
/// upstream: that one has forkd's fields added (it may have more than the parser
/// takes) and the route's shaping applied.
pub fn request_key(balance: &Balance, req: &Request, head: &[u8], peer: IpAddr) -> u64 {
    let Balance::Hash(what) = balance else {
        return 0;
    };
    match what {
        HashKey::ClientIp => match peer {
            IpAddr::V4(a) => hash_key(&a.octets()),
            IpAddr::V6(a) => hash_key(&a.octets()),
        },
        HashKey::Path => hash_key(req.path),
        // The head parsed already: a scan for the first field of that name.
        HashKey::Header(name) => {
            hash_key(crate::http::fields::header(head, name.0.as_bytes()).unwrap_or_default())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use forkd_shared::config::HeaderName;
    use forkd_shared::shm::upstream_state::{DownReason, NoActiveChecks};
    use std::time::Duration;

    fn upstream(backups: &[bool], balance: Balance) -> Upstream {
        let ports: Vec<u16> = (0..backups.len() as u16).map(|i| 9000 + i).collect();
        let mut u = Upstream {
            balance,
            ..crate::test_upstream::upstream("app", &ports)
        };
        for (s, &backup) in u.servers.iter_mut().zip(backups) {
            s.backup = backup;
        }
        u
    }

    use crate::test_region::region;

    fn balancer(u: &Upstream) -> Balancer {
        Balancer::new(
            &u.balance,
            u.servers.iter().map(|s| (s.label.as_str(), s.weight)),
            7,
        )
    }

    #[test]
    fn down_servers_are_skipped_backups_take_over_and_then_503() {
        let (_t, r) = region("tiers");
        let area = &r.layout().upstream_state;
        let u = upstream(&[false, false, true], Balance::RoundRobin);
        let mut b = balancer(&u);
        let mut scratch = Scratch::default();
        let now = 50_000;
        let mut pick = |tried| {
            choose(
                &mut b,
                &u,
                Some,
                area,
                &NoActiveChecks,
                tried,
                0,
                now,
                &mut scratch,
            )
        };
        let policy = fail_policy(&u);
        let picks: Vec<Choice> = (0..4).map(|_| pick(0)).collect();
        assert!(
            !picks.contains(&Choice::Server(2)),
            "the backup waits: {picks:?}"
        );
        area.server(0)
            .record_failure(DownReason::ConnectRefused, now - 1000, policy, true);
        assert_eq!(pick(0), Choice::Server(1));
        assert_eq!(pick(0), Choice::Server(1));
        assert_eq!(
            pick(0b10),
            Choice::NoneLeft,
            "1 tried, 0 down: not the backup"
        );
        area.server(1)
            .record_failure(DownReason::Timeout, now - 500, policy, true);
        assert_eq!(pick(0), Choice::Server(2), "no primary usable: the backup");
        area.server(2)
            .record_failure(DownReason::Reset, now - 200, policy, true);
        // Server 0 may be tried again first, 9 s from now.
        assert_eq!(
            pick(0),
            Choice::AllDown {
                retry_after_secs: 9
            }
        );
        assert_eq!(pick(0b100), Choice::NoneLeft);
    }

    #[test]
    fn a_down_server_gets_one_trial_after_fail_timeout() {
        let (_t, r) = region("trial");
        let area = &r.layout().upstream_state;
        let u = upstream(&[false, false], Balance::LeastConn);
        let mut b = balancer(&u);
        let mut scratch = Scratch::default();
        let policy = fail_policy(&u);
        area.server(0)
            .record_failure(DownReason::ConnectRefused, 1_000, policy, true);
        let mut at = |now| {
            choose(
                &mut b,
                &u,
                Some,
                area,
                &NoActiveChecks,
                0,
                0,
                now,
                &mut scratch,
            )
        };
        assert_eq!(at(5_000), Choice::Server(1));
        assert_eq!(at(11_000), Choice::Server(0), "the trial");
        assert_eq!(at(11_001), Choice::Server(1), "one trial only");
    }

    #[test]
    fn a_server_back_up_ramps_its_share_over_slow_start() {
        use std::sync::atomic::Ordering::Relaxed;
        let (_t, r) = region("slow-start");
        let area = &r.layout().upstream_state;
        let mut u = upstream(&[false, false], Balance::RoundRobin);
        for s in &mut u.servers {
            s.weight = 10;
        }
        u.slow_start = Duration::from_secs(10);
        for cell in 0..2 {
            area.server(cell).weight.store(10, Relaxed);
            area.server(cell).slow_start_ms.store(10_000, Relaxed);
        }
        let mut b = balancer(&u);
        let mut scratch = Scratch::default();
        // Server 1 was down and came back 2.5 s ago: weight 2 of 10 for now.
        area.server(1).mark_down(DownReason::Timeout, 1_000, 2_000);
        area.server(1).mark_up(7_500);
        let mut n = [0; 2];
        for _ in 0..120 {
            match choose(
                &mut b,
                &u,
                Some,
                area,
                &NoActiveChecks,
                0,
                0,
                10_000,
                &mut scratch,
            ) {
                Choice::Server(s) => n[s] += 1,
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(n, [100, 20]);
        // Once slow_start has passed: even.
        let mut n = [0; 2];
        for _ in 0..120 {
            if let Choice::Server(s) = choose(
                &mut b,
                &u,
                Some,
                area,
                &NoActiveChecks,
                0,
                0,
                17_500,
                &mut scratch,
            ) {
                n[s] += 1;
            }
        }
        assert_eq!(n, [60, 60]);
    }

    #[test]
    fn least_conn_sees_other_workers_in_flight() {
        let (_t, r) = region("global");
        let area = &r.layout().upstream_state;
        let u = upstream(&[false, false, false], Balance::LeastConn);
        let mut b = balancer(&u);
        let mut scratch = Scratch::default();
        // Another worker (slot 5) has two requests on server 0 and one on 2.
        area.note_slot(5);
        area.begin(0, 5);
        area.begin(0, 5);
        area.begin(2, 5);
        let choice = choose(
            &mut b,
            &u,
            Some,
            area,
            &NoActiveChecks,
            0,
            0,
            1,
            &mut scratch,
        );
        assert_eq!(choice, Choice::Server(1));
    }

    #[test]
    fn request_keys_hash_what_the_balance_names() {
        let head = b"GET /a/b?x=1 HTTP/1.1\r\nHost: h\r\nX-User:  alice \r\n\r\n";
        let req = crate::http::request::parse(head, head.len())
            .unwrap()
            .unwrap();
        let peer: IpAddr = "10.1.2.3".parse().unwrap();
        let by = |k: HashKey| request_key(&Balance::Hash(k), &req, head, peer);
        assert_eq!(by(HashKey::Path), hash_key(b"/a/b"));
        assert_eq!(
            by(HashKey::Header(HeaderName("x-user".into()))),
            hash_key(b"alice")
        );
        assert_eq!(
            by(HashKey::Header(HeaderName("X-None".into()))),
            hash_key(b"")
        );
        assert_eq!(by(HashKey::ClientIp), hash_key(&[10, 1, 2, 3]));
        assert_eq!(request_key(&Balance::RoundRobin, &req, head, peer), 0);
    }
}

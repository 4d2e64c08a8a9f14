//! Which server of an upstream takes a request, sans-io: the caller describes every
//! server as a [`Candidate`] (may it be used now, its weight now, its requests in
//! flight across all workers), the [`Balancer`] picks one.
//!
//! - `RoundRobin`: smooth weighted round robin, nginx's algorithm: each pick adds
//!   every usable server's weight to its running score, takes the highest score and
//!   takes the total off it. Weights 5, 1, 1 give `a a b a c a a`: spread out, never
//!   bursts. The scores are this worker's (round robin needs no global view); the
//!   weights and which servers are usable are the region's.
//! - `LeastConn`: the fewest requests in flight per unit of weight, all workers
//!   together; ties go round robin.
//! - `TwoChoices`: two different servers drawn at random (by weight), the one with
//!   fewer in flight per unit of weight wins: nearly as good as `LeastConn`, without
//!   herding every worker onto the same idle server between two updates.
//! - `Hash(..)`: consistent hashing on a ring of points (each server's points placed
//!   by hashing its label, so they do not depend on the other servers): a key goes
//!   to the first usable server clockwise from its hash. A server that is removed or
//!   unusable moves only its own keys.
//!
//! Which servers are candidates (not down, not already tried by this request, the
//! backups only when no primary is usable) is the caller's: see `upstream_health`.

use forkd_shared::config::Balance;

/// One server as the balancer sees it, at its index in the upstream's `servers`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    /// May take this request (up, not tried yet, in the tier being picked from).
    pub usable: bool,
    /// Weight now (`slow_start` applied), at least 1.
    pub weight: u32,
    /// Requests under way to it, every worker together.
    pub in_flight: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Policy {
    RoundRobin,
    LeastConn,
    TwoChoices,
    Hash,
}

/// Ring points per unit of weight, and the most points one server gets (a weight
/// above 16 counts as 16 on the ring).
const POINTS_PER_WEIGHT: u32 = 160;
const MAX_POINTS: u32 = 16 * POINTS_PER_WEIGHT;

/// One upstream's balancer, per worker.
#[derive(Debug)]
pub struct Balancer {
    policy: Policy,
    /// Smooth round robin scores, per server.
    scores: Vec<i64>,
    /// `(point, server)`, sorted by point (Hash only).
    ring: Vec<(u64, u32)>,
    rng: u64,
}

impl Balancer {
    /// A balancer for an upstream with `balance` over `servers`: each server's label
    /// (as written: its ring points follow it) and configured weight.
    pub fn new<'a>(
        balance: &Balance,
        servers: impl Iterator<Item = (&'a str, u32)>,
        seed: u64,
    ) -> Balancer {
        let policy = match balance {
            Balance::RoundRobin => Policy::RoundRobin,
            Balance::LeastConn => Policy::LeastConn,
            Balance::TwoChoices => Policy::TwoChoices,
            Balance::Hash(_) => Policy::Hash,
        };
        let mut ring = Vec::new();
        let mut count = 0;
        for (i, (label, weight)) in servers.enumerate() {
            count += 1;
            if policy == Policy::Hash {
                let points = weight.saturating_mul(POINTS_PER_WEIGHT).min(MAX_POINTS);
                for p in 0..points {
                    let mut h = Fnv::new();
                    h.write(label.as_bytes());
                    h.write(b"#");
                    h.write(&p.to_le_bytes());
                    ring.push((h.finish(), i as u32));
                }
            }
        }
        ring.sort_unstable();
        Balancer {
            policy,
            scores: vec![0; count],
            ring,
            rng: seed | 1,
        }
    }

    /// The server for a request whose hash key is `key` (see [`hash_key`]; ignored
    /// unless hashing); None when no candidate is usable.
    pub fn pick(&mut self, candidates: &[Candidate], key: u64) -> Option<usize> {
        if self.scores.len() != candidates.len() {
            self.scores.resize(candidates.len(), 0);
        }
        match self.policy {
            Policy::RoundRobin => self.round_robin(candidates, |_| true),
            Policy::LeastConn => {
                let best = candidates
                    .iter()
                    .filter(|c| c.usable)
                    .copied()
                    .reduce(|a, b| if lighter(&b, &a) { b } else { a })?;
                self.round_robin(candidates, |c| !lighter(&best, c) && !lighter(c, &best))
            }
            Policy::TwoChoices => self.two_choices(candidates),
            Policy::Hash => self.on_ring(candidates, key),
        }
    }

    /// Smooth weighted round robin over the usable candidates `among` accepts.
    fn round_robin(
        &mut self,
        candidates: &[Candidate],
        among: impl Fn(&Candidate) -> bool,
    ) -> Option<usize> {
        let mut total = 0i64;
        let mut best: Option<usize> = None;
        for (i, c) in candidates.iter().enumerate() {
            if !c.usable || !among(c) {
                continue;
            }
            let w = i64::from(c.weight.max(1));
            self.scores[i] += w;
            total += w;
            if best.is_none_or(|b| self.scores[i] > self.scores[b]) {
                best = Some(i);
            }
        }
        let best = best?;
        self.scores[best] -= total;
        Some(best)
    }

    fn two_choices(&mut self, candidates: &[Candidate]) -> Option<usize> {
        let total: u64 = candidates
            .iter()
            .filter(|c| c.usable)
            .map(|c| u64::from(c.weight.max(1)))
            .sum();
        let first = self.draw(candidates, total, None)?;
        let Some(second) = self.draw(
            candidates,
            total - u64::from(candidates[first].weight.max(1)),
            Some(first),
        ) else {
            return Some(first);
        };
        Some(if lighter(&candidates[second], &candidates[first]) {
            second
        } else {
            first
        })
    }

    /// A usable candidate other than `except`, drawn with probability proportional
    /// to its weight (`total`: the weights it draws among).
    fn draw(
        &mut self,
        candidates: &[Candidate],
        total: u64,
        except: Option<usize>,
    ) -> Option<usize> {
        if total == 0 {
            return None;
        }
        let mut at = self.next_random() % total;
        for (i, c) in candidates.iter().enumerate() {
            if !c.usable || Some(i) == except {
                continue;
            }
            let w = u64::from(c.weight.max(1));
            if at < w {
                return Some(i);
            }
            at -= w;
        }
        None
    }

    fn on_ring(&self, candidates: &[Candidate], key: u64) -> Option<usize> {
        if self.ring.is_empty() || !candidates.iter().any(|c| c.usable) {
            return None;
        }
        let start = self.ring.partition_point(|&(p, _)| p < key);
        (0..self.ring.len())
            .map(|step| self.ring[(start + step) % self.ring.len()].1 as usize)
            .find(|&s| candidates.get(s).is_some_and(|c| c.usable))
    }

    /// xorshift64*: plenty for spreading load, and no dependency.
    fn next_random(&mut self) -> u64 {
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// `a` has fewer requests in flight per unit of weight than `b`.
fn lighter(a: &Candidate, b: &Candidate) -> bool {
    u128::from(a.in_flight) * u128::from(b.weight.max(1))
        < u128::from(b.in_flight) * u128::from(a.weight.max(1))
}

/// The ring position of a request key (the client address's bytes, a header's
/// value, the path).
pub fn hash_key(bytes: &[u8]) -> u64 {
    let mut h = Fnv::new();
    h.write(bytes);
    h.finish()
}

/// FNV-1a with a final avalanche (splitmix64), so that keys differing in one byte
/// land far apart on the ring.
struct Fnv(u64);

impl Fnv {
    fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn finish(&self) -> u64 {
        let mut z = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use forkd_shared::config::{HashKey, HeaderName};

    fn up(weight: u32, in_flight: u64) -> Candidate {
        Candidate {
            usable: true,
            weight,
            in_flight,
        }
    }

    fn balancer(balance: Balance, weights: &[u32]) -> Balancer {
        let labels: Vec<String> = (0..weights.len())
            .map(|i| format!("10.0.0.{}:9000", i + 1))
            .collect();
        Balancer::new(
            &balance,
            labels
                .iter()
                .map(String::as_str)
                .zip(weights.iter().copied()),
            42,
        )
    }

    #[test]
    fn smooth_round_robin_spreads_weights_as_nginx_does() {
        let mut b = balancer(Balance::RoundRobin, &[5, 1, 1]);
        let c = [up(5, 0), up(1, 0), up(1, 0)];
        let picks: Vec<usize> = (0..7).map(|_| b.pick(&c, 0).unwrap()).collect();
        assert_eq!(picks, [0, 0, 1, 0, 2, 0, 0]);
        // An unusable server is skipped; the others share its turns.
        let mut c = c;
        c[0].usable = false;
        let picks: Vec<usize> = (0..4).map(|_| b.pick(&c, 0).unwrap()).collect();
        assert_eq!(picks.iter().filter(|&&s| s == 1).count(), 2, "{picks:?}");
        assert!(!picks.contains(&0));
        c[1].usable = false;
        c[2].usable = false;
        assert_eq!(b.pick(&c, 0), None);
    }

    #[test]
    fn weights_are_honoured_over_many_picks() {
        let mut b = balancer(Balance::RoundRobin, &[3, 1]);
        let c = [up(3, 0), up(1, 0)];
        let mut n = [0; 2];
        for _ in 0..400 {
            n[b.pick(&c, 0).unwrap()] += 1;
        }
        assert_eq!(n, [300, 100]);
    }

    #[test]
    fn least_conn_takes_the_fewest_in_flight_per_weight_and_round_robins_ties() {
        let mut b = balancer(Balance::LeastConn, &[1, 1, 2]);
        // 4 / 1, 1 / 1, 3 / 2: the second.
        assert_eq!(b.pick(&[up(1, 4), up(1, 1), up(2, 3)], 0), Some(1));
        // 2 / 1 vs 2 / 2: the weighted one.
        assert_eq!(b.pick(&[up(1, 2), up(1, 2), up(2, 2)], 0), Some(2));
        let idle = [up(1, 0), up(1, 0), up(1, 9)];
        let picks: Vec<usize> = (0..4).map(|_| b.pick(&idle, 0).unwrap()).collect();
        assert_eq!(picks.iter().filter(|&&s| s == 0).count(), 2, "{picks:?}");
        assert!(!picks.contains(&2));
    }

    #[test]
    fn two_choices_never_takes_the_busiest_of_several() {
        let mut b = balancer(Balance::TwoChoices, &[1, 1, 1]);
        let c = [up(1, 0), up(1, 50), up(1, 1)];
        let mut n = [0; 3];
        for _ in 0..3000 {
            n[b.pick(&c, 0).unwrap()] += 1;
        }
        assert_eq!(n[1], 0, "{n:?}");
        // Server 0 wins every draw it is in: 2 of the 3 pairs.
        assert!(n[0] > 1700 && n[0] < 2300, "{n:?}");
        // One usable: that one; none: None.
        let mut only = c;
        only[0].usable = false;
        only[2].usable = false;
        assert_eq!(b.pick(&only, 0), Some(1));
        only[1].usable = false;
        assert_eq!(b.pick(&only, 0), None);
    }

    fn keys() -> impl Iterator<Item = u64> {
        (0..10_000u32).map(|i| hash_key(format!("user-{i}").as_bytes()))
    }

    #[test]
    fn consistent_hashing_moves_only_a_removed_server_s_keys() {
        let hash = Balance::Hash(HashKey::Header(HeaderName("X-User".into())));
        let b = balancer(hash.clone(), &[1; 5]);
        let all = [up(1, 0); 5];
        let before: Vec<usize> = keys().map(|k| b.on_ring(&all, k).unwrap()).collect();
        let mut share = [0; 5];
        for &s in &before {
            share[s] += 1;
        }
        assert!(share.iter().all(|&n| n > 1200 && n < 2800), "{share:?}");

        // Server 2 down: its keys, and only its, move.
        let mut down = all;
        down[2].usable = false;
        let after: Vec<usize> = keys().map(|k| b.on_ring(&down, k).unwrap()).collect();
        let moved = before.iter().zip(&after).filter(|(a, b)| a != b).count();
        assert!(moved <= 2500, "{moved} of 10000 keys moved");
        assert!(before.iter().zip(&after).all(|(a, b)| a == b || *a == 2));

        // Server 2 removed from the configuration: the same.
        let labels = [
            "10.0.0.1:9000",
            "10.0.0.2:9000",
            "10.0.0.4:9000",
            "10.0.0.5:9000",
        ];
        let smaller = Balancer::new(&hash, labels.iter().map(|l| (*l, 1)), 1);
        let four = [up(1, 0); 4];
        let renumbered: Vec<usize> = keys()
            .map(|k| smaller.on_ring(&four, k).unwrap())
            .map(|s| if s >= 2 { s + 1 } else { s })
            .collect();
        let moved = before
            .iter()
            .zip(&renumbered)
            .filter(|(a, b)| a != b)
            .count();
        assert!(moved <= 2500, "{moved} of 10000 keys moved");
        assert_eq!(renumbered, after);
    }

    #[test]
    fn hashing_follows_weights_and_a_key_keeps_its_server() {
        let mut b = balancer(Balance::Hash(HashKey::Path), &[3, 1]);
        let c = [up(3, 0), up(1, 0)];
        let mut n = [0; 2];
        for k in keys() {
            n[b.pick(&c, k).unwrap()] += 1;
        }
        assert!(n[0] > 6500 && n[0] < 8500, "{n:?}");
        let k = hash_key(b"/some/path");
        let first = b.pick(&c, k);
        assert!((0..10).all(|_| b.pick(&c, k) == first));
    }
}

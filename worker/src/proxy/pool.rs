//! Idle upstream connections: per worker, per upstream server, most recently used
//! first (LIFO), bounded by `keepalive`, closed after `keepalive_timeout` idle, retired
//! after `keepalive_requests`.
//!
//! Generic over the connection type `C` (the event loop's upstream socket and token;
//! a fake in the tests) and knows nothing of clients. The pool never closes anything
//! itself: what must be closed is handed back to the caller, which deregisters and
//! drops it. Idle connections stay registered for reading in the event loop, so an
//! upstream's close or stray bytes reach the loop, which removes that connection
//! ([`Pool::remove`]) before any request can be written to it.
//!
//! LIFO because the most recently used connection is the least likely to have been
//! closed by the upstream's own idle timeout, and the oldest ones expire first.
//!
//! A pool also learns that timeout: how long its last connection the upstream closed
//! had been idle. A request that cannot be sent twice (a body, or a method that is not
//! idempotent; see `Session::can_resend`) is not put on a connection idle for half that
//! or more, since the upstream may be closing it as the request goes out; it gets a
//! new connection instead ([`Pool::take_safe`]). Idempotent requests still reuse any
//! connection, as a failure there is retried.

use crate::timers::Micros;
use forkd_shared::config::{Upstream, UpstreamAddress};
use std::collections::VecDeque;

/// A pool's limits, from the upstream's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSettings {
    /// Idle connections kept; 0 = none.
    pub keepalive: usize,
    pub keepalive_timeout: Micros,
    pub keepalive_requests: u64,
}

impl From<&Upstream> for PoolSettings {
    fn from(u: &Upstream) -> PoolSettings {
        PoolSettings {
            keepalive: u.keepalive,
            keepalive_timeout: u.keepalive_timeout.as_micros() as Micros,
            keepalive_requests: u.keepalive_requests,
        }
    }
}

#[derive(Debug)]
struct Idle<C> {
    conn: C,
    since: Micros,
    requests: u64,
}

/// A connection taken from a pool.
#[derive(Debug, PartialEq, Eq)]
pub struct Reused<C> {
    pub conn: C,
    /// Requests already served on it.
    pub requests: u64,
}

/// The idle connections to one server.
#[derive(Debug)]
pub struct Pool<C> {
    /// Oldest at the front, most recently used at the back.
    idle: VecDeque<Idle<C>>,
    settings: PoolSettings,
    /// How long the last connection the upstream closed had been idle: about the
    /// upstream's own idle timeout. None until one is seen, and again once an idle
    /// connection outlives twice that (the upstream keeps them longer now).
    upstream_closes_after: Option<Micros>,
}

impl<C> Pool<C> {
    pub fn new(settings: PoolSettings) -> Pool<C> {
        Pool {
            idle: VecDeque::new(),
            settings,
            upstream_closes_after: None,
        }
    }

    pub fn len(&self) -> usize {
        self.idle.len()
    }

    pub fn is_empty(&self) -> bool {
        self.idle.is_empty()
    }

    /// The most recently used connection that has not expired. Expired ones met on
    /// the way are pushed to `close`.
    pub fn take(&mut self, now: Micros, close: &mut Vec<C>) -> Option<Reused<C>> {
        self.expire(now, close);
        self.pop_freshest()
    }

    fn pop_freshest(&mut self) -> Option<Reused<C>> {
        self.idle.pop_back().map(|i| Reused {
            conn: i.conn,
            requests: i.requests,
        })
    }

    /// As [`Pool::take`], for a request that cannot be sent twice: None (open a new
    /// connection) when even the most recently used one has been idle for half the
    /// time after which the upstream was seen to close them.
    pub fn take_safe(&mut self, now: Micros, close: &mut Vec<C>) -> Option<Reused<C>> {
        self.expire(now, close);
        if let (Some(limit), Some(oldest)) = (self.upstream_closes_after, self.idle.front()) {
            if now.saturating_sub(oldest.since) >= limit.saturating_mul(2) {
                // Open twice as long as the upstream used to allow: it keeps them longer.
                self.upstream_closes_after = None;
            }
        }
        let freshest = self.idle.back()?;
        match self.upstream_closes_after {
            Some(limit) if now.saturating_sub(freshest.since) >= limit / 2 => None,
            _ => self.pop_freshest(),
        }
    }

    /// How long the upstream lets a connection idle, as last seen (see the module).
    pub fn upstream_closes_after(&self) -> Option<Micros> {
        self.upstream_closes_after
    }

    /// Offers a connection whose exchange ended cleanly after `requests` requests.
    /// `Err(c)`: close `c`: the offered connection when it is not pooled (pooling off,
    /// or `keepalive_requests` reached), or the oldest idle one it replaced in a full
    /// pool.
    pub fn put(&mut self, conn: C, requests: u64, now: Micros) -> Result<(), C> {
        if self.settings.keepalive == 0 || requests >= self.settings.keepalive_requests {
            return Err(conn);
        }
        if self.idle.len() >= self.settings.keepalive {
            // Full: the newcomer is the freshest, so the oldest makes room.
            let oldest = self.idle.pop_front().map(|i| i.conn);
            self.idle.push_back(Idle {
                conn,
                since: now,
                requests,
            });
            return oldest.map_or(Ok(()), Err);
        }
        self.idle.push_back(Idle {
            conn,
            since: now,
            requests,
        });
        Ok(())
    }

    /// Moves every connection idle for `keepalive_timeout` or more to `close`.
    pub fn expire(&mut self, now: Micros, close: &mut Vec<C>) {
        while let Some(front) = self.idle.front() {
            if now.saturating_sub(front.since) < self.settings.keepalive_timeout {
                break;
            }
            close.extend(self.idle.pop_front().map(|i| i.conn));
        }
    }

    /// When the oldest idle connection expires, if any.
    pub fn next_expiry(&self) -> Option<Micros> {
        self.idle
            .front()
            .map(|i| i.since.saturating_add(self.settings.keepalive_timeout))
    }

    /// Removes the idle connection `matches` picks (its address left the server's
    /// name, say).
    pub fn remove(&mut self, mut matches: impl FnMut(&C) -> bool) -> Option<C> {
        let at = self.idle.iter().position(|i| matches(&i.conn))?;
        self.idle.remove(at).map(|i| i.conn)
    }

    /// Removes the idle connection `matches` picks because it turned readable at `now`:
    /// the upstream closed it (or sent bytes nobody asked for). How long it had been
    /// idle is what the upstream allows (see [`Pool::take_safe`]).
    pub fn evict(&mut self, mut matches: impl FnMut(&C) -> bool, now: Micros) -> Option<C> {
        let at = self.idle.iter().position(|i| matches(&i.conn))?;
        let idle = self.idle.remove(at)?;
        self.upstream_closes_after = Some(now.saturating_sub(idle.since));
        Some(idle.conn)
    }

    /// Every idle connection, to close (drain, or a server removed by a reload).
    pub fn drain(&mut self, close: &mut Vec<C>) {
        close.extend(self.idle.drain(..).map(|i| i.conn));
    }

    /// New limits (reload); connections beyond the new `keepalive` go to `close`,
    /// oldest first.
    pub fn set_settings(&mut self, settings: PoolSettings, close: &mut Vec<C>) {
        self.settings = settings;
        while self.idle.len() > settings.keepalive {
            close.extend(self.idle.pop_front().map(|i| i.conn));
        }
    }
}

/// Names one server's pool in a [`Pools`], valid for the configuration generation it
/// was made in (see [`Pools::reconfigure`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerId {
    generation: u32,
    index: u32,
}

/// How many reloads an in-flight exchange's [`ServerId`] survives; an exchange older
/// than that just does not pool its connection.
const REMAPS_KEPT: usize = 8;

/// Every pool of a worker: one per upstream server.
#[derive(Debug)]
pub struct Pools<C> {
    generation: u32,
    /// (upstream name, address) per pool, in `pools` order.
    keys: Vec<(String, UpstreamAddress)>,
    pools: Vec<Pool<C>>,
    /// First pool index of each upstream (`Config::upstreams` order), and one past the last.
    offsets: Vec<usize>,
    /// For the last reloads: (generation, old index -> new index).
    remaps: VecDeque<(u32, Vec<Option<u32>>)>,
}

impl<C> Pools<C> {
    pub fn new(upstreams: &[Upstream]) -> Pools<C> {
        let mut pools = Pools {
            generation: 0,
            keys: Vec::new(),
            pools: Vec::new(),
            offsets: Vec::new(),
            remaps: VecDeque::new(),
        };
        pools.layout(upstreams, |_| None);
        pools
    }

    fn layout(&mut self, upstreams: &[Upstream], mut old: impl FnMut(usize) -> Option<Pool<C>>) {
        self.offsets.clear();
        let mut index = 0;
        for u in upstreams {
            self.offsets.push(index);
            for s in &u.servers {
                let key = (u.name.clone(), s.addr.clone());
                let pool = match old(index) {
                    Some(p) => p,
                    None => Pool::new(PoolSettings::from(u)),
                };
                self.keys.push(key);
                self.pools.push(pool);
                index += 1;
            }
        }
        self.offsets.push(index);
    }

    /// The pool of server `server` of upstream `upstream` (indices into the current
    /// configuration).
    pub fn server_id(&self, upstream: usize, server: usize) -> ServerId {
        let index = self.offsets[upstream] + server;
        debug_assert!(index < self.offsets[upstream + 1]);
        ServerId {
            generation: self.generation,
            index: index as u32,
        }
    }

    /// `id` in the current generation; None if its server was removed, or `id` is
    /// older than the remaps kept.
    pub fn current(&self, id: ServerId) -> Option<ServerId> {
        let mut index = id.index;
        let mut generation = id.generation;
        for (g, map) in &self.remaps {
            if *g == generation {
                index = (*map.get(index as usize)?)?;
                generation += 1;
            }
        }
        (generation == self.generation).then_some(ServerId { generation, index })
    }

    /// The pool `id` names, if its server is still configured.
    pub fn pool(&mut self, id: ServerId) -> Option<&mut Pool<C>> {
        let id = self.current(id)?;
        self.pools.get_mut(id.index as usize)
    }

    /// Adopts a reloaded configuration: pools of servers that stay keep their
    /// connections (with the new limits); those of removed servers are drained to
    /// `close`. In-flight exchanges' ids stay usable through [`Pools::current`].
    pub fn reconfigure(&mut self, upstreams: &[Upstream], close: &mut Vec<C>) {
        let old_keys = std::mem::take(&mut self.keys);
        let mut old_pools: Vec<Option<Pool<C>>> = std::mem::take(&mut self.pools)
            .into_iter()
            .map(Some)
            .collect();
        let mut remap = vec![None; old_keys.len()];
        let mut new_index = 0;
        let mut settings = Vec::new();
        for u in upstreams {
            for s in &u.servers {
                if let Some(old) = old_keys
                    .iter()
                    .position(|(name, addr)| *name == u.name && *addr == s.addr)
                {
                    remap[old] = Some(new_index as u32);
                }
                settings.push(PoolSettings::from(u));
                new_index += 1;
            }
        }
        let mut reverse = vec![None; new_index];
        for (old, new) in remap.iter().enumerate() {
            if let Some(new) = new {
                reverse[*new as usize] = Some(old);
            }
        }
        self.layout(upstreams, |i| {
            reverse[i].and_then(|old| old_pools[old].take())
        });
        for (pool, s) in self.pools.iter_mut().zip(settings) {
            pool.set_settings(s, close);
        }
        for pool in old_pools.iter_mut().flatten() {
            pool.drain(close);
        }
        self.remaps.push_back((self.generation, remap));
        if self.remaps.len() > REMAPS_KEPT {
            self.remaps.pop_front();
        }
        self.generation += 1;
    }

    /// Expires idle connections in every pool.
    pub fn expire(&mut self, now: Micros, close: &mut Vec<C>) {
        for pool in &mut self.pools {
            pool.expire(now, close);
        }
    }

    /// The earliest expiry over every pool.
    pub fn next_expiry(&self) -> Option<Micros> {
        self.pools.iter().filter_map(Pool::next_expiry).min()
    }

    /// Every idle connection of every pool (drain: they close at once).
    pub fn drain(&mut self, close: &mut Vec<C>) {
        for pool in &mut self.pools {
            pool.drain(close);
        }
    }

    /// Takes out the idle connection `matches` picks, whichever pool holds it (an
    /// event on it at `now` said it is no longer usable; see [`Pool::evict`]).
    pub fn evict(&mut self, mut matches: impl FnMut(&C) -> bool, now: Micros) -> Option<C> {
        self.pools
            .iter_mut()
            .find_map(|pool| pool.evict(&mut matches, now))
    }

    /// Pools (one per configured upstream server).
    pub fn len(&self) -> usize {
        self.pools.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pools.is_empty()
    }

    /// Idle connections in all pools.
    pub fn idle(&self) -> usize {
        self.pools.iter().map(Pool::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: PoolSettings = PoolSettings {
        keepalive: 2,
        keepalive_timeout: 1_000,
        keepalive_requests: 3,
    };

    #[test]
    fn most_recently_used_comes_out_first() {
        let mut p = Pool::new(S);
        let mut close = Vec::new();
        p.put("a", 1, 10).unwrap();
        p.put("b", 1, 20).unwrap();
        assert_eq!(p.take(30, &mut close).map(|r| r.conn), Some("b"));
        assert_eq!(
            p.take(30, &mut close),
            Some(Reused {
                conn: "a",
                requests: 1
            })
        );
        assert_eq!(p.take(30, &mut close), None);
        assert!(close.is_empty());
    }

    #[test]
    fn a_full_pool_drops_its_oldest() {
        let mut p = Pool::new(S);
        p.put("a", 1, 10).unwrap();
        p.put("b", 1, 20).unwrap();
        assert_eq!(p.put("c", 1, 30), Err("a"));
        assert_eq!(p.len(), 2);
    }

    #[test]
    fn idle_connections_expire_oldest_first() {
        let mut p = Pool::new(S);
        let mut close = Vec::new();
        p.put("a", 1, 0).unwrap();
        p.put("b", 1, 500).unwrap();
        assert_eq!(p.next_expiry(), Some(1_000));
        p.expire(999, &mut close);
        assert!(close.is_empty());
        p.expire(1_000, &mut close);
        assert_eq!(close, ["a"]);
        assert_eq!(p.take(1_600, &mut close), None, "b expired at 1500");
        assert_eq!(close, ["a", "b"]);
    }

    #[test]
    fn retired_or_disabled_connections_are_not_pooled() {
        let mut p = Pool::new(S);
        assert_eq!(p.put("a", 3, 0), Err("a"), "keepalive_requests reached");
        let mut off = Pool::new(PoolSettings { keepalive: 0, ..S });
        assert_eq!(off.put("b", 1, 0), Err("b"));
    }

    #[test]
    fn a_readable_idle_connection_is_removed() {
        let mut p = Pool::new(S);
        p.put(7, 1, 0).unwrap();
        p.put(8, 1, 0).unwrap();
        assert_eq!(p.remove(|&c| c == 7), Some(7));
        assert_eq!(p.remove(|&c| c == 7), None);
        assert_eq!(p.len(), 1);
    }

    /// Keeps connections a second, so the upstream's own closes are what is learned.
    const LONG: PoolSettings = PoolSettings {
        keepalive: 4,
        keepalive_timeout: 1_000_000,
        keepalive_requests: 100,
    };

    #[test]
    fn an_upstream_close_teaches_how_long_it_lets_connections_idle() {
        let mut p = Pool::new(LONG);
        assert_eq!(p.upstream_closes_after(), None);
        p.put(1, 1, 1_000).unwrap();
        // The upstream closed it 200 ms after it was pooled.
        assert_eq!(p.evict(|&c| c == 1, 201_000), Some(1));
        assert_eq!(p.upstream_closes_after(), Some(200_000));
        // An address leaving the server's name is not the upstream closing.
        p.put(2, 1, 300_000).unwrap();
        assert_eq!(p.remove(|&c| c == 2), Some(2));
        assert_eq!(p.upstream_closes_after(), Some(200_000));
    }

    #[test]
    fn a_request_that_cannot_be_resent_skips_connections_the_upstream_may_be_closing() {
        let mut close = Vec::new();
        let mut p = Pool::new(LONG);
        p.put(1, 1, 0).unwrap();
        p.evict(|&c| c == 1, 200_000); // the upstream closes after ~200 ms idle
        p.put(2, 1, 300_000).unwrap();
        // Idle 99 ms: well inside what the upstream allows.
        assert_eq!(p.take_safe(399_000, &mut close).map(|r| r.conn), Some(2));
        p.put(2, 2, 400_000).unwrap();
        // Idle 100 ms, half the upstream's time: a new connection instead; the pooled
        // one stays for requests that can be retried.
        assert_eq!(p.take_safe(500_000, &mut close), None);
        assert_eq!(p.len(), 1);
        assert_eq!(p.take(500_000, &mut close).map(|r| r.conn), Some(2));
        assert!(close.is_empty());
    }

    #[test]
    fn before_any_upstream_close_every_connection_may_be_taken() {
        let mut close = Vec::new();
        let mut p = Pool::new(LONG);
        p.put(1, 1, 0).unwrap();
        assert_eq!(p.take_safe(900_000, &mut close).map(|r| r.conn), Some(1));
    }

    #[test]
    fn a_connection_outliving_twice_the_learned_time_forgets_it() {
        let mut close = Vec::new();
        let mut p = Pool::new(LONG);
        p.put(1, 1, 0).unwrap();
        p.evict(|&c| c == 1, 10_000); // say, a restart closing everything after 10 ms
        p.put(2, 1, 20_000).unwrap();
        p.put(3, 1, 45_000).unwrap();
        // Connection 2 has been open 25 ms: the upstream keeps them longer than 10 ms.
        assert_eq!(p.take_safe(45_000, &mut close).map(|r| r.conn), Some(3));
        assert_eq!(p.upstream_closes_after(), None);
    }

    fn upstream(name: &str, ports: &[u16], keepalive: usize) -> Upstream {
        Upstream {
            keepalive,
            ..crate::test_upstream::upstream(name, ports)
        }
    }

    #[test]
    fn a_reload_keeps_pools_of_kept_servers_and_closes_removed_ones() {
        let mut pools: Pools<u32> =
            Pools::new(&[upstream("a", &[1, 2], 4), upstream("b", &[9], 4)]);
        let a2 = pools.server_id(0, 1);
        let b = pools.server_id(1, 0);
        pools.pool(a2).unwrap().put(12, 1, 0).unwrap();
        pools.pool(b).unwrap().put(19, 1, 0).unwrap();
        pools.pool(b).unwrap().put(29, 1, 0).unwrap();
        let mut close = Vec::new();
        // Server 1 of "a" removed, "a":2 moves to index 0, "b" shrinks to one idle.
        pools.reconfigure(
            &[upstream("a", &[2, 3], 4), upstream("b", &[9], 1)],
            &mut close,
        );
        assert_eq!(close, [19], "b's oldest beyond the new keepalive");
        assert_eq!(pools.current(a2), Some(pools.server_id(0, 0)));
        assert_eq!(
            pools.pool(a2).unwrap().take(1, &mut close).unwrap().conn,
            12
        );
        assert_eq!(pools.pool(b).unwrap().len(), 1);
        // An exchange that started on "a":1 finds no pool: its connection closes.
        let mut old: Pools<u32> = Pools::new(&[upstream("a", &[1, 2], 4)]);
        let a1 = old.server_id(0, 0);
        old.reconfigure(&[upstream("a", &[2], 4)], &mut close);
        assert!(old.pool(a1).is_none());
        old.reconfigure(&[upstream("a", &[2], 4)], &mut close);
        let a2 = Pools::<u32>::new(&[upstream("a", &[1, 2], 4)]).server_id(0, 1);
        assert_eq!(
            old.current(a2),
            Some(old.server_id(0, 0)),
            "through two reloads"
        );
    }

    #[test]
    fn drain_closes_every_idle_connection() {
        let mut pools: Pools<u32> = Pools::new(&[upstream("a", &[1, 2], 4)]);
        let (x, y) = (pools.server_id(0, 0), pools.server_id(0, 1));
        pools.pool(x).unwrap().put(1, 1, 0).unwrap();
        pools.pool(y).unwrap().put(2, 1, 5).unwrap();
        assert_eq!(pools.idle(), 2);
        assert_eq!(pools.next_expiry(), Some(4_000_000));
        let mut close = Vec::new();
        pools.drain(&mut close);
        close.sort();
        assert_eq!(close, [1, 2]);
        assert_eq!(pools.idle(), 0);
    }
}

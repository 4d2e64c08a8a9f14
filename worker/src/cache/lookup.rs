//! What a request on a cached route gets: an answer from the zone now (fresh, or
//! stale within `stale-while-revalidate` while one fetch refreshes it), a fetch that
//! will store (the key's lock taken, on any worker), a wait for another request's
//! fetch (up to `lock_timeout`), or a plain proxied exchange (not for the cache).
//!
//! ```text
//!  key ─▶ slot of the key ─ Vary record? ─▶ slot of the variant ─▶ body file (checked)
//!                                                    │
//!        fresh ─▶ Answer(HIT)     stale ─ swr ─▶ Answer(STALE) + a refresh if the lock is free
//!                                       └ lock ─▶ Fetch(revalidate)  held ─▶ Wait
//!  no entry ─ lock ─▶ Fetch(miss)   held ─▶ Wait   lock_timeout passed ─▶ Fetch (not stored)
//! ```

use super::fill::{Plan, Stale};
use super::policy::{self, Use};
use super::zones::{Remembered, Zone};
use super::CacheStatus;
use crate::http::request::Method;
use forkd_shared::cache::files::{self, OpenError, Opened};
use forkd_shared::cache::index::{counters, Index, Kind, LockWord};
use forkd_shared::cache::{variant_hash, KeyHash};
use forkd_shared::config::cache::RouteCache;
use std::rc::Rc;
use std::sync::Arc;

/// How often a request waiting for another's fetch of its key looks again (µs).
pub const WAIT_POLL_US: u64 = 10_000;

/// A wait, counted once per request: at its first look, made as its head came (a
/// look again comes `WAIT_POLL_US` later at the earliest).
fn wait(ix: &Index, now: &Now) -> Decision {
    if now.waited_us < WAIT_POLL_US {
        ix.bump(counters::LOCK_WAITS, 1);
    }
    Decision::Wait
}

/// The request, as the cache sees it.
pub struct Asked<'a> {
    pub method: Method,
    pub head: &'a [u8],
    pub fields: &'a [(&'a [u8], &'a [u8])],
    pub key: Vec<u8>,
}

/// When the decision is made.
#[derive(Debug, Clone, Copy)]
pub struct Now {
    /// Unix seconds.
    pub unix: u64,
    /// Unix milliseconds (when the request began waiting is told in ms).
    pub unix_ms: u64,
    /// The monotonic clock (ms), for fetch locks.
    pub ms: u64,
    /// Microseconds the request has waited already (since its first byte).
    pub waited_us: u64,
}

/// What the request gets.
pub enum Decision {
    /// Answered from the entry; `refresh`: a stale answer's background refresh,
    /// whose lock this request took.
    Answer {
        zone: Arc<Zone>,
        entry: Rc<Opened>,
        status: CacheStatus,
        age: u64,
        not_modified: bool,
        refresh: Option<Box<Plan>>,
    },
    /// Go upstream with this plan: stored if the response allows.
    Fetch(Box<Plan>),
    /// Another request fetches the key: look again shortly.
    Wait,
    /// Not for the cache (its method, `no-store`, a full index window): proxied as
    /// without a cache.
    Bypass(CacheStatus),
}

pub fn decide(
    zone: &Arc<Zone>,
    kept: &mut Remembered,
    rc: &RouteCache,
    a: Asked,
    now: Now,
) -> Decision {
    let ix = zone.index();
    let dirs = policy::request_directives(a.fields);
    if !matches!(a.method, Method::Get | Method::Head) || policy::bypass(a.method, &dirs) {
        ix.bump(counters::BYPASS, 1);
        return Decision::Bypass(CacheStatus::Bypass);
    }
    let primary = KeyHash::of(&[&a.key]);
    let mut target = primary;
    let mut vary = None;
    let first = ix.find(primary);
    if let Some(f) = first.filter(|f| f.view.kind == Kind::Vary) {
        // The record's epoch is in its slot; its names are read once per epoch.
        let epoch = f.view.expires;
        let known = kept.names(rc.zone, primary, epoch).or_else(|| {
            match files::open(&zone.dir, primary, Some(&a.key)) {
                Ok(o) if o.meta.is_vary_record() && o.meta.epoch == epoch => {
                    let read: Arc<[Box<[u8]>]> =
                        o.meta.vary.iter().map(|n| n.clone().into()).collect();
                    kept.put_names(rc.zone, primary, epoch, read.clone());
                    Some(read)
                }
                _ => None,
            }
        });
        match known {
            Some(record) => {
                let values = policy::vary_key(&record, a.fields);
                target = variant_hash(&a.key, epoch, &values);
                vary = Some((epoch, record.to_vec()));
                ix.touch(f.slot, now.unix);
            }
            None => forget(&ix, zone, f.slot, primary),
        }
    }
    let lock_ms = rc.lock_timeout.as_millis() as u64;
    // Made only to take a lock: `getpid` is a system call, and a hit takes none.
    let mine = || LockWord::new(std::process::id(), now.ms + lock_ms.max(1));
    let may_wait = now.waited_us < rc.lock_timeout.as_micros() as u64;
    let plan = |slot, lock: Option<LockWord>, vary, stale| {
        Box::new(Plan {
            zone: zone.clone(),
            key: a.key.clone(),
            hash: target,
            slot,
            store: lock.is_some(),
            lock,
            vary,
            request_head: a.head.into(),
            valid: rc.valid.clone(),
            route_swr: rc.stale_while_revalidate.as_secs(),
            route_sie: rc.stale_if_error.as_secs(),
            stale,
        })
    };
    // Without a vary record the key's own slot, found above, is the entry's.
    let found = if target == primary {
        first
    } else {
        ix.find(target)
    };
    if let Some(e) = found.filter(|e| e.view.kind == Kind::Entry) {
        let kept_open = kept.open_entry(rc.zone, e.slot, target, e.seq);
        let opened = match kept_open {
            Some(o) if !still_whole(zone, target, &o) => Err(()),
            Some(o) => Ok(o),
            None => {
                open_entry(zone, target, &a.key, vary.as_ref().map(|(ep, _)| *ep)).map(|mut o| {
                    if o.small_body().is_none() {
                        o.prefix.truncate(o.body_at as usize);
                    }
                    let o = Rc::new(o);
                    kept.keep_open(rc.zone, e.slot, target, e.seq, o.clone());
                    o
                })
            }
        };
        match opened {
            Err(()) => forget(&ix, zone, e.slot, target),
            Ok(entry) => {
                ix.touch(e.slot, now.unix);
                let reuse = policy::Entry {
                    stored_at: e.view.stored,
                    ttl: e.view.expires.saturating_sub(e.view.stored),
                    initial_age: entry.meta.age_at_store,
                    must_revalidate: entry.meta.must_revalidate(),
                    stale_while_revalidate: entry.meta.swr.max(rc.stale_while_revalidate.as_secs()),
                };
                let age = reuse.age(now.unix);
                let sie = entry.meta.sie.max(rc.stale_if_error.as_secs());
                let not_modified = super::hit::not_modified(a.fields, &entry.meta);
                let answer = |entry, status, refresh| Decision::Answer {
                    zone: zone.clone(),
                    entry,
                    status,
                    age,
                    not_modified,
                    refresh,
                };
                // A request that waited for the key's fetch takes what that fetch
                // stored (or confirmed) since it began, however short the entry's
                // freshness (a `max-age=1` confirmed in a second's last milliseconds is
                // stale by the clock's whole seconds a moment later): the waiters of
                // one fetch are answered by it, as Varnish's are.
                let began = now.unix_ms.saturating_sub(now.waited_us / 1000) / 1000;
                let coalesced = now.waited_us >= WAIT_POLL_US
                    && e.view.stored >= began
                    && ix.lock_free(e.slot, now.ms);
                let usable = match policy::usable(&reuse, &dirs, now.unix) {
                    _ if coalesced => Use::Fresh,
                    u => u,
                };
                match usable {
                    Use::Fresh => {
                        ix.bump(counters::HITS, 1);
                        return answer(entry, CacheStatus::Hit, None);
                    }
                    Use::StaleWhileRevalidate => {
                        ix.bump(counters::STALE, 1);
                        let word = mine();
                        let refresh = (a.method == Method::Get
                            && ix.try_lock(e.slot, word, now.ms))
                        .then(|| {
                            let stale = Stale {
                                meta: entry.meta.clone(),
                                hash: target,
                                slot: e.slot,
                                if_error: false,
                            };
                            plan(e.slot, Some(word), vary.clone(), Some(stale))
                        });
                        return answer(entry, CacheStatus::Stale, refresh);
                    }
                    Use::Revalidate => {
                        let stale = Stale {
                            meta: entry.meta.clone(),
                            hash: target,
                            slot: e.slot,
                            if_error: policy::stale_if_error_allows(&reuse, sie, now.unix),
                        };
                        let word = mine();
                        if a.method == Method::Get && ix.try_lock(e.slot, word, now.ms) {
                            ix.bump(counters::MISSES, 1);
                            return Decision::Fetch(plan(e.slot, Some(word), vary, Some(stale)));
                        }
                        if may_wait {
                            return wait(&ix, &now);
                        }
                        ix.bump(counters::MISSES, 1);
                        return Decision::Fetch(plan(e.slot, None, vary, Some(stale)));
                    }
                }
            }
        }
    }
    if a.method == Method::Head {
        // Its answer has no body to store; a GET for the key will fetch one.
        ix.bump(counters::MISSES, 1);
        return Decision::Bypass(CacheStatus::Miss);
    }
    if let Some(f) = ix.find(target) {
        if f.view.kind == Kind::Reserved && f.view.expires > now.unix {
            // Not storable lately: side by side to the application, stored if the
            // response now may be.
            ix.bump(counters::MISSES, 1);
            let mut p = plan(f.slot, None, vary, None);
            p.store = true;
            return Decision::Fetch(p);
        }
    }
    let Some(r) = ix.reserve(target, now.unix, now.ms) else {
        ix.bump(counters::BYPASS, 1);
        return Decision::Bypass(CacheStatus::Bypass);
    };
    if let Some(ev) = r.evicted {
        files::remove(&zone.dir, ev.hash);
        ix.bump(counters::EVICTIONS, 1);
    }
    let word = mine();
    if ix.try_lock(r.slot, word, now.ms) {
        ix.bump(counters::MISSES, 1);
        return Decision::Fetch(plan(r.slot, Some(word), vary, None));
    }
    if may_wait {
        return wait(&ix, &now);
    }
    ix.bump(counters::MISSES, 1);
    Decision::Fetch(plan(r.slot, None, vary, None))
}

/// Opens `hash`'s body file for `key`: a variant's must be of the vary record's
/// `epoch`. A missing or damaged file is `Err` (a miss).
fn open_entry(zone: &Zone, hash: KeyHash, key: &[u8], epoch: Option<u64>) -> Result<Opened, ()> {
    match files::open(&zone.dir, hash, Some(key)) {
        Ok(o) if !o.meta.is_vary_record() && epoch.is_none_or(|e| o.meta.epoch == e) => Ok(o),
        Ok(_) => Err(()),
        Err(OpenError::Corrupt(why)) => {
            forkd_shared::warn!(
                "cache zone `{}`: entry {} is damaged ({why}): removed, fetched again",
                zone.name,
                hash.hex()
            );
            Err(())
        }
        Err(_) => Err(()),
    }
}

/// Whether a body file kept open is still whole. A body answered from the bytes
/// read when it was opened is; one sent from the file is checked against the file's
/// size (one `fstat`), so a file cut short since is a miss, never sent short.
fn still_whole(zone: &Zone, hash: KeyHash, o: &Opened) -> bool {
    if o.small_body().is_some() {
        return true;
    }
    let size = o.file.metadata().map_or(0, |m| m.len());
    match o.meta.check_size(size) {
        Ok(()) => true,
        Err(why) => {
            forkd_shared::warn!(
                "cache zone `{}`: entry {} is damaged ({why}): removed, fetched again",
                zone.name,
                hash.hex()
            );
            false
        }
    }
}

/// An entry whose file is gone or damaged: out of the index and off the disk.
fn forget(ix: &Index, zone: &Zone, slot: usize, hash: KeyHash) {
    if ix.remove(slot, hash).is_some() {
        files::remove(&zone.dir, hash);
    }
}

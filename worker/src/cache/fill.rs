//! A fetch for the cache: what a miss (or the revalidation of a stale entry) carries
//! to the upstream's response head ([`Plan`]), what is decided there
//! ([`Plan::at_head`]: store it, pass it on, or answer from the entry because the
//! application said 304 or failed), and the body on its way to its file ([`Fill`]).
//!
//! The plan holds the key's fetch lock: dropping it (the exchange failed, the
//! response was not storable) gives the lock back, so a waiter goes upstream itself.
//! A fill publishes its entry in the index only once its body file is whole.

use super::key;
use super::policy::{self, Freshness, Storable, StoreInput};
use super::zones::Zone;
use crate::http::request::Method;
use forkd_shared::cache::entry::{Meta, FLAG_MUST_REVALIDATE, FLAG_VARY_RECORD};
use forkd_shared::cache::files::{self, Opened, Writer};
use forkd_shared::cache::index::{counters, LockWord};
use forkd_shared::cache::upkeep::view_of;
use forkd_shared::cache::{variant_hash, KeyHash};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// A stale entry this fetch revalidates: a 304 refreshes it, a failure may serve it.
#[derive(Debug)]
pub struct Stale {
    pub meta: Meta,
    pub hash: KeyHash,
    pub slot: usize,
    /// Its age now, and whether `stale-if-error` allows serving it.
    pub if_error: bool,
}

/// What a fetch for the cache needs once the response head is in.
pub struct Plan {
    pub zone: Arc<Zone>,
    pub key: Vec<u8>,
    /// The entry the fetch is for (the key's, or a variant's) and its slot.
    pub hash: KeyHash,
    pub slot: usize,
    /// The fetch lock held on `slot`; `None`: the lock could not be had in time
    /// (`lock_timeout`), or the key's responses were found not storable lately.
    pub lock: Option<LockWord>,
    /// The response is stored if it may be: with the lock, or without it for a key
    /// marked not storable (a response that now may be stored replaces the mark).
    pub store: bool,
    /// The key's vary record as found: its epoch and field names.
    pub vary: Option<(u64, Vec<Box<[u8]>>)>,
    /// The client's request head (its fields: Vary's values, `Authorization`).
    pub request_head: Box<[u8]>,
    pub valid: Vec<(u16, u64)>,
    pub route_swr: u64,
    pub route_sie: u64,
    pub stale: Option<Stale>,
}

impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plan")
            .field("zone", &self.zone.name)
            .field("hash", &self.hash)
            .field("lock", &self.lock)
            .finish()
    }
}

/// The largest body a revalidation copies to give its entry the 304's fields (a
/// larger one keeps its stored fields and gets its new times in place).
pub const REWRITE_MAX: u64 = 1 << 20;

/// How long a key whose response may not be stored is fetched without the lock
/// (seconds; Varnish's hit-for-miss lasts 120 s by default).
pub const PASS_FOR: u64 = 120;

/// What the response head decided.
pub enum AtHead {
    /// Stored while it goes to the client.
    Store(Box<Fill>),
    /// Not storable: it goes to the client, the cache is left as it was.
    Pass,
    /// The application confirmed the stale entry (304): the entry, refreshed,
    /// answers the client, not the upstream's 304.
    NotModified(Box<Plan>),
    /// The application failed (5xx) and `stale-if-error` allows the stale entry.
    StaleOnError(Box<Plan>),
}

/// The fields that make the fetch a revalidation of `stale` (`If-None-Match`,
/// `If-Modified-Since`), to add to the upstream request.
pub fn revalidation_fields(stale: &Meta) -> Vec<u8> {
    let mut f = Vec::new();
    if !stale.etag.is_empty() {
        f.extend_from_slice(b"If-None-Match: ");
        f.extend_from_slice(&stale.etag);
        f.extend_from_slice(b"\r\n");
    }
    if !stale.last_modified.is_empty() {
        f.extend_from_slice(b"If-Modified-Since: ");
        f.extend_from_slice(&stale.last_modified);
        f.extend_from_slice(b"\r\n");
    }
    f
}

/// Fields a stored head never keeps: the framing and the connection's (a hit writes
/// its own), `Date` and `Age` (a hit says when and how old).
const NOT_STORED: [&[u8]; 8] = [
    b"connection",
    b"keep-alive",
    b"proxy-connection",
    b"transfer-encoding",
    b"content-length",
    b"date",
    b"age",
    b"trailer",
];

/// Whether a field of a response is kept in a stored head.
fn stored(name: &[u8]) -> bool {
    !NOT_STORED.iter().any(|n| n.eq_ignore_ascii_case(name))
}

/// `fields` as a stored head: `Name: value\r\n` lines.
fn field_lines(fields: &[(&[u8], &[u8])]) -> Vec<u8> {
    let mut head = Vec::with_capacity(fields.iter().map(|(n, v)| n.len() + v.len() + 4).sum());
    for (name, value) in fields {
        head.extend_from_slice(name);
        head.extend_from_slice(b": ");
        head.extend_from_slice(value);
        head.extend_from_slice(b"\r\n");
    }
    head
}

/// The head fields to store, from the head forkd wrote for the client.
fn stored_head(client_head: &[u8]) -> Vec<u8> {
    let fields: Vec<_> = key::fields(client_head)
        .into_iter()
        .filter(|(n, _)| stored(n))
        .collect();
    field_lines(&fields)
}

impl Plan {
    fn request_fields(&self) -> Vec<(&[u8], &[u8])> {
        key::fields(&self.request_head)
    }

    /// Decides on the final response head: `status`, the upstream's head bytes, the
    /// head forkd wrote for the client.
    pub fn at_head(
        self: Box<Self>,
        status: u16,
        upstream_head: &[u8],
        client_head: &[u8],
        now: u64,
    ) -> AtHead {
        if status == 304 && self.stale.is_some() {
            return AtHead::NotModified(self);
        }
        if status >= 500 && self.stale.as_ref().is_some_and(|s| s.if_error) {
            return AtHead::StaleOnError(self);
        }
        if !self.store {
            return AtHead::Pass;
        }
        let response = key::fields(upstream_head);
        let request = self.request_fields();
        let verdict = policy::storable(&StoreInput {
            method: Method::Get,
            status,
            response: &response,
            request: &request,
            valid: &self.valid,
            now,
        });
        let fresh = match verdict {
            Storable::Yes(f) => f,
            Storable::No(_) => {
                if status < 500 && self.lock.is_some() {
                    self.mark_pass(now);
                }
                return AtHead::Pass;
            }
        };
        let values = policy::vary_key(&fresh.vary, &request);
        drop(request);
        match Fill::start(self, fresh, status, client_head, &values, now) {
            Some(fill) => AtHead::Store(Box::new(fill)),
            None => AtHead::Pass,
        }
    }

    /// The key's response may not be stored: for [`PASS_FOR`] seconds its requests
    /// go upstream without waiting on each other (a stored entry it had is removed:
    /// the application says it may not be kept any more).
    fn mark_pass(&self, now: u64) {
        let ix = self.zone.index();
        if ix.mark_pass(self.slot, self.hash, now + PASS_FOR).is_some() {
            files::remove(&self.zone.dir, self.hash);
        }
    }

    /// The stale entry's file, opened to answer from (a 304, an error).
    pub fn open_stale(&self) -> Option<Opened> {
        let s = self.stale.as_ref()?;
        files::open(&self.zone.dir, s.hash, Some(&self.key)).ok()
    }

    /// A 304 confirmed the stale entry: its freshness starts again, from the 304's
    /// fields merged over the stored ones (RFC 9111 §4.3.4), and so does its age. The
    /// stored head takes the 304's fields too (a new file with the same body, for a
    /// body up to [`REWRITE_MAX`]; a larger one keeps its head and gets its times
    /// rewritten in place). A 304 that now forbids storing removes the entry (this
    /// answer is still given from it: the application has just confirmed it).
    pub fn refresh(&self, not_modified_head: &[u8], now: u64) {
        let Some(s) = &self.stale else {
            return;
        };
        let new: Vec<(&[u8], &[u8])> = key::fields(not_modified_head)
            .into_iter()
            .filter(|(n, _)| stored(n))
            .collect();
        let stored = key::stored_fields(&s.meta.head);
        let mut merged: Vec<(&[u8], &[u8])> = new.clone();
        for (n, v) in stored {
            if !new.iter().any(|(m, _)| m.eq_ignore_ascii_case(n)) {
                merged.push((n, v));
            }
        }
        let request = self.request_fields();
        let verdict = policy::storable(&StoreInput {
            method: Method::Get,
            status: s.meta.status,
            response: &merged,
            request: &request,
            valid: &self.valid,
            now,
        });
        let ix = self.zone.index();
        ix.bump(counters::REVALIDATED, 1);
        let Storable::Yes(fresh) = verdict else {
            if ix.remove(s.slot, s.hash).is_some() {
                files::remove(&self.zone.dir, s.hash);
            }
            return;
        };
        let mut meta = s.meta.clone();
        meta.stored = now;
        meta.ttl = fresh.ttl;
        meta.age_at_store = fresh.age;
        if meta.body_len <= REWRITE_MAX {
            meta.head = field_lines(&merged);
            meta.flags = if fresh.must_revalidate {
                meta.flags | FLAG_MUST_REVALIDATE
            } else {
                meta.flags & !FLAG_MUST_REVALIDATE
            };
            if let Some(e) = fresh.etag {
                meta.etag = e.to_vec();
            }
            if let Some(l) = fresh.last_modified {
                meta.last_modified = l.to_vec();
            }
            if self.rewrite(s, meta.clone()) {
                return;
            }
        }
        if ix.refresh(s.slot, s.hash, now, now.saturating_add(fresh.ttl)) {
            let _ = files::refresh(&self.zone.dir, s.hash, &meta);
        }
    }

    /// The stale entry's file made anew with `meta`'s header and the same body.
    fn rewrite(&self, s: &Stale, meta: Meta) -> bool {
        let Ok(old) = files::open(&self.zone.dir, s.hash, Some(&self.key)) else {
            return false;
        };
        let Ok(mut w) = Writer::create(&self.zone.dir, s.hash, meta.clone()) else {
            return false;
        };
        let mut buf = vec![0u8; 64 * 1024];
        let mut at = old.body_at;
        let end = old.body_at + old.meta.body_len;
        while at < end {
            let want = ((end - at) as usize).min(buf.len());
            match std::os::unix::fs::FileExt::read_at(&old.file, &mut buf[..want], at) {
                Ok(0) | Err(_) => return false,
                Ok(n) => {
                    if w.write(&buf[..n]).is_err() {
                        return false;
                    }
                    at += n as u64;
                }
            }
        }
        let Ok(size) = w.finish() else {
            return false;
        };
        let mut published = meta;
        published.body_len = old.meta.body_len;
        self.zone
            .index()
            .publish(s.slot, view_of(s.hash, &published, size))
            .is_ok()
    }

    /// Writes the key's vary record (a new epoch, so variants stored under an older
    /// record are never found again) in the key's own slot; the epoch.
    fn write_vary_record(&self, names: &[Box<[u8]>], now: u64) -> Option<u64> {
        let primary = KeyHash::of(&[&self.key]);
        let ix = self.zone.index();
        let epoch = new_epoch(primary);
        let meta = Meta {
            status: 0,
            flags: FLAG_VARY_RECORD,
            stored: now,
            ttl: u64::from(u32::MAX),
            epoch,
            key: self.key.clone(),
            vary: names.iter().map(|n| n.to_vec()).collect(),
            ..Meta::default()
        };
        let size = Writer::create(&self.zone.dir, primary, meta.clone())
            .and_then(Writer::finish)
            .ok()?;
        let r = ix.reserve(primary, now, forkd_shared::shm::monotonic_ms())?;
        if let Some(e) = r.evicted {
            files::remove(&self.zone.dir, e.hash);
        }
        ix.publish(r.slot, view_of(primary, &meta, size)).ok()?;
        Some(epoch)
    }
}

/// A new vary record's epoch: never the epoch of an earlier record of the key, even
/// one the same worker made the same second (the record a purge removed: the
/// variants stored under it must not be found again).
fn new_epoch(primary: KeyHash) -> u64 {
    static MADE: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let parts = [
        nanos.to_le_bytes(),
        u64::from(std::process::id()).to_le_bytes(),
        MADE.fetch_add(1, Relaxed).to_le_bytes(),
        primary.lo().to_le_bytes(),
    ];
    KeyHash::of(&parts.each_ref().map(|p| &p[..])).lo()
}

impl Drop for Plan {
    fn drop(&mut self) {
        if let Some(lock) = self.lock {
            self.zone.index().unlock(self.slot, lock);
        }
    }
}

impl std::fmt::Debug for Fill {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fill").field("hash", &self.hash).finish()
    }
}

/// A response body on its way into its file.
pub struct Fill {
    writer: Option<Writer>,
    plan: Box<Plan>,
    /// The entry's hash (the key's, or the variant's the response said).
    hash: KeyHash,
    /// The most body bytes one entry may have (a quarter of the zone).
    limit: u64,
    /// The variant's own slot and the lock this fetch holds on it (a response that
    /// varies, met before its vary record existed or with other fields): requests
    /// for the variant wait for this fetch as for the key's.
    variant: Option<(usize, Option<LockWord>)>,
}

impl Drop for Fill {
    fn drop(&mut self) {
        if let Some((slot, Some(lock))) = self.variant {
            self.plan.zone.index().unlock(slot, lock);
        }
    }
}

impl Fill {
    fn start(
        plan: Box<Plan>,
        fresh: Freshness,
        status: u16,
        client_head: &[u8],
        vary_values: &[u8],
        now: u64,
    ) -> Option<Fill> {
        let known = plan.vary.as_ref().map(|(_, n)| n.as_slice());
        let (hash, epoch) = if fresh.vary.is_empty() {
            (KeyHash::of(&[&plan.key]), 0)
        } else if known == Some(fresh.vary.as_slice()) {
            (plan.hash, plan.vary.as_ref().map_or(0, |(e, _)| *e))
        } else {
            let epoch = plan.write_vary_record(&fresh.vary, now)?;
            (variant_hash(&plan.key, epoch, vary_values), epoch)
        };
        let mut flags = 0;
        if fresh.must_revalidate {
            flags |= FLAG_MUST_REVALIDATE;
        }
        let meta = Meta {
            status,
            flags,
            body_len: 0,
            stored: now,
            ttl: fresh.ttl,
            age_at_store: fresh.age,
            swr: fresh
                .stale_while_revalidate
                .unwrap_or(0)
                .max(plan.route_swr),
            sie: fresh.stale_if_error.unwrap_or(0).max(plan.route_sie),
            epoch,
            key: plan.key.clone(),
            head: stored_head(client_head),
            etag: fresh.etag.map(|e| e.to_vec()).unwrap_or_default(),
            last_modified: fresh.last_modified.map(|e| e.to_vec()).unwrap_or_default(),
            vary: fresh.vary.iter().map(|n| n.to_vec()).collect(),
        };
        let ix = plan.zone.index();
        match Writer::create(&plan.zone.dir, hash, meta) {
            Ok(w) => {
                let variant = (hash != plan.hash)
                    .then(|| {
                        let now_ms = forkd_shared::shm::monotonic_ms();
                        let r = ix.reserve(hash, now, now_ms)?;
                        if let Some(e) = r.evicted {
                            files::remove(&plan.zone.dir, e.hash);
                        }
                        let lock = plan.lock.filter(|l| ix.try_lock(r.slot, *l, now_ms));
                        Some((r.slot, lock))
                    })
                    .flatten();
                Some(Fill {
                    writer: Some(w),
                    limit: plan.zone.max_size / 4,
                    hash,
                    plan,
                    variant,
                })
            }
            Err(e) => {
                ix.bump(counters::STORE_FAILED, 1);
                forkd_shared::warn!(
                    "cache zone `{}`: a body file cannot be made, the response is not stored: {e}",
                    plan.zone.name
                );
                None
            }
        }
    }

    /// Body bytes, as decoded from the upstream.
    pub fn data(&mut self, d: &[u8]) {
        let Some(w) = self.writer.as_mut() else {
            return;
        };
        let over = w.written() + d.len() as u64 > self.limit;
        if over || w.write(d).is_err() {
            // Too large for the zone, or the disk is full: not stored, the response
            // goes on to the client untouched.
            self.writer = None;
            self.plan.zone.index().bump(counters::STORE_FAILED, 1);
        }
    }

    /// The body came whole: the file takes its name and the entry is published.
    pub fn complete(mut self: Box<Self>) {
        let Some(w) = self.writer.take() else {
            return;
        };
        let meta = w.meta().clone();
        let body_len = w.written();
        let plan = &self.plan;
        let ix = plan.zone.index();
        let size = match w.finish() {
            Ok(s) => s,
            Err(e) => {
                ix.bump(counters::STORE_FAILED, 1);
                forkd_shared::warn!(
                    "cache zone `{}`: storing an entry failed: {e}",
                    plan.zone.name
                );
                return;
            }
        };
        let mut meta = meta;
        meta.body_len = body_len;
        let view = view_of(self.hash, &meta, size);
        let slot = if self.hash == plan.hash {
            Some(plan.slot)
        } else if let Some((slot, _)) = self.variant {
            Some(slot)
        } else {
            None
        };
        let published = slot.is_some_and(|s| ix.publish(s, view).is_ok());
        if published {
            ix.bump(counters::STORES, 1);
        } else {
            // Its slot went to another key meanwhile: the file is not reachable.
            files::remove(&plan.zone.dir, self.hash);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_vary_record_of_a_key_has_a_new_epoch() {
        let k = KeyHash::of(&[b"httplocalhost/v"]);
        let (a, b) = (new_epoch(k), new_epoch(k));
        assert_ne!(a, b, "two records made at once share an epoch");
    }
}

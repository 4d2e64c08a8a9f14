//! The index of a cache zone: a header and a table of 64-byte slots in shared memory,
//! read and written by every worker without a lock.
//!
//! - **Where a key lives.** A key's slots are the `PROBE` slots from its hash modulo
//!   the table's size. A new entry takes the first empty one, else the least
//!   recently used one of them that nobody is fetching (its body file is then removed
//!   by whoever took the slot: [`Reserved::evicted`]).
//! - **Reading a slot.** Each slot is a seqlock: a writer moves its sequence from even
//!   to odd with a compare-and-swap, stores the fields, and makes it even again; a
//!   reader that saw the same even sequence before and after the fields has a
//!   consistent view. A hit costs a few loads, no store but `accessed`.
//! - **The fetch lock.** `lock` is apart from the seqlock: the pid of the worker
//!   fetching the key and when its lock ends (low 32 bits of the monotonic clock in
//!   ms). Concurrent misses for a key on any worker find it held and wait; a lock
//!   past its end, or held by a process that is gone, is taken over.
//!
//! A writer killed between the two stores of a sequence leaves its slot odd: no
//! reader or writer uses it again until the index is made anew (every start of the
//! daemon). One slot of the table lost, never a wrong answer.

use super::KeyHash;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{fence, AtomicU32, AtomicU64};

pub const MAGIC: u64 = u64::from_le_bytes(*b"FKDCIDX1");
pub const VERSION: u32 = 1;
/// Slots a key may live in.
pub const PROBE: usize = 8;
/// Bytes before the first slot.
pub const HEADER_SIZE: usize = 256;

/// Zone counters, in the index header (every worker adds to them).
pub mod counters {
    pub const HITS: usize = 0;
    pub const MISSES: usize = 1;
    pub const STALE: usize = 2;
    pub const REVALIDATED: usize = 3;
    pub const LOCK_WAITS: usize = 4;
    pub const EVICTIONS: usize = 5;
    pub const STORES: usize = 6;
    pub const BYPASS: usize = 7;
    pub const PURGED: usize = 8;
    pub const STORE_FAILED: usize = 9;
    pub const BYTES_SERVED: usize = 10;
    pub const EXPIRED_REMOVED: usize = 11;
    pub const COUNT: usize = 12;
    pub const NAMES: [&str; COUNT] = [
        "hits",
        "misses",
        "stale",
        "revalidated",
        "lock_waits",
        "evictions",
        "stores",
        "bypass",
        "purged",
        "store_failed",
        "bytes_served",
        "inactive_removed",
    ];
}

#[repr(C)]
pub struct Header {
    pub magic: AtomicU64,
    pub version: AtomicU32,
    pub entries: AtomicU32,
    /// Unix seconds the index was made.
    pub created: AtomicU64,
    /// 1 once the loader has put the body files on disk into it.
    pub loaded: AtomicU32,
    _pad: AtomicU32,
    /// The manager's lease: pid << 32 | low 32 bits of its last heartbeat (monotonic s).
    pub lease: AtomicU64,
    /// Body bytes of the entries in the index.
    pub bytes: AtomicU64,
    /// Entries in the index (vary records included).
    pub count: AtomicU64,
    pub counters: [AtomicU64; 16],
    _rest: [u8; HEADER_SIZE - 56 - 128],
}

/// What a slot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Kind {
    Empty = 0,
    /// A response: its body file is `files::body_path(hash)`.
    Entry = 1,
    /// A `Vary` record: which fields the key's responses vary by (in its file).
    Vary = 2,
    /// A key being fetched for the first time: only its lock means something.
    Reserved = 3,
}

impl Kind {
    fn of(v: u32) -> Kind {
        match v {
            1 => Kind::Entry,
            2 => Kind::Vary,
            3 => Kind::Reserved,
            _ => Kind::Empty,
        }
    }
}

#[repr(C, align(64))]
pub struct Slot {
    seq: AtomicU32,
    kind: AtomicU32,
    hi: AtomicU64,
    lo: AtomicU64,
    /// Unix seconds the response was stored or last revalidated.
    stored: AtomicU64,
    /// Unix seconds it is fresh until.
    expires: AtomicU64,
    /// Its body file's size.
    size: AtomicU64,
    /// Unix seconds of its last use (outside the seqlock: a hint for eviction).
    accessed: AtomicU64,
    /// The fetch lock (outside the seqlock).
    lock: AtomicU64,
}

/// A consistent read of a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotView {
    pub kind: Kind,
    pub hash: KeyHash,
    pub stored: u64,
    pub expires: u64,
    pub size: u64,
    pub accessed: u64,
}

/// Where a key is, if it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lookup {
    pub slot: usize,
    pub view: SlotView,
    /// The slot's sequence when read: it changes with every write to the slot, so a
    /// body file opened for this view is still the entry's while it is the same.
    pub seq: u32,
}

/// A slot taken for a key ([`Index::reserve`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reserved {
    pub slot: usize,
    /// What the slot held before (its body file is the taker's to remove).
    pub evicted: Option<SlotView>,
}

/// The fetch lock's word: who holds it and until when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockWord(pub u64);

impl LockWord {
    pub const FREE: LockWord = LockWord(0);

    pub fn new(pid: u32, until_ms: u64) -> LockWord {
        LockWord(u64::from(pid) << 32 | (until_ms as u32 as u64).max(1))
    }

    pub fn pid(self) -> u32 {
        (self.0 >> 32) as u32
    }

    /// Whether the lock has passed its end at `now_ms` (wrapping 32-bit ms: a lock
    /// lasts far less than 24 days).
    pub fn expired(self, now_ms: u64) -> bool {
        let until = self.0 as u32;
        (now_ms as u32).wrapping_sub(until) < (1 << 31)
    }
}

/// A view of a zone's index over shared memory.
#[derive(Clone, Copy)]
pub struct Index<'a> {
    pub header: &'a Header,
    pub slots: &'a [Slot],
}

/// How many times a writer retries a slot another writer holds.
const WRITE_TRIES: usize = 64;

impl<'a> Index<'a> {
    fn window(&self, hash: KeyHash) -> impl Iterator<Item = usize> + '_ {
        let n = self.slots.len();
        let start = (hash.lo() % n as u64) as usize;
        (0..PROBE.min(n)).map(move |i| (start + i) % n)
    }

    /// A consistent view of slot `i`, or `None` while it is being written.
    pub fn read(&self, i: usize) -> Option<(u32, SlotView)> {
        let s = &self.slots[i];
        let seq = s.seq.load(Acquire);
        if seq & 1 == 1 {
            return None;
        }
        let view = SlotView {
            kind: Kind::of(s.kind.load(Relaxed)),
            hash: KeyHash::from_parts(s.hi.load(Relaxed), s.lo.load(Relaxed)),
            stored: s.stored.load(Relaxed),
            expires: s.expires.load(Relaxed),
            size: s.size.load(Relaxed),
            accessed: s.accessed.load(Relaxed),
        };
        fence(Acquire);
        (s.seq.load(Relaxed) == seq).then_some((seq, view))
    }

    /// Writes slot `i` if its sequence is still `seq` (what [`Index::read`] gave).
    fn write(&self, i: usize, seq: u32, view: &SlotView) -> bool {
        let s = &self.slots[i];
        if s.seq
            .compare_exchange(seq, seq.wrapping_add(1), Acquire, Relaxed)
            .is_err()
        {
            return false;
        }
        s.kind.store(view.kind as u32, Relaxed);
        s.hi.store(view.hash.hi(), Relaxed);
        s.lo.store(view.hash.lo(), Relaxed);
        s.stored.store(view.stored, Relaxed);
        s.expires.store(view.expires, Relaxed);
        s.size.store(view.size, Relaxed);
        s.accessed.store(view.accessed, Relaxed);
        s.seq.store(seq.wrapping_add(2), Release);
        true
    }

    /// The slot holding `hash` (an entry, a vary record or a reservation). A slot of
    /// the window being written is waited for (briefly: a write is a few stores), so
    /// a key is not missed while its slot is refreshed or published.
    pub fn find(&self, hash: KeyHash) -> Option<Lookup> {
        for _ in 0..WRITE_TRIES / 2 {
            let mut written = false;
            for i in self.window(hash) {
                let Some((seq, view)) = self.read(i) else {
                    written = true;
                    continue;
                };
                if view.kind != Kind::Empty && view.hash == hash {
                    return Some(Lookup { slot: i, view, seq });
                }
            }
            if !written {
                return None;
            }
            std::hint::spin_loop();
        }
        None
    }

    /// A slot for `hash`: the one that holds it, else an empty one of its window,
    /// else the least recently used one nobody fetches (evicted). The slot holds a
    /// reservation for `hash` unless it already held the key. `None`: every slot of
    /// the window is being written or fetched.
    pub fn reserve(&self, hash: KeyHash, now: u64, now_ms: u64) -> Option<Reserved> {
        for attempt in 0..WRITE_TRIES {
            if let Some(found) = self.find(hash) {
                return Some(Reserved {
                    slot: found.slot,
                    evicted: None,
                });
            }
            let mut best: Option<(usize, u32, SlotView)> = None;
            let mut written = false;
            for i in self.window(hash) {
                let Some((seq, view)) = self.read(i) else {
                    // Being written: perhaps with this very key, by another worker
                    // that missed it at the same moment. Choosing another slot would
                    // give the key two slots and two fetches; look again once the
                    // write is done. (A writer killed mid-write leaves its slot odd
                    // for good: after half the tries it is passed over.)
                    written = true;
                    continue;
                };
                let locked = !self.lock_free(i, now_ms);
                let free = view.kind == Kind::Empty || view.kind == Kind::Reserved && !locked;
                if free {
                    best = Some((i, seq, view));
                    break;
                }
                if locked {
                    continue;
                }
                if best.is_none_or(|(_, _, b)| view.accessed < b.accessed) {
                    best = Some((i, seq, view));
                }
            }
            if written && attempt < WRITE_TRIES / 2 {
                std::hint::spin_loop();
                continue;
            }
            let (i, seq, old) = best?;
            let new = SlotView {
                kind: Kind::Reserved,
                hash,
                stored: 0,
                expires: 0,
                size: 0,
                accessed: now,
            };
            if self.write(i, seq, &new) {
                let evicted = matches!(old.kind, Kind::Entry | Kind::Vary).then_some(old);
                if let Some(e) = evicted {
                    self.forget_bytes(e.size);
                    self.header.count.fetch_sub(1, Relaxed);
                }
                return Some(Reserved { slot: i, evicted });
            }
        }
        None
    }

    /// Stores an entry (or vary record) for `hash` in slot `i`, which must hold
    /// `hash` (reserved or an older entry). Returns the older entry's view if it
    /// replaced one (its body file was replaced on disk by the same name).
    pub fn publish(&self, i: usize, view: SlotView) -> Result<Option<SlotView>, Busy> {
        for _ in 0..WRITE_TRIES {
            let Some((seq, old)) = self.read(i) else {
                std::hint::spin_loop();
                continue;
            };
            if old.hash != view.hash {
                return Err(Busy);
            }
            if self.write(i, seq, &view) {
                self.header.bytes.fetch_add(view.size, Relaxed);
                let replaced = matches!(old.kind, Kind::Entry | Kind::Vary).then_some(old);
                match replaced {
                    Some(o) => self.forget_bytes(o.size),
                    None => {
                        self.header.count.fetch_add(1, Relaxed);
                    }
                }
                return Ok(replaced);
            }
        }
        Err(Busy)
    }

    /// Sets slot `i`'s freshness (a revalidation said the entry is unchanged).
    pub fn refresh(&self, i: usize, hash: KeyHash, stored: u64, expires: u64) -> bool {
        for _ in 0..WRITE_TRIES {
            let Some((seq, mut view)) = self.read(i) else {
                continue;
            };
            if view.hash != hash || view.kind != Kind::Entry {
                return false;
            }
            view.stored = stored;
            view.expires = expires;
            if self.write(i, seq, &view) {
                return true;
            }
        }
        false
    }

    /// Marks slot `i` (holding `hash`) as a key whose responses are not stored, until
    /// `until` (unix seconds): requests for it go upstream side by side, without
    /// waiting for each other's fetch (Varnish's hit-for-miss). Returns the entry it
    /// held, if any (its body file is the caller's to remove).
    pub fn mark_pass(&self, i: usize, hash: KeyHash, until: u64) -> Option<SlotView> {
        for _ in 0..WRITE_TRIES {
            let (seq, old) = self.read(i)?;
            if old.hash != hash {
                return None;
            }
            let view = SlotView {
                kind: Kind::Reserved,
                hash,
                stored: 0,
                expires: until,
                size: 0,
                accessed: old.accessed,
            };
            if self.write(i, seq, &view) {
                let held = matches!(old.kind, Kind::Entry | Kind::Vary).then_some(old);
                if let Some(o) = held {
                    self.forget_bytes(o.size);
                    self.header.count.fetch_sub(1, Relaxed);
                }
                return held;
            }
        }
        None
    }

    /// Empties slot `i` if it holds `hash`: the removed entry, whose body file is the
    /// caller's to remove.
    pub fn remove(&self, i: usize, hash: KeyHash) -> Option<SlotView> {
        for _ in 0..WRITE_TRIES {
            let (seq, view) = self.read(i)?;
            if view.hash != hash || view.kind == Kind::Empty {
                return None;
            }
            let empty = SlotView {
                kind: Kind::Empty,
                hash: KeyHash(0),
                stored: 0,
                expires: 0,
                size: 0,
                accessed: 0,
            };
            if self.write(i, seq, &empty) {
                if matches!(view.kind, Kind::Entry | Kind::Vary) {
                    self.forget_bytes(view.size);
                    self.header.count.fetch_sub(1, Relaxed);
                }
                return Some(view);
            }
        }
        None
    }

    fn forget_bytes(&self, n: u64) {
        let _ = self
            .header
            .bytes
            .fetch_update(Relaxed, Relaxed, |b| Some(b.saturating_sub(n)));
    }

    /// Notes a use of slot `i` (for least-recently-used eviction).
    pub fn touch(&self, i: usize, now: u64) {
        let a = &self.slots[i].accessed;
        if a.load(Relaxed) < now {
            a.store(now, Relaxed);
        }
    }

    pub fn lock_word(&self, i: usize) -> LockWord {
        LockWord(self.slots[i].lock.load(Acquire))
    }

    /// Whether nobody holds slot `i`'s fetch lock at `now_ms` (free, past its end,
    /// or its holder is gone).
    pub fn lock_free(&self, i: usize, now_ms: u64) -> bool {
        let w = self.lock_word(i);
        w == LockWord::FREE || w.expired(now_ms) || !pid_running(w.pid() as i32)
    }

    /// Takes slot `i`'s fetch lock as `mine` if nobody holds it.
    pub fn try_lock(&self, i: usize, mine: LockWord, now_ms: u64) -> bool {
        let cell = &self.slots[i].lock;
        let held = LockWord(cell.load(Acquire));
        // A word equal to `mine` is another request of this process, made in the same
        // millisecond: held like any other.
        if held != LockWord::FREE && !held.expired(now_ms) && pid_running(held.pid() as i32) {
            return false;
        }
        cell.compare_exchange(held.0, mine.0, Acquire, Relaxed)
            .is_ok()
    }

    /// Gives slot `i`'s fetch lock back if `mine` still holds it.
    pub fn unlock(&self, i: usize, mine: LockWord) {
        let _ = self.slots[i]
            .lock
            .compare_exchange(mine.0, 0, Release, Relaxed);
    }

    pub fn bump(&self, counter: usize, n: u64) {
        self.header.counters[counter].fetch_add(n, Relaxed);
    }

    pub fn counter(&self, counter: usize) -> u64 {
        self.header.counters[counter].load(Relaxed)
    }
}

/// Whether `pid` exists (one `kill(pid, 0)`: cheap enough for a waiter to ask
/// often; a holder that died is reaped by the master within moments).
fn pid_running(pid: i32) -> bool {
    use nix::errno::Errno;
    pid > 0
        && matches!(
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
            Ok(()) | Err(Errno::EPERM)
        )
}

/// Another writer kept a slot for longer than a writer retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Busy;

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An index over ordinary memory, for tests.
    pub struct Owned {
        header: Box<Header>,
        slots: Vec<Slot>,
    }

    impl Owned {
        pub fn new(n: usize) -> Owned {
            // SAFETY-free: every field is an atomic integer or bytes, zero is valid.
            let header = Box::new(Header {
                magic: AtomicU64::new(MAGIC),
                version: AtomicU32::new(VERSION),
                entries: AtomicU32::new(n as u32),
                created: AtomicU64::new(0),
                loaded: AtomicU32::new(0),
                _pad: AtomicU32::new(0),
                lease: AtomicU64::new(0),
                bytes: AtomicU64::new(0),
                count: AtomicU64::new(0),
                counters: Default::default(),
                _rest: [0; HEADER_SIZE - 56 - 128],
            });
            let slots = (0..n)
                .map(|_| Slot {
                    seq: AtomicU32::new(0),
                    kind: AtomicU32::new(0),
                    hi: AtomicU64::new(0),
                    lo: AtomicU64::new(0),
                    stored: AtomicU64::new(0),
                    expires: AtomicU64::new(0),
                    size: AtomicU64::new(0),
                    accessed: AtomicU64::new(0),
                    lock: AtomicU64::new(0),
                })
                .collect();
            Owned { header, slots }
        }

        pub fn index(&self) -> Index<'_> {
            Index {
                header: &self.header,
                slots: &self.slots,
            }
        }
    }

    fn entry(hash: KeyHash, size: u64, accessed: u64) -> SlotView {
        SlotView {
            kind: Kind::Entry,
            hash,
            stored: 10,
            expires: 20,
            size,
            accessed,
        }
    }

    #[test]
    fn layout_sizes_are_what_the_file_geometry_assumes() {
        assert_eq!(std::mem::size_of::<Slot>(), 64);
        assert_eq!(std::mem::size_of::<Header>(), HEADER_SIZE);
    }

    #[test]
    fn a_reserved_key_is_found_published_refreshed_and_removed() {
        let o = Owned::new(64);
        let ix = o.index();
        let h = KeyHash::of(&[b"a"]);
        assert_eq!(ix.find(h), None);
        let r = ix.reserve(h, 5, 1000).unwrap();
        assert_eq!(r.evicted, None);
        assert_eq!(ix.find(h).unwrap().view.kind, Kind::Reserved);
        assert_eq!(
            ix.reserve(h, 5, 1000).unwrap().slot,
            r.slot,
            "same slot again"
        );
        assert_eq!(ix.publish(r.slot, entry(h, 100, 5)), Ok(None));
        assert_eq!(ix.header.bytes.load(Relaxed), 100);
        assert_eq!(ix.header.count.load(Relaxed), 1);
        let replaced = ix.publish(r.slot, entry(h, 40, 6)).unwrap().unwrap();
        assert_eq!(replaced.size, 100);
        assert_eq!(ix.header.bytes.load(Relaxed), 40);
        assert!(ix.refresh(r.slot, h, 30, 90));
        let v = ix.find(h).unwrap().view;
        assert_eq!((v.stored, v.expires), (30, 90));
        assert!(ix.remove(r.slot, KeyHash::of(&[b"other"])).is_none());
        let held = ix.mark_pass(r.slot, h, 500).unwrap();
        assert_eq!(held.size, 40);
        let v = ix.find(h).unwrap().view;
        assert_eq!((v.kind, v.expires), (Kind::Reserved, 500));
        assert_eq!(ix.header.bytes.load(Relaxed), 0);
        ix.publish(r.slot, entry(h, 40, 7)).unwrap();
        assert_eq!(ix.remove(r.slot, h).unwrap().size, 40);
        assert_eq!(ix.find(h), None);
        assert_eq!(ix.header.bytes.load(Relaxed), 0);
        assert_eq!(ix.header.count.load(Relaxed), 0);
    }

    #[test]
    fn a_full_window_evicts_its_least_recently_used_unlocked_slot() {
        let o = Owned::new(PROBE); // one window: every key lands in it
        let ix = o.index();
        let hashes: Vec<KeyHash> = (0..PROBE as u8).map(|i| KeyHash::of(&[&[i]])).collect();
        for (n, h) in hashes.iter().enumerate() {
            let r = ix.reserve(*h, 1, 0).unwrap();
            ix.publish(r.slot, entry(*h, 10, 100 + n as u64)).unwrap();
        }
        // The oldest (accessed 100) is locked by a live fetcher: the next oldest goes.
        let oldest = ix.find(hashes[0]).unwrap().slot;
        let me = std::process::id();
        assert!(ix.try_lock(oldest, LockWord::new(me, 10_000), 0));
        let newcomer = KeyHash::of(&[b"new"]);
        let r = ix.reserve(newcomer, 200, 0).unwrap();
        assert_eq!(r.evicted.unwrap().hash, hashes[1]);
        assert_eq!(ix.find(hashes[1]), None);
        assert!(ix.find(hashes[0]).is_some());
        assert_eq!(ix.header.bytes.load(Relaxed), 70);
    }

    #[test]
    fn the_fetch_lock_is_exclusive_until_released_expired_or_its_holder_is_gone() {
        let o = Owned::new(64);
        let ix = o.index();
        let h = KeyHash::of(&[b"k"]);
        let slot = ix.reserve(h, 1, 1000).unwrap().slot;
        let me = std::process::id();
        let a = LockWord::new(me, 1000 + 5000);
        assert!(ix.try_lock(slot, a, 1000));
        assert!(!ix.lock_free(slot, 2000));
        assert!(
            !ix.try_lock(slot, a, 1000),
            "another request of this process, same ms"
        );
        // Another live process's word (the parent of the test: pid 1 is running).
        let b = LockWord::new(1, 1000 + 5000);
        assert!(!ix.try_lock(slot, b, 2000), "held by a live process");
        assert!(ix.try_lock(slot, b, 6001), "past its end");
        ix.unlock(slot, a); // not a's any more: no effect
        assert_eq!(ix.lock_word(slot), b);
        ix.unlock(slot, b);
        assert!(ix.lock_free(slot, 6001));
        // A holder that is not running.
        let gone = LockWord::new(0x7fff_fff0, 99_999);
        assert!(ix.try_lock(slot, gone, 0));
        assert!(ix.try_lock(slot, a, 0), "its holder is gone");
    }

    #[test]
    fn the_lock_end_compares_across_the_32_bit_wrap() {
        let w = LockWord::new(7, (1u64 << 32) + 10);
        assert!(!w.expired((1u64 << 32) - 5));
        assert!(w.expired((1u64 << 32) + 10));
        assert!(w.expired((1u64 << 32) + 11));
        assert_eq!(w.pid(), 7);
    }

    #[test]
    fn concurrent_reservations_of_one_key_share_one_slot() {
        for round in 0..300u32 {
            let o = Owned::new(64);
            let ix = o.index();
            let h = KeyHash::of(&[&round.to_le_bytes()]);
            let go = std::sync::Barrier::new(4);
            let slots: Vec<usize> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..4)
                    .map(|_| {
                        s.spawn(|| {
                            go.wait();
                            ix.reserve(h, 1, 0).unwrap().slot
                        })
                    })
                    .collect();
                hs.into_iter().map(|t| t.join().unwrap()).collect()
            });
            assert!(
                slots.iter().all(|&x| x == slots[0]),
                "round {round}: one key in slots {slots:?}"
            );
        }
    }

    #[test]
    fn concurrent_writers_never_tear_a_slot() {
        let o = Owned::new(64);
        let ix = o.index();
        let h = KeyHash::of(&[b"k"]);
        let slot = ix.reserve(h, 1, 0).unwrap().slot;
        std::thread::scope(|s| {
            for t in 0..3u64 {
                s.spawn(move || {
                    for n in 0..2000u64 {
                        let v = t * 1_000_000 + n;
                        let _ = ix.publish(
                            slot,
                            SlotView {
                                kind: Kind::Entry,
                                hash: h,
                                stored: v,
                                expires: v,
                                size: v,
                                accessed: v,
                            },
                        );
                    }
                });
            }
            s.spawn(move || {
                for _ in 0..20_000 {
                    if let Some((_, v)) = ix.read(slot) {
                        assert!(v.stored == v.expires && v.expires == v.size, "torn: {v:?}");
                    }
                }
            });
        });
    }
}

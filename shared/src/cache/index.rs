//! The index of a cache zone: a header and a table of 64-byte slots in shared memory,
//! read and written by every worker without a lock.
//!
//! - **Where a key lives.** A key's slots are the `PROBE` slots from its hash modulo
//!   the table's size. A new entry takes the first empty one, else the least
//!   recently used one of them that nobody is fetching (its body file is then removed
//!   by whoever took the slot: [`Reserved::evicted`]).
//! - **Reading a slot.** Each slot is a seqlock: a writer moves its sequence from even
//!   to odd with a compare-and-swap (putting its pid beside it), stores the fields,
//!   and makes it even again; a reader that saw the same even sequence before and
//!   after the fields has a consistent view. A hit costs a few loads, no store but
//!   `accessed`. A slot being written is waited for, not passed over: its writer may
//!   be a thread the kernel preempted between two stores.
//! - **Taking a slot for a key.** Only [`Index::reserve`] puts a key in a slot, and
//!   reservations of a zone take turns (a word in the header holding the pid of the
//!   one reserving, for the few loads and one write it takes). Two workers missing
//!   one key at the same moment therefore always share one slot, and one fetch:
//!   without the turns, a slot's `accessed` or fetch lock changing between their
//!   two looks at the window could make them choose two slots.
//! - **The fetch lock.** `lock` is apart from the seqlock: the pid of the worker
//!   fetching the key and when its lock ends (low 32 bits of the monotonic clock in
//!   ms). Concurrent misses for a key on any worker find it held and wait; a lock
//!   past its end, or held by a process that is gone, is taken over.
//!
//! A writer killed between the two stores of a sequence leaves its slot odd with its
//! pid: whoever next waits for the slot sees the pid gone and empties the slot (what
//! it held is forgotten; its body file, if any, is indexed again at the next start).
//! A reserver killed in its turn is passed the same way.

use super::KeyHash;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{fence, AtomicU32, AtomicU64};
use std::time::{Duration, Instant};

pub const MAGIC: u64 = u64::from_le_bytes(*b"FKDCIDX1");
pub const VERSION: u32 = 2;
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
    /// The pid of the one reserving a slot now, 0 if nobody ([`Index::reserve`]).
    reserving: AtomicU32,
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
    /// The sequence (low 32 bits, odd while written) and, while odd, the writer's
    /// pid (high 32 bits).
    word: AtomicU64,
    kind: AtomicU32,
    /// Unix seconds of its last use (outside the seqlock: a hint for eviction).
    accessed: AtomicU32,
    hi: AtomicU64,
    lo: AtomicU64,
    /// Unix seconds the response was stored or last revalidated.
    stored: AtomicU64,
    /// Unix seconds it is fresh until.
    expires: AtomicU64,
    /// Its body file's size.
    size: AtomicU64,
    /// The fetch lock (outside the seqlock).
    lock: AtomicU64,
}

const EMPTY: SlotView = SlotView {
    kind: Kind::Empty,
    hash: KeyHash(0),
    stored: 0,
    expires: 0,
    size: 0,
    accessed: 0,
};

/// Unix seconds in 32 bits (enough until 2106), as a slot keeps its last use.
fn seconds32(unix: u64) -> u32 {
    unix.min(u64::from(u32::MAX)) as u32
}

/// A zone's turn to reserve, held by this process (its pid in the header's word)
/// until dropped.
struct Turn<'a>(&'a AtomicU32);

impl<'a> Turn<'a> {
    fn take(word: &'a AtomicU32) -> Turn<'a> {
        let me = std::process::id();
        let mut wait = HolderWait::new();
        loop {
            let held = word.load(Relaxed);
            let gone = held != 0 && matches!(wait.wait(u64::from(held), held), Holder::Gone);
            // From 0, or from the pid of a holder that is gone (so that two takers
            // cannot both win).
            if (held == 0 || gone) && word.compare_exchange(held, me, Acquire, Relaxed).is_ok() {
                return Turn(word);
            }
        }
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.0.store(0, Release);
    }
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

/// How many times a writer retries a slot another writer changed under it.
const WRITE_TRIES: usize = 64;
/// How long a slot being written, or a turn to reserve, is waited for while its
/// holder's pid exists. A write is a few stores, a turn a few loads and a write; a
/// holder preempted between them is back within the scheduler's latency. Past this,
/// the pid is taken for a dead holder's, reused by another process.
const HOLDER_WAIT: Duration = Duration::from_millis(500);

/// Waits for a holder (of a slot's write or a zone's turn to reserve) that is
/// `pid`: spins briefly, then yields the CPU (the holder may be a preempted thread
/// of this very process), asking now and then whether `pid` still exists.
struct HolderWait {
    /// What is waited for (a slot's odd word, a turn's pid): a new one starts anew.
    on: u64,
    tries: u32,
    since: Option<Instant>,
}

enum Holder {
    /// Look again.
    Running,
    /// The holder is gone (or held on past [`HOLDER_WAIT`]): take over.
    Gone,
}

impl HolderWait {
    fn new() -> HolderWait {
        HolderWait {
            on: 0,
            tries: 0,
            since: None,
        }
    }

    /// One wait for the holder `pid` of `on`.
    fn wait(&mut self, on: u64, pid: u32) -> Holder {
        if on != self.on {
            *self = HolderWait {
                on,
                ..HolderWait::new()
            };
        }
        self.tries += 1;
        if self.tries < 64 {
            std::hint::spin_loop();
            return Holder::Running;
        }
        let since = *self.since.get_or_insert_with(Instant::now);
        if self.tries.is_multiple_of(64) && !pid_running(pid as i32)
            || since.elapsed() > HOLDER_WAIT
        {
            return Holder::Gone;
        }
        std::thread::yield_now();
        Holder::Running
    }
}

/// The seqlock word of a slot being written by `pid` at odd sequence `seq`.
fn writing(pid: u32, seq: u32) -> u64 {
    u64::from(pid) << 32 | u64::from(seq)
}

impl<'a> Index<'a> {
    fn window(&self, hash: KeyHash) -> impl Iterator<Item = usize> + '_ {
        let n = self.slots.len();
        let start = (hash.lo() % n as u64) as usize;
        (0..PROBE.min(n)).map(move |i| (start + i) % n)
    }

    /// A consistent view of slot `i`, or `None` while it is being written.
    pub fn read(&self, i: usize) -> Option<(u32, SlotView)> {
        let s = &self.slots[i];
        let word = s.word.load(Acquire);
        if word & 1 == 1 {
            return None;
        }
        let view = SlotView {
            kind: Kind::of(s.kind.load(Relaxed)),
            hash: KeyHash::from_parts(s.hi.load(Relaxed), s.lo.load(Relaxed)),
            stored: s.stored.load(Relaxed),
            expires: s.expires.load(Relaxed),
            size: s.size.load(Relaxed),
            accessed: u64::from(s.accessed.load(Relaxed)),
        };
        fence(Acquire);
        (s.word.load(Relaxed) == word).then_some((word as u32, view))
    }

    /// Slot `i` once nobody is writing it: a writer that exists is waited for; one
    /// that is gone (killed between its stores) has the slot emptied.
    pub fn settled(&self, i: usize) -> (u32, SlotView) {
        let mut wait = HolderWait::new();
        loop {
            if let Some(read) = self.read(i) {
                return read;
            }
            let word = self.slots[i].word.load(Relaxed);
            if word & 1 == 0 {
                continue; // written between two loads of the read: read again
            }
            if let Holder::Gone = wait.wait(word, (word >> 32) as u32) {
                self.empty_abandoned(i, word);
            }
        }
    }

    /// Empties slot `i`, left odd (`word`) by a writer that is gone.
    fn empty_abandoned(&self, i: usize, word: u64) {
        let s = &self.slots[i];
        let seq = (word as u32).wrapping_add(2);
        let me = std::process::id();
        if s.word
            .compare_exchange(word, writing(me, seq), Acquire, Relaxed)
            .is_err()
        {
            return; // someone else did, or the writer finished after all
        }
        self.store_fields(s, &EMPTY);
        s.word.store(u64::from(seq.wrapping_add(1)), Release);
    }

    fn store_fields(&self, s: &Slot, view: &SlotView) {
        s.kind.store(view.kind as u32, Relaxed);
        s.hi.store(view.hash.hi(), Relaxed);
        s.lo.store(view.hash.lo(), Relaxed);
        s.stored.store(view.stored, Relaxed);
        s.expires.store(view.expires, Relaxed);
        s.size.store(view.size, Relaxed);
        s.accessed.store(seconds32(view.accessed), Relaxed);
    }

    /// Writes slot `i` if its sequence is still `seq` (what [`Index::read`] gave).
    fn write(&self, i: usize, seq: u32, view: &SlotView) -> bool {
        let s = &self.slots[i];
        let odd = writing(std::process::id(), seq.wrapping_add(1));
        if s.word
            .compare_exchange(u64::from(seq), odd, Acquire, Relaxed)
            .is_err()
        {
            return false;
        }
        self.store_fields(s, view);
        s.word.store(u64::from(seq.wrapping_add(2)), Release);
        true
    }

    /// The slot holding `hash` (an entry, a vary record or a reservation). A slot of
    /// the window being written is waited for (briefly: a write is a few stores), so
    /// a key is not missed while its slot is refreshed or published.
    pub fn find(&self, hash: KeyHash) -> Option<Lookup> {
        self.window(hash).find_map(|i| {
            let (seq, view) = self.settled(i);
            (view.kind != Kind::Empty && view.hash == hash).then_some(Lookup { slot: i, view, seq })
        })
    }

    /// A slot for `hash`: the one that holds it, else the first empty one of its
    /// window (or a reservation nobody fetches), else the least recently used one
    /// nobody fetches (evicted). The slot holds a reservation for `hash` unless it
    /// already held the key. `None`: every slot of the window is being fetched.
    pub fn reserve(&self, hash: KeyHash, now: u64, now_ms: u64) -> Option<Reserved> {
        let _turn = Turn::take(&self.header.reserving);
        for _ in 0..WRITE_TRIES {
            let mut free: Option<(usize, u32, SlotView)> = None;
            let mut oldest: Option<(usize, u32, SlotView)> = None;
            for i in self.window(hash) {
                let (seq, view) = self.settled(i);
                if view.kind != Kind::Empty && view.hash == hash {
                    return Some(Reserved {
                        slot: i,
                        evicted: None,
                    });
                }
                let locked = !self.lock_free(i, now_ms);
                if view.kind == Kind::Empty || view.kind == Kind::Reserved && !locked {
                    free = free.or(Some((i, seq, view)));
                } else if !locked && oldest.is_none_or(|(_, _, o)| view.accessed < o.accessed) {
                    oldest = Some((i, seq, view));
                }
            }
            let (i, seq, old) = free.or(oldest)?;
            let new = SlotView {
                kind: Kind::Reserved,
                hash,
                stored: 0,
                expires: 0,
                size: 0,
                accessed: now,
            };
            // Fails only if a writer (publishing, refreshing, removing another key)
            // changed the slot since it was read: look at the window again.
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
            let (seq, old) = self.settled(i);
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
            let (seq, mut view) = self.settled(i);
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
            let (seq, old) = self.settled(i);
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
            let (seq, view) = self.settled(i);
            if view.hash != hash || view.kind == Kind::Empty {
                return None;
            }
            if self.write(i, seq, &EMPTY) {
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
        let now = seconds32(now);
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
                reserving: AtomicU32::new(0),
                lease: AtomicU64::new(0),
                bytes: AtomicU64::new(0),
                count: AtomicU64::new(0),
                counters: Default::default(),
                _rest: [0; HEADER_SIZE - 56 - 128],
            });
            let slots = (0..n)
                .map(|_| Slot {
                    word: AtomicU64::new(0),
                    kind: AtomicU32::new(0),
                    accessed: AtomicU32::new(0),
                    hi: AtomicU64::new(0),
                    lo: AtomicU64::new(0),
                    stored: AtomicU64::new(0),
                    expires: AtomicU64::new(0),
                    size: AtomicU64::new(0),
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
    fn concurrent_evicting_reservations_of_one_key_share_one_slot_while_uses_reorder_the_window() {
        for round in 0..200u32 {
            // Eight slots: every key's window is the whole table, all of it full.
            let o = Owned::new(PROBE);
            let ix = o.index();
            for k in 0..PROBE as u32 {
                let other = KeyHash::of(&[b"other", &k.to_le_bytes(), &round.to_le_bytes()]);
                let r = ix.reserve(other, 1, 0).unwrap();
                ix.publish(r.slot, entry(other, 1, u64::from(k) + 1))
                    .unwrap();
            }
            let h = KeyHash::of(&[b"k", &round.to_le_bytes()]);
            let go = std::sync::Barrier::new(5);
            let done = std::sync::atomic::AtomicBool::new(false);
            let slots: Vec<usize> = std::thread::scope(|s| {
                // Hits on the other entries change which is least recently used
                // while the misses look at the window.
                s.spawn(|| {
                    go.wait();
                    let mut now = 100;
                    while !done.load(Relaxed) {
                        now += 1;
                        ix.touch(now as usize % PROBE, now);
                    }
                });
                let hs: Vec<_> = (0..4)
                    .map(|_| {
                        s.spawn(|| {
                            go.wait();
                            ix.reserve(h, 1_000_000, 0).unwrap().slot
                        })
                    })
                    .collect();
                let slots = hs.into_iter().map(|t| t.join().unwrap()).collect();
                done.store(true, Relaxed);
                slots
            });
            assert!(
                slots.iter().all(|&x| x == slots[0]),
                "round {round}: one key in slots {slots:?}"
            );
        }
    }

    /// A pid that existed and is gone (a child run and reaped).
    fn dead_pid() -> u32 {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    }

    #[test]
    fn a_slot_left_half_written_by_a_killed_writer_is_emptied_and_used_again() {
        let o = Owned::new(64);
        let ix = o.index();
        let h = KeyHash::of(&[b"k"]);
        let slot = ix.reserve(h, 1, 0).unwrap().slot;
        ix.publish(slot, entry(h, 10, 1)).unwrap();
        // A writer killed between its two stores: the word odd, its pid beside it.
        let seq = ix.read(slot).unwrap().0;
        o.slots[slot]
            .word
            .store(writing(dead_pid(), seq + 1), Relaxed);
        assert_eq!(ix.read(slot), None);
        assert_eq!(ix.find(h), None, "the half-written entry is not served");
        assert_eq!(ix.read(slot).map(|(_, v)| v.kind), Some(Kind::Empty));
        assert_eq!(ix.reserve(h, 2, 0).unwrap().slot, slot);
    }

    #[test]
    fn a_turn_to_reserve_held_by_a_process_that_is_gone_is_taken_over() {
        let o = Owned::new(64);
        let ix = o.index();
        o.header.reserving.store(dead_pid(), Relaxed);
        let h = KeyHash::of(&[b"k"]);
        assert!(ix.reserve(h, 1, 0).is_some());
        assert_eq!(
            o.header.reserving.load(Relaxed),
            0,
            "the turn is given back"
        );
    }

    #[test]
    fn a_slot_being_written_by_a_live_writer_is_waited_for_not_passed_over() {
        let o = Owned::new(64);
        let ix = o.index();
        let h = KeyHash::of(&[b"k"]);
        let slot = ix.reserve(h, 1, 0).unwrap().slot;
        let seq = ix.read(slot).unwrap().0;
        // This process "writes" the slot (its pid runs) and finishes a moment later.
        o.slots[slot]
            .word
            .store(writing(std::process::id(), seq + 1), Relaxed);
        std::thread::scope(|s| {
            let finder = s.spawn(|| ix.reserve(h, 2, 0).unwrap().slot);
            std::thread::sleep(Duration::from_millis(50));
            o.slots[slot].word.store(u64::from(seq + 2), Release);
            assert_eq!(finder.join().unwrap(), slot, "one key, one slot");
        });
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

//! The cells every area of the region is built from: counters bumped by their one
//! writer ([`bump`], [`Counters`], the latency [`Histogram`]), short texts read
//! without tearing ([`Text`]), and the counter-name tables ([`CounterName`]) builds
//! check before sharing a region. They know no area and no layout: the areas are
//! made of them, and `layout` composes the areas.

use super::counters::{Counter, COUNTER_CELLS, NAME_BYTES};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering::Relaxed};

/// Histogram buckets: exact below 16 µs, then 16 per power of two up to 2^36 µs, so a
/// bucket's midpoint is within 1/32 (3.1%) of any value in it.
pub const BUCKETS: usize = 16 + 32 * 16;

/// Adds `n` to a counter this process alone writes.
#[inline]
pub fn bump(counter: &AtomicU64, n: u64) {
    counter.store(counter.load(Relaxed).wrapping_add(n), Relaxed);
}

/// The bucket a latency of `us` microseconds falls in.
#[inline]
pub fn bucket_of(us: u64) -> usize {
    if us < 16 {
        return us as usize;
    }
    let e = 63 - us.leading_zeros() as usize; // >= 4
    if e > 35 {
        return BUCKETS - 1;
    }
    let sub = ((us >> (e - 4)) & 15) as usize;
    16 + (e - 4) * 16 + sub
}

/// `[low, high)` microseconds of bucket `i`.
pub fn bucket_bounds(i: usize) -> (u64, u64) {
    if i < 16 {
        return (i as u64, i as u64 + 1);
    }
    let e = (i - 16) / 16 + 4;
    let sub = ((i - 16) % 16) as u64;
    ((16 + sub) << (e - 4), (17 + sub) << (e - 4))
}

#[repr(C)]
pub struct Histogram {
    pub buckets: [AtomicU64; BUCKETS],
    pub sum_us: AtomicU64,
    pub count: AtomicU64,
}

impl Histogram {
    #[inline]
    pub fn record(&self, us: u64) {
        bump(&self.buckets[bucket_of(us)], 1);
        bump(&self.sum_us, us);
        bump(&self.count, 1);
    }
}

/// Counters that only grow (per worker, and retired): one cell per counter of the
/// table in `counters` (its id is the cell number), spare cells for counters later
/// builds add, and the latency histogram.
#[repr(C)]
pub struct Counters {
    pub cells: [AtomicU64; COUNTER_CELLS],
    pub latency: Histogram,
}

/// Every 64-bit word of a [`Counters`] block, numbered `0..WORDS` in a fixed order:
/// the cells, the histogram's buckets, its sum and its count. Folding and zeroing go
/// word by word in this order (the fold's journal records a word number).
pub const WORDS: usize = COUNTER_CELLS + BUCKETS + 2;

impl Counters {
    #[inline]
    pub fn get(&self, c: Counter) -> &AtomicU64 {
        &self.cells[c.cell()]
    }

    /// Adds `n` to counter `c` (this process being the row's only writer).
    #[inline]
    pub fn bump(&self, c: Counter, n: u64) {
        bump(self.get(c), n);
    }

    /// Word `i` of the block (see [`WORDS`]).
    pub fn word(&self, i: usize) -> &AtomicU64 {
        if i < COUNTER_CELLS {
            &self.cells[i]
        } else if i < COUNTER_CELLS + BUCKETS {
            &self.latency.buckets[i - COUNTER_CELLS]
        } else if i == COUNTER_CELLS + BUCKETS {
            &self.latency.sum_us
        } else {
            &self.latency.count
        }
    }

    /// Every word, in [`WORDS`] order.
    pub fn words(&self) -> impl Iterator<Item = &AtomicU64> {
        (0..WORDS).map(|i| self.word(i))
    }
}

/// A short text (reasons, errors, addresses) written by one writer under a sequence
/// count, so readers never take a torn one.
#[repr(C)]
pub struct Text<const N: usize> {
    seq: AtomicU64,
    len: AtomicU32,
    bytes: [AtomicU8; N],
}

impl<const N: usize> Text<N> {
    /// Writes `text`, cut to the capacity at a character boundary.
    pub fn set(&self, text: &str) {
        let mut end = text.len().min(N);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        // Odd while writing; already odd only if a writer died mid-write.
        let seq = self.seq.load(Relaxed) | 1;
        self.seq.store(seq, Relaxed);
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        for (slot, b) in self.bytes.iter().zip(&text.as_bytes()[..end]) {
            slot.store(*b, Relaxed);
        }
        self.len.store(end as u32, Relaxed);
        self.seq
            .store(seq + 1, std::sync::atomic::Ordering::Release);
    }

    /// The text; empty if it stayed mid-write for a bounded number of readings.
    pub fn get(&self) -> String {
        for _ in 0..1000 {
            let before = self.seq.load(std::sync::atomic::Ordering::Acquire);
            if before % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let len = (self.len.load(Relaxed) as usize).min(N);
            let bytes: Vec<u8> = self.bytes[..len].iter().map(|b| b.load(Relaxed)).collect();
            std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
            if self.seq.load(Relaxed) == before {
                return String::from_utf8_lossy(&bytes).into_owned();
            }
        }
        String::new()
    }
}

/// A counter's name in the region's name table, NUL-padded. Written by a master before
/// it forks workers, read when a master attaches.
#[repr(C)]
pub struct CounterName([AtomicU8; NAME_BYTES]);

impl CounterName {
    pub fn get(&self) -> String {
        let bytes: Vec<u8> = self
            .0
            .iter()
            .map(|b| b.load(Relaxed))
            .take_while(|&b| b != 0)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Writes `name` (the table checks names fit when compiling).
    pub fn set(&self, name: &str) {
        let bytes = name.as_bytes();
        for (i, cell) in self.0.iter().enumerate() {
            cell.store(bytes.get(i).copied().unwrap_or(0), Relaxed);
        }
    }
}

/// A region cell that names another counter than this build's counter of that id: the
/// builds cannot share the region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterMismatch {
    pub cell: usize,
    pub region: String,
    pub ours: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_values_in_order() {
        let mut last = 0;
        for us in [
            0u64,
            1,
            15,
            16,
            17,
            31,
            32,
            33,
            100,
            1000,
            65_535,
            1 << 30,
            u64::MAX,
        ] {
            let b = bucket_of(us);
            assert!(b >= last, "{us}");
            last = b;
            let (lo, hi) = bucket_bounds(b);
            if us < 1 << 36 {
                assert!(lo <= us && us < hi, "{us} not in [{lo}, {hi})");
            }
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn bucket_midpoints_are_within_five_percent() {
        for b in 16..BUCKETS {
            let (lo, hi) = bucket_bounds(b);
            let mid = (lo + hi) as f64 / 2.0;
            assert!((mid - lo as f64) / (lo as f64) < 0.05);
            assert_eq!(bucket_of(lo), b);
            assert_eq!(bucket_of(hi - 1), b);
        }
    }

    #[test]
    fn words_cover_the_counters_block() {
        assert_eq!(std::mem::size_of::<Counters>(), WORDS * 8);
    }

    #[test]
    fn text_round_trips_and_truncates_at_char_boundary() {
        let t: Text<8> = unsafe_free_zeroed();
        t.set("héllo wörld");
        assert_eq!(t.get(), "héllo w");
    }

    #[test]
    fn a_text_left_mid_write_reads_empty_and_the_next_set_repairs_it() {
        let t: Text<8> = unsafe_free_zeroed();
        t.set("first");
        // A writer killed mid-write leaves the count odd.
        t.seq.store(t.seq.load(Relaxed) + 1, Relaxed);
        assert_eq!(t.get(), "");
        t.set("second");
        assert_eq!(t.seq.load(Relaxed) % 2, 0);
        assert_eq!(t.get(), "second");
    }

    /// A zeroed Text built from atomics' constructors (no unsafe needed).
    fn unsafe_free_zeroed() -> Text<8> {
        Text {
            seq: AtomicU64::new(0),
            len: AtomicU32::new(0),
            bytes: std::array::from_fn(|_| AtomicU8::new(0)),
        }
    }
}

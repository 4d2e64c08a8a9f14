//! Folding an exited worker's row into the retired totals, crash-safe.
//!
//! The fold lock holds the folding master's pid (two masters share the region during a
//! binary upgrade), and the header keeps a journal of the word being moved, so a
//! master that finds the lock held by a process that is gone takes it over and
//! finishes the interrupted fold exactly. Readers see `fold_seq` odd meanwhile, and
//! give up after a bounded wait (see `report::read`).

use super::layout::{Layout, WorkerState, NO_WORD, WORDS};
use super::process_alive;
use super::upstream::{self, ROW_WORDS};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::time::{Duration, Instant};

/// Words a fold moves, numbered for the journal: the worker row's counters block
/// (`0..WORDS`, as before the upstream area), then its upstream cells (`WORDS..`).
pub const FOLD_WORDS: usize = WORDS + ROW_WORDS;

/// Word `i` (below [`FOLD_WORDS`]) of slot `index`'s counts.
fn row_word(layout: &Layout, index: usize, i: usize) -> &AtomicU64 {
    if i < WORDS {
        layout.slots[index].counters.word(i)
    } else {
        upstream::row_word(&layout.upstreams.rows[index], i - WORDS)
    }
}

/// Word `i` (below [`FOLD_WORDS`]) of the retired totals.
fn retired_word(layout: &Layout, i: usize) -> &AtomicU64 {
    if i < WORDS {
        layout.retired.counters.word(i)
    } else {
        upstream::row_word(&layout.upstreams.retired, i - WORDS)
    }
}

/// How long a master waits for another live master's fold before giving up on its own.
/// A fold takes microseconds; only a stopped master holds the lock this long.
pub const LOCK_PATIENCE: Duration = Duration::from_secs(1);

/// Moves the counters of the exited worker in slot `index` into the retired totals and
/// clears the slot, under `fold_seq` so readers never count them twice or not at all.
///
/// Crash-safe: the fold lock holds the folding master's pid, and the header keeps a
/// journal of the word being moved, so a master that finds the lock held by a process
/// that is gone takes it over and finishes the interrupted fold exactly before its
/// own. If another live master holds the lock for [`LOCK_PATIENCE`], the row is left
/// unfolded (its counts stay in the row, where readers count them) and marked exited.
pub fn fold_slot(layout: &Layout, index: usize) {
    let h = &layout.header;
    if let Err(holder) = lock_fold(layout) {
        crate::error!(
            "stats: master {holder} has held the fold lock for {LOCK_PATIENCE:?}; \
             worker row {index} keeps its counts unfolded"
        );
        layout.slots[index]
            .state
            .store(WorkerState::Exited as u32, Release);
        return;
    }
    // Odd: folding (already odd only if someone wrote the header: it ends even).
    let seq = h.fold_seq.load(Relaxed) | 1;
    h.fold_seq.store(seq, Relaxed);
    std::sync::atomic::fence(Release);
    h.fold_word.store(NO_WORD, Relaxed);
    h.fold_row.store(index as u32 + 1, Relaxed);
    move_words(layout, index, 0);
    finish_fold(layout, index);
    h.fold_seq.store(seq + 1, Release); // even: done
    h.fold_lock.store(0, Release);
}

/// Finishes a fold that a master which has since died left half done (the lock held by
/// a process that is gone, or an odd `fold_seq` under a free lock). Called by the
/// master once a second, so readers do not report the region inconsistent until the
/// next worker exits. Returns whether it found one.
pub fn recover_fold(layout: &Layout) -> bool {
    let h = &layout.header;
    let holder = h.fold_lock.load(Acquire);
    let stuck = if holder == 0 {
        h.fold_seq.load(Acquire) % 2 == 1
    } else {
        holder == std::process::id() || !process_alive(holder as i32)
    };
    if !stuck || lock_fold(layout).is_err() {
        return false;
    }
    finish_interrupted_fold(layout);
    h.fold_lock.store(0, Release);
    crate::warn!("stats: repaired a fold left unfinished (the region read as inconsistent)");
    true
}

/// Takes the fold lock: free, or held by a process that is gone (then the fold it left
/// is finished first). Err(holder) after [`LOCK_PATIENCE`] of a live holder.
fn lock_fold(layout: &Layout) -> Result<(), u32> {
    let h = &layout.header;
    let me = std::process::id();
    let started = Instant::now();
    let mut tries = 0u32;
    loop {
        let holder = match h.fold_lock.compare_exchange(0, me, Acquire, Relaxed) {
            Ok(_) => return Ok(()),
            Err(holder) => holder,
        };
        // A master folds on its one thread and never nests: the lock naming this
        // process was left by an earlier process with this pid.
        if (holder == me || !process_alive(holder as i32))
            && h.fold_lock
                .compare_exchange(holder, me, Acquire, Relaxed)
                .is_ok()
        {
            crate::warn!("stats: took the fold lock over from process {holder}, which is gone");
            finish_interrupted_fold(layout);
            return Ok(());
        }
        if started.elapsed() >= LOCK_PATIENCE {
            return Err(holder);
        }
        tries += 1;
        if tries < 64 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Under the lock taken over from a dead master: completes its fold from the journal,
/// and leaves `fold_seq` even.
fn finish_interrupted_fold(layout: &Layout) {
    let h = &layout.header;
    let row = h.fold_row.load(Acquire) as usize;
    if row > 0 && row <= layout.slots.len() {
        let index = row - 1;
        let word = h.fold_word.load(Relaxed);
        let start = if word == NO_WORD || word as usize >= FOLD_WORDS {
            0
        } else {
            let w = word as usize;
            let left = row_word(layout, index, w).load(Relaxed);
            if left != 0 {
                // Not yet cleared, so `fold_base` is still this word's retired value
                // from before it was added to (whether or not the add happened).
                retired_word(layout, w)
                    .store(h.fold_base.load(Relaxed).wrapping_add(left), Relaxed);
                row_word(layout, index, w).store(0, Relaxed);
            }
            w + 1
        };
        move_words(layout, index, start);
        finish_fold(layout, index);
        crate::warn!("stats: finished the fold of worker row {index} that a dead master began");
    }
    let seq = h.fold_seq.load(Relaxed);
    h.fold_seq.store((seq + 1) & !1, Release); // even
}

/// Moves words `start..` of row `index` into the retired totals, journalling each:
/// `fold_base` (the retired value before) is written before `fold_word` names the
/// word, and the row's word is cleared last, so a reader of the journal after a crash
/// knows whether the word still has to be moved.
fn move_words(layout: &Layout, index: usize, start: usize) {
    let h = &layout.header;
    for i in start..FOLD_WORDS {
        let (slot, retired) = (row_word(layout, index, i), retired_word(layout, i));
        let value = slot.load(Relaxed);
        if value == 0 {
            continue;
        }
        let base = retired.load(Relaxed);
        h.fold_base.store(base, Release);
        h.fold_word.store(i as u64, Release);
        retired.store(base.wrapping_add(value), Release);
        slot.store(0, Release);
    }
}

/// The rest of a fold, safe to repeat: gauges cleared, the row exited, the journal
/// closed.
fn finish_fold(layout: &Layout, index: usize) {
    let slot = &layout.slots[index];
    for gauge in [
        &slot.connections_active,
        &slot.connections_reading,
        &slot.connections_writing,
        &slot.connections_idle,
        &slot.open_fds,
        &slot.rss_bytes,
    ] {
        gauge.store(0, Relaxed);
    }
    slot.tunnels_open.store(0, Relaxed);
    upstream::clear_gauges(&layout.upstreams, index);
    super::upstream_state::clear_slot(&layout.upstream_state, index);
    super::limits::release_row(&layout.limits, &layout.limits_held, index);
    slot.state.store(WorkerState::Exited as u32, Release);
    layout.header.fold_row.store(0, Release);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::counters::COUNTER_CELLS;
    use crate::shm::master::claim_free_slot;
    use crate::shm::testing::{dead_pid, TempRegion};
    use crate::shm::{report, Region};

    fn me() -> i32 {
        std::process::id() as i32
    }

    /// Fills row `row` with counts (each word its own value), as a worker would.
    fn fill_row(layout: &Layout, row: usize, scale: u64) {
        let c = &layout.slots[row].counters;
        for (i, w) in c.words().enumerate() {
            w.store((i as u64 + 1) * scale, Relaxed);
        }
        layout.slots[row]
            .state
            .store(WorkerState::Serving as u32, Release);
    }

    fn words_of(c: &crate::shm::layout::Counters) -> Vec<u64> {
        c.words().map(|w| w.load(Relaxed)).collect()
    }

    /// What a master killed mid-fold leaves: words `..word` of `row` moved, and for
    /// `word`, the first `steps` of the journal protocol of `move_words` done (1: base
    /// journalled, 2: word named, 3: retired added to; 4 would clear the row's word).
    fn die_mid_fold(layout: &Layout, row: usize, word: usize, steps: usize, pid: i32) {
        let h = &layout.header;
        h.fold_lock.store(pid as u32, Release);
        h.fold_seq.store(h.fold_seq.load(Relaxed) | 1, Release);
        h.fold_word.store(NO_WORD, Release);
        h.fold_row.store(row as u32 + 1, Release);
        let retired = &layout.retired.counters;
        let slot = &layout.slots[row].counters;
        for i in 0..=word {
            let value = slot.word(i).load(Relaxed);
            let base = retired.word(i).load(Relaxed);
            let steps = if i < word { 4 } else { steps };
            if steps >= 1 {
                h.fold_base.store(base, Release);
            }
            if steps >= 2 {
                h.fold_word.store(i as u64, Release);
            }
            if steps >= 3 {
                retired.word(i).store(base + value, Release);
            }
            if steps >= 4 {
                slot.word(i).store(0, Release);
            }
        }
    }

    #[test]
    fn a_reading_of_a_region_left_mid_fold_ends_with_an_error() {
        let tmp = TempRegion::new("odd");
        let region = Region::create(&tmp.0, me(), None).unwrap();
        let dead = dead_pid();
        let h = &region.layout().header;
        h.fold_seq.store(7, Release);
        h.fold_lock.store(dead as u32, Release);
        let e = report::read(region.layout()).unwrap_err();
        assert_eq!(e.fold_seq, 7);
        assert_eq!(e.holder, dead);
        assert!(!e.holder_alive);
        assert!(e.to_string().contains("which is gone"), "{e}");
        let json: serde_json::Value = serde_json::from_str(&e.to_json()).unwrap();
        assert!(json["error"].as_str().unwrap().contains("inconsistent"));

        // The master's periodic recovery finishes it; readings work again.
        assert!(recover_fold(region.layout()));
        assert_eq!(h.fold_seq.load(Relaxed) % 2, 0);
        assert_eq!(h.fold_lock.load(Relaxed), 0);
        assert!(report::read(region.layout()).is_ok());
        assert!(!recover_fold(region.layout()), "nothing left to recover");
    }

    #[test]
    fn an_odd_count_under_a_free_lock_is_repaired() {
        let tmp = TempRegion::new("oddfree");
        let region = Region::create(&tmp.0, me(), None).unwrap();
        region.layout().header.fold_seq.store(3, Release);
        assert!(report::read(region.layout()).is_err());
        assert!(recover_fold(region.layout()));
        assert!(report::read(region.layout()).is_ok());
    }

    #[test]
    fn a_fold_cut_short_by_a_dead_master_is_finished_exactly() {
        let tmp = TempRegion::new("resume");
        let region = Region::create(&tmp.0, me(), None).unwrap();
        let l = region.layout();
        let a = claim_free_slot(l, 0, 1).unwrap();
        let b = claim_free_slot(l, 1, 1).unwrap();
        // Every crash point: before the first word, in the cells, in the histogram,
        // at the last word, and at each step of the protocol.
        for (word, steps) in [
            (0, 0),
            (0, 1),
            (5, 2),
            (5, 3),
            (COUNTER_CELLS + 3, 1),
            (COUNTER_CELLS + 3, 3),
            (WORDS - 1, 2),
            (WORDS - 1, 3),
            (WORDS - 1, 4),
        ] {
            fill_row(l, a, 1);
            fill_row(l, b, 1000);
            for w in l.retired.counters.words() {
                w.store(5, Relaxed);
            }
            let expected: Vec<u64> = words_of(&l.slots[a].counters)
                .iter()
                .zip(words_of(&l.slots[b].counters))
                .map(|(x, y)| 5 + x + y)
                .collect();
            die_mid_fold(l, a, word, steps, dead_pid());
            assert!(report::read(l).is_err(), "mid-fold reads as inconsistent");

            // This master folds another worker: it takes the lock over, finishes row
            // `a` from the journal, then folds `b`.
            fold_slot(l, b);
            assert_eq!(
                words_of(&l.retired.counters),
                expected,
                "crash at word {word} after {steps} steps"
            );
            assert!(words_of(&l.slots[a].counters).iter().all(|&v| v == 0));
            assert!(words_of(&l.slots[b].counters).iter().all(|&v| v == 0));
            assert_eq!(l.header.fold_lock.load(Relaxed), 0);
            assert_eq!(l.header.fold_row.load(Relaxed), 0);
            let r = report::read(l).expect("consistent again");
            assert_eq!(r.totals, r.retired);
            l.slots[a]
                .state
                .store(WorkerState::Starting as u32, Release);
            l.slots[b]
                .state
                .store(WorkerState::Starting as u32, Release);
        }
    }

    #[test]
    fn a_fold_lock_held_by_a_live_master_is_waited_for_boundedly() {
        let tmp = TempRegion::new("live");
        let region = Region::create(&tmp.0, me(), None).unwrap();
        let l = region.layout();
        let row = claim_free_slot(l, 0, 1).unwrap();
        fill_row(l, row, 1);
        let before = report::read(l).unwrap().totals;
        // pid 1 runs as long as the machine does.
        l.header.fold_lock.store(1, Release);
        fold_slot(l, row);
        // Not folded (its counts still count, in the row), but not lost, and not stuck.
        assert_eq!(report::read(l).unwrap().totals, before);
        assert_eq!(
            WorkerState::from_u32(l.slots[row].state.load(Relaxed)),
            WorkerState::Exited
        );
        assert_eq!(l.header.fold_lock.load(Relaxed), 1);
        assert!(!recover_fold(l), "a live holder's lock is not taken");
    }
}

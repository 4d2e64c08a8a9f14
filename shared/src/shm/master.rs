//! The master's writes to the region.

use super::counters::COUNTERS;
use super::layout::{Header, Layout, WorkerState, NO_WORD, WORDS};
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::time::{Duration, Instant};

/// Claims a free row (empty, or left by an exited worker whose counters were folded)
/// for a worker about to be forked. A compare-and-swap on the row's state, so two
/// masters sharing the region during a binary upgrade never claim the same row.
pub fn claim_free_slot(layout: &Layout, worker: usize, generation: u64) -> Option<usize> {
    for (index, slot) in layout.slots.iter().enumerate() {
        for free in [WorkerState::Empty, WorkerState::Exited] {
            if slot
                .state
                .compare_exchange(free as u32, WorkerState::Starting as u32, AcqRel, Relaxed)
                .is_ok()
            {
                claim_slot(layout, index, worker, generation);
                return Some(index);
            }
        }
    }
    None
}

/// Prepares slot `index` for a worker about to be forked.
pub fn claim_slot(layout: &Layout, index: usize, worker: usize, generation: u64) {
    let s = &layout.slots[index];
    s.pid.store(0, Relaxed);
    s.worker.store(worker as u32, Relaxed);
    s.generation.store(generation, Relaxed);
    s.started_ms.store(super::now_ms(), Relaxed);
    s.heartbeat_ms.store(super::monotonic_ms(), Relaxed);
    s.state.store(WorkerState::Starting as u32, Release);
    // (For `claim_free_slot` the state is already Starting; storing it again is harmless.)
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
        let retired = &layout.retired.counters;
        let slot = &layout.slots[index].counters;
        let word = h.fold_word.load(Relaxed);
        let start = if word == NO_WORD || word as usize >= WORDS {
            0
        } else {
            let w = word as usize;
            let left = slot.word(w).load(Relaxed);
            if left != 0 {
                // Not yet cleared, so `fold_base` is still this word's retired value
                // from before it was added to (whether or not the add happened).
                retired
                    .word(w)
                    .store(h.fold_base.load(Relaxed).wrapping_add(left), Relaxed);
                slot.word(w).store(0, Relaxed);
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
    let retired = &layout.retired.counters;
    let slot = &layout.slots[index].counters;
    for i in start..WORDS {
        let value = slot.word(i).load(Relaxed);
        if value == 0 {
            continue;
        }
        let base = retired.word(i).load(Relaxed);
        h.fold_base.store(base, Release);
        h.fold_word.store(i as u64, Release);
        retired.word(i).store(base.wrapping_add(value), Release);
        slot.word(i).store(0, Release);
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
    slot.state.store(WorkerState::Exited as u32, Release);
    layout.header.fold_row.store(0, Release);
}

/// Whether `pid` names a running process (a zombie has stopped running: it holds no
/// lock any more, it only waits to be reaped).
pub fn process_alive(pid: i32) -> bool {
    use nix::errno::Errno;
    if pid <= 0 {
        return false;
    }
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
        Ok(()) | Err(Errno::EPERM) => {}
        Err(_) => return false,
    }
    // `/proc/PID/stat`: "pid (comm) S ...", the state after the last ')'.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !matches!(
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next()),
            Some('Z' | 'X')
        ),
        Err(_) => true,
    }
}

/// Marks a slot unused (its worker's counters must have been folded).
pub fn release_slot(layout: &Layout, index: usize) {
    layout.slots[index]
        .state
        .store(WorkerState::Empty as u32, Release);
    layout.slots[index].pid.store(0, Relaxed);
}

/// A region cell that names another counter than this build's counter of that id: the
/// builds cannot share the region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterMismatch {
    pub cell: usize,
    pub region: String,
    pub ours: &'static str,
}

/// Names this build's counters in the region's name table, after checking that each
/// of their cells is unnamed or names the same counter already. Cells this build does
/// not know (a newer build's) keep their names, and their values are folded like any
/// other: a rollback to that build finds them intact.
pub fn adopt_counter_names(header: &Header) -> Result<(), CounterMismatch> {
    for def in COUNTERS {
        let region = header.counter_names[def.counter.cell()].get();
        if !region.is_empty() && region != def.name {
            return Err(CounterMismatch {
                cell: def.counter.cell(),
                region,
                ours: def.name,
            });
        }
    }
    let mut count = header.counter_count.load(Acquire);
    for def in COUNTERS {
        let name = &header.counter_names[def.counter.cell()];
        if name.get().is_empty() {
            name.set(def.name);
        }
        count = count.max(def.counter.cell() as u32 + 1);
    }
    header.counter_count.store(count, Release);
    Ok(())
}

/// Reads `TcpExt: ListenOverflows` from /proc/net/netstat.
pub fn read_listen_overflows() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/net/netstat").ok()?;
    let mut lines = text.lines();
    while let Some(names) = lines.next() {
        let values = lines.next()?;
        if !names.starts_with("TcpExt:") {
            continue;
        }
        let i = names
            .split_whitespace()
            .position(|n| n == "ListenOverflows")?;
        return values.split_whitespace().nth(i)?.parse().ok();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::counters::{Counter, COUNTER_CELLS as COUNTER_CELLS_FOR_TEST, REQUESTS};
    use crate::shm::testing::{dead_pid, TempRegion};
    use crate::shm::{report, Region};

    fn me() -> i32 {
        std::process::id() as i32
    }

    /// What an older build with the first `n` counters of the table (by id) leaves in
    /// a region: names for those only, and counts in those cells only.
    fn make_older(layout: &Layout, n: usize) -> Vec<Counter> {
        let mut ids: Vec<Counter> = COUNTERS.iter().map(|d| d.counter).collect();
        ids.sort_by_key(|c| c.0);
        let (kept, newer) = ids.split_at(n);
        for c in newer {
            layout.header.counter_names[c.cell()].set("");
        }
        layout
            .header
            .counter_count
            .store(kept.last().map_or(0, |c| c.cell() as u32 + 1), Release);
        kept.to_vec()
    }

    #[test]
    fn a_build_with_more_counters_folds_an_older_builds_rows_exactly() {
        let tmp = TempRegion::new("grow");
        let k = 3;
        let n = COUNTERS.len() - k;
        let older = Region::create(&tmp.0, me(), None).unwrap();
        let l = older.layout();
        let kept = make_older(l, n);
        // The older build's worker counted in its cells, and an earlier fold left
        // retired totals.
        let row = claim_free_slot(l, 0, 1).unwrap();
        for (i, c) in kept.iter().enumerate() {
            l.slots[row].counters.bump(*c, 10 + i as u64);
            l.retired.counters.bump(*c, 1000);
        }
        l.slots[row].counters.latency.record(250);
        l.slots[row]
            .state
            .store(WorkerState::Serving as u32, Release);

        // The newer build attaches (binary upgrade), and folds the older worker's row
        // when it exits.
        let newer = Region::attach(&tmp.0, me()).unwrap();
        let nl = newer.layout();
        assert_eq!(
            nl.header.counter_count.load(Relaxed) as usize,
            COUNTERS.iter().map(|d| d.counter.cell() + 1).max().unwrap()
        );
        for def in COUNTERS {
            assert_eq!(nl.header.counter_names[def.counter.cell()].get(), def.name);
        }
        let before = report::read(nl).unwrap();
        fold_slot(nl, row);
        let after = report::read(nl).unwrap();
        assert_eq!(after.totals, before.totals, "a fold changes no total");
        for (i, c) in kept.iter().enumerate() {
            assert_eq!(after.retired[*c], 1000 + 10 + i as u64);
        }
        for def in COUNTERS.iter().filter(|d| !kept.contains(&d.counter)) {
            assert_eq!(after.totals[def.counter], 0, "{}", def.name);
        }
        assert_eq!(after.retired.latency.count, 1);
        let json: serde_json::Value = serde_json::from_str(&after.to_json()).unwrap();
        for def in COUNTERS {
            assert!(json["totals"][def.name].is_u64(), "{}", def.name);
        }
        assert_eq!(json["totals"]["requests"], after.totals[REQUESTS]);
    }

    #[test]
    fn counters_of_a_newer_build_survive_a_fold_by_an_older_one() {
        let tmp = TempRegion::new("future");
        let newer = Region::create(&tmp.0, me(), None).unwrap();
        let l = newer.layout();
        let future = Counter(40);
        assert!(COUNTERS.iter().all(|d| d.counter != future));
        l.header.counter_names[future.cell()].set("future_counter");
        l.header.counter_count.store(41, Release);
        let row = claim_free_slot(l, 0, 1).unwrap();
        l.slots[row].counters.bump(future, 7);
        l.retired.counters.bump(future, 5);

        // This build attaches (a rollback to it, say) and folds the row.
        let this = Region::attach(&tmp.0, me()).unwrap();
        fold_slot(this.layout(), row);
        let after = report::read(this.layout()).unwrap();
        assert_eq!(after.retired[future], 12);
        assert_eq!(after.totals[future], 12);
        assert_eq!(this.layout().header.counter_count.load(Relaxed), 41);
        assert_eq!(
            this.layout().header.counter_names[future.cell()].get(),
            "future_counter"
        );
        assert!(!after.to_json().contains("future_counter"));
    }

    #[test]
    fn a_region_whose_cell_names_another_counter_is_not_shared() {
        let tmp = TempRegion::new("mismatch");
        let other = Region::create(&tmp.0, me(), None).unwrap();
        other.layout().header.counter_names[REQUESTS.cell()].set("requests_v2");
        match Region::attach(&tmp.0, me()) {
            Err(crate::shm::ShmError::Counters { mismatch, .. }) => {
                assert_eq!(mismatch.cell, REQUESTS.cell());
                assert_eq!(mismatch.region, "requests_v2");
                assert_eq!(mismatch.ours, "requests");
            }
            Err(e) => panic!("wrong error: {e}"),
            Ok(_) => panic!("attached a region counting another counter in a cell"),
        }
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
            (COUNTER_CELLS_FOR_TEST + 3, 1),
            (COUNTER_CELLS_FOR_TEST + 3, 3),
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

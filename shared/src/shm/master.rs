//! The master's writes to the region.

pub use super::cells::CounterMismatch;
use super::counters::COUNTERS;
use super::layout::{Header, Layout, WorkerState};
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};

pub use super::fold::{fold_slot, recover_fold, LOCK_PATIENCE};

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

/// Marks a slot unused (its worker's counters must have been folded).
pub fn release_slot(layout: &Layout, index: usize) {
    layout.slots[index]
        .state
        .store(WorkerState::Empty as u32, Release);
    layout.slots[index].pid.store(0, Relaxed);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::counters::{Counter, REQUESTS};
    use crate::shm::testing::TempRegion;
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
        // The highest named id plus one: the future counter's, or this build's own.
        let ours = COUNTERS
            .iter()
            .map(|d| d.counter.cell() + 1)
            .max()
            .unwrap_or(0) as u32;
        assert_eq!(
            this.layout().header.counter_count.load(Relaxed),
            ours.max(41)
        );
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
}

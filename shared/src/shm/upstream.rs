//! The upstream area of the region, appended after the worker rows: per upstream
//! server (a *cell*), the counters of `upstream_counters`, a histogram of the time to
//! the response head, and two gauges, in one row per worker slot (written only by
//! that slot's worker) plus the retired totals (written by the master when it folds
//! an exited worker's row, see `fold`).
//!
//! ```text
//! UpstreamArea
//!  ├── UpstreamHeader   counter name table, the label table: cell -> (upstream, server)
//!  ├── retired[64]      totals of exited workers, per cell
//!  └── rows[256][64]    per worker slot, per cell
//! ```
//!
//! **Identity.** The master writes the label table whenever it publishes a
//! configuration (start, reload, upgrade, rollback): each `(upstream name, server
//! label as written)` of the configuration keeps the cell it had, or takes a free
//! one. A cell whose server left the configuration keeps its label (state `Kept`)
//! and so its totals; it is given to another label only when no never-used cell is
//! left and it holds no counts. A worker maps its configuration's `(upstream index,
//! server index)` to cells when it adopts the configuration ([`lookup`]).
//!
//! **Capacity.** [`UPSTREAM_CELLS`] servers (all upstreams together, from
//! `crate::capacity`); a configuration with more, or with a name or label too long for
//! the table, is refused by `config` validation (`-t`, start, reload), since a server
//! without a cell is neither counted nor health-checked (always "usable"). What is
//! left here is a reload whose new servers find every cell configured or kept with
//! counts: a warning per server left out, and those servers are not counted (their
//! requests are still served). Memory: a cell is 384 bytes, a row 24 KiB, the area
//! 6 MiB of file (pages are only touched for cells in use); growing it would change
//! the layout a binary upgrade shares with the old master.

use super::cells::{bump, CounterMismatch, CounterName, Text};
use super::counters::Counter;
use super::upstream_counters::{UPSTREAM_COUNTERS, UPSTREAM_COUNTER_CELLS};
use crate::capacity::MAX_SLOTS;
use std::sync::atomic::{
    AtomicU32, AtomicU64, Ordering::Acquire, Ordering::Relaxed, Ordering::Release,
};

pub use crate::capacity::{SERVER_LABEL_BYTES, UPSTREAM_CELLS, UPSTREAM_NAME_BYTES};

/// Buckets of the upstream response-time histogram: powers of two of microseconds,
/// `[0, 128)`, `[128, 256)`, ..., `[2^28, 2^29)`, and `[2^29, ∞)` (2^29 µs ≈ 9 min).
/// Coarser than the request histogram (528 buckets, 3% wide): 256 worker rows × 64
/// cells of those would be 70 MiB; 24 buckets keep the area at 6 MiB, and a factor
/// of two is what Prometheus buckets are anyway.
pub const TIME_BUCKETS: usize = 24;

/// The bucket a time of `us` microseconds falls in.
#[inline]
pub fn time_bucket(us: u64) -> usize {
    if us < 128 {
        return 0;
    }
    let e = 63 - us.leading_zeros() as usize; // >= 7
    (e - 6).min(TIME_BUCKETS - 1)
}

/// The upper edge (exclusive) of bucket `i` in µs; None for the last.
pub fn time_bucket_high(i: usize) -> Option<u64> {
    (i + 1 < TIME_BUCKETS).then(|| 1u64 << (i + 7))
}

#[repr(C)]
pub struct TimeHistogram {
    pub buckets: [AtomicU64; TIME_BUCKETS],
    pub sum_us: AtomicU64,
    pub count: AtomicU64,
}

/// One upstream server's counts in one row.
#[repr(C, align(64))]
pub struct UpstreamCell {
    pub cells: [AtomicU64; UPSTREAM_COUNTER_CELLS],
    /// Time from the request being sent to the response head.
    pub head_time: TimeHistogram,
    /// Gauges (not folded: cleared when the row is folded): this worker's open
    /// connections to the server, and how many of them are idle in its pool.
    pub open: AtomicU64,
    pub idle: AtomicU64,
}

/// Counted words of an [`UpstreamCell`] (folded and summed): the cells, the
/// histogram's buckets, its sum and count. The gauges follow them.
pub const CELL_WORDS: usize = UPSTREAM_COUNTER_CELLS + TIME_BUCKETS + 2;

impl UpstreamCell {
    #[inline]
    pub fn bump(&self, c: Counter, n: u64) {
        bump(&self.cells[c.cell()], n);
    }

    #[inline]
    pub fn record_time(&self, us: u64) {
        bump(&self.head_time.buckets[time_bucket(us)], 1);
        bump(&self.head_time.sum_us, us);
        bump(&self.head_time.count, 1);
    }

    /// Counted word `i` (see [`CELL_WORDS`]).
    pub fn word(&self, i: usize) -> &AtomicU64 {
        if i < UPSTREAM_COUNTER_CELLS {
            &self.cells[i]
        } else if i < UPSTREAM_COUNTER_CELLS + TIME_BUCKETS {
            &self.head_time.buckets[i - UPSTREAM_COUNTER_CELLS]
        } else if i == UPSTREAM_COUNTER_CELLS + TIME_BUCKETS {
            &self.head_time.sum_us
        } else {
            &self.head_time.count
        }
    }

    pub fn has_counts(&self) -> bool {
        (0..CELL_WORDS).any(|i| self.word(i).load(Relaxed) != 0)
    }
}

/// What a cell of the label table is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LabelState {
    /// Never used (or reclaimed): no label, no counts.
    Free = 0,
    /// A server of the configuration last published.
    Configured = 1,
    /// A server no longer configured, kept with its label so its totals stay its own.
    Kept = 2,
}

impl LabelState {
    pub fn from_u32(v: u32) -> LabelState {
        match v {
            1 => LabelState::Configured,
            2 => LabelState::Kept,
            _ => LabelState::Free,
        }
    }
}

#[repr(C)]
pub struct UpstreamLabel {
    pub state: AtomicU32,
    pub upstream: Text<UPSTREAM_NAME_BYTES>,
    pub server: Text<SERVER_LABEL_BYTES>,
}

#[repr(C, align(64))]
pub struct UpstreamHeader {
    /// Cells of `counter_names` that carry a name (highest named id plus one).
    pub counter_count: AtomicU32,
    /// Bumped (odd while writing) each time a master rewrites the label table.
    pub labels_seq: AtomicU32,
    pub counter_names: [CounterName; UPSTREAM_COUNTER_CELLS],
    pub labels: [UpstreamLabel; UPSTREAM_CELLS],
}

#[repr(C, align(4096))]
pub struct UpstreamArea {
    pub header: UpstreamHeader,
    pub retired: [UpstreamCell; UPSTREAM_CELLS],
    /// `rows[slot]`: the worker in region slot `slot`.
    pub rows: [[UpstreamCell; UPSTREAM_CELLS]; MAX_SLOTS],
}

/// Names this build's upstream counters in the area's name table, after checking that
/// each of their cells is unnamed or names the same counter (see
/// `master::adopt_counter_names`).
pub fn adopt_counter_names(area: &UpstreamArea) -> Result<(), CounterMismatch> {
    let h = &area.header;
    for def in UPSTREAM_COUNTERS {
        let region = h.counter_names[def.counter.cell()].get();
        if !region.is_empty() && region != def.name {
            return Err(CounterMismatch {
                cell: def.counter.cell(),
                region,
                ours: def.name,
            });
        }
    }
    let mut count = h.counter_count.load(Acquire);
    for def in UPSTREAM_COUNTERS {
        let name = &h.counter_names[def.counter.cell()];
        if name.get().is_empty() {
            name.set(def.name);
        }
        count = count.max(def.counter.cell() as u32 + 1);
    }
    h.counter_count.store(count, Release);
    Ok(())
}

/// Whether cell `cell` holds counts anywhere (retired or any row).
fn cell_has_counts(area: &UpstreamArea, cell: usize) -> bool {
    area.retired[cell].has_counts() || area.rows.iter().any(|row| row[cell].has_counts())
}

/// A server of the configuration that the label table could not take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotCounted {
    pub upstream: String,
    pub server: String,
    pub why: &'static str,
}

impl std::fmt::Display for NotCounted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "upstream \"{}\" server \"{}\" is not counted in the stats: {}",
            self.upstream, self.server, self.why
        )
    }
}

/// Writes the label table for a configuration's upstream servers (`wanted`: each
/// upstream's name and its servers' labels, as `config::upstream_labels` gives them).
/// Kept labels keep their cells; new ones take a free cell. Returns the servers left
/// out, for the master to warn about.
pub fn publish_labels(area: &UpstreamArea, wanted: &[(String, Vec<String>)]) -> Vec<NotCounted> {
    let h = &area.header;
    let seq = h.labels_seq.load(Relaxed) | 1;
    h.labels_seq.store(seq, Relaxed);
    std::sync::atomic::fence(Release);
    let mut current: Vec<(LabelState, String, String)> = h
        .labels
        .iter()
        .map(|l| {
            let state = LabelState::from_u32(l.state.load(Acquire));
            match state {
                LabelState::Free => (state, String::new(), String::new()),
                _ => (state, l.upstream.get(), l.server.get()),
            }
        })
        .collect();
    let mut configured = [false; UPSTREAM_CELLS];
    let mut left_out = Vec::new();
    // First the servers that have a cell already (so none of those is reclaimed for
    // a new one), then the new ones.
    let mut new: Vec<(&String, &String)> = Vec::new();
    for (upstream, servers) in wanted {
        for server in servers {
            let why = if upstream.len() > UPSTREAM_NAME_BYTES {
                Some("its upstream's name is longer than the stats region's label table holds (64 bytes)")
            } else if server.len() > SERVER_LABEL_BYTES {
                Some("its address is longer than the stats region's label table holds (184 bytes)")
            } else {
                None
            };
            if let Some(why) = why {
                left_out.push(NotCounted {
                    upstream: upstream.clone(),
                    server: server.clone(),
                    why,
                });
                continue;
            }
            match current.iter().position(|(state, u, s)| {
                *state != LabelState::Free && u == upstream && s == server
            }) {
                Some(cell) => configured[cell] = true,
                None if !new.contains(&(upstream, server)) => new.push((upstream, server)),
                None => {}
            }
        }
    }
    for (upstream, server) in new {
        // A never-used cell first; then one kept for a server that has left and
        // holds no counts.
        let cell = current
            .iter()
            .position(|(state, _, _)| *state == LabelState::Free)
            .or_else(|| (0..UPSTREAM_CELLS).find(|&i| !configured[i] && !cell_has_counts(area, i)));
        let Some(cell) = cell else {
            left_out.push(NotCounted {
                upstream: upstream.clone(),
                server: server.clone(),
                why: "the stats region counts at most 64 upstream servers",
            });
            continue;
        };
        let label = &h.labels[cell];
        label.state.store(LabelState::Free as u32, Release);
        label.upstream.set(upstream);
        label.server.set(server);
        current[cell] = (LabelState::Configured, upstream.clone(), server.clone());
        configured[cell] = true;
    }
    for (i, (state, _, _)) in current.iter_mut().enumerate() {
        let new = match (*state, configured[i]) {
            (_, true) => LabelState::Configured,
            (LabelState::Free, false) => LabelState::Free,
            (_, false) => LabelState::Kept,
        };
        *state = new;
        h.labels[i].state.store(new as u32, Release);
    }
    h.labels_seq.store(seq.wrapping_add(1), Release);
    left_out
}

/// Each upstream's name and its servers' labels (the addresses as written), in the
/// configuration's order: what [`publish_labels`] and a worker's lookups work from.
pub fn config_labels(config: &crate::config::Config) -> Vec<(String, Vec<String>)> {
    config
        .upstreams
        .iter()
        .map(|u| {
            (
                u.name.clone(),
                u.servers.iter().map(|s| s.label.clone()).collect(),
            )
        })
        .collect()
}

/// The cell the master gave `(upstream, server)` in the configuration it published
/// last; None if it is not counted.
pub fn lookup(area: &UpstreamArea, upstream: &str, server: &str) -> Option<usize> {
    area.header.labels.iter().position(|l| {
        LabelState::from_u32(l.state.load(Acquire)) == LabelState::Configured
            && l.upstream.get() == upstream
            && l.server.get() == server
    })
}

/// Counted words of the whole upstream part of one row (see `fold`): the cells of
/// [`UPSTREAM_CELLS`] one after the other.
pub const ROW_WORDS: usize = UPSTREAM_CELLS * CELL_WORDS;

/// Counted word `i` (below [`ROW_WORDS`]) of a row of cells.
pub fn row_word(row: &[UpstreamCell; UPSTREAM_CELLS], i: usize) -> &AtomicU64 {
    row[i / CELL_WORDS].word(i % CELL_WORDS)
}

/// Clears the gauges of slot `index`'s row (its worker has exited).
pub fn clear_gauges(area: &UpstreamArea, index: usize) {
    for cell in &area.rows[index] {
        cell.open.store(0, Relaxed);
        cell.idle.store(0, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::testing::TempRegion;
    use crate::shm::Region;

    #[test]
    fn time_buckets_are_powers_of_two() {
        assert_eq!(time_bucket(0), 0);
        assert_eq!(time_bucket(127), 0);
        assert_eq!(time_bucket(128), 1);
        assert_eq!(time_bucket(255), 1);
        assert_eq!(time_bucket(256), 2);
        assert_eq!(time_bucket(u64::MAX), TIME_BUCKETS - 1);
        for i in 0..TIME_BUCKETS - 1 {
            let high = time_bucket_high(i).unwrap();
            assert_eq!(time_bucket(high - 1), i);
            assert_eq!(time_bucket(high), i + 1);
        }
        assert_eq!(time_bucket_high(TIME_BUCKETS - 1), None);
    }

    #[test]
    fn cells_are_cache_line_sized() {
        assert_eq!(std::mem::size_of::<UpstreamCell>(), 384);
        assert!(std::mem::size_of::<UpstreamArea>() < 7 << 20);
    }

    fn wanted(list: &[(&str, &[&str])]) -> Vec<(String, Vec<String>)> {
        list.iter()
            .map(|(u, s)| (u.to_string(), s.iter().map(|s| s.to_string()).collect()))
            .collect()
    }

    #[test]
    fn a_kept_server_keeps_its_cell_and_a_removed_one_its_counts() {
        let tmp = TempRegion::new("labels");
        let region = Region::create(&tmp.0, 1, None).unwrap();
        let l = region.layout();
        let a = &l.upstreams;
        assert!(publish_labels(
            a,
            &wanted(&[("app", &["127.0.0.1:9000", "127.0.0.1:9001"])])
        )
        .is_empty());
        let c0 = lookup(a, "app", "127.0.0.1:9000").unwrap();
        let c1 = lookup(a, "app", "127.0.0.1:9001").unwrap();
        assert_ne!(c0, c1);
        a.rows[3][c1].bump(super::super::upstream_counters::REQUESTS, 5);

        // 9001 leaves, 9002 and another upstream arrive.
        publish_labels(
            a,
            &wanted(&[
                ("app", &["127.0.0.1:9000", "127.0.0.1:9002"]),
                ("auth", &["unix:/run/a.sock"]),
            ]),
        );
        assert_eq!(lookup(a, "app", "127.0.0.1:9000"), Some(c0));
        assert_eq!(lookup(a, "app", "127.0.0.1:9001"), None, "not configured");
        let c2 = lookup(a, "app", "127.0.0.1:9002").unwrap();
        let c3 = lookup(a, "auth", "unix:/run/a.sock").unwrap();
        assert!(![c0, c1].contains(&c2) && ![c0, c1, c2].contains(&c3));
        assert_eq!(
            LabelState::from_u32(a.header.labels[c1].state.load(Relaxed)),
            LabelState::Kept
        );
        assert_eq!(a.header.labels[c1].server.get(), "127.0.0.1:9001");

        // 9001 comes back: its cell, with its counts.
        publish_labels(&l.upstreams, &wanted(&[("app", &["127.0.0.1:9001"])]));
        assert_eq!(lookup(a, "app", "127.0.0.1:9001"), Some(c1));
        assert_eq!(a.rows[3][c1].cells[0].load(Relaxed), 5);
    }

    #[test]
    fn servers_beyond_the_capacity_are_left_out_with_a_reason() {
        let tmp = TempRegion::new("capacity");
        let region = Region::create(&tmp.0, 1, None).unwrap();
        let l = region.layout();
        let servers: Vec<String> = (0..UPSTREAM_CELLS + 2)
            .map(|i| format!("10.0.0.1:{}", 1000 + i))
            .collect();
        let long = "x".repeat(SERVER_LABEL_BYTES + 1);
        let mut want = vec![("big".to_string(), servers.clone())];
        want.push(("other".to_string(), vec![long.clone()]));
        let left = publish_labels(&l.upstreams, &want);
        assert_eq!(left.len(), 3, "{left:?}");
        assert_eq!(left[0].server, long);
        assert!(left[0].why.contains("longer"));
        assert_eq!(left[1].server, servers[UPSTREAM_CELLS]);
        assert_eq!(left[2].server, servers[UPSTREAM_CELLS + 1]);
        assert!(left[1].to_string().contains("at most 64"), "{}", left[1]);
        assert_eq!(
            lookup(&l.upstreams, "big", &servers[UPSTREAM_CELLS - 1]),
            Some(UPSTREAM_CELLS - 1)
        );

        // A smaller configuration: cells of servers that left without counts are
        // reclaimed once no never-used cell is left.
        l.upstreams.retired[0].bump(super::super::upstream_counters::RETRIES, 1);
        let left = publish_labels(
            &l.upstreams,
            &wanted(&[("new", &["10.9.9.9:1", "10.9.9.9:2"])]),
        );
        assert!(left.is_empty());
        let c = lookup(&l.upstreams, "new", "10.9.9.9:1").unwrap();
        assert_ne!(c, 0, "a cell with counts is never given to another server");
        assert_eq!(l.upstreams.header.labels[0].server.get(), servers[0]);
    }

    /// A region as a build before the upstream area leaves it: the file ends at
    /// `LEGACY_SIZE`, with counts in a worker row and the retired totals.
    #[test]
    fn attaching_to_a_region_without_the_upstream_area_extends_it_and_keeps_every_total() {
        use crate::shm::counters::{BYTES_OUT, REQUESTS};
        use crate::shm::layout::{WorkerState, LEGACY_SIZE};
        use crate::shm::master::{claim_free_slot, fold_slot};
        use crate::shm::{report, RegionReader};
        let tmp = TempRegion::new("grow-area");
        let me = std::process::id() as i32;
        let row;
        {
            let old = Region::create(&tmp.0, me, None).unwrap();
            let l = old.layout();
            row = claim_free_slot(l, 0, 1).unwrap();
            l.slots[row].counters.bump(REQUESTS, 7);
            l.slots[row].counters.latency.record(300);
            l.retired.counters.bump(REQUESTS, 100);
            l.retired.counters.bump(BYTES_OUT, 5000);
            l.slots[row]
                .state
                .store(WorkerState::Serving as u32, Release);
            l.header.region_size.store(LEGACY_SIZE as u64, Relaxed);
        }
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&tmp.0)
            .unwrap();
        file.set_len(LEGACY_SIZE as u64).unwrap();
        drop(file);
        // A reader of this build reads it (no upstreams yet), and keeps reading it
        // through the upgrade.
        let reader = RegionReader::open(&tmp.0).expect("a reader maps the shorter region");
        let old = reader.report().unwrap();
        assert_eq!(old.totals[REQUESTS], 107);
        assert!(old.upstreams.is_empty());

        // The new master (binary upgrade) attaches: the file grows, totals stay.
        let new = Region::attach(&tmp.0, me).expect("attaches to the shorter region");
        let size = std::fs::metadata(&tmp.0).unwrap().len() as usize;
        assert_eq!(size, crate::shm::mapping::REGION_SIZE);
        let l = new.layout();
        assert_eq!(l.header.region_size.load(Relaxed) as usize, size);
        assert_eq!(l.upstreams.header.counter_names[0].get(), "requests");
        let before = report::read(l).unwrap();
        assert_eq!(before.totals[REQUESTS], 107);
        assert_eq!(before.totals[BYTES_OUT], 5000);
        assert_eq!(before.totals.latency.count, 1);
        assert!(before.upstreams.is_empty());

        // Its configuration's upstreams get cells, counted by a worker, folded
        // with the old row when that worker exits.
        publish_labels(&l.upstreams, &wanted(&[("app", &["127.0.0.1:9000"])]));
        let c = lookup(&l.upstreams, "app", "127.0.0.1:9000").unwrap();
        l.upstreams.rows[row][c].bump(super::super::upstream_counters::REQUESTS, 3);
        l.upstreams.rows[row][c].record_time(1500);
        l.upstreams.rows[row][c].open.store(2, Relaxed);
        fold_slot(l, row);
        let after = report::read(l).unwrap();
        assert_eq!(after.totals, before.totals);
        assert_eq!(after.retired[REQUESTS], 107);
        assert_eq!(after.upstreams.len(), 1);
        let u = &after.upstreams[0];
        assert_eq!(
            (u.upstream.as_str(), u.server.as_str()),
            ("app", "127.0.0.1:9000")
        );
        assert_eq!(u.values[super::super::upstream_counters::REQUESTS], 3);
        assert_eq!(u.values.head_time_count, 1);
        assert_eq!(u.values.open, 0, "an exited worker's gauges are cleared");
        assert!(!l.upstreams.rows[row][c].has_counts());
        let seen = reader.report().unwrap();
        assert_eq!(seen.totals[REQUESTS], 107);
        assert_eq!(
            seen.upstreams, after.upstreams,
            "the early reader sees the area"
        );
        drop(new);
    }
}

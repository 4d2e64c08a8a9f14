//! Counter values read out of the region: one row's, or a sum of rows. Serialised to
//! JSON from the counter table, so a new counter appears in `forkd stats --json` and
//! the `Status` route without further code.

use super::cells::{bucket_bounds, Counters, BUCKETS};
use super::counters::{Counter, COUNTERS, COUNTER_CELLS};
use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;
use std::sync::atomic::Ordering::Relaxed;

/// The latency histogram's values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LatencyValues {
    pub buckets: Vec<u64>,
    pub sum_us: u64,
    pub count: u64,
}

/// The values of one row's counters (a worker's, the retired totals, or a sum). Holds
/// every cell of the row, also those this build has no name for (a newer build's), so
/// sums carry them too.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterValues {
    pub cells: [u64; COUNTER_CELLS],
    pub latency: LatencyValues,
}

impl Default for CounterValues {
    fn default() -> Self {
        CounterValues {
            cells: [0; COUNTER_CELLS],
            latency: LatencyValues {
                buckets: vec![0; BUCKETS],
                sum_us: 0,
                count: 0,
            },
        }
    }
}

impl std::ops::Index<Counter> for CounterValues {
    type Output = u64;
    fn index(&self, c: Counter) -> &u64 {
        &self.cells[c.cell()]
    }
}

impl std::ops::IndexMut<Counter> for CounterValues {
    fn index_mut(&mut self, c: Counter) -> &mut u64 {
        &mut self.cells[c.cell()]
    }
}

impl CounterValues {
    /// Every cell of a row (relaxed loads: the caller makes the reading consistent).
    pub fn read(c: &Counters) -> CounterValues {
        CounterValues {
            cells: std::array::from_fn(|i| c.cells[i].load(Relaxed)),
            latency: LatencyValues {
                buckets: c.latency.buckets.iter().map(|b| b.load(Relaxed)).collect(),
                sum_us: c.latency.sum_us.load(Relaxed),
                count: c.latency.count.load(Relaxed),
            },
        }
    }

    /// Adds `o`, cell by cell.
    pub fn add(&mut self, o: &CounterValues) {
        for (a, b) in self.cells.iter_mut().zip(&o.cells) {
            *a = a.wrapping_add(*b);
        }
        for (a, b) in self.latency.buckets.iter_mut().zip(&o.latency.buckets) {
            *a = a.wrapping_add(*b);
        }
        self.latency.sum_us = self.latency.sum_us.wrapping_add(o.latency.sum_us);
        self.latency.count = self.latency.count.wrapping_add(o.latency.count);
    }

    /// The `q` quantile (0..=1) of request latency in µs: the midpoint of the bucket
    /// holding it (within 3.1% of the true value). None without requests.
    pub fn percentile(&self, q: f64) -> Option<u64> {
        let total: u64 = self.latency.buckets.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (i, &n) in self.latency.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                let (lo, hi) = bucket_bounds(i);
                return Some(if hi - lo == 1 { lo } else { (lo + hi) / 2 });
            }
        }
        None
    }
}

/// `{"<name>": n, ..., "latency": {...}}`: every counter of the table by name.
impl Serialize for CounterValues {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(COUNTERS.len() + 1))?;
        for def in COUNTERS {
            map.serialize_entry(def.name, &self[def.counter])?;
        }
        map.serialize_entry("latency", &LatencyJson::of(self))?;
        map.end()
    }
}

#[derive(Serialize)]
struct LatencyJson {
    count: u64,
    sum_us: u64,
    p50_us: Option<u64>,
    p90_us: Option<u64>,
    p99_us: Option<u64>,
    p999_us: Option<u64>,
    /// Only non-empty buckets, as `[low_us, high_us, count]`.
    buckets: Vec<[u64; 3]>,
}

impl LatencyJson {
    fn of(c: &CounterValues) -> LatencyJson {
        LatencyJson {
            count: c.latency.count,
            sum_us: c.latency.sum_us,
            p50_us: c.percentile(0.5),
            p90_us: c.percentile(0.9),
            p99_us: c.percentile(0.99),
            p999_us: c.percentile(0.999),
            buckets: c
                .latency
                .buckets
                .iter()
                .enumerate()
                .filter(|(_, &n)| n > 0)
                .map(|(i, &n)| {
                    let (lo, hi) = bucket_bounds(i);
                    [lo, hi, n]
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_has_every_counter_by_name() {
        let mut c = CounterValues::default();
        for (i, def) in COUNTERS.iter().enumerate() {
            c[def.counter] = 1000 + i as u64;
        }
        let v: serde_json::Value = serde_json::to_value(&c).unwrap();
        for (i, def) in COUNTERS.iter().enumerate() {
            assert_eq!(v[def.name], 1000 + i as u64, "{}", def.name);
        }
        assert_eq!(v["latency"]["count"], 0);
        assert!(v["latency"]["p50_us"].is_null());
    }
}

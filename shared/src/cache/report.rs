//! A zone's figures, read from its index header by any process (`forkd cache stats`,
//! the workers' `/metrics`): entries, bytes against `max_size`, and the counters every
//! worker adds to.

use super::index::{counters, Index};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::Ordering::Relaxed;

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ZoneReport {
    pub zone: String,
    pub entries: u64,
    pub bytes: u64,
    pub max_size: u64,
    pub index_entries: u64,
    /// The loader has put the files on disk into the index.
    pub loaded: bool,
    pub counters: BTreeMap<&'static str, u64>,
}

pub fn zone_report(zone: &str, index: &Index, max_size: u64) -> ZoneReport {
    let h = index.header;
    ZoneReport {
        zone: zone.to_string(),
        entries: h.count.load(Relaxed),
        bytes: h.bytes.load(Relaxed),
        max_size,
        index_entries: index.slots.len() as u64,
        loaded: h.loaded.load(Relaxed) == 1,
        counters: counters::NAMES
            .iter()
            .enumerate()
            .map(|(i, n)| (*n, index.counter(i)))
            .collect(),
    }
}

/// Prometheus text: `forkd_cache_<counter>_total{zone="..."}` and the gauges.
pub fn prometheus(reports: &[ZoneReport]) -> String {
    let mut out = String::new();
    if reports.is_empty() {
        return out;
    }
    type Gauge = (&'static str, &'static str, fn(&ZoneReport) -> u64);
    let gauges: [Gauge; 3] = [
        ("entries", "Entries in the zone's index.", |r| r.entries),
        ("bytes", "Bytes of the zone's body files.", |r| r.bytes),
        ("max_bytes", "The zone's max_size.", |r| r.max_size),
    ];
    for (name, help, value) in gauges {
        let _ = writeln!(out, "# HELP forkd_cache_{name} {help}");
        let _ = writeln!(out, "# TYPE forkd_cache_{name} gauge");
        for r in reports {
            let _ = writeln!(
                out,
                "forkd_cache_{name}{{zone=\"{}\"}} {}",
                r.zone,
                value(r)
            );
        }
    }
    for name in counters::NAMES {
        let _ = writeln!(
            out,
            "# HELP forkd_cache_{name}_total Cache zone counter `{name}`."
        );
        let _ = writeln!(out, "# TYPE forkd_cache_{name}_total counter");
        for r in reports {
            let v = r.counters.get(name).copied().unwrap_or(0);
            let _ = writeln!(out, "forkd_cache_{name}_total{{zone=\"{}\"}} {v}", r.zone);
        }
    }
    out
}

/// JSON: an array of zones.
pub fn json(reports: &[ZoneReport]) -> String {
    serde_json::to_string_pretty(reports).expect("plain fields serialise")
}

/// A table, one zone per block.
pub fn table(reports: &[ZoneReport]) -> String {
    let mut out = String::new();
    for r in reports {
        let _ = writeln!(
            out,
            "zone {}: {} entries of {}, {} of {} bytes{}",
            r.zone,
            r.entries,
            r.index_entries,
            r.bytes,
            r.max_size,
            if r.loaded { "" } else { " (loading)" }
        );
        for (k, v) in &r.counters {
            let _ = writeln!(out, "  {k:<18} {v}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::index::tests::Owned;

    #[test]
    fn figures_come_from_the_index_header() {
        let o = Owned::new(64);
        let ix = o.index();
        ix.bump(counters::HITS, 3);
        let r = zone_report("pages", &ix, 1000);
        assert_eq!(r.counters["hits"], 3);
        assert_eq!(r.index_entries, 64);
        let p = prometheus(std::slice::from_ref(&r));
        assert!(
            p.contains("forkd_cache_hits_total{zone=\"pages\"} 3\n"),
            "{p}"
        );
        assert!(p.contains("forkd_cache_max_bytes{zone=\"pages\"} 1000\n"));
        assert!(table(&[r]).contains("hits"));
    }
}

//! The worker's cache zones: each zone of the configuration with its index mapped
//! (`forkd_shared::cache::IndexFile`), mapped again when a reload changes the zone or
//! the master made its index anew. A zone whose index cannot be mapped is logged
//! once and treated as empty: its routes proxy without a cache, never fail.

use forkd_shared::cache::{current_id, Index, IndexFile, KeyHash};
use forkd_shared::config::cache::CacheZone;
use forkd_shared::config::Config;
use std::path::PathBuf;
use std::sync::Arc;

/// One zone as this worker uses it.
pub struct Zone {
    pub name: String,
    pub dir: PathBuf,
    pub max_size: u64,
    pub inactive: u64,
    map: IndexFile,
}

impl Zone {
    pub fn index(&self) -> Index<'_> {
        self.map.index()
    }
}

/// Every zone of the configuration in force (by `Config::caches` index).
#[derive(Default)]
pub struct Zones {
    zones: Vec<Option<Arc<Zone>>>,
    /// The field names of vary records this worker has read, by zone, key and epoch
    /// (a record's names never change within its epoch).
    pub vary_names: VaryNames,
}

/// A vary record's field names.
pub type Names = Arc<[Box<[u8]>]>;

/// Vary records' field names met lately (see [`Zones::vary_names`]).
#[derive(Default)]
pub struct VaryNames {
    names: rustc_hash::FxHashMap<(usize, KeyHash, u64), Names>,
}

/// Records remembered at most (then forgotten all at once; each costs one read).
const VARY_NAMES_KEPT: usize = 4096;

impl VaryNames {
    pub fn get(&self, zone: usize, key: KeyHash, epoch: u64) -> Option<Names> {
        self.names.get(&(zone, key, epoch)).cloned()
    }

    pub fn put(&mut self, zone: usize, key: KeyHash, epoch: u64, names: Names) {
        if self.names.len() >= VARY_NAMES_KEPT {
            self.names.clear();
        }
        self.names.insert((zone, key, epoch), names);
    }
}

impl Zones {
    pub fn new(config: &Config) -> Zones {
        let mut z = Zones::default();
        z.reconfigure(config);
        z
    }

    /// Follows `config`: a zone kept with the same index keeps its map (exchanges
    /// under way hold theirs through an `Rc`).
    pub fn reconfigure(&mut self, config: &Config) {
        let old = std::mem::take(&mut self.zones);
        self.vary_names = VaryNames::default();
        for c in &config.caches {
            let kept = old.iter().flatten().find(|z| same(z, c)).cloned();
            self.zones.push(kept.or_else(|| open(c)));
        }
    }

    pub fn get(&self, zone: usize) -> Option<&Arc<Zone>> {
        self.zones.get(zone)?.as_ref()
    }

    /// Zone `zone` and the vary names remembered, apart.
    pub fn with_names(&mut self, zone: usize) -> Option<(&Arc<Zone>, &mut VaryNames)> {
        let z = self.zones.get(zone)?.as_ref()?;
        Some((z, &mut self.vary_names))
    }

    /// Every zone mapped, for the cache thread and the stats.
    pub fn all(&self) -> impl Iterator<Item = &Arc<Zone>> {
        self.zones.iter().flatten()
    }
}

fn same(z: &Zone, c: &CacheZone) -> bool {
    z.name == c.name
        && z.dir == c.path
        && z.max_size == c.max_size
        && z.inactive == c.inactive.as_secs()
        && z.index().slots.len() == c.index_entries as usize
        && current_id(&c.path) == Some(z.map.id)
}

fn open(c: &CacheZone) -> Option<Arc<Zone>> {
    match IndexFile::open(&c.path, Some(c.index_entries)) {
        Ok(map) => Some(Arc::new(Zone {
            name: c.name.clone(),
            dir: c.path.clone(),
            max_size: c.max_size,
            inactive: c.inactive.as_secs(),
            map,
        })),
        Err(e) => {
            forkd_shared::error!(
                "cache zone `{}`: its index cannot be used, its routes proxy without a cache: {e}",
                c.name
            );
            None
        }
    }
}

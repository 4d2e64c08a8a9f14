//! The worker's cache zones: each zone of the configuration with its index mapped
//! (`forkd_shared::cache::IndexFile`), mapped again when a reload changes the zone or
//! the master made its index anew. A zone whose index cannot be mapped is logged
//! once and treated as empty: its routes proxy without a cache, never fail.

use forkd_shared::cache::files::Opened;
use forkd_shared::cache::{current_id, Index, IndexFile, KeyHash};
use forkd_shared::config::cache::CacheZone;
use forkd_shared::config::Config;
use std::path::PathBuf;
use std::rc::Rc;
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
    /// What this worker remembers of the zones' files: vary records' field names,
    /// and body files it keeps open for the next hits.
    pub remembered: Remembered,
}

/// A vary record's field names.
pub type Names = Arc<[Box<[u8]>]>;

/// What a worker remembers of the zones' files (see [`Zones::remembered`]).
///
/// - A vary record's field names, by zone, key and epoch: a record's names never
///   change within its epoch (a new record has a new epoch, in its slot).
/// - Body files kept open, by zone and slot, with the slot's sequence when opened:
///   every write to a slot changes its sequence, so an entry found with the same
///   sequence is the same file, and a hit costs no `open`, `fstat`, `read` or `close`
///   (a small body is answered from the bytes read when it was opened). A file
///   replaced, evicted or purged is dropped at its next lookup, or when the table
///   is full; until then its descriptor holds its disk space (at most
///   `OPEN_KEPT` files per worker).
#[derive(Default)]
pub struct Remembered {
    names: rustc_hash::FxHashMap<(usize, KeyHash, u64), Names>,
    open: rustc_hash::FxHashMap<(usize, usize), (KeyHash, u32, Rc<Opened>)>,
}

/// Records remembered at most (then forgotten all at once; each costs one read).
const VARY_NAMES_KEPT: usize = 4096;
/// Body files a worker keeps open at most.
pub const OPEN_KEPT: usize = 512;

impl Remembered {
    pub fn names(&self, zone: usize, key: KeyHash, epoch: u64) -> Option<Names> {
        self.names.get(&(zone, key, epoch)).cloned()
    }

    pub fn put_names(&mut self, zone: usize, key: KeyHash, epoch: u64, names: Names) {
        if self.names.len() >= VARY_NAMES_KEPT {
            self.names.clear();
        }
        self.names.insert((zone, key, epoch), names);
    }

    /// The body file kept open for `hash` in slot `slot`, if the slot is unchanged.
    pub fn open_entry(
        &mut self,
        zone: usize,
        slot: usize,
        hash: KeyHash,
        seq: u32,
    ) -> Option<Rc<Opened>> {
        match self.open.get(&(zone, slot)) {
            Some((h, s, o)) if *h == hash && *s == seq => Some(o.clone()),
            Some(_) => {
                self.open.remove(&(zone, slot));
                None
            }
            None => None,
        }
    }

    /// Keeps `entry` open for the next hits on slot `slot` as of sequence `seq`.
    pub fn keep_open(
        &mut self,
        zone: usize,
        slot: usize,
        hash: KeyHash,
        seq: u32,
        entry: Rc<Opened>,
    ) {
        if self.open.len() >= OPEN_KEPT {
            // Forget an eighth, whichever the table gives first.
            let drop: Vec<_> = self.open.keys().take(OPEN_KEPT / 8).copied().collect();
            for k in drop {
                self.open.remove(&k);
            }
        }
        self.open.insert((zone, slot), (hash, seq, entry));
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
        self.remembered = Remembered::default();
        for c in &config.caches {
            let kept = old.iter().flatten().find(|z| same(z, c)).cloned();
            self.zones.push(kept.or_else(|| open(c)));
        }
    }

    pub fn get(&self, zone: usize) -> Option<&Arc<Zone>> {
        self.zones.get(zone)?.as_ref()
    }

    /// Zone `zone` and what the worker remembers, apart.
    pub fn with_remembered(&mut self, zone: usize) -> Option<(&Arc<Zone>, &mut Remembered)> {
        let z = self.zones.get(zone)?.as_ref()?;
        Some((z, &mut self.remembered))
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

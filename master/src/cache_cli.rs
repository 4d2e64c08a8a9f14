//! `forkd cache stats` and `forkd cache purge`: the shared caches of the configured
//! server, read and changed through their index files (the same shared memory the
//! workers use, so a purge is seen by every worker at once). Works while the daemon
//! runs and while it is stopped.

use crate::cli::{CacheArgs, PurgeWhat};
use forkd_shared::cache::report::{self, ZoneReport};
use forkd_shared::cache::upkeep::{purge, Purge};
use forkd_shared::cache::IndexFile;
use forkd_shared::config::Config;

pub fn run(config: &Config, args: &CacheArgs) -> i32 {
    if config.caches.is_empty() {
        eprintln!("forkd: {} has no `caches`", config.file.display());
        return 1;
    }
    match args {
        CacheArgs::Stats { json } => stats(config, *json),
        CacheArgs::Purge { zone, what } => purge_zone(config, zone, what),
    }
}

fn stats(config: &Config, json: bool) -> i32 {
    let mut reports: Vec<ZoneReport> = Vec::new();
    let mut failed = false;
    for z in &config.caches {
        match IndexFile::open(&z.path, None) {
            Ok(map) => reports.push(report::zone_report(&z.name, &map.index(), z.max_size)),
            Err(e) => {
                eprintln!("forkd: cache zone `{}`: {e}", z.name);
                failed = true;
            }
        }
    }
    if json {
        println!("{}", report::json(&reports));
    } else {
        print!("{}", report::table(&reports));
    }
    i32::from(failed)
}

fn purge_zone(config: &Config, name: &str, what: &PurgeWhat) -> i32 {
    let Some(z) = config.caches.iter().find(|z| z.name == name) else {
        let known: Vec<&str> = config.caches.iter().map(|z| z.name.as_str()).collect();
        eprintln!(
            "forkd: no cache zone named `{name}` (known: {})",
            known.join(", ")
        );
        return 1;
    };
    let map = match IndexFile::open(&z.path, None) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("forkd: cache zone `{name}`: {e}");
            return 1;
        }
    };
    let what = match what {
        PurgeWhat::Key(k) => Purge::Key(k.as_bytes()),
        PurgeWhat::Prefix(p) => Purge::Prefix(p.as_bytes()),
    };
    let n = purge(&z.path, &map.index(), &what);
    println!(
        "forkd: purged {n} entr{} from cache zone `{name}`",
        if n == 1 { "y" } else { "ies" }
    );
    0
}

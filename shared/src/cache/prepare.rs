//! What the master does for the cache zones before workers use them: each zone's
//! folder made (0700, given to `user`), and its index made anew at every start of the
//! daemon (the loader then fills it from the body files), or on a reload when the
//! zone is new or its `index_entries` changed.

use super::map::{IndexFile, MapError};
use crate::config::Config;
use std::io;

/// When the master prepares the zones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// The daemon starts (or a new binary takes over): every index is made anew.
    Start,
    /// A reload: an index that exists with the right size is kept.
    Reload,
}

/// Prepares every zone of `config`.
pub fn prepare(config: &Config, when: When) -> io::Result<()> {
    let owner = owner(config)?;
    for zone in &config.caches {
        make_folder(&zone.path, owner)?;
        let keep =
            when == When::Reload && IndexFile::open(&zone.path, Some(zone.index_entries)).is_ok();
        if !keep {
            IndexFile::create(&zone.path, zone.index_entries, owner).map_err(|e| {
                let kind = match &e {
                    MapError::Io { source, .. } => source.kind(),
                    MapError::Foreign { .. } => io::ErrorKind::InvalidData,
                };
                io::Error::new(kind, e.to_string())
            })?;
        }
    }
    Ok(())
}

/// The workers' user and group, if they switch to one.
fn owner(config: &Config) -> io::Result<Option<(u32, u32)>> {
    let Some(name) = &config.user else {
        return Ok(None);
    };
    let user = nix::unistd::User::from_name(name)
        .map_err(io::Error::from)?
        .ok_or_else(|| io::Error::other(format!("no user named `{name}`")))?;
    let gid = match &config.group {
        Some(g) => nix::unistd::Group::from_name(g)
            .map_err(io::Error::from)?
            .ok_or_else(|| io::Error::other(format!("no group named `{g}`")))?
            .gid
            .as_raw(),
        None => user.gid.as_raw(),
    };
    Ok(Some((user.uid.as_raw(), gid)))
}

fn make_folder(dir: &std::path::Path, owner: Option<(u32, u32)>) -> io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    if !dir.is_dir() {
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(parent)
                .map_err(|e| {
                    io::Error::new(e.kind(), format!("mkdir {}: {e}", parent.display()))
                })?;
        }
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(dir)
            .or_else(|e| if dir.is_dir() { Ok(()) } else { Err(e) })
            .map_err(|e| io::Error::new(e.kind(), format!("mkdir {}: {e}", dir.display())))?;
    }
    if let Some((uid, gid)) = owner {
        let meta = std::fs::metadata(dir)?;
        if meta.uid() != uid {
            std::os::unix::fs::chown(dir, Some(uid), Some(gid))
                .map_err(|e| io::Error::new(e.kind(), format!("chown {}: {e}", dir.display())))?;
        }
    }
    Ok(())
}

//! `temp_dir`: the folder proxied bodies are spooled to when they do not fit in
//! memory. The configuration checks it can be used ([`check`], for `-t` and every
//! reload, run as the workers' user by the reload preflight; [`check_reachable`]:
//! the folders above it searchable by the workers' user); the master makes it
//! and hands it to the workers' user before forking ([`prepare`]). The files in it
//! have no name (`O_TMPFILE`; see `worker/src/spool/temp.rs`), so nothing is left
//! in it after a crash or `kill -9`.

use crate::config::Config;
use nix::unistd::{access, AccessFlags};
use std::io;
use std::path::Path;

/// Whether `dir` can hold the workers' temporary files: an existing folder this
/// process may write to, or one it could create (its nearest existing ancestor is).
pub fn check(dir: &Path) -> Result<(), String> {
    let mut at = dir;
    loop {
        match std::fs::metadata(at) {
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                return Err(format!(
                    "cannot be reached ({e}): its parent folders must be searchable"
                ));
            }
            Ok(m) if m.is_dir() => {
                return access(at, AccessFlags::W_OK | AccessFlags::X_OK).map_err(|e| {
                    if at == dir {
                        format!("not writable ({e})")
                    } else {
                        format!("cannot be created: {} is not writable ({e})", at.display())
                    }
                });
            }
            Ok(_) if at == dir => return Err("not a folder".into()),
            Ok(_) => {
                return Err(format!(
                    "cannot be created: {} is not a folder",
                    at.display()
                ))
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
                ) =>
            {
                match at.parent() {
                    Some(parent) => at = parent,
                    None => return Err("no existing ancestor".into()),
                }
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// Whether workers running as `uid`:`gid` (the credentials `worker/src/setup.rs`
/// drops to: the user, and `group` or the user's own group, no other) can reach
/// `dir` once the master has made it and given it to them ([`prepare`]): every
/// existing folder above it must be searchable by them. Read from the mode bits
/// (an ACL that grants more is not seen: the check errs on the side of refusing).
pub fn check_reachable(dir: &Path, uid: u32, gid: u32) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    if uid == 0 {
        return Ok(());
    }
    for above in dir.ancestors().skip(1) {
        let Ok(m) = std::fs::metadata(above) else {
            // Missing: the master creates it, root-owned 0755 (`prepare`).
            continue;
        };
        let search = if m.uid() == uid {
            m.mode() & 0o100
        } else if m.gid() == gid {
            m.mode() & 0o010
        } else {
            m.mode() & 0o001
        };
        if search == 0 {
            return Err(format!(
                "the workers' user cannot reach it: {} is not searchable by uid {uid} gid {gid} (mode {:o})",
                above.display(),
                m.mode() & 0o7777
            ));
        }
    }
    Ok(())
}

/// Creates `temp_dir` (mode 0700) if it is missing and, with `user`, gives it to the
/// workers' user, so a worker that gave up root can create its files there. Nothing
/// for a configuration that buffers no proxied body.
pub fn prepare(config: &Config) -> io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    if !config.spools() {
        return Ok(());
    }
    let dir = &config.temp_dir;
    if !dir.is_dir() {
        let mkdir = |at: &Path, mode: u32| {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(mode)
                .create(at)
                .map_err(|e| io::Error::new(e.kind(), format!("mkdir {}: {e}", at.display())))
        };
        // The folders above are only passed through (0755, as `mkdir -p` makes them):
        // a worker that gave up root must search them to reach its own 0700 folder.
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            mkdir(parent, 0o755)?;
        }
        mkdir(dir, 0o700)?;
    }
    let Some(name) = &config.user else {
        return Ok(());
    };
    let user = nix::unistd::User::from_name(name)
        .map_err(io::Error::from)?
        .ok_or_else(|| io::Error::other(format!("no user named `{name}`")))?;
    let meta = std::fs::metadata(dir)?;
    use std::os::unix::fs::MetadataExt;
    if meta.uid() != user.uid.as_raw() {
        std::os::unix::fs::chown(dir, Some(user.uid.as_raw()), None)
            .map_err(|e| io::Error::new(e.kind(), format!("chown {}: {e}", dir.display())))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{check, check_reachable};
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_folder_above_that_the_workers_cannot_search_is_refused() {
        let base = std::env::temp_dir().join(format!("forkd-tempdir-reach-{}", std::process::id()));
        let locked = base.join("locked");
        std::fs::create_dir_all(&locked).unwrap();
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o700)).unwrap();
        // A uid and gid that own nothing here: only the "other" bits apply.
        let (uid, gid) = (4_000_001, 4_000_001);
        let err = check_reachable(&locked.join("tmp/spool"), uid, gid).unwrap_err();
        assert!(err.contains(&locked.display().to_string()), "{err}");
        // Root reaches everything; the folder itself need not be searchable (the
        // master gives it to the workers).
        assert_eq!(check_reachable(&locked.join("tmp"), 0, 0), Ok(()));
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o711)).unwrap();
        assert_eq!(check_reachable(&locked.join("tmp/spool"), uid, gid), Ok(()));
        assert_eq!(check_reachable(&locked, uid, gid), Ok(()));
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_missing_folder_under_a_writable_one_can_be_created() {
        let base = std::env::temp_dir().join(format!("forkd-tempdir-{}", std::process::id()));
        std::fs::create_dir_all(&base).unwrap();
        assert_eq!(check(&base.join("a/b")), Ok(()));
        assert_eq!(check(&base), Ok(()));
        let file = base.join("file");
        std::fs::write(&file, b"x").unwrap();
        assert_eq!(check(&file), Err("not a folder".into()));
        assert!(check(&file.join("sub"))
            .unwrap_err()
            .contains("is not a folder"));
        std::fs::remove_dir_all(&base).unwrap();
    }
}

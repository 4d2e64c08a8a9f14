//! Binary upgrade, the new master's side: until its first workers serve, a master
//! knows how it came to be. Once they serve, a fresh master tells systemd it is ready;
//! a master exec'd by an upgrade takes over: it locks and writes the pid file, answers `ready`
//! to the old master, takes the stats region over and tells systemd its pid.

use crate::daemon::PidFile;
use crate::inherited::UpgradeChild;
use crate::notify;
use forkd_shared::shm::Region;
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;

/// How this master came to be, until its first workers serve.
pub enum Starting {
    Fresh,
    /// Exec'd by another master, which waits for our answer.
    Upgraded(UpgradeChild),
}

/// What finishing the start came to.
pub enum Started {
    /// A fresh master serves.
    Fresh,
    /// This master took over from the old one and owns the pid file now.
    TookOver(PidFile),
    /// The takeover failed (said to the old master, which keeps serving): this master
    /// must stop.
    Failed,
}

impl Starting {
    /// The first workers serve: READY for systemd, and for a new master the takeover.
    pub fn finish(self, pid_path: &Path, region: &Region) -> Started {
        let mut child = match self {
            Starting::Fresh => {
                notify::notify("READY=1\nSTATUS=serving");
                return Started::Fresh;
            }
            Starting::Upgraded(child) => child,
        };
        let pid_file = PidFile::lock(pid_path).and_then(|p| p.write_pid().map(|()| p));
        let pid_file = match pid_file {
            Ok(p) => p,
            Err(e) => {
                child.failed(&e.to_string());
                forkd_shared::error!("upgrade: {e}; the old master keeps serving");
                return Started::Failed;
            }
        };
        let header = &region.layout().header;
        header.master_pid.store(std::process::id() as i32, Relaxed);
        child.ready();
        forkd_shared::notice!("upgrade: serving; master {} retires", child.from);
        notify::notify(&format!(
            "MAINPID={}\nREADY=1\nSTATUS=serving (upgraded)",
            std::process::id()
        ));
        Started::TookOver(pid_file)
    }
}

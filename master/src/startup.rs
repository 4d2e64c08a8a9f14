//! Starting the master: the minimum before the first fork. Error log, pid file lock,
//! stats region, listening sockets (bound, or inherited from systemd or from the
//! master being upgraded), signals, pid file, the published configuration, then the
//! workers.

use crate::daemon::PidFile;
use crate::handover::Starting;
use crate::inherited::{Inherited, UpgradeChild};
use crate::listeners::Sockets;
use crate::signals::Signals;
use crate::supervisor::{Start, Supervisor};
use crate::upgrade::Upgrade;
use forkd_shared::config::{Config, LogLevel};
use forkd_shared::shm::Region;
use std::rc::Rc;

/// Runs the master until it stops; returns the exit code.
pub fn run(config: Config, text: String) -> i32 {
    let mut upgrade = UpgradeChild::from_env();
    let inherited = Inherited::from_env(upgrade.as_ref().and_then(UpgradeChild::ready_fd));
    if let Err(e) = forkd_shared::log::init(&config.error_log, config.log_level, "-") {
        eprintln!("forkd: cannot open the error log: {e}");
        return fail(&mut upgrade, format!("cannot open the error log: {e}"));
    }
    if let Err(e) = forkd_shared::log::hand_to_workers(&config) {
        forkd_shared::alert!("preparing the log files for the workers failed: {e}");
        return fail(&mut upgrade, format!("preparing the log files failed: {e}"));
    }
    if let Err(e) = forkd_shared::temp_dir::prepare(&config) {
        forkd_shared::alert!("preparing temp_dir failed: {e}");
        return fail(&mut upgrade, format!("preparing temp_dir failed: {e}"));
    }
    use forkd_shared::cache::prepare::{prepare, When};
    if let Err(e) = prepare(&config, When::Start) {
        forkd_shared::alert!("preparing the cache zones failed: {e}");
        return fail(
            &mut upgrade,
            format!("preparing the cache zones failed: {e}"),
        );
    }
    for warning in &config.warnings {
        forkd_shared::warn!("{warning}");
    }
    let mut inherited = match inherited {
        Ok(i) => i,
        Err(e) => {
            eprintln!("forkd: {e}");
            return fail(&mut upgrade, e.to_string());
        }
    };
    // Running means holding the pid file's lock. A new master (binary upgrade) takes
    // it once it serves (see `handover.rs`): until then the old master holds its own.
    let pid_file = match upgrade {
        Some(_) => None,
        None => match PidFile::lock(&config.pid_file) {
            Ok(p) => Some(p),
            Err(e) => return fail(&mut upgrade, e.to_string()),
        },
    };
    let me = std::process::id() as i32;
    let from = upgrade.as_ref().map(|u| u.from);
    // A binary upgrade shares the old master's region when the layout matches, so
    // every counter carries over; otherwise it starts a fresh one.
    let region = match from.map(|from| Region::attach(&config.shm_file, from)) {
        Some(Ok(r)) => Ok(r),
        Some(Err(e)) => {
            forkd_shared::warn!(
                "cannot share the previous master's stats region ({e}): starting a fresh one, totals restart"
            );
            Region::create(&config.shm_file, me, from)
        }
        None => Region::create(&config.shm_file, me, from),
    };
    let region = match region {
        Ok(r) => Rc::new(r),
        Err(e) => return fail(&mut upgrade, e.to_string()),
    };
    let sockets = match Sockets::open(&config, None, &mut inherited) {
        Ok(s) => s,
        Err(e) => return fail(&mut upgrade, e.to_string()),
    };
    inherited.close_unused();
    let mut signals = match Signals::install() {
        Ok(s) => s,
        Err(e) => return fail(&mut upgrade, format!("signalfd failed: {e}")),
    };
    // The pid goes in once signals are ours: a `-s` before that would kill us.
    if let Some(Err(e)) = pid_file.as_ref().map(PidFile::write_pid) {
        return fail(&mut upgrade, e.to_string());
    }
    let (exe, args) = own_command();
    let workers = config.workers.get();
    let accept = config.accept;
    let addrs = sockets
        .addrs
        .iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let sup = Supervisor::start(Start {
        config,
        text,
        sockets,
        region,
        pid_file,
        starting: match upgrade.take() {
            Some(child) => Starting::Upgraded(child),
            None => Starting::Fresh,
        },
        upgrade: Upgrade::new(exe, args),
    });
    let sup = match sup {
        Ok(sup) => sup,
        // The master being upgraded from was told already.
        Err(e) => return fail(&mut None, e),
    };
    forkd_shared::notice!(
        "forkd {} started: {workers} worker(s), accept {accept:?}, listening on {addrs}{}",
        env!("CARGO_PKG_VERSION"),
        if inherited.source.is_empty() {
            String::new()
        } else {
            format!(" (sockets from {})", inherited.source)
        }
    );
    let code = sup.run(&mut signals);
    forkd_shared::notice!("forkd exited");
    code
}

/// This binary's path, resolved now (an upgrade execs whatever is at that path then,
/// even if the running file was replaced), and the arguments it was started with.
fn own_command() -> (std::path::PathBuf, Vec<std::ffi::OsString>) {
    let exe = std::env::current_exe().unwrap_or_else(|_| "/proc/self/exe".into());
    // A replaced binary shows as "path (deleted)": exec the path, not the old inode.
    let exe = match exe.to_str().and_then(|s| s.strip_suffix(" (deleted)")) {
        Some(path) => path.into(),
        None => exe,
    };
    (exe, std::env::args_os().skip(1).collect())
}

/// Reports a start-up failure (to the master being upgraded too); the exit code.
fn fail(upgrade: &mut Option<UpgradeChild>, message: String) -> i32 {
    forkd_shared::log_at!(LogLevel::Emerg, "{message}");
    if let Some(up) = upgrade.as_mut() {
        up.failed(&message);
    }
    1
}

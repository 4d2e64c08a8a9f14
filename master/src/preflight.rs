//! A reload's dry run as a worker. Workers check a configuration again after dropping
//! privileges (they parse it as their `user`, so a `root` the user cannot reach is an
//! error, and open changed access logs as that user), so a configuration the master
//! accepts can be refused by every worker. Before the master publishes anything, a
//! forked child drops privileges exactly as a worker does and runs the same checks;
//! its refusal fails the reload with its reason, and nothing changes.
//!
//! What it cannot see: failures that depend on one worker's state at that moment (a
//! full descriptor table, a full disk). Those are still only logged by the worker.

use crate::daemon::PidFile;
use crate::process;
use crate::reload::How;
use forkd_shared::config::{Config, LogTarget};
use forkd_worker::access_log::AccessLogs;
use std::time::Duration;

/// How long the check may take (parsing and opening log files).
const CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// Checks, as the workers' user, that they can take `new` (with `text`, the text they
/// will parse) from `current` the way `how` says. Nothing to check without `user`:
/// the workers then run with the master's privileges.
pub fn check(
    current: &Config,
    new: &Config,
    text: &str,
    how: &How,
    pid_file: &mut Option<PidFile>,
) -> Result<(), String> {
    let Some(user) = new.user.as_deref() else {
        return Ok(());
    };
    let refused = |why: String| format!("the workers (user {user}) would refuse it: {why}");
    process::run_check(pid_file, CHECK_TIMEOUT, || match how {
        // New workers get the master's parsed configuration and open their logs
        // before they drop privileges: dropping them is what can fail.
        How::NewGeneration { .. } => {
            forkd_worker::setup::drop_privileges(user).map_err(|e| e.to_string())
        }
        How::InPlace => {
            forkd_worker::setup::drop_privileges(user).map_err(|e| e.to_string())?;
            adoptable(current, new, text)
        }
    })
    .map_err(refused)
}

/// What a running worker does on adopting `text` in place, short of adopting it:
/// parse and validate it, and open the access logs if they changed.
fn adoptable(current: &Config, new: &Config, text: &str) -> Result<(), String> {
    let mut config = Config::parse(&new.file, text).map_err(|e| e.to_string())?;
    config.resolve_like(current);
    if let Some(why) = current.needs_new_workers(&config) {
        return Err(format!("it needs new workers ({why})"));
    }
    let logs_changed = config
        .servers
        .iter()
        .map(|s| &s.access_log)
        .ne(current.servers.iter().map(|s| &s.access_log));
    if logs_changed {
        AccessLogs::open(&config.servers).map_err(|e| {
            let files: Vec<String> = config
                .servers
                .iter()
                .filter_map(|s| match &s.access_log {
                    Some(LogTarget::File(path)) => Some(path.display().to_string()),
                    _ => None,
                })
                .collect();
            format!("opening its access logs ({}) failed: {e}", files.join(", "))
        })?;
    }
    Ok(())
}

//! A reload's dry run as a worker, before the master publishes anything.
//!
//! A configuration the master accepts can still be refused by the workers: running
//! workers check it again as their `user` when they adopt it in place (a `root` the
//! user cannot reach is an error; changed access logs are opened as that user), and
//! the workers of a new generation open their access logs, pin themselves to their
//! CPUs and drop privileges as they start (a new generation that cannot start would
//! otherwise replace the old one after its wait and leave nothing serving). A forked
//! child of the master does the same, in the same order, and its refusal fails the
//! reload with its reason, so every worker keeps the old configuration.
//!
//! What it cannot see: failures that depend on one worker's state at that moment (a
//! full descriptor table, a full disk). Those are still only logged by the worker.

use crate::daemon::PidFile;
use crate::process;
use crate::reload::How;
use forkd_shared::config::{Config, LogTarget};
use forkd_worker::access_log::AccessLogs;
use forkd_worker::setup;
use std::time::Duration;

/// How long the check may take (parsing and opening log files).
const CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// Checks in a forked child that the workers can take `new` (with `text`, the text
/// running workers will parse) from `current` the way `how` says. No child is forked
/// when the check cannot differ from the master's own validation (in place, without
/// `user`, access logs unchanged).
pub fn check(
    current: &Config,
    new: &Config,
    text: &str,
    how: &How,
    pid_file: &mut Option<PidFile>,
) -> Result<(), String> {
    let user = new.user.as_deref();
    let needed = match how {
        How::NewGeneration { .. } => true,
        // Without `user` a worker parses as the master just did; what is left is
        // opening changed access logs, which the master does not do.
        How::InPlace => user.is_some() || logs_changed(current, new),
    };
    if !needed {
        return Ok(());
    }
    process::run_check(pid_file, CHECK_TIMEOUT, || match how {
        How::NewGeneration { .. } => startable(new),
        How::InPlace => {
            drop_privileges(user, new.group.as_deref())?;
            adoptable(current, new, text)
        }
    })
    .map_err(|why| match user {
        Some(user) => format!("the workers (user {user}) would refuse it: {why}"),
        None => format!("the workers would refuse it: {why}"),
    })
}

fn drop_privileges(user: Option<&str>, group: Option<&str>) -> Result<(), String> {
    match user {
        Some(user) => setup::drop_privileges(user, group).map_err(|e| e.to_string()),
        None => Ok(()),
    }
}

/// What a new worker does as it starts with `new`, in its order: pin to each CPU a
/// slot will use, open the access logs, drop privileges.
fn startable(new: &Config) -> Result<(), String> {
    for slot in 0..new.workers.get().min(new.cpus.len()) {
        setup::pin(slot, &new.cpus).map_err(|e| e.to_string())?;
    }
    open_access_logs(new)?;
    drop_privileges(new.user.as_deref(), new.group.as_deref())
}

/// What a running worker does on adopting `text` in place, short of adopting it:
/// parse and validate it, and open the access logs if they changed.
fn adoptable(current: &Config, new: &Config, text: &str) -> Result<(), String> {
    let mut config =
        Config::parse_after(&new.file, text, Some(current)).map_err(|e| e.to_string())?;
    config.resolve_like(current);
    if let Some(why) = current.needs_new_workers(&config) {
        return Err(format!("it needs new workers ({why})"));
    }
    if logs_changed(current, &config) {
        open_access_logs(&config)?;
    }
    Ok(())
}

/// Whether a running worker opens its access logs again to adopt `new` (the
/// worker's own test).
fn logs_changed(current: &Config, new: &Config) -> bool {
    new.servers
        .iter()
        .map(|s| &s.access_log)
        .ne(current.servers.iter().map(|s| &s.access_log))
}

fn open_access_logs(config: &Config) -> Result<(), String> {
    AccessLogs::open(&config.servers).map(drop).map_err(|e| {
        let files: Vec<String> = config
            .servers
            .iter()
            .filter_map(|s| match &s.access_log {
                Some(LogTarget::File(path)) => Some(path.display().to_string()),
                _ => None,
            })
            .collect();
        format!("opening its access logs ({}) failed: {e}", files.join(", "))
    })
}

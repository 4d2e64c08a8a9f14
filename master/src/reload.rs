//! Reload planning (HUP): from the configuration in force and the newly loaded one,
//! decide how the change can be applied, without doing anything. The supervisor
//! carries the plan out (publishing, sockets, workers).
//!
//! - `InPlace`: the running workers can take the change; it is published as a
//!   snapshot in shared memory and adopted by them.
//! - `NewGeneration`: the change needs new sockets or processes; a new generation of
//!   workers serves before the old one drains.
//! - refused: the change cannot be made without a restart; nothing changes.

use forkd_shared::config::{AcceptMode, Config};
use std::fmt;
use std::path::PathBuf;

/// How a reload applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum How {
    /// The running workers adopt the new configuration.
    InPlace,
    /// New workers start with it; `why` says which setting needs them.
    NewGeneration { why: &'static str },
}

/// A setting that cannot change on reload and keeps its running value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kept {
    PidFile(PathBuf),
    ShmFile(PathBuf),
}

impl fmt::Display for Kept {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Kept::PidFile(p) => write!(
                f,
                "pid_file cannot change on reload; keeping {}",
                p.display()
            ),
            Kept::ShmFile(p) => write!(
                f,
                "shm_file cannot change on reload; keeping {}",
                p.display()
            ),
        }
    }
}

/// What a reload will do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub how: How,
    /// Settings whose change is ignored (the running value stays).
    pub kept: Vec<Kept>,
    /// The error log or its level changed: it is opened again.
    pub reopen_error_log: bool,
}

/// Why a reload cannot apply at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    AcceptChanged { from: AcceptMode, to: AcceptMode },
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refused::AcceptChanged { from, to } => write!(
                f,
                "accept cannot change from {from:?} to {to:?} on reload (the sockets differ): it takes a restart"
            ),
        }
    }
}

/// How the change from `old` to `new` can be applied.
pub fn plan(old: &Config, new: &Config) -> Result<Plan, Refused> {
    if new.accept != old.accept {
        return Err(Refused::AcceptChanged {
            from: old.accept,
            to: new.accept,
        });
    }
    let mut kept = Vec::new();
    if new.pid_file != old.pid_file {
        kept.push(Kept::PidFile(old.pid_file.clone()));
    }
    if new.shm_file != old.shm_file {
        kept.push(Kept::ShmFile(old.shm_file.clone()));
    }
    let how = match old.needs_new_workers(new) {
        Some(why) => How::NewGeneration { why },
        None => How::InPlace,
    };
    Ok(Plan {
        how,
        kept,
        reopen_error_log: new.error_log != old.error_log || new.log_level != old.log_level,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn config(top: &str, listen: &str) -> Config {
        let text = format!(
            "(workers: Count(2), pid_file: \"/tmp/forkd-plan.pid\", shm_file: \"/tmp/forkd-plan.shm\", {top}
              servers: [(listen: [\"{listen}\"], routes: [(prefix: \"/\", handler: Liveness)])])"
        );
        Config::parse(Path::new("/tmp/forkd-plan.ron"), &text).expect("test config is valid")
    }

    #[test]
    fn a_per_request_change_applies_in_place() {
        let old = config("", "127.0.0.1:8080");
        let mut new = old.clone();
        new.servers[0].keepalive_timeout *= 2;
        let plan = plan(&old, &new).unwrap();
        assert_eq!(plan.how, How::InPlace);
        assert!(plan.kept.is_empty());
        assert!(!plan.reopen_error_log);
    }

    #[test]
    fn new_sockets_or_worker_count_need_a_new_generation() {
        let old = config("", "127.0.0.1:8080");
        let moved = config("", "127.0.0.1:8081");
        assert!(matches!(
            plan(&old, &moved).unwrap().how,
            How::NewGeneration { .. }
        ));
        let more = config("", "127.0.0.1:8080");
        let mut more = more;
        more.workers = std::num::NonZeroUsize::new(3).unwrap();
        assert_eq!(
            plan(&old, &more).unwrap().how,
            How::NewGeneration {
                why: "the number of workers changed"
            }
        );
    }

    #[test]
    fn changing_the_accept_mode_is_refused() {
        let old = config("accept: Shared,", "127.0.0.1:8080");
        let new = config("accept: ReusePort,", "127.0.0.1:8080");
        let refused = plan(&old, &new).unwrap_err();
        assert_eq!(
            refused,
            Refused::AcceptChanged {
                from: AcceptMode::Shared,
                to: AcceptMode::ReusePort
            }
        );
        assert!(refused.to_string().contains("takes a restart"));
    }

    #[test]
    fn pid_and_shm_files_keep_their_running_values() {
        let old = config("", "127.0.0.1:8080");
        let mut new = old.clone();
        new.pid_file = "/tmp/elsewhere.pid".into();
        new.shm_file = "/tmp/elsewhere.shm".into();
        let plan = plan(&old, &new).unwrap();
        assert_eq!(
            plan.kept,
            vec![
                Kept::PidFile(old.pid_file.clone()),
                Kept::ShmFile(old.shm_file.clone())
            ]
        );
        assert_eq!(plan.how, How::InPlace);
    }

    #[test]
    fn a_new_log_level_reopens_the_error_log() {
        let old = config("log_level: Info,", "127.0.0.1:8080");
        let new = config("log_level: Debug,", "127.0.0.1:8080");
        assert!(plan(&old, &new).unwrap().reopen_error_log);
    }
}

//! The error log: one per process, written to stderr, stdout, a file or syslog.
//!
//! Lines look like nginx's so existing tooling reads them:
//! `2026/11/29 22:10:00 [error] 1234#0: bind(127.0.0.1:80) failed: ...`
//! (`#0` is the worker slot, `#-` the master). The log is process-global because
//! every module may need to report, and processes are single-threaded: the mutex is
//! never contended, it only makes the global safe.

use crate::config::{Config, LogLevel, LogTarget};
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Mutex;

enum Sink {
    Stderr,
    Stdout,
    File(File),
    Syslog(Box<SyslogLogger>),
}

struct Logger {
    sink: Sink,
    target: LogTarget,
    level: LogLevel,
    /// `-` for the master, the slot number for a worker.
    who: String,
}

static LOGGER: Mutex<Option<Logger>> = Mutex::new(None);

/// Opens (creating its folder if needed) a log file for appending.
pub fn open_append(path: &Path) -> io::Result<File> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o640)
        .open(path)
}

/// When workers switch to `user`, makes every log file of `config` (error log and
/// access logs) exist and belong to that user and `group`: a worker re-opens its
/// logs after `-s reopen` or a reload, long after it gave up root, and may then only
/// open files it owns. The master calls this before forking, before publishing a
/// reloaded configuration and before forwarding `USR1`, as nginx's master does.
/// Nothing else is handed over: the stats region stays the master's (0640), written by
/// workers only through the mapping they inherit.
pub fn hand_to_workers(config: &Config) -> io::Result<()> {
    let files = std::iter::once(&config.error_log)
        .chain(config.servers.iter().filter_map(|s| s.access_log.as_ref()))
        .filter_map(|t| match t {
            LogTarget::File(path) => Some(path.as_path()),
            _ => None,
        });
    let Some(name) = &config.user else {
        // Workers keep the master's credentials and open what the master could.
        return Ok(());
    };
    let user = nix::unistd::User::from_name(name)
        .map_err(io::Error::from)?
        .ok_or_else(|| io::Error::other(format!("no user named `{name}`")))?;
    let gid = match &config.group {
        None => user.gid,
        Some(g) => {
            nix::unistd::Group::from_name(g)
                .map_err(io::Error::from)?
                .ok_or_else(|| io::Error::other(format!("no group named `{g}`")))?
                .gid
        }
    };
    for path in files {
        let file = open_append(path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        std::os::unix::fs::fchown(&file, Some(user.uid.as_raw()), Some(gid.as_raw()))
            .map_err(|e| io::Error::new(e.kind(), format!("chown {}: {e}", path.display())))?;
    }
    Ok(())
}

fn open_sink(target: &LogTarget) -> io::Result<Sink> {
    Ok(match target {
        LogTarget::Stderr => Sink::Stderr,
        LogTarget::Stdout => Sink::Stdout,
        LogTarget::File(path) => Sink::File(open_append(path)?),
        LogTarget::Syslog => Sink::Syslog(syslog_logger()?),
    })
}

/// A syslog connection (local socket, facility daemon, tag `forkd[pid]`), for the
/// error log and for access logs sent to syslog.
pub fn syslog_logger() -> io::Result<Box<SyslogLogger>> {
    let formatter = syslog::Formatter3164 {
        facility: syslog::Facility::LOG_DAEMON,
        hostname: None,
        process: "forkd".into(),
        pid: std::process::id(),
    };
    syslog::unix(formatter)
        .map(Box::new)
        .map_err(|e| io::Error::other(e.to_string()))
}

/// The syslog crate's logger type, named once.
pub type SyslogLogger = syslog::Logger<syslog::LoggerBackend, syslog::Formatter3164>;

/// Installs the process's error log. On failure the previous log (or stderr) stays.
pub fn init(target: &LogTarget, level: LogLevel, who: &str) -> io::Result<()> {
    let sink = open_sink(target)?;
    let mut guard = LOGGER.lock().unwrap_or_else(|p| p.into_inner());
    *guard = Some(Logger {
        sink,
        target: target.clone(),
        level,
        who: who.to_string(),
    });
    Ok(())
}

/// Changes who the lines are attributed to (a worker after fork).
pub fn set_who(who: &str) {
    let mut guard = LOGGER.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(l) = guard.as_mut() {
        l.who = who.to_string();
        if let Sink::Syslog(s) = &mut l.sink {
            s.formatter.pid = std::process::id();
        }
    }
}

/// Re-opens the log file (logrotate moved it away). Keeps the old one on failure.
pub fn reopen() -> io::Result<()> {
    let mut guard = LOGGER.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(l) = guard.as_mut() {
        if matches!(l.target, LogTarget::File(_)) {
            l.sink = open_sink(&l.target)?;
        }
    }
    Ok(())
}

/// Whether a message at `level` would be written.
pub fn enabled(level: LogLevel) -> bool {
    let guard = LOGGER.lock().unwrap_or_else(|p| p.into_inner());
    match guard.as_ref() {
        Some(l) => level >= l.level,
        None => level >= LogLevel::Info,
    }
}

fn level_name(level: LogLevel) -> &'static str {
    match level {
        LogLevel::Debug => "debug",
        LogLevel::Info => "info",
        LogLevel::Notice => "notice",
        LogLevel::Warn => "warn",
        LogLevel::Error => "error",
        LogLevel::Crit => "crit",
        LogLevel::Alert => "alert",
        LogLevel::Emerg => "emerg",
    }
}

/// `2026/11/29 22:10:00` in UTC.
pub fn timestamp(now: std::time::SystemTime) -> String {
    let secs = now
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (y, mo, d) = civil_from_days((secs / 86400) as i64);
    let rem = secs % 86400;
    format!(
        "{y:04}/{mo:02}/{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Writes one line at `level`. Use the `error!`/`warn!`/... macros rather than this.
pub fn write(level: LogLevel, args: std::fmt::Arguments<'_>) {
    let mut guard = LOGGER.lock().unwrap_or_else(|p| p.into_inner());
    let (min, who) = match guard.as_ref() {
        Some(l) => (l.level, l.who.as_str()),
        None => (LogLevel::Info, "-"),
    };
    if level < min {
        return;
    }
    let line = format!(
        "{} [{}] {}#{}: {}\n",
        timestamp(std::time::SystemTime::now()),
        level_name(level),
        std::process::id(),
        who,
        args
    );
    // A failed log write has nowhere to be reported; dropping the line is all we can do.
    let _ = match guard.as_mut().map(|l| &mut l.sink) {
        None | Some(Sink::Stderr) => io::stderr().write_all(line.as_bytes()),
        Some(Sink::Stdout) => io::stdout().write_all(line.as_bytes()),
        Some(Sink::File(f)) => f.write_all(line.as_bytes()),
        Some(Sink::Syslog(s)) => {
            let msg = format!("[{}] {}", level_name(level), args);
            match level {
                LogLevel::Debug => s.debug(msg),
                LogLevel::Info => s.info(msg),
                LogLevel::Notice => s.notice(msg),
                LogLevel::Warn => s.warning(msg),
                LogLevel::Error => s.err(msg),
                LogLevel::Crit => s.crit(msg),
                LogLevel::Alert => s.alert(msg),
                LogLevel::Emerg => s.emerg(msg),
            }
            .map_err(|e| io::Error::other(e.to_string()))
        }
    };
}

#[macro_export]
macro_rules! log_at {
    ($level:expr, $($arg:tt)*) => {
        $crate::log::write($level, format_args!($($arg)*))
    };
}
#[macro_export]
macro_rules! debug { ($($arg:tt)*) => { $crate::log_at!($crate::config::LogLevel::Debug, $($arg)*) }; }
#[macro_export]
macro_rules! info { ($($arg:tt)*) => { $crate::log_at!($crate::config::LogLevel::Info, $($arg)*) }; }
#[macro_export]
macro_rules! notice { ($($arg:tt)*) => { $crate::log_at!($crate::config::LogLevel::Notice, $($arg)*) }; }
#[macro_export]
macro_rules! warn { ($($arg:tt)*) => { $crate::log_at!($crate::config::LogLevel::Warn, $($arg)*) }; }
#[macro_export]
macro_rules! error { ($($arg:tt)*) => { $crate::log_at!($crate::config::LogLevel::Error, $($arg)*) }; }
#[macro_export]
macro_rules! alert { ($($arg:tt)*) => { $crate::log_at!($crate::config::LogLevel::Alert, $($arg)*) }; }

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_786), (2026, 11, 29));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }

    #[test]
    fn timestamp_format() {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(20_786 * 86400 + 3661);
        assert_eq!(timestamp(t), "2026/11/29 01:01:01");
    }
}

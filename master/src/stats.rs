//! `forkd stats`: maps the region read-only and prints it. Works with or without a
//! running master (a stopped master's last state is still in the file). A region left
//! inconsistent by a master killed mid-write is reported, never waited on for ever.
//!
//! Output: a reading is written whole, blocking while the consumer is slower than the
//! interval (back-pressure: the reader maps the region read-only and holds no lock
//! while it waits, so nothing of the daemon's waits on it, and `SIGINT`/`SIGTERM` end
//! it as ever). A write that fails ends it: a consumer gone (`EPIPE`, as when piped
//! to `head`) with 0 and nothing said, any other error (a full disk) with 1 and the
//! error. `--watch` used to ignore both and run for ever.

use crate::cli::StatsArgs;
use forkd_shared::shm::report::{Inconsistent, Report};
use forkd_shared::shm::RegionReader;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

/// The interval over which a one-shot table measures request rates.
const RATE_INTERVAL: Duration = Duration::from_secs(1);

/// Readings (each waits at most `report::PATIENCE`) before a one-shot `forkd stats`
/// gives up on an inconsistent region.
const ATTEMPTS: u32 = 10;

pub fn run(path: &Path, args: &StatsArgs) -> i32 {
    let region = match RegionReader::open(path) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("forkd stats: {e}");
            return 1;
        }
    };
    match print(&region, args) {
        Ok(code) => code,
        Err(Stopped::ConsumerGone) => 0,
        Err(Stopped::Write(e)) => {
            eprintln!("forkd stats: writing to stdout failed: {e}");
            1
        }
    }
}

/// Why printing stopped early.
enum Stopped {
    /// stdout's reader has gone (`EPIPE`).
    ConsumerGone,
    Write(std::io::Error),
}

/// Writes `text` whole to stdout and flushes it.
fn emit(text: &str) -> Result<(), Stopped> {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::BrokenPipe => Stopped::ConsumerGone,
            _ => Stopped::Write(e),
        })
}

/// The readings `args` ask for; the exit code, unless a write failed.
fn print(region: &RegionReader, args: &StatsArgs) -> Result<i32, Stopped> {
    if args.json {
        let Some(interval) = args.watch else {
            let Some(report) = reading(region) else {
                return Ok(1);
            };
            emit(&report.to_json())?;
            return Ok(0);
        };
        loop {
            match region.report() {
                Ok(report) => emit(&report.to_json())?,
                Err(e) => eprintln!("forkd stats: {e}; retrying"),
            }
            std::thread::sleep(interval);
        }
    }
    let interval = args.watch.unwrap_or(RATE_INTERVAL);
    let Some(mut previous) = reading(region) else {
        return Ok(1);
    };
    let mut taken = Instant::now();
    if args.watch.is_none() && !previous.master_alive {
        emit(&previous.to_table(None, 0.0))?;
        return Ok(0);
    }
    loop {
        std::thread::sleep(interval.saturating_sub(taken.elapsed()));
        let now = match region.report() {
            Ok(now) => now,
            Err(e) if args.watch.is_some() => {
                eprintln!("forkd stats: {e}; retrying");
                continue;
            }
            Err(_) => {
                let Some(now) = reading(region) else {
                    return Ok(1);
                };
                now
            }
        };
        let elapsed = taken.elapsed().as_secs_f64();
        taken = Instant::now();
        let table = now.to_table(Some(&previous), elapsed);
        if args.watch.is_none() {
            emit(&table)?;
            return Ok(0);
        }
        emit(&(table + "\n"))?;
        previous = now;
    }
}

/// A consistent reading within [`ATTEMPTS`]; says so on stderr while retrying, and
/// None (after printing why) when the region stayed inconsistent.
fn reading(region: &RegionReader) -> Option<Report> {
    let mut last: Option<Inconsistent> = None;
    for _ in 0..ATTEMPTS {
        match region.report() {
            Ok(report) => return Some(report),
            Err(e) => {
                if last.is_none() {
                    eprintln!("forkd stats: {e}; retrying");
                }
                last = Some(e);
            }
        }
    }
    if let Some(e) = last {
        eprintln!(
            "forkd stats: giving up after {ATTEMPTS} readings of {}: {e}",
            region.path().display()
        );
    }
    None
}

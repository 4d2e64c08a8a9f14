//! `forkd stats`: maps the region read-only and prints it. Works with or without a
//! running master (a stopped master's last state is still in the file). A region left
//! inconsistent by a master killed mid-write is reported, never waited on for ever.

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
    let mut stdout = std::io::stdout();
    if args.json {
        loop {
            match args.watch {
                Some(interval) => {
                    match region.report() {
                        Ok(report) => {
                            let _ = stdout.write_all(report.to_json().as_bytes());
                            let _ = stdout.flush();
                        }
                        Err(e) => eprintln!("forkd stats: {e}; retrying"),
                    }
                    std::thread::sleep(interval);
                }
                None => {
                    let Some(report) = reading(&region) else {
                        return 1;
                    };
                    let _ = stdout.write_all(report.to_json().as_bytes());
                    return 0;
                }
            }
        }
    }
    let interval = args.watch.unwrap_or(RATE_INTERVAL);
    let Some(mut previous) = reading(&region) else {
        return 1;
    };
    let mut taken = Instant::now();
    if args.watch.is_none() && !previous.master_alive {
        let _ = stdout.write_all(previous.to_table(None, 0.0).as_bytes());
        return 0;
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
                let Some(now) = reading(&region) else {
                    return 1;
                };
                now
            }
        };
        let elapsed = taken.elapsed().as_secs_f64();
        taken = Instant::now();
        let _ = stdout.write_all(now.to_table(Some(&previous), elapsed).as_bytes());
        let _ = stdout.flush();
        if args.watch.is_none() {
            return 0;
        }
        let _ = stdout.write_all(b"\n");
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

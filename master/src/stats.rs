//! `forkd stats`: maps the region read-only and prints it. Works with or without a
//! running master (a stopped master's last state is still in the file).

use crate::cli::StatsArgs;
use forkd_shared::shm::{report, Region};
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

/// The interval over which a one-shot table measures request rates.
const RATE_INTERVAL: Duration = Duration::from_secs(1);

pub fn run(path: &Path, args: &StatsArgs) -> i32 {
    let region = match Region::open_read(path) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("forkd stats: {e}");
            return 1;
        }
    };
    let layout = region.layout();
    let mut stdout = std::io::stdout();
    if args.json {
        loop {
            let _ = stdout.write_all(report::read(layout).to_json().as_bytes());
            let _ = stdout.flush();
            match args.watch {
                Some(interval) => std::thread::sleep(interval),
                None => return 0,
            }
        }
    }
    let interval = args.watch.unwrap_or(RATE_INTERVAL);
    let mut previous = report::read(layout);
    let mut taken = Instant::now();
    if args.watch.is_none() && !previous.master_alive {
        let _ = stdout.write_all(previous.to_table(None, 0.0).as_bytes());
        return 0;
    }
    loop {
        std::thread::sleep(interval.saturating_sub(taken.elapsed()));
        let now = report::read(layout);
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

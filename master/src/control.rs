//! `forkd -s SIGNAL`: find the running master through the pid file and signal it.
//!
//! `reload` is synchronous: it watches the stats region until every worker serves the
//! new configuration generation (exit 0), or the master reports the reload failed
//! (prints the error, exit 1). nginx's `-s reload` cannot tell whether it worked.

use crate::cli::ControlSignal;
use crate::daemon;
use forkd_shared::config::Config;
use forkd_shared::shm::layout::WorkerState;
use forkd_shared::shm::report::Report;
use forkd_shared::shm::RegionReader;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::time::{Duration, Instant};

/// How long `-s reload` waits for the workers to report the new generation.
const RELOAD_WAIT: Duration = Duration::from_secs(60);

/// The signal the master understands for each `-s` name (as nginx's).
pub fn signal_for(control: ControlSignal) -> Signal {
    match control {
        ControlSignal::Stop => Signal::SIGINT,
        ControlSignal::Quit => Signal::SIGQUIT,
        ControlSignal::Reload => Signal::SIGHUP,
        ControlSignal::Reopen => Signal::SIGUSR1,
        ControlSignal::Upgrade => Signal::SIGUSR2,
    }
}

/// Sends the signal; returns the exit code.
pub fn send(config: &Config, control: ControlSignal) -> i32 {
    let pid = match daemon::read_live(&config.pid_file) {
        Ok(pid) => pid,
        Err(e) => {
            eprintln!("forkd: cannot send {control:?}: {e}");
            return 1;
        }
    };
    if control == ControlSignal::Reload {
        return reload(config, pid);
    }
    if control == ControlSignal::Upgrade {
        return upgrade(config, pid);
    }
    signal(pid, signal_for(control))
}

fn signal(pid: Pid, signal: Signal) -> i32 {
    match kill(pid, signal) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("forkd: kill({pid}, {signal}) failed: {e}");
            1
        }
    }
}

/// What a reload has come to, as seen in the region.
#[derive(Debug, PartialEq, Eq)]
enum Progress {
    Waiting,
    Failed(String),
    /// Generation in force in this many workers.
    Done {
        generation: u64,
        workers: usize,
    },
}

/// Counters read before the signal, to tell this reload's outcome from earlier ones.
struct Before {
    ok: u64,
    failed: u64,
}

fn progress(report: &Report, before: &Before) -> Progress {
    if report.reloads_failed > before.failed {
        return Progress::Failed(report.last_reload_error.clone());
    }
    if report.reloads_ok <= before.ok {
        return Progress::Waiting;
    }
    // The master says when every one of its workers serves the generation: only it
    // knows how many it runs and which are still to start.
    let generation = report.config_generation;
    if report.generation_in_force != generation {
        return Progress::Waiting;
    }
    Progress::Done {
        generation,
        workers: serving_in(report, generation),
    }
}

/// The workers a reading shows serving `generation`.
fn serving_in(report: &Report, generation: u64) -> usize {
    report
        .workers
        .iter()
        .filter(|w| w.state == WorkerState::Serving && w.generation == generation)
        .count()
}

fn reload(config: &Config, pid: Pid) -> i32 {
    let reading = RegionReader::open(&config.shm_file)
        .map_err(|e| e.to_string())
        .and_then(|region| Ok((region.report().map_err(|e| e.to_string())?, region)));
    let (first, region) = match reading {
        Ok(r) => r,
        Err(e) => {
            eprintln!("forkd: cannot follow the reload ({e}); sending HUP without waiting");
            return signal(pid, Signal::SIGHUP);
        }
    };
    let before = Before {
        ok: first.reloads_ok,
        failed: first.reloads_failed,
    };
    let code = signal(pid, Signal::SIGHUP);
    if code != 0 {
        return code;
    }
    let deadline = Instant::now() + RELOAD_WAIT;
    let mut last = first;
    loop {
        // An inconsistent reading (a fold under way for too long) is one more wait.
        if let Ok(report) = region.report() {
            last = report;
        }
        match progress(&last, &before) {
            Progress::Done { generation, .. } => {
                // A report reads the worker rows before the master's verdict, so the
                // reading that saw the verdict may hold rows from just before it:
                // count them in a reading taken after it (the rows it judged were
                // written before the verdict).
                let workers = (0..50)
                    .find_map(|_| match region.report() {
                        Ok(r) => Some(serving_in(&r, generation)),
                        Err(_) => {
                            std::thread::sleep(Duration::from_millis(10));
                            None
                        }
                    })
                    .unwrap_or_else(|| serving_in(&last, generation));
                println!("forkd: reloaded: configuration generation {generation} in force in {workers} worker(s)");
                return 0;
            }
            Progress::Failed(error) => {
                eprintln!(
                    "forkd: reload failed, the running configuration stays in force:\n{error}"
                );
                return 1;
            }
            Progress::Waiting => {}
        }
        if kill(pid, None).is_err() {
            eprintln!("forkd: the master {pid} exited during the reload");
            return 1;
        }
        if Instant::now() >= deadline {
            eprintln!(
                "forkd: the reload was accepted, but not every worker reports generation {} after {RELOAD_WAIT:?}: see the error log",
                last.config_generation
            );
            return 1;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `-s upgrade`: USR2, then wait until the old master counts the upgrade as done
/// (the new master serves) or failed (rolled back, with the reason).
fn upgrade(config: &Config, pid: Pid) -> i32 {
    let reading = RegionReader::open(&config.shm_file)
        .map_err(|e| e.to_string())
        .and_then(|region| Ok((region.report().map_err(|e| e.to_string())?, region)));
    let (first, region) = match reading {
        Ok(r) => r,
        Err(e) => {
            eprintln!("forkd: cannot follow the upgrade ({e}); sending USR2 without waiting");
            return signal(pid, Signal::SIGUSR2);
        }
    };
    let (ok, failed) = (first.upgrades_ok, first.upgrades_failed);
    let code = signal(pid, Signal::SIGUSR2);
    if code != 0 {
        return code;
    }
    // The old master gives up after upgrade_timeout; allow for its rollback too.
    let deadline = Instant::now() + config.upgrade_timeout + Duration::from_secs(10);
    let mut last = first;
    loop {
        if let Ok(report) = region.report() {
            last = report;
        }
        if last.upgrades_failed > failed {
            eprintln!(
                "forkd: upgrade failed and was rolled back; master {pid} keeps serving:\n{}",
                last.last_upgrade_error
            );
            return 1;
        }
        if last.upgrades_ok > ok {
            let new = daemon::read_live(&config.pid_file)
                .map_or_else(|_| "?".to_string(), |p| p.to_string());
            println!("forkd: upgraded: master {new} serves; master {pid} is draining its workers");
            return 0;
        }
        if kill(pid, None).is_err() {
            eprintln!("forkd: the master {pid} exited during the upgrade");
            return 1;
        }
        if Instant::now() >= deadline {
            eprintln!("forkd: no answer to the upgrade from master {pid}: see the error log");
            return 1;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

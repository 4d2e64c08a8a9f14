//! `forkd`: the master process and the command line.
//!
//! - `cli`: arguments.
//! - `control`: `-s`: signalling a running master through its pid file.
//! - `startup`: what the master does before its first fork.
//! - `supervisor`: the master's loop; owns the configuration in force, the sockets,
//!   the region and the pid file, and applies what the parts below report.
//! - `workers`: the workers of every generation, respawn with backoff, retiring.
//! - `reload`: HUP's plan (in place, new generation, refused), without side effects.
//! - `preflight`: a reload's dry run as the workers' user, before anything is published.
//! - `upgrade`: binary upgrade (USR2), the old master's state machine.
//! - `handover`: binary upgrade, the new master's takeover once its workers serve.
//! - `inherited`: sockets inherited from the previous master or from systemd.
//! - `notify`: systemd's sd_notify.
//! - `process`: every fork (a worker; a new master, which execs), and reaping.
//! - `netstat`: the kernel's TCP counters, read through one held descriptor.
//! - `signals`: the master's signalfd.
//! - `listeners`: binding the listening sockets.
//! - `daemon`: the pid file.
//! - `stats`: `forkd stats`, reading the shared-memory region.

mod cache_cli;
mod cli;
mod control;
mod daemon;
mod handover;
mod inherited;
mod listeners;
mod netstat;
mod notify;
mod preflight;
mod process;
mod reload;
mod signals;
mod startup;
mod stats;
mod supervisor;
mod upgrade;
mod workers;

use forkd_shared::config::Config;

fn main() {
    std::process::exit(run());
}

fn run() -> i32 {
    let cli = match cli::parse(std::env::args().skip(1)) {
        Ok(cli) => cli,
        Err(message) => {
            eprintln!("forkd: {message}\n{}", cli::USAGE);
            return 1;
        }
    };
    let action = match cli.action.clone() {
        cli::Action::Help => {
            println!("{}", cli::USAGE);
            return 0;
        }
        cli::Action::Version => {
            println!("forkd version {}", env!("CARGO_PKG_VERSION"));
            return 0;
        }
        cli::Action::Stats(args) if args.shm.is_some() => {
            return stats::run(args.shm.as_deref().expect("checked"), &args);
        }
        other => other,
    };
    let (config, text) = match Config::load_with_text(&cli.config) {
        Ok(loaded) => loaded,
        Err(errors) => {
            eprintln!("{errors}");
            if let cli::Action::Run = action {
                // Exec'd by a master being upgraded: it rolls back and says why.
                if let Some(mut upgrade) = inherited::UpgradeChild::from_env() {
                    upgrade.failed(&errors.to_string());
                }
            }
            if matches!(action, cli::Action::Test) {
                eprintln!(
                    "forkd: configuration file {} test failed",
                    cli.config.display()
                );
            }
            return 1;
        }
    };
    match action {
        cli::Action::Test => {
            for warning in &config.warnings {
                eprintln!("{warning}");
            }
            println!(
                "forkd: configuration file {} test is successful",
                config.file.display()
            );
            0
        }
        cli::Action::Signal(signal) => control::send(&config, signal),
        cli::Action::Run => startup::run(config, text),
        cli::Action::Stats(args) => stats::run(&config.shm_file, &args),
        cli::Action::Cache(args) => cache_cli::run(&config, &args),
        cli::Action::Help | cli::Action::Version => unreachable!("handled above"),
    }
}

//! `forkd`: the master process and the command line.
//!
//! - `cli`: arguments.
//! - `control`: `-s`: signalling a running master through its pid file.
//! - `supervisor`: the master's loop: signals, workers, reload, stop.
//! - `process`: forking a worker (the only `fork`) and reaping.
//! - `signals`: the master's signalfd.
//! - `listeners`: binding the listening sockets.
//! - `daemon`: the pid file.
//! - `stats`: `forkd stats`, reading the shared-memory region.

mod cli;
mod control;
mod daemon;
mod listeners;
mod process;
mod signals;
mod stats;
mod supervisor;

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
    let config = match Config::load(&cli.config) {
        Ok(config) => config,
        Err(errors) => {
            eprintln!("{errors}");
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
            println!(
                "forkd: configuration file {} test is successful",
                config.file.display()
            );
            0
        }
        cli::Action::Signal(signal) => control::send(&config, signal),
        cli::Action::Run => supervisor::run(config),
        cli::Action::Stats(args) => stats::run(&config.shm_file, &args),
        cli::Action::Help | cli::Action::Version => unreachable!("handled above"),
    }
}

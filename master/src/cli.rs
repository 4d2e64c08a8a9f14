//! Command-line arguments: `forkd [-c FILE] [-t] [-s SIGNAL] [-V]`.

use std::path::PathBuf;

pub const USAGE: &str = "usage: forkd [-c FILE] [-t] [-s stop|quit|reload|reopen|upgrade] [-V] [-h]
       forkd stats [-c FILE | --shm PATH] [--json] [--watch[=1s]]
  -c FILE   configuration file (default: conf/forkd.ron)
  -t        test the configuration and exit
  -s SIGNAL send a signal to the running master: stop (fast), quit (graceful),
            reload (re-read the configuration, wait until in force), reopen
            (re-open log files), upgrade (exec the binary on disk, wait until it serves)
  -V        print the version and exit
  -h        print this help and exit
  stats     print the shared-memory stats of the server configured in FILE (or of the
            region at PATH): a table per worker, or --json with every counter;
            --watch repeats every interval (default 1s) until interrupted";

/// What the master is asked to send with `-s`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlSignal {
    Stop,
    Quit,
    Reload,
    Reopen,
    Upgrade,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Run,
    Test,
    Signal(ControlSignal),
    Version,
    Help,
    Stats(StatsArgs),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsArgs {
    /// Read this region instead of the config's `shm_file`.
    pub shm: Option<PathBuf>,
    pub json: bool,
    /// Repeat every interval.
    pub watch: Option<std::time::Duration>,
}

#[derive(Debug, PartialEq, Eq)]
pub struct Cli {
    pub config: PathBuf,
    pub action: Action,
}

pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Cli, String> {
    let mut config = PathBuf::from("conf/forkd.ron");
    let mut action = Action::Run;
    let mut args = args.into_iter().peekable();
    if args.peek().map(String::as_str) == Some("stats") {
        args.next();
        let mut stats = StatsArgs {
            shm: None,
            json: false,
            watch: None,
        };
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "-c" => config = args.next().ok_or("-c needs a file name")?.into(),
                "--shm" => stats.shm = Some(args.next().ok_or("--shm needs a path")?.into()),
                "--json" => stats.json = true,
                "--watch" => stats.watch = Some(std::time::Duration::from_secs(1)),
                other => match other.strip_prefix("--watch=") {
                    Some(interval) => {
                        let d = forkd_shared::config::units::parse_duration(interval)?;
                        if d.is_zero() {
                            return Err("--watch interval must be above zero".into());
                        }
                        stats.watch = Some(d);
                    }
                    None => return Err(format!("unknown stats argument `{other}`")),
                },
            }
        }
        return Ok(Cli {
            config,
            action: Action::Stats(stats),
        });
    }
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "-c" => config = args.next().ok_or("-c needs a file name")?.into(),
            "-t" => action = Action::Test,
            "-V" | "--version" => action = Action::Version,
            "-h" | "--help" => action = Action::Help,
            "-s" => {
                let name = args.next().ok_or("-s needs a signal name")?;
                action = Action::Signal(match name.as_str() {
                    "stop" => ControlSignal::Stop,
                    "quit" => ControlSignal::Quit,
                    "reload" => ControlSignal::Reload,
                    "reopen" => ControlSignal::Reopen,
                    "upgrade" => ControlSignal::Upgrade,
                    other => {
                        return Err(format!(
                            "unknown signal `{other}`: use stop, quit, reload, reopen or upgrade"
                        ))
                    }
                });
            }
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    Ok(Cli { config, action })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Cli, String> {
        parse(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn defaults_to_running_the_bundled_config() {
        assert_eq!(
            p(&[]),
            Ok(Cli {
                config: "conf/forkd.ron".into(),
                action: Action::Run
            })
        );
    }

    #[test]
    fn flags() {
        assert_eq!(p(&["-c", "x.ron", "-t"]).unwrap().action, Action::Test);
        assert_eq!(
            p(&["-c", "x.ron", "-t"]).unwrap().config,
            PathBuf::from("x.ron")
        );
        assert_eq!(
            p(&["-s", "reload"]).unwrap().action,
            Action::Signal(ControlSignal::Reload)
        );
        assert_eq!(p(&["-V"]).unwrap().action, Action::Version);
    }

    #[test]
    fn stats_arguments() {
        let cli = p(&["stats", "--shm", "/x.shm", "--json", "--watch=2s"]).unwrap();
        assert_eq!(
            cli.action,
            Action::Stats(StatsArgs {
                shm: Some("/x.shm".into()),
                json: true,
                watch: Some(std::time::Duration::from_secs(2))
            })
        );
        assert!(p(&["stats", "--watch=0s"]).is_err());
        assert!(p(&["stats", "--frob"]).is_err());
    }

    #[test]
    fn bad_arguments() {
        assert!(p(&["-s", "kill"]).unwrap_err().contains("unknown signal"));
        assert!(p(&["-c"]).is_err());
        assert!(p(&["--frobnicate"]).is_err());
    }
}

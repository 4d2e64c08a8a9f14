//! Command-line arguments: `forkd [-c FILE] [-t] [-s SIGNAL] [-V]`.

use std::path::PathBuf;

pub const USAGE: &str = "usage: forkd [-c FILE] [-t] [-s stop|quit|reload|reopen|upgrade] [-V] [-h]
       forkd stats [-c FILE | --shm PATH] [--json] [--watch[=1s]]
       forkd cache stats [-c FILE] [--json]
       forkd cache purge [-c FILE] ZONE (KEY | --prefix PREFIX)
  -c FILE   configuration file (default: conf/forkd.ron)
  -t        test the configuration and exit
  -s SIGNAL send a signal to the running master: stop (fast), quit (graceful),
            reload (re-read the configuration, wait until in force), reopen
            (re-open log files), upgrade (exec the binary on disk, wait until it serves)
  -V        print the version and exit
  -h        print this help and exit
  stats     print the shared-memory stats of the server configured in FILE (or of the
            region at PATH): a table per worker, or --json with every counter;
            --watch repeats every interval (default 1s) until interrupted
  cache     the shared caches of the server configured in FILE: `stats` prints each
            zone's entries, bytes and counters (--json: as JSON); `purge` removes the
            entry of KEY (as the route's key template makes it, e.g.
            httpexample.com/page) or every key starting with PREFIX from ZONE";

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
    Cache(CacheArgs),
}

/// `forkd cache ...`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheArgs {
    Stats { json: bool },
    Purge { zone: String, what: PurgeWhat },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PurgeWhat {
    Key(String),
    Prefix(String),
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
    // `stats` may come anywhere (`forkd -c FILE stats` as well as `forkd stats -c FILE`).
    let mut stats: Option<StatsArgs> = None;
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        if arg == "cache" && stats.is_none() && action == Action::Run {
            let (c, cache) = parse_cache(args, config)?;
            return Ok(Cli {
                config: c,
                action: Action::Cache(cache),
            });
        }
        match (arg.as_str(), stats.as_mut()) {
            ("-c", _) => config = args.next().ok_or("-c needs a file name")?.into(),
            ("stats", None) => {
                stats = Some(StatsArgs {
                    shm: None,
                    json: false,
                    watch: None,
                })
            }
            ("--shm", Some(st)) => st.shm = Some(args.next().ok_or("--shm needs a path")?.into()),
            ("--json", Some(st)) => st.json = true,
            ("--watch", Some(st)) => st.watch = Some(std::time::Duration::from_secs(1)),
            (other, Some(st)) if other.starts_with("--watch=") => {
                let d = forkd_shared::config::units::parse_duration(&other["--watch=".len()..])?;
                if d.is_zero() {
                    return Err("--watch interval must be above zero".into());
                }
                st.watch = Some(d);
            }
            (other, Some(_)) => return Err(format!("unknown stats argument `{other}`")),
            ("-t", None) => action = Action::Test,
            ("-V" | "--version", None) => action = Action::Version,
            ("-h" | "--help", None) => action = Action::Help,
            ("-s", None) => {
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
            (other, None) => return Err(format!("unknown argument `{other}`")),
        }
    }
    if let Some(stats) = stats {
        if action != Action::Run {
            return Err("stats cannot be combined with -t, -s, -V or -h".into());
        }
        return Ok(Cli {
            config,
            action: Action::Stats(stats),
        });
    }
    Ok(Cli { config, action })
}

/// `cache stats [--json]` or `cache purge ZONE KEY|--prefix P`, `-c FILE` anywhere.
fn parse_cache(
    args: impl Iterator<Item = String>,
    mut config: PathBuf,
) -> Result<(PathBuf, CacheArgs), String> {
    let mut words = Vec::new();
    let mut json = false;
    let mut prefix = None;
    let mut args = args;
    while let Some(a) = args.next() {
        match a.as_str() {
            "-c" => config = args.next().ok_or("-c needs a file name")?.into(),
            "--json" => json = true,
            "--prefix" => prefix = Some(args.next().ok_or("--prefix needs a prefix")?),
            _ => words.push(a),
        }
    }
    let cache = match (words.first().map(String::as_str), &words[1..]) {
        (Some("stats"), []) if prefix.is_none() => CacheArgs::Stats { json },
        (Some("purge"), [zone]) if !json => match prefix {
            Some(p) => CacheArgs::Purge {
                zone: zone.clone(),
                what: PurgeWhat::Prefix(p),
            },
            None => return Err("cache purge needs a KEY or --prefix PREFIX".into()),
        },
        (Some("purge"), [zone, key]) if !json && prefix.is_none() => CacheArgs::Purge {
            zone: zone.clone(),
            what: PurgeWhat::Key(key.clone()),
        },
        _ => return Err(
            "use `forkd cache stats [--json]` or `forkd cache purge ZONE (KEY | --prefix PREFIX)`"
                .into(),
        ),
    };
    Ok((config, cache))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Cli, String> {
        parse(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn cache_subcommands() {
        let c = p(&["-c", "x.ron", "cache", "purge", "pages", "--prefix", "http"]).unwrap();
        assert_eq!(c.config, PathBuf::from("x.ron"));
        assert_eq!(
            c.action,
            Action::Cache(CacheArgs::Purge {
                zone: "pages".into(),
                what: PurgeWhat::Prefix("http".into())
            })
        );
        let c = p(&["cache", "stats", "--json", "-c", "y.ron"]).unwrap();
        assert_eq!(c.config, PathBuf::from("y.ron"));
        assert_eq!(c.action, Action::Cache(CacheArgs::Stats { json: true }));
        assert!(matches!(
            p(&["cache", "purge", "pages", "k"]).unwrap().action,
            Action::Cache(CacheArgs::Purge {
                what: PurgeWhat::Key(_),
                ..
            })
        ));
        assert!(p(&["cache", "purge", "pages"]).is_err());
        assert!(p(&["cache", "frob"]).is_err());
        assert!(p(&["cache", "purge", "pages", "k", "--prefix", "p"]).is_err());
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
        let cli = p(&["-c", "x.ron", "stats", "--json"]).unwrap();
        assert_eq!(cli.config, PathBuf::from("x.ron"));
        assert!(matches!(
            cli.action,
            Action::Stats(StatsArgs { json: true, .. })
        ));
        assert!(p(&["--json"]).is_err());
        assert!(p(&["stats", "-t"]).is_err());
        assert!(p(&["stats", "--frob"]).is_err());
    }

    #[test]
    fn bad_arguments() {
        assert!(p(&["-s", "kill"]).unwrap_err().contains("unknown signal"));
        assert!(p(&["-c"]).is_err());
        assert!(p(&["--frobnicate"]).is_err());
    }
}

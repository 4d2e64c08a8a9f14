//! The configuration: `file -> raw (serde mirror) -> validated Config`.
//!
//! ```text
//!  forkd.ron ──read──▶ text ──ron──▶ raw::RawConfig ──validate──▶ Config
//!                        │              (syntax, types, units,       (paths resolved,
//!                        │               unknown keys: 1st error)     cross-checks: every error)
//!                        └──────────── errors carry FILE:LINE:COL ─────────┘
//! ```
//!
//! The master loads it before forking; workers inherit the validated value.

pub mod cache;
pub mod cidr;
mod error;
pub mod limits;
mod locate;
mod model;
pub mod names;
pub mod overload;
pub mod raw;
pub mod shaping;
pub mod site;
pub mod tls;
pub mod units;
mod upstream;
mod validate;

pub use error::{ConfigError, ConfigErrorKind, ConfigErrors};
pub use model::{
    Compress, Config, ErrorPage, H2Settings, Handler, Listener, LogTarget, ProxyHeader, Route,
    Server,
};
pub use raw::{AcceptMode, AccessLogFormat, LogLevel};

pub use raw::{Balance, HashKey, HeaderName};
pub use upstream::{
    resolve_name, HealthCheck, Resolver, Timeouts, Upstream, UpstreamAddress, UpstreamServer,
    MAX_RESOLVED,
};

use std::path::Path;

/// The pipeline: file or text to a validated [`Config`].
impl Config {
    /// Reads, parses and validates `path`. Every error found carries FILE:LINE:COL.
    pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
        Config::load_with_text(path).map(|(config, _)| config)
    }

    /// Like [`Config::load`], also returning the text (to publish it to workers).
    pub fn load_with_text(path: &Path) -> Result<(Config, String), ConfigErrors> {
        let file = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        let text = std::fs::read_to_string(&file).map_err(|source| {
            ConfigErrors(vec![ConfigError {
                file: file.clone(),
                line: 0,
                col: 0,
                kind: ConfigErrorKind::Read(source),
            }])
        })?;
        Config::parse(&file, &text).map(|c| (c, text))
    }

    /// Parses and validates `text` as if read from `file`.
    pub fn parse(file: &Path, text: &str) -> Result<Config, ConfigErrors> {
        Config::parse_with(file, text, &upstream::resolve_name)
    }

    /// [`Config::parse`] for a worker adopting a reload: a server name `old`
    /// has already is given `old`'s addresses (the worker running the checks
    /// re-resolves it off the event loop), so only a name new to the worker is
    /// resolved here; certificates it may no longer read are taken from `old` as
    /// [`Config::parse_after`] does.
    pub fn parse_like(file: &Path, text: &str, old: &Config) -> Result<Config, ConfigErrors> {
        let known = |host: &str, port: u16| {
            old.upstreams
                .iter()
                .flat_map(|u| &u.servers)
                .find(|s| {
                    s.name
                        .as_ref()
                        .is_some_and(|(h, p)| h == host && *p == port)
                })
                .map(|s| s.resolved.clone())
        };
        let resolve = |host: &str, port: u16| {
            known(host, port).map_or_else(|| upstream::resolve_name(host, port), Ok)
        };
        Config::parse_full(file, text, &resolve, Some(old))
    }

    /// [`Config::parse`] with names resolved by `resolve` (host, port -> addresses).
    pub fn parse_with(
        file: &Path,
        text: &str,
        resolve: &Resolver<'_>,
    ) -> Result<Config, ConfigErrors> {
        Config::parse_full(file, text, resolve, None)
    }

    /// Like [`Config::parse`], for a process running `running`: a certificate file it
    /// may not read (a worker that gave up root; keys are often root's alone) is taken
    /// from `running` when the same files are named there. The master reads the
    /// files itself, and a changed certificate starts workers that have it
    /// ([`Config::needs_new_workers`]), so only unchanged ones are taken this way.
    pub fn parse_after(
        file: &Path,
        text: &str,
        running: Option<&Config>,
    ) -> Result<Config, ConfigErrors> {
        Config::parse_full(file, text, &upstream::resolve_name, running)
    }

    /// The parse all the others are: names resolved by `resolve`, certificates
    /// unreadable now taken from `running`.
    fn parse_full(
        file: &Path,
        text: &str,
        resolve: &Resolver<'_>,
        running: Option<&Config>,
    ) -> Result<Config, ConfigErrors> {
        let raw: raw::RawConfig = ron::Options::default().from_str(text).map_err(|e| {
            ConfigErrors(vec![ConfigError {
                file: file.to_path_buf(),
                line: e.span.start.line,
                col: e.span.start.col,
                kind: ConfigErrorKind::Syntax(e.code),
            }])
        })?;
        validate::validate(file, text, raw, resolve, running)
    }
}

//! Validated `upstreams`: `raw::RawUpstream -> Upstream`, addresses resolved.
//!
//! Locating errors: serde keeps no positions, so an error about an upstream is placed
//! at its key (`"app": (`) or at the first matching text after it.

use super::raw::{RawUpstream, UpstreamAddr};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

/// One entry of `upstreams`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    pub name: String,
    /// Never empty.
    pub servers: Vec<UpstreamServer>,
    /// Idle connections kept per worker and server; 0 = none.
    pub keepalive: usize,
    pub keepalive_timeout: Duration,
    /// At least 1.
    pub keepalive_requests: u64,
    pub connect_timeout: Duration,
    pub send_timeout: Duration,
    pub read_timeout: Duration,
    /// Attempts beyond the first.
    pub retries: u32,
    /// The adaptive concurrency limit, if any.
    pub overload: Option<super::overload::Overload>,
}

/// One server of an upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamServer {
    pub addr: UpstreamAddress,
    /// The address as written in the file (`app.internal:9000`), for logs and stats.
    pub label: String,
}

/// Where an upstream server listens.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum UpstreamAddress {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl std::fmt::Display for UpstreamAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UpstreamAddress::Tcp(addr) => write!(f, "{addr}"),
            UpstreamAddress::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

/// A problem with one upstream, located by `validate`.
pub(super) enum UpstreamProblem {
    /// `servers: []`.
    NoServers,
    /// `keepalive_requests: 0`.
    ZeroKeepaliveRequests,
    /// A host name that does not resolve (the address as written, and why).
    Unresolved(String, String),
    /// `overload`'s `min_limit` above its `max_limit`.
    OverloadBounds { min: u32, max: u32 },
}

/// Validates one upstream; returns it, or every problem found.
pub(super) fn validate_upstream(
    name: &str,
    raw: RawUpstream,
) -> Result<Upstream, Vec<UpstreamProblem>> {
    let mut problems = Vec::new();
    if raw.servers.is_empty() {
        problems.push(UpstreamProblem::NoServers);
    }
    if raw.keepalive_requests == 0 {
        problems.push(UpstreamProblem::ZeroKeepaliveRequests);
    }
    let mut servers = Vec::with_capacity(raw.servers.len());
    for addr in raw.servers {
        match addr {
            UpstreamAddr::Ip(a) => servers.push(UpstreamServer {
                addr: UpstreamAddress::Tcp(a),
                label: a.to_string(),
            }),
            UpstreamAddr::Unix(p) => servers.push(UpstreamServer {
                label: format!("unix:{}", p.display()),
                addr: UpstreamAddress::Unix(p),
            }),
            UpstreamAddr::Name(host, port) => {
                let label = format!("{host}:{port}");
                // Every address of the name is a server, as nginx does.
                match (host.as_str(), port).to_socket_addrs() {
                    Ok(addrs) => {
                        let before = servers.len();
                        for a in addrs {
                            servers.push(UpstreamServer {
                                addr: UpstreamAddress::Tcp(a),
                                label: label.clone(),
                            });
                        }
                        if servers.len() == before {
                            problems
                                .push(UpstreamProblem::Unresolved(label, "no addresses".into()));
                        }
                    }
                    Err(e) => problems.push(UpstreamProblem::Unresolved(label, e.to_string())),
                }
            }
        }
    }
    if let Some(o) = &raw.overload {
        if o.min_limit > o.max_limit {
            problems.push(UpstreamProblem::OverloadBounds {
                min: o.min_limit,
                max: o.max_limit,
            });
        }
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    Ok(Upstream {
        name: name.to_string(),
        servers,
        keepalive: raw.keepalive,
        keepalive_timeout: raw.keepalive_timeout.0,
        keepalive_requests: raw.keepalive_requests,
        connect_timeout: raw.connect_timeout.0,
        send_timeout: raw.send_timeout.0,
        read_timeout: raw.read_timeout.0,
        retries: raw.retries,
        overload: raw.overload,
    })
}

//! Which servers each listener's connections may be routed to, from the
//! configuration: read by the TLS acceptors (a listener's certificates) and by the
//! connections (a request's `Host`), kept in the worker's services.

use forkd_shared::config::Config;

/// Which servers a listener's connections may be routed to.
pub struct Routing {
    pub servers: Vec<usize>,
    /// The first server on the address: used when no name matches.
    pub default: usize,
    /// The largest `max_header_bytes` among `servers`: how much of a head is read
    /// before its `Host` can select a server.
    pub max_header_bytes: usize,
}

/// For each listener, the servers on its address (a validated config has at least one).
pub fn routing(config: &Config) -> Vec<Routing> {
    config
        .listeners
        .iter()
        .map(|l| {
            let servers: Vec<usize> = (0..config.servers.len())
                .filter(|&s| config.servers[s].listen.contains(&l.addr))
                .collect();
            let max_header_bytes = servers
                .iter()
                .map(|&s| config.servers[s].max_header_bytes)
                .max()
                .unwrap_or(16384);
            Routing {
                default: servers[0],
                servers,
                max_header_bytes,
            }
        })
        .collect()
}

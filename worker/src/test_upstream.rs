//! For the worker's unit tests: an upstream on 127.0.0.1 with the defaults the tests
//! share (round robin, `max_fails: 1`, one retry, no checks, no overload limit); each
//! test changes the fields it is about with struct update syntax.

use forkd_shared::config::{Balance, Upstream, UpstreamAddress, UpstreamServer};
use std::time::Duration;

/// An upstream `name` with one server per port in `ports` (weight 1, not a backup).
pub fn upstream(name: &str, ports: &[u16]) -> Upstream {
    Upstream {
        name: name.into(),
        servers: ports.iter().map(|&p| server(p)).collect(),
        keepalive: 0,
        keepalive_timeout: Duration::from_secs(4),
        keepalive_requests: 100,
        connect_timeout: Duration::from_secs(1),
        send_timeout: Duration::from_secs(1),
        read_timeout: Duration::from_secs(1),
        retries: 1,
        balance: Balance::RoundRobin,
        max_fails: 1,
        fail_timeout: Duration::from_secs(10),
        slow_start: Duration::ZERO,
        health_check: None,
        resolve_every: Duration::from_secs(30),
        tunnel_idle_timeout: Duration::from_secs(3600),
        overload: None,
    }
}

/// A server at 127.0.0.1:`port`, weight 1, not a backup.
pub fn server(port: u16) -> UpstreamServer {
    UpstreamServer {
        addr: UpstreamAddress::Tcp(([127, 0, 0, 1], port).into()),
        label: format!("127.0.0.1:{port}"),
        name: None,
        resolved: vec![([127, 0, 0, 1], port).into()],
        weight: 1,
        backup: false,
    }
}

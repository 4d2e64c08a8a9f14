//! The TLS side of each listener: a rustls `ServerConfig` when its servers have
//! `tls`, with an SNI resolver over their certificates.

use super::stream::Tls;
use super::tickets::Tickets;
use crate::routing::Routing;
use forkd_shared::config::names::name_matches;
use forkd_shared::config::tls::TlsVersion;
use forkd_shared::config::Config;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use std::sync::Arc;

/// Per listener (by index), its TLS configuration, if it is a TLS address.
#[derive(Default)]
pub struct Acceptors {
    by_listener: Vec<Option<Arc<ServerConfig>>>,
}

/// Why a listener's TLS configuration could not be built.
#[derive(Debug)]
pub struct BuildError {
    pub addr: std::net::SocketAddr,
    pub source: rustls::Error,
}

impl std::fmt::Display for BuildError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TLS on {}: {}", self.addr, self.source)
    }
}

impl Acceptors {
    /// Builds the configuration of every TLS listener of `config`.
    pub fn new(
        config: &Config,
        routing: &[Routing],
        resumption: &Resumption,
    ) -> Result<Acceptors, BuildError> {
        let mut by_listener = Vec::with_capacity(routing.len());
        for (l, r) in config.listeners.iter().zip(routing) {
            by_listener.push(server_config(config, r, resumption).map_err(|source| {
                BuildError {
                    addr: l.addr,
                    source,
                }
            })?);
        }
        Ok(Acceptors { by_listener })
    }

    /// Whether any listener speaks TLS.
    pub fn any(&self) -> bool {
        self.by_listener.iter().any(Option::is_some)
    }

    /// The TLS session of a connection accepted on `listener`; `None`: close it (a
    /// TLS session could not be started, which only a configuration rustls refuses
    /// causes: nothing is served in plain text on an HTTPS address).
    pub fn accept(&self, listener: usize) -> Option<Tls> {
        match self.by_listener.get(listener).and_then(Option::as_ref) {
            Some(config) => match rustls::ServerConnection::new(config.clone()) {
                Ok(conn) => Some(Tls::server(conn)),
                Err(e) => {
                    forkd_shared::error!("starting a TLS session failed: {e}");
                    None
                }
            },
            None => Some(Tls::none()),
        }
    }
}

/// What outlives a configuration: the ticketer (keys from the region) and the
/// worker's TLS 1.2 session cache, shared by every listener's `ServerConfig`.
pub struct Resumption {
    pub tickets: Arc<Tickets>,
    pub sessions: Arc<dyn rustls::server::StoresServerSessions>,
}

impl Resumption {
    pub fn new() -> Resumption {
        Resumption {
            tickets: Arc::new(Tickets::new(super::tickets::LIFETIME_SECS)),
            sessions: rustls::server::ServerSessionMemoryCache::new(super::tickets::SESSION_CACHE),
        }
    }
}

impl Default for Resumption {
    fn default() -> Self {
        Resumption::new()
    }
}

fn server_config(
    config: &Config,
    routing: &Routing,
    resumption: &Resumption,
) -> Result<Option<Arc<ServerConfig>>, rustls::Error> {
    let mut entries = Vec::new();
    let mut default = 0;
    for &s in &routing.servers {
        let server = &config.servers[s];
        let Some(tls) = &server.tls else { continue };
        if s == routing.default {
            default = entries.len();
        }
        entries.push(Entry {
            names: server.names.clone(),
            keys: tls.certificates.iter().map(|c| c.key.clone()).collect(),
            versions: tls.versions.clone(),
            tickets: tls.session_tickets,
            http2: tls.http2,
        });
    }
    if entries.is_empty() {
        return Ok(None);
    }
    // The address's default server decides what the address offers: versions and
    // tickets are negotiated before SNI chooses a server.
    let first = &entries[default];
    let mut versions: Vec<&'static rustls::SupportedProtocolVersion> = Vec::new();
    if first.versions.contains(&TlsVersion::Tls13) {
        versions.push(&rustls::version::TLS13);
    }
    if first.versions.contains(&TlsVersion::Tls12) {
        versions.push(&rustls::version::TLS12);
    }
    let session_tickets = first.tickets;
    let http2 = first.http2;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut sc = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&versions)?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(Resolver { entries, default }));
    // ALPN, like versions, is chosen before SNI: the default server's `http2` decides.
    sc.alpn_protocols = match http2 {
        true => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
        false => vec![b"http/1.1".to_vec()],
    };
    sc.session_storage = resumption.sessions.clone();
    if session_tickets {
        sc.ticketer = resumption.tickets.clone();
    } else {
        sc.send_tls13_tickets = 0;
    }
    Ok(Some(Arc::new(sc)))
}

/// One TLS server of the address: its names and certificates.
#[derive(Debug)]
struct Entry {
    names: Vec<String>,
    keys: Vec<Arc<CertifiedKey>>,
    versions: Vec<TlsVersion>,
    tickets: bool,
    http2: bool,
}

/// SNI: the server whose `names` match (exactly, or `*.example.com` for one label),
/// else the address's default; among its certificates the first whose key can sign
/// with a scheme the client offers (an ECDSA and an RSA chain side by side).
#[derive(Debug)]
struct Resolver {
    entries: Vec<Entry>,
    default: usize,
}

impl Resolver {
    fn entry(&self, sni: Option<&str>) -> &Entry {
        sni.and_then(|name| {
            let exact = self
                .entries
                .iter()
                .find(|e| e.names.iter().any(|n| n.eq_ignore_ascii_case(name)));
            exact.or_else(|| {
                self.entries
                    .iter()
                    .find(|e| e.names.iter().any(|n| name_matches(n, name.as_bytes())))
            })
        })
        .unwrap_or(&self.entries[self.default])
    }
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let entry = self.entry(hello.server_name());
        let schemes = hello.signature_schemes();
        entry
            .keys
            .iter()
            .find(|k| k.key.choose_scheme(schemes).is_some())
            .or_else(|| entry.keys.first())
            .cloned()
    }
}

//! TLS for the end-to-end tests: certificates made in the test (`rcgen`), a rustls
//! client that verifies them, and the answers it gets (status, body, the certificate
//! served, whether the session was resumed).
//!
//! Included by a test file as `#[path = "support/tls.rs"] mod tls_support;` beside
//! `mod support;` (it uses `crate::support` for the HTTP parsing).

use crate::support::{parse_head, Response};
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, HandshakeKind, ProtocolVersion, StreamOwned};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// A certificate authority made for one test.
pub struct TestCa {
    cert: rcgen::Certificate,
    key: rcgen::KeyPair,
}

/// A certificate the CA issued: the chain (leaf, then the CA) and the key, as PEM.
pub struct Issued {
    pub chain_pem: String,
    pub key_pem: String,
    /// The leaf, DER: what a client sees as the server's certificate.
    pub leaf: Vec<u8>,
}

impl Issued {
    /// Writes `<stem>.pem` (the chain) and `<stem>.key` into `dir`.
    pub fn write(&self, dir: &Path, stem: &str) {
        std::fs::write(dir.join(format!("{stem}.pem")), &self.chain_pem).unwrap();
        std::fs::write(dir.join(format!("{stem}.key")), &self.key_pem).unwrap();
    }
}

/// Days since the epoch as a calendar date.
fn date_of(days: i64) -> (i32, u8, u8) {
    let (y, m, d) = forkd_shared::log::civil_from_days(days);
    (y as i32, m as u8, d as u8)
}

fn today() -> i64 {
    (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        / 86400) as i64
}

impl TestCa {
    pub fn new() -> TestCa {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "forkd test CA");
        let cert = params.self_signed(&key).unwrap();
        TestCa { cert, key }
    }

    pub fn pem(&self) -> String {
        self.cert.pem()
    }

    /// A leaf for `names` (the first is its common name), valid for `days` from today
    /// (negative: already expired), ECDSA P-256.
    pub fn issue(&self, names: &[&str], days: i64) -> Issued {
        self.issue_with(names, days, &rcgen::PKCS_ECDSA_P256_SHA256)
    }

    pub fn issue_with(
        &self,
        names: &[&str],
        days: i64,
        alg: &'static rcgen::SignatureAlgorithm,
    ) -> Issued {
        self.issue_for(names, days, rcgen::KeyPair::generate_for(alg).unwrap())
    }

    /// A leaf for a key made elsewhere (RSA: ring cannot make RSA keys; `openssl
    /// genpkey` can), PKCS#8 PEM.
    pub fn issue_for_key(&self, names: &[&str], days: i64, key_pem: &str) -> Issued {
        self.issue_for(names, days, rcgen::KeyPair::from_pem(key_pem).unwrap())
    }

    fn issue_for(&self, names: &[&str], days: i64, key: rcgen::KeyPair) -> Issued {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = rcgen::CertificateParams::new(names.clone()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, names[0].clone());
        let (y, m, d) = date_of(today() - 1);
        params.not_before = rcgen::date_time_ymd(y, m, d);
        let (y, m, d) = date_of(today() + days);
        params.not_after = rcgen::date_time_ymd(y, m, d);
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        Issued {
            chain_pem: cert.pem() + &self.cert.pem(),
            key_pem: key.serialize_pem(),
            leaf: cert.der().to_vec(),
        }
    }

    /// A client trusting this CA, offering `http/1.1`, keeping sessions (tickets) for
    /// resumption across its connections.
    pub fn client(&self) -> Arc<ClientConfig> {
        self.client_with(&[&rustls::version::TLS13, &rustls::version::TLS12], true)
    }

    /// A client that never resumes: every handshake is a full one (and shows the
    /// certificate served now).
    pub fn client_without_resumption(&self) -> Arc<ClientConfig> {
        let mut config = (*self.client()).clone();
        config.resumption = rustls::client::Resumption::disabled();
        Arc::new(config)
    }

    pub fn client_with(
        &self,
        versions: &[&'static rustls::SupportedProtocolVersion],
        sni: bool,
    ) -> Arc<ClientConfig> {
        self.client_trusting(versions, sni, rustls::crypto::ring::default_provider(), &[])
    }

    /// A client with its own crypto provider (cipher suites), trusting this CA and
    /// the certificates `extra_roots` (DER).
    pub fn client_trusting(
        &self,
        versions: &[&'static rustls::SupportedProtocolVersion],
        sni: bool,
        provider: rustls::crypto::CryptoProvider,
        extra_roots: &[Vec<u8>],
    ) -> Arc<ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from(self.cert.der().to_vec()))
            .unwrap();
        for der in extra_roots {
            roots.add(CertificateDer::from(der.clone())).unwrap();
        }
        let provider = Arc::new(provider);
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(versions)
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        config.enable_sni = sni;
        Arc::new(config)
    }
}

impl Default for TestCa {
    fn default() -> Self {
        TestCa::new()
    }
}

/// One TLS connection of the client.
pub struct TlsConn {
    pub s: StreamOwned<ClientConnection, TcpStream>,
    buf: Vec<u8>,
}

/// What a finished handshake said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handshake {
    pub resumed: bool,
    pub version: Option<ProtocolVersion>,
    pub alpn: Option<Vec<u8>>,
    /// The server's leaf certificate, DER.
    pub leaf: Vec<u8>,
}

impl TlsConn {
    /// Connects to 127.0.0.1:`port`, verifying the certificate for `name` (sent as SNI
    /// unless the config disables it), and completes the handshake.
    pub fn connect(port: u16, name: &str, config: &Arc<ClientConfig>) -> Result<TlsConn, String> {
        TlsConn::connect_after(port, name, config, &[])
    }

    /// Like [`TlsConn::connect`], writing `preface` on the TCP connection before the
    /// handshake starts (a PROXY protocol header, as a balancer sends it).
    pub fn connect_after(
        port: u16,
        name: &str,
        config: &Arc<ClientConfig>,
        preface: &[u8],
    ) -> Result<TlsConn, String> {
        let mut tcp =
            TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("connect: {e}"))?;
        tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        tcp.set_write_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        tcp.write_all(preface)
            .map_err(|e| format!("write the preface: {e}"))?;
        let server_name = ServerName::try_from(name.to_string()).map_err(|e| e.to_string())?;
        let conn = ClientConnection::new(config.clone(), server_name)
            .map_err(|e| format!("client: {e}"))?;
        let mut s = StreamOwned::new(conn, tcp);
        while s.conn.is_handshaking() {
            s.conn
                .complete_io(&mut s.sock)
                .map_err(|e| format!("handshake: {e}"))?;
        }
        Ok(TlsConn { s, buf: Vec::new() })
    }

    pub fn handshake(&self) -> Handshake {
        let c = &self.s.conn;
        Handshake {
            resumed: c.handshake_kind() == Some(HandshakeKind::Resumed),
            version: c.protocol_version(),
            alpn: c.alpn_protocol().map(<[u8]>::to_vec),
            leaf: c
                .peer_certificates()
                .and_then(|certs| certs.first())
                .map(|c| c.as_ref().to_vec())
                .unwrap_or_default(),
        }
    }

    pub fn send(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.s
            .write_all(bytes)
            .and_then(|()| self.s.flush())
            .map_err(|e| format!("write: {e}"))
    }

    fn fill(&mut self) -> Result<(), String> {
        let mut chunk = [0u8; 16384];
        match self.s.read(&mut chunk) {
            Ok(0) => Err("the server closed the connection".into()),
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                Ok(())
            }
            Err(e) => Err(format!("read: {e}")),
        }
    }

    /// Reads one response (its body by `Content-Length`).
    pub fn response(&mut self) -> Result<Response, String> {
        let end = loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            self.fill()?;
        };
        let mut r = parse_head(&self.buf[..end])?;
        self.buf.drain(..end);
        let len = r.content_length()?;
        while self.buf.len() < len {
            self.fill()?;
        }
        r.body = self.buf.drain(..len).collect();
        Ok(r)
    }

    /// GET `path` with `Host: host` on this connection (kept alive).
    pub fn get(&mut self, host: &str, path: &str) -> Result<Response, String> {
        self.send(format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())?;
        self.response()
    }
}

/// One GET on a new connection: the handshake and the response.
pub fn tls_get(
    port: u16,
    name: &str,
    config: &Arc<ClientConfig>,
    path: &str,
) -> Result<(Handshake, Response), String> {
    let mut c = TlsConn::connect(port, name, config)?;
    let r = c.get(name, path)?;
    Ok((c.handshake(), r))
}

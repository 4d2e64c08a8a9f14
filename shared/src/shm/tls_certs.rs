//! The certificates in force and when each expires, in an area appended to the
//! region: the master writes the table whenever it publishes a configuration (start,
//! reload, upgrade, rollback); `forkd stats` (table and `--json`) and the `Status`
//! and `Metrics` routes read it, so an operator's monitoring sees a renewal that did
//! not happen before clients do.

use super::cells::Text;
use crate::config::Config;
use serde::Serialize;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};

/// Certificates the table holds (more are left out, with a warning).
pub const MAX_CERTS: usize = 32;

#[repr(C)]
pub struct CertEntry {
    /// `notAfter`, seconds since the epoch.
    pub not_after_s: AtomicU64,
    /// The server's first name (or its first listen address).
    pub server: Text<128>,
    /// The certificate file.
    pub file: Text<256>,
}

#[repr(C)]
pub struct TlsCertsArea {
    pub count: AtomicU32,
    pub entries: [CertEntry; MAX_CERTS],
}

/// One certificate as read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CertReport {
    pub server: String,
    pub file: String,
    pub not_after_s: u64,
}

/// Writes the certificates of `config` (all servers, in order). Returns a warning
/// when some did not fit.
pub fn publish(area: &TlsCertsArea, config: &Config) -> Option<String> {
    let mut n = 0;
    let mut left_out = 0;
    for s in &config.servers {
        let Some(tls) = &s.tls else { continue };
        let server = s
            .names
            .first()
            .cloned()
            .or_else(|| s.listen.first().map(|a| a.to_string()))
            .unwrap_or_default();
        for c in &tls.certificates {
            let Some(e) = area.entries.get(n) else {
                left_out += 1;
                continue;
            };
            // Cleared first: a reader between the two sees no date, not a wrong one.
            e.not_after_s.store(0, Relaxed);
            e.server.set(&server);
            e.file.set(&c.cert_path.display().to_string());
            let secs = c
                .not_after
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            e.not_after_s.store(secs, Release);
            n += 1;
        }
    }
    area.count.store(n as u32, Release);
    (left_out > 0).then(|| {
        format!("{left_out} certificate(s) beyond the first {MAX_CERTS} are not shown in the stats")
    })
}

/// The certificates in force.
pub fn read(area: &TlsCertsArea) -> Vec<CertReport> {
    let n = (area.count.load(Acquire) as usize).min(MAX_CERTS);
    area.entries[..n]
        .iter()
        .filter_map(|e| {
            let not_after_s = e.not_after_s.load(Acquire);
            (not_after_s != 0).then(|| CertReport {
                server: e.server.get(),
                file: e.file.get(),
                not_after_s,
            })
        })
        .collect()
}

/// The table's section: one line per certificate with its expiry date and days left.
pub fn table(o: &mut String, certs: &[CertReport]) {
    if certs.is_empty() {
        return;
    }
    let now = super::now_ms() / 1000;
    let _ = writeln!(o, "\nTLS certificates:");
    for c in certs {
        let date = httpdate::fmt_http_date(
            std::time::UNIX_EPOCH + std::time::Duration::from_secs(c.not_after_s),
        );
        let days = (c.not_after_s as i64 - now as i64).div_euclid(86400);
        let _ = writeln!(
            o,
            "  {:<32} expires {date} ({days} days)  {}",
            c.server, c.file
        );
    }
}

/// `forkd_tls_certificate_expiry_timestamp_seconds{server, file}`.
pub fn prometheus(o: &mut String, certs: &[CertReport]) {
    if certs.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "# HELP forkd_tls_certificate_expiry_timestamp_seconds When a certificate in force expires (notAfter).\n# TYPE forkd_tls_certificate_expiry_timestamp_seconds gauge"
    );
    let esc = |s: &str| {
        s.replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n")
    };
    for c in certs {
        let _ = writeln!(
            o,
            "forkd_tls_certificate_expiry_timestamp_seconds{{server=\"{}\",file=\"{}\"}} {}",
            esc(&c.server),
            esc(&c.file),
            c.not_after_s
        );
    }
}

//! A server's `tls`: its certificates (chain and key, PEM files read when the
//! configuration is loaded), the protocol versions it offers and whether it issues
//! session tickets.
//!
//! ```text
//!  RawTls ──read PEM──▶ chain + key ──checks──▶ Tls { certificates: [Certificate] }
//!                         │  key matches the leaf, each certificate issued by the next,
//!                         │  not after ─▶ warning when expired or within EXPIRY_WARNING
//!                         └─ every problem a `CertProblem`, located by `validate`
//! ```
//!
//! Reading the files here, in the loader, makes `-t` and a reload refuse a bad
//! certificate before anything is published; a worker adopting a reload in place
//! parses the same text and so reads the renewed files itself.

use rustls::crypto::ring::sign::any_supported_type;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use serde::Deserialize;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A certificate expiring sooner than this is a warning.
pub const EXPIRY_WARNING: Duration = Duration::from_secs(30 * 24 * 3600);

/// `tls: Some((certificates: [...], versions: [Tls12, Tls13], session_tickets: true,
/// http2: true))`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTls {
    pub certificates: Vec<RawCertificate>,
    #[serde(default = "default_versions")]
    pub versions: Vec<TlsVersion>,
    #[serde(default = "default_tickets")]
    pub session_tickets: bool,
    /// Offer HTTP/2 by ALPN (`h2`, then `http/1.1`).
    #[serde(default = "default_http2")]
    pub http2: bool,
}

fn default_http2() -> bool {
    true
}

/// `(cert: "chain.pem", key: "key.pem")`: the chain leaf first, then its issuers.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCertificate {
    pub cert: String,
    pub key: String,
}

#[derive(Debug, Deserialize, Clone, Copy, PartialEq, Eq)]
pub enum TlsVersion {
    Tls12,
    Tls13,
}

fn default_versions() -> Vec<TlsVersion> {
    vec![TlsVersion::Tls12, TlsVersion::Tls13]
}

fn default_tickets() -> bool {
    true
}

/// A validated `tls`.
#[derive(Debug, Clone)]
pub struct Tls {
    pub certificates: Vec<Certificate>,
    pub versions: Vec<TlsVersion>,
    pub session_tickets: bool,
    pub http2: bool,
}

/// One loaded certificate chain with its key.
#[derive(Debug, Clone)]
pub struct Certificate {
    pub cert_path: PathBuf,
    pub key_path: PathBuf,
    /// The chain and its signing key, ready for rustls.
    pub key: Arc<CertifiedKey>,
    /// The leaf's `notAfter`.
    pub not_after: SystemTime,
    /// The leaf's subject, as readable text (`CN=example.com`), for messages and stats.
    pub subject: String,
}

/// What is wrong with one `(cert, key)` entry.
#[derive(Debug)]
pub enum CertProblem {
    /// A file could not be read.
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The file holds no PEM certificate (or no PEM private key).
    NoneFound { path: PathBuf, what: &'static str },
    /// The PEM text is malformed.
    Pem { path: PathBuf, message: String },
    /// A certificate rustls cannot parse.
    BadCertificate { path: PathBuf, index: usize },
    /// A key rustls cannot use (unsupported algorithm, malformed).
    BadKey { path: PathBuf, message: String },
    /// The key is not the leaf certificate's.
    KeyMismatch { cert: PathBuf, key: PathBuf },
    /// Certificate `index` (0 = leaf) was not issued by the one after it.
    ChainOrder { path: PathBuf, index: usize },
}

impl fmt::Display for CertProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CertProblem::Read { path, source } => {
                write!(f, "cannot read `{}`: {source}", path.display())
            }
            CertProblem::NoneFound { path, what } => {
                write!(f, "`{}` holds no PEM {what}", path.display())
            }
            CertProblem::Pem { path, message } => {
                write!(f, "`{}` is not valid PEM: {message}", path.display())
            }
            CertProblem::BadCertificate { path, index } => write!(
                f,
                "certificate {} in `{}` is not a valid X.509 certificate",
                index + 1,
                path.display()
            ),
            CertProblem::BadKey { path, message } => {
                write!(f, "the key in `{}` cannot be used: {message}", path.display())
            }
            CertProblem::KeyMismatch { cert, key } => write!(
                f,
                "the key in `{}` does not match the certificate in `{}`",
                key.display(),
                cert.display()
            ),
            CertProblem::ChainOrder { path, index } => write!(
                f,
                "the chain in `{}` is out of order: certificate {} was not issued by certificate {} (the leaf comes first, then each issuer)",
                path.display(),
                index + 1,
                index + 2
            ),
        }
    }
}

/// Reads `cert` and `key` (relative to `base`) and checks them.
pub fn load_certificate(base: &Path, raw: &RawCertificate) -> Result<Certificate, CertProblem> {
    let cert_path = base.join(&raw.cert);
    let key_path = base.join(&raw.key);
    let cert_pem = std::fs::read(&cert_path).map_err(|source| CertProblem::Read {
        path: cert_path.clone(),
        source,
    })?;
    let key_pem = std::fs::read(&key_path).map_err(|source| CertProblem::Read {
        path: key_path.clone(),
        source,
    })?;
    let mut chain: Vec<CertificateDer<'static>> = Vec::new();
    for item in CertificateDer::pem_slice_iter(&cert_pem) {
        chain.push(item.map_err(|e| CertProblem::Pem {
            path: cert_path.clone(),
            message: format!("{e:?}"),
        })?);
    }
    if chain.is_empty() {
        return Err(CertProblem::NoneFound {
            path: cert_path,
            what: "certificate",
        });
    }
    let key = match PrivateKeyDer::from_pem_slice(&key_pem) {
        Ok(key) => key,
        Err(rustls::pki_types::pem::Error::NoItemsFound) => {
            return Err(CertProblem::NoneFound {
                path: key_path,
                what: "private key",
            })
        }
        Err(e) => {
            return Err(CertProblem::Pem {
                path: key_path,
                message: format!("{e:?}"),
            })
        }
    };
    let mut parsed = Vec::with_capacity(chain.len());
    for (index, der) in chain.iter().enumerate() {
        parsed.push(
            der::parse(der.as_ref()).ok_or_else(|| CertProblem::BadCertificate {
                path: cert_path.clone(),
                index,
            })?,
        );
    }
    for (index, pair) in parsed.windows(2).enumerate() {
        if pair[0].issuer != pair[1].subject {
            return Err(CertProblem::ChainOrder {
                path: cert_path,
                index,
            });
        }
    }
    let signing = any_supported_type(&key).map_err(|e| CertProblem::BadKey {
        path: key_path.clone(),
        message: e.to_string(),
    })?;
    let certified = CertifiedKey::new(chain, signing);
    if certified.keys_match().is_err() {
        return Err(CertProblem::KeyMismatch {
            cert: cert_path,
            key: key_path,
        });
    }
    let leaf = &parsed[0];
    Ok(Certificate {
        cert_path,
        key_path,
        key: Arc::new(certified),
        not_after: UNIX_EPOCH + Duration::from_secs(leaf.not_after.max(0) as u64),
        subject: leaf.subject_text.clone(),
    })
}

/// A warning about `cert`'s expiry at `now`, if it is due.
pub fn expiry_warning(cert: &Certificate, now: SystemTime) -> Option<String> {
    let date = httpdate::fmt_http_date(cert.not_after);
    match cert.not_after.duration_since(now) {
        Err(_) => Some(format!(
            "the certificate in `{}` ({}) expired on {date}",
            cert.cert_path.display(),
            cert.subject
        )),
        Ok(left) if left < EXPIRY_WARNING => Some(format!(
            "the certificate in `{}` ({}) expires on {date}, in {} day(s)",
            cert.cert_path.display(),
            cert.subject,
            left.as_secs() / 86400
        )),
        Ok(_) => None,
    }
}

/// Just enough DER to read a certificate's issuer, subject and `notAfter` (RFC 5280
/// section 4.1): rustls checks the rest, and a full X.509 crate would be a large
/// dependency for three fields.
mod der {
    pub struct Parsed {
        /// The issuer and subject names as encoded (compared byte for byte, as path
        /// building does).
        pub issuer: Vec<u8>,
        pub subject: Vec<u8>,
        /// `CN=...` (or the first attribute), for messages.
        pub subject_text: String,
        /// Seconds since the Unix epoch.
        pub not_after: i64,
    }

    /// One TLV: its tag, its contents, the whole encoding, and what follows it.
    struct Tlv<'a>(u8, &'a [u8], &'a [u8], &'a [u8]);

    fn tlv(input: &[u8]) -> Option<Tlv<'_>> {
        let (&tag, rest) = input.split_first()?;
        let (&first, rest) = rest.split_first()?;
        let (len, rest) = if first < 0x80 {
            (usize::from(first), rest)
        } else {
            let n = usize::from(first & 0x7f);
            if n == 0 || n > 4 || rest.len() < n {
                return None;
            }
            let len = rest[..n]
                .iter()
                .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
            (len, &rest[n..])
        };
        if rest.len() < len {
            return None;
        }
        let header = input.len() - rest.len();
        Some(Tlv(tag, &rest[..len], &input[..header + len], &rest[len..]))
    }

    const SEQUENCE: u8 = 0x30;

    pub fn parse(cert: &[u8]) -> Option<Parsed> {
        let Tlv(tag, certificate, _, _) = tlv(cert)?;
        if tag != SEQUENCE {
            return None;
        }
        let Tlv(tag, tbs, _, _) = tlv(certificate)?;
        if tag != SEQUENCE {
            return None;
        }
        let mut rest = tbs;
        let Tlv(tag, _, _, after) = tlv(rest)?;
        if tag == 0xa0 {
            rest = after; // [0] version
        }
        let Tlv(_, _, _, rest) = tlv(rest)?; // serialNumber
        let Tlv(_, _, _, rest) = tlv(rest)?; // signature
        let Tlv(tag, _, issuer, rest) = tlv(rest)?;
        if tag != SEQUENCE {
            return None;
        }
        let Tlv(tag, validity, _, rest) = tlv(rest)?;
        if tag != SEQUENCE {
            return None;
        }
        let Tlv(tag, subject_body, subject, _) = tlv(rest)?;
        if tag != SEQUENCE {
            return None;
        }
        let Tlv(_, _, _, validity) = tlv(validity)?; // notBefore
        let Tlv(tag, not_after, _, _) = tlv(validity)?;
        Some(Parsed {
            issuer: issuer.to_vec(),
            subject: subject.to_vec(),
            subject_text: name_text(subject_body),
            not_after: time(tag, not_after)?,
        })
    }

    /// The common name (OID 2.5.4.3) of a Name, or `(no common name)`.
    fn name_text(mut name: &[u8]) -> String {
        const CN: &[u8] = &[0x55, 0x04, 0x03];
        while let Some(Tlv(_, set, _, rest)) = tlv(name) {
            name = rest;
            if let Some(Tlv(_, attr, _, _)) = tlv(set) {
                if let Some(Tlv(0x06, oid, _, value)) = tlv(attr) {
                    if oid == CN {
                        if let Some(Tlv(_, text, _, _)) = tlv(value) {
                            return format!("CN={}", String::from_utf8_lossy(text));
                        }
                    }
                }
            }
        }
        "(no common name)".into()
    }

    /// UTCTime (`YYMMDDHHMMSSZ`, 0x17) or GeneralizedTime (`YYYYMMDDHHMMSSZ`, 0x18).
    fn time(tag: u8, text: &[u8]) -> Option<i64> {
        let text = std::str::from_utf8(text).ok()?.strip_suffix('Z')?;
        let (year, rest) = match tag {
            0x17 if text.len() == 12 => {
                let yy: i64 = text[..2].parse().ok()?;
                (if yy >= 50 { 1900 + yy } else { 2000 + yy }, &text[2..])
            }
            0x18 if text.len() == 14 => (text[..4].parse().ok()?, &text[4..]),
            _ => return None,
        };
        let field = |i: usize| -> Option<i64> { rest.get(i..i + 2)?.parse().ok() };
        let (month, day) = (field(0)?, field(2)?);
        let (hour, min, sec) = (field(4)?, field(6)?, field(8)?);
        Some(days_from_civil(year, month, day) * 86400 + hour * 3600 + min * 60 + sec)
    }

    /// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's method).
    fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
        let y = if m <= 2 { y - 1 } else { y };
        let era = y.div_euclid(400);
        let yoe = y - era * 400;
        let mp = (m + 9) % 12;
        let doy = (153 * mp + 2) / 5 + d - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        era * 146097 + doe - 719468
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn dates_count_days_from_the_epoch() {
            assert_eq!(super::days_from_civil(1970, 1, 1), 0);
            assert_eq!(super::days_from_civil(2000, 3, 1), 11017);
            assert_eq!(super::time(0x17, b"491231235959Z"), Some(2524607999));
            assert_eq!(super::time(0x18, b"20500101000000Z"), Some(2524608000));
            assert_eq!(super::time(0x17, b"4912312359Z"), None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Dir(PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    fn dir(name: &str) -> Dir {
        let p = std::env::temp_dir().join(format!("forkd-tls-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        Dir(p)
    }

    fn ca() -> (rcgen::Certificate, rcgen::KeyPair) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "test CA");
        (params.self_signed(&key).unwrap(), key)
    }

    fn leaf(
        ca: &(rcgen::Certificate, rcgen::KeyPair),
        name: &str,
        days: i64,
    ) -> (rcgen::Certificate, rcgen::KeyPair) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec![name.to_string()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let (y, m, d) = date_of(now / 86400 + days);
        params.not_after = rcgen::date_time_ymd(y, m, d);
        (params.signed_by(&key, &ca.0, &ca.1).unwrap(), key)
    }

    /// The date `days` after the epoch.
    fn date_of(days: i64) -> (i32, u8, u8) {
        let (y, m, d) = crate::log::civil_from_days(days);
        (y as i32, m as u8, d as u8)
    }

    fn write(d: &Dir, name: &str, text: &str) {
        std::fs::write(d.0.join(name), text).unwrap();
    }

    fn entry(cert: &str, key: &str) -> RawCertificate {
        RawCertificate {
            cert: cert.into(),
            key: key.into(),
        }
    }

    #[test]
    fn a_chain_in_order_with_its_key_loads_and_reads_its_expiry() {
        let d = dir("ok");
        let ca = ca();
        let (cert, key) = leaf(&ca, "a.test", 90);
        write(&d, "chain.pem", &(cert.pem() + &ca.0.pem()));
        write(&d, "key.pem", &key.serialize_pem());
        let c = load_certificate(&d.0, &entry("chain.pem", "key.pem")).unwrap();
        assert_eq!(c.key.cert.len(), 2);
        assert_eq!(c.subject, "CN=a.test");
        let left = c.not_after.duration_since(SystemTime::now()).unwrap();
        assert!(left > Duration::from_secs(89 * 86400) && left < Duration::from_secs(91 * 86400));
        assert!(expiry_warning(&c, SystemTime::now()).is_none());
    }

    #[test]
    fn a_chain_out_of_order_a_wrong_key_and_missing_files_are_refused() {
        let d = dir("bad");
        let ca = ca();
        let (cert, key) = leaf(&ca, "a.test", 90);
        let (_, other_key) = leaf(&ca, "b.test", 90);
        write(&d, "reversed.pem", &(ca.0.pem() + &cert.pem()));
        write(&d, "leaf.pem", &cert.pem());
        write(&d, "key.pem", &key.serialize_pem());
        write(&d, "other.pem", &other_key.serialize_pem());
        write(&d, "empty.pem", "nothing here\n");
        let err = |c: &str, k: &str| load_certificate(&d.0, &entry(c, k)).unwrap_err();
        assert!(matches!(
            err("reversed.pem", "key.pem"),
            CertProblem::ChainOrder { index: 0, .. }
        ));
        assert!(matches!(
            err("leaf.pem", "other.pem"),
            CertProblem::KeyMismatch { .. }
        ));
        assert!(matches!(
            err("missing.pem", "key.pem"),
            CertProblem::Read { .. }
        ));
        assert!(matches!(
            err("leaf.pem", "missing.pem"),
            CertProblem::Read { .. }
        ));
        assert!(matches!(
            err("empty.pem", "key.pem"),
            CertProblem::NoneFound { .. }
        ));
        assert!(matches!(
            err("leaf.pem", "empty.pem"),
            CertProblem::NoneFound { .. }
        ));
    }

    #[test]
    fn an_expired_or_soon_expiring_certificate_is_a_warning_with_its_date() {
        let d = dir("expiry");
        let ca = ca();
        for (days, says) in [(-2, "expired on"), (10, "expires on")] {
            let (cert, key) = leaf(&ca, "a.test", days);
            write(&d, "c.pem", &cert.pem());
            write(&d, "k.pem", &key.serialize_pem());
            let c = load_certificate(&d.0, &entry("c.pem", "k.pem")).unwrap();
            let w = expiry_warning(&c, SystemTime::now()).unwrap();
            assert!(w.contains(says) && w.contains("GMT"), "{w}");
        }
    }
}

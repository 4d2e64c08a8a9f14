//! The PROXY protocol header (HAProxy's spec, versions 1 and 2, as HAProxy and AWS NLB
//! send it) that a load balancer puts before the client's bytes to say who the client
//! is. Sans-io: [`parse`] looks at what has arrived so far and says whether the header
//! is complete, how long it is, and the client's address.
//!
//! A `LOCAL` command (v2) or `UNKNOWN` protocol (v1) means the balancer speaks for
//! itself (health checks): the socket's address stands.
//!
//! Every header [`parse`] accepts fits in [`V2_MAX`] bytes, and it decides on any
//! `V2_MAX` bytes (a header, or an error): the connection peeks at the socket through
//! a buffer that size and reads exactly the header's `len`, leaving what follows
//! (under TLS, the ClientHello) in the socket.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

const V1_PREFIX: &[u8] = b"PROXY ";
/// The longest v1 header, CRLF included (spec §2.1).
const V1_MAX: usize = 107;
const V2_SIGNATURE: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";
/// Addresses plus TLVs (AWS adds its VPC endpoint id): generous, but bounded. The
/// longest header of either version.
pub const V2_MAX: usize = 16 + 1024;
const _: () = assert!(V1_MAX <= V2_MAX);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parsed {
    /// More bytes are needed.
    Incomplete,
    /// The header is the first `len` bytes; the client is `client` (None: keep the
    /// socket's address).
    Done {
        len: usize,
        client: Option<SocketAddr>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyError {
    /// The connection does not start with either version's signature.
    BadSignature,
    /// The header is longer than a valid one can be.
    TooLong,
    /// Signature right, contents wrong.
    Malformed(&'static str),
}

/// Parses a PROXY header at the start of `buf`.
pub fn parse(buf: &[u8]) -> Result<Parsed, ProxyError> {
    if starts_like(buf, V2_SIGNATURE) {
        return if buf.len() < V2_SIGNATURE.len() {
            Ok(Parsed::Incomplete)
        } else {
            parse_v2(buf)
        };
    }
    if starts_like(buf, V1_PREFIX) {
        return if buf.len() < V1_PREFIX.len() {
            Ok(Parsed::Incomplete)
        } else {
            parse_v1(buf)
        };
    }
    Err(ProxyError::BadSignature)
}

/// `buf` and `sig` agree on their common length.
fn starts_like(buf: &[u8], sig: &[u8]) -> bool {
    let n = buf.len().min(sig.len());
    buf[..n] == sig[..n]
}

fn parse_v1(buf: &[u8]) -> Result<Parsed, ProxyError> {
    let window = &buf[..buf.len().min(V1_MAX)];
    let Some(lf) = window.iter().position(|&b| b == b'\n') else {
        return if buf.len() >= V1_MAX {
            Err(ProxyError::TooLong)
        } else {
            Ok(Parsed::Incomplete)
        };
    };
    let line = window[..lf]
        .strip_suffix(b"\r")
        .ok_or(ProxyError::Malformed("v1 line does not end in CRLF"))?;
    let line = std::str::from_utf8(line).map_err(|_| ProxyError::Malformed("v1 not ASCII"))?;
    let mut parts = line.split(' ');
    parts.next(); // "PROXY"
    let family = parts
        .next()
        .ok_or(ProxyError::Malformed("v1 without protocol"))?;
    let len = lf + 1;
    match family {
        "UNKNOWN" => return Ok(Parsed::Done { len, client: None }),
        "TCP4" | "TCP6" => {}
        _ => {
            return Err(ProxyError::Malformed(
                "v1 protocol not TCP4, TCP6 or UNKNOWN",
            ))
        }
    }
    let fields: Vec<&str> = parts.collect();
    let [src, _dst, sport, _dport] = fields[..] else {
        return Err(ProxyError::Malformed("v1 needs four address fields"));
    };
    let ip: IpAddr = src
        .parse()
        .map_err(|_| ProxyError::Malformed("v1 source address"))?;
    if matches!(
        (family, ip),
        ("TCP4", IpAddr::V6(_)) | ("TCP6", IpAddr::V4(_))
    ) {
        return Err(ProxyError::Malformed(
            "v1 address does not match its protocol",
        ));
    }
    let port: u16 = sport
        .parse()
        .map_err(|_| ProxyError::Malformed("v1 source port"))?;
    Ok(Parsed::Done {
        len,
        client: Some(SocketAddr::new(ip, port)),
    })
}

fn parse_v2(buf: &[u8]) -> Result<Parsed, ProxyError> {
    if buf.len() < 16 {
        return Ok(Parsed::Incomplete);
    }
    let ver_cmd = buf[12];
    if ver_cmd >> 4 != 2 {
        return Err(ProxyError::Malformed("v2 version is not 2"));
    }
    let family = buf[13];
    let body = usize::from(u16::from_be_bytes([buf[14], buf[15]]));
    let len = 16 + body;
    if len > V2_MAX {
        return Err(ProxyError::TooLong);
    }
    if buf.len() < len {
        return Ok(Parsed::Incomplete);
    }
    let addr = &buf[16..len];
    match ver_cmd & 0x0f {
        0 => return Ok(Parsed::Done { len, client: None }), // LOCAL
        1 => {}
        _ => {
            return Err(ProxyError::Malformed(
                "v2 command is neither LOCAL nor PROXY",
            ))
        }
    }
    let client = match family >> 4 {
        0 => None, // AF_UNSPEC
        1 => {
            if addr.len() < 12 {
                return Err(ProxyError::Malformed("v2 IPv4 addresses truncated"));
            }
            let ip = Ipv4Addr::new(addr[0], addr[1], addr[2], addr[3]);
            let port = u16::from_be_bytes([addr[8], addr[9]]);
            Some(SocketAddr::new(IpAddr::V4(ip), port))
        }
        2 => {
            if addr.len() < 36 {
                return Err(ProxyError::Malformed("v2 IPv6 addresses truncated"));
            }
            let octets: [u8; 16] = addr[..16].try_into().expect("16 bytes");
            let port = u16::from_be_bytes([addr[32], addr[33]]);
            Some(SocketAddr::new(IpAddr::V6(Ipv6Addr::from(octets)), port))
        }
        3 => None, // AF_UNIX: no address to use
        _ => return Err(ProxyError::Malformed("v2 address family unknown")),
    };
    Ok(Parsed::Done { len, client })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v2(cmd: u8, family: u8, addr: &[u8], tlvs: &[u8]) -> Vec<u8> {
        let mut h = V2_SIGNATURE.to_vec();
        h.push(0x20 | cmd);
        h.push(family);
        h.extend_from_slice(&((addr.len() + tlvs.len()) as u16).to_be_bytes());
        h.extend_from_slice(addr);
        h.extend_from_slice(tlvs);
        h
    }

    /// Every prefix of a valid header is Incomplete, the whole is Done.
    fn split_reads(header: &[u8], want: Option<SocketAddr>) {
        for cut in 0..header.len() {
            assert_eq!(
                parse(&header[..cut]),
                Ok(Parsed::Incomplete),
                "cut at {cut}"
            );
        }
        let mut with_request = header.to_vec();
        with_request.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
        assert_eq!(
            parse(&with_request),
            Ok(Parsed::Done {
                len: header.len(),
                client: want
            })
        );
    }

    #[test]
    fn v1_tcp4_and_tcp6_in_any_split() {
        split_reads(
            b"PROXY TCP4 192.0.2.7 10.0.0.1 56324 443\r\n",
            Some("192.0.2.7:56324".parse().unwrap()),
        );
        split_reads(
            b"PROXY TCP6 2001:db8::5 2001:db8::1 4000 80\r\n",
            Some("[2001:db8::5]:4000".parse().unwrap()),
        );
        split_reads(b"PROXY UNKNOWN\r\n", None);
    }

    #[test]
    fn v2_proxy_local_and_tlvs_in_any_split() {
        let mut a4 = vec![198, 51, 100, 9, 10, 0, 0, 1];
        a4.extend_from_slice(&40000u16.to_be_bytes());
        a4.extend_from_slice(&443u16.to_be_bytes());
        // An AWS-style TLV (type 0xEA, VPC endpoint id) after the addresses.
        let tlv = [0xEA, 0x00, 0x05, 0x01, b'v', b'p', b'c', b'e'];
        split_reads(
            &v2(1, 0x11, &a4, &tlv),
            Some("198.51.100.9:40000".parse().unwrap()),
        );
        let mut a6 = vec![0u8; 36];
        a6[..16].copy_from_slice(&"2001:db8::9".parse::<Ipv6Addr>().unwrap().octets());
        a6[32..34].copy_from_slice(&8080u16.to_be_bytes());
        split_reads(
            &v2(1, 0x21, &a6, &[]),
            Some("[2001:db8::9]:8080".parse().unwrap()),
        );
        // LOCAL (a balancer's health check): the socket's address stands.
        split_reads(&v2(0, 0x00, &[], &[]), None);
    }

    #[test]
    fn bad_signatures_are_refused_at_the_first_wrong_byte() {
        assert_eq!(parse(b"GET / HTTP/1.1\r\n"), Err(ProxyError::BadSignature));
        assert_eq!(parse(b"PROXZ"), Err(ProxyError::BadSignature));
        assert_eq!(parse(b"\r\n\r\n\0\r\nQUIX"), Err(ProxyError::BadSignature));
        assert_eq!(
            parse(b"PROXY TCP5 1.2.3.4 1.2.3.4 1 2\r\n"),
            Err(ProxyError::Malformed(
                "v1 protocol not TCP4, TCP6 or UNKNOWN"
            ))
        );
        assert!(matches!(
            parse(b"PROXY TCP4 2001:db8::1 1.2.3.4 1 2\r\n"),
            Err(ProxyError::Malformed(_))
        ));
        assert!(matches!(
            parse(b"PROXY TCP4 1.2.3.4 1.2.3.4 99999 2\r\n"),
            Err(ProxyError::Malformed(_))
        ));
        let mut bad_version = v2(1, 0x11, &[0; 12], &[]);
        bad_version[12] = 0x11;
        assert!(matches!(parse(&bad_version), Err(ProxyError::Malformed(_))));
        assert!(matches!(
            parse(&v2(1, 0x11, &[0; 4], &[])),
            Err(ProxyError::Malformed(_))
        ));
    }

    /// What a connection peeks at (at most `V2_MAX` bytes) always decides: never
    /// `Incomplete` with the buffer full, whatever follows the signature.
    #[test]
    fn a_full_peek_buffer_always_decides() {
        let mut v1 = b"PROXY TCP4 ".to_vec();
        v1.resize(V2_MAX, b'1');
        let mut v2 = V2_SIGNATURE.to_vec();
        v2.extend_from_slice(&[0x21, 0x11]);
        v2.extend_from_slice(&((V2_MAX - 16) as u16).to_be_bytes());
        v2.resize(V2_MAX, 0);
        for buf in [v1, v2] {
            assert_ne!(parse(&buf), Ok(Parsed::Incomplete));
        }
    }

    #[test]
    fn oversize_headers_are_refused_before_they_are_read() {
        let mut long = b"PROXY TCP4 ".to_vec();
        long.resize(V1_MAX, b'1');
        assert_eq!(parse(&long), Err(ProxyError::TooLong));
        // v2 declares its length: refused as soon as the length is known.
        let mut h = V2_SIGNATURE.to_vec();
        h.extend_from_slice(&[0x21, 0x11]);
        h.extend_from_slice(&(V2_MAX as u16).to_be_bytes());
        assert_eq!(parse(&h), Err(ProxyError::TooLong));
    }
}

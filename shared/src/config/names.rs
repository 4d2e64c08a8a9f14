//! Server names (`server_names`): how a name matches the host a client asks for, the
//! same for an HTTP `Host` (which server answers) and a TLS SNI name (which
//! certificate is served).

/// Whether a server name (`example.com`, or `*.example.com` for exactly one more
/// label) matches `host` (a TLS SNI name or an HTTP `Host`), ignoring case.
pub fn name_matches(pattern: &str, host: &[u8]) -> bool {
    match pattern.as_bytes().strip_prefix(b"*.") {
        Some(suffix) => host
            .iter()
            .position(|&b| b == b'.')
            .is_some_and(|dot| dot > 0 && host[dot + 1..].eq_ignore_ascii_case(suffix)),
        None => pattern.as_bytes().eq_ignore_ascii_case(host),
    }
}

#[cfg(test)]
mod tests {
    use super::name_matches;

    #[test]
    fn a_wildcard_matches_one_label() {
        let m = |pattern: &str, name: &str| name_matches(pattern, name.as_bytes());
        assert!(m("*.example.com", "a.example.com"));
        assert!(m("*.example.com", "A.Example.COM"));
        assert!(!m("*.example.com", "example.com"));
        assert!(!m("*.example.com", ".example.com"));
        assert!(!m("*.example.com", "a.b.example.com"));
        assert!(m("example.com", "EXAMPLE.com"));
    }
}

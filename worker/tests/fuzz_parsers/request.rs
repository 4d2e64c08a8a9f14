//! The request head parser and its framing rules.

use super::mutate;
use forkd_worker::http::request::{self, BodyKind, RequestError, Version};
use proptest::prelude::*;

fn method() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => prop::sample::select(vec![&b"GET"[..], b"HEAD", b"POST"]),
        1 => prop::sample::select(vec![&b"PUT"[..], b"OPTIONS", b"get", b"G(T", b""]),
    ]
    .prop_map(<[u8]>::to_vec)
}

fn target() -> impl Strategy<Value = Vec<u8>> {
    let path = prop::collection::vec(prop::sample::select(b"/az09.%2e?=&#-_~".to_vec()), 0..24);
    let start = prop::sample::select(vec![
        &b"http://example.com"[..],
        b"http://example.com:8080",
        b"HTTPS://[::1]:81",
        b"http://",
        b"http://a b",
        b"*",
        b"",
    ]);
    (prop_oneof![4 => Just(&b"/"[..]), 1 => start], path)
        .prop_map(|(start, rest)| [start, &rest].concat())
}

fn version() -> impl Strategy<Value = &'static [u8]> {
    let odd = prop::sample::select(vec![
        &b"HTTP/2.0"[..],
        b"HTTP/1.2",
        b"HTTP/1",
        b"HTTP/2",
        b"HTTP/2x",
        b"HTTP/",
        b"HTP/1.1",
        b"http/1.1",
    ]);
    prop_oneof![
        6 => Just(&b"HTTP/1.1"[..]),
        3 => Just(&b"HTTP/1.0"[..]),
        1 => odd,
    ]
}

/// Fields a well-behaved client sends, each well-formed.
fn good_field() -> impl Strategy<Value = Vec<u8>> {
    prop::sample::select(vec![
        &b"Content-Length: 5"[..],
        b"Content-Length: 0",
        b"Transfer-Encoding: chunked",
        b"transfer-encoding: gzip, chunked",
        b"Connection: close",
        b"Connection: keep-alive",
        b"Expect: 100-continue",
        b"Range: bytes=0-5",
        b"User-Agent: fuzz",
        b"Accept: */*",
    ])
    .prop_map(<[u8]>::to_vec)
}

fn field() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![3 => good_field(), 2 => any_field()]
}

fn any_field() -> impl Strategy<Value = Vec<u8>> {
    let name = prop::sample::select(vec![
        &b"Host"[..],
        b"host",
        b"Content-Length",
        b"content-length",
        b"Transfer-Encoding",
        b"TRANSFER-ENCODING",
        b"Connection",
        b"Expect",
        b"Range",
        b"If-Range",
        b"If-None-Match",
        b"If-Modified-Since",
        b"Referer",
        b"User-Agent",
        b"X-Other",
        b"Bad Name",
        b"",
    ]);
    let value = prop::sample::select(vec![
        &b"localhost"[..],
        b"example.com:8080",
        b"[::1]",
        b"a/b",
        b"",
        b"0",
        b"5",
        b"5, 5",
        b"5, 6",
        b"-1",
        b"99999999999999999999",
        b"chunked",
        b"gzip",
        b"gzip, chunked",
        b"chunked, gzip",
        b"chunked, chunked",
        b" , chunked",
        b"close",
        b"keep-alive",
        b"upgrade, close",
        b"100-continue",
        b"teapot",
        b"bytes=0-5",
        b"v\x01",
        b"folded\r\n continued",
    ]);
    let space = prop::sample::select(vec![&b" "[..], b"", b"  ", b"\t"]);
    (
        name,
        space,
        value,
        prop::sample::select(vec![&b""[..], b" "]),
    )
        .prop_map(|(n, s, v, t)| [n, b":", s, v, t].concat())
}

/// A request: line, fields, empty line, some body, with the given line ending.
fn request() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::sample::select(vec![&b""[..], b"\r\n", b"\n"]),
        method(),
        target(),
        version(),
        prop::collection::vec(field(), 0..6),
        prop::option::weighted(0.8, any::<u8>()),
        prop::sample::select(vec![&b"\r\n"[..], b"\r\n", b"\n"]),
        prop::sample::select(vec![
            &b""[..],
            b"hello",
            b"0\r\n\r\n",
            b"GET / HTTP/1.1\r\n\r\n",
        ]),
    )
        .prop_map(|(lead, m, t, v, mut fields, host, eol, body)| {
            let mut out = lead.to_vec();
            out.extend_from_slice(&[&m[..], b" ", &t, b" ", v, eol].concat());
            if let Some(at) = host {
                let at = usize::from(at) % (fields.len() + 1);
                fields.insert(at, b"Host: localhost".to_vec());
            }
            for f in fields {
                out.extend_from_slice(&f);
                out.extend_from_slice(eol);
            }
            out.extend_from_slice(eol);
            out.extend_from_slice(body);
            out
        })
}

fn max_header_bytes() -> impl Strategy<Value = usize> {
    prop_oneof![1 => Just(16384usize), 3 => 8..400usize]
}

/// What a connection does: parse the buffer after every read, act on the first answer.
fn parse_as_read(input: &[u8], cuts: &[u16], max: usize) -> String {
    for len in mutate::prefix_lengths(input.len(), cuts) {
        match request::parse(&input[..len], max) {
            Ok(None) => continue,
            other => return format!("{other:?}"),
        }
    }
    "Ok(None)".into()
}

/// The head's field lines as (lower-case name, trimmed value), read independently of
/// the parser: only used on heads the parser accepted.
fn fields_of(head: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut lines = head
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
        .skip_while(|l| l.is_empty());
    lines.next(); // the request line
    lines
        .take_while(|l| !l.is_empty())
        .map(|l| {
            let colon = l.iter().position(|&b| b == b':').expect("a field line");
            let value = l[colon + 1..].trim_ascii();
            (l[..colon].to_ascii_lowercase(), value.to_vec())
        })
        .collect()
}

fn check_framing(input: &[u8], max: usize) -> Result<(), TestCaseError> {
    let Ok(Some(req)) = request::parse(input, max) else {
        return Ok(());
    };
    prop_assert!(req.head_len <= input.len() && req.head_len <= max);
    let head = &input[..req.head_len];
    prop_assert!(head.ends_with(b"\n\n") || head.ends_with(b"\n\r\n"));
    let fields = fields_of(head);
    let named = |n: &[u8]| fields.iter().filter(|(name, _)| name == n).count();
    let te = named(b"transfer-encoding");
    let cl = named(b"content-length");
    prop_assert!(te == 0 || cl == 0, "TE and CL together were accepted");
    if te > 0 {
        prop_assert_eq!(req.version, Version::Http11, "TE in HTTP/1.0 was accepted");
        prop_assert_eq!(req.body, BodyKind::Chunked);
        // Empty list elements do not count (RFC 9110 §5.6.1).
        let last = fields
            .iter()
            .filter(|(n, _)| n == b"transfer-encoding")
            .flat_map(|(_, v)| v.split(|&b| b == b','))
            .map(<[u8]>::trim_ascii)
            .rfind(|c| !c.is_empty());
        prop_assert!(last.is_some_and(|c| c.eq_ignore_ascii_case(b"chunked")));
    } else {
        prop_assert_ne!(req.body, BodyKind::Chunked);
    }
    if let BodyKind::Length(n) = req.body {
        prop_assert!(n > 0 && cl > 0);
        for (_, v) in fields.iter().filter(|(n, _)| n == b"content-length") {
            for item in v.split(|&b| b == b',') {
                // Leading zeros are digits too (`1*DIGIT`).
                let value = std::str::from_utf8(item.trim_ascii()).ok();
                prop_assert_eq!(value.and_then(|v| v.parse::<u64>().ok()), Some(n));
            }
        }
    }
    if cl > 0 && req.body == BodyKind::None {
        for (_, v) in fields.iter().filter(|(n, _)| n == b"content-length") {
            for item in v.split(|&b| b == b',') {
                prop_assert_eq!(item.trim_ascii().iter().find(|&&b| b != b'0'), None);
            }
        }
    }
    if cl == 0 && te == 0 {
        prop_assert_eq!(req.body, BodyKind::None);
    }
    let absolute = !req.target.starts_with(b"/");
    prop_assert!(named(b"host") <= 1);
    if req.version == Version::Http11 {
        prop_assert!(absolute || named(b"host") == 1, "HTTP/1.1 without Host");
    } else {
        prop_assert!(!req.expect_continue);
    }
    prop_assert!(req.path.starts_with(b"/"));
    Ok(())
}

proptest! {
    #![proptest_config(crate::config(2000))]

    #[test]
    fn any_split_parses_like_the_whole(
        base in request(),
        edits in mutate::edits(4),
        cuts in mutate::cuts(),
        max in max_header_bytes(),
    ) {
        let mut input = base;
        mutate::apply(&mut input, &edits);
        let whole = format!("{:?}", request::parse(&input, max));
        prop_assert_eq!(
            parse_as_read(&input, &cuts, max),
            whole,
            "input {:?} cut at {:?} (max {})",
            input.escape_ascii().to_string(),
            mutate::prefix_lengths(input.len(), &cuts),
            max
        );
    }

    #[test]
    fn accepted_heads_obey_the_framing_rules(
        base in request(),
        edits in mutate::edits(3),
        max in max_header_bytes(),
    ) {
        let mut input = base;
        mutate::apply(&mut input, &edits);
        check_framing(&input, max).map_err(|e| {
            TestCaseError::fail(format!("{e} for {:?} (max {max})", input.escape_ascii().to_string()))
        })?;
    }

    #[test]
    fn arbitrary_bytes_do_not_panic_and_split_alike(
        input in prop::collection::vec(any::<u8>(), 0..300),
        cuts in mutate::cuts(),
        max in max_header_bytes(),
    ) {
        let whole = format!("{:?}", request::parse(&input, max));
        prop_assert_eq!(
            parse_as_read(&input, &cuts, max),
            whole,
            "input {:?} cut at {:?} (max {})",
            input.escape_ascii().to_string(),
            mutate::prefix_lengths(input.len(), &cuts),
            max
        );
        check_framing(&input, max)?;
    }
}

/// Errors always map to a client error status, and carry a reason for the log.
#[test]
fn every_error_has_a_4xx_or_5xx_status_and_a_reason() {
    for e in [
        RequestError::Malformed("x"),
        RequestError::UriTooLong,
        RequestError::HeadersTooLarge,
        RequestError::UnsupportedTransferEncoding,
        RequestError::VersionNotSupported,
        RequestError::ExpectationFailed,
    ] {
        assert!((400..=505).contains(&e.status().0), "{e:?}");
        assert!(!e.reason().is_empty());
    }
}

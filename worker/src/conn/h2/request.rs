//! An HTTP/2 request's decoded fields as the HTTP/1.1 head every handler already
//! reads: one dispatch for both protocols. The connection only decodes the
//! fields; every rule of a request's fields is checked here, so a request that
//! passes is one RFC 9113 allows (§8.1.1, §8.2, §8.3.1):
//!
//! - field names are lowercase tokens, values carry no NUL, CR or LF and neither
//!   start nor end with a space or tab (§8.2.1);
//! - the request pseudo-fields come first, each once, `:method`, `:scheme` and a
//!   non-empty `:path` among them (`*` only for OPTIONS); CONNECT, which forkd does
//!   not serve over HTTP/2, is refused as having no `:path`;
//! - `:authority` becomes `Host` (a `host` field beside it must agree);
//! - `cookie` fields, which HTTP/2 may split, are joined with `; ` (§8.2.3);
//! - connection-specific fields are refused (§8.2.2), and `te` other than
//!   `trailers`;
//! - `content-length` is digits, the same in every copy, and says how much DATA the
//!   stream must carry ([`Head::length`]); a body without it is framed `chunked`
//!   for the handlers (the stream's DATA frames are written as chunks), so a
//!   proxied upload goes upstream as HTTP/1.1 would send it.

use super::hpack::Fields;

/// How the stream's DATA frames are framed in the HTTP/1.1 input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// The request ended with its HEADERS.
    None,
    /// `content-length` said how long: DATA goes in as it is.
    Length,
    /// Each DATA frame becomes a chunk, the end of the stream the last chunk.
    Chunked,
}

/// What the stream needs to know of the request it passed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    pub framing: Framing,
    /// `content-length`: the DATA frames must add up to it (RFC 9113 §8.1.1).
    pub length: Option<u64>,
    /// The method is HEAD: the response's framing describes a body never sent.
    pub head_request: bool,
}

/// A request HTTP/2 forbids (a stream error PROTOCOL_ERROR, RFC 9113 §8.1.1). What
/// a variant carries came from the client: printable, cut to [`SHOWN`] bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Malformed {
    /// A connection-specific field (`connection`, `transfer-encoding`, ...).
    ConnectionField(String),
    /// `te` with anything but `trailers`.
    Te,
    /// `host` names another authority than `:authority`.
    HostDisagrees,
    /// No `:path` (or a CONNECT request, which forkd does not serve over HTTP/2).
    NoPath,
    /// `content-length` on a request whose HEADERS ended the stream, other than 0.
    LengthWithoutBody,
    /// A field name with an uppercase letter (§8.2.1).
    UppercaseName(String),
    /// A field name that is empty or has a byte a token cannot.
    BadName(String),
    /// This field's value has NUL, CR or LF, or starts or ends with a space or tab.
    BadValue(String),
    /// A pseudo-field a request does not have (`:status`, `:protocol`, ...).
    UnknownPseudo(String),
    /// A request pseudo-field twice.
    RepeatedPseudo(&'static str),
    /// A pseudo-field after a regular field.
    PseudoAfterField(String),
    /// `:method` or `:scheme` missing.
    MissingPseudo(&'static str),
    EmptyPath,
    /// `:path` `*` with this method (only OPTIONS may).
    AsteriskNotOptions(String),
    /// A `:path` neither `*` nor starting with `/`, or with a byte a request line
    /// cannot carry (a space, a control, non-ASCII).
    BadPath(String),
    /// A `:method` that is not a token.
    BadMethod(String),
    /// A `content-length` that is not digits (or past `u64`).
    BadLength(String),
    /// Two `content-length` fields with these different lengths.
    LengthsDisagree(u64, u64),
}

/// Bytes of a client's name or value a [`Malformed`] keeps, for the log line.
pub const SHOWN: usize = 64;

impl Malformed {
    /// What was wrong, for the log line ("... sent a malformed HTTP/2 request: {why}").
    pub fn why(&self) -> String {
        match self {
            Malformed::ConnectionField(name) => format!("connection-specific field `{name}`"),
            Malformed::Te => "`te` other than `trailers`".into(),
            Malformed::HostDisagrees => "`host` other than `:authority`".into(),
            Malformed::NoPath => "no `:path`".into(),
            Malformed::LengthWithoutBody => "`content-length` without a body".into(),
            Malformed::UppercaseName(name) => format!("uppercase in field name `{name}`"),
            Malformed::BadName(name) => format!("field name `{name}` not a token"),
            Malformed::BadValue(name) => {
                format!("field `{name}` with NUL, CR, LF or outer whitespace in its value")
            }
            Malformed::UnknownPseudo(name) => format!("pseudo-field `{name}` in a request"),
            Malformed::RepeatedPseudo(name) => format!("`{name}` twice"),
            Malformed::PseudoAfterField(name) => format!("`{name}` after a regular field"),
            Malformed::MissingPseudo(name) => format!("no `{name}`"),
            Malformed::EmptyPath => "empty `:path`".into(),
            Malformed::AsteriskNotOptions(method) => format!("`:path` `*` with `{method}`"),
            Malformed::BadPath(path) => format!("`:path` `{path}` not an origin-form target"),
            Malformed::BadMethod(method) => format!("`:method` `{method}` not a token"),
            Malformed::BadLength(value) => format!("`content-length` `{value}` not a length"),
            Malformed::LengthsDisagree(a, b) => format!("`content-length` {a} and {b}"),
        }
    }
}

/// The client's bytes as a log line may show them: escaped, cut to [`SHOWN`].
fn shown(bytes: &[u8]) -> String {
    let cut = &bytes[..bytes.len().min(SHOWN)];
    let mut s = cut.escape_ascii().to_string();
    if cut.len() < bytes.len() {
        s.push_str("...");
    }
    s
}

/// The request pseudo-fields, before any regular field.
#[derive(Default)]
struct Pseudo<'f> {
    method: Option<&'f [u8]>,
    scheme: Option<&'f [u8]>,
    authority: Option<&'f [u8]>,
    path: Option<&'f [u8]>,
}

/// Writes the HTTP/1.1 head of the request `fields` carry into `out`; `ended`: the
/// HEADERS frame ended the stream (no body).
pub fn head(fields: &Fields, ended: bool, out: &mut Vec<u8>) -> Result<Head, Malformed> {
    let p = pseudo(fields)?;
    let method = p.method.ok_or(Malformed::MissingPseudo(":method"))?;
    if method == b"CONNECT" {
        return Err(Malformed::NoPath);
    }
    if !is_token(method) {
        return Err(Malformed::BadMethod(shown(method)));
    }
    p.scheme.ok_or(Malformed::MissingPseudo(":scheme"))?;
    let path = p.path.ok_or(Malformed::NoPath)?;
    match path {
        [] => return Err(Malformed::EmptyPath),
        b"*" if method != b"OPTIONS" => return Err(Malformed::AsteriskNotOptions(shown(method))),
        b"*" => {}
        [b'/', ..] if path.iter().all(|b| (0x21..=0x7e).contains(b)) => {}
        _ => return Err(Malformed::BadPath(shown(path))),
    }
    out.extend_from_slice(method);
    out.push(b' ');
    out.extend_from_slice(path);
    out.extend_from_slice(b" HTTP/1.1\r\n");
    if let Some(a) = p.authority {
        field(out, b"host", a);
    }
    let mut cookies = false;
    let mut length = None;
    for (name, value) in fields.iter().filter(|(n, _)| !n.starts_with(b":")) {
        if is_connection_specific(name) {
            return Err(Malformed::ConnectionField(shown(name)));
        }
        match name {
            b"te" if !value.eq_ignore_ascii_case(b"trailers") => return Err(Malformed::Te),
            b"host" => match p.authority {
                Some(a) if !a.eq_ignore_ascii_case(value) => return Err(Malformed::HostDisagrees),
                Some(_) => {}
                None => field(out, b"host", value),
            },
            b"cookie" => cookies = true,
            b"content-length" => {
                let n = decimal(value).ok_or_else(|| Malformed::BadLength(shown(value)))?;
                match length {
                    Some(l) if l != n => return Err(Malformed::LengthsDisagree(l, n)),
                    Some(_) => {}
                    None => {
                        length = Some(n);
                        field(out, b"content-length", value);
                    }
                }
            }
            _ => field(out, name, value),
        }
    }
    if cookies {
        out.extend_from_slice(b"cookie: ");
        let values = fields.iter().filter(|(n, _)| *n == b"cookie");
        for (i, (_, c)) in values.enumerate() {
            if i > 0 {
                out.extend_from_slice(b"; ");
            }
            out.extend_from_slice(c);
        }
        out.extend_from_slice(b"\r\n");
    }
    let framing = match (ended, length) {
        (true, Some(l)) if l != 0 => return Err(Malformed::LengthWithoutBody),
        (true, _) => Framing::None,
        (false, Some(_)) => Framing::Length,
        (false, None) => {
            out.extend_from_slice(b"transfer-encoding: chunked\r\n");
            Framing::Chunked
        }
    };
    out.extend_from_slice(b"\r\n");
    Ok(Head {
        framing,
        length,
        head_request: method == b"HEAD",
    })
}

/// Checks every name and value, and takes the pseudo-fields from the front.
fn pseudo(fields: &Fields) -> Result<Pseudo<'_>, Malformed> {
    let mut p = Pseudo::default();
    let mut regular = false;
    for (name, value) in fields.iter() {
        if name.starts_with(b":") {
            if regular {
                return Err(Malformed::PseudoAfterField(shown(name)));
            }
            let (slot, known) = match name {
                b":method" => (&mut p.method, ":method"),
                b":scheme" => (&mut p.scheme, ":scheme"),
                b":authority" => (&mut p.authority, ":authority"),
                b":path" => (&mut p.path, ":path"),
                _ => return Err(Malformed::UnknownPseudo(shown(name))),
            };
            if slot.is_some() {
                return Err(Malformed::RepeatedPseudo(known));
            }
            *slot = Some(value);
        } else {
            regular = true;
            if name.is_empty() {
                return Err(Malformed::BadName(String::new()));
            }
            // One pass that cannot stop early (it vectorises); which rule broke
            // is looked for only when one did.
            let class = name
                .iter()
                .fold(0u8, |acc, &b| acc | NAME_CLASS[usize::from(b)]);
            if class != 0 {
                if name.iter().any(u8::is_ascii_uppercase) {
                    return Err(Malformed::UppercaseName(shown(name)));
                }
                return Err(Malformed::BadName(shown(name)));
            }
        }
        let edge = |b: Option<&u8>| matches!(b, Some(b' ' | b'\t'));
        if super::bytes_check::has_nul_cr_lf(value) || edge(value.first()) || edge(value.last()) {
            return Err(Malformed::BadValue(shown(name)));
        }
    }
    Ok(p)
}

/// Fields that mean something only to one HTTP/1.1 connection (RFC 9113 §8.2.2):
/// refused in a request, dropped from a response. Any case (a response's names
/// are HTTP/1.1's).
pub fn is_connection_specific(name: &[u8]) -> bool {
    if !matches!(name.len(), 7 | 10 | 16 | 17) {
        return false;
    }
    [
        &b"connection"[..],
        b"keep-alive",
        b"proxy-connection",
        b"transfer-encoding",
        b"upgrade",
    ]
    .iter()
    .any(|n| name.eq_ignore_ascii_case(n))
}

/// A token character (RFC 9110 §5.6.2).
fn is_tchar(b: u8) -> bool {
    NAME_CLASS[usize::from(b)] & NOT_TCHAR == 0
}

const NOT_TCHAR: u8 = 1;
const UPPERCASE: u8 = 2;

/// Per byte, what keeps it out of an HTTP/2 field name: not a token character,
/// or an uppercase letter (RFC 9113 §8.2.1); 0 for the bytes a name may have.
const NAME_CLASS: [u8; 256] = {
    let mut t = [NOT_TCHAR; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            t[b] = 0;
        }
        if c.is_ascii_uppercase() {
            t[b] = UPPERCASE;
        }
        b += 1;
    }
    let extra = b"!#$%&'*+-.^_`|~";
    let mut i = 0;
    while i < extra.len() {
        t[extra[i] as usize] = 0;
        i += 1;
    }
    t
};

fn is_token(s: &[u8]) -> bool {
    !s.is_empty() && s.iter().all(|&b| is_tchar(b))
}

/// `s` as a decimal number: digits only, within `u64`.
fn decimal(s: &[u8]) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    s.iter().try_fold(0u64, |n, &b| match b {
        b'0'..=b'9' => n.checked_mul(10)?.checked_add(u64::from(b - b'0')),
        _ => None,
    })
}

fn field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Writes `data` as one chunk of a chunked body into `out`.
pub fn chunk(out: &mut Vec<u8>, data: &[u8]) {
    use std::io::Write;
    let _ = write!(out, "{:x}\r\n", data.len());
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// The end of a chunked body.
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

#[cfg(test)]
mod tests {
    use super::super::fuzz::config;
    use super::super::hpack::Decoder;
    use super::*;
    use crate::http::request as h1;
    use proptest::prelude::*;

    /// `list` as the decoder gives it: each field a literal, names as they are.
    fn fields(list: &[(&str, &str)]) -> Fields {
        let mut block = Vec::new();
        for (name, value) in list {
            block.push(0x00);
            for s in [name, value] {
                assert!(s.len() < 127);
                block.push(s.len() as u8);
                block.extend_from_slice(s.as_bytes());
            }
        }
        let mut f = Fields::new();
        Decoder::new().decode(&block, usize::MAX, &mut f).unwrap();
        assert_eq!(f.len(), list.len());
        f
    }

    /// A request's fields: the pseudo-fields (`:authority` if given), then `rest`.
    fn request<'a>(
        method: &'a str,
        path: &'a str,
        authority: Option<&'a str>,
        rest: &[(&'a str, &'a str)],
    ) -> Vec<(&'a str, &'a str)> {
        let mut list = vec![(":method", method), (":scheme", "https"), (":path", path)];
        list.extend(authority.map(|a| (":authority", a)));
        list.extend_from_slice(rest);
        list
    }

    fn text(list: &[(&str, &str)], ended: bool) -> Result<(String, Head), Malformed> {
        let mut out = Vec::new();
        let h = head(&fields(list), ended, &mut out)?;
        Ok((String::from_utf8(out).unwrap(), h))
    }

    fn get(rest: &[(&str, &str)]) -> Result<(String, Head), Malformed> {
        text(&request("GET", "/", Some("h"), rest), true)
    }

    #[test]
    fn a_get_becomes_the_head_http11_would_send() {
        let list = request(
            "GET",
            "/a/b?x=1",
            Some("example.com"),
            &[("accept", "*/*"), ("cookie", "a=1"), ("cookie", "b=2")],
        );
        assert_eq!(
            text(&list, true).unwrap(),
            (
                "GET /a/b?x=1 HTTP/1.1\r\nhost: example.com\r\naccept: */*\r\ncookie: a=1; b=2\r\n\r\n"
                    .into(),
                Head { framing: Framing::None, length: None, head_request: false }
            )
        );
        let (_, h) = text(&request("HEAD", "/", Some("h"), &[]), true).unwrap();
        assert!(h.head_request);
    }

    #[test]
    fn a_body_without_length_is_chunked_and_one_with_it_is_not() {
        let (t, h) = text(&request("POST", "/up", Some("h"), &[]), false).unwrap();
        assert!(t.ends_with("transfer-encoding: chunked\r\n\r\n"), "{t}");
        assert_eq!((h.framing, h.length), (Framing::Chunked, None));
        let list = request("POST", "/up", Some("h"), &[("content-length", "5")]);
        let (t, h) = text(&list, false).unwrap();
        assert!(t.contains("content-length: 5\r\n") && !t.contains("chunked"));
        assert_eq!((h.framing, h.length), (Framing::Length, Some(5)));
        let mut body = Vec::new();
        chunk(&mut body, b"hello world, 17 b");
        body.extend_from_slice(LAST_CHUNK);
        assert_eq!(body, b"11\r\nhello world, 17 b\r\n0\r\n\r\n");
    }

    #[test]
    fn connection_specific_fields_and_te_other_than_trailers_are_malformed() {
        for (name, value) in [
            ("connection", "keep-alive"),
            ("keep-alive", "5"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("proxy-connection", "x"),
        ] {
            assert_eq!(
                get(&[(name, value)]),
                Err(Malformed::ConnectionField(name.into()))
            );
        }
        assert_eq!(get(&[("te", "gzip")]), Err(Malformed::Te));
        assert!(get(&[("te", "trailers")]).is_ok());
    }

    #[test]
    fn host_must_agree_with_authority_and_serves_without_it() {
        let list = request("GET", "/", Some("a.example"), &[("host", "b.example")]);
        assert_eq!(text(&list, true), Err(Malformed::HostDisagrees));
        let list = request("GET", "/x", None, &[("host", "b.example")]);
        let (t, _) = text(&list, true).unwrap();
        assert_eq!(t, "GET /x HTTP/1.1\r\nhost: b.example\r\n\r\n");
        assert_eq!(
            get(&[("content-length", "3")]),
            Err(Malformed::LengthWithoutBody)
        );
        assert!(get(&[("content-length", "00")]).is_ok());
    }

    #[test]
    fn names_must_be_lowercase_tokens() {
        assert_eq!(
            get(&[("Accept", "*/*")]),
            Err(Malformed::UppercaseName("Accept".into()))
        );
        assert_eq!(get(&[("a b", "1")]), Err(Malformed::BadName("a b".into())));
        assert_eq!(get(&[("a:b", "1")]), Err(Malformed::BadName("a:b".into())));
        assert_eq!(get(&[("", "1")]), Err(Malformed::BadName("".into())));
        assert_eq!(
            get(&[("x\u{7f}", "1")]),
            Err(Malformed::BadName("x\\x7f".into()))
        );
    }

    #[test]
    fn values_must_not_carry_nul_cr_lf_or_outer_whitespace() {
        for value in ["a\0b", "a\rb", "a\nb", " a", "a ", "\ta", "a\t"] {
            assert_eq!(
                get(&[("x-a", value)]),
                Err(Malformed::BadValue("x-a".into())),
                "{value:?}"
            );
        }
        assert!(get(&[("x-a", "a \tb")]).is_ok());
        assert!(get(&[("x-a", "")]).is_ok());
        let list = request("GET", "/", Some("h "), &[]);
        assert_eq!(
            text(&list, true),
            Err(Malformed::BadValue(":authority".into()))
        );
    }

    #[test]
    fn pseudo_fields_are_the_four_of_a_request_each_once_and_first() {
        for name in [":status", ":protocol", ":"] {
            assert_eq!(
                text(&[(name, "1"), (":method", "GET")], true),
                Err(Malformed::UnknownPseudo(name.into()))
            );
        }
        let list = [
            (":method", "GET"),
            (":method", "GET"),
            (":scheme", "https"),
            (":path", "/"),
        ];
        assert_eq!(text(&list, true), Err(Malformed::RepeatedPseudo(":method")));
        assert_eq!(
            get(&[("accept", "*/*"), (":authority", "h")]),
            Err(Malformed::PseudoAfterField(":authority".into()))
        );
    }

    #[test]
    fn method_scheme_and_a_path_are_required() {
        let list = [(":scheme", "https"), (":path", "/")];
        assert_eq!(text(&list, true), Err(Malformed::MissingPseudo(":method")));
        let list = [(":method", "GET"), (":path", "/")];
        assert_eq!(text(&list, true), Err(Malformed::MissingPseudo(":scheme")));
        let list = [(":method", "GET"), (":scheme", "https")];
        assert_eq!(text(&list, true), Err(Malformed::NoPath));
        // CONNECT carries only `:authority` (RFC 9113 §8.5): not served.
        let list = [(":method", "CONNECT"), (":authority", "h:443")];
        assert_eq!(text(&list, false), Err(Malformed::NoPath));
    }

    #[test]
    fn the_path_is_origin_form_or_an_asterisk_for_options() {
        assert_eq!(
            text(&request("GET", "", Some("h"), &[]), true),
            Err(Malformed::EmptyPath)
        );
        assert_eq!(
            text(&request("GET", "*", Some("h"), &[]), true),
            Err(Malformed::AsteriskNotOptions("GET".into()))
        );
        let (t, _) = text(&request("OPTIONS", "*", Some("h"), &[]), true).unwrap();
        assert!(t.starts_with("OPTIONS * HTTP/1.1\r\n"), "{t}");
        for path in ["a/b", "http://h/", "/a b", "/\u{7f}", "/é"] {
            assert!(
                matches!(
                    text(&request("GET", path, Some("h"), &[]), true),
                    Err(Malformed::BadPath(_))
                ),
                "{path:?}"
            );
        }
        assert_eq!(
            text(&request("G T", "/", Some("h"), &[]), true),
            Err(Malformed::BadMethod("G T".into()))
        );
    }

    #[test]
    fn content_length_is_digits_and_every_copy_agrees() {
        for value in ["", "5x", "-1", "+5", "5, 5", "99999999999999999999"] {
            assert_eq!(
                text(
                    &request("POST", "/", Some("h"), &[("content-length", value)]),
                    false
                ),
                Err(Malformed::BadLength(value.into())),
                "{value:?}"
            );
        }
        let list = request(
            "POST",
            "/",
            Some("h"),
            &[("content-length", "5"), ("content-length", "6")],
        );
        assert_eq!(text(&list, false), Err(Malformed::LengthsDisagree(5, 6)));
        let list = request(
            "POST",
            "/",
            Some("h"),
            &[("content-length", "5"), ("content-length", "05")],
        );
        let (t, h) = text(&list, false).unwrap();
        assert_eq!(t.matches("content-length").count(), 1, "{t}");
        assert_eq!(h.length, Some(5));
    }

    #[test]
    fn what_a_client_sent_is_shown_escaped_and_cut() {
        let long = "X".repeat(100);
        let Err(e) = get(&[(&long, "1")]) else {
            panic!()
        };
        assert_eq!(
            e.why(),
            format!("uppercase in field name `{}...`", "X".repeat(SHOWN))
        );
        assert_eq!(Malformed::NoPath.why(), "no `:path`");
        assert_eq!(
            Malformed::ConnectionField("upgrade".into()).why(),
            "connection-specific field `upgrade`"
        );
    }

    proptest! {
        #![proptest_config(config(256))]

        /// An HTTP/2 request written as an HTTP/1.1 head is one complete head our
        /// parser reads back with the same method and target, or a `Malformed` the
        /// RFC names.
        #[test]
        fn a_translated_request_is_one_head_the_parser_reads_back(
            method in prop::sample::select(vec!["GET", "HEAD", "POST", "PUT", "OPTIONS", "PATCH", "X-CUSTOM"]),
            path in "/[a-zA-Z0-9._~%/?=&-]{0,24}",
            authority in prop::option::of("[a-z0-9.-]{1,12}(:[0-9]{1,5})?"),
            fields in prop::collection::vec(
                (prop::sample::select(vec![
                    "accept", "cookie", "content-length", "host", "te", "connection",
                    "transfer-encoding", "upgrade", "x-a", "user-agent", "range", "X-Up",
                ]), "[ -~]{0,16}"),
                0..8,
            ),
            ended in any::<bool>(),
        ) {
            let list = request(method, &path, authority.as_deref(), &fields.iter().map(|(n, v)| (*n, v.as_str())).collect::<Vec<_>>());
            let has = |name: &str| fields.iter().any(|(n, _)| *n == name);
            let mut out = Vec::new();
            match head(&super::tests::fields(&list), ended, &mut out) {
                Ok(h) => {
                    for special in ["connection", "transfer-encoding", "upgrade", "X-Up"] {
                        prop_assert!(!has(special), "{} passed", special);
                    }
                    prop_assert_eq!(h.head_request, method == "HEAD");
                    prop_assert_eq!(h.length.is_some(), has("content-length"));
                    match h1::parse(&out, 1 << 20) {
                        Ok(Some(r)) => {
                            prop_assert_eq!(r.head_len, out.len(), "one head, nothing after it");
                            prop_assert_eq!(r.method_name, method);
                            prop_assert_eq!(r.target, path.as_bytes());
                        }
                        Ok(None) => prop_assert!(false, "an incomplete head: {:?}", String::from_utf8_lossy(&out)),
                        // A value HTTP/1.1 refuses (an empty Host, a bad range) is
                        // answered 400, as over HTTP/1.1.
                        Err(_) => {}
                    }
                }
                Err(Malformed::ConnectionField(name)) => {
                    prop_assert!(["connection", "transfer-encoding", "upgrade"].contains(&name.as_str()));
                }
                Err(Malformed::Te) => prop_assert!(fields.iter().any(|(n, v)| *n == "te" && !v.eq_ignore_ascii_case("trailers"))),
                Err(Malformed::HostDisagrees) => prop_assert!(authority.is_some() && has("host")),
                Err(Malformed::LengthWithoutBody) => prop_assert!(ended && has("content-length")),
                Err(Malformed::UppercaseName(name)) => prop_assert_eq!(name, "X-Up"),
                Err(Malformed::BadValue(name)) => prop_assert!(fields.iter().any(|(n, v)| *n == name && (v.starts_with(' ') || v.ends_with(' ')))),
                Err(Malformed::BadLength(value)) => prop_assert!(fields.iter().any(|(n, v)| *n == "content-length" && shown(v.as_bytes()) == value)),
                Err(Malformed::LengthsDisagree(..)) => prop_assert!(fields.iter().filter(|(n, _)| *n == "content-length").count() > 1),
                Err(e) => prop_assert!(false, "{:?} from a well-formed request", e),
            }
        }
    }
}

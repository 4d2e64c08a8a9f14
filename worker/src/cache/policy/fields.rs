//! The field syntax the cache policy reads (RFC 9110 §5): fields by name, the
//! elements of comma-separated lists across repeated fields, delta-seconds and
//! HTTP dates.

use super::Fields;

/// The largest delta-seconds kept: RFC 9111 §1.2.2 has a cache take a larger value
/// (or an overflow) as 2^31. It also keeps `stored_at + ttl` far from overflowing.
pub const DELTA_SECONDS_MAX: u64 = 1 << 31;

/// The values of every field `name` (case-insensitive), in order, trimmed.
pub fn values<'a>(fields: Fields<'a>, name: &'a [u8]) -> impl Iterator<Item = &'a [u8]> + 'a {
    fields
        .iter()
        .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim_ascii())
}

/// The value of the first field `name`: where a singleton field repeats, the first
/// one counts (RFC 9111 §4.2.1).
pub fn first<'a>(fields: Fields<'a>, name: &'a [u8]) -> Option<&'a [u8]> {
    values(fields, name).next()
}

/// Whether a field `name` is present (even empty).
pub fn has(fields: Fields, name: &[u8]) -> bool {
    fields.iter().any(|(n, _)| n.eq_ignore_ascii_case(name))
}

/// How a list's elements quote: whether a backslash inside quotes escapes the next
/// byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quoting {
    /// quoted-string (RFC 9110 §5.6.4): `\"` does not end it (Cache-Control, Vary'd
    /// fields).
    Escapes,
    /// entity-tags (RFC 9110 §8.8.3): a backslash is an ordinary byte, `"a\"` is a
    /// whole tag.
    Plain,
}

/// The elements of every field `name`, across repeated fields, in order: each field
/// split at commas outside quotes, elements trimmed, empty elements skipped (RFC 9110
/// §5.6.1). A quote left open ends at the end of its field.
pub fn list<'a>(
    fields: Fields<'a>,
    name: &'a [u8],
    quoting: Quoting,
) -> impl Iterator<Item = &'a [u8]> + 'a {
    values(fields, name).flat_map(move |value| Elements {
        rest: value,
        quoting,
    })
}

/// The elements of one field value (see [`list`]).
pub struct Elements<'a> {
    rest: &'a [u8],
    quoting: Quoting,
}

impl<'a> Elements<'a> {
    pub fn new(value: &'a [u8], quoting: Quoting) -> Self {
        Elements {
            rest: value,
            quoting,
        }
    }
}

impl<'a> Iterator for Elements<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        while !self.rest.is_empty() {
            let end = element_end(self.rest, self.quoting);
            let element = self.rest[..end].trim_ascii();
            self.rest = self.rest.get(end + 1..).unwrap_or_default();
            if !element.is_empty() {
                return Some(element);
            }
        }
        None
    }
}

/// Where the first element of `s` ends: the first comma outside quotes, or the end.
fn element_end(s: &[u8], quoting: Quoting) -> usize {
    let mut quoted = false;
    let mut i = 0;
    while i < s.len() {
        match s[i] {
            b'"' => quoted = !quoted,
            b'\\' if quoted && quoting == Quoting::Escapes => i += 1,
            b',' if !quoted => return i,
            _ => {}
        }
        i += 1;
    }
    s.len()
}

/// delta-seconds (RFC 9111 §1.2.2): one or more digits, larger values saturating at
/// [`DELTA_SECONDS_MAX`]. Anything else (empty, a sign, a fraction) is `None`.
pub fn delta_seconds(s: &[u8]) -> Option<u64> {
    if s.is_empty() || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let value = s.iter().try_fold(0u64, |n, &d| {
        n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    });
    Some(value.map_or(DELTA_SECONDS_MAX, |n| n.min(DELTA_SECONDS_MAX)))
}

/// An HTTP-date (RFC 9110 §5.6.7, all three formats) as unix seconds; `None` when
/// it is not one. A date before 1970 counts as 0.
pub fn http_date(value: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(value.trim_ascii()).ok()?;
    let time = httpdate::parse_http_date(text).ok()?;
    Some(
        time.duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(value: &str, quoting: Quoting) -> Vec<&str> {
        Elements::new(value.as_bytes(), quoting)
            .map(|e| std::str::from_utf8(e).unwrap())
            .collect()
    }

    #[test]
    fn elements_are_trimmed_and_empty_ones_skipped() {
        let cases: &[(&str, &[&str])] = &[
            ("a,b", &["a", "b"]),
            ("  a ,\tb\t", &["a", "b"]),
            (",,a,, ,b,", &["a", "b"]),
            ("", &[]),
            (" , ", &[]),
            ("max-age=5", &["max-age=5"]),
        ];
        for (value, want) in cases {
            assert_eq!(split(value, Quoting::Escapes), *want, "{value:?}");
        }
    }

    #[test]
    fn commas_inside_quotes_do_not_split() {
        assert_eq!(
            split(r#"no-cache="set-cookie, foo", max-age=5"#, Quoting::Escapes),
            [r#"no-cache="set-cookie, foo""#, "max-age=5"]
        );
        assert_eq!(
            split(r#""a,b", "c""#, Quoting::Plain),
            [r#""a,b""#, r#""c""#]
        );
        // An unclosed quote runs to the end of the field.
        assert_eq!(split(r#"a="x, y"#, Quoting::Escapes), [r#"a="x, y"#]);
    }

    #[test]
    fn backslash_escapes_only_in_quoted_strings() {
        // quoted-string: `\"` stays inside, so the comma after it is still quoted.
        assert_eq!(
            split(r#"ext="a\", b", max-age=1"#, Quoting::Escapes),
            [r#"ext="a\", b""#, "max-age=1"]
        );
        // entity-tag: `"a\"` is a whole tag, the comma after it splits.
        assert_eq!(split(r#""a\", "b""#, Quoting::Plain), [r#""a\""#, r#""b""#]);
        // Outside quotes a backslash is an ordinary byte.
        assert_eq!(split(r"a\,b", Quoting::Escapes), [r"a\", "b"]);
    }

    #[test]
    fn lists_run_across_repeated_fields_by_name_whatever_the_case() {
        let fields: Fields = &[
            (b"Cache-Control", b"public, max-age=1"),
            (b"ETag", b"\"x\""),
            (b"cache-control", b" no-transform "),
            (b"CACHE-CONTROL", b""),
        ];
        let got: Vec<&[u8]> = list(fields, b"Cache-Control", Quoting::Escapes).collect();
        assert_eq!(got, [&b"public"[..], b"max-age=1", b"no-transform"]);
        // A quote does not carry over into the next field.
        let fields: Fields = &[(b"vary", b"\"a, b"), (b"vary", b"c, d")];
        assert_eq!(list(fields, b"vary", Quoting::Escapes).count(), 3);
        assert!(has(&[(b"Vary", b"")], b"vary"));
        assert!(!has(&[(b"Varyx", b"")], b"vary"));
        assert_eq!(first(fields, b"VARY"), Some(&b"\"a, b"[..]));
        assert_eq!(first(fields, b"age"), None);
    }

    #[test]
    fn delta_seconds_are_digits_only_and_saturate() {
        let cases: &[(&str, Option<u64>)] = &[
            ("0", Some(0)),
            ("60", Some(60)),
            ("007", Some(7)),
            ("2147483647", Some(2147483647)),
            ("2147483648", Some(DELTA_SECONDS_MAX)),
            ("2147483649", Some(DELTA_SECONDS_MAX)),
            ("99999999999999999999999999", Some(DELTA_SECONDS_MAX)),
            ("", None),
            ("abc", None),
            ("-1", None),
            ("+1", None),
            ("1.5", None),
            ("1 ", None),
        ];
        for (s, want) in cases {
            assert_eq!(delta_seconds(s.as_bytes()), *want, "{s:?}");
        }
    }

    #[test]
    fn http_dates_in_all_three_formats() {
        // RFC 9110 §5.6.7's example instant.
        let t = 784_111_777;
        assert_eq!(http_date(b"Sun, 06 Nov 1994 08:49:37 GMT"), Some(t));
        assert_eq!(http_date(b"Sunday, 06-Nov-94 08:49:37 GMT"), Some(t));
        assert_eq!(http_date(b"Sun Nov  6 08:49:37 1994"), Some(t));
        assert_eq!(http_date(b"  Sun, 06 Nov 1994 08:49:37 GMT "), Some(t));
        for bad in [
            &b"0"[..],
            b"",
            b"-1",
            b"tomorrow",
            b"Sun, 06 Nov 1994 25:49:37 GMT",
            b"\xff",
        ] {
            assert_eq!(http_date(bad), None, "{bad:?}");
        }
    }
}

//! A client's conditional GET or HEAD against a stored entry (RFC 9110 §13): whether
//! the cache answers 304 Not Modified itself.

use super::fields::{self, Quoting};
use super::Fields;

/// Whether a client's conditional request is answered 304 from a stored entry with
/// validators `etag` and `last_modified` (as the response sent them), in RFC 9110
/// §13.2.2's order:
///
/// - `If-None-Match`, when present, decides alone: 304 when one of its entity-tags
///   matches `etag` by weak comparison (§8.8.3.2: `W/"x"` matches `"x"`), or it is
///   `*` (the entry is a current representation).
/// - Otherwise `If-Modified-Since`: 304 when `last_modified` is no later than its
///   date. It is ignored (RFC 9110 §13.1.3) when it is not one valid HTTP-date, or comes in
///   more than one field, or the entry has no valid Last-Modified.
///
/// Both apply to GET and HEAD only, the only requests the cache answers (see
/// [`super::bypass`]). `If-Match`, `If-Unmodified-Since` and `If-Range` are not
/// evaluated here. Unlike RFC 9111 §4.3.2, an entry without Last-Modified does not
/// fall back to its Date (nginx does not either): it never matches a date.
pub fn not_modified(request: Fields, etag: Option<&[u8]>, last_modified: Option<&[u8]>) -> bool {
    if fields::has(request, b"if-none-match") {
        return fields::list(request, b"if-none-match", Quoting::Plain)
            .any(|tag| tag == b"*" || etag.is_some_and(|etag| weak_match(tag, etag.trim_ascii())));
    }
    let mut since = fields::values(request, b"if-modified-since");
    let (Some(since), None) = (since.next(), since.next()) else {
        return false;
    };
    match (
        fields::http_date(since),
        last_modified.and_then(fields::http_date),
    ) {
        (Some(since), Some(modified)) => modified <= since,
        _ => false,
    }
}

/// Weak comparison of two entity-tags (RFC 9110 §8.8.3.2): their opaque-tags are
/// equal, whether either is weak. Something that is not an entity-tag (no quotes)
/// matches nothing.
fn weak_match(a: &[u8], b: &[u8]) -> bool {
    match (opaque_tag(a), opaque_tag(b)) {
        (Some(a), Some(b)) => a == b,
        _ => false,
    }
}

/// The opaque-tag of an entity-tag, quotes included: `W/"x"` and `"x"` give `"x"`.
fn opaque_tag(tag: &[u8]) -> Option<&[u8]> {
    let opaque = tag.strip_prefix(b"W/").unwrap_or(tag);
    let quoted = opaque.len() >= 2 && opaque.starts_with(b"\"") && opaque.ends_with(b"\"");
    quoted.then_some(opaque)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DATE: &[u8] = b"Sun, 06 Nov 1994 08:49:37 GMT";
    const EARLIER: &[u8] = b"Sun, 06 Nov 1994 08:49:36 GMT";
    const LATER: &[u8] = b"Sunday, 06-Nov-94 08:49:38 GMT";

    fn inm(value: &'static [u8], etag: &[u8]) -> bool {
        not_modified(&[(b"If-None-Match", value)], Some(etag), None)
    }

    #[test]
    fn if_none_match_weak_comparison() {
        let cases: &[(&[u8], &[u8], bool)] = &[
            (b"\"x\"", b"\"x\"", true),
            (b"W/\"x\"", b"\"x\"", true),
            (b"\"x\"", b"W/\"x\"", true),
            (b"W/\"x\"", b"W/\"x\"", true),
            (b"\"x\"", b"\"y\"", false),
            (b"\"x\"", b"\"X\"", false),
            (b"w/\"x\"", b"\"x\"", false),
            (b"x", b"x", false),
            (b"\"x\"", b" \"x\" ", true),
            (b"\"\"", b"\"\"", true),
            (b"\"", b"\"", false),
        ];
        for &(header, etag, want) in cases {
            assert_eq!(inm(header, etag), want, "{header:?} vs {etag:?}");
        }
    }

    #[test]
    fn if_none_match_lists_and_star() {
        assert!(inm(b"\"a\", \"b\", W/\"x\"", b"\"x\""));
        assert!(inm(b"\"a\",\"x\"", b"\"x\""));
        assert!(!inm(b"\"a\", \"b\"", b"\"x\""));
        // A comma inside an entity-tag does not split it.
        assert!(inm(b"\"a,b\"", b"\"a,b\""));
        assert!(!inm(b"\"a,b\"", b"\"b\""));
        // A backslash is part of an entity-tag, not an escape.
        assert!(inm(b"\"a\\\", \"x\"", b"\"x\""));
        let split: Fields = &[(b"If-None-Match", b"\"a\""), (b"if-none-match", b"\"x\"")];
        assert!(not_modified(split, Some(b"\"x\""), None));
        assert!(inm(b"*", b"\"x\""));
        assert!(not_modified(&[(b"If-None-Match", b" * ")], None, None));
        assert!(!not_modified(&[(b"If-None-Match", b"\"x\"")], None, None));
    }

    #[test]
    fn if_none_match_decides_over_if_modified_since() {
        let both: Fields = &[(b"If-Modified-Since", LATER), (b"If-None-Match", b"\"y\"")];
        assert!(!not_modified(both, Some(b"\"x\""), Some(DATE)));
        assert!(not_modified(both, Some(b"\"y\""), Some(LATER)));
        // Present but empty still decides (nothing matches).
        let empty: Fields = &[(b"If-None-Match", b""), (b"If-Modified-Since", LATER)];
        assert!(!not_modified(empty, Some(b"\"x\""), Some(DATE)));
    }

    #[test]
    fn if_modified_since_compares_dates() {
        // (If-Modified-Since, Last-Modified, 304)
        type Case = (&'static [u8], Option<&'static [u8]>, bool);
        let cases: &[Case] = &[
            (DATE, Some(DATE), true),
            (LATER, Some(DATE), true),
            (EARLIER, Some(DATE), false),
            // Another format of the same instant is the same date.
            (b"Sun Nov  6 08:49:37 1994", Some(DATE), true),
            (b"yesterday", Some(DATE), false),
            (DATE, Some(b"yesterday"), false),
            (DATE, None, false),
        ];
        for &(since, modified, want) in cases {
            let request: Fields = &[(b"If-Modified-Since", since)];
            assert_eq!(
                not_modified(request, None, modified),
                want,
                "{since:?} vs {modified:?}"
            );
        }
        assert!(!not_modified(&[], Some(b"\"x\""), Some(DATE)));
    }

    #[test]
    fn if_modified_since_in_two_fields_is_ignored() {
        let two: Fields = &[(b"If-Modified-Since", DATE), (b"If-Modified-Since", DATE)];
        assert!(!not_modified(two, None, Some(DATE)));
    }
}

//! Vary (RFC 9110 §12.5.5, RFC 9111 §4.1): which request fields a stored response
//! was chosen by, and the secondary key that tells its variants apart.

use super::fields::{self, Quoting};
use super::Fields;

/// The most distinct field names a stored response may vary by; more is not stored
/// (each costs a secondary key part on every lookup, and real origins vary by one or
/// two).
pub const MAX_VARY_FIELDS: usize = 4;

/// A response's Vary, from every Vary field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Vary {
    /// Field names, lowercased, deduplicated, sorted; empty without Vary.
    Names(Vec<Box<[u8]>>),
    /// `*`: the response may differ by anything, so no request can be matched to it.
    Star,
    /// More than [`MAX_VARY_FIELDS`] distinct names.
    TooMany,
}

/// The response's Vary names.
pub fn vary(response: Fields) -> Vary {
    let mut names: Vec<Box<[u8]>> = Vec::new();
    for name in fields::list(response, b"vary", Quoting::Escapes) {
        if name == b"*" {
            return Vary::Star;
        }
        let name = name.to_ascii_lowercase().into_boxed_slice();
        if !names.contains(&name) {
            names.push(name);
        }
    }
    if names.len() > MAX_VARY_FIELDS {
        return Vary::TooMany;
    }
    names.sort();
    Vary::Names(names)
}

/// The secondary key for a Vary'd response: for each name in `vary` (as
/// [`super::Freshness::vary`] gives them), the name, then the request's values for it.
///
/// The values are normalised as RFC 9111 §4.1 allows: every field of that name, as
/// one list (RFC 9110 §5.3), its elements trimmed and joined by ", " (so
/// `gzip,br`, `gzip, br` and two fields `gzip` and `br` are one variant), empty
/// elements dropped. Their case is kept.
///
/// A field the request lacks only matches a request that lacks it too (§4.1), so
/// absent and present-but-empty differ. Every part is length-prefixed, so no two
/// different requests give one key, whatever bytes their values hold:
/// `name`, `0x00`, then `0x00` for an absent field or `0x01`, the values' length (4
/// bytes, big-endian) and the values.
pub fn vary_key(vary: &[Box<[u8]>], request: Fields) -> Vec<u8> {
    let mut key = Vec::new();
    for name in vary {
        key.extend_from_slice(name);
        key.push(0);
        if !fields::has(request, name) {
            key.push(0);
            continue;
        }
        let mut values = Vec::new();
        for element in fields::list(request, name, Quoting::Escapes) {
            if !values.is_empty() {
                values.extend_from_slice(b", ");
            }
            values.extend_from_slice(element);
        }
        key.push(1);
        let len = u32::try_from(values.len()).unwrap_or(u32::MAX);
        key.extend_from_slice(&len.to_be_bytes());
        key.extend_from_slice(&values);
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<Box<[u8]>> {
        list.iter().map(|n| n.as_bytes().into()).collect()
    }

    #[test]
    fn vary_names_are_lowercased_deduplicated_sorted() {
        let fields: Fields = &[
            (b"Vary", b"User-Agent, accept-encoding"),
            (b"Content-Type", b"text/plain"),
            (b"VARY", b" Accept-Encoding ,Accept-Language,,"),
        ];
        assert_eq!(
            vary(fields),
            Vary::Names(names(&["accept-encoding", "accept-language", "user-agent"]))
        );
        assert_eq!(vary(&[]), Vary::Names(vec![]));
        assert_eq!(vary(&[(b"Vary", b"")]), Vary::Names(vec![]));
        assert_eq!(vary(&[(b"Vary", b" , ")]), Vary::Names(vec![]));
    }

    #[test]
    fn vary_star_anywhere_is_star() {
        assert_eq!(vary(&[(b"Vary", b"*")]), Vary::Star);
        assert_eq!(vary(&[(b"Vary", b"accept-encoding, *")]), Vary::Star);
        assert_eq!(vary(&[(b"Vary", b"accept"), (b"vary", b" * ")]), Vary::Star);
        // `*` inside a name is not the star.
        assert_eq!(vary(&[(b"Vary", b"x-*")]), Vary::Names(names(&["x-*"])));
    }

    #[test]
    fn more_than_max_distinct_names_is_too_many() {
        let four: Fields = &[(b"Vary", b"a, b, c, d, A, B")];
        assert_eq!(vary(four), Vary::Names(names(&["a", "b", "c", "d"])));
        let five: Fields = &[(b"Vary", b"a, b, c, d"), (b"Vary", b"e")];
        assert_eq!(vary(five), Vary::TooMany);
    }

    #[test]
    fn key_normalises_list_whitespace_and_repeated_fields() {
        let v = names(&["accept-encoding"]);
        let one: Fields = &[(b"Accept-Encoding", b"gzip, br")];
        let tight: Fields = &[(b"accept-encoding", b"gzip,br")];
        let loose: Fields = &[(b"ACCEPT-ENCODING", b"  gzip ,  br ,")];
        let split: Fields = &[
            (b"Accept-Encoding", b"gzip"),
            (b"Host", b"a"),
            (b"Accept-Encoding", b"br"),
        ];
        let k = vary_key(&v, one);
        assert_eq!(k, b"accept-encoding\0\x01\0\0\0\x08gzip, br");
        for other in [tight, loose, split] {
            assert_eq!(vary_key(&v, other), k, "{other:?}");
        }
        // Order and case of values count.
        assert_ne!(vary_key(&v, &[(b"Accept-Encoding", b"br, gzip")]), k);
        assert_ne!(vary_key(&v, &[(b"Accept-Encoding", b"GZIP, br")]), k);
        // Fields the response does not vary by do not count.
        assert_eq!(
            vary_key(
                &v,
                &[(b"Accept-Encoding", b"gzip, br"), (b"Cookie", b"a=1")]
            ),
            k
        );
    }

    #[test]
    fn key_tells_absent_from_empty() {
        let v = names(&["accept-encoding"]);
        let absent = vary_key(&v, &[(b"Host", b"a")]);
        let empty = vary_key(&v, &[(b"Accept-Encoding", b"")]);
        let commas = vary_key(&v, &[(b"Accept-Encoding", b" , ")]);
        assert_eq!(absent, b"accept-encoding\0\0");
        assert_ne!(absent, empty);
        assert_eq!(empty, commas);
        assert!(vary_key(&[], &[(b"Accept-Encoding", b"gzip")]).is_empty());
    }

    #[test]
    fn keys_of_different_requests_never_collide() {
        let v = names(&["a", "b"]);
        let requests: &[Fields] = &[
            &[],
            &[(b"a", b"")],
            &[(b"b", b"")],
            &[(b"a", b""), (b"b", b"")],
            &[(b"a", b"x")],
            &[(b"b", b"x")],
            &[(b"a", b"x\0b\0")],
            &[(b"a", b"x\0\x01\0\0\0\0")],
            &[(b"a", b"x"), (b"b", b"y")],
            &[(b"a", b"x, b"), (b"b", b"y")],
            &[(b"a", b"x"), (b"b", b"y, z")],
        ];
        let keys: Vec<Vec<u8>> = requests.iter().map(|r| vary_key(&v, r)).collect();
        for (i, a) in keys.iter().enumerate() {
            for (j, b) in keys.iter().enumerate().skip(i + 1) {
                assert_ne!(a, b, "{:?} and {:?}", requests[i], requests[j]);
            }
        }
    }
}

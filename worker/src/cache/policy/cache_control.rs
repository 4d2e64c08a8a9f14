//! Cache-Control directives (RFC 9111 §5.2), from every Cache-Control field of a
//! response or a request, and the request's `Pragma: no-cache` (§5.4).
//!
//! A directive is `name[=argument]`, the name compared case-insensitively, the
//! argument a token or a quoted-string, both accepted whatever form the directive
//! is meant to be sent in (§5.2). Unknown directives are ignored. A directive whose
//! number is not delta-seconds (`max-age=abc`) is ignored as if absent; where a
//! directive with a number repeats, its first valid occurrence counts (§4.2.1).
//! Directives without a number count when named, whatever their argument
//! (`private="set-cookie"` is `private`).

use super::fields::{self, Quoting};
use super::Fields;

/// Response Cache-Control directives forkd uses (RFC 9111 §5.2.2), from every
/// Cache-Control field.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ResponseDirectives {
    pub max_age: Option<u64>,
    pub s_maxage: Option<u64>,
    pub no_store: bool,
    /// `no-cache`, with or without field names.
    pub no_cache: bool,
    /// `private`, with or without field names.
    pub private: bool,
    pub public: bool,
    pub must_revalidate: bool,
    pub proxy_revalidate: bool,
    /// RFC 5861 §3.
    pub stale_while_revalidate: Option<u64>,
    /// RFC 5861 §4.
    pub stale_if_error: Option<u64>,
}

/// The response directives of every Cache-Control field in `fields`.
pub fn response_directives(fields: Fields) -> ResponseDirectives {
    let mut d = ResponseDirectives::default();
    for (name, argument) in directives(fields) {
        match name {
            Name::MaxAge => set_seconds(&mut d.max_age, argument),
            Name::SMaxage => set_seconds(&mut d.s_maxage, argument),
            Name::NoStore => d.no_store = true,
            Name::NoCache => d.no_cache = true,
            Name::Private => d.private = true,
            Name::Public => d.public = true,
            Name::MustRevalidate => d.must_revalidate = true,
            Name::ProxyRevalidate => d.proxy_revalidate = true,
            Name::StaleWhileRevalidate => set_seconds(&mut d.stale_while_revalidate, argument),
            Name::StaleIfError => set_seconds(&mut d.stale_if_error, argument),
            Name::MaxStale | Name::MinFresh | Name::OnlyIfCached | Name::Other => {}
        }
    }
    d
}

/// Request Cache-Control directives (RFC 9111 §5.2.1).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RequestDirectives {
    /// `no-cache`, or `Pragma: no-cache` in a request without Cache-Control.
    pub no_cache: bool,
    pub no_store: bool,
    pub max_age: Option<u64>,
    /// `max-stale`: `Some(None)` without a number (any staleness), `Some(Some(n))`
    /// stale by fewer than `n` seconds.
    pub max_stale: Option<Option<u64>>,
    pub min_fresh: Option<u64>,
    pub only_if_cached: bool,
}

/// The request directives of every Cache-Control field in `fields`; without any
/// Cache-Control field, `Pragma: no-cache` counts as `no-cache` (§5.4).
pub fn request_directives(fields: Fields) -> RequestDirectives {
    let mut d = RequestDirectives::default();
    for (name, argument) in directives(fields) {
        match name {
            Name::NoCache => d.no_cache = true,
            Name::NoStore => d.no_store = true,
            Name::MaxAge => set_seconds(&mut d.max_age, argument),
            Name::MinFresh => set_seconds(&mut d.min_fresh, argument),
            Name::OnlyIfCached => d.only_if_cached = true,
            Name::MaxStale => match argument {
                // Without a number: any staleness. A number that is not one is ignored.
                None => d.max_stale = d.max_stale.or(Some(None)),
                Some(a) => {
                    if let (None, Some(n)) = (d.max_stale, seconds(a)) {
                        d.max_stale = Some(Some(n));
                    }
                }
            },
            Name::SMaxage
            | Name::Private
            | Name::Public
            | Name::MustRevalidate
            | Name::ProxyRevalidate
            | Name::StaleWhileRevalidate
            | Name::StaleIfError
            | Name::Other => {}
        }
    }
    if !fields::has(fields, b"cache-control") {
        d.no_cache = fields::list(fields, b"pragma", Quoting::Escapes)
            .any(|e| e.eq_ignore_ascii_case(b"no-cache"));
    }
    d
}

/// The directives forkd reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Name {
    MaxAge,
    SMaxage,
    NoStore,
    NoCache,
    Private,
    Public,
    MustRevalidate,
    ProxyRevalidate,
    StaleWhileRevalidate,
    StaleIfError,
    MaxStale,
    MinFresh,
    OnlyIfCached,
    Other,
}

impl Name {
    fn of(name: &[u8]) -> Name {
        const NAMES: &[(&[u8], Name)] = &[
            (b"max-age", Name::MaxAge),
            (b"s-maxage", Name::SMaxage),
            (b"no-store", Name::NoStore),
            (b"no-cache", Name::NoCache),
            (b"private", Name::Private),
            (b"public", Name::Public),
            (b"must-revalidate", Name::MustRevalidate),
            (b"proxy-revalidate", Name::ProxyRevalidate),
            (b"stale-while-revalidate", Name::StaleWhileRevalidate),
            (b"stale-if-error", Name::StaleIfError),
            (b"max-stale", Name::MaxStale),
            (b"min-fresh", Name::MinFresh),
            (b"only-if-cached", Name::OnlyIfCached),
        ];
        NAMES
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map_or(Name::Other, |&(_, known)| known)
    }
}

/// Every directive of every Cache-Control field: its name and its argument, if it
/// has one (`=` and what follows, trimmed, quotes still on).
fn directives(fields: Fields<'_>) -> impl Iterator<Item = (Name, Option<&[u8]>)> {
    fields::list(fields, b"cache-control", Quoting::Escapes).map(|element| {
        match element.iter().position(|&b| b == b'=') {
            Some(eq) => (
                Name::of(element[..eq].trim_ascii()),
                Some(element[eq + 1..].trim_ascii()),
            ),
            None => (Name::of(element), None),
        }
    })
}

/// Keeps the first valid number of a directive.
fn set_seconds(slot: &mut Option<u64>, argument: Option<&[u8]>) {
    if slot.is_none() {
        *slot = argument.and_then(seconds);
    }
}

/// A directive's delta-seconds argument, as a token or a quoted-string (`"5"`).
fn seconds(argument: &[u8]) -> Option<u64> {
    let unquoted = argument
        .strip_prefix(b"\"")
        .and_then(|a| a.strip_suffix(b"\""))
        .unwrap_or(argument);
    fields::delta_seconds(unquoted)
}

#[cfg(test)]
mod tests {
    use super::super::fields::DELTA_SECONDS_MAX;
    use super::*;

    fn cc(values: &[&'static str]) -> Vec<(&'static [u8], &'static [u8])> {
        values
            .iter()
            .map(|v| (&b"Cache-Control"[..], v.as_bytes()))
            .collect()
    }

    fn response(values: &[&'static str]) -> ResponseDirectives {
        response_directives(&cc(values))
    }

    fn request(values: &[&'static str]) -> RequestDirectives {
        request_directives(&cc(values))
    }

    #[test]
    fn response_directives_each_one() {
        let d = ResponseDirectives::default();
        let cases: &[(&str, ResponseDirectives)] = &[
            (
                "max-age=60",
                ResponseDirectives {
                    max_age: Some(60),
                    ..d
                },
            ),
            (
                "s-maxage=5",
                ResponseDirectives {
                    s_maxage: Some(5),
                    ..d
                },
            ),
            (
                "no-store",
                ResponseDirectives {
                    no_store: true,
                    ..d
                },
            ),
            (
                "no-cache",
                ResponseDirectives {
                    no_cache: true,
                    ..d
                },
            ),
            ("private", ResponseDirectives { private: true, ..d }),
            ("public", ResponseDirectives { public: true, ..d }),
            (
                "must-revalidate",
                ResponseDirectives {
                    must_revalidate: true,
                    ..d
                },
            ),
            (
                "proxy-revalidate",
                ResponseDirectives {
                    proxy_revalidate: true,
                    ..d
                },
            ),
            (
                "stale-while-revalidate=30",
                ResponseDirectives {
                    stale_while_revalidate: Some(30),
                    ..d
                },
            ),
            (
                "stale-if-error=600",
                ResponseDirectives {
                    stale_if_error: Some(600),
                    ..d
                },
            ),
            ("", d),
            ("no-transform, immutable, x-ext=1", d),
            // Request-only directives mean nothing in a response.
            ("max-stale, min-fresh=1, only-if-cached", d),
        ];
        for (value, want) in cases {
            assert_eq!(response(&[value]), *want, "{value:?}");
        }
    }

    #[test]
    fn directives_are_split_across_fields_and_case_insensitive() {
        let want = ResponseDirectives {
            public: true,
            max_age: Some(60),
            s_maxage: Some(10),
            must_revalidate: true,
            ..Default::default()
        };
        assert_eq!(
            response(&["public, max-age=60", "S-MaxAge=10", "Must-Revalidate"]),
            want
        );
        assert_eq!(
            response(&["PUBLIC,MAX-AGE=60,s-maxage=10,must-revalidate"]),
            want
        );
        assert_eq!(
            response(&[
                " public ,, max-age = 60 ",
                "",
                "s-maxage=10, must-revalidate"
            ]),
            want
        );
        // Another field's name is not Cache-Control.
        let fields: Fields = &[
            (b"Cache-Controls", b"no-store"),
            (b"X-Cache-Control", b"no-store"),
        ];
        assert_eq!(response_directives(fields), ResponseDirectives::default());
    }

    #[test]
    fn quoted_field_names_do_not_leak_directives() {
        let d = response(&[r#"no-cache="set-cookie, max-age=5", private="x,no-store""#]);
        assert!(d.no_cache && d.private);
        assert_eq!(d.max_age, None);
        assert!(!d.no_store);
        let d = response(&[r#"no-cache="set-cookie, foo", max-age=5"#]);
        assert!(d.no_cache);
        assert_eq!(d.max_age, Some(5));
    }

    #[test]
    fn numbers_invalid_are_ignored_first_valid_counts_huge_saturate() {
        let cases: &[(&[&str], Option<u64>)] = &[
            (&["max-age=abc"], None),
            (&["max-age"], None),
            (&["max-age="], None),
            (&["max-age=-5"], None),
            (&["max-age=1.5"], None),
            (&["max-age=\"30\""], Some(30)),
            (&["max-age=\"30"], None),
            (&["max-age=abc, max-age=7"], Some(7)),
            (&["max-age=7", "max-age=9"], Some(7)),
            (&["max-age=0"], Some(0)),
            (
                &["max-age=99999999999999999999999"],
                Some(DELTA_SECONDS_MAX),
            ),
        ];
        for (values, want) in cases {
            assert_eq!(response(values).max_age, *want, "{values:?}");
            let s: Vec<String> = values
                .iter()
                .map(|v| v.replace("max-age", "stale-if-error"))
                .collect();
            let fields: Vec<(&[u8], &[u8])> = s
                .iter()
                .map(|v| (&b"cache-control"[..], v.as_bytes()))
                .collect();
            assert_eq!(response_directives(&fields).stale_if_error, *want, "{s:?}");
        }
    }

    #[test]
    fn request_directives_each_one() {
        let d = RequestDirectives::default();
        let cases: &[(&str, RequestDirectives)] = &[
            (
                "no-cache",
                RequestDirectives {
                    no_cache: true,
                    ..d
                },
            ),
            (
                "no-store",
                RequestDirectives {
                    no_store: true,
                    ..d
                },
            ),
            (
                "max-age=0",
                RequestDirectives {
                    max_age: Some(0),
                    ..d
                },
            ),
            (
                "max-stale",
                RequestDirectives {
                    max_stale: Some(None),
                    ..d
                },
            ),
            (
                "max-stale=20",
                RequestDirectives {
                    max_stale: Some(Some(20)),
                    ..d
                },
            ),
            (
                "max-stale=\"20\"",
                RequestDirectives {
                    max_stale: Some(Some(20)),
                    ..d
                },
            ),
            ("max-stale=x", d),
            (
                "max-stale=x, max-stale=3",
                RequestDirectives {
                    max_stale: Some(Some(3)),
                    ..d
                },
            ),
            (
                "max-stale, max-stale=3",
                RequestDirectives {
                    max_stale: Some(None),
                    ..d
                },
            ),
            (
                "max-stale=3, max-stale",
                RequestDirectives {
                    max_stale: Some(Some(3)),
                    ..d
                },
            ),
            (
                "min-fresh=10",
                RequestDirectives {
                    min_fresh: Some(10),
                    ..d
                },
            ),
            (
                "only-if-cached",
                RequestDirectives {
                    only_if_cached: true,
                    ..d
                },
            ),
            (
                "MAX-AGE=5, No-Cache",
                RequestDirectives {
                    max_age: Some(5),
                    no_cache: true,
                    ..d
                },
            ),
            // Response-only directives mean nothing in a request.
            ("public, private, s-maxage=1, must-revalidate", d),
        ];
        for (value, want) in cases {
            assert_eq!(request(&[value]), *want, "{value:?}");
        }
    }

    #[test]
    fn pragma_no_cache_counts_only_without_cache_control() {
        let pragma: Fields = &[(b"Pragma", b"No-Cache")];
        assert!(request_directives(pragma).no_cache);
        let pragma: Fields = &[(b"pragma", b"x-foo, no-cache")];
        assert!(request_directives(pragma).no_cache);
        let other: Fields = &[(b"Pragma", b"x-no-cache")];
        assert!(!request_directives(other).no_cache);
        // Any Cache-Control field, even one without no-cache, overrides Pragma.
        let both: Fields = &[(b"Pragma", b"no-cache"), (b"Cache-Control", b"max-age=5")];
        let d = request_directives(both);
        assert!(!d.no_cache);
        assert_eq!(d.max_age, Some(5));
        // Pragma is a request field only.
        assert_eq!(response_directives(pragma), ResponseDirectives::default());
    }
}

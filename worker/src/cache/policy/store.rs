//! Storing responses in a shared cache (RFC 9111 §3): whether a response may be
//! stored, and for how long it is fresh (§4.2).

use super::cache_control::{request_directives, response_directives, ResponseDirectives};
use super::fields::{self, Elements, Quoting, DELTA_SECONDS_MAX};
use super::vary::{vary, Vary};
use super::Fields;
use crate::http::request::Method;

/// The statuses stored on the response's own explicit freshness (s-maxage, max-age,
/// Expires): RFC 9110 §15.1's heuristically cacheable ones without 206 (partial
/// content is never stored here), with 302 and 307 (nginx stores those too). Any
/// other status with explicit freshness is stored only if the route's `valid`
/// table gives it.
pub const STORABLE_STATUSES: [u16; 13] = [
    200, 203, 204, 300, 301, 302, 307, 308, 404, 405, 410, 414, 501,
];

/// Whether and how a response may be stored by a shared cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Storable {
    No(NotStored),
    Yes(Freshness),
}

/// Why a response is not stored, in the order [`storable`] checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotStored {
    /// The request was neither GET nor HEAD.
    Method,
    /// The request said `Cache-Control: no-store` (RFC 9111 §5.2.1.5).
    RequestNoStore,
    /// 1xx, 206, 304 or not a status at all; or a status not in
    /// [`STORABLE_STATUSES`] with explicit freshness that the `valid` table does not
    /// give.
    Status,
    /// `no-store` (§5.2.2.5).
    NoStore,
    /// `private`, with or without field names (§5.2.2.7): a shared cache does not
    /// keep a part of it either.
    Private,
    /// The request carried `Authorization` and the response allows no shared cache
    /// to reuse it: none of `public`, `s-maxage`, `must-revalidate` (§3.5).
    Authorization,
    /// The response sets a cookie and is not `public` (as nginx: one client's
    /// cookie must not reach the others).
    SetCookie,
    /// `Vary: *` (RFC 9110 §12.5.5): no request can be matched to it.
    VaryStar,
    /// More than [`super::MAX_VARY_FIELDS`] distinct Vary names.
    TooManyVary,
    /// Neither explicit freshness nor a `valid` table entry for the status. forkd
    /// uses no heuristic freshness (from Last-Modified), as nginx.
    NoFreshness,
}

/// How a stored response may be reused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Freshness {
    /// Seconds the response is fresh for from when it was stored (its freshness
    /// lifetime already reduced by its age on arrival; may be 0: stored but stale at
    /// once, e.g. `no-cache`, which must be revalidated before every use). At most
    /// 2^31.
    pub ttl: u64,
    /// Its age on arrival (RFC 9111 §4.2.3 corrected_initial_age, with no response
    /// delay): max(Age field, now − Date). The `Age` sent with it adds the time
    /// since it was stored ([`super::Entry::age`]).
    pub age: u64,
    /// The response's own `stale-while-revalidate` seconds, if it said any.
    pub stale_while_revalidate: Option<u64>,
    /// The response's own `stale-if-error` seconds, if it said any.
    pub stale_if_error: Option<u64>,
    /// A stale entry is never served without revalidating it: must-revalidate,
    /// proxy-revalidate or s-maxage (RFC 9111 §4.2.4, §5.2.2.10), or no-cache.
    pub must_revalidate: bool,
    /// Vary field names, lowercased, deduplicated, sorted (empty without Vary): pass
    /// them to [`super::vary_key`].
    pub vary: Vec<Box<[u8]>>,
    /// The validator to revalidate with: the first ETag field as received, trimmed.
    pub etag: Option<Box<[u8]>>,
    /// The other validator: the first Last-Modified field as received, trimmed.
    pub last_modified: Option<Box<[u8]>>,
}

/// A response head received from an upstream, and what decides whether it is stored.
#[derive(Debug, Clone, Copy)]
pub struct StoreInput<'a> {
    /// The request's method.
    pub method: Method,
    pub status: u16,
    /// The response's fields.
    pub response: Fields<'a>,
    /// The client request's fields (for `Authorization` and `no-store`).
    pub request: Fields<'a>,
    /// The route's `valid` table: (status, seconds), used when the response gives no
    /// freshness. Status 0 stands for any status not listed; 0 seconds is not
    /// stored (so `(404, 0)` keeps 404s out of a `(0, 600)` route).
    pub valid: &'a [(u16, u64)],
    /// When forkd received the response head (unix seconds).
    pub now: u64,
}

/// Whether a shared cache may store the response (RFC 9111 §3, nginx where the RFC
/// leaves room), and how fresh it is. The rules, in order:
///
/// 1. Only responses to GET and HEAD, whose request did not say `no-store`.
/// 2. Never 1xx, 206 (forkd stores whole responses) or 304 (it updates an entry,
///    it is not one).
/// 3. Not `no-store`, not `private`; not to a request with `Authorization` unless
///    `public`, `s-maxage` or `must-revalidate`; not with `Set-Cookie` unless
///    `public`; not `Vary: *` nor more than [`super::MAX_VARY_FIELDS`] names.
/// 4. The freshness lifetime: `s-maxage`, else `max-age`, else `Expires` − `Date`
///    (`now` without a valid Date; an invalid Expires is already expired, §5.3),
///    stored for a status in [`STORABLE_STATUSES`] or one the `valid` table gives;
///    else the `valid` table's seconds for the status; else not stored.
/// 5. ttl = lifetime − age on arrival (never below 0), whichever gave the lifetime.
///    `no-cache` (with or without field names) stores it with ttl 0 and
///    `must_revalidate`, to be revalidated on every use.
pub fn storable(input: &StoreInput) -> Storable {
    match decide(input) {
        Ok(freshness) => Storable::Yes(freshness),
        Err(why) => Storable::No(why),
    }
}

fn decide(input: &StoreInput) -> Result<Freshness, NotStored> {
    if input.method == Method::Other {
        return Err(NotStored::Method);
    }
    if request_directives(input.request).no_store {
        return Err(NotStored::RequestNoStore);
    }
    if !(200..=599).contains(&input.status) || input.status == 206 || input.status == 304 {
        return Err(NotStored::Status);
    }
    let d = response_directives(input.response);
    if d.no_store {
        return Err(NotStored::NoStore);
    }
    if d.private {
        return Err(NotStored::Private);
    }
    let shareable = d.public || d.s_maxage.is_some() || d.must_revalidate;
    if fields::has(input.request, b"authorization") && !shareable {
        return Err(NotStored::Authorization);
    }
    if fields::has(input.response, b"set-cookie") && !d.public {
        return Err(NotStored::SetCookie);
    }
    let vary = match vary(input.response) {
        Vary::Names(names) => names,
        Vary::Star => return Err(NotStored::VaryStar),
        Vary::TooMany => return Err(NotStored::TooManyVary),
    };
    let date = fields::first(input.response, b"date").and_then(fields::http_date);
    let table = valid_seconds(input.valid, input.status);
    let lifetime = match explicit_lifetime(&d, input.response, date, input.now) {
        Some(lifetime) if STORABLE_STATUSES.contains(&input.status) || table.is_some() => lifetime,
        Some(_) => return Err(NotStored::Status),
        None => table.ok_or(NotStored::NoFreshness)?,
    };
    let age = age_on_arrival(input.response, date, input.now);
    Ok(Freshness {
        ttl: if d.no_cache {
            0
        } else {
            lifetime.saturating_sub(age)
        },
        age,
        stale_while_revalidate: d.stale_while_revalidate,
        stale_if_error: d.stale_if_error,
        must_revalidate: d.must_revalidate
            || d.proxy_revalidate
            || d.s_maxage.is_some()
            || d.no_cache,
        vary,
        etag: validator(input.response, b"etag"),
        last_modified: validator(input.response, b"last-modified"),
    })
}

/// The response's own freshness lifetime (RFC 9111 §4.2.1): a shared cache's
/// s-maxage, else max-age, else Expires − Date. `None`: it gave none.
fn explicit_lifetime(
    d: &ResponseDirectives,
    response: Fields,
    date: Option<u64>,
    now: u64,
) -> Option<u64> {
    if let Some(seconds) = d.s_maxage.or(d.max_age) {
        return Some(seconds);
    }
    let expires = fields::first(response, b"expires")?;
    // An invalid Expires ("0" included) is a time in the past (§5.3).
    let expires = fields::http_date(expires).unwrap_or(0);
    Some(
        expires
            .saturating_sub(date.unwrap_or(now))
            .min(DELTA_SECONDS_MAX),
    )
}

/// The `valid` table's seconds for `status`: its own row, else row 0; none when
/// neither is there or the row says 0.
fn valid_seconds(valid: &[(u16, u64)], status: u16) -> Option<u64> {
    let row = valid
        .iter()
        .find(|&&(s, _)| s == status)
        .or_else(|| valid.iter().find(|&&(s, _)| s == 0));
    row.map(|&(_, seconds)| seconds.min(DELTA_SECONDS_MAX))
        .filter(|&seconds| seconds > 0)
}

/// The response's age when it arrived (RFC 9111 §4.2.3): the larger of its Age
/// field (the first member of the first field, §5.1; ignored when invalid) and how
/// long ago its Date was (0 when Date is missing, invalid or in the future).
fn age_on_arrival(response: Fields, date: Option<u64>, now: u64) -> u64 {
    let age_value = fields::first(response, b"age")
        .and_then(|v| Elements::new(v, Quoting::Escapes).next())
        .and_then(fields::delta_seconds)
        .unwrap_or(0);
    let apparent_age = date.map_or(0, |date| now.saturating_sub(date));
    age_value.max(apparent_age).min(DELTA_SECONDS_MAX)
}

fn validator(response: Fields, name: &'static [u8]) -> Option<Box<[u8]>> {
    fields::first(response, name)
        .filter(|v| !v.is_empty())
        .map(Box::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    const NOW: u64 = 1_000_000_000;

    /// Fields as text.
    type Pairs<'a> = &'a [(&'a str, &'a str)];

    fn date(t: u64) -> String {
        httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(t))
    }

    fn bytes<'a>(fields: &[(&'a str, &'a str)]) -> Vec<(&'a [u8], &'a [u8])> {
        fields
            .iter()
            .map(|(n, v)| (n.as_bytes(), v.as_bytes()))
            .collect()
    }

    fn decide_full(
        method: Method,
        status: u16,
        response: &[(&str, &str)],
        request: &[(&str, &str)],
        valid: &[(u16, u64)],
    ) -> Storable {
        storable(&StoreInput {
            method,
            status,
            response: &bytes(response),
            request: &bytes(request),
            valid,
            now: NOW,
        })
    }

    /// A 200 to a plain GET, no `valid` table.
    fn store(response: &[(&str, &str)]) -> Storable {
        decide_full(Method::Get, 200, response, &[], &[])
    }

    fn yes(result: Storable) -> Freshness {
        match result {
            Storable::Yes(f) => f,
            Storable::No(why) => panic!("not stored: {why:?}"),
        }
    }

    fn ttl(response: &[(&str, &str)]) -> u64 {
        yes(store(response)).ttl
    }

    const FRESH: (&str, &str) = ("Cache-Control", "max-age=60");

    #[test]
    fn only_get_and_head_without_request_no_store() {
        assert_eq!(
            decide_full(Method::Other, 200, &[FRESH], &[], &[]),
            Storable::No(NotStored::Method)
        );
        assert_eq!(
            yes(decide_full(Method::Head, 200, &[FRESH], &[], &[])).ttl,
            60
        );
        let no_store = [("Cache-Control", "No-Store")];
        assert_eq!(
            decide_full(Method::Get, 200, &[FRESH], &no_store, &[]),
            Storable::No(NotStored::RequestNoStore)
        );
        // A request's no-cache only asks for revalidation; the response is still kept.
        let no_cache = [("Cache-Control", "no-cache"), ("Pragma", "no-cache")];
        assert_eq!(
            yes(decide_full(Method::Get, 200, &[FRESH], &no_cache, &[])).ttl,
            60
        );
    }

    #[test]
    fn listed_statuses_are_stored_on_explicit_freshness() {
        for status in STORABLE_STATUSES {
            let f = yes(decide_full(Method::Get, status, &[FRESH], &[], &[]));
            assert_eq!(f.ttl, 60, "{status}");
        }
        for status in [201, 202, 400, 403, 500, 502, 503] {
            assert_eq!(
                decide_full(Method::Get, status, &[FRESH], &[], &[]),
                Storable::No(NotStored::Status),
                "{status}"
            );
        }
    }

    #[test]
    fn partial_not_modified_informational_and_bogus_statuses_are_never_stored() {
        for status in [0, 99, 100, 101, 103, 199, 206, 304, 600, 999] {
            let got = decide_full(Method::Get, status, &[FRESH], &[], &[(status, 60), (0, 60)]);
            assert_eq!(got, Storable::No(NotStored::Status), "{status}");
        }
    }

    #[test]
    fn valid_table_gives_freshness_and_admits_other_statuses() {
        let table = [(200, 30), (500, 5), (0, 600)];
        // (status, response, valid, ttl if stored)
        type Case<'a> = (u16, Pairs<'a>, &'a [(u16, u64)], Option<u64>);
        let cases: &[Case] = &[
            // Without explicit freshness: the status's row, else row 0.
            (200, &[], &table, Some(30)),
            (500, &[], &table, Some(5)),
            (404, &[], &table, Some(600)),
            (503, &[], &table, Some(600)),
            (200, &[], &[(0, 7)], Some(7)),
            // Explicit freshness wins over the table; the table only admits the status.
            (200, &[FRESH], &table, Some(60)),
            (500, &[FRESH], &table, Some(60)),
            (503, &[FRESH], &[(0, 1)], Some(60)),
            // A row of 0 seconds keeps its status out, even from row 0.
            (404, &[], &[(404, 0), (0, 600)], None),
            (500, &[FRESH], &[(500, 0), (0, 600)], None),
            (200, &[], &[(0, 0)], None),
            // Huge seconds saturate.
            (200, &[], &[(200, u64::MAX)], Some(DELTA_SECONDS_MAX)),
        ];
        for &(status, response, valid, want) in cases {
            let got = decide_full(Method::Get, status, response, &[], valid);
            match want {
                Some(ttl) => assert_eq!(yes(got).ttl, ttl, "{status} {response:?} {valid:?}"),
                None => assert!(
                    matches!(got, Storable::No(_)),
                    "{status} {valid:?}: {got:?}"
                ),
            }
        }
        assert_eq!(store(&[]), Storable::No(NotStored::NoFreshness));
        assert_eq!(
            decide_full(Method::Get, 500, &[], &[], &[(200, 60)]),
            Storable::No(NotStored::NoFreshness)
        );
        // Last-Modified gives no heuristic freshness.
        let old = date(NOW - 86_400 * 365);
        assert_eq!(
            store(&[("Last-Modified", &old)]),
            Storable::No(NotStored::NoFreshness)
        );
        // Neither does public alone.
        assert_eq!(
            store(&[("Cache-Control", "public")]),
            Storable::No(NotStored::NoFreshness)
        );
    }

    #[test]
    fn no_store_and_private_are_not_stored() {
        let cases: &[(&str, NotStored)] = &[
            ("no-store", NotStored::NoStore),
            ("max-age=60, NO-STORE", NotStored::NoStore),
            ("public, no-store, max-age=60", NotStored::NoStore),
            ("private", NotStored::Private),
            ("Private, max-age=60", NotStored::Private),
            (
                "private=\"set-cookie, x-user\", max-age=60",
                NotStored::Private,
            ),
            ("public, private, s-maxage=60", NotStored::Private),
        ];
        for &(cc, why) in cases {
            assert_eq!(store(&[("Cache-Control", cc)]), Storable::No(why), "{cc}");
        }
        // Split across fields just the same.
        let split = [FRESH, ("cache-control", "private")];
        assert_eq!(store(&split), Storable::No(NotStored::Private));
        // Only as a directive: inside another's quoted field names, it is not one.
        assert_eq!(
            ttl(&[(
                "Cache-Control",
                "no-cache=\"no-store, private\", max-age=60"
            )]),
            0
        );
    }

    #[test]
    fn set_cookie_only_with_public() {
        assert_eq!(
            store(&[FRESH, ("Set-Cookie", "id=1")]),
            Storable::No(NotStored::SetCookie)
        );
        assert_eq!(
            store(&[FRESH, ("set-cookie", "")]),
            Storable::No(NotStored::SetCookie)
        );
        assert_eq!(
            ttl(&[
                ("Cache-Control", "public, max-age=60"),
                ("Set-Cookie", "id=1")
            ]),
            60
        );
        assert_eq!(ttl(&[FRESH, ("Set-Cookie2", "id=1")]), 60);
    }

    #[test]
    fn authorization_needs_public_s_maxage_or_must_revalidate() {
        let auth = [("Authorization", "Bearer x")];
        let cases: &[(&str, bool)] = &[
            ("max-age=60", false),
            ("max-age=60, proxy-revalidate", false),
            ("s-maxage=abc, max-age=60", false),
            ("public, max-age=60", true),
            ("s-maxage=60", true),
            ("max-age=60, must-revalidate", true),
        ];
        for &(cc, stored) in cases {
            let got = decide_full(Method::Get, 200, &[("Cache-Control", cc)], &auth, &[]);
            if stored {
                assert_eq!(yes(got).ttl, 60, "{cc}");
            } else {
                assert_eq!(got, Storable::No(NotStored::Authorization), "{cc}");
            }
        }
        let lower = [("authorization", "")];
        assert_eq!(
            decide_full(Method::Get, 200, &[FRESH], &lower, &[]),
            Storable::No(NotStored::Authorization)
        );
        // Authorization in the response is no request's.
        assert_eq!(ttl(&[FRESH, ("Authorization", "x")]), 60);
    }

    #[test]
    fn vary_star_too_many_and_names() {
        assert_eq!(
            store(&[FRESH, ("Vary", "accept, *")]),
            Storable::No(NotStored::VaryStar)
        );
        let five = [FRESH, ("Vary", "a, b, c"), ("Vary", "d, e")];
        assert_eq!(store(&five), Storable::No(NotStored::TooManyVary));
        let f = yes(store(&[
            FRESH,
            ("Vary", "Accept-Encoding, Accept"),
            ("vary", "accept-encoding"),
        ]));
        let names: Vec<&[u8]> = f.vary.iter().map(|n| &n[..]).collect();
        assert_eq!(names, [&b"accept"[..], b"accept-encoding"]);
        assert!(yes(store(&[FRESH])).vary.is_empty());
    }

    #[test]
    fn lifetime_s_maxage_then_max_age_then_expires() {
        let soon = date(NOW + 300);
        let cases: &[(&[(&str, &str)], u64)] = &[
            (
                &[
                    ("Cache-Control", "max-age=60, s-maxage=10"),
                    ("Expires", &soon),
                ],
                10,
            ),
            (&[("Cache-Control", "max-age=60"), ("Expires", &soon)], 60),
            (&[("Cache-Control", "max-age=60"), ("Expires", "0")], 60),
            (&[("Expires", &soon)], 300),
            (&[("Cache-Control", "max-age=abc"), ("Expires", &soon)], 300),
            (&[("Cache-Control", "s-maxage=abc, max-age=20")], 20),
            (&[("Cache-Control", "max-age=0")], 0),
            (
                &[("Cache-Control", "max-age=99999999999999999999")],
                DELTA_SECONDS_MAX,
            ),
        ];
        for &(response, want) in cases {
            assert_eq!(ttl(response), want, "{response:?}");
        }
    }

    #[test]
    fn expires_against_date_or_now_invalid_is_expired() {
        let (now, soon, later, past) =
            (date(NOW), date(NOW + 300), date(NOW + 400), date(NOW - 100));
        let cases: &[(&[(&str, &str)], u64)] = &[
            // Expires − Date: an origin clock 100 s ahead still gives 300 s.
            (&[("Date", &later), ("Expires", &date(NOW + 700))], 300),
            (&[("Date", &now), ("Expires", &soon)], 300),
            // No Date, or an invalid one: Expires − now.
            (&[("Expires", &soon)], 300),
            (&[("Date", "garbage"), ("Expires", &soon)], 300),
            // In the past, before Date, or invalid ("0" included): expired, stored stale.
            (&[("Expires", &past)], 0),
            (&[("Date", &soon), ("Expires", &now)], 0),
            (&[("Expires", "0")], 0),
            (&[("Expires", "-1")], 0),
            (&[("Expires", "")], 0),
            // The first Expires counts.
            (&[("Expires", &soon), ("Expires", "0")], 300),
            (&[("Expires", "0"), ("Expires", &soon)], 0),
            // Far future saturates.
            (
                &[("Expires", "Fri, 31 Dec 9999 23:59:59 GMT")],
                DELTA_SECONDS_MAX,
            ),
        ];
        for &(response, want) in cases {
            assert_eq!(ttl(response), want, "{response:?}");
        }
        // An expired Expires is explicit freshness: it keeps its status storable.
        assert_eq!(
            yes(decide_full(Method::Get, 404, &[("Expires", "0")], &[], &[])).ttl,
            0
        );
        assert_eq!(
            decide_full(Method::Get, 500, &[("Expires", "0")], &[], &[]),
            Storable::No(NotStored::Status)
        );
    }

    #[test]
    fn age_on_arrival_from_age_field_and_date() {
        let (d50, future) = (date(NOW - 50), date(NOW + 1000));
        // (response beside max-age=100, age on arrival)
        let cases: &[(&[(&str, &str)], u64)] = &[
            (&[], 0),
            (&[("Age", "30")], 30),
            (&[("age", " 30 ")], 30),
            (&[("Age", "10, 20")], 10),
            (&[("Age", "10"), ("Age", "20")], 10),
            (&[("Age", "abc")], 0),
            (&[("Age", "-5")], 0),
            (&[("Age", "99999999999999999999")], DELTA_SECONDS_MAX),
            // Date skew: an origin clock behind makes it older, ahead changes nothing.
            (&[("Date", &d50)], 50),
            (&[("Date", &future)], 0),
            (&[("Date", "garbage")], 0),
            // The larger of the two.
            (&[("Date", &d50), ("Age", "20")], 50),
            (&[("Date", &d50), ("Age", "80")], 80),
        ];
        for &(extra, want) in cases {
            let mut response = vec![("Cache-Control", "max-age=100")];
            response.extend_from_slice(extra);
            let f = yes(store(&response));
            assert_eq!(f.age, want, "{extra:?}");
            assert_eq!(f.ttl, 100u64.saturating_sub(want), "{extra:?}");
        }
    }

    #[test]
    fn age_also_shortens_table_and_expires_freshness() {
        let f = yes(decide_full(
            Method::Get,
            200,
            &[("Age", "20")],
            &[],
            &[(200, 60)],
        ));
        assert_eq!((f.ttl, f.age), (40, 20));
        // Expires − Date already counts the Date; Age on top of it does.
        let response = [
            ("Date", &date(NOW - 50)[..]),
            ("Expires", &date(NOW + 250)[..]),
            ("Age", "100"),
        ];
        let f = yes(store(&response));
        assert_eq!((f.ttl, f.age), (200, 100));
        assert_eq!(ttl(&[FRESH, ("Age", "600")]), 0);
    }

    #[test]
    fn no_cache_is_stored_stale_and_always_revalidated() {
        for cc in [
            "no-cache, max-age=60",
            "No-Cache, s-maxage=60",
            "no-cache=\"set-cookie, foo\", max-age=60",
        ] {
            let f = yes(store(&[("Cache-Control", cc)]));
            assert_eq!((f.ttl, f.must_revalidate), (0, true), "{cc}");
        }
        // Storing still needs freshness to be given: no-cache alone is not.
        assert_eq!(
            store(&[("Cache-Control", "no-cache")]),
            Storable::No(NotStored::NoFreshness)
        );
        let f = yes(decide_full(
            Method::Get,
            200,
            &[("Cache-Control", "no-cache")],
            &[],
            &[(0, 60)],
        ));
        assert_eq!((f.ttl, f.must_revalidate), (0, true));
    }

    #[test]
    fn must_revalidate_from_each_directive() {
        let cases: &[(&str, bool)] = &[
            ("max-age=60", false),
            ("max-age=60, public, stale-while-revalidate=5", false),
            ("max-age=60, must-revalidate", true),
            ("max-age=60, proxy-revalidate", true),
            ("s-maxage=60", true),
            ("max-age=60, no-cache", true),
        ];
        for &(cc, want) in cases {
            assert_eq!(
                yes(store(&[("Cache-Control", cc)])).must_revalidate,
                want,
                "{cc}"
            );
        }
    }

    #[test]
    fn validators_and_stale_windows_as_received() {
        let lm = "Sun, 06 Nov 1994 08:49:37 GMT";
        let response = [
            ("Cache-Control", "max-age=60, stale-while-revalidate=30"),
            ("cache-control", "stale-if-error=600"),
            ("ETag", " W/\"v1\" "),
            ("ETag", "\"v2\""),
            ("Last-Modified", lm),
        ];
        let f = yes(store(&response));
        assert_eq!(f.etag.as_deref(), Some(&b"W/\"v1\""[..]));
        assert_eq!(f.last_modified.as_deref(), Some(lm.as_bytes()));
        assert_eq!(
            (f.stale_while_revalidate, f.stale_if_error),
            (Some(30), Some(600))
        );
        let f = yes(store(&[FRESH, ("ETag", "")]));
        assert_eq!(
            (f.etag, f.last_modified, f.stale_while_revalidate),
            (None, None, None)
        );
    }
}

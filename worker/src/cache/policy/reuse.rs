//! Reusing stored responses (RFC 9111 §4): what a stored entry may answer a
//! request with, given its age and the request's directives.
//!
//! Time is whole seconds. An entry is fresh while fewer than `ttl` seconds have
//! passed since it was stored; after that it is stale, and a window of N seconds
//! (`max-stale=N`, `stale-while-revalidate=N`, `stale-if-error=N`) covers the first
//! N seconds of staleness, so N = 0 covers nothing.

use super::cache_control::RequestDirectives;
use crate::http::request::Method;

/// What a stored entry may answer a request with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// Served as it is: fresh, or stale within the request's `max-stale`.
    Fresh,
    /// Stale, but may be served while it is revalidated in the background.
    StaleWhileRevalidate,
    /// Must be revalidated before use: stale, or the request wants a fresher one
    /// (`no-cache`, `max-age=0`, `min-fresh`). A request with `only-if-cached`
    /// gets 504 instead (RFC 9111 §5.2.1.7; the caller's to send).
    Revalidate,
}

/// A stored entry, as reuse needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// When it was stored (unix seconds).
    pub stored_at: u64,
    /// [`super::Freshness::ttl`].
    pub ttl: u64,
    /// Its age when stored, [`super::Freshness::age`].
    pub initial_age: u64,
    /// [`super::Freshness::must_revalidate`].
    pub must_revalidate: bool,
    /// Seconds a stale entry may be served while revalidating: the larger of the
    /// response's `stale-while-revalidate` and the route's.
    pub stale_while_revalidate: u64,
}

impl Entry {
    /// The `Age` to send with it (RFC 9111 §5.1, §4.2.3 current_age): its age when
    /// stored plus the seconds since.
    pub fn age(&self, now: u64) -> u64 {
        self.initial_age.saturating_add(self.resident(now))
    }

    /// Seconds since it was stored (0 if the clock went back).
    fn resident(&self, now: u64) -> u64 {
        now.saturating_sub(self.stored_at)
    }
}

/// What `entry` may answer `request` with at `now`:
///
/// - the request's `no-cache`, or an age (with the age on arrival) above its
///   `max-age`: [`Use::Revalidate`];
/// - fresh: [`Use::Fresh`], unless it stays fresh for fewer than the request's
///   `min-fresh` seconds ([`Use::Revalidate`]);
/// - stale: [`Use::Revalidate`] with `min-fresh` or `must_revalidate`; else
///   [`Use::Fresh`] within the request's `max-stale`; else
///   [`Use::StaleWhileRevalidate`] within the entry's `stale_while_revalidate`;
///   else [`Use::Revalidate`].
pub fn usable(entry: &Entry, request: &RequestDirectives, now: u64) -> Use {
    if request.no_cache || request.max_age.is_some_and(|max| entry.age(now) > max) {
        return Use::Revalidate;
    }
    let resident = entry.resident(now);
    if resident < entry.ttl {
        let fresh_for = entry.ttl - resident;
        return match request.min_fresh {
            Some(min) if fresh_for < min => Use::Revalidate,
            _ => Use::Fresh,
        };
    }
    if request.min_fresh.is_some() || entry.must_revalidate {
        return Use::Revalidate;
    }
    let stale_for = resident - entry.ttl;
    match request.max_stale {
        Some(None) => return Use::Fresh,
        Some(Some(max)) if stale_for < max => return Use::Fresh,
        _ => {}
    }
    if stale_for < entry.stale_while_revalidate {
        Use::StaleWhileRevalidate
    } else {
        Use::Revalidate
    }
}

/// Whether `entry` may stand in for an upstream error (a 5xx or no answer) while
/// revalidating it at `now`, with `stale_if_error` seconds (RFC 5861 §4): a fresh
/// entry always may; a stale one within `stale_if_error` seconds of staleness, never
/// with `must_revalidate` (RFC 9111 §4.2.4).
pub fn stale_if_error_allows(entry: &Entry, stale_if_error: u64, now: u64) -> bool {
    let resident = entry.resident(now);
    if resident < entry.ttl {
        return true;
    }
    !entry.must_revalidate && resident - entry.ttl < stale_if_error
}

/// Whether a client request bypasses the cache entirely (neither looked up nor
/// stored): a method other than GET and HEAD, or `Cache-Control: no-store`. A
/// `Range` request does not: it is answered from a whole stored response.
pub fn bypass(method: Method, request: &RequestDirectives) -> bool {
    method == Method::Other || request.no_store
}

#[cfg(test)]
mod tests {
    use super::*;

    const STORED: u64 = 1_000_000;

    fn entry(ttl: u64) -> Entry {
        Entry {
            stored_at: STORED,
            ttl,
            initial_age: 0,
            must_revalidate: false,
            stale_while_revalidate: 0,
        }
    }

    fn plain() -> RequestDirectives {
        RequestDirectives::default()
    }

    #[test]
    fn fresh_before_ttl_then_revalidate() {
        let e = entry(60);
        let cases = [
            (0, Use::Fresh),
            (59, Use::Fresh),
            (60, Use::Revalidate),
            (1000, Use::Revalidate),
        ];
        for (after, want) in cases {
            assert_eq!(usable(&e, &plain(), STORED + after), want, "{after}");
        }
        // Stored stale (no-cache, an expired Expires): never fresh.
        assert_eq!(usable(&entry(0), &plain(), STORED), Use::Revalidate);
        // A clock gone back leaves it fresh, not wrapped around.
        assert_eq!(usable(&e, &plain(), STORED - 10), Use::Fresh);
    }

    #[test]
    fn request_no_cache_always_revalidates() {
        let no_cache = RequestDirectives {
            no_cache: true,
            ..plain()
        };
        let generous = Entry {
            stale_while_revalidate: 100,
            ..entry(60)
        };
        assert_eq!(usable(&generous, &no_cache, STORED), Use::Revalidate);
        let any_stale = RequestDirectives {
            max_stale: Some(None),
            ..no_cache
        };
        assert_eq!(usable(&generous, &any_stale, STORED + 70), Use::Revalidate);
    }

    #[test]
    fn request_max_age_bounds_the_age_with_age_on_arrival() {
        let e = Entry {
            initial_age: 30,
            ..entry(600)
        };
        let cases = [
            (0, 0, Use::Revalidate),
            (30, 0, Use::Fresh),
            (30, 1, Use::Revalidate),
            (40, 10, Use::Fresh),
            (40, 11, Use::Revalidate),
        ];
        for (max_age, after, want) in cases {
            let request = RequestDirectives {
                max_age: Some(max_age),
                ..plain()
            };
            assert_eq!(
                usable(&e, &request, STORED + after),
                want,
                "max-age={max_age} +{after}"
            );
        }
        // max-age=0 beats stale-while-revalidate (a browser's reload).
        let swr = Entry {
            stale_while_revalidate: 100,
            ..entry(10)
        };
        let reload = RequestDirectives {
            max_age: Some(0),
            ..plain()
        };
        assert_eq!(usable(&swr, &reload, STORED + 15), Use::Revalidate);
        // A max-age the entry is within leaves the stale rules to decide.
        let lenient = RequestDirectives {
            max_age: Some(3600),
            ..plain()
        };
        assert_eq!(
            usable(&swr, &lenient, STORED + 15),
            Use::StaleWhileRevalidate
        );
    }

    #[test]
    fn request_min_fresh_needs_that_much_freshness_left() {
        let e = entry(60);
        let cases = [
            (10, 0, Use::Fresh),
            (10, 50, Use::Fresh),
            (10, 51, Use::Revalidate),
            (61, 0, Use::Revalidate),
        ];
        for (min, after, want) in cases {
            let request = RequestDirectives {
                min_fresh: Some(min),
                ..plain()
            };
            assert_eq!(
                usable(&e, &request, STORED + after),
                want,
                "min-fresh={min} +{after}"
            );
        }
        // Stale never has freshness left, whatever else allows staleness.
        let request = RequestDirectives {
            min_fresh: Some(0),
            max_stale: Some(None),
            ..plain()
        };
        let swr = Entry {
            stale_while_revalidate: 100,
            ..e
        };
        assert_eq!(usable(&swr, &request, STORED + 60), Use::Revalidate);
    }

    #[test]
    fn request_max_stale_serves_stale_as_is() {
        let e = entry(60);
        let cases = [
            (None, 100_000, Use::Fresh),
            (Some(10), 60, Use::Fresh),
            (Some(10), 69, Use::Fresh),
            (Some(10), 70, Use::Revalidate),
            (Some(0), 60, Use::Revalidate),
        ];
        for (max_stale, after, want) in cases {
            let request = RequestDirectives {
                max_stale: Some(max_stale),
                ..plain()
            };
            assert_eq!(
                usable(&e, &request, STORED + after),
                want,
                "{max_stale:?} +{after}"
            );
        }
        // Not past must-revalidate.
        let strict = Entry {
            must_revalidate: true,
            ..e
        };
        let any = RequestDirectives {
            max_stale: Some(None),
            ..plain()
        };
        assert_eq!(usable(&strict, &any, STORED + 61), Use::Revalidate);
    }

    #[test]
    fn stale_while_revalidate_window() {
        let e = Entry {
            stale_while_revalidate: 30,
            ..entry(60)
        };
        let cases = [
            (59, Use::Fresh),
            (60, Use::StaleWhileRevalidate),
            (89, Use::StaleWhileRevalidate),
            (90, Use::Revalidate),
        ];
        for (after, want) in cases {
            assert_eq!(usable(&e, &plain(), STORED + after), want, "+{after}");
        }
        // Not with must_revalidate.
        let strict = Entry {
            must_revalidate: true,
            ..e
        };
        assert_eq!(usable(&strict, &plain(), STORED + 60), Use::Revalidate);
        // Within the request's max-stale, as is; past it, the window still applies.
        let short = RequestDirectives {
            max_stale: Some(Some(5)),
            ..plain()
        };
        assert_eq!(usable(&e, &short, STORED + 62), Use::Fresh);
        assert_eq!(usable(&e, &short, STORED + 70), Use::StaleWhileRevalidate);
    }

    #[test]
    fn stale_if_error_window() {
        let e = entry(60);
        let cases = [
            (0, 0, true),
            (59, 0, true),
            (60, 0, false),
            (60, 10, true),
            (69, 10, true),
            (70, 10, false),
        ];
        for (after, sie, want) in cases {
            assert_eq!(
                stale_if_error_allows(&e, sie, STORED + after),
                want,
                "+{after} sie={sie}"
            );
        }
        let strict = Entry {
            must_revalidate: true,
            ..e
        };
        assert!(stale_if_error_allows(&strict, 600, STORED + 59));
        assert!(!stale_if_error_allows(&strict, 600, STORED + 60));
        assert!(!stale_if_error_allows(
            &Entry { ttl: 0, ..strict },
            u64::MAX,
            STORED
        ));
    }

    #[test]
    fn age_adds_the_age_on_arrival() {
        let e = Entry {
            initial_age: 25,
            ..entry(60)
        };
        assert_eq!(e.age(STORED), 25);
        assert_eq!(e.age(STORED + 100), 125);
        assert_eq!(e.age(STORED - 5), 25);
        assert_eq!(
            Entry {
                initial_age: u64::MAX,
                ..e
            }
            .age(STORED + 1),
            u64::MAX
        );
    }

    #[test]
    fn bypass_other_methods_and_no_store() {
        assert!(!bypass(Method::Get, &plain()));
        assert!(!bypass(Method::Head, &plain()));
        assert!(bypass(Method::Other, &plain()));
        assert!(bypass(
            Method::Get,
            &RequestDirectives {
                no_store: true,
                ..plain()
            }
        ));
        let revalidating = RequestDirectives {
            no_cache: true,
            max_age: Some(0),
            ..plain()
        };
        assert!(!bypass(Method::Get, &revalidating));
    }
}

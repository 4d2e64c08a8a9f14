//! What RFC 9111 lets a shared cache do, sans-io: no clock, no storage, only field
//! values and unix seconds in, decisions out.
//!
//! ```text
//! response head ─ storable ─▶ Storable::Yes(Freshness) ─ stored with vary_key ─▶ Entry
//! request ─ request_directives ─▶ bypass? ─ lookup(vary_key) ─▶ usable(Entry) ─▶ Use
//!                                                    not_modified ─▶ 304 from the entry
//! ```
//!
//! - `fields`: list, delta-seconds and HTTP-date syntax.
//! - `cache_control`: Cache-Control directives of responses and requests.
//! - `store`: whether a response is stored, and its freshness (§3, §4.2).
//! - `reuse`: what a stored entry may answer (§4), its `Age`, bypassing.
//! - `vary`: Vary names and the secondary key (§4.1).
//! - `conditional`: a client's If-None-Match / If-Modified-Since against an entry.

mod cache_control;
mod conditional;
mod fields;
mod reuse;
mod store;
mod vary;

pub use cache_control::{
    request_directives, response_directives, RequestDirectives, ResponseDirectives,
};
pub use conditional::not_modified;
pub use fields::DELTA_SECONDS_MAX;
pub use reuse::{bypass, stale_if_error_allows, usable, Entry, Use};
pub use store::{storable, Freshness, NotStored, Storable, StoreInput, STORABLE_STATUSES};
pub use vary::{vary_key, MAX_VARY_FIELDS};

/// Header fields in the order received: (name, value), names compared
/// case-insensitively, a field possibly repeated.
pub type Fields<'a> = &'a [(&'a [u8], &'a [u8])];

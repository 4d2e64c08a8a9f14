//! A response from the cache: the stored status and header fields, forkd's `Date`,
//! the entry's `Age`, its length, the connection's `Connection` field, then the body
//! (copied when the first read of the file brought it, else `sendfile` from the
//! file). A client's conditional request that the entry satisfies gets a 304 with
//! the fields RFC 9110 §15.4.5 keeps.

use super::zones::Zone;
use crate::http::response::{self, Persistence, Status};
use crate::out::OutQueue;
use forkd_shared::cache::entry::Meta;
use forkd_shared::cache::files::Opened;
use forkd_shared::cache::index::counters;
use std::rc::Rc;

/// What a cached answer sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sent {
    pub status: u16,
    pub body_bytes: u64,
}

/// How a cached entry is answered.
pub struct Answer<'a> {
    pub date: &'a [u8],
    pub age: u64,
    pub persistence: Persistence,
    pub head_only: bool,
    /// The client's conditional request holds for the entry: 304.
    pub not_modified: bool,
}

/// Whether the client's conditional request (`request`'s fields) holds for the
/// stored entry `meta`: then it is answered 304.
pub fn not_modified(request: &[(&[u8], &[u8])], meta: &Meta) -> bool {
    let given = |v: &[u8]| !v.is_empty();
    super::policy::not_modified(
        request,
        Some(&meta.etag[..]).filter(|v| given(v)),
        Some(&meta.last_modified[..]).filter(|v| given(v)),
    )
}

/// Fields a 304 keeps of the stored response (RFC 9110 §15.4.5), besides `Date`.
const KEPT_BY_304: [&[u8]; 6] = [
    b"cache-control",
    b"content-location",
    b"etag",
    b"expires",
    b"vary",
    b"last-modified",
];

/// Statuses whose responses have no body and no `Content-Length` (RFC 9110 §8.6).
fn bodiless(status: u16) -> bool {
    status == 204 || status == 304 || (100..200).contains(&status)
}

/// Queues the answer from `entry` of `zone` (its body bytes counted in the zone's
/// `bytes_served`).
pub fn write(out: &mut OutQueue, zone: &Zone, entry: &Rc<Opened>, a: &Answer) -> Sent {
    let sent = queue(out, entry, a);
    zone.index().bump(counters::BYTES_SERVED, sent.body_bytes);
    sent
}

fn queue(out: &mut OutQueue, entry: &Rc<Opened>, a: &Answer) -> Sent {
    let meta = &entry.meta;
    let status = if a.not_modified { 304 } else { meta.status };
    let b = out.bytes();
    response::status_line(b, Status(status));
    b.extend_from_slice(b"\r\nDate: ");
    b.extend_from_slice(a.date);
    b.extend_from_slice(b"\r\nAge: ");
    response::push_decimal(b, a.age);
    b.extend_from_slice(b"\r\n");
    if a.not_modified {
        for line in meta.head.split_inclusive(|&c| c == b'\n') {
            let name = line.split(|&c| c == b':').next().unwrap_or_default();
            if KEPT_BY_304.iter().any(|k| k.eq_ignore_ascii_case(name)) {
                b.extend_from_slice(line);
            }
        }
        response::finish(b, a.persistence);
        return Sent {
            status,
            body_bytes: 0,
        };
    }
    b.extend_from_slice(&meta.head);
    let len = meta.body_len;
    if !bodiless(status) {
        response::content_length(b, len);
    }
    response::finish(b, a.persistence);
    if a.head_only || bodiless(status) || len == 0 {
        return Sent {
            status,
            body_bytes: 0,
        };
    }
    match entry.small_body() {
        Some(body) => b.extend_from_slice(body),
        None => out.push_entry(entry.clone(), entry.body_at, len),
    }
    Sent {
        status,
        body_bytes: len,
    }
}

//! The `Purge` route handler: `PURGE /path` removes the entry of the request's key
//! (and, for a response that varies, its vary record, so no variant stored under it
//! is found again) from the zone, for every worker at once. 200 when there was one,
//! 404 when the key had no entry, 405 for another method. `forkd cache purge` does
//! the same from the command line, and by prefix.

use super::zones::Zone;
use crate::handlers::{Outcome, Reply};
use crate::http::response::{self, Status};
use forkd_shared::cache::index::counters;
use forkd_shared::cache::{files, KeyHash};

pub fn serve(method: &str, zone: Option<&Zone>, key: &[u8], reply: &mut Reply) -> Outcome {
    if method != "PURGE" {
        return reply.error(Status::METHOD_NOT_ALLOWED, &[("Allow", b"PURGE")]);
    }
    let Some(zone) = zone else {
        return reply.error(Status::SERVICE_UNAVAILABLE, &[]);
    };
    let ix = zone.index();
    let hash = KeyHash::of(&[key]);
    let removed = ix
        .find(hash)
        .and_then(|f| ix.remove(f.slot, hash))
        .is_some();
    if removed {
        files::remove(&zone.dir, hash);
        ix.bump(counters::PURGED, 1);
    }
    let (status, body): (Status, &[u8]) = if removed {
        (Status::OK, b"purged\n")
    } else {
        (Status::NOT_FOUND, b"not cached\n")
    };
    let out = reply.out.bytes();
    response::start(out, status, reply.date);
    out.extend_from_slice(b"Content-Type: text/plain\r\nCache-Control: no-store\r\n");
    response::content_length(out, body.len() as u64);
    response::finish(out, reply.persistence);
    let body_bytes = if reply.head_only {
        0
    } else {
        out.extend_from_slice(body);
        body.len() as u64
    };
    Outcome {
        status,
        body_bytes,
        logged: true,
    }
}

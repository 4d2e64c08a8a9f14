//! Liveness and readiness probes: answered from memory, never logged, never touching
//! disk, so a probe measures the process and not the file system.

use super::reply::{Outcome, Reply};
use crate::http::request::Method;
use crate::http::response::{self, Status};

/// Which probe a route answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// 200 while the process runs.
    Liveness,
    /// 200 while accepting work, 503 while draining.
    Readiness,
}

/// GET and HEAD only.
pub fn allows(method: Method) -> bool {
    method != Method::Other
}

pub fn serve(probe: Probe, method: Method, draining: bool, reply: &mut Reply) -> Outcome {
    if !allows(method) {
        let mut outcome = reply.error(Status::METHOD_NOT_ALLOWED, &[("Allow", b"GET, HEAD")]);
        outcome.logged = false;
        return outcome;
    }
    let (status, body): (Status, &[u8]) = match probe {
        Probe::Liveness => (Status::OK, b"alive\n"),
        Probe::Readiness if draining => (Status::SERVICE_UNAVAILABLE, b"draining\n"),
        Probe::Readiness => (Status::OK, b"ready\n"),
    };
    let out = reply.out.bytes();
    response::start(out, status, reply.date);
    out.extend_from_slice(b"Content-Type: text/plain\r\nCache-Control: no-store\r\n");
    response::content_length(out, body.len() as u64);
    response::finish(out, reply.persistence);
    if !reply.head_only {
        out.extend_from_slice(body);
    }
    Outcome {
        status,
        body_bytes: if reply.head_only {
            0
        } else {
            body.len() as u64
        },
        logged: false,
    }
}

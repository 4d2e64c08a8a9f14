//! The `Status` (JSON) and `Metrics` (Prometheus) handlers: the shared-memory stats,
//! read the same way `forkd stats` reads them. A reading that cannot be made
//! consistent in bounded time (a master died mid-fold) is a 503 saying so, never a
//! worker waiting.

use super::reply::{Outcome, Reply};
use crate::http::request::Method;
use crate::http::response::{self, Status};
use forkd_shared::shm::Region;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    Prometheus,
}

pub fn serve(format: Format, method: Method, region: &Region, reply: &mut Reply) -> Outcome {
    serve_with(format, method, region, "", reply)
}

/// [`serve`], with `extra` Prometheus lines after the region's (the cache zones').
pub fn serve_with(
    format: Format,
    method: Method,
    region: &Region,
    extra: &str,
    reply: &mut Reply,
) -> Outcome {
    if method == Method::Other {
        return reply.error(Status::METHOD_NOT_ALLOWED, &[("Allow", b"GET, HEAD")]);
    }
    let (status, body, content_type) = match (region.report(), format) {
        (Ok(report), Format::Json) => (Status::OK, report.to_json(), "application/json"),
        (Ok(report), Format::Prometheus) => (
            Status::OK,
            report.to_prometheus() + extra,
            "text/plain; version=0.0.4; charset=utf-8",
        ),
        (Err(e), Format::Json) => (Status::SERVICE_UNAVAILABLE, e.to_json(), "application/json"),
        (Err(e), Format::Prometheus) => (
            Status::SERVICE_UNAVAILABLE,
            format!("{e}; retry later\n"),
            "text/plain; charset=utf-8",
        ),
    };
    let out = reply.out.bytes();
    response::start(out, status, reply.date);
    response::header(out, "Content-Type", content_type.as_bytes());
    out.extend_from_slice(b"Cache-Control: no-store\r\n");
    if status != Status::OK {
        out.extend_from_slice(b"Retry-After: 1\r\n");
    }
    response::content_length(out, body.len() as u64);
    response::finish(out, reply.persistence);
    let body_bytes = if reply.head_only {
        0
    } else {
        out.extend_from_slice(body.as_bytes());
        body.len() as u64
    };
    Outcome {
        status,
        body_bytes,
        logged: true,
    }
}

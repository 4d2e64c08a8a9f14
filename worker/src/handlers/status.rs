//! The `Status` (JSON) and `Metrics` (Prometheus) handlers: the shared-memory stats,
//! read the same way `forkd stats` reads them.

use super::{Outcome, Reply};
use crate::http::request::Method;
use crate::http::response::{self, Status};
use forkd_shared::shm::{report, Region};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    Prometheus,
}

pub fn serve(format: Format, method: Method, region: &Region, reply: &mut Reply) -> Outcome {
    if method == Method::Other {
        return reply.error(Status::METHOD_NOT_ALLOWED, &[("Allow", b"GET, HEAD")]);
    }
    let report = report::read(region.layout());
    let (body, content_type) = match format {
        Format::Json => (report.to_json(), "application/json"),
        Format::Prometheus => (
            report.to_prometheus(),
            "text/plain; version=0.0.4; charset=utf-8",
        ),
    };
    let out = reply.out.bytes();
    response::start(out, Status::OK, reply.date);
    response::header(out, "Content-Type", content_type.as_bytes());
    out.extend_from_slice(b"Cache-Control: no-store\r\n");
    response::content_length(out, body.len() as u64);
    response::finish(out, reply.persistence);
    let body_bytes = if reply.head_only {
        0
    } else {
        out.extend_from_slice(body.as_bytes());
        body.len() as u64
    };
    Outcome {
        status: Status::OK,
        body_bytes,
        logged: true,
    }
}

//! Request handlers: what a route does with a request once it is parsed and framed.
//!
//! A handler appends one complete response to the connection's output queue and says
//! what it sent ([`Outcome`]). It never blocks and never touches the socket.

pub mod health;
pub mod static_files;
pub mod status;

use crate::http::request::Method;
use crate::http::response::{self, Persistence, Status};
use crate::out::OutQueue;
use forkd_shared::config::Handler;

/// Whether `handler` answers `method` with anything but 405: known from the head
/// alone, so that a request whose body would be wasted is answered before it is sent
/// (instead of `100 Continue`). Each handler module says its own methods.
pub fn allows(handler: &Handler, method: Method) -> bool {
    match handler {
        Handler::Liveness | Handler::Readiness => health::allows(method),
        Handler::Static { .. } => static_files::allows(method),
        // `status::serve` answers GET and HEAD, like the probes.
        Handler::Status | Handler::Metrics => health::allows(method),
        // The upstream decides (interim until the proxy is integrated: h-proxy).
        Handler::Proxy { .. } => true,
    }
}

/// Where a handler writes its response, and how the connection wants it framed.
pub struct Reply<'a> {
    pub out: &'a mut OutQueue,
    /// The cached `Date` value.
    pub date: &'a [u8],
    pub persistence: Persistence,
    /// A HEAD request: headers only.
    pub head_only: bool,
}

/// What a handler sent, for the access log and the stats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub status: Status,
    /// Body bytes (not headers) the response carries.
    pub body_bytes: u64,
    /// Whether this request belongs in the access log (probes do not).
    pub logged: bool,
}

impl Reply<'_> {
    /// A complete error page with `extra` header fields.
    pub fn error(&mut self, status: Status, extra: &[(&str, &[u8])]) -> Outcome {
        let body_bytes = response::error(
            self.out.bytes(),
            status,
            self.date,
            self.persistence,
            extra,
            self.head_only,
        );
        Outcome {
            status,
            body_bytes,
            logged: true,
        }
    }
}

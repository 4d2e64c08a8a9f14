//! What every handler writes to and returns: [`Reply`] (the connection's output
//! queue and how the response is framed) and [`Outcome`] (what was sent).

use crate::http::response::{self, Persistence, Status};
use crate::out::OutQueue;

/// Where a handler writes its response, and how the connection wants it framed.
pub struct Reply<'a> {
    pub out: &'a mut OutQueue,
    /// The cached `Date` value.
    pub date: &'a [u8],
    pub persistence: Persistence,
    /// A HEAD request: headers only.
    pub head_only: bool,
    /// The route's header fields and the server's error pages.
    pub site: response::Site<'a>,
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
    /// A complete error page (the server's `error_pages` one if configured) with
    /// `extra` header fields: the one path every handler's error responses take.
    pub fn error(&mut self, status: Status, extra: &[(&str, &[u8])]) -> Outcome {
        let body_bytes = response::error_with(
            self.out.bytes(),
            status,
            self.date,
            self.persistence,
            extra,
            &self.site,
            self.head_only,
        );
        Outcome {
            status,
            body_bytes,
            logged: true,
        }
    }
}

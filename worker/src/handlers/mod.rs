//! Request handlers: what a route does with a request once it is parsed and framed.
//!
//! A handler appends one complete response to the connection's output queue and says
//! what it sent ([`Outcome`]). It never blocks and never touches the socket.

pub mod health;
pub mod redirect;
pub mod reply;
mod representation;
pub mod ret;
mod root;
pub mod static_files;
pub mod status;

use crate::http::request::Method;
use forkd_shared::config::Handler;

pub use reply::{Outcome, Reply};

/// Whether `handler` answers `method` with anything but 405: known from the head
/// alone, so that a request whose body would be wasted is answered before it is sent
/// (instead of `100 Continue`). Each handler module says its own methods.
pub fn allows(handler: &Handler, method: Method) -> bool {
    match handler {
        Handler::Liveness | Handler::Readiness => health::allows(method),
        Handler::Static { .. } => static_files::allows(method),
        // `status::serve` answers GET and HEAD, like the probes.
        Handler::Status | Handler::Metrics => health::allows(method),
        // Like nginx's `return`: the same answer whatever the method.
        Handler::Redirect { .. } | Handler::Return { .. } => true,
        // The upstream decides.
        Handler::Proxy { .. } => true,
        // `PURGE` is not a method the parser names: the handler checks it.
        Handler::Purge { .. } => method == Method::Other,
    }
}

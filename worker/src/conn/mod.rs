//! One client connection.
//!
//! - `io`: the state machine and the socket (read, write, deadlines, close).
//! - `dispatch`: a parsed request to its server, route and handler, and the response
//!   queued (no socket), or "proxy this".
//! - `proxied`: the client side of a proxied exchange (the session pumped, the
//!   response written to the client, steps acted on).
//!
//! `io` calls `dispatch` and `proxied`; `proxied` calls `dispatch` (error pages, the
//! access log); `dispatch` knows nothing of the other two.

mod dispatch;
mod io;
mod proxied;

pub use io::{Activity, Conn, Verdict};

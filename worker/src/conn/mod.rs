//! One client connection.
//!
//! - `io`: the state machine and the socket (read, write, deadlines, close).
//! - `dispatch`: a parsed request to its server, route and handler, and the response
//!   queued (no socket), or "proxy this".
//! - `proxied`: the client side of a proxied exchange (the session pumped, the
//!   response written to the client, steps acted on).
//! - `proxied_deadlines`: its deadlines (the upstream's, held while it waits on the
//!   client, and the client's).
//! - `tunnel`: an upgraded connection (101): bytes both ways between the client and
//!   the upstream socket.
//!
//! `io` calls `dispatch`, `proxied` and `tunnel`; `proxied` calls `dispatch` (error
//! pages, the access log); `dispatch` knows nothing of the others.

mod dispatch;
mod io;
mod proxied;
mod proxied_deadlines;
mod tunnel;

pub use io::{Activity, Conn, Registration, Verdict};
pub use tunnel::Tunnel;

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
//! - `h2`: an HTTP/2 connection: its framing, and each stream an exchange through
//!   `dispatch` and `proxied` as an HTTP/1.1 request is.
//!
//! `io` calls `dispatch`, `proxied`, `tunnel` and `h2`; `proxied` calls `dispatch` (error
//! pages, the access log); `dispatch` knows nothing of the others.

mod dispatch;
mod h2;
mod io;
mod proxied;
mod proxied_deadlines;
mod tunnel;

pub use h2::{split_key, Session as H2Session};
pub use io::{Activity, Conn, Registration, Verdict};
pub use tunnel::Tunnel;

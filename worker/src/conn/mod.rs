//! One client connection.
//!
//! - `io`: the state machine and the socket (read, write, deadlines, close).
//! - `dispatch`: a parsed request to its server, route and handler, and the response
//!   queued (no socket).
//!
//! `io` calls `dispatch`; `dispatch` knows nothing of `io`.

mod dispatch;
mod io;

pub use io::{Activity, Conn, Verdict};

//! HTTPS: rustls driven sans-io under a connection.
//!
//! - `acceptor`: per listener, the rustls `ServerConfig` of its TLS servers (built
//!   again when the worker adopts a configuration, so a renewed certificate is
//!   served by the running worker; handshakes under way keep the old one's `Arc`),
//!   and the SNI resolver choosing among their certificates.
//! - `stream`: [`Transport`], the socket a connection reads and writes: plain, or
//!   TLS records decrypted on read and encrypted on write through the same
//!   non-blocking socket.
//! - `tickets`: session tickets sealed with keys every worker shares, so a client
//!   resumes on whichever worker it lands on next.

pub mod acceptor;
pub mod stream;
pub mod tickets;

pub use acceptor::Acceptors;
pub use stream::{Tls, Transport};

//! HTTP/2 to clients (RFC 9113): a connection owns the framing, each stream is one
//! exchange answered by the same dispatch, handlers and proxy as HTTP/1.1.
//!
//! - `frame`: frames read and written (RFC 9113 §4, §6), sans-io;
//! - `hpack`, `huffman`: header blocks decoded (the dynamic table, Huffman) and
//!   encoded (no dynamic table);
//! - `bytes_check`: field values checked eight bytes at a time;
//! - `connection`: the connection's protocol state, sans-io: preface, SETTINGS,
//!   flow control both ways, stream states, header blocks, PING, GOAWAY, errors;
//! - `link`: the connection's bytes (plain or TLS), with the frame meters on both
//!   directions;
//! - `meter`: sans-io frame-header reading: the flood rules, what forkd sent;
//! - `session`: the connection and its streams, driven from the event loop;
//! - `stream`: one stream's exchange;
//! - `request` / `response`: an HTTP/2 request as an HTTP/1.1 head, and the
//!   HTTP/1.1 response written for it read back as HEADERS, DATA and trailers;
//!
//! `conn/io.rs` switches a connection here when TLS chose `h2` by ALPN, or when a
//! plain `http2: PriorKnowledge` address reads the preface.

mod bytes_check;
mod connection;
mod frame;
#[cfg(test)]
mod fuzz;
mod hpack;
mod huffman;
mod link;
mod meter;
mod request;
mod response;
mod session;
mod stream;

pub use link::Link;
pub use meter::{Inbound, PREFACE};
pub use session::{Driven, Peer, Session};

/// Bits of a client key above the connection's slot: which of its HTTP/2
/// streams (plus one) an upstream socket belongs to (0: the connection itself).
const STREAM_SHIFT: u32 = 32;

/// The key an upstream socket of stream `slot` of connection `conn` is owned by.
pub fn stream_key(conn: usize, slot: usize) -> usize {
    conn | ((slot + 1) << STREAM_SHIFT)
}

/// A client key split into the connection's slot and the stream's, if any.
pub fn split_key(key: usize) -> (usize, Option<usize>) {
    let conn = key & ((1 << STREAM_SHIFT) - 1);
    match key >> STREAM_SHIFT {
        0 => (conn, None),
        s => (conn, Some(s - 1)),
    }
}

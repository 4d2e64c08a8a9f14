//! HTTP/1.x, sans-io: every function here works on byte slices and is unit-tested
//! without sockets. The connection code in `conn` feeds it bytes and sends what it
//! produces.
//!
//! - `request`: request head parsing and the framing rules (RFC 9112), errors mapped
//!   to status codes in exactly one place.
//! - `chunked`: the chunked transfer-coding decoder (bodies are read and discarded).
//! - `path`: percent-decoding and normalising a request path so it cannot escape a root.
//! - `head_scan`: where a head in pieces may end (parse it then, not on every read).
//! - `range`: a single byte `Range` header.
//! - `response`: writing status lines, headers and error pages.

pub mod accept_encoding;
pub mod chunked;
pub mod fields;
pub mod head_scan;
pub mod path;
pub mod range;
pub mod request;
pub mod response;

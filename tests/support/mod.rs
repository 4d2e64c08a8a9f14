//! The end-to-end harness, shared by every file in `tests/`: run the real `forkd`
//! binary on a config written into a temp folder, on a reserved loopback port; wait for
//! it to serve; talk raw HTTP to it, alone or under load; stop it and check its error
//! log when done.
//!
//! | module | owns |
//! |---|---|
//! | `daemon` | `Builder` (config + site), `TestDaemon` (start, wait, signal, reload, upgrade steps, cleanup), `TempDir`, `write_site` |
//! | `dates` | dates computed apart from the server's code: `http_date` (IMF-fixdate), `log_time`, `now_secs` |
//! | `gate` | `Gate`: an upstream that holds every request until the test opens it, counting arrivals |
//! | `gunicorn` | `Gunicorn`: a real application server (gunicorn, two sync workers, `wsgi_app.py`) in a shared venv |
//! | `h2client` | `H2Client`: a blocking h2c client, one request at a time, answers whole with trailers |
//! | `h2load` | `H2Load`: HTTP/2 (h2c) load, streams in flight on each connection, GOAWAY followed by a new connection |
//! | `h2py` | Python's HTTP/2 stack (`h2`, `hyperframe`, `hpack`, `httpx`, pinned) in a shared venv, and the runner of `tests/h2/`'s conformance checks |
//! | `http` | the raw HTTP/1.1 client: `Response`, `read_response`, the fallible `Conn` |
//! | `load` | the load client (`Load`, per-kind counts and failure reasons) and the site it asks for |
//! | `port` | `PortReservation`: ports held until the daemon is gone |
//! | `process` | /proc (children, state, descriptors, sockets), signals, `forkd` as a CLI |
//! | `serial` | `SerialUpstream`: an application server that serves one connection at a time (gunicorn's sync worker), to see what a slow client costs it |
//! | `scripted` | `ScriptedUpstream`: raw bytes per connection, a script of reads and writes (a misbehaving upstream) |
//! | `stats` | `forkd stats --json`, parsed; `total` (a counter of the totals) |
//! | `upstream` | `TestUpstream` (and `upstream(respond)`, with default settings): a threaded HTTP/1.1 upstream with faults on demand |
//! | `venv` | Python venvs with pinned PyPI packages, made once per machine under a lock |
//! | `wait` | polling with a deadline |
#![allow(dead_code, unused_imports)]

pub mod daemon;
pub mod dates;
pub mod gate;
pub mod gunicorn;
pub mod h2client;
pub mod h2load;
pub mod h2py;
pub mod http;
pub mod load;
pub mod port;
pub mod process;
pub mod scripted;
pub mod serial;
pub mod stats;
pub mod upstream;
pub mod venv;
pub mod wait;

pub use daemon::*;
pub use dates::*;
pub use http::*;
pub use load::*;
pub use port::*;
pub use process::*;
pub use stats::*;
pub use wait::*;

/// `len` bytes of deterministic noise (xorshift, one stream per `seed`), so a misplaced
/// or repeated chunk of a body is noticed.
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15 ^ seed.wrapping_mul(0xD6E8_FEB8_6659_FD93);
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

//! The shared proxy cache; `policy`: what RFC 9111 says may be stored, for how long,
//! and what a request may be answered with.

pub mod policy;

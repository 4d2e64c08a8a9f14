//! OS calls that no safe crate wraps. Everything `unsafe` in this crate is here.

pub mod epoll;
pub mod socket;

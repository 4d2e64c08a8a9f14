//! Socket options nix does not wrap.

use std::io;
use std::os::fd::RawFd;

/// `TCP_DEFER_ACCEPT`: the kernel hands a connection to `accept` only once its first
/// data has arrived (or after about `seconds`), so the worker can read the request at
/// once instead of registering the connection and waiting for it.
pub fn set_defer_accept(fd: RawFd, seconds: i32) -> io::Result<()> {
    // SAFETY: `seconds` is a live c_int for the duration of the call and its size is
    // passed alongside; a bad descriptor is reported through the return value.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            (&seconds as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if rc == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

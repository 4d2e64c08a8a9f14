//! systemd's notification protocol (`sd_notify`), without libsystemd: one datagram per
//! state change to the socket named by `NOTIFY_SOCKET`. Without it this does nothing.
//!
//! READY=1 once workers serve; RELOADING=1 with MONOTONIC_USEC, then READY=1 (and
//! STATUS= with the error for a failed reload); STOPPING=1 on stop; MAINPID= from the
//! new master after a binary upgrade.

use std::os::unix::net::UnixDatagram;

/// Sends `message` (newline-separated `KEY=value` lines) if systemd listens.
pub fn notify(message: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let Ok(socket) = UnixDatagram::unbound() else {
        return;
    };
    let bytes = path.as_encoded_bytes();
    let result = if let Some(name) = bytes.strip_prefix(b"@") {
        // An abstract socket name.
        use std::os::linux::net::SocketAddrExt;
        std::os::unix::net::SocketAddr::from_abstract_name(name)
            .and_then(|addr| socket.send_to_addr(message.as_bytes(), &addr))
    } else {
        socket.send_to(message.as_bytes(), &path)
    };
    if let Err(e) = result {
        forkd_shared::warn!("sd_notify({}) failed: {e}", message.replace('\n', " "));
    }
}

/// `RELOADING=1` with the monotonic timestamp systemd requires alongside it.
pub fn reloading() {
    let usec = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |t| {
        t.tv_sec() as u64 * 1_000_000 + t.tv_nsec() as u64 / 1000
    });
    notify(&format!("RELOADING=1\nMONOTONIC_USEC={usec}"));
}

//! The harness's own promises, which every other test file relies on: a reserved port
//! is never handed to anyone else while forkd can still bind it, in both accept modes,
//! also when a reload moves the listener to another reserved port.

mod support;
use nix::sys::socket::{bind, socket, AddressFamily, SockFlag, SockType, SockaddrIn};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::Duration;
use support::*;

#[test]
fn a_reserved_port_is_not_handed_out_by_bind_or_connect() {
    let reserved: Vec<PortReservation> = (0..64).map(|_| PortReservation::new()).collect();
    let ports: Vec<u16> = reserved.iter().map(|r| r.port()).collect();
    // A socket without SO_REUSEADDR cannot bind it (std's `TcpListener` sets the
    // option, so that one could, if it asked for the port by number).
    let plain = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    let at = SockaddrIn::new(127, 0, 0, 1, ports[0]);
    assert_eq!(
        bind(plain.as_raw_fd(), &at),
        Err(nix::errno::Errno::EADDRINUSE),
        "a plain bind got the reserved port {}",
        ports[0]
    );
    // The ephemeral allocator skips it, for bind(0) and for connect() alike.
    let bound: Vec<TcpListener> = (0..2000)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let taken: Vec<u16> = bound
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .filter(|p| ports.contains(p))
        .collect();
    assert!(
        taken.is_empty(),
        "bind(0) handed out reserved ports {taken:?}"
    );
    drop(bound);
    let server = TcpListener::bind("127.0.0.1:0").unwrap();
    // Each connection accepted at once (the accept queue stays short) and kept open
    // (its port stays in use).
    let pairs: Vec<(TcpStream, TcpStream)> = (0..500)
        .map(|_| {
            let c = TcpStream::connect(server.local_addr().unwrap()).unwrap();
            (c, server.accept().unwrap().0)
        })
        .collect();
    let taken: Vec<u16> = pairs
        .iter()
        .map(|(c, _)| c.local_addr().unwrap().port())
        .filter(|p| ports.contains(p))
        .collect();
    assert!(taken.is_empty(), "connect() used reserved ports {taken:?}");
}

/// forkd in `accept` mode serves on its reserved port, and after a reload that changes
/// `listen` to another reserved port, on that one only.
fn a_reload_moves_the_listener_to_another_reserved_port(accept: &'static str) {
    let mut d = TestDaemon::builder().workers(2).accept(accept).start();
    assert_eq!(d.get("/healthz").status, 200, "{accept}: on the first port");
    let old = d.port;
    let new = d.reserve_port();
    write_config(&d.config, &d.builder.config_text(new));
    let (code, out, err) = d.ctl(&["-s", "reload"]);
    assert_eq!(
        code,
        0,
        "{accept}: reload to port {new}: {out}{err}\n{}",
        d.error_log()
    );
    d.port = new;
    assert_eq!(
        d.get("/healthz").status,
        200,
        "{accept}: on the new port {new}"
    );
    assert!(
        wait_until(Duration::from_secs(10), || TcpStream::connect((
            "127.0.0.1",
            old
        ))
        .is_err()),
        "{accept}: the old port {old} still accepts connections after the reload"
    );
    assert!(
        listening_sockets(old).is_empty(),
        "{accept}: sockets still listen on the old port {old}: {:?}",
        listening_sockets(old)
    );
}

#[test]
fn a_reload_moves_the_listener_to_another_reserved_port_with_shared_accept() {
    a_reload_moves_the_listener_to_another_reserved_port("Shared");
}

#[test]
fn a_reload_moves_the_listener_to_another_reserved_port_with_reuseport_accept() {
    a_reload_moves_the_listener_to_another_reserved_port("ReusePort");
}

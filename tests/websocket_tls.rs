//! WebSocket over TLS (`wss://`, issue #12 with #14): a tungstenite client over a
//! rustls client stream talks through forkd's TLS server to a plain WebSocket echo
//! upstream. The tunnel's client side decrypts and encrypts: messages both ways, a
//! 1 MiB message, and a tunnel closed for idleness ends with a `close_notify` (a
//! clean end of the TLS stream, not a truncation).

mod support;
// Only some of the TLS helpers are used here.
#[allow(dead_code)]
#[path = "support/tls.rs"]
mod tls_support;
#[path = "support/ws_echo.rs"]
mod ws_echo;

use rustls::pki_types::ServerName;
use rustls::{ClientConnection, StreamOwned};
use std::net::TcpStream;
use std::time::Duration;
use support::*;
use tls_support::*;
use tungstenite::error::ProtocolError;
use tungstenite::{Message, WebSocket};
use ws_echo::{End, WsEcho};

type Wss = WebSocket<StreamOwned<ClientConnection, TcpStream>>;

/// A daemon with a plain probe server on its port and a TLS server `a.test` on
/// `tls_port` proxying `/ws` to `upstream` with upgrades allowed.
struct Daemon {
    d: TestDaemon,
    tls_port: u16,
    ca: TestCa,
}

fn start(upstream: &str, upstream_keys: &str) -> Daemon {
    let ca = TestCa::new();
    let mut d = TestDaemon::builder().workers(2).prepare();
    let tls_port = d.reserve_port();
    ca.issue(&["a.test"], 90).write(d.dir.path(), "a");
    let text = format!(
        r#"(
    workers: Count(2),
    pid_file: "forkd.pid",
    shm_file: "forkd.shm",
    error_log: File("error.log"),
    log_level: Info,
    upstreams: {{ "app": (servers: ["{upstream}"], {upstream_keys}) }},
    servers: [
        (
            listen: ["127.0.0.1:{plain}"],
            names: ["localhost"],
            routes: [(prefix: "/healthz", handler: Liveness)],
        ),
        (
            listen: ["127.0.0.1:{tls_port}"],
            names: ["a.test"],
            tls: Some((certificates: [(cert: "a.pem", key: "a.key")])),
            routes: [(prefix: "/ws", handler: Proxy(upstream: "app", upgrade: true))],
        ),
    ],
)
"#,
        plain = d.port
    );
    std::fs::write(&d.config, text).unwrap();
    let cmd = d.command();
    let pid = d.spawn(cmd);
    d.wait_serving(pid);
    Daemon { d, tls_port, ca }
}

/// A `wss://a.test/ws` handshake through forkd (TLS, then the WebSocket upgrade).
fn wss_connect(x: &Daemon) -> Wss {
    let tcp = TcpStream::connect(("127.0.0.1", x.tls_port)).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let name = ServerName::try_from("a.test".to_string()).unwrap();
    let conn = ClientConnection::new(x.ca.client(), name).unwrap();
    let stream = StreamOwned::new(conn, tcp);
    match tungstenite::client::client("wss://a.test/ws", stream) {
        Ok((ws, response)) => {
            assert_eq!(response.status(), 101);
            ws
        }
        Err(e) => panic!("wss handshake through forkd failed: {e}"),
    }
}

#[test]
fn a_websocket_over_tls_echoes_messages_both_ways_and_a_large_one() {
    let echo = WsEcho::start();
    let x = start(&echo.addr().to_string(), "");
    let mut ws = wss_connect(&x);
    let head = echo.heads().join("\n").to_ascii_lowercase();
    assert!(
        head.contains("x-forwarded-proto: https"),
        "the upstream is told the client spoke TLS: {head}"
    );

    for i in 0..2000 {
        let text = format!("message {i}");
        ws.send(Message::text(text.clone())).unwrap();
        assert_eq!(ws.read().unwrap().to_text().unwrap(), text);
    }
    // More than a TLS record, a pipe and a socket buffer hold, both ways.
    let big = noise(1 << 20, 7);
    ws.send(Message::binary(big.clone())).unwrap();
    match ws.read().unwrap() {
        Message::Binary(got) => assert!(got[..] == big[..], "the 1 MiB message changed"),
        other => panic!("expected the binary echo, got {other:?}"),
    }
    // Counted just after the echo is sent: wait for the last count.
    assert!(
        wait_until(Duration::from_secs(10), || echo.echoed() >= 2001),
        "{} echoed",
        echo.echoed()
    );
    assert_eq!(
        echo.echoed(),
        2001,
        "every message reached the upstream once"
    );

    ws_echo::close_handshake(ws);
    assert!(
        wait_until(Duration::from_secs(10), || echo.ends() == [End::CloseFrame]),
        "{:?}",
        echo.ends()
    );
    x.d.assert_log_clean();
}

#[test]
fn an_idle_tls_tunnel_ends_with_close_notify() {
    let echo = WsEcho::start();
    let x = start(&echo.addr().to_string(), r#"tunnel_idle_timeout: "1s","#);
    let mut ws = wss_connect(&x);
    ws.send(Message::text("before the pause")).unwrap();
    assert_eq!(ws.read().unwrap().to_text().unwrap(), "before the pause");
    // The TLS stream ends cleanly (close_notify: rustls reads an end of stream, and
    // tungstenite calls it a reset without a closing handshake); a TCP close
    // without it would be an unexpected EOF.
    match ws.read() {
        Err(tungstenite::Error::Protocol(ProtocolError::ResetWithoutClosingHandshake)) => {}
        other => panic!("expected a clean end of the TLS stream, got {other:?}"),
    }
    assert!(x.d.wait_for_log("idle: closing", Duration::from_secs(10)));
    x.d.assert_log_clean();
}

//! WebSocket / Upgrade tunnels through the proxy, end to end: a real WebSocket client
//! (tungstenite, blocking) talks through the real `forkd` to a WebSocket echo upstream
//! (`support/ws_echo.rs`); raw sockets where the exact bytes matter (pipelined bytes,
//! half-close, backpressure, a 101 nobody asked for).

mod support;
#[path = "support/ws_echo.rs"]
mod ws_echo;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use support::*;
use tungstenite::{Message, WebSocket};
use ws_echo::{end_of, End, WsEcho};

/// A daemon with `/ws` proxied to `upstream` (named `app`, `upstream_keys` added) by a
/// route with `route_keys` (e.g. `, upgrade: true`), and `/metrics`.
fn ws_daemon(upstream: &str, route_keys: &str, upstream_keys: &str, top: &str) -> TestDaemon {
    TestDaemon::builder()
        .top(&format!(
            "{top} upstreams: {{ \"app\": (servers: [\"{upstream}\"], {upstream_keys}) }},"
        ))
        .routes(&format!(
            r#"(prefix: "/healthz", handler: Liveness),
            (prefix: "/metrics", handler: Metrics),
            (prefix: "/ws", handler: Proxy(upstream: "app"{route_keys})),"#
        ))
        .start()
}

/// A WebSocket handshake through forkd on `/ws`.
fn ws_connect(d: &TestDaemon) -> WebSocket<TcpStream> {
    let stream = d.connect();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    match tungstenite::client::client("ws://localhost/ws", stream) {
        Ok((ws, response)) => {
            assert_eq!(response.status(), 101);
            ws
        }
        Err(e) => panic!("handshake through forkd failed: {e}"),
    }
}

fn stats(d: &TestDaemon) -> serde_json::Value {
    stats_json(&d.config)
}

/// Tunnels open now, every worker together.
fn tunnels_open(d: &TestDaemon) -> u64 {
    stats(d)["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["tunnels_open"].as_u64().expect("a tunnels_open gauge"))
        .sum()
}

/// Closes the WebSocket with a close frame and reads until the close is answered.
/// A daemon tunnelling to `echo` whose drains last 3 s.
fn draining_daemon(echo: &WsEcho) -> TestDaemon {
    ws_daemon(
        &echo.addr().to_string(),
        ", upgrade: true",
        "",
        "drain_timeout: \"3s\",",
    )
}

/// Sends `text` and reads it back from the echo server through the tunnel.
fn echoes(ws: &mut WebSocket<TcpStream>, text: &str) {
    ws.send(Message::text(text)).unwrap();
    assert_eq!(ws.read().unwrap().to_text().unwrap(), text);
}

#[test]
fn ten_thousand_messages_go_both_ways_and_the_tunnel_is_counted() {
    let echo = WsEcho::start();
    let d = ws_daemon(&echo.addr().to_string(), ", upgrade: true", "", "");
    let mut ws = ws_connect(&d);
    let head = echo.heads()[0].to_ascii_lowercase();
    assert!(head.contains("\r\nupgrade: websocket\r\n"), "{head}");
    assert!(head.contains("\r\nconnection: upgrade\r\n"), "{head}");
    assert!(head.contains("\r\nsec-websocket-key: "), "{head}");
    assert!(
        wait_until(Duration::from_secs(10), || tunnels_open(&d) == 1),
        "the open tunnel is not in the gauge: {}",
        stats(&d)
    );
    assert_eq!(total(&d, "tunnels_opened"), 1);
    // The tunnel holds its upstream connection, open and not idle in a pool.
    assert!(
        wait_until(Duration::from_secs(10), || {
            let s = stats(&d);
            s["upstreams"][0]["connections_open"] == 1 && s["upstreams"][0]["connections_idle"] == 0
        }),
        "{}",
        stats(&d)
    );

    // 100 in flight at a time: both directions busy at once.
    for batch in 0..100 {
        for i in 0..100 {
            let text = format!("message {batch}-{i} {}", "x".repeat(i * 7));
            ws.write(Message::text(text)).unwrap();
        }
        ws.flush().unwrap();
        for i in 0..100 {
            let got = ws.read().unwrap();
            let want = format!("message {batch}-{i} {}", "x".repeat(i * 7));
            assert_eq!(got.to_text().unwrap(), want);
        }
    }
    assert_eq!(echo.echoed(), 10_000);
    let metrics = String::from_utf8(d.get("/metrics").body).unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("forkd_tunnels_open{") && l.ends_with(" 1")),
        "{metrics}"
    );
    ws_echo::close_handshake(ws);
    assert!(
        wait_until(Duration::from_secs(10), || echo.ends() == [End::CloseFrame]),
        "{:?}",
        echo.ends()
    );
    assert!(
        wait_until(Duration::from_secs(10), || tunnels_open(&d) == 0
            && total(&d, "tunnels_closed") == 1
            && stats(&d)["upstreams"][0]["connections_open"] == 0),
        "{}",
        stats(&d)
    );
    let (code, table, _) = d.ctl(&["stats"]);
    assert_eq!(code, 0);
    assert!(
        table.contains("tunnels open 0  opened 1  closed 1"),
        "{table}"
    );
    assert!(
        d.wait_for_access_log("\"GET /ws HTTP/1.1\" 101 ", Duration::from_secs(10)),
        "{}",
        d.access_log()
    );
    d.assert_log_clean();
}

#[test]
fn a_one_mebibyte_message_arrives_whole_both_ways() {
    let echo = WsEcho::start();
    let d = ws_daemon(&echo.addr().to_string(), ", upgrade: true", "", "");
    let mut ws = ws_connect(&d);
    for seed in 0..3 {
        let data = noise(1 << 20, seed);
        ws.send(Message::binary(data.clone())).unwrap();
        match ws.read().unwrap() {
            Message::Binary(got) => assert!(got[..] == data[..], "message {seed} changed"),
            other => panic!("{other:?}"),
        }
    }
    ws_echo::close_handshake(ws);
    d.assert_log_clean();
}

#[test]
fn an_idle_tunnel_is_closed_after_tunnel_idle_timeout() {
    let echo = WsEcho::start();
    let d = ws_daemon(
        &echo.addr().to_string(),
        ", upgrade: true",
        "tunnel_idle_timeout: \"1s\",",
        "",
    );
    let mut ws = ws_connect(&d);
    echoes(&mut ws, "before the pause");
    // Nothing either way now: forkd closes both sides (an EOF each, not a reset).
    let e = ws.read().expect_err("the idle tunnel was closed");
    assert_eq!(end_of(e), End::Eof);
    assert!(
        wait_until(Duration::from_secs(10), || echo.ends() == [End::Eof]),
        "{:?}",
        echo.ends()
    );
    assert!(d.wait_for_log("idle: closing", Duration::from_secs(10)));
    assert!(wait_until(Duration::from_secs(10), || total(
        &d,
        "tunnels_closed"
    ) == 1));
    d.assert_log_clean();
}

#[test]
fn quit_closes_an_open_tunnel_cleanly_after_drain_timeout_and_the_daemon_exits() {
    let echo = WsEcho::start();
    let mut d = draining_daemon(&echo);
    let mut ws = ws_connect(&d);
    echoes(&mut ws, "one");
    let (code, _, err) = d.ctl(&["-s", "quit"]);
    assert_eq!(code, 0, "{err}");
    // The drain has begun and the tunnel still carries messages.
    assert!(
        wait_until(Duration::from_secs(10), || {
            stats(&d)["workers"]
                .as_array()
                .unwrap()
                .iter()
                .any(|w| w["state"] == "draining")
        }),
        "{}",
        stats(&d)
    );
    echoes(&mut ws, "during the drain");
    // Then drain_timeout ends it: an EOF to both sides, and the daemon exits.
    let e = ws
        .read()
        .expect_err("the tunnel was closed at the drain's end");
    assert_eq!(end_of(e), End::Eof);
    let status = d
        .wait_exit(Duration::from_secs(30))
        .expect("the daemon exits after drain_timeout");
    assert!(status.success(), "{status:?}");
    assert!(
        wait_until(Duration::from_secs(10), || echo.ends() == [End::Eof]),
        "{:?}",
        echo.ends()
    );
    assert!(d.error_log().contains("drain_timeout reached"));
    d.assert_log_clean();
}

#[test]
fn a_route_without_upgrade_proxies_the_request_as_plain_http() {
    let echo = WsEcho::start();
    let d = ws_daemon(&echo.addr().to_string(), "", "", "");
    match tungstenite::client::client("ws://localhost/ws", d.connect()) {
        Err(tungstenite::HandshakeError::Failure(tungstenite::Error::Http(response))) => {
            assert_eq!(response.status(), 426, "the application's own answer")
        }
        Ok(_) => panic!("a route without upgrade: true tunnelled"),
        Err(e) => panic!("{e}"),
    }
    let head = echo.heads()[0].to_ascii_lowercase();
    assert!(!head.contains("\r\nupgrade:"), "{head}");
    assert!(!head.contains("connection: upgrade"), "{head}");
    assert_eq!(total(&d, "tunnels_opened"), 0);
    d.assert_log_clean();
}

/// An upstream that answers every request head with `reply` and then closes.
fn fixed_upstream(reply: &'static [u8]) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(mut s) = s else { return };
            let _ = read_head(&mut s);
            let _ = s.write_all(reply);
        }
    });
    addr
}

/// Reads a head (through the empty line) and what came after it in the same reads.
fn read_head(s: &mut TcpStream) -> Option<(String, Vec<u8>)> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(at) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = got[at + 4..].to_vec();
            return Some((String::from_utf8_lossy(&got[..at + 4]).into_owned(), rest));
        }
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return None,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

const UPGRADE: &str = "GET /ws HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\n\
                       Upgrade: example/1\r\n\r\n";

#[test]
fn a_101_nobody_asked_for_is_a_502() {
    let addr = fixed_upstream(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: example/1\r\nConnection: upgrade\r\n\r\n",
    );
    let d = ws_daemon(&addr, ", upgrade: true", "retries: 0,", "");
    // A plain request on an upgrade route: the client asked for nothing.
    let r = d.request("GET /ws HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    assert_eq!(r.status, 502, "{}", r.head);
    // An upgrade request on a route that does not allow it: forkd asked for nothing.
    let plain = ws_daemon(&addr, "", "retries: 0,", "");
    let r = plain.request(UPGRADE);
    assert_eq!(r.status, 502, "{}", r.head);
    assert_eq!(
        total(&d, "tunnels_opened") + total(&plain, "tunnels_opened"),
        0
    );
}

#[test]
fn bytes_after_both_heads_are_relayed_and_a_half_close_is_passed_on() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let upstream = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let (head, mut rest) = read_head(&mut s).unwrap();
        // The 101 and the first tunnel bytes in one write.
        s.write_all(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: example/1\r\nConnection: upgrade\r\n\r\nfrom-upstream;",
        )
        .unwrap();
        // Everything the client sends, until its half-close reaches us.
        s.read_to_end(&mut rest).unwrap();
        // Our direction still works after the client's EOF.
        s.write_all(b"echo:").unwrap();
        s.write_all(&rest).unwrap();
        (head, rest)
    });
    let d = ws_daemon(&addr, ", upgrade: true", "", "");
    let mut c = d.connect();
    // The client's first tunnel bytes go in the same write as its request.
    let mut first = UPGRADE.as_bytes().to_vec();
    first.extend_from_slice(b"pipelined;");
    c.write_all(&first).unwrap();
    let (head, mut got) = read_head(&mut c).unwrap();
    assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
    assert!(head.contains("\r\nUpgrade: example/1\r\n"), "{head}");
    assert!(head.contains("\r\nConnection: upgrade\r\n"), "{head}");
    while !got.ends_with(b"from-upstream;") {
        let mut buf = [0u8; 1024];
        let n = c.read(&mut buf).unwrap();
        assert!(n > 0, "closed after {got:?}");
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(got, b"from-upstream;");
    c.write_all(b"later").unwrap();
    c.shutdown(std::net::Shutdown::Write).unwrap();
    let mut tail = Vec::new();
    if let Err(e) = c.read_to_end(&mut tail) {
        panic!("{e} after {tail:?}\n{}", d.error_log());
    }
    assert_eq!(
        tail, b"echo:pipelined;later",
        "then the upstream's close ends it"
    );
    let (upstream_head, upstream_got) = upstream.join().unwrap();
    assert!(
        upstream_head.contains("\r\nUpgrade: example/1\r\nConnection: upgrade\r\n"),
        "{upstream_head}"
    );
    assert_eq!(upstream_got, b"pipelined;later");
    assert!(wait_until(Duration::from_secs(10), || total(
        &d,
        "tunnels_closed"
    ) == 1));
    d.assert_log_clean();
}

#[test]
fn a_client_that_does_not_read_stops_the_upstream_being_read() {
    const TOTAL: u64 = 96 << 20;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let written = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&written);
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        read_head(&mut s).unwrap();
        s.write_all(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: example/1\r\nConnection: upgrade\r\n\r\n",
        )
        .unwrap();
        let piece = noise(64 * 1024, 3);
        while counter.load(SeqCst) < TOTAL {
            if s.write_all(&piece).is_err() {
                return;
            }
            counter.fetch_add(piece.len() as u64, SeqCst);
        }
    });
    let d = ws_daemon(&addr, ", upgrade: true", "", "");
    let mut c = d.connect();
    c.write_all(UPGRADE.as_bytes()).unwrap();
    let (head, mut received) = read_head(&mut c).unwrap();
    assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
    // The client reads nothing more for now: the upstream's writes stall once the
    // kernel buffers and forkd's bounded pipe are full.
    let mut last = written.load(SeqCst);
    assert!(
        wait_until(Duration::from_secs(60), || {
            std::thread::sleep(Duration::from_millis(500));
            let now = written.load(SeqCst);
            let stalled = now == last && now > 0;
            last = now;
            stalled
        }),
        "the upstream never stalled"
    );
    assert!(
        last < TOTAL / 2,
        "{last} bytes left the upstream for a client that reads nothing"
    );
    // Reading resumes the flow, every byte in order.
    let piece = noise(64 * 1024, 3);
    let mut at = 0usize;
    for &b in &received {
        assert_eq!(b, piece[at % piece.len()], "byte {at}");
        at += 1;
    }
    received.clear();
    let mut buf = vec![0u8; 256 * 1024];
    while (at as u64) < TOTAL {
        let n = c.read(&mut buf).unwrap();
        assert!(n > 0, "closed after {at} bytes");
        for &b in &buf[..n] {
            assert_eq!(b, piece[at % piece.len()], "byte {at}");
            at += 1;
        }
    }
    assert_eq!(at as u64, TOTAL);
    d.assert_log_clean();
}

#[test]
fn a_reload_that_retires_the_worker_closes_its_tunnel_after_drain_timeout() {
    let echo = WsEcho::start();
    let mut d = draining_daemon(&echo);
    let old = d.workers();
    let mut ws = ws_connect(&d);
    echoes(&mut ws, "before");
    // Another worker count: a new generation, and the old worker is retired.
    d.builder.workers = 2;
    let (code, out, err) = d.reload();
    assert_eq!(code, 0, "{out}{err}");
    echoes(&mut ws, "while retiring");
    let e = ws
        .read()
        .expect_err("the retired worker's tunnel was closed");
    assert_eq!(end_of(e), End::Eof);
    assert!(
        d.wait_replaced(&old, 2, Duration::from_secs(30)),
        "the retired worker did not exit"
    );
    // The new generation tunnels as well.
    let mut ws = ws_connect(&d);
    echoes(&mut ws, "after");
    ws_echo::close_handshake(ws);
    d.assert_log_clean();
}

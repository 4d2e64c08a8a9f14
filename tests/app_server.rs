//! forkd in front of a real application server: gunicorn with two sync workers
//! (`support::gunicorn`), the kind of upstream a slow client can starve. These tests
//! prove the harness itself (the app answers what `wsgi_app.py` documents, directly and
//! through forkd); the buffering tests of issue #20 build on it.

mod support;
use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;
use support::gunicorn::{big_body, crc32, Gunicorn};
use support::*;

/// GET `path` straight from gunicorn; everything it sent until it closed.
fn raw_get(g: &Gunicorn, path: &str, extra: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", g.port())).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: app.test\r\n{extra}\r\n").unwrap();
    String::from_utf8_lossy(&read_to_close(&mut s)).into_owned()
}

/// forkd with every path but `/healthz` proxied to `g`.
fn in_front_of(g: &Gunicorn) -> Builder {
    TestDaemon::builder()
        .top(&format!(
            "upstreams: {{ \"app\": (servers: [\"{}\"]) }},",
            g.addr()
        ))
        .routes(
            r#"(prefix: "/healthz", handler: Liveness),
            (prefix: "/", handler: Proxy(upstream: "app")),"#,
        )
}

fn upload_request(body: &[u8]) -> Vec<u8> {
    let mut req = format!(
        "POST /upload HTTP/1.1\r\nHost: app.test\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(body);
    req
}

fn exchange(mut s: TcpStream, request: &[u8]) -> Response {
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(request).unwrap();
    read_response(&mut s, false).expect("a response")
}

#[test]
fn the_app_answers_what_wsgi_app_py_documents() {
    let g = Gunicorn::start();
    assert_eq!(g.workers().len(), 2);
    let direct = || TcpStream::connect(("127.0.0.1", g.port())).unwrap();

    let big = exchange(
        direct(),
        b"GET /big?mb=2 HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(big.status, 200, "{}", big.head);
    assert!(big.body == big_body(2), "/big?mb=2 is not big_body(2)");

    let body = noise(300_000, 7);
    let up = exchange(direct(), &upload_request(&body));
    assert_eq!(up.body_str(), format!("300000 {:08x}\n", crc32(&body)));

    let redirect = raw_get(&g, "/redirect", "");
    assert!(
        redirect.contains(&format!("\r\nLocation: http://{}/tiny\r\n", g.addr())),
        "{redirect}"
    );

    let echo = raw_get(&g, "/echo-headers?a=1", "X-Forwarded-For: 10.1.2.3\r\n");
    assert!(
        echo.contains("\r\n\r\nGET /echo-headers?a=1 HTTP/1.1\r\n"),
        "{echo}"
    );
    assert!(echo.contains("\r\nHost: app.test\r\n"), "{echo}");
    assert!(echo.contains("\r\nX-Forwarded-For: 10.1.2.3\r\n"), "{echo}");

    let sse = raw_get(&g, "/sse?n=3&ms=50", "");
    assert!(
        sse.contains("\r\nContent-Type: text/event-stream\r\n"),
        "{sse}"
    );
    let events: Vec<usize> = (0..3)
        .map(|i| {
            sse.find(&format!("id: {i}\ndata: event {i}\n\n"))
                .unwrap_or_else(|| panic!("event {i} missing: {sse}"))
        })
        .collect();
    assert!(events.windows(2).all(|w| w[0] < w[1]), "{sse}");

    let stream = raw_get(&g, "/stream?n=2&ms=50&accel=no", "");
    assert!(stream.contains("\r\nX-Accel-Buffering: no\r\n"), "{stream}");
    assert!(
        stream.contains("\r\nTransfer-Encoding: chunked\r\n"),
        "{stream}"
    );
    assert!(stream.contains("chunk 1\n"), "{stream}");
    let plain = raw_get(&g, "/stream?n=1&ms=0", "");
    assert!(!plain.contains("X-Accel-Buffering"), "{plain}");
}

#[test]
fn forkd_serves_gunicorn_and_a_1_mb_upload_round_trips() {
    let g = Gunicorn::start();
    let d = in_front_of(&g).server("max_body_bytes: \"4MiB\",").start();

    let tiny = d.get("/tiny");
    assert_eq!(tiny.status, 200, "{}", tiny.head);
    assert_eq!(tiny.body, b"tiny\n");

    let body = noise(1_000_000, 20);
    let up = exchange(d.connect(), &upload_request(&body));
    assert_eq!(up.status, 200, "{}", up.head);
    assert_eq!(up.body_str(), format!("1000000 {:08x}\n", crc32(&body)));

    let big = d.get("/big?mb=3");
    assert_eq!(big.status, 200, "{}", big.head);
    assert!(big.body == big_body(3), "/big?mb=3 through forkd differs");
    d.assert_log_clean();
}

/// Four clients that read a 20 MiB response slowly and four that upload slowly, twice
/// as many as gunicorn has workers: with forkd buffering both ways, a normal client
/// is still answered while they are under way (each holds a worker for its whole
/// transfer without buffering, and the normal client waits for ever).
#[test]
fn slow_readers_and_uploaders_do_not_starve_gunicorns_workers() {
    let g = Gunicorn::start();
    let d = in_front_of(&g)
        .workers(1)
        // The slow clients stall for the whole test: no timeout or minimum rate may
        // let them go first (`min_*_rate` apply to proxied exchanges too).
        .server("max_body_bytes: \"4MiB\", body_timeout: \"120s\", send_timeout: \"120s\", min_body_rate: 0, min_send_rate: 0,")
        .start();
    let mut readers = Vec::new();
    for _ in 0..4 {
        let mut s = d.connect();
        s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        s.write_all(b"GET /big?mb=20 HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n")
            .unwrap();
        readers.push(s);
    }
    let body = noise(500_000, 9);
    let mut uploaders = Vec::new();
    for _ in 0..4 {
        let mut s = d.connect();
        s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        let request = upload_request(&body);
        // Everything but the last 100 KB: the upload is under way.
        s.write_all(&request[..request.len() - 100_000]).unwrap();
        uploaders.push((s, request));
    }
    // The readers' responses were read whole by forkd: gunicorn is free.
    for _ in 0..3 {
        let mut s = d.connect();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        s.write_all(b"GET /tiny HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n")
            .unwrap();
        let r = read_response(&mut s, false).expect("the normal client is answered");
        assert_eq!(
            (r.status, r.body.as_slice()),
            (200, &b"tiny\n"[..]),
            "{}",
            r.head
        );
    }
    for (mut s, request) in uploaders {
        s.write_all(&request[request.len() - 100_000..]).unwrap();
        let r = read_response(&mut s, false).expect("the upload is answered");
        assert_eq!(r.body_str(), format!("500000 {:08x}\n", crc32(&body)));
    }
    let want = big_body(20);
    for mut s in readers {
        let r = read_response(&mut s, false).expect("the slow reader gets its response");
        assert_eq!(r.status, 200, "{}", r.head);
        assert!(r.body == want, "a slow reader's body differs");
    }
    d.assert_log_clean();
}

//! A `Proxy` route shaping its request end to end: `path`, `host`, `set_headers` and
//! `remove_headers` checked byte for byte in the head the test upstream received, a
//! `Location` / `Refresh` naming the upstream rewritten in what the client gets, a
//! route's `read_timeout` outlasting its upstream's, and `-t` locating bad keys.

mod support;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use support::upstream::{upstream, Reply, TestUpstream};
use support::*;

/// A daemon with upstream `app` (the one server `up`, `keys` added) and `routes`.
fn daemon(up: &TestUpstream, keys: &str, routes: &str) -> TestDaemon {
    TestDaemon::builder()
        .top(&format!(
            "upstreams: {{ \"app\": (servers: [\"{}\"], {keys}) }},",
            up.addr()
        ))
        .routes(&format!(
            "(prefix: \"/healthz\", handler: Liveness),\n{routes}"
        ))
        .start()
}

#[test]
fn path_host_set_and_removed_fields_reach_the_upstream_byte_for_byte() {
    let up = upstream(|_| Reply::ok(b"ok"));
    let d = daemon(
        &up,
        "",
        r#"(prefix: "/api/", handler: Proxy(upstream: "app",
               path: Some("/v1/{path}"),
               host: Fixed("app.internal"),
               set_headers: [("X-Real-IP", "{client_ip}"), ("X-Env", "prod"),
                             ("X-Seen", "{scheme}://{host} {request_id}")],
               remove_headers: ["X-Debug"])),
           (prefix: "/plain/", handler: Proxy(upstream: "app", host: Upstream)),"#,
    );
    let r = d.request(
        "GET /api/a%20b/../items/%3F%41?id=%41&x HTTP/1.1\r\nHost: shop.test:8080\r\n\
         X-Debug: 1\r\nX-Env: dev\r\nx-real-ip: 6.6.6.6\r\nX-Request-Id: req-1\r\n\
         Accept: */*\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(
        up.received()[0].head,
        "GET /v1/items/%3F%41?id=%41&x HTTP/1.1\r\nHost: app.internal\r\nAccept: */*\r\n\
         X-Forwarded-For: 127.0.0.1\r\nX-Forwarded-Proto: http\r\n\
         X-Forwarded-Host: shop.test:8080\r\nX-Request-Id: req-1\r\n\
         X-Real-IP: 127.0.0.1\r\nX-Env: prod\r\nX-Seen: http://shop.test req-1"
    );
    // The access log says what the client asked for, not what went upstream.
    assert!(
        d.wait_for_access_log(
            "\"GET /api/a%20b/../items/%3F%41?id=%41&x HTTP/1.1\" 200 2",
            Duration::from_secs(10)
        ),
        "{}",
        d.access_log()
    );
    // `host: Upstream`: the server as written; no `path`: the target as received.
    let port = up.addr().port();
    let r = d.request(
        "GET /plain/x%41?q HTTP/1.1\r\nHost: shop.test\r\nX-Request-Id: req-2\r\n\
         Connection: close\r\n\r\n",
    );
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(
        up.received()[1].head,
        format!(
            "GET /plain/x%41?q HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\
             X-Forwarded-For: 127.0.0.1\r\nX-Forwarded-Proto: http\r\n\
             X-Forwarded-Host: shop.test\r\nX-Request-Id: req-2"
        )
    );
    d.assert_log_clean();
}

#[test]
fn a_redirect_naming_the_upstream_gets_the_clients_host_and_prefix() {
    // The upstream names itself as an application does (its own address, which it
    // knows once it listens).
    let me: Arc<OnceLock<String>> = Arc::default();
    let named = me.clone();
    let up = upstream(move |req| {
        let me = named.get().map_or("", String::as_str);
        let location = match req.path() {
            "/v1/login" => format!("http://{me}/v1/welcome?next=%2Fa"),
            "/v1/relative" => "/v1/next".into(),
            _ => "http://elsewhere.test/v1/x".into(),
        };
        Reply::Full {
            status: 302,
            extra: vec![
                ("Location".into(), location),
                ("Refresh".into(), format!("0; url=http://{me}/v1/done")),
            ],
            body: Vec::new(),
        }
    });
    me.set(up.addr().to_string()).unwrap();
    let d = daemon(
        &up,
        "",
        r#"(prefix: "/api/", handler: Proxy(upstream: "app", path: Some("/v1/{path}"))),"#,
    );
    let get = |path: &str| {
        d.request(&format!(
            "GET {path} HTTP/1.1\r\nHost: shop.test:8080\r\nConnection: close\r\n\r\n"
        ))
    };
    let r = get("/api/login");
    assert_eq!(r.status, 302, "{}", r.head);
    assert!(
        r.head.contains(
            "\r\nLocation: http://shop.test:8080/api/welcome?next=%2Fa\r\n\
             Refresh: 0; url=http://shop.test:8080/api/done\r\n"
        ),
        "{}",
        r.head
    );
    // Relative, or another host: as the upstream sent it.
    let r = get("/api/relative");
    assert!(r.head.contains("\r\nLocation: /v1/next\r\n"), "{}", r.head);
    let r = get("/api/other");
    assert!(
        r.head
            .contains("\r\nLocation: http://elsewhere.test/v1/x\r\n"),
        "{}",
        r.head
    );
    d.assert_log_clean();
}

#[test]
fn a_route_read_timeout_outlasts_its_upstreams() {
    let up = upstream(|_| Reply::ok(b"late").delayed(Duration::from_millis(1500)));
    let d = daemon(
        &up,
        "read_timeout: \"300ms\", retries: 0",
        r#"(prefix: "/poll/", handler: Proxy(upstream: "app", read_timeout: Some("60s"))),
           (prefix: "/api/", handler: Proxy(upstream: "app")),"#,
    );
    let r = d.get("/api/x");
    assert_eq!(r.status, 504, "{}", r.head);
    let r = d.get("/poll/x");
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(r.body, b"late");
}

#[test]
fn t_locates_a_bad_placeholder_and_a_refused_field() {
    let up = upstream(|_| Reply::ok(b""));
    let d = TestDaemon::builder()
        .top(&format!(
            "upstreams: {{ \"app\": (servers: [\"{}\"]) }},",
            up.addr()
        ))
        .routes(
            "(prefix: \"/api/\", handler: Proxy(upstream: \"app\",\n\
             set_headers: [(\"X-A\", \"{remote_addr}\")])),",
        )
        .prepare();
    let (code, out, err) = run_forkd(&d.config, &["-t"]);
    assert_eq!(code, 1, "{out}{err}");
    let line = d
        .builder
        .config_text(d.port)
        .lines()
        .position(|l| l.contains("X-A"))
        .unwrap()
        + 1;
    let at = format!("forkd.ron:{line}:");
    assert!(
        err.contains(&at) && err.contains("unknown placeholder `{remote_addr}`"),
        "{at}: {err}"
    );
}

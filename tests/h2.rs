//! HTTP/2 end to end with the `h2` crate's client (h2c): a stream's request goes
//! through the same routes, handlers, proxy and access log as HTTP/1.1. Static files
//! keep conditional requests, ranges and precompression; proxied requests follow the
//! header rules (`:authority` as Host, cookies joined, `te` not forwarded) and pass
//! response trailers; bodies past the stream window flow both ways. The frame-level
//! conformance and the floods are `tests/h2_conformance.rs`; reloads, upgrades and
//! quit under h2 load are in `tests/reliability.rs` and `tests/upgrade.rs`.

mod support;

use std::time::Duration;
use support::h2client::H2Client;
use support::upstream::{fnv, Reply, Settings, TestUpstream, FNV_START};
use support::*;

fn page() -> Vec<u8> {
    (0..2000u32).map(|i| b'a' + (i % 26) as u8).collect()
}

#[test]
fn static_files_over_h2_keep_conditionals_ranges_and_precompression() {
    let big = noise(200 * 1024, 7);
    let d = TestDaemon::builder()
        .h2c()
        .routes(r#"(prefix: "/", handler: Static(root: "www", precompressed: true)),"#)
        .file("page.txt", &page())
        .file("page.txt.gz", b"pretend-gzip-bytes")
        .file("big.bin", &big)
        .start();
    let mut c = H2Client::connect(d.port);

    let r = c.request("GET", "/page.txt", &[], None).unwrap();
    assert_eq!((r.status, r.body.as_slice()), (200, page().as_slice()));
    let etag = r.header("etag").expect("an ETag").to_string();

    let r = c
        .request("GET", "/page.txt", &[("if-none-match", &etag)], None)
        .unwrap();
    assert_eq!((r.status, r.body.len()), (304, 0), "{:?}", r.headers);

    let r = c
        .request("GET", "/page.txt", &[("range", "bytes=0-9")], None)
        .unwrap();
    assert_eq!(r.status, 206);
    assert_eq!(r.header("content-range"), Some("bytes 0-9/2000"));
    assert_eq!(r.body, &page()[..10]);

    let r = c
        .request("GET", "/page.txt", &[("accept-encoding", "gzip")], None)
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    assert_eq!(r.body, b"pretend-gzip-bytes");

    let r = c.request("HEAD", "/page.txt", &[], None).unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-length"), Some("2000"));
    assert!(r.body.is_empty());

    // Past the 64 KiB stream window: DATA as the client opens it.
    let r = c.request("GET", "/big.bin", &[], None).unwrap();
    assert_eq!(r.status, 200);
    assert!(r.body == big, "{} bytes, not the file's", r.body.len());

    let r = c.request("GET", "/missing", &[], None).unwrap();
    assert_eq!(r.status, 404);

    // The workers flush the access log at least once a second.
    let mut log = String::new();
    let logged = wait_until(Duration::from_secs(30), || {
        log = d.access_log();
        log.contains("\"GET /page.txt HTTP/2.0\" 304 ")
            && log.contains("\"HEAD /page.txt HTTP/2.0\" 200 ")
    });
    assert!(logged, "the streams' lines, as HTTP/2.0:\n{log}");
}

#[test]
fn proxied_h2_streams_follow_the_header_rules_and_pass_trailers() {
    let up = TestUpstream::start(Settings::default(), |req| match req.path() {
        "/app/trailers" => Reply::Chunked {
            body: b"streamed body".to_vec(),
            chunk: 4,
            trailers: vec![("x-checksum".into(), "abc123".into())],
        },
        _ => Reply::Echo,
    });
    let d = TestDaemon::builder()
        .h2c()
        .top(&format!(
            r#"upstreams: {{ "app": (servers: ["{}"]) }},"#,
            up.addr()
        ))
        .routes(r#"(prefix: "/app/", handler: Proxy(upstream: "app")),"#)
        .start();
    let mut c = H2Client::connect(d.port);

    let r = c
        .request(
            "GET",
            "/app/echo?q=1",
            &[
                ("cookie", "a=1"),
                ("cookie", "b=2"),
                ("te", "trailers"),
                ("x-custom", "v"),
            ],
            None,
        )
        .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let got = up.received().pop().expect("the upstream got the request");
    assert_eq!(got.method(), "GET");
    assert_eq!(got.path(), "/app/echo?q=1");
    assert_eq!(
        got.header("host"),
        Some(format!("localhost:{}", d.port).as_str()),
        "{}",
        got.head
    );
    assert_eq!(
        got.headers("cookie").collect::<Vec<_>>(),
        ["a=1; b=2"],
        "{}",
        got.head
    );
    assert_eq!(got.header("x-custom"), Some("v"));
    assert_eq!(got.header("te"), None, "te is hop-by-hop: {}", got.head);
    assert!(
        got.head.starts_with("GET /app/echo?q=1 HTTP/1.1\r\n"),
        "{}",
        got.head
    );

    let r = c
        .request("GET", "/app/trailers", &[("te", "trailers")], None)
        .unwrap();
    assert_eq!((r.status, r.body.as_slice()), (200, &b"streamed body"[..]));
    let trailers = r.trailers.expect("the upstream's trailers");
    assert_eq!(
        trailers.get("x-checksum").and_then(|v| v.to_str().ok()),
        Some("abc123")
    );

    // An upload past the stream window, buffered and sent upstream whole.
    let upload = noise(1 << 20, 9);
    let r = c
        .request(
            "POST",
            "/app/echo",
            &[("content-type", "application/octet-stream")],
            Some(&upload),
        )
        .unwrap();
    assert_eq!(r.status, 200);
    let got = up.received().pop().unwrap();
    assert_eq!(
        (got.body_len, got.body_hash),
        (upload.len() as u64, fnv(FNV_START, &upload)),
        "the upload reached the upstream byte for byte: {}",
        got.head
    );
}

#[test]
fn compress_over_h2_sends_the_same_gzip_body_as_over_http_1_1() {
    let page: Vec<u8> = (0..40_000u32)
        .flat_map(|i| format!("line {i} of a text page\n").into_bytes())
        .take(64 * 1024)
        .collect();
    let d = TestDaemon::builder()
        .h2c()
        .routes(
            r#"(prefix: "/", handler: Static(root: "www", compress: Some((min_size: "1KiB", level: 5)))),"#,
        )
        .file("page.txt", &page)
        .start();
    let h1 = d.request(
        "GET /page.txt HTTP/1.1\r\nHost: localhost\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(h1.header("Content-Encoding"), Some("gzip"));
    assert!(h1.body.len() < page.len() / 2, "{} bytes", h1.body.len());
    let mut c = H2Client::connect(d.port);
    let r = c
        .request("GET", "/page.txt", &[("accept-encoding", "gzip")], None)
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(
        (r.header("content-encoding"), r.header("vary")),
        (Some("gzip"), Some("Accept-Encoding"))
    );
    assert!(
        r.body == h1.body,
        "the h2 body is not the gzip body HTTP/1.1 got"
    );
    let r = c.request("GET", "/page.txt", &[], None).unwrap();
    assert!(r.body == page && r.header("content-encoding").is_none());
}

#[test]
fn cached_proxy_routes_answer_h2_streams_from_the_zone_and_fetch_once_for_concurrent_ones() {
    let cacheable = |body: &[u8]| Reply::Full {
        status: 200,
        extra: vec![("Cache-Control".into(), "max-age=600".into())],
        body: body.to_vec(),
    };
    let up = TestUpstream::start(Settings::default(), move |req| match req.path() {
        "/c/slow" => cacheable(b"slow and shared").delayed(Duration::from_millis(300)),
        _ => cacheable(b"cached over h2"),
    });
    let d = TestDaemon::builder()
        .h2c()
        .top(&format!(
            r#"upstreams: {{ "app": (servers: ["{}"]) }},
            caches: {{ "pages": (path: "cache/pages", max_size: "16MiB", index_entries: 256) }},"#,
            up.addr()
        ))
        .routes(
            r#"(prefix: "/c/", handler: Proxy(upstream: "app", cache: Some((zone: "pages")))),"#,
        )
        .start();
    let mut c = H2Client::connect(d.port);
    let first = c.request("GET", "/c/page", &[], None).unwrap();
    assert_eq!(
        (first.status, first.body.as_slice()),
        (200, &b"cached over h2"[..])
    );
    let second = c.request("GET", "/c/page", &[], None).unwrap();
    assert_eq!(
        (second.status, second.body.as_slice()),
        (200, &b"cached over h2"[..])
    );
    assert!(second.header("age").is_some(), "a hit says its age");
    assert_eq!(
        up.received()
            .iter()
            .filter(|r| r.path() == "/c/page")
            .count(),
        1,
        "the second stream was answered from the zone"
    );

    // Streams for one key at once: one fetch, the others wait for it on the stream.
    let pending: Vec<_> = (0..10).map(|_| c.start("GET", "/c/slow")).collect();
    for p in pending {
        let r = c.finish(p).unwrap();
        assert_eq!(
            (r.status, r.body.as_slice()),
            (200, &b"slow and shared"[..])
        );
    }
    assert_eq!(
        up.received()
            .iter()
            .filter(|r| r.path() == "/c/slow")
            .count(),
        1,
        "concurrent streams for one key make one upstream request"
    );
}

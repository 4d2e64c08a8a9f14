//! HTTP behaviour of the real binary, byte for byte where it matters.
//!
//! Every test starts its own daemon (one worker, a free loopback port) and talks raw
//! HTTP/1.x to it. Expected responses are built from first principles: the file's
//! metadata for the validators, the documented error page layout, RFC 9110/9112 for the
//! semantics. The only thing taken from a response is its `Date`, and that is checked to
//! be the IMF-fixdate of a second the test was running in.

mod support;

use std::io::Write;
use std::net::TcpStream;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant, UNIX_EPOCH};
use support::*;

/// How long anything that must happen may take on a loaded machine.
const WAIT: Duration = Duration::from_secs(10);

/// A fixed modification time for the files the conditional tests use:
/// Tue, 14 Nov 2023 22:13:20 GMT.
const MTIME: u64 = 1_700_000_000;
const MTIME_DATE: &str = "Tue, 14 Nov 2023 22:13:20 GMT";

const CLOSE: &str = "Connection: close\r\n";
/// The `Allow` field of a 405 from a static or health route.
const ALLOW: &[(&str, &str)] = &[("Allow", "GET, HEAD")];

// ---------------------------------------------------------------------------------------
// Dates

/// The `Date` of a raw response, which must be the IMF-fixdate of a second between
/// `t0` (taken before the request) and now, give or take one.
fn date_of(raw: &[u8], t0: i64) -> String {
    let text = String::from_utf8_lossy(raw);
    let date = text
        .split("\r\n")
        .take_while(|l| !l.is_empty())
        .find_map(|l| l.strip_prefix("Date: "))
        .unwrap_or_else(|| panic!("no `Date: ` field in the response:\n{}", show(raw)))
        .to_string();
    let t1 = now_secs();
    assert!(
        (t0 - 1..=t1 + 1).any(|t| http_date(t) == date),
        "Date {date:?} is not the IMF-fixdate of a second between {} and {}",
        http_date(t0 - 1),
        http_date(t1 + 1)
    );
    date
}

// ---------------------------------------------------------------------------------------
// Expected responses

/// What a file response must say about the file.
struct FileInfo {
    content_type: String,
    last_modified: String,
    etag: String,
    size: u64,
}

/// Validators from the file's metadata: `Last-Modified` is the mtime as an HTTP date,
/// the `ETag` is `"<mtime hex>-<size hex>"`.
fn file_info(path: &Path, content_type: &str) -> FileInfo {
    let meta = std::fs::metadata(path).unwrap();
    FileInfo {
        content_type: content_type.to_string(),
        last_modified: http_date(meta.mtime()),
        etag: format!("\"{:x}-{:x}\"", meta.mtime(), meta.len()),
        size: meta.len(),
    }
}

fn set_mtime(path: &Path, secs: u64) {
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(UNIX_EPOCH + Duration::from_secs(secs))
        .unwrap();
}

/// Which `Connection` field ends a response head.
#[derive(Debug, Clone, Copy)]
enum Conn {
    /// HTTP/1.1 keep-alive: no field.
    Keep,
    /// `Connection: keep-alive` (an HTTP/1.0 client asked for it).
    KeepAlive,
    /// `Connection: close`.
    Close,
}

impl Conn {
    fn field(self) -> &'static str {
        match self {
            Conn::Keep => "",
            Conn::KeepAlive => "Connection: keep-alive\r\n",
            Conn::Close => CLOSE,
        }
    }
}

/// The body of an error page; `status` is e.g. `404 Not Found`.
fn error_page(status: &str) -> String {
    format!("<html><head><title>{status}</title></head><body><h1>{status}</h1><hr>forkd</body></html>\n")
}

/// A whole error response with `extra` fields after `Content-Length`.
fn error_response(
    status: &str,
    date: &str,
    extra: &[(&str, &str)],
    conn: Conn,
    head_only: bool,
) -> String {
    let page = error_page(status);
    let mut out = format!(
        "HTTP/1.1 {status}\r\nServer: forkd\r\nDate: {date}\r\nContent-Type: text/html\r\nContent-Length: {}\r\n",
        page.len()
    );
    for (name, value) in extra {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    out.push_str(conn.field());
    out.push_str("\r\n");
    if !head_only {
        out.push_str(&page);
    }
    out
}

/// The head of a file response; `range` is the first and last byte of a 206.
fn file_head(info: &FileInfo, date: &str, range: Option<(u64, u64)>, conn: Conn) -> String {
    let (status, len) = match range {
        None => ("200 OK", info.size),
        Some((first, last)) => ("206 Partial Content", last - first + 1),
    };
    let mut out = format!(
        "HTTP/1.1 {status}\r\nServer: forkd\r\nDate: {date}\r\nContent-Type: {}\r\nLast-Modified: {}\r\nETag: {}\r\nAccept-Ranges: bytes\r\n",
        info.content_type, info.last_modified, info.etag
    );
    if let Some((first, last)) = range {
        out.push_str(&format!(
            "Content-Range: bytes {first}-{last}/{}\r\n",
            info.size
        ));
    }
    out.push_str(&format!("Content-Length: {len}\r\n"));
    out.push_str(conn.field());
    out.push_str("\r\n");
    out
}

fn not_modified_head(info: &FileInfo, date: &str, conn: Conn) -> String {
    format!(
        "HTTP/1.1 304 Not Modified\r\nServer: forkd\r\nDate: {date}\r\nLast-Modified: {}\r\nETag: {}\r\n{}\r\n",
        info.last_modified,
        info.etag,
        conn.field()
    )
}

fn cat(head: &str, body: &[u8]) -> Vec<u8> {
    let mut v = head.as_bytes().to_vec();
    v.extend_from_slice(body);
    v
}

// ---------------------------------------------------------------------------------------
// Talking to the daemon

/// `METHOD TARGET HTTP/1.1`, `Host: localhost`, then `fields` (each ending in CRLF).
fn req(method: &str, target: &str, fields: &str) -> String {
    format!("{method} {target} HTTP/1.1\r\nHost: localhost\r\n{fields}\r\n")
}

fn open(d: &TestDaemon) -> TcpStream {
    let s = d.connect();
    s.set_write_timeout(Some(WAIT)).unwrap();
    s
}

fn send(s: &mut TcpStream, bytes: impl AsRef<[u8]>) {
    s.write_all(bytes.as_ref()).expect("sending a request");
}

/// Reads one response (1xx included) to a request that was not HEAD.
fn recv(s: &mut TcpStream) -> Response {
    read_response(s, false).expect("a response, but the server closed the connection")
}

/// Reads one response to a HEAD request.
fn recv_head(s: &mut TcpStream) -> Response {
    read_response(s, true).expect("a response, but the server closed the connection")
}

/// The bytes of a response as received.
fn raw(r: &Response) -> Vec<u8> {
    cat(&r.head, &r.body)
}

/// The server closes the connection and sends nothing more.
fn assert_closed(s: &mut TcpStream) {
    let rest = read_until_close(s);
    assert!(
        rest.is_empty(),
        "bytes after the last response:\n{}",
        show(&rest)
    );
}

/// Sends `request` on a new connection and reads until the server closes it.
fn exchange(d: &TestDaemon, request: impl AsRef<[u8]>) -> Vec<u8> {
    let mut s = open(d);
    send(&mut s, request);
    read_until_close(&mut s)
}

/// Bytes, escaped and shortened for a failure message.
fn show(b: &[u8]) -> String {
    let s = b.escape_ascii().to_string().replace("\\r\\n", "\\r\\n\n");
    if s.len() > 2000 {
        format!("{}... ({} more characters)", &s[..2000], s.len() - 2000)
    } else {
        s
    }
}

fn assert_same(actual: &[u8], expected: &[u8], what: &str) {
    if actual != expected {
        let at = actual
            .iter()
            .zip(expected)
            .position(|(a, b)| a != b)
            .unwrap_or(actual.len().min(expected.len()));
        panic!(
            "{what}: bytes differ from offset {at}\n--- expected ({} bytes):\n{}\n--- actual ({} bytes):\n{}",
            expected.len(),
            show(expected),
            actual.len(),
            show(actual)
        );
    }
}

/// Sends `request` alone on a new connection: the answer must be exactly the error page
/// `status` with `Connection: close`, after which the server closes the connection. A
/// new connection is then still served.
fn assert_rejected(d: &TestDaemon, request: impl AsRef<[u8]>, status: &str) {
    let request = request.as_ref();
    let t0 = now_secs();
    let got = exchange(d, request);
    assert_error_page(
        &got,
        t0,
        status,
        &[],
        Conn::Close,
        &format!("the answer to\n{}\n", show(request)),
    );
    d.assert_serves("/a.txt", b"hello\n");
}

/// `assert_rejected` for each of `requests`, all answered `status`.
fn assert_all_rejected<R: AsRef<[u8]>>(
    d: &TestDaemon,
    status: &str,
    requests: impl IntoIterator<Item = R>,
) {
    for request in requests {
        assert_rejected(d, request, status);
    }
}

/// Sends `METHOD TARGET` for each of `requests` on the kept connection `s`: each
/// answer must be exactly the error page `status` with the `extra` fields, and the
/// connection stays open. Then a good request on it is still served.
fn assert_error_pages(
    s: &mut TcpStream,
    status: &str,
    extra: &[(&str, &str)],
    requests: &[(&str, &str)],
) {
    let t0 = now_secs();
    for (method, target) in requests {
        send(s, req(method, target, ""));
        let got = raw(&recv(s));
        assert_error_page(
            &got,
            t0,
            status,
            extra,
            Conn::Keep,
            &format!("{method} {target}"),
        );
    }
    send(s, req("GET", "/a.txt", ""));
    assert_eq!(
        recv(s).body,
        b"hello\n",
        "a good request after the error pages"
    );
}

/// `(GET, target)` for each of `targets`.
fn gets<'a>(targets: &[&'a str]) -> Vec<(&'static str, &'a str)> {
    targets.iter().map(|t| ("GET", *t)).collect()
}

/// `got` is exactly the error page `status` with the `extra` fields and `conn`'s
/// `Connection` field, dated between `t0` and now.
fn assert_error_page(
    got: &[u8],
    t0: i64,
    status: &str,
    extra: &[(&str, &str)],
    conn: Conn,
    what: &str,
) {
    let date = date_of(got, t0);
    let expected = error_response(status, &date, extra, conn, false);
    assert_same(got, expected.as_bytes(), what);
}

/// A last `GET path` with `Connection: close` on `s`: answered with `body`, then the
/// server closes the connection.
fn get_last(s: &mut TcpStream, path: &str, body: &[u8]) {
    send(s, req("GET", path, CLOSE));
    assert_eq!(recv(s).body, body, "GET {path} with Connection: close");
    assert_closed(s);
}

/// Sends `bytes` on a new connection: the answers' bodies are `bodies`, in order, and
/// then the server closes the connection.
fn assert_bodies_then_close(d: &TestDaemon, bytes: impl AsRef<[u8]>, bodies: &[&[u8]]) {
    let mut s = open(d);
    send(&mut s, bytes);
    for (i, body) in bodies.iter().enumerate() {
        assert_eq!(recv(&mut s).body, *body, "response {i}");
    }
    assert_closed(&mut s);
}

/// The site most tests serve.
fn site() -> Builder {
    TestDaemon::builder()
        .file("a.txt", b"hello\n")
        .file("dir/index.html", b"<p>dir index</p>\n")
        .file("noindex/x.txt", b"x\n")
        .file("digits.txt", b"0123456789abcdefghij")
}

// ---------------------------------------------------------------------------------------
// Static files

#[test]
fn get_file_is_answered_byte_for_byte() {
    let d = site().start();
    let info = file_info(&d.www().join("a.txt"), "text/plain; charset=utf-8");
    let t0 = now_secs();

    // Keep-alive (HTTP/1.1 default): no Connection field.
    let mut s = open(&d);
    send(&mut s, req("GET", "/a.txt", ""));
    let got = raw(&recv(&mut s));
    let date = date_of(&got, t0);
    let expected = cat(&file_head(&info, &date, None, Conn::Keep), b"hello\n");
    assert_same(&got, &expected, "GET /a.txt");

    // The same again from the cache, then with `Connection: close` on the same connection.
    send(&mut s, req("GET", "/a.txt", CLOSE));
    let got = read_until_close(&mut s);
    let date = date_of(&got, t0);
    let expected = cat(&file_head(&info, &date, None, Conn::Close), b"hello\n");
    assert_same(&got, &expected, "GET /a.txt with Connection: close");
}

#[test]
fn head_sends_the_same_head_without_a_body() {
    let d = site().start();
    let info = file_info(&d.www().join("a.txt"), "text/plain; charset=utf-8");
    let t0 = now_secs();

    let got = exchange(&d, req("HEAD", "/a.txt", CLOSE));
    let date = date_of(&got, t0);
    assert_same(
        &got,
        file_head(&info, &date, None, Conn::Close).as_bytes(),
        "HEAD /a.txt",
    );

    // On a keep-alive connection: the next response follows the head directly.
    let mut s = open(&d);
    send(&mut s, req("HEAD", "/a.txt", ""));
    let r = recv_head(&mut s);
    let date = date_of(r.head.as_bytes(), t0);
    assert_eq!(r.head, file_head(&info, &date, None, Conn::Keep));
    send(&mut s, req("HEAD", "/missing.txt", ""));
    let r = recv_head(&mut s);
    let date = date_of(r.head.as_bytes(), t0);
    assert_eq!(
        r.head,
        error_response("404 Not Found", &date, &[], Conn::Keep, true)
    );
    send(&mut s, req("GET", "/a.txt", CLOSE));
    let got = read_until_close(&mut s);
    assert!(got.starts_with(b"HTTP/1.1 200 OK\r\n"), "{}", show(&got));
    assert!(got.ends_with(b"\r\n\r\nhello\n"), "{}", show(&got));
}

#[test]
fn slash_serves_index_html() {
    let d = site().start();
    let t0 = now_secs();
    let info = file_info(&d.www().join("index.html"), "text/html; charset=utf-8");
    let got = exchange(&d, req("GET", "/", CLOSE));
    let date = date_of(&got, t0);
    let expected = cat(
        &file_head(&info, &date, None, Conn::Close),
        b"<h1>index</h1>\n",
    );
    assert_same(&got, &expected, "GET /");

    let info = file_info(&d.www().join("dir/index.html"), "text/html; charset=utf-8");
    let got = exchange(&d, req("GET", "/dir/", CLOSE));
    let date = date_of(&got, t0);
    let expected = cat(
        &file_head(&info, &date, None, Conn::Close),
        b"<p>dir index</p>\n",
    );
    assert_same(&got, &expected, "GET /dir/");
}

#[test]
fn directory_without_slash_redirects_keeping_the_query() {
    let d = site().start();
    let t0 = now_secs();
    let mut s = open(&d);
    for (target, location) in [("/dir", "/dir/"), ("/dir?x=1&y=%20", "/dir/?x=1&y=%20")] {
        send(&mut s, req("GET", target, ""));
        let got = raw(&recv(&mut s));
        assert_error_page(
            &got,
            t0,
            "301 Moved Permanently",
            &[("Location", location)],
            Conn::Keep,
            &format!("GET {target}"),
        );
    }
}

#[test]
fn directory_redirect_is_never_to_another_host() {
    // The Location of a directory redirect must not become a scheme-relative reference
    // (`//host/...`): a browser would follow it to another site (an open redirect).
    let d = site().start();
    let mut s = open(&d);
    let mut bad = Vec::new();
    for target in [
        "//evil.example/../dir",
        "//evil.example/%2e%2e/dir",
        "//dir",
        "///dir",
    ] {
        send(&mut s, req("GET", target, ""));
        let r = recv(&mut s);
        assert_eq!(r.status, 301, "GET {target}: {}", r.head);
        let location = r.header("Location").unwrap_or_default().to_string();
        if !location.starts_with('/') || location.starts_with("//") || !location.ends_with("dir/") {
            bad.push(format!("GET {target} -> Location: {location}"));
        }
    }
    assert!(
        bad.is_empty(),
        "redirects a browser follows to another host:\n{}",
        bad.join("\n")
    );
}

#[test]
fn absolute_form_without_a_path_is_the_root() {
    // RFC 9112 §3.2.2 absolute-form is an absolute-URI, whose path may be empty; for
    // http an empty path is the same as "/" (RFC 9110 §4.2.3).
    let d = site().start();
    let port = d.port;
    let mut s = open(&d);
    send(
        &mut s,
        format!("GET http://localhost:{port}/ HTTP/1.1\r\nHost: localhost\r\n\r\n"),
    );
    assert_eq!(recv(&mut s).body, b"<h1>index</h1>\n");
    send(
        &mut s,
        format!("GET http://localhost:{port} HTTP/1.1\r\nHost: localhost\r\n\r\n"),
    );
    let got = raw(&recv(&mut s));
    assert!(
        got.starts_with(b"HTTP/1.1 200 OK\r\n") && got.ends_with(b"\r\n\r\n<h1>index</h1>\n"),
        "GET http://localhost:{port} was answered:\n{}",
        show(&got)
    );
}

#[test]
fn directory_without_index_is_403() {
    let d = site().start();
    let t0 = now_secs();
    let got = exchange(&d, req("GET", "/noindex/", CLOSE));
    assert_error_page(&got, t0, "403 Forbidden", &[], Conn::Close, "GET /noindex/");
    // Its files are still served.
    assert_eq!(d.get("/noindex/x.txt").body, b"x\n");
}

#[test]
fn missing_file_is_404_with_the_error_page_and_keeps_the_connection() {
    let d = site().start();
    let targets = ["/nope.txt", "/a.txt/", "/nodir/nope.txt", "/dir/nope"];
    assert_error_pages(&mut open(&d), "404 Not Found", &[], &gets(&targets));
}

#[test]
fn content_type_follows_the_extension() {
    let png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";
    let d = site()
        .file("p.html", b"<p>x</p>")
        .file("s.css", b"p{}")
        .file("s.js", b"let x;")
        .file("i.png", png)
        .file("d.json", b"{}")
        .file("u.forkdunknown", b"?")
        .file("noext", b"?")
        .file("empty.txt", b"")
        .start();
    let mut s = open(&d);
    for (path, content_type, body) in [
        ("/p.html", "text/html; charset=utf-8", &b"<p>x</p>"[..]),
        ("/s.css", "text/css; charset=utf-8", b"p{}"),
        ("/s.js", "text/javascript; charset=utf-8", b"let x;"),
        ("/a.txt", "text/plain; charset=utf-8", b"hello\n"),
        ("/i.png", "image/png", png),
        ("/d.json", "application/json", b"{}"),
        ("/u.forkdunknown", "application/octet-stream", b"?"),
        ("/noext", "application/octet-stream", b"?"),
        ("/empty.txt", "text/plain; charset=utf-8", b""),
    ] {
        send(&mut s, req("GET", path, ""));
        let r = recv(&mut s);
        assert_eq!(r.status, 200, "{path}: {}", r.head);
        assert_eq!(r.header("Content-Type"), Some(content_type), "{path}");
        assert_eq!(
            r.header("Content-Length"),
            Some(&*body.len().to_string()),
            "{path}"
        );
        assert_eq!(r.body, body, "{path}");
    }
}

#[test]
fn query_dot_segments_and_escapes_resolve_to_the_file() {
    let d = site().file("hello world.txt", b"spaced\n").start();
    let mut s = open(&d);
    for (target, body) in [
        ("/a.txt?v=1&w=2", &b"hello\n"[..]),
        ("/dir/../a.txt", b"hello\n"),
        ("/./a.txt", b"hello\n"),
        ("//a.txt", b"hello\n"),
        ("/%61.txt", b"hello\n"),
        ("/hello%20world.txt", b"spaced\n"),
        ("/dir/./", b"<p>dir index</p>\n"),
    ] {
        send(&mut s, req("GET", target, ""));
        let r = recv(&mut s);
        assert_eq!(r.status, 200, "{target}: {}", r.head);
        assert_eq!(r.body, body, "{target}");
    }
}

#[test]
fn an_edited_file_is_served_fresh_and_a_deleted_one_is_404() {
    let d = site().start();
    let path = d.www().join("a.txt");
    let before = d.get("/a.txt");
    assert_eq!(before.body, b"hello\n");
    std::fs::write(&path, b"hello, edited\n").unwrap();
    let mut last = before.clone();
    let fresh = wait_until(WAIT, || {
        last = d.get("/a.txt");
        last.body == b"hello, edited\n"
    });
    assert!(fresh, "still served after the edit: {:?}", last.body_str());
    let info = file_info(&path, "text/plain; charset=utf-8");
    assert_eq!(last.header("ETag"), Some(info.etag.as_str()));
    assert_eq!(last.header("Content-Length"), Some("14"));
    std::fs::remove_file(&path).unwrap();
    assert!(
        wait_until(WAIT, || d.get("/a.txt").status == 404),
        "a deleted file is still served"
    );
}

// ---------------------------------------------------------------------------------------
// Methods

#[test]
fn other_methods_on_static_files_are_405_with_allow() {
    let d = site().start();
    let mut s = open(&d);
    let requests = ["POST", "PUT", "DELETE", "OPTIONS", "PATCH"].map(|m| (m, "/a.txt"));
    assert_error_pages(&mut s, "405 Method Not Allowed", ALLOW, &requests);
    // With a body: the body is read and the connection goes on.
    send(
        &mut s,
        format!(
            "{}{}",
            req("POST", "/a.txt", "Content-Length: 5\r\n"),
            "hello"
        ),
    );
    let r = recv(&mut s);
    assert_eq!(r.status, 405, "{}", r.head);
    assert_eq!(r.header("Allow"), Some("GET, HEAD"));
    send(&mut s, req("GET", "/a.txt", ""));
    assert_eq!(recv(&mut s).body, b"hello\n");
}

#[test]
fn health_routes_answer_other_methods_with_405() {
    let d = site().start();
    let requests = [("POST", "/healthz"), ("POST", "/readyz")];
    assert_error_pages(&mut open(&d), "405 Method Not Allowed", ALLOW, &requests);
}

// ---------------------------------------------------------------------------------------
// Conditional requests

/// A site with `c.txt` at a fixed, old modification time.
fn conditional_site() -> (TestDaemon, FileInfo) {
    let d = site().file("c.txt", b"conditional\n").start();
    let path = d.www().join("c.txt");
    set_mtime(&path, MTIME);
    let info = file_info(&path, "text/plain; charset=utf-8");
    // Also a check of the test's own date formatting against a known date.
    assert_eq!(info.last_modified, MTIME_DATE);
    (d, info)
}

/// Sends GET /c.txt with `fields` on `s` and returns the response bytes.
fn get_c(s: &mut TcpStream, fields: &str) -> Vec<u8> {
    send(s, req("GET", "/c.txt", fields));
    raw(&recv(s))
}

#[test]
fn if_none_match_with_the_etag_is_304_without_a_body() {
    let (d, info) = conditional_site();
    let t0 = now_secs();
    let mut s = open(&d);
    let got = get_c(&mut s, &format!("If-None-Match: {}\r\n", info.etag));
    let date = date_of(&got, t0);
    assert_same(
        &got,
        not_modified_head(&info, &date, Conn::Keep).as_bytes(),
        "GET /c.txt with a matching If-None-Match",
    );
    // HEAD too; and `Connection: close` is honoured on a 304.
    send(
        &mut s,
        req(
            "HEAD",
            "/c.txt",
            &format!("If-None-Match: {}\r\n{CLOSE}", info.etag),
        ),
    );
    let got = read_until_close(&mut s);
    let date = date_of(&got, t0);
    assert_same(
        &got,
        not_modified_head(&info, &date, Conn::Close).as_bytes(),
        "HEAD /c.txt with a matching If-None-Match",
    );
}

#[test]
fn if_none_match_star_weak_and_lists_match() {
    let (d, info) = conditional_site();
    let mut s = open(&d);
    for value in [
        "*".to_string(),
        format!("W/{}", info.etag),
        format!("\"other\", {}", info.etag),
        format!("\"a\",{},\"b\"", info.etag),
    ] {
        let got = get_c(&mut s, &format!("If-None-Match: {value}\r\n"));
        assert!(
            got.starts_with(b"HTTP/1.1 304 Not Modified\r\n"),
            "If-None-Match: {value}\n{}",
            show(&got)
        );
    }
}

#[test]
fn if_none_match_without_the_etag_is_200() {
    let (d, info) = conditional_site();
    let t0 = now_secs();
    let mut s = open(&d);
    let stale = format!("\"{:x}-{:x}\"", MTIME - 1, info.size);
    for value in [stale.as_str(), "\"other\"", "\"a\", \"b\""] {
        let got = get_c(&mut s, &format!("If-None-Match: {value}\r\n"));
        let date = date_of(&got, t0);
        let expected = cat(&file_head(&info, &date, None, Conn::Keep), b"conditional\n");
        assert_same(&got, &expected, &format!("If-None-Match: {value}"));
    }
}

#[test]
fn if_modified_since_not_before_mtime_is_304_and_before_is_200() {
    let (d, info) = conditional_site();
    let t0 = now_secs();
    let mut s = open(&d);
    for since in [
        MTIME_DATE.to_string(),
        http_date(MTIME as i64 + 1),
        http_date(MTIME as i64 + 86_400 * 30),
        // The obsolete formats a recipient must accept (RFC 9110 §5.6.7).
        "Tuesday, 14-Nov-23 22:13:20 GMT".to_string(),
        "Tue Nov 14 22:13:20 2023".to_string(),
    ] {
        let got = get_c(&mut s, &format!("If-Modified-Since: {since}\r\n"));
        let date = date_of(&got, t0);
        assert_same(
            &got,
            not_modified_head(&info, &date, Conn::Keep).as_bytes(),
            &format!("If-Modified-Since: {since}"),
        );
    }
    for since in [
        http_date(MTIME as i64 - 1),
        http_date(0),
        "not a date".to_string(),
    ] {
        let got = get_c(&mut s, &format!("If-Modified-Since: {since}\r\n"));
        let date = date_of(&got, t0);
        let expected = cat(&file_head(&info, &date, None, Conn::Keep), b"conditional\n");
        assert_same(&got, &expected, &format!("If-Modified-Since: {since}"));
    }
}

#[test]
fn if_none_match_takes_precedence_over_if_modified_since() {
    let (d, info) = conditional_site();
    let mut s = open(&d);
    // A non-matching tag wins over a date that alone would give 304.
    let got = get_c(
        &mut s,
        &format!("If-None-Match: \"other\"\r\nIf-Modified-Since: {MTIME_DATE}\r\n"),
    );
    assert!(got.starts_with(b"HTTP/1.1 200 OK\r\n"), "{}", show(&got));
    assert!(got.ends_with(b"\r\n\r\nconditional\n"), "{}", show(&got));
    // A matching tag wins over a date that alone would give 200.
    let got = get_c(
        &mut s,
        &format!(
            "If-Modified-Since: {}\r\nIf-None-Match: {}\r\n",
            http_date(0),
            info.etag
        ),
    );
    assert!(
        got.starts_with(b"HTTP/1.1 304 Not Modified\r\n"),
        "{}",
        show(&got)
    );
}

// ---------------------------------------------------------------------------------------
// Ranges

/// GET /digits.txt (20 bytes) with `fields`; the response bytes.
fn get_digits(s: &mut TcpStream, fields: &str) -> Vec<u8> {
    send(s, req("GET", "/digits.txt", fields));
    raw(&recv(s))
}

fn digits_info(d: &TestDaemon) -> FileInfo {
    let path = d.www().join("digits.txt");
    set_mtime(&path, MTIME);
    file_info(&path, "text/plain; charset=utf-8")
}

#[test]
fn single_ranges_are_206_with_content_range() {
    let d = site().start();
    let info = digits_info(&d);
    let t0 = now_secs();
    let mut s = open(&d);
    for (range, first, last) in [
        ("bytes=0-4", 0, 4),
        ("bytes=-3", 17, 19),
        ("bytes=5-", 5, 19),
        ("bytes=15-100", 15, 19),
        ("bytes=-100", 0, 19),
        ("bytes=19-19", 19, 19),
    ] {
        let got = get_digits(&mut s, &format!("Range: {range}\r\n"));
        let date = date_of(&got, t0);
        let body = &b"0123456789abcdefghij"[first as usize..=last as usize];
        let expected = cat(
            &file_head(&info, &date, Some((first, last)), Conn::Keep),
            body,
        );
        assert_same(&got, &expected, &format!("Range: {range}"));
    }
}

#[test]
fn unsatisfiable_range_is_416_with_the_size() {
    let d = site().start();
    digits_info(&d);
    let t0 = now_secs();
    let mut s = open(&d);
    for range in ["bytes=20-", "bytes=100-200", "bytes=-0"] {
        let got = get_digits(&mut s, &format!("Range: {range}\r\n"));
        assert_error_page(
            &got,
            t0,
            "416 Range Not Satisfiable",
            &[("Content-Range", "bytes */20")],
            Conn::Keep,
            &format!("Range: {range}"),
        );
    }
}

#[test]
fn invalid_ranges_get_the_whole_file() {
    let d = site().start();
    let info = digits_info(&d);
    let t0 = now_secs();
    let mut s = open(&d);
    // Several valid ranges: multipart/byteranges, tests/site.rs.
    for range in ["bytes=0-1,5-1", "bytes=5-1", "bytes=a-b", "items=0-4"] {
        let got = get_digits(&mut s, &format!("Range: {range}\r\n"));
        let date = date_of(&got, t0);
        let expected = cat(
            &file_head(&info, &date, None, Conn::Keep),
            b"0123456789abcdefghij",
        );
        assert_same(&got, &expected, &format!("Range: {range}"));
    }
    // HEAD ignores Range (it is only defined for GET).
    send(&mut s, req("HEAD", "/digits.txt", "Range: bytes=0-4\r\n"));
    let r = recv_head(&mut s);
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(r.header("Content-Length"), Some("20"));
}

#[test]
fn if_range_with_a_stale_validator_gets_the_whole_file() {
    let d = site().start();
    let info = digits_info(&d);
    let t0 = now_secs();
    let mut s = open(&d);
    let stale_tag = format!("\"{:x}-{:x}\"", MTIME - 60, info.size);
    let weak_tag = format!("W/{}", info.etag);
    let stale_date = http_date(MTIME as i64 - 60);
    for validator in [stale_tag.as_str(), &weak_tag, &stale_date] {
        let got = get_digits(
            &mut s,
            &format!("Range: bytes=0-4\r\nIf-Range: {validator}\r\n"),
        );
        let date = date_of(&got, t0);
        let expected = cat(
            &file_head(&info, &date, None, Conn::Keep),
            b"0123456789abcdefghij",
        );
        assert_same(&got, &expected, &format!("If-Range: {validator}"));
    }
    for validator in [info.etag.as_str(), MTIME_DATE] {
        let got = get_digits(
            &mut s,
            &format!("Range: bytes=0-4\r\nIf-Range: {validator}\r\n"),
        );
        let date = date_of(&got, t0);
        let expected = cat(&file_head(&info, &date, Some((0, 4)), Conn::Keep), b"01234");
        assert_same(&got, &expected, &format!("If-Range: {validator}"));
    }
}

#[test]
fn large_file_is_sent_whole_and_by_range_byte_identical() {
    const SIZE: usize = 3 << 20;
    let content = noise(SIZE, 11);
    let d = site().file("big.bin", &content).start();
    let info = file_info(&d.www().join("big.bin"), "application/octet-stream");
    let t0 = now_secs();
    let mut s = open(&d);

    send(&mut s, req("GET", "/big.bin", ""));
    let r = recv(&mut s);
    let date = date_of(r.head.as_bytes(), t0);
    assert_eq!(r.head, file_head(&info, &date, None, Conn::Keep));
    assert!(r.body == content, "the 3 MiB body differs from the file");

    for (range, first, last) in [
        ("bytes=1000000-2099999", 1_000_000u64, 2_099_999u64),
        ("bytes=-70000", (SIZE - 70_000) as u64, SIZE as u64 - 1),
        ("bytes=3000000-", 3_000_000, SIZE as u64 - 1),
        ("bytes=65535-65537", 65_535, 65_537),
    ] {
        send(
            &mut s,
            req("GET", "/big.bin", &format!("Range: {range}\r\n")),
        );
        let r = recv(&mut s);
        let date = date_of(r.head.as_bytes(), t0);
        assert_eq!(
            r.head,
            file_head(&info, &date, Some((first, last)), Conn::Keep),
            "Range: {range}"
        );
        assert!(
            r.body == content[first as usize..=last as usize],
            "Range: {range}: the body differs from the file"
        );
    }

    send(&mut s, req("HEAD", "/big.bin", ""));
    let r = recv_head(&mut s);
    let date = date_of(r.head.as_bytes(), t0);
    assert_eq!(r.head, file_head(&info, &date, None, Conn::Keep));

    // Pipelined behind a file sent from disk: a small file, a range, then the end.
    let pipeline = [
        req("GET", "/big.bin", ""),
        req("GET", "/a.txt", ""),
        req("GET", "/big.bin", "Range: bytes=10-19\r\n"),
        req("GET", "/big.bin", CLOSE),
    ]
    .concat();
    send(&mut s, pipeline);
    let r = recv(&mut s);
    assert!(r.status == 200 && r.body == content, "pipelined big file");
    let r = recv(&mut s);
    assert_eq!((r.status, r.body.as_slice()), (200, &b"hello\n"[..]));
    let r = recv(&mut s);
    assert_eq!((r.status, r.body.as_slice()), (206, &content[10..20]));
    let r = recv(&mut s);
    assert!(
        r.status == 200 && r.body == content,
        "last pipelined big file"
    );
    assert_eq!(r.header("Connection"), Some("close"));
    assert_closed(&mut s);
}

// ---------------------------------------------------------------------------------------
// Path safety

#[test]
fn traversal_and_bad_escapes_are_400_and_never_leak() {
    let d = site().start();
    std::fs::write(d.dir.path().join("secret.txt"), b"TOP SECRET\n").unwrap();
    let targets = [
        "/../etc/passwd",
        "/%2e%2e/%2e%2e/etc/passwd",
        "/%2E%2E/secret.txt",
        "/.%2e/secret.txt",
        "/../secret.txt",
        "/dir/../../secret.txt",
        "/..%2fsecret.txt",
        "/..",
        "/a%2fb",
        "/a%2Fb",
        "/a%00b",
        "/%zz",
        "/a%2",
    ];
    assert_error_pages(&mut open(&d), "400 Bad Request", &[], &gets(&targets));
}

#[test]
fn symlinks_out_of_the_root_are_404_and_never_leak() {
    let d = site().start();
    let outside = d.dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(d.dir.path().join("secret.txt"), b"TOP SECRET\n").unwrap();
    std::fs::write(outside.join("secret2.txt"), b"TOP SECRET 2\n").unwrap();
    std::fs::write(outside.join("index.html"), b"TOP SECRET INDEX\n").unwrap();
    let www = d.www();
    std::os::unix::fs::symlink(d.dir.path().join("secret.txt"), www.join("link.txt")).unwrap();
    std::os::unix::fs::symlink("../secret.txt", www.join("rel.txt")).unwrap();
    std::os::unix::fs::symlink(&outside, www.join("outdir")).unwrap();
    std::os::unix::fs::symlink("a.txt", www.join("alias.txt")).unwrap();

    let mut s = open(&d);
    let targets = [
        "/link.txt",
        "/rel.txt",
        "/outdir/secret2.txt",
        "/outdir/index.html",
    ];
    assert_error_pages(&mut s, "404 Not Found", &[], &gets(&targets));
    // The outside directory itself is not served either (whatever the refusal).
    for target in ["/outdir/", "/outdir"] {
        send(&mut s, req("GET", target, ""));
        let r = recv(&mut s);
        assert_ne!(r.status, 200, "GET {target}: {}", r.head);
        assert!(
            !r.body_str().contains("SECRET"),
            "GET {target} leaked: {}",
            r.body_str()
        );
    }
    // A symlink that stays inside the root is followed.
    send(&mut s, req("GET", "/alias.txt", ""));
    let r = recv(&mut s);
    assert_eq!((r.status, r.body.as_slice()), (200, &b"hello\n"[..]));
}

#[test]
fn special_files_are_404_and_do_not_hang_the_worker() {
    let d = site().start();
    let www = d.www();
    let status = std::process::Command::new("mkfifo")
        .arg(www.join("fifo.txt"))
        .status()
        .expect("running mkfifo");
    assert!(status.success());
    std::os::unix::fs::symlink("/dev/zero", www.join("zero.bin")).unwrap();
    let targets = ["/fifo.txt", "/zero.bin"];
    assert_error_pages(&mut open(&d), "404 Not Found", &[], &gets(&targets));
}

// ---------------------------------------------------------------------------------------
// Bad input: answered, then the connection is closed

/// What the default site answers with an error page and `Connection: close`: (the
/// rule broken, the status, requests that break it).
fn rejected_requests() -> Vec<(&'static str, &'static str, Vec<String>)> {
    const BAD: &str = "400 Bad Request";
    let get = |fields: &str, body: &str| format!("{}{body}", req("GET", "/a.txt", fields));
    let coded = |coding: &str, body: &str| get(&format!("Transfer-Encoding: {coding}\r\n"), body);
    let lines = |lines: &[&str]| lines.iter().map(|l| l.to_string()).collect::<Vec<_>>();
    vec![
        (
            "a malformed request line",
            BAD,
            lines(&[
                "GET /a b HTTP/1.1\r\nHost: localhost\r\n\r\n",
                "GET  /a.txt HTTP/1.1\r\nHost: localhost\r\n\r\n",
                "GET /a.txt HTTP/1.1 extra\r\nHost: localhost\r\n\r\n",
                "GET /a.txt\r\nHost: localhost\r\n\r\n",
                "GET /a.txt FTP/1.1\r\nHost: localhost\r\n\r\n",
                "G(ET /a.txt HTTP/1.1\r\nHost: localhost\r\n\r\n",
                "GET a.txt HTTP/1.1\r\nHost: localhost\r\n\r\n",
                "\x01\x02\x03\r\n\r\n",
            ]),
        ),
        (
            "obsolete line folding",
            BAD,
            vec![
                get("X-Folded: a\r\n b\r\n", ""),
                get("X-Folded: a\r\n\tb\r\n", ""),
            ],
        ),
        (
            // RFC 9112 §5.1: between a field name and the colon; §2.2: between the start
            // line and the first field.
            "whitespace around a field name",
            BAD,
            lines(&[
                "GET /a.txt HTTP/1.1\r\nHost : localhost\r\n\r\n",
                "GET /a.txt HTTP/1.1\r\n Host: localhost\r\n\r\n",
            ]),
        ),
        (
            "HTTP/1.1 without exactly one Host",
            BAD,
            lines(&[
                "GET /a.txt HTTP/1.1\r\n\r\n",
                "GET /a.txt HTTP/1.1\r\nUser-Agent: x\r\n\r\n",
                "GET /a.txt HTTP/1.1\r\nHost: localhost\r\nHost: other\r\n\r\n",
            ]),
        ),
        (
            "Content-Length with Transfer-Encoding",
            BAD,
            vec![
                get(
                    "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
                    "0\r\n\r\n",
                ),
                get(
                    "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",
                    "hello",
                ),
            ],
        ),
        (
            "a conflicting or invalid Content-Length",
            BAD,
            [
                "Content-Length: 5\r\nContent-Length: 6\r\n",
                "Content-Length: 5, 6\r\n",
                "Content-Length: abc\r\n",
                "Content-Length: -1\r\n",
                "Content-Length: +5\r\n",
                "Content-Length: 99999999999999999999\r\n",
            ]
            .map(|fields| get(fields, "hello!"))
            .to_vec(),
        ),
        (
            "bad chunked framing",
            BAD,
            [
                "zz\r\nhello\r\n0\r\n\r\n",
                "-5\r\nhello\r\n0\r\n\r\n",
                "\r\n",
                "11111111111111111\r\n",
                "5\r\nhelloX\r\n0\r\n\r\n",
                "5\nhello\r\n0\r\n\r\n",
                "0x5\r\nhello\r\n0\r\n\r\n",
            ]
            .map(|body| coded("chunked", body))
            .to_vec(),
        ),
        (
            "an unknown transfer coding",
            "501 Not Implemented",
            vec![coded("gzip", ""), coded("gzip, chunked", "0\r\n\r\n")],
        ),
        (
            // RFC 9112 §6.3: 400 and close.
            "chunked not the final coding",
            BAD,
            vec![coded("chunked, gzip", "0\r\n\r\n")],
        ),
        (
            "another HTTP version",
            "505 HTTP Version Not Supported",
            ["HTTP/2.0", "HTTP/1.2", "HTTP/3.0"]
                .map(|version| format!("GET /a.txt {version}\r\nHost: localhost\r\n\r\n"))
                .to_vec(),
        ),
        (
            "an unknown expectation",
            "417 Expectation Failed",
            vec![get("Expect: something-else\r\n", "")],
        ),
    ]
}

#[test]
fn bad_requests_get_their_error_page_and_the_connection_is_closed() {
    let d = site().start();
    for (rule, status, requests) in rejected_requests() {
        eprintln!("{rule}: {} request(s), {status}", requests.len());
        assert_all_rejected(&d, status, requests);
    }
}

#[test]
fn http10_needs_no_host() {
    let d = site().start();
    let got = exchange(&d, "GET /a.txt HTTP/1.0\r\n\r\n");
    assert!(got.starts_with(b"HTTP/1.1 200 OK\r\n"), "{}", show(&got));
}

#[test]
fn identical_content_length_duplicates_are_one_length() {
    // RFC 9112 §6.3.
    let d = site().start();
    assert_bodies_then_close(
        &d,
        format!(
            "{}hello{}",
            req(
                "GET",
                "/a.txt",
                "Content-Length: 5\r\nContent-Length: 5\r\n"
            ),
            req("GET", "/a.txt", CLOSE)
        ),
        &[&b"hello\n"[..], &b"hello\n"[..]],
    );
}

#[test]
fn invalid_host_value_is_400() {
    // RFC 9112 §3.2: a server MUST answer 400 to a request whose Host field value is
    // invalid. `a/b` is not a uri-host (nginx: "client sent invalid host header").
    let d = site().start();
    let mut s = open(&d);
    send(&mut s, "GET /a.txt HTTP/1.1\r\nHost: bad/host\r\n\r\n");
    let r = recv(&mut s);
    assert_eq!(
        r.status,
        400,
        "Host: bad/host was answered:\n{}",
        show(&raw(&r))
    );
    assert_eq!(r.body, error_page("400 Bad Request").as_bytes());
}

#[test]
fn request_line_over_max_header_bytes_is_414() {
    let d = site().server(r#"max_header_bytes: "1KiB","#).start();
    let long = format!("/{}", "a".repeat(2000));
    assert_rejected(&d, req("GET", &long, ""), "414 URI Too Long");
    // Not even a whole line yet.
    assert_rejected(&d, format!("GET {long}"), "414 URI Too Long");
    // Just under the limit is served (404: no such file).
    let fits = format!("/{}", "a".repeat(900));
    let r = d.get(&fits);
    assert_eq!(r.status, 404, "{}", r.head);
}

#[test]
fn headers_over_max_header_bytes_are_431() {
    let d = site().server(r#"max_header_bytes: "1KiB","#).start();
    let big = format!("X-Big: {}\r\n", "b".repeat(2000));
    let many: String = (0..30)
        .map(|i| format!("X-Field-{i}: {}\r\n", "v".repeat(30)))
        .collect();
    // More than 100 fields, in few bytes.
    let count: String = (0..101).map(|i| format!("X{i}:v\r\n")).collect();
    let requests = [big, many, count].map(|fields| req("GET", "/a.txt", &fields));
    assert_all_rejected(&d, "431 Request Header Fields Too Large", requests);
    // A head that fits is served.
    let r = d.request(&req(
        "GET",
        "/a.txt",
        &format!("X-Big: {}\r\n{CLOSE}", "b".repeat(800)),
    ));
    assert_eq!(r.status, 200, "{}", r.head);
}

#[test]
fn body_over_max_body_bytes_is_413() {
    let d = site().server(r#"max_body_bytes: "1KiB","#).start();
    let over = "x".repeat(1025);
    let part = "y".repeat(400);
    let requests = [
        format!("{}{over}", req("GET", "/a.txt", "Content-Length: 1025\r\n")),
        // Chunked: one large chunk, and small chunks that add up.
        format!(
            "{}401\r\n{over}\r\n0\r\n\r\n",
            req("GET", "/a.txt", "Transfer-Encoding: chunked\r\n")
        ),
        format!(
            "{}190\r\n{part}\r\n190\r\n{part}\r\n190\r\n{part}\r\n0\r\n\r\n",
            req("GET", "/a.txt", "Transfer-Encoding: chunked\r\n")
        ),
    ];
    assert_all_rejected(&d, "413 Content Too Large", requests);
    // With `Expect: 100-continue`, the refusal comes instead of the 100.
    let got = exchange(
        &d,
        req(
            "GET",
            "/a.txt",
            "Expect: 100-continue\r\nContent-Length: 4096\r\n",
        ),
    );
    assert!(
        got.starts_with(b"HTTP/1.1 413 Content Too Large\r\n"),
        "{}",
        show(&got)
    );
    // Exactly at the limit is fine, both ways.
    let exact = "z".repeat(1024);
    assert_bodies_then_close(
        &d,
        format!(
            "{}{exact}{}400\r\n{exact}\r\n0\r\n\r\n",
            req("GET", "/a.txt", "Content-Length: 1024\r\n"),
            req(
                "GET",
                "/a.txt",
                "Transfer-Encoding: chunked\r\nConnection: close\r\n"
            ),
        ),
        &[&b"hello\n"[..], &b"hello\n"[..]],
    );
}

#[test]
fn http10_request_with_transfer_encoding_closes_the_connection() {
    // RFC 9112 §6.1: an HTTP/1.0 message with Transfer-Encoding has faulty framing; the
    // server MUST close the connection after processing it, keep-alive or not.
    let d = site().start();
    let mut s = open(&d);
    send(
        &mut s,
        "GET /a.txt HTTP/1.0\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    );
    let r = recv(&mut s);
    assert_eq!(
        r.header("Connection"),
        Some("close"),
        "the connection is kept open after an HTTP/1.0 request with Transfer-Encoding:\n{}",
        r.head
    );
    assert_closed(&mut s);
}

// ---------------------------------------------------------------------------------------
// Request bodies

#[test]
fn content_length_body_is_discarded_exactly() {
    let d = site().start();
    let info = file_info(&d.www().join("a.txt"), "text/plain; charset=utf-8");
    let t0 = now_secs();
    let mut s = open(&d);
    // Body and the next request in one write: the body must end exactly at its length
    // (it even looks like a request).
    let smuggled = "GET /digits.txt HTTP/1.1\r\nHost: localhost\r\n\r\n";
    send(
        &mut s,
        format!(
            "{}{smuggled}{}",
            req(
                "GET",
                "/a.txt",
                &format!("Content-Length: {}\r\n", smuggled.len())
            ),
            req("GET", "/a.txt", "")
        ),
    );
    for _ in 0..2 {
        let got = raw(&recv(&mut s));
        let date = date_of(&got, t0);
        let expected = cat(&file_head(&info, &date, None, Conn::Keep), b"hello\n");
        assert_same(&got, &expected, "GET with a body");
    }
    // The body in pieces.
    send(&mut s, req("GET", "/a.txt", "Content-Length: 10\r\n"));
    s.set_nodelay(true).unwrap();
    for piece in ["01", "234", "56789"] {
        send(&mut s, piece);
    }
    assert_eq!(recv(&mut s).body, b"hello\n");
    get_last(&mut s, "/digits.txt", b"0123456789abcdefghij");
}

#[test]
fn chunked_body_with_extensions_and_trailers_is_discarded() {
    let d = site().start();
    let body = "5;name=value\r\nhello\r\n6 ; quoted=\"a b\"\r\n world\r\nA\r\n0123456789\r\n0;last\r\nX-Trailer: 1\r\nY: two\r\n\r\n";
    let mut s = open(&d);
    send(
        &mut s,
        format!(
            "{}{body}{}",
            req("GET", "/a.txt", "Transfer-Encoding: chunked\r\n"),
            req("GET", "/digits.txt", "")
        ),
    );
    let hello = |s: &mut TcpStream, how: &str| {
        let r = recv(s);
        let got = (r.status, r.body.as_slice());
        assert_eq!(got, (200, &b"hello\n"[..]), "{how}: {}", r.head);
    };
    hello(&mut s, "the chunked body in one write");
    let r = recv(&mut s);
    assert_eq!(r.body, b"0123456789abcdefghij");

    // Byte by byte: the decoder keeps its state across reads.
    s.set_nodelay(true).unwrap();
    send(
        &mut s,
        req("GET", "/a.txt", "Transfer-Encoding: chunked\r\n"),
    );
    for b in body.as_bytes() {
        send(&mut s, [*b]);
    }
    hello(&mut s, "the chunked body byte by byte");
    get_last(&mut s, "/digits.txt", b"0123456789abcdefghij");
}

#[test]
fn expect_100_continue_gets_an_interim_response_before_the_body() {
    let d = site().start();
    let info = file_info(&d.www().join("a.txt"), "text/plain; charset=utf-8");
    let t0 = now_secs();
    let mut s = open(&d);
    send(
        &mut s,
        req(
            "GET",
            "/a.txt",
            "Expect: 100-continue\r\nContent-Length: 5\r\n",
        ),
    );
    let interim = recv(&mut s);
    assert_eq!(interim.head, "HTTP/1.1 100 Continue\r\n\r\n");
    send(&mut s, "hello");
    let got = raw(&recv(&mut s));
    let date = date_of(&got, t0);
    let expected = cat(&file_head(&info, &date, None, Conn::Keep), b"hello\n");
    assert_same(&got, &expected, "the final response after 100 Continue");

    // Chunked too.
    send(
        &mut s,
        req(
            "GET",
            "/digits.txt",
            "Expect: 100-continue\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n",
        ),
    );
    assert_eq!(recv(&mut s).head, "HTTP/1.1 100 Continue\r\n\r\n");
    send(&mut s, "3\r\nabc\r\n0\r\n\r\n");
    assert_eq!(recv(&mut s).body, b"0123456789abcdefghij");
    assert_closed(&mut s);
}

#[test]
fn expect_100_continue_is_ignored_for_http10() {
    // RFC 9110 §10.1.1: a server that receives 100-continue in an HTTP/1.0 request MUST
    // ignore it (an HTTP/1.0 client does not know 1xx responses).
    let d = site().start();
    let got = exchange(
        &d,
        "GET /a.txt HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\nhello",
    );
    assert!(
        got.starts_with(b"HTTP/1.1 200 OK\r\n"),
        "an HTTP/1.0 client got:\n{}",
        show(&got)
    );
    assert!(got.ends_with(b"\r\n\r\nhello\n"), "{}", show(&got));
}

#[test]
fn empty_lines_before_a_request_line_are_ignored() {
    // RFC 9112 §2.2: a server SHOULD ignore at least one empty line before the request
    // line (old clients send an extra CRLF after a body).
    let d = site().start();
    assert_bodies_then_close(
        &d,
        format!(
            "{}hello\r\n{}",
            req("GET", "/a.txt", "Content-Length: 5\r\n"),
            req("GET", "/digits.txt", CLOSE)
        ),
        &[&b"hello\n"[..], &b"0123456789abcdefghij"[..]],
    );
}

// ---------------------------------------------------------------------------------------
// Keep-alive and pipelining

#[test]
fn several_requests_share_one_connection() {
    let d = site().start();
    let mut s = open(&d);
    for i in 0..5 {
        let path = if i % 2 == 0 { "/a.txt" } else { "/digits.txt" };
        send(&mut s, req("GET", path, ""));
        let r = recv(&mut s);
        assert_eq!(r.status, 200, "request {i}: {}", r.head);
        assert_eq!(r.header("Connection"), None, "request {i}");
    }
    get_last(&mut s, "/a.txt", b"hello\n");
}

#[test]
fn ten_pipelined_requests_are_answered_in_order() {
    let mut b = site();
    for i in 0..10 {
        b = b.file(
            &format!("p{i}.txt"),
            format!("pipelined file {i}\n").as_bytes(),
        );
    }
    let d = b.start();
    let mut s = open(&d);
    let pipeline: String = (0..10)
        .map(|i| {
            req(
                "GET",
                &format!("/p{i}.txt"),
                if i == 9 { CLOSE } else { "" },
            )
        })
        .collect();
    send(&mut s, pipeline);
    for i in 0..10 {
        let r = recv(&mut s);
        assert_eq!(r.status, 200, "response {i}: {}", r.head);
        assert_eq!(
            r.body_str(),
            format!("pipelined file {i}\n"),
            "response {i}"
        );
    }
    assert_closed(&mut s);
}

#[test]
fn hundreds_of_pipelined_requests_overflowing_the_buffers_are_all_answered() {
    // A 1 KiB input buffer, so the pipeline is read in many pieces with heads cut in
    // two; and enough output that it is written in several batches.
    let d = site()
        .server(r#"max_header_bytes: "1KiB","#)
        .file("m.bin", &noise(40 * 1024, 12))
        .start();
    let mut s = open(&d);
    let mut pipeline: String = (0..300)
        .map(|i| req("GET", if i % 2 == 0 { "/a.txt" } else { "/digits.txt" }, ""))
        .collect();
    pipeline.push_str(&req("GET", "/m.bin", "").repeat(40));
    pipeline.push_str(&req("GET", "/a.txt", CLOSE));
    send(&mut s, pipeline);
    for i in 0..300 {
        let r = recv(&mut s);
        let body: &[u8] = if i % 2 == 0 {
            b"hello\n"
        } else {
            b"0123456789abcdefghij"
        };
        assert_eq!((r.status, r.body.as_slice()), (200, body), "response {i}");
    }
    let m = noise(40 * 1024, 12);
    for i in 0..40 {
        let r = recv(&mut s);
        assert!(
            r.status == 200 && r.body == m,
            "response {} for /m.bin",
            300 + i
        );
    }
    let r = recv(&mut s);
    assert_eq!((r.status, r.body.as_slice()), (200, &b"hello\n"[..]));
    assert_closed(&mut s);
}

#[test]
fn pipelined_requests_of_every_kind_are_answered_in_order() {
    let d = site().start();
    let info = digits_info(&d);
    let mut s = open(&d);
    let pipeline = [
        req("HEAD", "/a.txt", ""),
        req("GET", "/nope", ""),
        req(
            "GET",
            "/digits.txt",
            &format!("If-None-Match: {}\r\n", info.etag),
        ),
        req("GET", "/digits.txt", "Range: bytes=2-3\r\n"),
        req("GET", "/a.txt", "Content-Length: 3\r\n") + "xyz",
        req("GET", "/a.txt", "Transfer-Encoding: chunked\r\n") + "1\r\nq\r\n0\r\n\r\n",
        req("GET", "/healthz", ""),
        req("GET", "/dir", ""),
        req("POST", "/a.txt", ""),
        req("GET", "/a.txt", CLOSE),
    ]
    .concat();
    send(&mut s, pipeline);
    let r = recv_head(&mut s);
    assert_eq!((r.status, r.header("Content-Length")), (200, Some("6")));
    let r = recv(&mut s);
    assert_eq!(r.status, 404);
    let r = recv(&mut s);
    assert_eq!(r.status, 304);
    let r = recv(&mut s);
    assert_eq!((r.status, r.body.as_slice()), (206, &b"23"[..]));
    let r = recv(&mut s);
    assert_eq!((r.status, r.body.as_slice()), (200, &b"hello\n"[..]));
    let r = recv(&mut s);
    assert_eq!((r.status, r.body.as_slice()), (200, &b"hello\n"[..]));
    let r = recv(&mut s);
    assert_eq!((r.status, r.body.as_slice()), (200, &b"alive\n"[..]));
    let r = recv(&mut s);
    assert_eq!((r.status, r.header("Location")), (301, Some("/dir/")));
    let r = recv(&mut s);
    assert_eq!(r.status, 405);
    let r = recv(&mut s);
    assert_eq!((r.status, r.body.as_slice()), (200, &b"hello\n"[..]));
    assert_eq!(r.header("Connection"), Some("close"));
    assert_closed(&mut s);
}

#[test]
fn http10_without_keep_alive_gets_connection_close_and_is_closed() {
    let d = site().start();
    let info = file_info(&d.www().join("a.txt"), "text/plain; charset=utf-8");
    let t0 = now_secs();
    let got = exchange(&d, "GET /a.txt HTTP/1.0\r\nUser-Agent: old\r\n\r\n");
    let date = date_of(&got, t0);
    let expected = cat(&file_head(&info, &date, None, Conn::Close), b"hello\n");
    assert_same(&got, &expected, "HTTP/1.0 GET");
    // Errors too.
    let got = exchange(&d, "GET /nope HTTP/1.0\r\n\r\n");
    assert_error_page(
        &got,
        t0,
        "404 Not Found",
        &[],
        Conn::Close,
        "HTTP/1.0 GET of a missing file",
    );
}

#[test]
fn http10_with_keep_alive_stays_open() {
    let d = site().start();
    let info = file_info(&d.www().join("a.txt"), "text/plain; charset=utf-8");
    let t0 = now_secs();
    let mut s = open(&d);
    for value in ["keep-alive", "Keep-Alive"] {
        send(
            &mut s,
            format!("GET /a.txt HTTP/1.0\r\nConnection: {value}\r\n\r\n"),
        );
        let got = raw(&recv(&mut s));
        let date = date_of(&got, t0);
        let expected = cat(&file_head(&info, &date, None, Conn::KeepAlive), b"hello\n");
        assert_same(&got, &expected, "HTTP/1.0 keep-alive GET");
    }
    send(
        &mut s,
        "GET /nope HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
    );
    let got = raw(&recv(&mut s));
    assert_error_page(
        &got,
        t0,
        "404 Not Found",
        &[],
        Conn::KeepAlive,
        "HTTP/1.0 keep-alive 404",
    );
    // The last one without keep-alive: closed.
    send(&mut s, "GET /a.txt HTTP/1.0\r\n\r\n");
    let r = recv(&mut s);
    assert_eq!(r.header("Connection"), Some("close"));
    assert_closed(&mut s);
}

#[test]
fn connection_close_on_http11_is_honoured() {
    let d = site().start();
    let mut s = open(&d);
    send(&mut s, req("GET", "/a.txt", ""));
    assert_eq!(recv(&mut s).header("Connection"), None);
    send(
        &mut s,
        req("GET", "/a.txt", "Connection: keep-alive, Close\r\n"),
    );
    let r = recv(&mut s);
    assert_eq!((r.status, r.header("Connection")), (200, Some("close")));
    assert_closed(&mut s);
    // Also on errors a handler produces.
    let got = exchange(&d, req("GET", "/nope", CLOSE));
    assert!(
        got.starts_with(b"HTTP/1.1 404 Not Found\r\n"),
        "{}",
        show(&got)
    );
    assert!(show(&got).contains("Connection: close"), "{}", show(&got));
}

#[test]
fn keepalive_requests_limit_closes_after_the_last_one() {
    let d = site().server("keepalive_requests: 3,").start();
    let info = file_info(&d.www().join("a.txt"), "text/plain; charset=utf-8");
    let t0 = now_secs();
    let mut s = open(&d);
    for i in 0..2 {
        send(&mut s, req("GET", "/a.txt", ""));
        let r = recv(&mut s);
        assert_eq!(
            (r.status, r.header("Connection")),
            (200, None),
            "request {i}"
        );
    }
    send(&mut s, req("GET", "/a.txt", ""));
    let got = raw(&recv(&mut s));
    let date = date_of(&got, t0);
    let expected = cat(&file_head(&info, &date, None, Conn::Close), b"hello\n");
    assert_same(&got, &expected, "the third request");
    assert_closed(&mut s);

    // Pipelined: three answered, the last with `Connection: close`, the fourth dropped.
    let mut s = open(&d);
    send(&mut s, req("GET", "/a.txt", "").repeat(4));
    for i in 0..3 {
        let r = recv(&mut s);
        assert_eq!(r.status, 200, "pipelined request {i}");
        let conn = if i == 2 { Some("close") } else { None };
        assert_eq!(r.header("Connection"), conn, "pipelined request {i}");
    }
    assert_closed(&mut s);
}

#[test]
fn idle_keep_alive_connection_is_closed_after_keepalive_timeout() {
    let d = site().server(r#"keepalive_timeout: "1s","#).start();
    let mut s = open(&d);
    // Measured from before the request: the idle time starts later than this.
    let idle = Instant::now();
    send(&mut s, req("GET", "/a.txt", ""));
    assert_eq!(recv(&mut s).body, b"hello\n");
    assert_closed(&mut s);
    assert!(
        idle.elapsed() >= Duration::from_millis(900),
        "closed after {:?}, before the 1 s keepalive_timeout",
        idle.elapsed()
    );
}

/// With `key: "1s"`, a client that sends `partial` and stalls gets exactly the 408
/// page with `Connection: close`, not before the timeout, and the connection closed.
fn assert_408_after_1s(key: &str, partial: &str, what: &str) {
    let d = site().server(&format!(r#"{key}: "1s","#)).start();
    let t0 = now_secs();
    let mut s = open(&d);
    let start = Instant::now();
    send(&mut s, partial);
    let got = read_until_close(&mut s);
    assert!(
        start.elapsed() >= Duration::from_millis(900),
        "{what}: answered after {:?}, before the 1 s {key}",
        start.elapsed()
    );
    let page = "408 Request Timeout";
    assert_error_page(&got, t0, page, &[], Conn::Close, what);
}

#[test]
fn incomplete_head_gets_408_after_header_timeout() {
    let partial = "GET /a.txt HTTP/1.1\r\nHost: localhost\r\n";
    assert_408_after_1s("header_timeout", partial, "an incomplete head");
}

#[test]
fn stalled_body_gets_408_after_body_timeout() {
    let partial = req("GET", "/a.txt", "Content-Length: 10\r\n") + "abc";
    assert_408_after_1s("body_timeout", &partial, "a stalled body");
}

// ---------------------------------------------------------------------------------------
// Health routes and the access log

#[test]
fn health_routes_answer_byte_for_byte() {
    let d = site().start();
    let t0 = now_secs();
    let mut s = open(&d);
    for (path, body) in [("/healthz", "alive\n"), ("/readyz", "ready\n")] {
        send(&mut s, req("GET", path, ""));
        let got = raw(&recv(&mut s));
        let date = date_of(&got, t0);
        let expected = format!(
            "HTTP/1.1 200 OK\r\nServer: forkd\r\nDate: {date}\r\nContent-Type: text/plain\r\nCache-Control: no-store\r\nContent-Length: 6\r\n\r\n{body}"
        );
        assert_same(&got, expected.as_bytes(), &format!("GET {path}"));
        send(&mut s, req("HEAD", path, ""));
        let r = recv_head(&mut s);
        let date = date_of(r.head.as_bytes(), t0);
        let expected = format!(
            "HTTP/1.1 200 OK\r\nServer: forkd\r\nDate: {date}\r\nContent-Type: text/plain\r\nCache-Control: no-store\r\nContent-Length: 6\r\n\r\n"
        );
        assert_eq!(r.head, expected, "HEAD {path}");
    }
    send(&mut s, req("GET", "/a.txt", ""));
    assert_eq!(recv(&mut s).body, b"hello\n");
}

#[test]
fn access_log_has_file_requests_in_combined_format_but_no_probes() {
    let d = site().start();
    let t0 = now_secs();
    let mut s = open(&d);
    let ua = "User-Agent: agent\r\n";
    for request in [
        req("GET", "/healthz", ua),
        req("GET", "/readyz", ua),
        req("HEAD", "/healthz", ua),
        req("GET", "/a.txt", ua),
        req("HEAD", "/a.txt", ua),
        req(
            "GET",
            "/missing?q=\"1\"",
            "Referer: http://ref.example/page\r\n",
        ),
    ] {
        send(&mut s, &request);
        read_response(&mut s, request.starts_with("HEAD")).expect("a response");
    }
    let logged = d.wait_for_access_log("/missing", WAIT);
    assert!(
        logged,
        "the access log was not written within {WAIT:?}: {:?}",
        d.access_log()
    );
    let t1 = now_secs();
    let log = d.access_log();
    assert!(
        !log.contains("healthz") && !log.contains("readyz"),
        "probes were logged:\n{log}"
    );
    let page = error_page("404 Not Found").len();
    let expected = [
        "127.0.0.1 - - [TIME] \"GET /a.txt HTTP/1.1\" 200 6 \"-\" \"agent\"".to_string(),
        "127.0.0.1 - - [TIME] \"HEAD /a.txt HTTP/1.1\" 200 0 \"-\" \"agent\"".to_string(),
        format!(
            "127.0.0.1 - - [TIME] \"GET /missing?q=\\x221\\x22 HTTP/1.1\" 404 {page} \"http://ref.example/page\" \"-\""
        ),
    ];
    let mut masked = Vec::new();
    for line in log.lines() {
        let (open_at, close_at) = match (line.find('['), line.find(']')) {
            (Some(a), Some(b)) if a < b => (a, b),
            _ => panic!("no [time] in the access log line {line:?}"),
        };
        let time = &line[open_at + 1..close_at];
        assert!(
            (t0 - 1..=t1 + 1).any(|t| log_time(t) == time),
            "log time {time:?} is not a second of this test (like {:?})",
            log_time(t0)
        );
        masked.push(format!("{}TIME{}", &line[..=open_at], &line[close_at..]));
    }
    assert_eq!(masked, expected, "access log:\n{log}");
    assert!(log.ends_with('\n'));
}

// ---------------------------------------------------------------------------------------
// Host routing

#[test]
fn host_selects_the_server_and_unknown_hosts_get_the_first() {
    // A second server on the same address, written into the config through the routes
    // text: it closes the first server's routes and opens the second server.
    let routes = r#"(prefix: "/healthz", handler: Liveness),
            (prefix: "/", handler: Static(root: "www", index: ["index.html"])),
        ],
    ), (
        listen: ["127.0.0.1:{port}"],
        names: ["other.test"],
        routes: [
            (prefix: "/", handler: Static(root: "www/other", index: ["index.html"])),"#;
    let d = site()
        .routes(routes)
        .file("other/index.html", b"other site\n")
        .start();
    let main = b"<h1>index</h1>\n";
    let other = b"other site\n";
    let mut s = open(&d);
    for (fields_or_target, expected) in [
        ("Host: localhost\r\n", &main[..]),
        ("Host: other.test\r\n", other),
        ("Host: OTHER.Test:8080\r\n", other),
        ("Host: unknown.test\r\n", main),
    ] {
        send(&mut s, format!("GET / HTTP/1.1\r\n{fields_or_target}\r\n"));
        let r = recv(&mut s);
        assert_eq!(r.status, 200, "{fields_or_target}: {}", r.head);
        assert_eq!(r.body, expected, "{fields_or_target}");
    }
    // Absolute form: the target's authority wins over Host (RFC 9112 §3.2.2).
    let port = d.port;
    send(
        &mut s,
        format!("GET http://other.test:{port}/ HTTP/1.1\r\nHost: localhost\r\n\r\n"),
    );
    assert_eq!(recv(&mut s).body, other);
    send(
        &mut s,
        format!("GET http://localhost:{port}/a.txt HTTP/1.1\r\nHost: other.test\r\n\r\n"),
    );
    assert_eq!(recv(&mut s).body, b"hello\n");
    // HTTP/1.0 without Host: the first server.
    send(&mut s, "GET / HTTP/1.0\r\n\r\n");
    assert_eq!(recv(&mut s).body, main);
    assert_closed(&mut s);
}

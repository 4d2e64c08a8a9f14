//! HTTP behaviour of the real binary, byte for byte where it matters.

mod support;
use support::*;

#[test]
fn serves_index_and_files() {
    let d = TestDaemon::builder().file("a.txt", b"hello\n").start();
    let r = d.get("/a.txt");
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"hello\n");
    assert_eq!(r.header("Content-Type"), Some("text/plain; charset=utf-8"));
    let r = d.get("/");
    assert_eq!(r.body, b"<h1>index</h1>\n");
}

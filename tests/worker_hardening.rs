//! Worker hardening (issue 10): routes that cannot be bypassed by spelling a path
//! differently, per-host limits that apply, final answers instead of `100 Continue`,
//! fairness between connections, minimum transfer rates.
//!
//! Every test starts its own daemon and talks raw HTTP/1.1 to it; none asserts a
//! duration (deadlines are generous bounds on outcomes, for a loaded machine).

mod support;

use std::time::Duration;
use support::*;

/// How long anything that must happen may take on a loaded machine.
const WAIT: Duration = Duration::from_secs(10);

fn get_close(d: &TestDaemon, target: &str) -> Response {
    d.request(&format!(
        "GET {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    ))
}

// ---------------------------------------------------------------------------------------
// Routing by the normalised path (item 1)

const API_ROUTES: &str = r#"(prefix: "/api", handler: Liveness),
            (prefix: "/", handler: Static(root: "www", index: ["index.html"])),"#;

#[test]
fn every_spelling_of_a_routed_path_reaches_its_route() {
    let d = TestDaemon::builder()
        .routes(API_ROUTES)
        .file("x/api-file.txt", b"static\n")
        .start();
    for target in ["/api/x", "//api/x", "/%61pi/x", "/x/../api/x", "/./api/x"] {
        let r = get_close(&d, target);
        assert_eq!(r.status, 200, "{target}: {}", r.head);
        assert_eq!(r.body_str(), "alive\n", "{target} went past the /api route");
    }
}

#[test]
fn a_path_that_leaves_a_route_is_served_by_the_route_it_lands_in() {
    let d = TestDaemon::builder().file("1kb.txt", &[b'k'; 1024]).start();
    let r = get_close(&d, "/healthz/../1kb.txt");
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(r.body, vec![b'k'; 1024], "answered by the /healthz route");
    let r = get_close(&d, "/%68ealthz");
    assert_eq!(r.body_str(), "alive\n");
}

#[test]
fn a_path_that_cannot_be_normalised_is_400_before_routing() {
    let d = TestDaemon::builder().start();
    for target in [
        "/healthz/../../x",
        "/healthz/%2e%2e/%2e%2e/x",
        "/healthz%2fx",
        "/healthz%00",
        "/healthz%zz",
    ] {
        let r = get_close(&d, target);
        assert_eq!(r.status, 400, "{target}: {}", r.head);
    }
}

#[test]
fn a_folder_prefix_matches_the_folder_only() {
    let d = TestDaemon::builder()
        .routes(
            r#"(prefix: "/api/", handler: Liveness),
            (prefix: "/", handler: Static(root: "www", index: ["index.html"])),"#,
        )
        .file("apix", b"not the api\n")
        .start();
    assert_eq!(get_close(&d, "/api/x").body_str(), "alive\n");
    assert_eq!(get_close(&d, "//api//x").body_str(), "alive\n");
    assert_eq!(get_close(&d, "/apix").body_str(), "not the api\n");
}

#[test]
fn every_spelling_of_a_file_is_the_same_file_and_the_cache_follows_changes() {
    let d = TestDaemon::builder().file("dir/a.txt", b"one\n").start();
    for target in [
        "/dir/a.txt",
        "//dir/a.txt",
        "/dir/./a.txt",
        "/%64ir/a.txt",
        "/x/../dir/a.txt",
    ] {
        assert_eq!(get_close(&d, target).body_str(), "one\n", "{target}");
    }
    std::fs::write(d.www().join("dir/a.txt"), b"two, longer\n").unwrap();
    assert!(
        wait_until(WAIT, || get_close(&d, "/%64ir/a.txt").body_str()
            == "two, longer\n"),
        "a changed file is served fresh under another spelling"
    );
    assert_eq!(get_close(&d, "/dir/a.txt").body_str(), "two, longer\n");
}

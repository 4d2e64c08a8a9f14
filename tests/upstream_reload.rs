//! `-s reload` changes an upstream group in place (issue #12): new weights, a new
//! `balance` and a server no longer `backup` are in force in the same worker
//! processes as soon as the reload returns, and the shares of the requests follow.
//! Two workers, load from one client spread over both by the kernel.

// Only some of its helpers are used here.
#[allow(dead_code)]
#[path = "support/checked_upstream.rs"]
mod checked_upstream;
mod support;

use checked_upstream::CheckedUpstream;
use support::*;

/// Requests of a burst.
const BURST: usize = 200;

/// The `upstreams:` block: servers `(addr, weight, backup)` balanced by `balance`.
fn upstreams(servers: &[(&CheckedUpstream, u32, bool)], balance: &str) -> String {
    let list: Vec<String> = servers
        .iter()
        .map(|(s, w, backup)| format!("(addr: \"{}\", weight: {w}, backup: {backup})", s.addr))
        .collect();
    format!(
        "upstreams: {{ \"app\": (servers: [{}], balance: {balance}) }},",
        list.join(", ")
    )
}

/// Requests for `path(i)`, i in 0..n, each of which must succeed: how many each of
/// `servers` answered, in order.
fn shares(
    d: &TestDaemon,
    servers: &[&CheckedUpstream],
    n: usize,
    path: impl Fn(usize) -> String,
) -> Vec<u64> {
    let before: Vec<u64> = servers.iter().map(|s| s.client_requests()).collect();
    for i in 0..n {
        let r = d.get(&path(i));
        assert_eq!(r.status, 200, "request {i}: {}", r.head);
    }
    servers
        .iter()
        .zip(before)
        .map(|(s, b)| s.client_requests() - b)
        .collect()
}

fn distinct(i: usize) -> String {
    format!("/api/item{i}")
}

#[test]
fn a_reload_changes_weights_balance_and_backup_in_place() {
    let (a, b, c) = (
        CheckedUpstream::start("a", "127.0.0.1"),
        CheckedUpstream::start("b", "127.0.0.1"),
        CheckedUpstream::start("c", "127.0.0.1"),
    );
    let all = [&a, &b, &c];
    let mut d = TestDaemon::builder()
        .workers(2)
        .top(&upstreams(
            &[(&a, 1, false), (&b, 1, false), (&c, 1, true)],
            "RoundRobin",
        ))
        .routes(
            r#"(prefix: "/healthz", handler: Liveness),
            (prefix: "/api/", handler: Proxy(upstream: "app")),"#,
        )
        .start();
    let workers = d.workers();
    assert_eq!(workers.len(), 2);

    // Before: even between a and b; the backup c gets nothing while they are up.
    let got = shares(&d, &all, BURST, distinct);
    assert_eq!(
        got[2], 0,
        "the backup served while the primaries are up: {got:?}"
    );
    assert!(
        got[0] * 3 > got[1] * 2 && got[1] * 3 > got[0] * 2,
        "equal weights, uneven shares: {got:?}"
    );

    // Weights 3:1:1, c a primary now.
    d.builder.top = upstreams(
        &[(&a, 3, false), (&b, 1, false), (&c, 1, false)],
        "RoundRobin",
    );
    let (code, out, err) = d.reload();
    assert_eq!(code, 0, "reload: {out} {err}");
    let got = shares(&d, &all, BURST, distinct);
    assert!(
        got[2] > 0,
        "c is no backup any more, yet got nothing: {got:?}"
    );
    assert!(
        got[0] >= 2 * got[1] && got[0] >= 2 * got[2],
        "weights 3:1:1, shares {got:?}"
    );
    assert!(
        got[1] * 2 > got[2] && got[2] * 2 > got[1],
        "b and c weigh the same, shares {got:?}"
    );

    // A consistent hash on the path: one path, one server; round robin spread it.
    let same = |_: usize| "/api/one-path".to_string();
    let spread = shares(&d, &all, 30, same);
    assert!(
        spread.iter().filter(|&&n| n > 0).count() > 1,
        "round robin sent one path to one server only: {spread:?}"
    );
    d.builder.top = upstreams(
        &[(&a, 3, false), (&b, 1, false), (&c, 1, false)],
        "Hash(Path)",
    );
    let (code, out, err) = d.reload();
    assert_eq!(code, 0, "reload: {out} {err}");
    let pinned = shares(&d, &all, 30, same);
    assert_eq!(
        pinned.iter().filter(|&&n| n > 0).count(),
        1,
        "Hash(Path) sent one path to more than one server: {pinned:?}"
    );

    assert_eq!(d.workers(), workers, "the changes were adopted in place");
}

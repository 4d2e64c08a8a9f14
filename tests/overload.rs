//! Overload protection, end to end: nobody starves at `worker_connections`, per-client
//! limits shared by the workers.
//!
//! Nothing here asserts timing: deadlines are generous and only bound a broken run.

mod support;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::*;

fn total(stats: &serde_json::Value, key: &str) -> u64 {
    stats["totals"][key]
        .as_u64()
        .unwrap_or_else(|| panic!("no counter {key} in {}", stats["totals"]))
}

/// 48 keep-alive clients, each requesting in a loop, on one worker that holds 16
/// connections: each is served, none of their requests fails. Before rotation, 32 of
/// them waited in the accept queue for the whole run.
#[test]
fn at_worker_connections_every_waiting_client_is_served_and_no_request_fails() {
    const CLIENTS: usize = 48;
    let d = TestDaemon::builder()
        .workers(1)
        .top("worker_connections: 16,")
        // Unlimited requests per connection: only rotation frees a connection.
        .server("keepalive_requests: 0,")
        .start();
    let port = d.port;
    let served = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(AtomicU64::new(0));
    let responses = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(90);
    let threads: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (served, failures, responses) =
                (served.clone(), failures.clone(), responses.clone());
            std::thread::spawn(move || -> Vec<String> {
                let mut errors = Vec::new();
                let mut mine = 0u64;
                let mut conn: Option<Conn> = None;
                while Instant::now() < deadline && (served.load(SeqCst) < CLIENTS || mine < 3) {
                    let c = match conn.as_mut() {
                        Some(c) => c,
                        None => match Conn::connect_timeout(port, Duration::from_secs(60)) {
                            Ok(c) => conn.insert(c),
                            Err(e) => {
                                errors.push(e);
                                failures.fetch_add(1, SeqCst);
                                std::thread::sleep(Duration::from_millis(50));
                                continue;
                            }
                        },
                    };
                    match c.exchange(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n") {
                        Ok(r) => {
                            assert_eq!(r.status, 200);
                            mine += 1;
                            if mine == 1 {
                                served.fetch_add(1, SeqCst);
                            }
                            responses.fetch_add(1, SeqCst);
                            if r.closes() {
                                conn = None;
                            }
                        }
                        Err(e) => {
                            // A request sent and not answered (closed, reset, or
                            // starved past the read timeout).
                            errors.push(e);
                            failures.fetch_add(1, SeqCst);
                            conn = None;
                        }
                    }
                }
                errors
            })
        })
        .collect();
    let errors: Vec<String> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    assert_eq!(
        served.load(SeqCst),
        CLIENTS,
        "clients never served; errors: {errors:?}"
    );
    assert_eq!(failures.load(SeqCst), 0, "failed requests: {errors:?}");
    let stats = stats_json(&d.config);
    assert!(
        total(&stats, "connections_rotated") > 0,
        "{}",
        stats["totals"]
    );
    assert!(total(&stats, "connection_limit_hits") > 0);
    assert!(responses.load(SeqCst) >= CLIENTS as u64 * 3);
}

//! Reliability under real load: a multi-threaded HTTP client hammers the real binary
//! while the tests reload, stop, kill workers, reopen logs and run forkd as PID 1, and
//! every request that does not get its complete, expected answer is counted as failed.

mod support;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;
use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use support::*;

/// How long an ended child may stay unreaped: "a moment", generously (the machine may
/// be shared with other loads).
const ZOMBIE_MAX: Duration = Duration::from_secs(2);

/// Watches a process's children in the background: how long any of them stayed a
/// zombie, and how many there were at most.
struct ZombieWatch {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<(Duration, Vec<i32>, usize)>>,
}

impl ZombieWatch {
    fn start(parent: i32) -> ZombieWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut since: Vec<(i32, Instant)> = Vec::new();
            let mut longest = Duration::ZERO;
            let mut long_lived = Vec::new();
            let mut most_children = 0;
            while !flag.load(Ordering::Relaxed) {
                let children = children_of(parent);
                most_children = most_children.max(children.len());
                let zombies: Vec<i32> = children
                    .into_iter()
                    .filter(|&c| proc_state(c) == Some('Z'))
                    .collect();
                since.retain(|(p, _)| zombies.contains(p));
                for z in zombies {
                    let at = match since.iter().find(|(p, _)| *p == z) {
                        Some(&(_, at)) => at,
                        None => {
                            since.push((z, Instant::now()));
                            Instant::now()
                        }
                    };
                    let age = at.elapsed();
                    if age > ZOMBIE_MAX && !long_lived.contains(&z) {
                        long_lived.push(z);
                    }
                    longest = longest.max(age);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            (longest, long_lived, most_children)
        });
        ZombieWatch {
            stop,
            thread: Some(thread),
        }
    }

    /// (longest time a child was seen as a zombie, children that were zombies for more
    /// than `ZOMBIE_MAX`, the most children seen at once)
    fn finish(mut self) -> (Duration, Vec<i32>, usize) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for ZombieWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A Liveness route whose prefix names a reload round: its presence shows which
/// configuration a worker serves.
fn marker_route(round: usize) -> String {
    format!("(prefix: \"/round-{round}/\", handler: Liveness),\n")
}

fn default_routes() -> String {
    TestDaemon::builder().routes
}

/// Asserts that `/round-{round}/` answers (on a new connection) and the previous round's
/// marker does not.
fn assert_round_served(port: u16, round: usize, context: &str) {
    let now = get_close(port, &format!("/round-{round}/"))
        .unwrap_or_else(|e| panic!("{context}: GET /round-{round}/: {e}"));
    assert_eq!(
        (now.status, now.body.as_slice()),
        (200, &b"alive\n"[..]),
        "{context}: the new route is not served right after `-s reload` returned"
    );
    if round > 0 {
        let old = get_close(port, &format!("/round-{}/", round - 1))
            .unwrap_or_else(|e| panic!("{context}: GET /round-{}/: {e}", round - 1));
        assert_eq!(
            old.status, 404,
            "{context}: the previous round's route is still served"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Reloads under load
// ---------------------------------------------------------------------------------------

#[test]
fn twenty_reloads_with_changed_routes_and_timeouts_fail_no_request() {
    let mut d = load_site(TestDaemon::builder().workers(2))
        .server("keepalive_timeout: \"30s\",")
        .routes(&format!("{}{}", marker_route(0), default_routes()))
        .start();
    let workers = d.workers();
    // A keep-alive connection opened before the reloads sees each new route too. Its
    // first request makes it one: a connection that never sent a request is closed by
    // header_timeout (10 s), which a loaded machine may reach before round 1.
    let mut kept = Conn::connect(d.port).unwrap();
    let r = kept.exchange(&get_request(SMALL_PATH, false)).unwrap();
    check_small(&r).unwrap();
    let kept_since = Instant::now();
    let load = Load::start(d.port);
    load.wait_for(300);
    for round in 1..=20 {
        // Every round changes a route, a timeout and two limits (all within what the
        // load needs); the last one shortens the keep-alive timeout to 1 s, which is
        // checked below.
        let keepalive = match round {
            20 => "1s",
            r if r % 2 == 0 => "30s",
            _ => "31s",
        };
        d.builder.routes = format!("{}{}", marker_route(round), default_routes());
        let (max_header, max_body) = if round % 2 == 0 {
            ("16KiB", "1MiB")
        } else {
            ("8KiB", "64KiB")
        };
        d.builder.server = format!(
            "keepalive_timeout: \"{keepalive}\", max_header_bytes: \"{max_header}\", \
             max_body_bytes: \"{max_body}\","
        );
        let (code, out, err) = d.reload();
        assert_eq!(code, 0, "round {round}: -s reload failed: {out}{err}");
        assert!(
            out.contains(&format!(
                "configuration generation {} in force in 2 worker(s)",
                round + 1
            )),
            "round {round}: {out}"
        );
        for _ in 0..4 {
            assert_round_served(d.port, round, &format!("round {round}"));
        }
        let r = kept
            .exchange(&get_request(&format!("/round-{round}/"), false))
            .unwrap_or_else(|e| {
                panic!(
                    "round {round}: the kept connection, {:?} after its first request: {e}",
                    kept_since.elapsed()
                )
            });
        assert_eq!(
            r.status, 200,
            "round {round}: the kept connection does not see the new route"
        );
        load.wait_for(100);
    }
    assert_eq!(
        d.workers(),
        workers,
        "route and timeout changes are adopted in place, by the same workers"
    );
    // The new keep-alive timeout (1 s, was 30-31 s) applies to a new idle connection
    // (generous bound: this machine may be shared with other loads).
    let mut idle = Conn::connect(d.port).unwrap();
    let r = idle.exchange(&get_request(SMALL_PATH, false)).unwrap();
    assert_eq!(r.status, 200);
    let idle_since = Instant::now();
    idle.wait_close(Duration::from_secs(12))
        .expect("the idle connection closed by the new keep-alive timeout");
    let closed_after = idle_since.elapsed();
    load.stop().assert_clean("20 reloads", 2000);
    assert!(
        closed_after < Duration::from_secs(10),
        "an idle connection was closed after {closed_after:?}: the 1 s keep-alive timeout of the last reload is not in force"
    );
    d.stop();
}

/// The configuration of generation 1 still serves, in the same workers.
fn assert_old_config_serves(d: &TestDaemon, workers: &[i32], context: &str) {
    assert_eq!(d.workers(), workers, "{context}: workers were replaced");
    for _ in 0..4 {
        let r = get_close(d.port, "/round-1/").unwrap();
        assert_eq!(
            r.status, 404,
            "{context}: a route of the refused config is served"
        );
        let r = get_close(d.port, SMALL_PATH).unwrap();
        check_small(&r).unwrap();
    }
}

#[test]
fn broken_reload_under_load_fails_with_the_error_keeps_serving_and_the_next_one_works() {
    let mut d = load_site(TestDaemon::builder().workers(2)).start();
    let workers = d.workers();
    let load = Load::start(d.port);
    load.wait_for(300);

    // The new route together with an invalid duration: nothing of it may apply.
    let good_routes = d.builder.routes.clone();
    d.builder.routes = format!("{}{good_routes}", marker_route(1));
    d.builder.server = "keepalive_timeout: \"15 parsecs\",".into();
    let broken = d.builder.config_text(d.port);
    let line = broken.lines().position(|l| l.contains("parsecs")).unwrap() + 1;
    let position = format!("{}:{line}:", d.config.display());
    let (code, out, err) = d.reload();
    assert_eq!(code, 1, "-s reload of a broken config: {out}{err}");
    assert!(
        err.contains(&position) && err.contains("parsecs"),
        "-s reload does not print the error with its position {position}COL:\n{err}"
    );
    load.wait_for(300);
    assert_old_config_serves(&d, &workers, "after `-s reload` of a broken config");

    // `-s reload` refuses a broken file before signalling; the master must refuse it
    // too when it gets HUP some other way (kill -HUP, systemctl reload).
    d.signal("HUP");
    assert!(
        wait_until(Duration::from_secs(10), || d
            .error_log()
            .lines()
            .any(|l| l.contains("reload failed") && l.contains(&position))),
        "the master did not log the failed reload with {position}COL:\n{}",
        d.error_log()
    );
    load.wait_for(300);
    assert_old_config_serves(&d, &workers, "after HUP with a broken config");

    // A valid file the master refuses: the accept mode cannot change on reload.
    d.builder.server.clear();
    d.builder.accept = "ReusePort";
    let (code, out, err) = d.reload();
    assert_eq!(code, 1, "-s reload changing the accept mode: {out}{err}");
    assert!(
        err.contains("reload failed") && err.contains("accept cannot change"),
        "-s reload does not print the master's error:\n{err}"
    );
    load.wait_for(300);
    assert_old_config_serves(&d, &workers, "after a reload the master refused");

    // Fixed: the same change without the errors applies.
    d.builder.accept = "Shared";
    let (code, out, err) = d.reload();
    assert_eq!(code, 0, "the good reload after broken ones: {out}{err}");
    assert!(
        out.contains("configuration generation 2 in force in 2 worker(s)"),
        "{out}"
    );
    for _ in 0..4 {
        assert_round_served(d.port, 1, "the good reload after broken ones");
    }
    load.wait_for(300);
    load.stop().assert_clean("broken reload", 1500);
    d.stop();
}

/// Reloads 2 -> 3 -> 1 -> 2 workers under load in `accept` mode.
/// Reloads `d` to each worker count of `counts` in turn (generation 2, 3, ...), each
/// time asserting the new generation is in force and the old one has left, then
/// `between` (the load runs on meanwhile).
fn reload_to_worker_counts(d: &mut TestDaemon, counts: &[usize], what: &str, between: impl Fn()) {
    for (i, &workers) in counts.iter().enumerate() {
        let old = d.workers();
        d.builder.workers = workers;
        let (code, out, err) = d.reload();
        let generation = i + 2;
        assert_eq!(code, 0, "{what}: reload to {workers} workers: {out}{err}");
        assert!(
            out.contains(&format!(
                "configuration generation {generation} in force in {workers} worker(s)"
            )),
            "{what}: reload to {workers} workers: {out}"
        );
        assert!(
            d.wait_replaced(&old, workers, Duration::from_secs(15)),
            "{what}: the old generation {old:?} did not leave for {workers} new workers: {:?}\n{}",
            d.workers(),
            d.error_log()
        );
        between();
    }
}

fn worker_count_reloads_fail_no_request(accept: &'static str) {
    let mut d = load_site(TestDaemon::builder().workers(2).accept(accept)).start();
    let load = Load::start(d.port);
    load.wait_for(300);
    reload_to_worker_counts(&mut d, &[3, 1, 2], accept, || load.wait_for(500));
    load.stop()
        .assert_clean(&format!("worker-count reloads, {accept}"), 1500);
    d.stop();
}

/// Worker-count reloads back to back under load in `accept` mode: each `-s reload`
/// returns once the new generation serves, and the next one follows at once, while
/// earlier generations may still be draining.
fn rapid_worker_count_reloads_fail_no_request(accept: &'static str) {
    let mut d = load_site(TestDaemon::builder().workers(2).accept(accept)).start();
    let first = d.workers();
    let load = Load::start(d.port);
    load.wait_for(300);
    let sequence = [3, 1, 2, 1, 3, 2];
    for (i, workers) in sequence.into_iter().enumerate() {
        d.builder.workers = workers;
        let (code, out, err) = d.reload();
        assert_eq!(
            code,
            0,
            "{accept}: reload to {workers} workers: {out}{err}\nerror log:\n{}",
            d.error_log()
        );
        assert!(
            out.contains(&format!(
                "configuration generation {} in force in {workers} worker(s)",
                i + 2
            )),
            "{accept}: reload to {workers} workers: {out}\nerror log:\n{}",
            d.error_log()
        );
    }
    assert!(
        d.wait_replaced(&first, 2, Duration::from_secs(15)),
        "{accept}: the earlier generations did not leave: {:?}\n{}",
        d.workers(),
        d.error_log()
    );
    load.wait_for(500);
    load.stop().assert_clean(
        &format!("back-to-back worker-count reloads, {accept}"),
        1000,
    );
    d.stop();
}

#[test]
fn back_to_back_worker_count_reloads_fail_no_request_with_shared_accept() {
    rapid_worker_count_reloads_fail_no_request("Shared");
}

#[test]
fn back_to_back_worker_count_reloads_fail_no_request_with_reuseport_accept() {
    rapid_worker_count_reloads_fail_no_request("ReusePort");
}

#[test]
fn worker_count_reloads_under_load_fail_no_request_with_shared_accept() {
    worker_count_reloads_fail_no_request("Shared");
}

#[test]
fn worker_count_reloads_under_load_fail_no_request_with_reuseport_accept() {
    worker_count_reloads_fail_no_request("ReusePort");
}

/// The master's resources after a reload, with the old generation gone.
#[derive(Debug)]
struct MasterSample {
    round: usize,
    /// Its steady descriptors (see `steady_fds`): number and what each points to.
    fds: Vec<(i32, String)>,
    rss_kib: u64,
    threads: u64,
    children: usize,
    /// Workers configured.
    workers: usize,
}

/// The descriptors of `pid` that stay open over five readings 20 ms apart. A descriptor
/// open for a moment only (a /proc file being read, a pipe of a fork in progress) is
/// no leak; a leaked one stays.
fn steady_fds(pid: i32) -> Vec<(i32, String)> {
    let mut steady = fd_table(pid);
    for _ in 0..4 {
        std::thread::sleep(Duration::from_millis(20));
        let now = fd_table(pid);
        steady.retain(|fd| now.contains(fd));
    }
    steady
}

impl MasterSample {
    /// What its steady descriptors point to, sorted (the numbers themselves may change:
    /// a reload duplicates a kept socket and closes the old descriptor).
    fn fd_targets(&self) -> Vec<&str> {
        let mut targets: Vec<&str> = self.fds.iter().map(|(_, t)| t.as_str()).collect();
        targets.sort_unstable();
        targets
    }

    fn take(master: i32, round: usize, workers: usize) -> MasterSample {
        MasterSample {
            round,
            fds: steady_fds(master),
            rss_kib: proc_status_u64(master, "VmRSS"),
            threads: proc_status_u64(master, "Threads"),
            children: children_of(master).len(),
            workers,
        }
    }
}

#[test]
fn two_hundred_reloads_leave_the_master_flat_and_no_zombies() {
    let mut d = load_site(TestDaemon::builder().workers(2))
        .routes(&format!("{}{}", marker_route(0), default_routes()))
        .start();
    let master = d.pid();
    let load = Load::start(d.port);
    load.wait_for(200);
    let watch = ZombieWatch::start(master);
    let mut generation = 1;
    let mut samples = Vec::new();
    for round in 1..=200 {
        // Every 10th reload changes the worker count (a new generation); the others
        // change a route (adopted in place).
        if round % 10 == 0 {
            d.builder.workers = if d.builder.workers == 2 { 3 } else { 2 };
        }
        d.builder.routes = format!("{}{}", marker_route(round), default_routes());
        let (code, out, err) = d.reload();
        generation += 1;
        assert_eq!(code, 0, "reload {round}: {out}{err}");
        assert!(
            out.contains(&format!("configuration generation {generation} in force")),
            "reload {round}: {out}"
        );
        if round % 50 == 0 || round == 20 {
            // Settled: the old generation has left.
            let workers = d.builder.workers;
            assert!(
                wait_until(Duration::from_secs(10), || {
                    let now = d.workers();
                    now.len() == workers && now.iter().all(|&w| proc_state(w) != Some('Z'))
                }),
                "after reload {round}: children {:?}, want {workers} live workers",
                d.workers()
            );
            let sample = MasterSample::take(master, round, workers);
            eprintln!("{sample:?}");
            samples.push(sample);
        }
    }
    assert_round_served(d.port, 200, "reload 200");
    let (longest_zombie, long_zombies, most_children) = watch.finish();
    load.stop().assert_clean("200 reloads", 2000);
    // Reload 20 is the baseline: by then every allocation pattern has been through.
    let base = &samples[0];
    for s in &samples {
        assert_eq!(
            s.fd_targets(),
            base.fd_targets(),
            "the master's descriptors after reload {} differ from after reload {}:\n  \
             after {}: {:?}\n  after {}: {:?}",
            s.round,
            base.round,
            s.round,
            s.fds,
            base.round,
            base.fds
        );
        assert!(
            s.rss_kib <= base.rss_kib + 256,
            "the master's RSS grew from {} KiB (reload {}) to {} KiB (reload {})",
            base.rss_kib,
            base.round,
            s.rss_kib,
            s.round
        );
        assert_eq!(s.threads, 1, "the master runs {} threads", s.threads);
        assert_eq!(
            s.children, s.workers,
            "the master has {} children after reload {}, for {} workers",
            s.children, s.round, s.workers
        );
    }
    assert!(
        long_zombies.is_empty(),
        "children left as zombies for over {ZOMBIE_MAX:?}: {long_zombies:?} (longest {longest_zombie:?})"
    );
    // Old and new generation side by side: at most 2 + 3 workers.
    assert!(
        most_children <= 5,
        "the master had {most_children} children at once"
    );
    eprintln!(
        "200 reloads: longest zombie {longest_zombie:?}, most children at once {most_children}"
    );
    d.stop();
}

// ---------------------------------------------------------------------------------------
// Graceful stop under load
// ---------------------------------------------------------------------------------------

/// A download of a large file started before the stop, read slowly.
struct SlowDownload {
    conn: Conn,
    keepalive: bool,
    length: usize,
}

const SLOW_LEN: usize = 16 << 20;

fn slow_data() -> &'static [u8] {
    static DATA: OnceLock<Vec<u8>> = OnceLock::new();
    DATA.get_or_init(|| noise(SLOW_LEN, 3))
}

fn start_slow_download(port: u16, keepalive: bool) -> SlowDownload {
    let mut conn = Conn::connect(port).unwrap();
    // A small fixed receive buffer (no autotuning): what the client has not read stays
    // mostly on the server's side, so the response is still being sent when the
    // workers begin to drain.
    nix::sys::socket::setsockopt(&conn.s, nix::sys::socket::sockopt::RcvBuf, &(128 * 1024))
        .unwrap();
    let close = if keepalive {
        ""
    } else {
        "Connection: close\r\n"
    };
    conn.send(format!("GET /slow.bin HTTP/1.1\r\nHost: localhost\r\n{close}\r\n").as_bytes())
        .unwrap();
    let head = conn.read_head().unwrap();
    assert_eq!(head.status, 200);
    assert_eq!(head.closes(), !keepalive, "{head:?}");
    let length = head.content_length().unwrap();
    assert_eq!(length, SLOW_LEN);
    SlowDownload {
        conn,
        keepalive,
        length,
    }
}

impl SlowDownload {
    /// Reads the body slowly until `fast_after`, then at full speed; then expects the
    /// server to close the connection. Returns the body.
    fn finish(mut self, fast_after: Instant) -> Result<Vec<u8>, String> {
        let mut body = std::mem::take(&mut self.conn.buf);
        let mut chunk = vec![0u8; 32 * 1024];
        while body.len() < self.length {
            let want = chunk.len().min(self.length - body.len());
            match self.conn.s.read(&mut chunk[..want]) {
                Ok(0) => return Err(format!("EOF after {} of {} bytes", body.len(), self.length)),
                Ok(n) => body.extend_from_slice(&chunk[..n]),
                Err(e) => return Err(format!("{e} after {} of {} bytes", body.len(), self.length)),
            }
            if Instant::now() < fast_after {
                // About 2 MiB/s: some 5 MiB of 16 read when reading speeds up.
                std::thread::sleep(Duration::from_millis(15));
            }
        }
        // Draining: even the keep-alive connection is closed once its response is done.
        self.conn
            .wait_close(Duration::from_secs(5))
            .map_err(|e| format!("after the body (keep-alive: {}): {e}", self.keepalive))?;
        Ok(body)
    }
}

#[test]
fn term_under_load_fails_readiness_first_completes_slow_responses_and_exits_in_time() {
    let shutdown_delay = Duration::from_secs(2);
    let drain_timeout = Duration::from_secs(10);
    let mut d = load_site(TestDaemon::builder().workers(2))
        .top(r#"shutdown_delay: "2s", drain_timeout: "10s","#)
        .file("slow.bin", slow_data())
        .start();
    let workers = d.workers();
    let load = Load::start(d.port);
    load.wait_for(300);
    let slow: Vec<SlowDownload> = [false, true]
        .into_iter()
        .map(|keepalive| start_slow_download(d.port, keepalive))
        .collect();

    // A load balancer: probes readiness every 10 ms on new connections and takes the
    // server out of rotation (stops the load) `LB_LAG` after the first 503, so the
    // server must keep serving the full load during `shutdown_delay`.
    const LB_LAG: Duration = Duration::from_millis(300);
    let port = d.port;
    let lb_stop = load.stop_flag();
    let counters = load.tally();
    let term_at: Arc<OnceLock<Instant>> = Arc::new(OnceLock::new());
    let term_seen = term_at.clone();
    let ready = Arc::new(AtomicU64::new(0));
    let ready_seen = ready.clone();
    let prober = std::thread::spawn(move || -> Result<(u64, Duration, Response, u64), String> {
        loop {
            let r = get_close(port, "/readyz").map_err(|e| format!("readiness probe: {e}"))?;
            match r.status {
                200 if r.body == b"ready\n" => {
                    ready_seen.fetch_add(1, Ordering::Relaxed);
                }
                503 => {
                    let seen = term_seen.get().map(|t| t.elapsed());
                    let ok_at_503 = counters.ok();
                    let after = get_close(port, SMALL_PATH)
                        .map_err(|e| format!("GET right after readiness 503: {e}"))?;
                    std::thread::sleep(LB_LAG);
                    lb_stop.store(true, Ordering::Relaxed);
                    let served_after_503 = counters.ok() - ok_at_503;
                    let seen = seen.ok_or("503 before TERM was sent")?;
                    return Ok((
                        ready_seen.load(Ordering::Relaxed),
                        seen,
                        after,
                        served_after_503,
                    ));
                }
                s => return Err(format!("readiness answered {s}: {:?}", r.body)),
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    // The prober sees the server ready a few times first.
    assert!(
        wait_until(Duration::from_secs(10), || prober.is_finished()
            || ready.load(Ordering::Relaxed) >= 3),
        "readiness probes do not answer 200"
    );
    term_at.set(Instant::now()).unwrap();
    let term = *term_at.get().unwrap();
    d.signal("TERM");

    // Read slowly until draining has begun, then at full speed.
    let fast_after = term + shutdown_delay + Duration::from_millis(500);
    let readers: Vec<_> = slow
        .into_iter()
        .map(|s| {
            let keepalive = s.keepalive;
            (keepalive, std::thread::spawn(move || s.finish(fast_after)))
        })
        .collect();
    let status = d.wait_exit(shutdown_delay + drain_timeout + Duration::from_secs(5));
    let exited_after = term.elapsed();
    let probe = prober.join().unwrap();
    let report = load.stop();
    for (keepalive, reader) in readers {
        let body = reader
            .join()
            .unwrap()
            .unwrap_or_else(|e| panic!("slow download (keep-alive: {keepalive}): {e}"));
        assert!(
            body == slow_data(),
            "slow download (keep-alive: {keepalive}): {} bytes, not byte-exact",
            body.len()
        );
    }
    let status =
        status.unwrap_or_else(|| panic!("forkd still running {exited_after:?} after TERM"));
    let log = d.error_log();
    assert!(status.success(), "exit status {status}:\n{log}");
    // In time: once drained, not forced by drain_timeout (how long it took is printed
    // below; wall-clock bounds are for bench/).
    assert!(
        !log.contains("drain_timeout reached") && !log.contains("killing them"),
        "the stop was forced:\n{log}"
    );
    // Both downloads were in flight when draining began.
    let draining: usize = log
        .lines()
        .filter_map(|l| l.split("draining ").nth(1))
        .filter_map(|r| r.split(' ').next()?.parse::<usize>().ok())
        .sum();
    assert!(
        draining >= 2,
        "the workers drained {draining} connection(s), not the 2 downloads:\n{log}"
    );
    let (ready, seen_503, after, served_after_503) = probe.unwrap();
    assert!(ready >= 1, "readiness never answered 200 before the stop");
    // Readiness failed first: the 503 came while the server still served the load
    // (`after`, `served_after_503`), that is before draining began.
    check_small(&after).expect("still serving during shutdown_delay, after readiness went 503");
    assert!(
        served_after_503 > 0,
        "no load request was served between readiness 503 and the load balancer's reaction"
    );
    assert!(
        wait_until(Duration::from_secs(3), || workers
            .iter()
            .all(|&w| !alive(w))),
        "workers outlived the master"
    );
    eprintln!(
        "TERM: readiness 503 after {seen_503:?}, {served_after_503} load requests served in \
         the {LB_LAG:?} after it, exit after {exited_after:?}"
    );
    report.assert_clean("TERM", 300);
}

// ---------------------------------------------------------------------------------------
// Killed workers
// ---------------------------------------------------------------------------------------

/// Waits for the single worker of `d` to be a live process and returns it.
fn live_worker(d: &TestDaemon, not: &[i32]) -> i32 {
    let mut pid = 0;
    assert!(
        wait_until(Duration::from_secs(10), || match d.workers().as_slice() {
            [w] if !not.contains(w) && alive(*w) => {
                pid = *w;
                true
            }
            _ => false,
        }),
        "no live worker besides {not:?}: {:?}\n{}",
        d.workers(),
        d.error_log()
    );
    pid
}

#[test]
/// How fast the replacement serves is a figure (`bench/recovery-times`), not asserted.
fn sigkilled_worker_is_replaced_and_the_replacement_serves() {
    let d = load_site(TestDaemon::builder().workers(1))
        .expect_alerts()
        .start();
    let load = Load::start(d.port);
    load.wait_for(300);
    let mut killed = Vec::new();
    let mut measured = Vec::new();
    for _ in 0..3 {
        let victim = live_worker(&d, &killed);
        // The replacement must be serving before the next measurement.
        load.wait_for(100);
        let t0 = Instant::now();
        send_signal(victim, Signal::SIGKILL);
        killed.push(victim);
        // Dead (a zombie or reaped) before the first request goes out, so the request
        // cannot be answered by the victim.
        while proc_state(victim).is_some_and(|s| s != 'Z') {
            assert!(t0.elapsed() < Duration::from_secs(2), "SIGKILL ignored");
            std::thread::sleep(Duration::from_micros(200));
        }
        let served = loop {
            let outcome = match get_close(d.port, "/healthz") {
                Ok(r) if r.status == 200 => break t0.elapsed(),
                Ok(r) => format!("status {}", r.status),
                Err(e) => e,
            };
            assert!(
                t0.elapsed() < SETTLE,
                "no replacement served within {SETTLE:?}: {outcome}\n{}",
                d.error_log()
            );
        };
        let replacement = live_worker(&d, &killed);
        assert_ne!(replacement, victim);
        measured.push(served);
    }
    let report = load.stop();
    eprintln!(
        "SIGKILL: kill -> served by the replacement: {measured:?}; load (requests on the killed \
         worker's connections fail by nature): {}",
        report.summary()
    );
    let log = d.error_log();
    for victim in &killed {
        assert!(
            log.lines()
                .any(|l| l.contains(&format!("({victim})")) && l.contains("SIGKILL")),
            "the death of {victim} by SIGKILL is not in the error log:\n{log}"
        );
    }
}

#[test]
fn crash_looping_worker_backs_off_visibly_in_stats_and_serves_again() {
    let d = load_site(TestDaemon::builder().workers(1))
        .expect_alerts()
        .start();
    // Killed as soon as it appears, 6 times: the 5th and 6th deaths within the crash
    // window are respawned after 100 ms and 200 ms.
    let mut killed = Vec::new();
    let mut last_kill = Instant::now();
    for _ in 0..6 {
        let pid = live_worker(&d, &killed);
        send_signal(pid, Signal::SIGKILL);
        last_kill = Instant::now();
        killed.push(pid);
    }
    let respawned = live_worker(&d, &killed);
    let backoff = last_kill.elapsed();
    assert!(
        backoff >= Duration::from_millis(150),
        "the 6th death in a row was respawned after {backoff:?}: no backoff"
    );
    let mut json = Value::Null;
    assert!(
        wait_until(Duration::from_secs(10), || {
            json = stats_json(&d.config);
            json["master"]["respawns"].as_u64().is_some_and(|n| n >= 6)
        }),
        "forkd stats does not show 6 respawns:\n{json:#}"
    );
    let reason = json["master"]["last_respawn_reason"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        reason.contains("killed by SIGKILL") && reason.contains("respawning in"),
        "forkd stats does not show the backoff: last_respawn_reason {reason:?}"
    );
    assert!(
        d.error_log().contains("respawning in"),
        "no backoff in the error log:\n{}",
        d.error_log()
    );
    if let Err(last) = wait_small_served(d.port, Duration::from_secs(15)) {
        panic!(
            "no worker serves after the crash loop ({last}):\n{}",
            d.error_log()
        );
    }
    assert_eq!(
        d.workers(),
        vec![respawned],
        "one worker after the crash loop"
    );
    eprintln!(
        "crash loop: the 6th death was respawned after {backoff:?}; forkd stats: respawns \
         {:?}, last_respawn_reason {reason:?}",
        json["master"]["respawns"]
    );
}

// ---------------------------------------------------------------------------------------
// Log reopening under load
// ---------------------------------------------------------------------------------------

fn count_lines(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .count()
}

#[test]
fn reopen_under_load_loses_no_access_log_line() {
    let mut d = load_site(TestDaemon::builder().workers(2)).start();
    let dir = d.dir.path().to_path_buf();
    let load = Load::start(d.port);
    load.wait_for(500);
    std::fs::rename(dir.join("access.log"), dir.join("access.log.1")).unwrap();
    let (code, out, err) = d.ctl(&["-s", "reopen"]);
    assert_eq!(code, 0, "-s reopen: {out}{err}");
    assert!(
        wait_until(Duration::from_secs(5), || count_lines(
            &dir.join("access.log")
        ) > 0),
        "nothing logged to the re-opened access.log"
    );
    load.wait_for(500);
    let report = load.stop();
    // Stopping flushes every worker's buffered lines.
    let status = d.stop().expect("forkd stopped");
    assert!(status.success(), "exit status {status}");
    let old = count_lines(&dir.join("access.log.1"));
    let new = count_lines(&dir.join("access.log"));
    report.assert_clean("reopen", 1000);
    // Every successful load request is logged (probes are not; the load sends none).
    assert_eq!(
        old as u64 + new as u64,
        report.ok(),
        "access.log.1 has {old} lines and access.log {new}; the load got {} answers",
        report.ok()
    );
    assert!(old > 0 && new > 0, "old {old}, new {new}");
}

// ---------------------------------------------------------------------------------------
// PID 1
// ---------------------------------------------------------------------------------------

/// forkd as PID 1 of a new PID namespace, started through `unshare`; killed with its
/// namespace if the test fails.
struct Pid1 {
    unshare: Child,
    /// forkd's pid as seen from here.
    forkd: i32,
}

impl Drop for Pid1 {
    fn drop(&mut self) {
        if self.unshare.try_wait().ok().flatten().is_none() {
            // Killing the namespace's init kills every process in it. (Never kill(0):
            // that is this test's own process group.)
            if self.forkd > 0 {
                let _ = kill(Pid::from_raw(self.forkd), Signal::SIGKILL);
            }
            let _ = self.unshare.kill();
            let _ = self.unshare.wait();
        }
    }
}

#[test]
fn forkd_as_pid_1_serves_reaps_orphans_and_stops_on_term() {
    // The site and config only: forkd runs under `unshare`, not as the harness's child.
    let site = load_site(TestDaemon::builder().workers(2)).prepare();
    let port = site.port;
    let config = site.config.clone();
    let error_log = || site.error_log();

    // No skipping: the test fails if unshare is missing or not permitted.
    let mut cmd = Command::new("unshare");
    cmd.args(["--pid", "--fork", "--mount-proc", BIN, "-c"])
        .arg(&config);
    site.plumb(&mut cmd);
    let unshare = cmd
        .spawn()
        .expect("unshare --pid --fork --mount-proc (util-linux) must be available");
    let mut ns = Pid1 { forkd: 0, unshare };
    let unshare_pid = ns.unshare.id() as i32;
    let mut forkd = 0;
    assert!(
        wait_until(Duration::from_secs(10), || {
            if let Some(&c) = children_of(unshare_pid).first() {
                if proc_comm(c) == "forkd" {
                    forkd = c;
                    return true;
                }
            }
            false
        }),
        "forkd did not start under unshare: {:?}",
        ns.unshare.try_wait()
    );
    ns.forkd = forkd;
    let status = std::fs::read_to_string(format!("/proc/{forkd}/status")).unwrap();
    let nspid = status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .unwrap_or_default()
        .split_whitespace()
        .last()
        .unwrap_or_default()
        .to_string();
    assert_eq!(nspid, "1", "forkd is not PID 1 in its namespace: {status}");

    // It serves.
    if let Err(last) = wait_small_served(port, Duration::from_secs(10)) {
        panic!("forkd as PID 1 does not serve ({last}):\n{}", error_log());
    }
    assert!(
        wait_until(Duration::from_secs(5), || children_of(forkd).len() == 2),
        "workers: {:?}",
        children_of(forkd)
    );
    let workers = children_of(forkd);

    // An orphan in the namespace is re-parented to forkd, which must reap it.
    let orphaned = Command::new("nsenter")
        .args([
            "-t",
            &forkd.to_string(),
            "-p",
            "-m",
            "sh",
            "-c",
            "sleep 3 & exit",
        ])
        .stdin(Stdio::null())
        .status()
        .expect("nsenter (util-linux) must be available");
    assert!(orphaned.success(), "nsenter: {orphaned}");
    // The background `sh` execs `sleep` after its parent may have exited: look until
    // the re-parented child shows as `sleep` (it lives 3 s).
    let mut orphan = None;
    wait_until(SETTLE, || {
        orphan = children_of(forkd)
            .into_iter()
            .find(|&c| proc_comm(c) == "sleep");
        orphan.is_some()
    });
    let orphan = orphan.unwrap_or_else(|| {
        panic!(
            "the orphan was not re-parented to forkd: children {:?}",
            children_of(forkd)
        )
    });
    assert!(
        wait_until(SETTLE, || {
            !children_of(forkd).contains(&orphan) && proc_state(orphan).is_none()
        }),
        "the orphan {orphan} was not reaped: state {:?}, children of forkd {:?}",
        proc_state(orphan),
        children_of(forkd)
    );
    let zombies: Vec<i32> = children_of(forkd)
        .into_iter()
        .filter(|&c| proc_state(c) == Some('Z'))
        .collect();
    assert!(zombies.is_empty(), "zombie children of forkd: {zombies:?}");
    assert_eq!(
        children_of(forkd),
        workers,
        "reaping the orphan changed the workers"
    );
    let r = get_close(port, SMALL_PATH).expect("serving after reaping the orphan");
    check_small(&r).unwrap();

    // TERM from outside the namespace stops it gracefully.
    send_signal(forkd, Signal::SIGTERM);
    let status = wait_child(&mut ns.unshare, Duration::from_secs(10))
        .unwrap_or_else(|| panic!("forkd as PID 1 ignored TERM:\n{}", error_log()));
    assert!(
        status.success(),
        "forkd as PID 1 exited with {status}:\n{}",
        error_log()
    );
    let log = error_log();
    for bad in ["[alert]", "[crit]", "[emerg]"] {
        assert!(!log.contains(bad), "{bad} in the error log:\n{log}");
    }
}

// ---------------------------------------------------------------------------------------
// HTTP/2: the same lifecycle, streams instead of requests
// ---------------------------------------------------------------------------------------

/// Worker-count reloads under h2c load (3 connections, 8 streams in flight on each):
/// each retiring worker sends the two-step GOAWAY and finishes its open streams, the
/// clients reconnect to the new generation. `h2_max_requests: 200` makes every
/// connection end with a GOAWAY every 200 streams as well.
#[test]
fn worker_count_reloads_under_h2_load_fail_no_stream() {
    let mut d = load_site(TestDaemon::builder().workers(2).h2c())
        .server("h2_max_requests: 200,")
        .start();
    let load = support::h2load::H2Load::start(d.port, 3, 8);
    load.wait_for(300);
    reload_to_worker_counts(&mut d, &[3, 1, 2], "h2c", || load.wait_for(300));
    let report = load.stop();
    report.assert_clean("worker-count reloads under h2 load", 1000);
    assert!(
        report.goaways >= 3,
        "the retired workers and h2_max_requests ended connections with GOAWAY: {}",
        report.summary()
    );
    let log = d.access_log();
    assert!(
        log.contains("\"GET /load.txt HTTP/2.0\" 200 ")
            && log.contains("\"POST /upload HTTP/2.0\" 405 "),
        "the access log names the streams' protocol as nginx does:\n{}",
        &log[..log.len().min(600)]
    );
    d.stop();
}

/// `-s quit` under h2c load: no new connection is opened once it is sent; every stream
/// the clients began on the open connections is answered in full (the workers send
/// GOAWAY and finish them within drain_timeout), and the daemon exits.
#[test]
fn quit_under_h2_load_answers_every_stream_it_began() {
    let mut d = load_site(TestDaemon::builder().workers(2).h2c())
        .top(r#"drain_timeout: "20s","#)
        .server("h2_max_requests: 1000000,")
        .start();
    let load = support::h2load::H2Load::start(d.port, 3, 8);
    load.wait_for(300);
    load.server_closing();
    let (code, out, err) = d.ctl(&["-s", "quit"]);
    assert_eq!(code, 0, "-s quit: {out}{err}");
    assert!(
        d.wait_exit(Duration::from_secs(40)).is_some(),
        "the daemon did not exit after -s quit\n{}",
        d.error_log()
    );
    let report = load.stop();
    report.assert_clean("quit under h2 load", 300);
    assert_eq!(
        report.goaways,
        report.connections,
        "every connection was ended by the server's GOAWAY: {}",
        report.summary()
    );
    d.assert_log_clean();
}

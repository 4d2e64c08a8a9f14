//! Process lifecycle of the real binary: signals, workers, accept modes, CLI.

mod support;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};
use support::*;

// ---------------------------------------------------------------------------------------
// Local helpers
// ---------------------------------------------------------------------------------------

/// Starts `forkd -c config` in the background (stdout/stderr discarded).
fn spawn_forkd(config: &Path) -> Child {
    forkd_command(config).spawn().expect("spawn forkd")
}

/// GET `path` on a new connection with `Connection: close`, reading until EOF. None if
/// the connection fails or no complete answer arrives within `timeout` (unlike
/// `TestDaemon::get`, which panics): for polling while the server changes state.
fn try_get(port: u16, path: &str, timeout: Duration) -> Option<Response> {
    let mut c = Conn::connect_timeout(port, timeout).ok()?;
    let r = c.exchange(&get_request(path, true)).ok()?;
    c.wait_close(timeout).ok()?;
    Some(r)
}

/// Bytes the process has passed to `write(2)`-family calls on files (`wchar` in
/// /proc/PID/io).
///
/// This is how the tests tell which worker served: responses carry nothing that names
/// the worker, and all workers append to the same access log. Socket output does not
/// show here (std sends with `send(2)`, which task I/O accounting does not count), but
/// each worker appends the access-log lines of the requests *it* answered with
/// `write(2)` on its own descriptor, at least once a second. An idle worker writes
/// nothing at all (its error log is quiet at `Info`, its access-log buffer empty), so
/// a worker's `wchar` grows by exactly the log lines of the requests it served.
fn written_bytes(pid: i32) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io"))
        .unwrap_or_else(|e| panic!("reading /proc/{pid}/io: {e}"));
    io.lines()
        .find_map(|l| l.strip_prefix("wchar:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("wchar in /proc/PID/io")
}

/// Asserts `got == want` without printing megabytes on failure.
fn assert_same_bytes(got: &[u8], want: &[u8]) {
    if got != want {
        let first = got.iter().zip(want).position(|(a, b)| a != b);
        panic!(
            "body differs: got {} bytes, want {}; first difference at {:?}",
            got.len(),
            want.len(),
            first
        );
    }
}

/// A pid that names no process: a child that has exited and been reaped.
fn dead_pid() -> i32 {
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id() as i32;
    child.wait().unwrap();
    assert!(!alive(pid));
    pid
}

/// One `FILE:LINE:COL: message` line of `forkd -t`.
#[derive(Debug)]
struct Positioned {
    line: usize,
    col: usize,
    message: String,
}

/// Checks that every line `forkd -t` printed on stderr, except its closing verdict, is
/// `FILE:LINE:COL: message` with the config's path; returns them.
fn positioned_errors(stderr: &str, config: &Path) -> Vec<Positioned> {
    let prefix = format!("{}:", config.display());
    let mut out = Vec::new();
    for l in stderr.lines() {
        if l.starts_with("forkd: configuration file") {
            assert!(l.ends_with("test failed"), "verdict line: {l:?}");
            continue;
        }
        let rest = l
            .strip_prefix(&prefix)
            .unwrap_or_else(|| panic!("not `{prefix}LINE:COL: message`: {l:?}\n{stderr}"));
        let mut parts = rest.splitn(3, ':');
        let line = parts.next().and_then(|v| v.parse().ok());
        let col = parts.next().and_then(|v| v.parse().ok());
        let message = parts.next().and_then(|m| m.strip_prefix(' '));
        match (line, col, message) {
            (Some(line), Some(col), Some(message))
                if line > 0 && col > 0 && !message.is_empty() =>
            {
                out.push(Positioned {
                    line,
                    col,
                    message: message.to_string(),
                })
            }
            _ => panic!("not `FILE:LINE:COL: message`: {l:?}\n{stderr}"),
        }
    }
    assert!(
        stderr.contains("test failed"),
        "no verdict line in stderr:\n{stderr}"
    );
    out
}

/// 1-based number of the first line of `text` containing `needle`.
fn line_of(text: &str, needle: &str) -> usize {
    text.lines()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("{needle:?} not in the config"))
        + 1
}

/// A config for `forkd -t` with one line per setting, so positions are easy to predict.
const TEST_CONFIG: &str = r#"(
    workers: Count(1),
    pid_file: "forkd.pid",
    error_log: File("error.log"),
    servers: [(
        listen: ["127.0.0.1:18080"],
        keepalive_timeout: "15s",
        routes: [
            (prefix: "/healthz", handler: Liveness),
            (prefix: "/", handler: Static(root: "www")),
        ],
    )],
)
"#;

/// Runs `forkd -t` on `text` (with a `www` folder next to it).
fn config_test(text: &str) -> (TempDir, PathBuf, i32, String, String) {
    let dir = TempDir::new();
    std::fs::create_dir_all(dir.path().join("www")).unwrap();
    let config = dir.path().join("forkd.ron");
    std::fs::write(&config, text).unwrap();
    let (code, out, err) = run_forkd(&config, &["-t"]);
    (dir, config, code, out, err)
}

/// Sends a keep-alive GET on `s` and reads its response.
fn keepalive_get(s: &mut TcpStream, path: &str) -> Response {
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n");
    s.write_all(req.as_bytes()).unwrap();
    read_response(s, false).expect("a response")
}

/// Reads `s` until EOF; Ok(bytes) on a clean close, Err on a reset or a timeout.
fn read_until_eof(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    s.read_to_end(&mut out).map(|_| out)
}

/// Makes `n` `Connection: close` requests for `/` from `threads` threads, each pausing
/// `pause` between its requests; returns how many got the index page.
fn hammer_spaced(port: u16, threads: usize, n: usize, pause: Duration) -> usize {
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(move || {
                    (0..n / threads)
                        .filter(|_| {
                            std::thread::sleep(pause);
                            try_get(port, "/", Duration::from_secs(10))
                                .is_some_and(|r| r.status == 200 && r.body == b"<h1>index</h1>\n")
                        })
                        .count()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    })
}

/// Waits for the master to exit, asserts a clean exit, a removed pid file and no worker
/// left alive.
fn assert_clean_exit(d: &mut TestDaemon, workers: &[i32], timeout: Duration) {
    let status = d
        .wait_exit(timeout)
        .unwrap_or_else(|| panic!("master still running after {timeout:?}"));
    assert!(
        status.success(),
        "master exit status {status}: {}",
        d.error_log()
    );
    assert!(!d.pid_file().exists(), "pid file left behind");
    assert!(
        wait_until(Duration::from_secs(3), || workers
            .iter()
            .all(|&w| !alive(w))),
        "workers {workers:?} outlived the master"
    );
}

// ---------------------------------------------------------------------------------------
// Command line
// ---------------------------------------------------------------------------------------

#[test]
fn config_test_accepts_a_good_config() {
    let (_dir, config, code, out, err) = config_test(TEST_CONFIG);
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    assert!(out.contains("test is successful"), "stdout: {out}");
    assert!(
        out.contains(&config.display().to_string()),
        "names the file: {out}"
    );
    // The harness's own config, as the daemon tests use it, is good too.
    let (_dir, config, _) = write_site(&TestDaemon::builder());
    let (code, out, err) = run_forkd(&config, &["-t"]);
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    assert!(out.contains("test is successful"), "stdout: {out}");
}

#[test]
fn config_test_reports_a_syntax_error_with_its_position() {
    // The comma after `workers: Count(1)` is missing.
    let text = TEST_CONFIG.replace("workers: Count(1),", "workers: Count(1)");
    let (_dir, config, code, _out, err) = config_test(&text);
    assert_eq!(code, 1, "stderr: {err}");
    let errors = positioned_errors(&err, &config);
    assert_eq!(errors.len(), 1, "{err}");
    // Where the comma is missing, or where the next key stands instead of it.
    let missing = line_of(&text, "workers: Count(1)");
    assert!(
        errors[0].line == missing || errors[0].line == missing + 1,
        "line {} for a comma missing at the end of line {missing}: {err}",
        errors[0].line
    );
    assert!(errors[0].message.to_lowercase().contains("comma"), "{err}");
}

#[test]
fn config_test_reports_an_unknown_key_with_its_position() {
    let text = TEST_CONFIG.replace(
        "keepalive_timeout: \"15s\",",
        "keepalive_timeout: \"15s\",\n        keepalive_timout: \"1s\",",
    );
    let (_dir, config, code, _out, err) = config_test(&text);
    assert_eq!(code, 1, "stderr: {err}");
    let errors = positioned_errors(&err, &config);
    assert_eq!(errors.len(), 1, "{err}");
    assert_eq!(errors[0].line, line_of(&text, "keepalive_timout"), "{err}");
    assert_eq!(errors[0].col, 9, "column of the key: {err}");
    assert!(errors[0].message.contains("keepalive_timout"), "{err}");
}

#[test]
fn config_test_reports_a_bad_duration_unit_with_its_position() {
    let text = TEST_CONFIG.replace("\"15s\"", "\"15 parsecs\"");
    let (_dir, config, code, _out, err) = config_test(&text);
    assert_eq!(code, 1, "stderr: {err}");
    let errors = positioned_errors(&err, &config);
    assert_eq!(errors.len(), 1, "{err}");
    assert_eq!(errors[0].line, line_of(&text, "parsecs"), "{err}");
    assert!(errors[0].message.contains("unknown unit"), "{err}");
    assert!(errors[0].message.contains("parsecs"), "{err}");
}

#[test]
fn config_test_reports_a_missing_root_and_a_duplicate_prefix_each_at_its_line() {
    // Probes first, then an asset route whose folder does not exist, then the site: the
    // usual order of routes. `/healthz` is routed twice.
    let text = TEST_CONFIG.replace(
        "            (prefix: \"/\", handler: Static(root: \"www\")),",
        "            (prefix: \"/assets\", handler: Static(root: \"no-such-dir\")),\n\
         \x20           (prefix: \"/\", handler: Static(root: \"www\")),\n\
         \x20           (prefix: \"/healthz\", handler: Readiness),",
    );
    let (_dir, config, code, _out, err) = config_test(&text);
    assert_eq!(code, 1, "stderr: {err}");
    let errors = positioned_errors(&err, &config);
    assert_eq!(errors.len(), 2, "both errors are reported: {err}");
    let root = errors
        .iter()
        .find(|e| e.message.contains("not a directory"))
        .unwrap_or_else(|| panic!("no missing-root error: {err}"));
    assert!(root.message.contains("no-such-dir"), "{err}");
    assert_eq!(
        root.line,
        line_of(&text, "no-such-dir"),
        "the missing root's line: {err}"
    );
    let dup = errors
        .iter()
        .find(|e| e.message.contains("routed twice"))
        .unwrap_or_else(|| panic!("no duplicate-prefix error: {err}"));
    assert_eq!(
        dup.line,
        line_of(&text, "handler: Readiness"),
        "the duplicate's line: {err}"
    );
}

#[test]
fn signals_without_a_running_master_fail_clearly() {
    let (dir, config, _) = write_site(&TestDaemon::builder());
    for sig in ["quit", "stop", "reload", "reopen"] {
        let (code, _out, err) = run_forkd(&config, &["-s", sig]);
        assert_eq!(code, 1, "-s {sig}: {err}");
        assert!(
            err.contains("forkd.pid"),
            "-s {sig} names the pid file: {err}"
        );
        assert!(err.contains("does not exist"), "-s {sig}: {err}");
        assert!(err.contains("is forkd running?"), "-s {sig}: {err}");
    }
    assert!(!dir.path().join("forkd.pid").exists());
}

#[test]
fn signal_with_a_stale_pid_file_fails_mentioning_stale() {
    let (dir, config, _) = write_site(&TestDaemon::builder());
    let pid = dead_pid();
    std::fs::write(dir.path().join("forkd.pid"), format!("{pid}\n")).unwrap();
    for sig in ["quit", "reload"] {
        let (code, _out, err) = run_forkd(&config, &["-s", sig]);
        assert_eq!(code, 1, "-s {sig}: {err}");
        assert!(err.contains("stale"), "-s {sig}: {err}");
        assert!(
            err.contains(&pid.to_string()),
            "-s {sig} names the pid: {err}"
        );
    }
}

#[test]
fn version_flag_prints_the_version() {
    let out = Command::new(BIN).arg("-V").output().unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        stdout.trim(),
        format!("forkd version {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn second_instance_with_the_same_pid_file_exits_and_the_first_keeps_serving() {
    // The second instance's refusal is an [emerg] line in the shared error log.
    let d = TestDaemon::builder().workers(2).expect_alerts().start();
    let workers = d.workers();
    let mut second = spawn_forkd(&d.config);
    let status = expect_exit(&mut second, Duration::from_secs(10), "the second forkd");
    assert!(!status.success(), "the second forkd exited with {status}");
    assert!(
        d.error_log().contains("already running"),
        "the refusal is logged: {}",
        d.error_log()
    );
    let pid_file = std::fs::read_to_string(d.pid_file()).expect("pid file still there");
    assert_eq!(
        pid_file.trim(),
        d.pid().to_string(),
        "pid file still names the first"
    );
    assert_eq!(d.workers(), workers);
    for _ in 0..5 {
        assert_eq!(d.get("/").status, 200);
    }
    // And it is still the one `-s` talks to.
    let (code, _out, err) = d.ctl(&["-s", "reopen"]);
    assert_eq!(code, 0, "{err}");
}

// ---------------------------------------------------------------------------------------
// Stopping
// ---------------------------------------------------------------------------------------

#[test]
fn quit_stops_gracefully_and_removes_pid_file() {
    let mut d = TestDaemon::builder().workers(2).start();
    let workers = d.workers();
    assert_eq!(workers.len(), 2);
    let status = d.stop().expect("exits");
    assert!(status.success());
    assert!(!d.pid_file().exists());
    assert!(wait_until(Duration::from_secs(2), || workers
        .iter()
        .all(|&w| !alive(w))));
}

#[test]
fn term_stops_gracefully_and_removes_pid_file() {
    let mut d = TestDaemon::builder().workers(2).start();
    let workers = d.workers();
    assert_eq!(workers.len(), 2);
    d.signal("TERM");
    assert_clean_exit(&mut d, &workers, Duration::from_secs(10));
    assert!(d.error_log().contains("graceful stop"), "{}", d.error_log());
}

#[test]
fn dash_s_quit_and_dash_s_stop_stop_the_running_master() {
    for sig in ["quit", "stop"] {
        let mut d = TestDaemon::builder().workers(2).start();
        let workers = d.workers();
        let (code, _out, err) = d.ctl(&["-s", sig]);
        assert_eq!(code, 0, "-s {sig}: {err}");
        assert_clean_exit(&mut d, &workers, Duration::from_secs(10));
    }
}

/// Starts a daemon serving a `len`-byte noise file as `/big.bin` and requests it on a
/// connection that reads only the response head. Returns the daemon, the file's bytes,
/// the connection (positioned at the body) and the Content-Length.
fn start_big_download(builder: Builder, len: usize) -> (TestDaemon, Vec<u8>, TcpStream, usize) {
    let data = noise(len, 0);
    let d = builder.file("big.bin", &data).start();
    let mut s = d.connect();
    s.write_all(b"GET /big.bin HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    let head = read_response(&mut s, true).expect("a response head");
    assert_eq!(head.status, 200);
    let length: usize = head.header("Content-Length").unwrap().parse().unwrap();
    assert_eq!(length, len);
    (d, data, s, length)
}

#[test]
fn term_during_a_slow_response_lets_it_complete_byte_exact() {
    let (mut d, data, mut s, length) = start_big_download(
        TestDaemon::builder().top(r#"drain_timeout: "20s","#),
        16 << 20,
    );
    let workers = d.workers();
    d.signal("TERM");
    // The worker reports the download as the connection it is draining: the response is
    // still in flight (far more than the socket buffers hold is left to send).
    assert!(
        d.wait_for_log("draining 1 connection(s)", Duration::from_secs(10)),
        "no drain with one connection in the log:\n{}",
        d.error_log()
    );
    assert!(
        d.wait_exit(Duration::ZERO).is_none(),
        "master gone before the response was read"
    );
    // Read the rest slowly: small reads with short pauses.
    let mut body = Vec::with_capacity(length);
    let mut chunk = vec![0u8; 64 * 1024];
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    while body.len() < length {
        let want = chunk.len().min(length - body.len());
        match s.read(&mut chunk[..want]) {
            Ok(0) => panic!("EOF after {} of {length} body bytes", body.len()),
            Ok(n) => body.extend_from_slice(&chunk[..n]),
            Err(e) => panic!(
                "read error after {} of {length} body bytes: {e}",
                body.len()
            ),
        }
        if body.len() < 4 << 20 {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    assert_same_bytes(&body, &data);
    assert_eq!(
        read_until_eof(&mut s).expect("a clean close").len(),
        0,
        "nothing after the body"
    );
    assert_clean_exit(&mut d, &workers, Duration::from_secs(15));
    // Stopped because the response was done, not because drain_timeout ran out.
    let log = d.error_log();
    assert!(
        !log.contains("drain_timeout reached") && !log.contains("killing them"),
        "the stop was forced by drain_timeout:\n{log}"
    );
}

#[test]
fn int_stops_fast_without_waiting_for_a_response_in_flight() {
    let (mut d, _data, mut s, length) = start_big_download(
        TestDaemon::builder().top(r#"drain_timeout: "120s","#),
        16 << 20,
    );
    let workers = d.workers();
    d.signal("INT");
    // The client reads nothing, so a drain could only end at drain_timeout: an exit
    // well before it (a deadline no loaded machine misses) is a fast stop.
    assert_clean_exit(&mut d, &workers, Duration::from_secs(60));
    assert!(
        !d.error_log().contains("drain_timeout reached"),
        "INT waited for drain_timeout:\n{}",
        d.error_log()
    );
    // The download was cut short.
    let mut got = 0;
    let mut chunk = vec![0u8; 256 * 1024];
    loop {
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    assert!(got < length, "the whole body arrived despite a fast stop");
}

/// One graceful stop with a `shutdown_delay` of `delay_s` seconds: readiness fails at
/// once while new connections are still served, and the master exits only after the
/// delay. Returns whether the checks all ran within the delay; if they did not (a
/// loaded machine), their outcome says nothing and the caller retries with a longer
/// delay.
fn graceful_stop_with_delay(delay_s: u64) -> bool {
    let delay = Duration::from_secs(delay_s);
    let mut d = TestDaemon::builder()
        .top(&format!(
            r#"shutdown_delay: "{delay_s}s", drain_timeout: "5s","#
        ))
        .start();
    let workers = d.workers();
    assert_eq!(d.get("/readyz").status, 200);
    let stop_at = Instant::now();
    d.signal("QUIT");
    // Readiness fails at once so load balancers take the instance out...
    let mut last = None;
    let not_ready = wait_until(delay / 2, || {
        last = try_get(d.port, "/readyz", Duration::from_millis(500)).map(|r| r.status);
        last == Some(503)
    });
    // ...while new connections are still accepted and served.
    let live = try_get(d.port, "/healthz", Duration::from_secs(1)).map(|r| r.status);
    let page = try_get(d.port, "/", Duration::from_secs(1)).map(|r| r.status);
    let in_time = stop_at.elapsed() < delay;
    if in_time {
        assert!(
            not_ready,
            "/readyz answered {last:?} during shutdown_delay, not 503"
        );
        assert_eq!(
            live,
            Some(200),
            "/healthz on a new connection during shutdown_delay"
        );
        assert_eq!(
            page,
            Some(200),
            "a page on a new connection during shutdown_delay"
        );
    }
    assert_clean_exit(&mut d, &workers, delay + Duration::from_secs(15));
    assert!(
        stop_at.elapsed() >= delay - Duration::from_millis(200),
        "stopped before shutdown_delay passed: {:?}",
        stop_at.elapsed()
    );
    in_time
}

#[test]
fn graceful_stop_fails_readiness_but_keeps_serving_during_shutdown_delay() {
    for delay_s in [3, 10, 30] {
        if graceful_stop_with_delay(delay_s) {
            return;
        }
        eprintln!("the checks took longer than a {delay_s} s shutdown_delay: again with more");
    }
    panic!("a few requests took longer than a 30 s shutdown_delay");
}

#[test]
fn drain_closes_idle_keepalive_and_answers_a_late_request_with_connection_close() {
    let mut d = TestDaemon::builder()
        .top(r#"shutdown_delay: "1s", drain_timeout: "10s","#)
        .start();
    let workers = d.workers();
    // An idle keep-alive connection.
    let mut idle = d.connect();
    let r = keepalive_get(&mut idle, "/healthz");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("Connection"), None, "keep-alive before the stop");
    // A keep-alive connection that has started its next request when the stop comes.
    let mut busy = d.connect();
    assert_eq!(keepalive_get(&mut busy, "/").status, 200);
    busy.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\n")
        .unwrap();
    d.signal("QUIT");
    // The server closes the idle one (when draining starts, after shutdown_delay).
    idle.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    match read_until_eof(&mut idle) {
        Ok(rest) => assert!(
            rest.is_empty(),
            "unexpected bytes on the idle connection: {rest:?}"
        ),
        Err(e) => panic!("idle keep-alive connection not closed by the server: {e}"),
    }
    // Now draining: the other connection finishes its request and is told to close.
    busy.write_all(b"\r\n").unwrap();
    let r = read_response(&mut busy, false).expect("an answer during the drain");
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"<h1>index</h1>\n");
    assert_eq!(r.header("Connection"), Some("close"), "{}", r.head);
    assert_eq!(
        read_until_eof(&mut busy)
            .expect("closed after the response")
            .len(),
        0
    );
    assert_clean_exit(&mut d, &workers, Duration::from_secs(10));
}

// ---------------------------------------------------------------------------------------
// Supervision
// ---------------------------------------------------------------------------------------

#[test]
fn killed_worker_is_replaced_in_its_slot() {
    let d = TestDaemon::builder().workers(2).expect_alerts().start();
    let before = d.workers();
    assert_eq!(before.len(), 2);
    let (victim, survivor) = (before[0], before[1]);
    signal(victim, "KILL");
    assert!(
        wait_until(Duration::from_secs(5), || {
            let w = d.workers();
            w.len() == 2 && !w.contains(&victim)
        }),
        "no replacement for worker {victim}: {:?}",
        d.workers()
    );
    let after = d.workers();
    assert!(
        after.contains(&survivor),
        "the other worker was left alone: {after:?}"
    );
    let new = *after.iter().find(|&&w| w != survivor).unwrap();
    assert_ne!(new, victim);
    assert!(
        d.wait_for_log(
            &format!("({victim}) was killed by SIGKILL"),
            Duration::from_secs(5)
        ),
        "the death is not in the error log:\n{}",
        d.error_log()
    );
    // The new worker serves: keep asking until it has logged (answered) one of them;
    // see `written_bytes`.
    let base = written_bytes(new);
    let mut served = 0;
    let new_served = wait_until(Duration::from_secs(10), || {
        let r = try_get(d.port, "/", Duration::from_secs(5)).expect("an answer");
        assert_eq!(r.status, 200);
        served += 1;
        written_bytes(new) > base
    });
    assert!(
        new_served,
        "the new worker answered none of {served} requests"
    );
}

#[test]
fn crash_looping_worker_is_respawned_with_backoff_and_serves_again() {
    let d = TestDaemon::builder().expect_alerts().start();
    let mut killed: Vec<i32> = Vec::new();
    for _ in 0..6 {
        let mut pid = 0;
        assert!(
            wait_until(Duration::from_secs(10), || match d.workers().first() {
                Some(&w) if !killed.contains(&w) && alive(w) => {
                    pid = w;
                    true
                }
                _ => false,
            }),
            "no worker respawned after {} kills:\n{}",
            killed.len(),
            d.error_log()
        );
        signal(pid, "KILL");
        killed.push(pid);
    }
    assert!(
        d.wait_for_log("respawning in", Duration::from_secs(5)),
        "no backoff in the error log:\n{}",
        d.error_log()
    );
    let mut last = None;
    assert!(
        wait_until(Duration::from_secs(15), || {
            last = try_get(d.port, "/healthz", Duration::from_secs(2)).map(|r| r.status);
            last == Some(200)
        }),
        "no worker serves after the crash loop (last answer {last:?}):\n{}",
        d.error_log()
    );
    let now = d.workers();
    assert_eq!(now.len(), 1, "{now:?}");
    assert!(!killed.contains(&now[0]));
}

#[test]
fn worker_that_cannot_initialise_is_not_respawned_and_the_master_exits() {
    // The access log's folder is a file: every worker fails to open it at start-up.
    let builder = TestDaemon::builder().workers(2);
    let (dir, config, _) = write_site(&builder);
    let text = std::fs::read_to_string(&config).unwrap().replace(
        r#"File("access.log")"#,
        r#"File("www/index.html/access.log")"#,
    );
    std::fs::write(&config, text).unwrap();
    let mut master = spawn_forkd(&config);
    let status = expect_exit(
        &mut master,
        Duration::from_secs(10),
        "forkd with failing workers",
    );
    let log = std::fs::read_to_string(dir.path().join("error.log")).unwrap_or_default();
    assert_eq!(status.code(), Some(1), "exit status {status}:\n{log}");
    assert!(log.contains("not respawning"), "{log}");
    assert_eq!(
        log.matches("worker cannot start").count(),
        2,
        "each slot tried once, no respawn loop:\n{log}"
    );
    assert!(
        !dir.path().join("forkd.pid").exists(),
        "pid file left behind"
    );
}

// ---------------------------------------------------------------------------------------
// Accept modes and connection limits
// ---------------------------------------------------------------------------------------

fn both_workers_serve(accept: &'static str) {
    // The measure below is each worker's write(2) bytes (`wchar`), which must be
    // exactly its access-log lines: no file pool, whose threads wake the loop with
    // 8-byte eventfd writes in the same process.
    let d = TestDaemon::builder()
        .workers(2)
        .accept(accept)
        .top("file_threads: 0,")
        .start();
    let workers = d.workers();
    assert_eq!(workers.len(), 2);
    let base: Vec<u64> = workers.iter().map(|&w| written_bytes(w)).collect();
    let log_base = d.access_log().len();
    // A shared queue hands back-to-back connections to whichever worker is awake and
    // idle (the shared-queue trade-off: even latency, uneven load; see
    // bench/accept-queues); forkd rotates its workers through the queue every 16
    // accepts, which spreads connections that arrive a little apart, as real clients'
    // do. A reuseport queue per worker spreads any arrival pattern.
    let pause = if accept == "Shared" {
        Duration::from_millis(5)
    } else {
        Duration::ZERO
    };
    let ok = hammer_spaced(d.port, 4, 400, pause);
    assert_eq!(ok, 400, "every request got the index page");
    // Wait for the workers to flush their access-log lines (at least once a second).
    let line = "\"GET / HTTP/1.1\" 200";
    assert!(
        wait_until(Duration::from_secs(5), || d
            .access_log()
            .matches(line)
            .count()
            == 400),
        "{accept}: {} of 400 requests in the access log",
        d.access_log().matches(line).count()
    );
    let grown: Vec<u64> = workers
        .iter()
        .zip(&base)
        .map(|(&w, &b)| written_bytes(w) - b)
        .collect();
    // The measure is sound: the workers wrote exactly the new access-log lines.
    let log_growth = (d.access_log().len() - log_base) as u64;
    assert_eq!(grown.iter().sum::<u64>(), log_growth, "{accept}: {grown:?}");
    // Each worker logged (so answered) a share of the requests.
    let one_line = log_growth / 400;
    assert!(
        grown.iter().all(|&g| g >= one_line),
        "{accept}: access-log bytes written per worker: {grown:?} (one line: {one_line} bytes)"
    );
    assert_eq!(d.workers(), workers, "no worker died");
}

#[test]
fn shared_accept_serves_every_connection_on_both_workers() {
    both_workers_serve("Shared");
}

#[test]
fn reuseport_accept_serves_every_connection_on_both_workers() {
    both_workers_serve("ReusePort");
}

#[test]
fn worker_connections_limit_defers_a_new_connection_until_one_closes() {
    let d = TestDaemon::builder().top("worker_connections: 2,").start();
    let mut first = d.connect();
    assert_eq!(keepalive_get(&mut first, "/healthz").status, 200);
    let mut second = d.connect();
    assert_eq!(keepalive_get(&mut second, "/healthz").status, 200);
    // A third connection is not served while both are open...
    let mut third = d.connect();
    third
        .write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    third
        .set_read_timeout(Some(Duration::from_millis(1500)))
        .unwrap();
    let mut byte = [0u8; 1];
    match third.read(&mut byte) {
        Err(e) if is_timeout(&e) => {}
        other => panic!("third connection answered over the limit of 2: {other:?}"),
    }
    // ...the first two still are...
    assert_eq!(keepalive_get(&mut second, "/healthz").status, 200);
    // ...and once one closes, the third is served.
    drop(first);
    third
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut raw = Vec::new();
    third
        .read_to_end(&mut raw)
        .expect("served after a slot freed");
    let r = parse_response(&raw).expect("a response");
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"<h1>index</h1>\n");
    let _ = second.shutdown(Shutdown::Both);
}

// ---------------------------------------------------------------------------------------
// Timeouts
// ---------------------------------------------------------------------------------------

/// With `key: "300ms"`, a client that sends `partial` and stalls gets a 408 with
/// `Connection: close`, not before the timeout, and the connection closed after it.
fn assert_408_after_the_timeout(key: &str, partial: &[u8]) {
    let d = TestDaemon::builder()
        .server(&format!(r#"{key}: "300ms","#))
        .start();
    let mut s = d.connect();
    // The deadline for the 408: generous, the timeout itself is 300 ms.
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let sent = Instant::now();
    s.write_all(partial).unwrap();
    let r = read_response(&mut s, false).expect("a 408");
    let waited = sent.elapsed();
    assert_eq!(r.status, 408, "{key}: {}", r.head);
    assert_eq!(r.header("Connection"), Some("close"), "{key}");
    assert!(
        read_until_eof(&mut s).is_ok_and(|rest| rest.is_empty()),
        "{key}: closed after the 408"
    );
    assert!(
        waited >= Duration::from_millis(250),
        "{key}: 408 after only {waited:?}"
    );
}

#[test]
fn header_timeout_answers_408_to_a_partial_request_line() {
    assert_408_after_the_timeout("header_timeout", b"GET /index.ht");
}

#[test]
fn header_timeout_closes_a_connection_that_sends_nothing_silently() {
    // With TCP_DEFER_ACCEPT the connection is only accepted after a second or more; it
    // must then be closed without a response.
    let d = TestDaemon::builder()
        .server(r#"header_timeout: "300ms","#)
        .start();
    let mut s = d.connect();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    match read_until_eof(&mut s) {
        Ok(bytes) => assert!(
            bytes.is_empty(),
            "got {:?}",
            String::from_utf8_lossy(&bytes)
        ),
        Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
        Err(e) => panic!("an idle connection was not closed: {e}"),
    }
}

#[test]
fn keepalive_timeout_closes_an_idle_keepalive_connection() {
    let d = TestDaemon::builder()
        .server(r#"keepalive_timeout: "300ms","#)
        .start();
    let mut s = d.connect();
    assert_eq!(keepalive_get(&mut s, "/").status, 200);
    let r = keepalive_get(&mut s, "/healthz");
    assert_eq!(r.status, 200, "a second request on the same connection");
    // The deadline for the close: generous, the timeout itself is 300 ms.
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let idle_from = Instant::now();
    match read_until_eof(&mut s) {
        Ok(rest) => assert!(rest.is_empty(), "unexpected bytes: {rest:?}"),
        Err(e) => panic!("idle keep-alive connection not closed: {e}"),
    }
    let idle = idle_from.elapsed();
    assert!(
        idle >= Duration::from_millis(250),
        "closed after only {idle:?}"
    );
}

#[test]
fn body_timeout_answers_408_to_a_stalled_body() {
    assert_408_after_the_timeout(
        "body_timeout",
        b"POST /healthz HTTP/1.1\r\nHost: localhost\r\nContent-Length: 10\r\n\r\nabc",
    );
}

#[test]
fn send_timeout_disconnects_a_client_that_does_not_read() {
    let (d, _data, mut s, length) = start_big_download(
        TestDaemon::builder().server(r#"send_timeout: "500ms","#),
        32 << 20,
    );
    // Read nothing more; the server's writes stall and it gives up.
    assert!(
        d.wait_for_log("timed out reading its response", Duration::from_secs(10)),
        "the stalled client was not disconnected:\n{}",
        d.error_log()
    );
    let mut got = 0;
    let mut chunk = vec![0u8; 256 * 1024];
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let end = loop {
        match s.read(&mut chunk) {
            Ok(0) => break "EOF".to_string(),
            Ok(n) => got += n,
            Err(e) if is_timeout(&e) => panic!("the connection was left open after {got} bytes"),
            Err(e) => break e.to_string(), // a reset
        }
    };
    assert!(
        got < length,
        "the whole body arrived ({got} bytes, ended by {end}) after the server gave up"
    );
}

// ---------------------------------------------------------------------------------------
// Reload and reopen
// ---------------------------------------------------------------------------------------

const LIVE2: &str = r#"(prefix: "/live2", handler: Liveness),"#;

#[test]
fn reload_applies_a_changed_route_in_place_and_new_workers_for_a_new_count() {
    let mut d = TestDaemon::builder().workers(2).start();
    let old = d.workers();
    assert_eq!(d.get("/live2").status, 404);
    d.builder.routes = format!("{LIVE2}\n{}", d.builder.routes);
    std::fs::write(&d.config, d.builder.config_text(d.port)).unwrap();
    let (code, out, err) = d.ctl(&["-s", "reload"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("generation 2"), "{out}");
    // `-s reload` returned: the new route is in force in every worker, at once.
    for _ in 0..20 {
        assert_eq!(d.get("/live2").status, 200);
        assert_eq!(d.get("/").status, 200);
    }
    // A route change needs no new processes.
    assert_eq!(d.workers(), old, "workers were replaced for a route change");

    // A new worker count does: a new generation serves, the old one is gone.
    d.builder.workers = 3;
    std::fs::write(&d.config, d.builder.config_text(d.port)).unwrap();
    let (code, out, err) = d.ctl(&["-s", "reload"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("generation 3 in force in 3 worker(s)"),
        "{out}"
    );
    assert!(
        d.wait_replaced(&old, 3, Duration::from_secs(10)),
        "workers not replaced: before {old:?}, now {:?}",
        d.workers()
    );
    assert!(
        wait_until(Duration::from_secs(10), || old.iter().all(|&w| !alive(w))),
        "an old worker is still running"
    );
    for _ in 0..20 {
        assert_eq!(d.get("/live2").status, 200);
    }
}

#[test]
fn reload_with_a_broken_config_keeps_serving_the_old_one() {
    let d = TestDaemon::builder().workers(2).start();
    let old = d.workers();
    // The new route and a bad duration: nothing of it may apply.
    let mut broken = TestDaemon::builder();
    broken.routes = format!("{LIVE2}\n{}", broken.routes);
    let text = broken
        .server("keepalive_timeout: \"15 parsecs\",\n")
        .config_text(d.port);
    std::fs::write(&d.config, &text).unwrap();
    d.signal("HUP");
    assert!(
        d.wait_for_log("reload failed", Duration::from_secs(10)),
        "the failed reload is not logged:\n{}",
        d.error_log()
    );
    let log = d.error_log();
    let line = log.lines().find(|l| l.contains("reload failed")).unwrap();
    let position = format!("{}:{}:", d.config.display(), line_of(&text, "parsecs"));
    assert!(line.contains(&position), "no {position}COL: in {line:?}");
    assert!(line.contains("parsecs"), "{line:?}");
    assert_eq!(d.workers(), old, "workers replaced by a failed reload");
    for _ in 0..10 {
        assert_eq!(
            d.get("/live2").status,
            404,
            "a route of the broken config is served"
        );
        assert_eq!(d.get("/healthz").status, 200);
    }
}

#[test]
fn reopen_moves_logging_to_new_files_after_rotation() {
    let d = TestDaemon::builder().start();
    let dir = d.dir.path().to_path_buf();
    assert_eq!(d.get("/before-rotation").status, 404);
    assert!(
        d.wait_for_access_log("/before-rotation", Duration::from_secs(5)),
        "access log: {}",
        d.access_log()
    );
    // logrotate: move the files away, then tell forkd.
    std::fs::rename(dir.join("access.log"), dir.join("access.log.1")).unwrap();
    std::fs::rename(dir.join("error.log"), dir.join("error.log.1")).unwrap();
    let (code, _out, err) = d.ctl(&["-s", "reopen"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        wait_until(Duration::from_secs(5), || {
            dir.join("access.log").exists() && dir.join("error.log").exists()
        }),
        "logs not re-created after reopen"
    );
    assert_eq!(d.get("/after-rotation").status, 404);
    assert!(
        d.wait_for_access_log("/after-rotation", Duration::from_secs(5)),
        "new access log: {:?}",
        d.access_log()
    );
    assert!(!d.access_log().contains("/before-rotation"));
    let rotated = std::fs::read_to_string(dir.join("access.log.1")).unwrap();
    assert!(rotated.contains("/before-rotation"));
    assert!(
        !rotated.contains("/after-rotation"),
        "written to the rotated file: {rotated}"
    );
    assert!(
        d.error_log().contains("reopening logs"),
        "{}",
        d.error_log()
    );
}

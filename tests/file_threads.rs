//! The file pool (`file_threads`): static files not in the open-file cache are
//! opened and read by a worker's threads while its event loop serves the other
//! connections. Files come back byte-exact whatever their size, with ranges, HEAD,
//! 404s and index files; a file stuck in the file system holds only the requests for
//! it (HTTP/1.1 connections and HTTP/2 streams alike); a queue fuller than the
//! threads take makes requests wait, never fail; `file_threads: 0` opens files on the
//! loop as before; reloads and an upgrade with the pool on fail no request.
//!
//! A stuck file is a debug-build seam of the pool (`file_pool/threads.rs`): a job for
//! `forkd-test-gate-*` first opens `<file>.gate`, a FIFO, which blocks until the test
//! opens it for writing. Nothing here depends on timing.

mod support;

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use support::h2client::H2Client;
use support::*;

/// Sizes around the open-file cache's memory limit (64 KiB: held in memory up to
/// it, `sendfile` above) and the output batch.
const SIZES: &[usize] = &[0, 1, 1024, 65535, 65536, 65537, 300 * 1024];

fn sized(n: usize) -> String {
    format!("/sized/{n}.bin")
}

fn with_sized_files(mut b: Builder) -> Builder {
    for (i, &n) in SIZES.iter().enumerate() {
        b = b.file(sized(n).trim_start_matches('/'), &noise(n, i as u64 + 1));
    }
    b.file("dir/index.html", b"<p>the directory's index</p>\n")
}

fn total(d: &TestDaemon, key: &str) -> u64 {
    let stats = stats_json(&d.config);
    stats["totals"][key]
        .as_u64()
        .unwrap_or_else(|| panic!("no totals.{key} in {stats}"))
}

fn request(path: &str, method: &str, extra: &str) -> Vec<u8> {
    format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\n{extra}\r\n").into_bytes()
}

/// Every file and answer a static route gives, checked byte for byte on one
/// keep-alive connection (each file asked twice: through the pool, then from the
/// cache).
fn assert_site_served(d: &TestDaemon) {
    let mut c = Conn::connect(d.port).unwrap();
    for round in 0..2 {
        for (i, &n) in SIZES.iter().enumerate() {
            let body = noise(n, i as u64 + 1);
            let r = c.exchange(&request(&sized(n), "GET", "")).unwrap();
            assert_eq!(r.status, 200, "round {round}, {n} bytes: {}", r.head);
            assert!(
                r.body == body,
                "round {round}: {n} bytes came back different"
            );
            if n > 20 {
                let r = c
                    .exchange(&request(&sized(n), "GET", "Range: bytes=10-19\r\n"))
                    .unwrap();
                assert_eq!(r.status, 206, "{}", r.head);
                assert_eq!(r.body, &body[10..20]);
            }
            let head = request(&sized(n), "HEAD", "");
            c.send(&head).unwrap();
            let r = c.read_head().unwrap();
            assert_eq!(r.status, 200);
            assert_eq!(r.content_length().unwrap(), n);
        }
        let r = c.exchange(&request("/missing.txt", "GET", "")).unwrap();
        assert_eq!(r.status, 404);
        let r = c.exchange(&request("/dir", "GET", "")).unwrap();
        assert_eq!(r.status, 301);
        assert_eq!(r.header("Location"), Some("/dir/"));
        let r = c.exchange(&request("/dir/", "GET", "")).unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.body, b"<p>the directory's index</p>\n");
    }
}

#[test]
fn files_come_back_byte_exact_through_the_pool() {
    let d = with_sized_files(TestDaemon::builder().top("file_threads: 2,")).start();
    assert_site_served(&d);
    // Each file once through the pool (the second round is the cache's), plus the
    // missing file and the directory's answers.
    let jobs = total(&d, "file_jobs");
    assert!(jobs >= SIZES.len() as u64, "file_jobs {jobs}");
    d.assert_log_clean();
}

#[test]
fn file_threads_0_opens_files_on_the_loop() {
    let d = with_sized_files(TestDaemon::builder().top("file_threads: 0,")).start();
    assert_site_served(&d);
    assert_eq!(total(&d, "file_jobs"), 0);
    d.assert_log_clean();
}

/// A FIFO at `<www>/<name>.gate`: the job for `name` waits until [`open_gate`].
fn make_gate(d: &TestDaemon, name: &str) -> std::path::PathBuf {
    let gate = d.www().join(format!("{name}.gate"));
    nix::unistd::mkfifo(&gate, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
    gate
}

/// Lets the job blocked on `gate` go: opens it for writing (which needs the job to
/// have opened it for reading first) and closes it.
fn open_gate(gate: &Path) {
    let opened = wait_until(SETTLE, || {
        OpenOptions::new()
            .write(true)
            .custom_flags(nix::libc::O_NONBLOCK)
            .open(gate)
            .is_ok()
    });
    assert!(opened, "no file job opened {}", gate.display());
}

#[test]
fn a_stuck_file_holds_only_the_requests_for_it_and_a_full_queue_waits() {
    const COLD: usize = 40; // past the one thread's 16 queued jobs
    let mut b = TestDaemon::builder()
        .top("file_threads: 1,")
        .file("warm.txt", b"warm\n")
        .file("forkd-test-gate-a.txt", b"behind the gate\n");
    for i in 0..COLD {
        b = b.file(
            &format!("cold/{i}.txt"),
            format!("cold file {i}\n").as_bytes(),
        );
    }
    let d = b.start();
    let gate = make_gate(&d, "forkd-test-gate-a.txt");
    let mut warm = Conn::connect(d.port).unwrap();
    let r = warm.exchange(&request("/warm.txt", "GET", "")).unwrap();
    assert_eq!((r.status, r.body.as_slice()), (200, &b"warm\n"[..]));

    // Two requests for the stuck file: one job, the second joins it.
    let mut stuck: Vec<Conn> = (0..2).map(|_| Conn::connect(d.port).unwrap()).collect();
    stuck[0]
        .send(&request("/forkd-test-gate-a.txt", "GET", ""))
        .unwrap();
    stuck[1]
        .send(&request("/forkd-test-gate-a.txt", "GET", ""))
        .unwrap();
    assert!(
        wait_until(SETTLE, || total(&d, "file_jobs_joined") == 1),
        "the second request did not join the first one's job"
    );

    // The one thread is stuck: a cached file is still answered, on the loop.
    for _ in 0..3 {
        let r = warm.exchange(&request("/warm.txt", "GET", "")).unwrap();
        assert_eq!((r.status, r.body.as_slice()), (200, &b"warm\n"[..]));
    }

    // Cold files queue behind it, past what the thread's queue holds.
    let mut cold: Vec<Conn> = (0..COLD)
        .map(|i| {
            let mut c = Conn::connect(d.port).unwrap();
            c.send(&request(&format!("/cold/{i}.txt"), "GET", ""))
                .unwrap();
            c
        })
        .collect();
    // Each request went to the pool with all before it still under way (the stuck
    // job; the joiner counted 1): 1 + (1 + 2 + ... + COLD) jobs ahead in all.
    let expected = 1 + (COLD * (COLD + 1) / 2) as u64;
    assert!(
        wait_until(SETTLE, || total(&d, "file_queue_depth") == expected),
        "file_queue_depth {} (not every cold request waits behind the stuck file)",
        total(&d, "file_queue_depth")
    );
    assert_eq!(
        total(&d, "file_jobs"),
        1,
        "only the warm file's job is done"
    );

    open_gate(&gate);
    for c in &mut stuck {
        let r = c.response().unwrap();
        assert_eq!(
            (r.status, r.body.as_slice()),
            (200, &b"behind the gate\n"[..])
        );
    }
    for (i, c) in cold.iter_mut().enumerate() {
        let r = c.response().unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.body, format!("cold file {i}\n").as_bytes());
    }
    assert_eq!(total(&d, "file_jobs"), 2 + COLD as u64);
    assert!(total(&d, "file_wait_us") > 0);
    d.assert_log_clean();
}

#[test]
fn an_h2_stream_waits_for_its_file_while_another_stream_is_answered() {
    let big = noise(200 * 1024, 9);
    let d = TestDaemon::builder()
        .h2c()
        .top("file_threads: 1,")
        .file("warm.txt", b"warm\n")
        .file("forkd-test-gate-h2.bin", &big)
        .start();
    let gate = make_gate(&d, "forkd-test-gate-h2.bin");
    let mut c = H2Client::connect(d.port);
    let r = c.request("GET", "/warm.txt", &[], None).unwrap();
    assert_eq!((r.status, r.body.as_slice()), (200, &b"warm\n"[..]));

    let stuck = c.start("GET", "/forkd-test-gate-h2.bin");
    // The same connection's other streams are answered while that one waits.
    for _ in 0..3 {
        let r = c.request("GET", "/warm.txt", &[], None).unwrap();
        assert_eq!((r.status, r.body.as_slice()), (200, &b"warm\n"[..]));
    }
    let r = c.request("GET", "/healthz", &[], None).unwrap();
    assert_eq!(r.status, 200);

    open_gate(&gate);
    let r = c.finish(stuck).unwrap();
    assert_eq!(r.status, 200);
    assert!(r.body == big, "{} bytes, not the file's", r.body.len());
    let r = c
        .request("GET", "/forkd-test-gate-h2.bin", &[], None)
        .unwrap();
    assert!(r.body == big, "from the cache: {} bytes", r.body.len());
    d.assert_log_clean();
}

#[test]
fn reloads_and_an_upgrade_with_the_pool_on_fail_no_request() {
    let scenario = "file_threads: reloads and an upgrade";
    let mut d = load_site(TestDaemon::builder().workers(2).own_binary())
        .top(r#"file_threads: 2, drain_timeout: "5s","#)
        .prepare();
    let cmd = d.command();
    let pid = d.spawn(cmd);
    d.wait_serving(pid);
    let load = Load::start(d.port);
    load.wait_for(300);
    for round in 1..=5 {
        // Each reload empties the workers' file caches: the load's files go through
        // the pool again.
        d.builder.server = format!("keepalive_requests: {},", 1000 + round);
        let (code, out, err) = d.reload();
        assert_eq!(code, 0, "reload {round}: {out}{err}");
        load.wait_for(200);
    }
    let config = d.config.clone();
    let r = d.ctl_with(&config, &["-s", "upgrade"]);
    assert_eq!(r.code, 0, "upgrade: {r:?}\n{}", d.error_log());
    let new = d.master().expect("a pid file after the upgrade");
    d.adopt_master(new);
    d.wait_serving(new);
    load.wait_for(300);
    let report = load.stop();
    report.assert_clean(scenario, 0);
    assert!(total(&d, "file_jobs") > 0);
    d.stop_master();
    d.assert_log_clean();
}

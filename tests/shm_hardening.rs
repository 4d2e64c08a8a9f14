//! End-to-end tests of the shared-memory region's hardening: readers that answer
//! (an error or data) when the region is left inconsistent instead of hanging, a fold
//! lock recovered from a dead holder, and "another master runs" decided by a lock on
//! the region file rather than by the pid written in it.
//!
//! The region is corrupted by writing its file (the same pages the daemon maps) at the
//! offsets of the layout, computed from the `forkd-shared` types.

mod support;

use forkd_shared::shm::layout::{Header, Layout};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use support::{wait_until, TestDaemon, BIN};

/// Long enough for a loaded 2-core machine; only a failing test waits this long.
const SETTLE: Duration = Duration::from_secs(30);

const ROUTES: &str = r#"(prefix: "/healthz", handler: Liveness),
            (prefix: "/status", handler: Status),
            (prefix: "/metrics", handler: Metrics),
            (prefix: "/", handler: Static(root: "www", index: ["index.html"])),"#;

fn header_offset(field: usize) -> u64 {
    (std::mem::offset_of!(Layout, header) + field) as u64
}

/// Writes `bytes` into the region file at `offset`.
fn poke(region: &Path, offset: u64, bytes: &[u8]) {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(region)
        .expect("open the region for writing");
    f.write_all_at(bytes, offset).expect("write the region");
}

/// A process that runs until killed: stands for a live process that is not forkd.
struct Sleeper(Child);

impl Sleeper {
    fn start() -> Sleeper {
        Sleeper(
            Command::new("sleep")
                .arg("600")
                .stdin(Stdio::null())
                .spawn()
                .expect("spawn sleep"),
        )
    }
    fn pid(&self) -> i32 {
        self.0.id() as i32
    }
    fn end(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        self.end();
    }
}

/// Runs `forkd ARGS...`, killing it (and failing) if it has not exited within SETTLE:
/// the point of these tests is that the commands end.
fn forkd_within(args: &[&str]) -> (ExitStatus, String, String) {
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run forkd");
    let deadline = Instant::now() + SETTLE;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            return (
                status,
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            );
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("forkd {args:?} hung for {SETTLE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------------
// Readers never hang
// ---------------------------------------------------------------------------------

/// A fold left half done: the count odd, the lock naming a process. While that
/// process runs (a live master, as far as anyone can tell) nobody may take the lock, so
/// the region stays inconsistent: `/status`, `/metrics` and `forkd stats` say so
/// instead of hanging, and the worker keeps serving. Once the holder is gone, the
/// master takes the lock over and the readings come back.
#[test]
fn readers_answer_while_the_region_is_left_mid_fold_and_recover_after() {
    let d = TestDaemon::builder().routes(ROUTES).start();
    let region = d.dir.path().join("forkd.shm");
    let config = d.config.to_str().unwrap().to_string();
    assert_eq!(d.get("/status").status, 200);

    let mut holder = Sleeper::start();
    // The lock first: the master repairs an odd count under a free lock.
    poke(
        &region,
        header_offset(std::mem::offset_of!(Header, fold_lock)),
        &(holder.pid() as u32).to_le_bytes(),
    );
    poke(
        &region,
        header_offset(std::mem::offset_of!(Header, fold_seq)),
        &1_000_001u64.to_le_bytes(),
    );

    let status = d.get("/status");
    assert_eq!(status.status, 503, "{}", status.body_str());
    assert!(
        status.body_str().contains("inconsistent"),
        "{}",
        status.body_str()
    );
    assert_eq!(status.header("Retry-After"), Some("1"));
    let error: serde_json::Value = serde_json::from_slice(&status.body).expect("JSON error");
    assert!(error["error"]
        .as_str()
        .unwrap()
        .contains("fold_seq 1000001"));
    let metrics = d.get("/metrics");
    assert_eq!(metrics.status, 503, "{}", metrics.body_str());
    // The worker that answered is not stuck.
    assert_eq!(d.get("/healthz").status, 200);
    assert_eq!(d.get("/index.html").status, 200);

    for args in [
        vec!["stats", "-c", config.as_str(), "--json"],
        vec!["stats", "-c", config.as_str()],
    ] {
        let (code, out, err) = forkd_within(&args);
        assert_eq!(code.code(), Some(1), "{args:?}: {out}{err}");
        assert!(err.contains("inconsistent"), "{args:?}: {err}");
        assert!(err.contains("giving up"), "{args:?}: {err}");
    }

    // The holder goes: the master takes the lock over and finishes the fold.
    holder.end();
    assert!(
        wait_until(SETTLE, || d.get("/status").status == 200),
        "the region stayed inconsistent after its lock holder died: {}",
        d.error_log()
    );
    let (code, out, err) = forkd_within(&["stats", "-c", &config, "--json"]);
    assert!(code.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["master"]["pid"].as_i64(), Some(d.pid() as i64));
    assert!(
        d.error_log().contains("took the fold lock over"),
        "{}",
        d.error_log()
    );
}

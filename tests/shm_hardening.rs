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
use support::{forkd_command, wait_until, TempDir, TestDaemon, BIN};

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

// ---------------------------------------------------------------------------------
// "Another master runs" is the region's lock, not the pid in its header
// ---------------------------------------------------------------------------------

/// Starts `forkd -c CONFIG` and waits until it serves `/healthz` on `port` and has
/// written its pid file.
fn start_forkd(config: &Path, port: u16) -> Child {
    let mut child = forkd_command(config).spawn().expect("spawn forkd");
    let dir = config.parent().unwrap();
    let served = wait_until(SETTLE, || {
        if child.try_wait().unwrap().is_some() {
            return true;
        }
        dir.join("forkd.pid").exists()
            && std::net::TcpStream::connect(("127.0.0.1", port)).is_ok_and(|mut s| {
                use std::io::{Read, Write};
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                let mut buf = [0u8; 12];
                s.write_all(b"GET /healthz HTTP/1.0\r\n\r\n").is_ok()
                    && s.read_exact(&mut buf).is_ok()
                    && &buf == b"HTTP/1.1 200"
            })
    });
    if let Some(status) = child.try_wait().unwrap() {
        let log = std::fs::read_to_string(dir.join("error.log")).unwrap_or_default();
        panic!("forkd exited during start-up ({status}):\n{log}");
    }
    assert!(served, "forkd did not serve within {SETTLE:?}");
    child
}

fn quit(mut child: Child) {
    support::signal(child.id() as i32, "QUIT");
    let stopped = wait_until(SETTLE, || child.try_wait().unwrap().is_some());
    if !stopped {
        let _ = child.kill();
    }
    let _ = child.wait();
    assert!(stopped, "forkd did not stop on QUIT");
}

/// After a crash the region's header names the crashed master, whose pid may by now
/// belong to an unrelated live process: that does not stop a start.
#[test]
fn a_region_naming_an_unrelated_live_process_does_not_stop_a_start() {
    let dir = TempDir::new();
    let builder = TestDaemon::builder().routes(ROUTES);
    builder.write_files(dir.path());
    let port = support::free_port();
    let config = dir.path().join("forkd.ron");
    std::fs::write(&config, builder.config_text(port)).unwrap();
    let unrelated = Sleeper::start();
    // What a crashed master leaves, its pid since reused.
    drop(
        forkd_shared::shm::Region::create(&dir.path().join("forkd.shm"), unrelated.pid(), None)
            .unwrap(),
    );

    // Nor does it make the crashed master look running.
    let (code, out, err) = forkd_within(&["stats", "-c", config.to_str().unwrap(), "--json"]);
    assert!(code.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["master"]["pid"].as_i64(), Some(unrelated.pid() as i64));
    assert_eq!(v["master"]["alive"], false, "{v:#}");

    let forkd = start_forkd(&config, port);
    let (code, out, err) = forkd_within(&["stats", "-c", config.to_str().unwrap(), "--json"]);
    assert!(code.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["master"]["pid"].as_i64(), Some(forkd.id() as i64));
    assert_eq!(v["master"]["alive"], true);
    quit(forkd);
}

/// A second instance configured with the same `shm_file` is refused while the first
/// runs, even when the header names a process that is gone: the first one's region
/// is neither replaced nor shared.
#[test]
fn a_second_master_is_refused_while_the_first_runs_whatever_its_header_says() {
    let d = TestDaemon::builder().routes(ROUTES).start();
    let shm = d.dir.path().join("forkd.shm");
    let gone = {
        let mut c = Command::new("true").spawn().unwrap();
        let pid = c.id() as i32;
        c.wait().unwrap();
        pid
    };
    poke(
        &shm,
        header_offset(std::mem::offset_of!(Header, master_pid)),
        &gone.to_le_bytes(),
    );
    let inode = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&shm).unwrap());

    let other = TempDir::new();
    let config2 = support::second_master_config(other.path(), &shm);
    let (status, _, err) = forkd_within(&["-c", config2.to_str().unwrap()]);
    let log = std::fs::read_to_string(other.path().join("error.log")).unwrap_or_default();
    assert!(!status.success(), "the second master ran beside the first");
    assert!(
        format!("{err}{log}").contains("in use by the forkd master"),
        "stderr: {err}\nerror log: {log}"
    );
    assert!(!other.path().join("second.pid").exists());

    // The first one keeps its region and keeps counting in it.
    assert_eq!(
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&shm).unwrap()),
        inode,
        "the region file was replaced"
    );
    let before = d.get("/status");
    assert_eq!(before.status, 200);
    let requests = |r: &support::Response| {
        serde_json::from_slice::<serde_json::Value>(&r.body).unwrap()["totals"]["requests"]
            .as_u64()
            .unwrap()
    };
    let n = requests(&before);
    assert!(
        wait_until(SETTLE, || requests(&d.get("/status")) > n),
        "the first master stopped counting"
    );
}

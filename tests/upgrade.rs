//! Binary upgrade end to end (USR2 and `forkd -s upgrade`), nginx's manual flow (WINCH,
//! HUP), systemd integration (sd_notify, socket activation, the unit files) and the
//! container deployment files, against the real binary.
//!
//! The upgrade tests run forkd from a copy of the binary in their temp folder
//! (`<tmp>/bin/forkd`): a master execs whatever is at the path it was started from, so
//! a test can put a broken "new binary" there. The harness always starts
//! `support::BIN`, so this file has its own small start/wait/stop helpers.

mod support;

use nix::sys::signal::{kill, Signal};
use nix::sys::socket::{recv, MsgFlags};
use nix::unistd::Pid;
use serde_json::Value;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use support::{alive, children_of, free_port, noise, wait_until, Builder, TempDir, BIN};

// ---------------------------------------------------------------------------------------
// Constants and the site
// ---------------------------------------------------------------------------------------

/// A small file, answered from the worker's cache.
const SMALL_PATH: &str = "/load.txt";
/// A file above the cache's memory limit: answered with `sendfile`, so responses are
/// in flight for longer while a master hands over.
const BIG_PATH: &str = "/big.bin";
/// Below the `Static` route: the body is read, then answered 405.
const POST_PATH: &str = "/upload";
const POST_BODY_LEN: usize = 2048;

/// Per-read/per-write timeout of the load client: a request without progress for this
/// long failed.
const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// No load runs longer than this, whatever the test does.
const LOAD_HARD_CAP: Duration = Duration::from_secs(180);
/// Upper bound for what normally takes well under a second (a busy 2-core machine).
const SETTLE: Duration = Duration::from_secs(20);
/// How much later than `upgrade_timeout` a rollback may be reported by `-s upgrade`.
const ROLLBACK_MARGIN: Duration = Duration::from_secs(5);

/// Environment variables of the upgrade/systemd protocols: never inherited by accident.
const PROTOCOL_ENV: [&str; 7] = [
    "LISTEN_PID",
    "LISTEN_FDS",
    "LISTEN_FDNAMES",
    "NOTIFY_SOCKET",
    "FORKD_LISTENERS",
    "FORKD_READY_FD",
    "FORKD_UPGRADE_FROM",
];

fn small_body() -> &'static [u8] {
    static BODY: OnceLock<Vec<u8>> = OnceLock::new();
    BODY.get_or_init(|| {
        (0..40)
            .map(|i| format!("line {i:02} of the upgrade load file: jumps over the lazy dog\n"))
            .collect::<String>()
            .into_bytes()
    })
}

fn big_body() -> &'static [u8] {
    static BODY: OnceLock<Vec<u8>> = OnceLock::new();
    BODY.get_or_init(|| noise(150 * 1024, 7))
}

fn post_body() -> &'static [u8] {
    static BODY: OnceLock<Vec<u8>> = OnceLock::new();
    BODY.get_or_init(|| noise(POST_BODY_LEN, 9))
}

/// The harness's default site (liveness, readiness, static `www`) with the load files,
/// `workers` workers, `accept` mode and extra top-level keys.
fn site(workers: usize, accept: &'static str, top: &str) -> Builder {
    Builder::default()
        .workers(workers)
        .accept(accept)
        .top(top)
        .file("load.txt", small_body())
        .file("big.bin", big_body())
}

// ---------------------------------------------------------------------------------------
// A forkd run from a copy of the binary in its temp folder
// ---------------------------------------------------------------------------------------

/// What `forkd -c CONFIG ARGS...` answered.
#[derive(Debug)]
struct Ctl {
    code: i32,
    out: String,
    err: String,
    took: Duration,
}

struct Server {
    dir: TempDir,
    port: u16,
    workers: usize,
    /// The configuration file the masters run with (absolute).
    config: PathBuf,
    /// The first master, our child (later masters are children of their predecessor).
    first: Option<Child>,
    /// Every master seen, for the cleanup.
    masters: Vec<i32>,
}

impl Server {
    /// Writes the site, the config (on `port`) and `<tmp>/bin/forkd`; starts nothing.
    fn new(builder: Builder, port: u16) -> Server {
        let dir = TempDir::new();
        builder.write_files(dir.path());
        std::fs::create_dir_all(dir.path().join("bin")).unwrap();
        copy_executable(Path::new(BIN), &dir.path().join("bin/forkd"));
        let config = dir.path().join("forkd.ron");
        std::fs::write(&config, builder.config_text(port)).unwrap();
        Server {
            dir,
            port,
            workers: builder.workers,
            config,
            first: None,
            masters: Vec::new(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn bin(&self) -> PathBuf {
        self.path("bin/forkd")
    }

    fn pid_file(&self) -> PathBuf {
        self.path("forkd.pid")
    }

    fn oldbin(&self) -> PathBuf {
        self.path("forkd.pid.oldbin")
    }

    fn shm(&self) -> PathBuf {
        self.path("forkd.shm")
    }

    fn error_log(&self) -> String {
        std::fs::read_to_string(self.path("error.log")).unwrap_or_default()
    }

    /// `<tmp>/bin/forkd -c CONFIG`, stderr to `<tmp>/stderr.txt`, no protocol variables.
    fn command(&self) -> Command {
        let mut cmd = Command::new(self.bin());
        cmd.arg("-c").arg(&self.config);
        self.plumb(&mut cmd);
        cmd
    }

    fn plumb(&self, cmd: &mut Command) {
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path("stderr.txt"))
            .unwrap();
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(stderr));
        for name in PROTOCOL_ENV {
            cmd.env_remove(name);
        }
    }

    /// Spawns `cmd` (which must become the master itself, by exec) as the first master.
    fn spawn(&mut self, mut cmd: Command) -> i32 {
        let child = cmd.spawn().expect("spawn forkd");
        let pid = child.id() as i32;
        self.first = Some(child);
        self.masters.push(pid);
        pid
    }

    /// Starts `<tmp>/bin/forkd -c CONFIG` and waits until it serves; its pid.
    fn start(&mut self) -> i32 {
        let cmd = self.command();
        let pid = self.spawn(cmd);
        self.wait_serving(pid);
        pid
    }

    /// The pid the pid file names.
    fn master(&self) -> Option<i32> {
        std::fs::read_to_string(self.pid_file())
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Reaps the first master once it has exited (it stays a zombie otherwise).
    fn reap_first(&mut self) {
        if let Some(c) = self.first.as_mut() {
            if let Ok(Some(_)) = c.try_wait() {
                self.first = None;
            }
        }
    }

    /// Waits until the pid file names `pid`, it has all its workers, and /healthz
    /// answers 200.
    fn wait_serving(&mut self, pid: i32) {
        let deadline = Instant::now() + SETTLE;
        loop {
            if let Some(c) = self.first.as_mut().filter(|c| c.id() as i32 == pid) {
                if let Some(status) = c.try_wait().unwrap() {
                    self.first = None;
                    panic!(
                        "master {pid} exited while starting ({status}); stderr:\n{}\nerror log:\n{}",
                        std::fs::read_to_string(self.path("stderr.txt")).unwrap_or_default(),
                        self.error_log()
                    );
                }
            }
            if self.master() == Some(pid)
                && alive(pid)
                && children_of(pid).len() == self.workers
                && workers_serving(&self.shm(), &children_of(pid))
                && status_of(self.port, "/healthz") == Some(200)
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "master {pid} not serving within {SETTLE:?}: pid file names {:?}, children {:?}; error log:\n{}",
                self.master(),
                children_of(pid),
                self.error_log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Runs `forkd -c CONFIG ARGS...` (the real binary: the copy may be a script).
    fn ctl(&self, config: &Path, args: &[&str]) -> Ctl {
        let started = Instant::now();
        let mut cmd = Command::new(BIN);
        cmd.arg("-c").arg(config).args(args).stdin(Stdio::null());
        for name in PROTOCOL_ENV {
            cmd.env_remove(name);
        }
        let out = cmd.output().expect("run forkd");
        Ctl {
            code: out.status.code().unwrap_or(-1),
            out: String::from_utf8_lossy(&out.stdout).into_owned(),
            err: String::from_utf8_lossy(&out.stderr).into_owned(),
            took: started.elapsed(),
        }
    }

    /// Puts an executable script at `<tmp>/bin/forkd` (written aside, renamed over it).
    fn install_script(&self, script: &str) {
        let source = self.path("script.src");
        std::fs::write(&source, script).unwrap();
        let tmp = self.path("bin/.forkd.new");
        copy_executable(&source, &tmp);
        std::fs::rename(&tmp, self.bin()).unwrap();
    }

    /// Puts the real binary back at `<tmp>/bin/forkd`.
    fn install_real_binary(&self) {
        let tmp = self.path("bin/.forkd.new");
        copy_executable(Path::new(BIN), &tmp);
        std::fs::rename(&tmp, self.bin()).unwrap();
    }

    /// Graceful stop (QUIT) of the master the pid file names; waits until it and its
    /// workers are gone.
    fn stop(&mut self) {
        let pid = self.master().expect("a pid file to stop by");
        let workers = children_of(pid);
        kill(Pid::from_raw(pid), Signal::SIGQUIT).unwrap();
        let gone = wait_until(SETTLE, || {
            self.reap_first();
            !alive(pid) && workers.iter().all(|&w| !alive(w))
        });
        assert!(
            gone,
            "master {pid} or its workers {workers:?} still running {SETTLE:?} after QUIT"
        );
        assert!(
            !self.pid_file().exists(),
            "the pid file outlived the master"
        );
    }

    /// No alert, crit or emerg in the error log.
    fn assert_log_clean(&self) {
        let log = self.error_log();
        for bad in ["[alert]", "[crit]", "[emerg]"] {
            assert!(
                !log.contains(bad),
                "unexpected {bad} in the error log:\n{log}"
            );
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let config = self.config.to_string_lossy().into_owned();
        let ours = |pid: i32| {
            alive(pid)
                && std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&config))
        };
        let masters: Vec<i32> = self.masters.iter().copied().filter(|&p| ours(p)).collect();
        let mut descendants = Vec::new();
        for &m in &masters {
            collect_descendants(m, &mut descendants);
        }
        for &m in &masters {
            let _ = kill(Pid::from_raw(m), Signal::SIGQUIT);
        }
        wait_until(Duration::from_secs(10), || {
            self.reap_first();
            masters.iter().all(|&m| !alive(m))
        });
        for &p in masters.iter().chain(&descendants) {
            if alive(p) {
                let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
            }
        }
        if let Some(mut c) = self.first.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Copies `from` to `to` (mode 755) with `cp`, so that no descriptor open for writing on
/// `to` ever exists in this multi-threaded process: a child another test thread forks
/// meanwhile would inherit it until its exec, and exec'ing `to` would then fail with
/// ETXTBSY ("Text file busy").
fn copy_executable(from: &Path, to: &Path) {
    let status = Command::new("cp")
        .arg(from)
        .arg(to)
        .stdin(Stdio::null())
        .status()
        .expect("run cp");
    assert!(status.success(), "cp {} {}", from.display(), to.display());
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn collect_descendants(pid: i32, out: &mut Vec<i32>) {
    for c in children_of(pid) {
        out.push(c);
        collect_descendants(c, out);
    }
}

// ---------------------------------------------------------------------------------------
// A small HTTP/1.1 client that reports failures instead of panicking
// ---------------------------------------------------------------------------------------

struct Resp {
    status: u16,
    /// The server said `Connection: close`.
    closes: bool,
    body: Vec<u8>,
}

struct Conn {
    s: TcpStream,
    buf: Vec<u8>,
    /// Requests sent on it, for failure reports.
    sent: u64,
}

impl Conn {
    fn open(port: u16) -> Result<Conn, String> {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let s =
            TcpStream::connect_timeout(&addr, IO_TIMEOUT).map_err(|e| format!("connect: {e}"))?;
        s.set_read_timeout(Some(IO_TIMEOUT))
            .map_err(|e| format!("setsockopt: {e}"))?;
        s.set_write_timeout(Some(IO_TIMEOUT))
            .map_err(|e| format!("setsockopt: {e}"))?;
        let _ = s.set_nodelay(true);
        Ok(Conn {
            s,
            buf: Vec::new(),
            sent: 0,
        })
    }

    fn send(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.sent += 1;
        self.s.write_all(bytes).map_err(|e| format!("write: {e}"))
    }

    /// Where a failed request was, for the report (and, if the connection is still
    /// open, which process holds the server's end of it).
    fn describe(&self, since: Instant) -> String {
        let port = self.s.local_addr().map_or(0, |a| a.port());
        let server = self.s.peer_addr().map_or(0, |a| a.port());
        format!(
            "request {} on the connection from port {port}, {} ms after it began; server side: {}",
            self.sent,
            since.elapsed().as_millis(),
            server_side(server, port)
        )
    }

    /// One read into the buffer; EOF, errors and timeouts are failures.
    fn fill(&mut self, what: &str) -> Result<(), String> {
        let mut chunk = [0u8; 16 * 1024];
        let read = loop {
            match self.s.read(&mut chunk) {
                // A signal to this process is no failure of the server.
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                other => break other,
            }
        };
        match read {
            Ok(0) => Err(format!(
                "connection closed {what} ({} bytes of it)",
                self.buf.len()
            )),
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                Ok(())
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                Err(format!("timed out {what} ({} bytes of it)", self.buf.len()))
            }
            Err(e) => Err(format!("{e} {what} ({} bytes of it)", self.buf.len())),
        }
    }

    /// Reads one complete response (forkd always sends a Content-Length).
    fn response(&mut self) -> Result<Resp, String> {
        let end = loop {
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break end;
            }
            if self.buf.len() > 64 * 1024 {
                return Err("response head over 64 KiB".into());
            }
            self.fill("before a complete response head")?;
        };
        let head: Vec<u8> = self.buf.drain(..end + 4).collect();
        let head = String::from_utf8_lossy(&head).into_owned();
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let status: u16 = status_line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("bad status line {status_line:?}"))?;
        let mut length = None;
        let mut closes = false;
        for line in lines.filter(|l| !l.is_empty()) {
            let (name, value) = line
                .split_once(':')
                .ok_or_else(|| format!("bad header line {line:?}"))?;
            let value = value.trim();
            if name.eq_ignore_ascii_case("Content-Length") {
                length = Some(
                    value
                        .parse::<usize>()
                        .map_err(|e| format!("bad Content-Length {value:?}: {e}"))?,
                );
            } else if name.eq_ignore_ascii_case("Connection") {
                closes = value.to_ascii_lowercase().contains("close");
            }
        }
        let length = length.ok_or_else(|| format!("status {status} without Content-Length"))?;
        while self.buf.len() < length {
            self.fill(&format!("in a body of {length} bytes"))?;
        }
        let rest = self.buf.split_off(length);
        let body = std::mem::replace(&mut self.buf, rest);
        Ok(Resp {
            status,
            closes,
            body,
        })
    }

    /// Before reusing a keep-alive connection: has the server closed it after its last
    /// complete response? (A non-blocking peek: no request is at stake yet.)
    fn closed_by_server(&self) -> Result<bool, String> {
        if !self.buf.is_empty() {
            return Err(format!(
                "{} unexpected bytes after a complete response",
                self.buf.len()
            ));
        }
        let mut byte = [0u8; 1];
        match recv(
            self.s.as_raw_fd(),
            &mut byte,
            MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
        ) {
            Ok(0) => Ok(true),
            Ok(_) => Err("unsolicited bytes from the server between requests".into()),
            Err(nix::errno::Errno::EAGAIN) => Ok(false),
            // A reset after a complete response: closed, no request was lost.
            Err(_) => Ok(true),
        }
    }
}

/// The state of the server's end of the connection `client_port` → `server_port`
/// (/proc/net/tcp) and the processes holding it, for failure reports.
fn server_side(server_port: u16, client_port: u16) -> String {
    let local = format!("0100007F:{server_port:04X}");
    let remote = format!("0100007F:{client_port:04X}");
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let Some(f) = table
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() > 9 && f[1] == local && f[2] == remote)
    else {
        return "gone".into();
    };
    let (state, queues, inode) = (f[3], f[4], f[9]);
    let link = format!("socket:[{inode}]");
    let mut holders = Vec::new();
    if inode != "0" {
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            if fd_links(pid).contains(&link) {
                holders.push(pid);
            }
        }
    }
    format!("state {state}, tx:rx queue {queues}, inode {inode}, held by {holders:?}")
}

fn get_request(path: &str, close: bool) -> Vec<u8> {
    let connection = if close { "Connection: close\r\n" } else { "" };
    format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{connection}\r\n").into_bytes()
}

/// GET `path` on a new connection; the response.
fn get(port: u16, path: &str) -> Result<Resp, String> {
    let mut c = Conn::open(port)?;
    c.send(&get_request(path, true))?;
    c.response()
}

/// The status of GET `path` on a new connection, or None (for polling).
fn status_of(port: u16, path: &str) -> Option<u16> {
    get(port, path).ok().map(|r| r.status)
}

fn check(r: &Resp, what: &str, status: u16, body: Option<&[u8]>) -> Result<(), String> {
    if r.status != status {
        return Err(format!(
            "{what}: status {} (want {status}): {:?}",
            r.status,
            String::from_utf8_lossy(&r.body[..r.body.len().min(120)])
        ));
    }
    if let Some(body) = body {
        if r.body != body {
            return Err(format!(
                "{what}: a body of {} bytes that differs from the expected {} bytes",
                r.body.len(),
                body.len()
            ));
        }
    }
    Ok(())
}

/// GET the small load file on a new connection, asserting the complete answer.
fn assert_serves(port: u16, context: &str) {
    let r = get(port, SMALL_PATH).unwrap_or_else(|e| panic!("{context}: GET {SMALL_PATH}: {e}"));
    check(&r, SMALL_PATH, 200, Some(small_body())).unwrap_or_else(|e| panic!("{context}: {e}"));
}

// ---------------------------------------------------------------------------------------
// The load client
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
enum Kind {
    /// GETs back to back on a persistent connection (every 8th for the big file).
    KeepAlive,
    /// One GET per new connection (`Connection: close`).
    NewConnection,
    /// POSTs with a body on a persistent connection (answered 405 after the body).
    Post,
}

#[derive(Default)]
struct Tally {
    keepalive: AtomicU64,
    new_connection: AtomicU64,
    post: AtomicU64,
    failed: AtomicU64,
    /// Keep-alive connections found closed by the server after a complete answer.
    server_closes: AtomicU64,
    reasons: Mutex<Vec<String>>,
}

impl Tally {
    fn ok(&self) -> u64 {
        self.keepalive.load(Ordering::SeqCst)
            + self.new_connection.load(Ordering::SeqCst)
            + self.post.load(Ordering::SeqCst)
    }
}

struct LoadReport {
    keepalive: u64,
    new_connection: u64,
    post: u64,
    failed: u64,
    server_closes: u64,
    reasons: Vec<String>,
    elapsed: Duration,
}

impl LoadReport {
    fn summary(&self) -> String {
        format!(
            "{} keep-alive GET, {} new-connection GET, {} POST ok; {} FAILED; in {:.1?} \
             ({} keep-alive connections closed by the server between requests); first \
             failures:\n  {}",
            self.keepalive,
            self.new_connection,
            self.post,
            self.failed,
            self.elapsed,
            self.server_closes,
            self.reasons.join("\n  ")
        )
    }

    fn assert_clean(&self, scenario: &str) {
        eprintln!("[{scenario}] load: {}", self.summary());
        assert!(
            self.failed == 0 && self.elapsed < LOAD_HARD_CAP,
            "{scenario}: {}",
            self.summary()
        );
        assert!(
            self.keepalive > 0 && self.new_connection > 0 && self.post > 0,
            "{scenario}: a kind of request never ran: {}",
            self.summary()
        );
    }
}

/// A few client threads until stopped: 2 keep-alive GET, 1 new-connection GET, 1 POST.
struct Load {
    stop: Arc<AtomicBool>,
    tally: Arc<Tally>,
    threads: Vec<JoinHandle<()>>,
    started: Instant,
}

impl Load {
    fn start(port: u16) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let tally = Arc::new(Tally::default());
        let started = Instant::now();
        let kinds = [
            Kind::KeepAlive,
            Kind::KeepAlive,
            Kind::NewConnection,
            Kind::Post,
        ];
        let threads = kinds
            .into_iter()
            .enumerate()
            .map(|(index, kind)| {
                let t = LoadThread {
                    port,
                    kind,
                    index,
                    stop: stop.clone(),
                    tally: tally.clone(),
                    started,
                };
                std::thread::Builder::new()
                    .name(format!("load-{index}"))
                    .spawn(move || t.run())
                    .unwrap()
            })
            .collect();
        Load {
            stop,
            tally,
            threads,
            started,
        }
    }

    fn ok(&self) -> u64 {
        self.tally.ok()
    }

    /// Waits until `more` more requests succeeded (at most `SETTLE`).
    fn wait_for(&self, more: u64) {
        let target = self.ok() + more;
        assert!(
            wait_until(SETTLE, || self.ok() >= target),
            "the load made no progress: {} ok, {} failed; first failures: {:?}",
            self.ok(),
            self.tally.failed.load(Ordering::SeqCst),
            self.tally.reasons.lock().unwrap()
        );
    }

    fn finish(mut self) -> LoadReport {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            t.join().expect("a load thread panicked");
        }
        let t = &self.tally;
        LoadReport {
            keepalive: t.keepalive.load(Ordering::SeqCst),
            new_connection: t.new_connection.load(Ordering::SeqCst),
            post: t.post.load(Ordering::SeqCst),
            failed: t.failed.load(Ordering::SeqCst),
            server_closes: t.server_closes.load(Ordering::SeqCst),
            reasons: t.reasons.lock().unwrap().clone(),
            elapsed: self.started.elapsed(),
        }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

struct LoadThread {
    port: u16,
    kind: Kind,
    index: usize,
    stop: Arc<AtomicBool>,
    tally: Arc<Tally>,
    started: Instant,
}

impl LoadThread {
    fn running(&self) -> bool {
        !self.stop.load(Ordering::SeqCst) && self.started.elapsed() < LOAD_HARD_CAP
    }

    fn fail(&self, reason: String) {
        self.tally.failed.fetch_add(1, Ordering::SeqCst);
        let mut reasons = self.tally.reasons.lock().unwrap();
        if reasons.len() < 12 {
            reasons.push(format!(
                "[+{} ms, thread {} {:?}] {reason}",
                self.started.elapsed().as_millis(),
                self.index,
                self.kind
            ));
        }
        drop(reasons);
        // Not a readiness wait: keeps a refusing server from being hammered in a loop.
        std::thread::sleep(Duration::from_millis(5));
    }

    fn run(self) {
        match self.kind {
            Kind::NewConnection => self.run_new_connections(),
            Kind::KeepAlive | Kind::Post => self.run_keepalive(),
        }
    }

    fn run_new_connections(&self) {
        let request = get_request(SMALL_PATH, true);
        while self.running() {
            let began = Instant::now();
            let result = Conn::open(self.port).and_then(|mut c| {
                c.send(&request)?;
                let r = c
                    .response()
                    .map_err(|e| format!("{e} [{}]", c.describe(began)))?;
                check(&r, SMALL_PATH, 200, Some(small_body()))?;
                // Let the server close first (no TIME_WAIT piles up on our ports); what
                // happens after a complete response is no failed request.
                let _ = c.s.set_read_timeout(Some(Duration::from_secs(2)));
                let _ = c.s.read(&mut [0u8; 64]);
                Ok(())
            });
            match result {
                Ok(()) => {
                    self.tally.new_connection.fetch_add(1, Ordering::SeqCst);
                }
                Err(reason) => self.fail(reason),
            }
        }
    }

    fn run_keepalive(&self) {
        let get_small = get_request(SMALL_PATH, false);
        let get_big = get_request(BIG_PATH, false);
        let mut post = format!(
            "POST {POST_PATH} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nContent-Length: {POST_BODY_LEN}\r\n\r\n"
        )
        .into_bytes();
        post.extend_from_slice(post_body());
        let mut conn: Option<Conn> = None;
        // Every 8th GET is for the big file.
        let mut n: u64 = 0;
        while self.running() {
            if let Some(c) = &conn {
                match c.closed_by_server() {
                    Ok(false) => {}
                    Ok(true) => {
                        self.tally.server_closes.fetch_add(1, Ordering::SeqCst);
                        conn = None;
                    }
                    Err(reason) => {
                        self.fail(reason);
                        conn = None;
                        continue;
                    }
                }
            }
            if conn.is_none() {
                match Conn::open(self.port) {
                    Ok(c) => conn = Some(c),
                    Err(reason) => {
                        self.fail(reason);
                        continue;
                    }
                }
            }
            let c = conn.as_mut().unwrap();
            n = (n + 1) % 8;
            let began = Instant::now();
            let result = match self.kind {
                Kind::Post => c
                    .send(&post)
                    .and_then(|()| c.response())
                    .and_then(|r| check(&r, POST_PATH, 405, None).map(|()| r)),
                _ if n == 0 => c
                    .send(&get_big)
                    .and_then(|()| c.response())
                    .and_then(|r| check(&r, BIG_PATH, 200, Some(big_body())).map(|()| r)),
                _ => c
                    .send(&get_small)
                    .and_then(|()| c.response())
                    .and_then(|r| check(&r, SMALL_PATH, 200, Some(small_body())).map(|()| r)),
            };
            match result {
                Ok(r) => {
                    let counter = match self.kind {
                        Kind::Post => &self.tally.post,
                        _ => &self.tally.keepalive,
                    };
                    counter.fetch_add(1, Ordering::SeqCst);
                    if r.closes {
                        conn = None;
                    }
                }
                Err(reason) => {
                    self.fail(format!("{reason} [{}]", c.describe(began)));
                    conn = None;
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Stats: `forkd stats --json` totals
// ---------------------------------------------------------------------------------------

/// `totals.requests` of `forkd stats --shm SHM --json` (by region path: the config
/// file may be broken on purpose while this runs).
fn total_requests(shm: &Path) -> Result<u64, String> {
    let out = Command::new(BIN)
        .arg("stats")
        .arg("--shm")
        .arg(shm)
        .arg("--json")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("run forkd stats: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "forkd stats --json failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let json: Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("forkd stats --json is not JSON: {e}"))?;
    json["totals"]["requests"]
        .as_u64()
        .ok_or_else(|| format!("no totals.requests in {json}"))
}

/// Whether the stats region shows every one of `workers` in state "serving" (what
/// the master waits for before it counts as started; it ignores USR2 until then).
fn workers_serving(shm: &Path, workers: &[i32]) -> bool {
    let Ok(out) = Command::new(BIN)
        .arg("stats")
        .arg("--shm")
        .arg(shm)
        .arg("--json")
        .stdin(Stdio::null())
        .output()
    else {
        return false;
    };
    let Ok(json) = serde_json::from_slice::<Value>(&out.stdout) else {
        return false;
    };
    let rows = json["workers"].as_array().cloned().unwrap_or_default();
    workers.iter().all(|&w| {
        rows.iter().any(|r| {
            r["pid"].as_i64() == Some(i64::from(w)) && r["state"].as_str() == Some("serving")
        })
    })
}

/// Samples `totals.requests` in the background: it must never go backwards, and never
/// be below the requests the load client has completed (each was counted before its
/// response was sent).
struct StatsWatch {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<(u64, Vec<String>)>>,
}

impl StatsWatch {
    fn start(shm: PathBuf, tally: Arc<Tally>) -> StatsWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let (mut samples, mut last, mut problems) = (0u64, 0u64, Vec::new());
            while !flag.load(Ordering::SeqCst) {
                let completed = tally.ok();
                match total_requests(&shm) {
                    Ok(total) => {
                        if total < last {
                            problems.push(format!(
                                "sample {samples}: totals.requests went back from {last} to {total}"
                            ));
                        }
                        if total < completed {
                            problems.push(format!(
                                "sample {samples}: totals.requests {total} is below the {completed} requests the client completed before the sample"
                            ));
                        }
                        last = last.max(total);
                    }
                    Err(e) => problems.push(format!("sample {samples}: {e}")),
                }
                samples += 1;
                // A sampling interval, not a readiness wait.
                std::thread::sleep(Duration::from_millis(50));
            }
            (samples, problems)
        });
        StatsWatch {
            stop,
            handle: Some(handle),
        }
    }

    fn assert_clean(mut self, scenario: &str) {
        self.stop.store(true, Ordering::SeqCst);
        let (samples, problems) = self.handle.take().unwrap().join().unwrap();
        eprintln!(
            "[{scenario}] stats: {samples} samples, {} problems",
            problems.len()
        );
        assert!(samples > 0, "{scenario}: no stats sample was taken");
        assert!(
            problems.is_empty(),
            "{scenario}: {} of {samples} stats samples wrong; first:\n  {}",
            problems.len(),
            problems
                .iter()
                .take(10)
                .cloned()
                .collect::<Vec<_>>()
                .join("\n  ")
        );
    }
}

impl Drop for StatsWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

// ---------------------------------------------------------------------------------------
// Upgrade steps
// ---------------------------------------------------------------------------------------

/// `forkd -c CLI_CONFIG -s upgrade` that must succeed: exit 0 naming the new master,
/// the pid file names it, the old master and its workers go, `.oldbin` goes, and the
/// new master serves with all its workers. Returns the new master.
fn good_upgrade(srv: &mut Server, cli_config: &Path, what: &str) -> i32 {
    let old = srv.master().expect("a pid file before the upgrade");
    let old_workers = children_of(old);
    assert_eq!(
        old_workers.len(),
        srv.workers,
        "{what}: master {old} before the upgrade has children {old_workers:?}"
    );
    let r = srv.ctl(cli_config, &["-s", "upgrade"]);
    assert_eq!(
        r.code,
        0,
        "{what}: forkd -s upgrade: {r:?}\nerror log:\n{}",
        srv.error_log()
    );
    let new = srv.master().expect("a pid file after the upgrade");
    srv.masters.push(new);
    assert_ne!(new, old, "{what}: the pid file still names the old master");
    assert!(
        r.out
            .starts_with(&format!("forkd: upgraded: master {new} serves")),
        "{what}: forkd -s upgrade said {:?}, the pid file names {new}",
        r.out
    );
    let gone = wait_until(SETTLE, || {
        srv.reap_first();
        !alive(old) && old_workers.iter().all(|&w| !alive(w))
    });
    assert!(
        gone,
        "{what}: the old master {old} (alive: {}) or its workers {old_workers:?} (alive: {:?}) still run {SETTLE:?} after the upgrade",
        alive(old),
        old_workers.iter().filter(|&&w| alive(w)).collect::<Vec<_>>()
    );
    assert!(
        !srv.oldbin().exists(),
        "{what}: {} is left after the old master exited",
        srv.oldbin().display()
    );
    srv.wait_serving(new);
    let new_workers = children_of(new);
    assert!(
        new_workers.iter().all(|w| !old_workers.contains(w)),
        "{what}: new workers {new_workers:?} vs old {old_workers:?}"
    );
    new
}

/// `forkd -c CLI_CONFIG -s upgrade` that must fail and roll back within
/// `upgrade_timeout` + a margin: non-zero exit with every string of `reason` on
/// stderr, the pid file names the old master again, no `.oldbin`, the old master keeps
/// exactly its workers (the new master is gone) and serves.
fn failed_upgrade(
    srv: &mut Server,
    cli_config: &Path,
    upgrade_timeout: Duration,
    reason: &[&str],
    what: &str,
) {
    let old = srv.master().expect("a pid file before the upgrade");
    let mut workers = children_of(old);
    workers.sort_unstable();
    let r = srv.ctl(cli_config, &["-s", "upgrade"]);
    eprintln!("[{what}] forkd -s upgrade: {r:?}");
    assert_ne!(
        r.code,
        0,
        "{what}: forkd -s upgrade succeeded: {r:?}\nerror log:\n{}",
        srv.error_log()
    );
    assert!(
        r.err.contains("upgrade failed and was rolled back"),
        "{what}: stderr does not say it was rolled back: {r:?}"
    );
    for part in reason {
        assert!(
            r.err.contains(part),
            "{what}: stderr does not give the reason ({part:?}): {r:?}"
        );
    }
    assert!(
        r.took <= upgrade_timeout + ROLLBACK_MARGIN,
        "{what}: the rollback took {:?} (upgrade_timeout {upgrade_timeout:?} + {ROLLBACK_MARGIN:?})",
        r.took
    );
    assert_eq!(
        srv.master(),
        Some(old),
        "{what}: the pid file is not restored"
    );
    assert!(
        !srv.oldbin().exists(),
        "{what}: {} is left after the rollback",
        srv.oldbin().display()
    );
    assert!(alive(old), "{what}: the old master {old} is gone");
    let settled = wait_until(SETTLE, || {
        let mut now = children_of(old);
        now.sort_unstable();
        now == workers
    });
    assert!(
        settled,
        "{what}: master {old} has children {:?}, want exactly its workers {workers:?} (the new master stopped)",
        children_of(old)
    );
    assert_serves(srv.port, what);
}

// ---------------------------------------------------------------------------------------
// 1. Upgrades in a row under load
// ---------------------------------------------------------------------------------------

fn ten_upgrades_under_load(accept: &'static str) {
    let scenario = format!("10 upgrades, accept {accept}");
    let mut srv = Server::new(site(2, accept, r#"drain_timeout: "5s","#), free_port());
    let first = srv.start();
    let load = Load::start(srv.port);
    let watch = StatsWatch::start(srv.shm(), load.tally.clone());
    load.wait_for(200);
    let config = srv.config.clone();
    let mut masters = vec![first];
    let mut last_total = 0;
    for round in 1..=10 {
        let what = format!("{scenario}: upgrade {round}");
        let at = load.started.elapsed();
        let new = good_upgrade(&mut srv, &config, &what);
        eprintln!(
            "[{scenario}] upgrade {round} at +{} ms, done at +{} ms: master {new}",
            at.as_millis(),
            load.started.elapsed().as_millis()
        );
        assert!(!masters.contains(&new), "{what}: master {new} again");
        masters.push(new);
        // The new master's workers carry the load before the next upgrade.
        load.wait_for(100);
        let completed = load.ok();
        let total = total_requests(&srv.shm()).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(
            total >= last_total && total >= completed,
            "{what}: totals.requests {total}, after the previous upgrade {last_total}, completed by the client {completed}"
        );
        last_total = total;
    }
    let report = load.finish();
    watch.assert_clean(&scenario);
    report.assert_clean(&scenario);
    srv.stop();
    srv.assert_log_clean();
}

#[test]
fn ten_upgrades_under_load_fail_no_request_with_shared_accept() {
    ten_upgrades_under_load("Shared");
}

#[test]
fn ten_upgrades_under_load_fail_no_request_with_reuseport_accept() {
    ten_upgrades_under_load("ReusePort");
}

// ---------------------------------------------------------------------------------------
// 2. Failed upgrades roll back
// ---------------------------------------------------------------------------------------

#[test]
fn failed_upgrades_roll_back_under_load_and_a_good_one_follows() {
    let scenario = "failed upgrades";
    let top = r#"drain_timeout: "5s", upgrade_timeout: "1s","#;
    let port = free_port();
    let good_text = site(2, "Shared", top).config_text(port);
    let mut srv = Server::new(site(2, "Shared", top), port);
    // A second valid configuration naming the same pid_file and shm_file (relative to
    // the same folder), for `-s upgrade` while the master's own file is broken.
    let cli_config = srv.path("cli.ron");
    std::fs::write(&cli_config, &good_text).unwrap();
    let master = srv.start();
    let timeout = Duration::from_secs(1);
    let load = Load::start(port);
    load.wait_for(200);

    srv.install_script("#!/bin/sh\nexit 3\n");
    failed_upgrade(
        &mut srv,
        &cli_config,
        timeout,
        &["exited with code 3"],
        "a new binary that exits at once",
    );
    load.wait_for(100);

    srv.install_script("#!/bin/sh\nexec sleep 60\n");
    failed_upgrade(
        &mut srv,
        &cli_config,
        timeout,
        &["not ready within upgrade_timeout"],
        "a new binary that never says ready",
    );
    load.wait_for(100);

    srv.install_real_binary();
    let broken = good_text.replacen("(\n", "(\n    no_such_key: 1,\n", 1);
    assert_ne!(broken, good_text);
    std::fs::write(&srv.config, &broken).unwrap();
    let config_name = format!("{}:", srv.config.display());
    failed_upgrade(
        &mut srv,
        &cli_config,
        timeout,
        &[&config_name, "no_such_key"],
        "a configuration the new master rejects",
    );
    load.wait_for(100);
    assert_eq!(srv.master(), Some(master));

    // The final good upgrade, with room for a busy machine.
    std::fs::write(
        &srv.config,
        good_text.replace(r#"upgrade_timeout: "1s""#, r#"upgrade_timeout: "10s""#),
    )
    .unwrap();
    let config = srv.config.clone();
    let r = srv.ctl(&config, &["-s", "reload"]);
    assert_eq!(r.code, 0, "reload to upgrade_timeout 10s: {r:?}");
    let new = good_upgrade(&mut srv, &config, "the good upgrade after the failed ones");
    assert_ne!(new, master);
    load.wait_for(100);
    load.finish().assert_clean(scenario);
    srv.stop();
    srv.assert_log_clean();
}

// ---------------------------------------------------------------------------------------
// 3. nginx's manual flow: USR2 by kill, WINCH, HUP
// ---------------------------------------------------------------------------------------

#[test]
fn usr2_by_kill_hands_over_then_winch_parks_the_workers_and_hup_brings_them_back() {
    let mut srv = Server::new(site(2, "Shared", r#"drain_timeout: "5s","#), free_port());
    let old = srv.start();
    let old_workers = children_of(old);
    kill(Pid::from_raw(old), Signal::SIGUSR2).unwrap();
    // Asynchronous: the pid file moves to .oldbin, then names the new master once it
    // serves. `.oldbin` (if seen at all: it goes when the old master exits) names the
    // old master.
    let mut oldbin_seen = None;
    let handed_over = wait_until(SETTLE, || {
        if let Some(pid) = std::fs::read_to_string(srv.oldbin())
            .ok()
            .and_then(|t| t.trim().parse::<i32>().ok())
        {
            oldbin_seen = Some(pid);
        }
        srv.master().is_some_and(|p| p != old && alive(p))
    });
    assert!(
        handed_over,
        "no new master in the pid file {SETTLE:?} after USR2; error log:\n{}",
        srv.error_log()
    );
    let new = srv.master().unwrap();
    srv.masters.push(new);
    if let Some(pid) = oldbin_seen {
        assert_eq!(pid, old, ".oldbin named {pid}, not the old master {old}");
    }
    let gone = wait_until(SETTLE, || {
        srv.reap_first();
        !alive(old) && old_workers.iter().all(|&w| !alive(w))
    });
    assert!(gone, "the old master {old} or its workers still run");
    assert!(!srv.oldbin().exists(), ".oldbin left after the handover");
    srv.wait_serving(new);
    assert_serves(srv.port, "after USR2");

    // WINCH: the workers go and are not replaced; the master stays.
    let workers = children_of(new);
    kill(Pid::from_raw(new), Signal::SIGWINCH).unwrap();
    assert!(
        wait_until(SETTLE, || children_of(new).is_empty()),
        "workers of {new} still running after WINCH: {:?}",
        children_of(new)
    );
    assert!(workers.iter().all(|&w| !alive(w)));
    // Respawning is immediate, so half a second without a child means none comes.
    let respawned = wait_until(Duration::from_millis(500), || !children_of(new).is_empty());
    assert!(
        !respawned,
        "workers came back without HUP: {:?}",
        children_of(new)
    );
    assert!(alive(new), "the master exited after WINCH");
    assert_eq!(srv.master(), Some(new));

    // HUP: a full set of workers again, serving.
    kill(Pid::from_raw(new), Signal::SIGHUP).unwrap();
    srv.wait_serving(new);
    let back = children_of(new);
    assert!(
        back.iter().all(|w| !workers.contains(w)),
        "the same workers {back:?} after WINCH and HUP"
    );
    assert_serves(srv.port, "after WINCH and HUP");
    srv.stop();
    srv.assert_log_clean();
}

// ---------------------------------------------------------------------------------------
// 4. sd_notify
// ---------------------------------------------------------------------------------------

fn monotonic_usec() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).unwrap();
    t.tv_sec() as u64 * 1_000_000 + t.tv_nsec() as u64 / 1000
}

/// Reads datagrams from the notify socket, keeping the transcript for messages.
struct Notify {
    sock: UnixDatagram,
    transcript: Vec<String>,
}

impl Notify {
    fn next(&mut self, expecting: &str) -> String {
        let mut buf = [0u8; 4096];
        let received = loop {
            match self.sock.recv(&mut buf) {
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                other => break other,
            }
        };
        match received {
            Ok(n) => {
                let m = String::from_utf8_lossy(&buf[..n]).into_owned();
                self.transcript.push(m.clone());
                m
            }
            Err(e) => panic!(
                "no notification ({e}) while expecting {expecting}; so far: {:?}",
                self.transcript
            ),
        }
    }

    /// `RELOADING=1\nMONOTONIC_USEC=N` with N taken between `before` and now.
    fn expect_reloading(&mut self, before: u64) {
        let m = self.next("RELOADING=1");
        let after = monotonic_usec();
        let usec = m
            .strip_prefix("RELOADING=1\nMONOTONIC_USEC=")
            .filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|d| d.parse::<u64>().ok())
            .unwrap_or_else(|| {
                panic!(
                    "want RELOADING=1 and MONOTONIC_USEC=<digits>, got {m:?}; so far: {:?}",
                    self.transcript
                )
            });
        assert!(
            (before..=after).contains(&usec),
            "MONOTONIC_USEC={usec} is not CLOCK_MONOTONIC at the reload ({before}..={after})"
        );
    }
}

#[test]
fn sd_notify_messages_in_order_through_start_reloads_upgrade_and_stop() {
    let top = r#"drain_timeout: "5s","#;
    let port = free_port();
    let first_text = site(2, "Shared", top).config_text(port);
    let reloaded_text = site(2, "Shared", top)
        .server(r#"keepalive_timeout: "20s","#)
        .config_text(port);
    assert_ne!(first_text, reloaded_text);
    let mut srv = Server::new(site(2, "Shared", top), port);
    let sock_path = srv.path("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(SETTLE)).unwrap();
    let mut notify = Notify {
        sock,
        transcript: Vec::new(),
    };
    let mut cmd = srv.command();
    cmd.env("NOTIFY_SOCKET", &sock_path);
    let first = srv.spawn(cmd);
    srv.wait_serving(first);
    assert_eq!(notify.next("READY=1"), "READY=1\nSTATUS=serving");

    // A good reload: RELOADING=1, then READY=1 with the generation now in force.
    let config = srv.config.clone();
    std::fs::write(&config, &reloaded_text).unwrap();
    let before = monotonic_usec();
    let r = srv.ctl(&config, &["-s", "reload"]);
    assert_eq!(r.code, 0, "good reload: {r:?}");
    let generation: u64 = r
        .out
        .split("configuration generation ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|g| g.parse().ok())
        .unwrap_or_else(|| panic!("no generation in {:?}", r.out));
    notify.expect_reloading(before);
    assert_eq!(
        notify.next("READY=1 after the reload"),
        format!("READY=1\nSTATUS=serving configuration generation {generation}")
    );

    // A failed reload: RELOADING=1, then the error in STATUS= with READY=1. The CLI
    // reads a valid copy (same pid_file and shm_file) while the master's file is broken.
    let cli_config = srv.path("cli.ron");
    std::fs::write(&cli_config, &reloaded_text).unwrap();
    std::fs::write(
        &config,
        reloaded_text.replacen("(\n", "(\n    no_such_key: 1,\n", 1),
    )
    .unwrap();
    let before = monotonic_usec();
    let r = srv.ctl(&cli_config, &["-s", "reload"]);
    assert_ne!(r.code, 0, "a broken reload succeeded: {r:?}");
    assert!(r.err.contains("no_such_key"), "bad reload: {r:?}");
    notify.expect_reloading(before);
    let m = notify.next("STATUS=reload failed");
    assert!(
        m.starts_with(&format!("STATUS=reload failed: {}:", config.display()))
            && m.contains("no_such_key")
            && m.ends_with("\nREADY=1")
            && m.matches('\n').count() == 1,
        "want STATUS=reload failed: <the error>\\nREADY=1, got {m:?}"
    );

    // An upgrade: the new master sends MAINPID= with READY=1; the old one says nothing.
    std::fs::write(&config, &reloaded_text).unwrap();
    let new = good_upgrade(&mut srv, &config, "the upgrade under sd_notify");
    assert_eq!(
        notify.next("MAINPID="),
        format!("MAINPID={new}\nREADY=1\nSTATUS=serving (upgraded)")
    );

    // Stop: STOPPING=1, and nothing after it.
    srv.stop();
    assert_eq!(notify.next("STOPPING=1"), "STOPPING=1");
    notify.sock.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 4096];
    match notify.sock.recv(&mut buf) {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        other => panic!(
            "a notification after STOPPING=1: {:?}; transcript {:?}",
            other.map(|n| String::from_utf8_lossy(&buf[..n]).into_owned()),
            notify.transcript
        ),
    }
    srv.assert_log_clean();
}

// ---------------------------------------------------------------------------------------
// 5. Socket activation
// ---------------------------------------------------------------------------------------

/// `socket:[INODE]`, what /proc shows for a socket descriptor.
fn fd_link(pid: &str, fd: RawFd) -> String {
    std::fs::read_link(format!("/proc/{pid}/fd/{fd}"))
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

/// Every descriptor link of `pid`.
fn fd_links(pid: i32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| {
            dir.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .map(|l| l.to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// `socket:[INODE]` of every TCP socket listening on 127.0.0.1:`port` (/proc/net/tcp).
fn listening_sockets(port: u16) -> Vec<String> {
    let local = format!("0100007F:{port:04X}");
    std::fs::read_to_string("/proc/net/tcp")
        .unwrap()
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            (f.len() > 9 && f[1] == local && f[3] == "0A").then(|| format!("socket:[{}]", f[9]))
        })
        .collect()
}

/// forkd started the way systemd starts a socket-activated service: `listener` as fd 3,
/// `LISTEN_PID` (the forkd process itself unless `listen_pid` says otherwise),
/// `LISTEN_FDS=1`, `LISTEN_FDNAMES=http`.
fn activated_command(srv: &Server, listener: &TcpListener, listen_pid: Option<u32>) -> Command {
    let pid = match listen_pid {
        Some(p) => p.to_string(),
        None => "$$".to_string(),
    };
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(format!(
            r#"export LISTEN_PID={pid} LISTEN_FDS=1 LISTEN_FDNAMES=http; exec "$0" -c "$1""#
        ))
        .arg(srv.bin())
        .arg(&srv.config);
    srv.plumb(&mut cmd);
    let fd = listener.as_raw_fd();
    // The descriptor becomes fd 3 without close-on-exec in the child only, so it does
    // not leak into processes that other tests spawn meanwhile.
    // SAFETY: between fork and exec only async-signal-safe calls (dup2, fcntl) are made.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(fd, 3) < 0 || libc::fcntl(3, libc::F_SETFD, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd
}

#[test]
fn socket_activation_adopts_the_socket_from_systemd_instead_of_binding() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let inode = fd_link("self", listener.as_raw_fd());
    let mut srv = Server::new(site(2, "Shared", r#"drain_timeout: "5s","#), port);
    let cmd = activated_command(&srv, &listener, None);
    let master = srv.spawn(cmd);
    srv.wait_serving(master);
    assert!(
        srv.error_log().contains("(sockets from systemd)"),
        "the error log does not say the sockets came from systemd:\n{}",
        srv.error_log()
    );
    assert!(
        !srv.error_log().contains("LISTEN_FDS"),
        "LISTEN_FDS warnings:\n{}",
        srv.error_log()
    );
    // No socket of its own: the only listener on the port is ours, and the master
    // holds it.
    assert_eq!(
        listening_sockets(port),
        vec![inode.clone()],
        "listening sockets on port {port} (the test's is {inode})"
    );
    assert!(
        fd_links(master).contains(&inode),
        "master {master} does not hold {inode}: {:?}",
        fd_links(master)
    );
    // Our copy closed: forkd keeps serving on the adopted socket.
    drop(listener);
    for i in 0..5 {
        assert_serves(port, &format!("request {i} after the test closed its copy"));
    }
    assert_eq!(listening_sockets(port), vec![inode]);
    srv.stop();
    srv.assert_log_clean();
}

#[test]
fn socket_activation_for_another_pid_is_ignored_and_forkd_binds_itself() {
    // fd 3 listens on one port; the configuration names another.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let passed_port = listener.local_addr().unwrap().port();
    let inode = fd_link("self", listener.as_raw_fd());
    let port = free_port();
    let mut srv = Server::new(site(1, "Shared", r#"drain_timeout: "5s","#), port);
    let cmd = activated_command(&srv, &listener, Some(std::process::id()));
    let master = srv.spawn(cmd);
    srv.wait_serving(master);
    let log = srv.error_log();
    assert!(
        !log.contains("systemd") && !log.contains("LISTEN_FDS"),
        "LISTEN_FDS for another process was not ignored:\n{log}"
    );
    assert_serves(port, "on the port forkd bound itself");
    let own = listening_sockets(port);
    assert_eq!(own.len(), 1, "listening sockets on {port}: {own:?}");
    assert_ne!(own[0], inode);
    assert!(
        fd_links(master).contains(&own[0]),
        "master {master} does not hold the socket it bound ({})",
        own[0]
    );
    // Nothing serves the socket handed over for another process.
    let mut c = TcpStream::connect(("127.0.0.1", passed_port)).unwrap();
    c.write_all(&get_request("/healthz", true)).unwrap();
    c.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut buf = [0u8; 64];
    let read = loop {
        match c.read(&mut buf) {
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            other => break other,
        }
    };
    match read {
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
        other => panic!(
            "the socket passed for another pid answered: {:?}",
            other.map(|n| String::from_utf8_lossy(&buf[..n]).into_owned())
        ),
    }
    srv.stop();
    srv.assert_log_clean();
}

// ---------------------------------------------------------------------------------------
// 6. systemd unit files
// ---------------------------------------------------------------------------------------

fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

fn read_repo_file(rel: &str) -> String {
    std::fs::read_to_string(repo_file(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
}

/// `key: "DURATION"` in a RON text (the first line that is not a comment).
fn ron_duration(text: &str, key: &str) -> Duration {
    let prefix = format!("{key}:");
    let line = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with("//"))
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no `{key}:` in the config"));
    let value = line[prefix.len()..]
        .trim()
        .trim_end_matches(',')
        .trim()
        .trim_matches('"');
    parse_duration(value).unwrap_or_else(|| panic!("`{key}: {value}` is not a duration"))
}

/// "500ms", "25s", "2m", "1min", "1h", "35" (seconds, as systemd reads it), and
/// space-separated sums ("1min 30s").
fn parse_duration(text: &str) -> Option<Duration> {
    let mut total = Duration::ZERO;
    for part in text.split_whitespace() {
        let digits = part
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(part.len());
        let n: u64 = part[..digits].parse().ok()?;
        total += match &part[digits..] {
            "ms" => Duration::from_millis(n),
            "" | "s" | "sec" => Duration::from_secs(n),
            "m" | "min" => Duration::from_secs(60 * n),
            "h" => Duration::from_secs(3600 * n),
            _ => return None,
        };
    }
    (!text.trim().is_empty()).then_some(total)
}

/// Every `Key=value` of `[section]` in a unit file, in order.
fn unit_keys(text: &str, section: &str) -> Vec<(String, String)> {
    let mut current = String::new();
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if line.starts_with('[') {
            current = line.trim_matches(|c| c == '[' || c == ']').to_string();
            continue;
        }
        if current == section {
            if let Some((k, v)) = line.split_once('=') {
                out.push((k.trim().to_string(), v.trim().to_string()));
            }
        }
    }
    out
}

fn unit_key<'a>(keys: &'a [(String, String)], key: &str) -> Option<&'a str> {
    keys.iter()
        .rev()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

#[test]
fn systemd_units_verify_cleanly_and_fit_the_server() {
    let service = read_repo_file("systemd/forkd.service");
    let socket = read_repo_file("systemd/forkd.socket");
    let dir = TempDir::new();
    let config = dir.path().join("forkd.ron");
    std::fs::create_dir_all(dir.path().join("www")).unwrap();
    std::fs::write(&config, site(1, "Shared", "").config_text(8080)).unwrap();

    // The units with their paths pointed at this build and a temp config.
    let config_str = config.to_string_lossy();
    let rewritten: String = service
        .lines()
        .map(|line| {
            let is_exec = ["ExecStart=", "ExecStartPre=", "ExecReload="]
                .iter()
                .any(|k| line.trim_start().starts_with(k));
            if is_exec {
                line.replace("/usr/local/bin/forkd", BIN)
                    .replace("/etc/forkd/forkd.ron", &config_str)
            } else {
                line.to_string()
            }
        })
        .map(|l| l + "\n")
        .collect();
    let service_keys = unit_keys(&rewritten, "Service");
    for key in ["ExecStart", "ExecStartPre", "ExecReload"] {
        let v = unit_key(&service_keys, key).unwrap_or_else(|| panic!("no {key}="));
        assert!(
            v.contains(BIN) && v.contains(&*config_str),
            "{key}={v}: paths not rewritten (did the unit's paths change?)"
        );
    }
    std::fs::write(dir.path().join("forkd.service"), &rewritten).unwrap();
    std::fs::write(dir.path().join("forkd.socket"), &socket).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(dir.path().join("forkd.service"))
        .arg(dir.path().join("forkd.socket"))
        .stdin(Stdio::null())
        .output()
        .expect("run systemd-analyze (installed at /usr/bin/systemd-analyze)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "systemd-analyze verify: {}\nstdout: {}\nstderr: {stderr}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );

    // The keys forkd's behaviour depends on.
    let keys = unit_keys(&service, "Service");
    assert_eq!(unit_key(&keys, "Type"), Some("notify"));
    assert_eq!(unit_key(&keys, "NotifyAccess"), Some("all"));
    assert_eq!(unit_key(&keys, "KillMode"), Some("mixed"));
    let reload = unit_key(&keys, "ExecReload").expect("ExecReload=");
    assert!(reload.contains("-s reload"), "ExecReload={reload}");
    let stop = unit_key(&keys, "TimeoutStopSec").expect("TimeoutStopSec=");
    let stop = parse_duration(stop).unwrap_or_else(|| panic!("TimeoutStopSec={stop}"));
    let conf = read_repo_file("conf/forkd.ron");
    let drain = ron_duration(&conf, "drain_timeout") + ron_duration(&conf, "shutdown_delay");
    assert!(
        stop > drain,
        "TimeoutStopSec {stop:?} is not above drain_timeout + shutdown_delay {drain:?} of conf/forkd.ron"
    );
    let socket_keys = unit_keys(&socket, "Socket");
    let listen = unit_key(&socket_keys, "ListenStream").expect("forkd.socket has ListenStream=");
    assert!(!listen.is_empty(), "ListenStream is empty");
    // forkd adopts a passed socket by address: it must be one the config listens on.
    assert!(
        conf.contains(&format!("\"{listen}\"")),
        "ListenStream={listen} is not a listen address of conf/forkd.ron"
    );
}

// ---------------------------------------------------------------------------------------
// 7. Container deployment
// ---------------------------------------------------------------------------------------

/// The `path:` of a Kubernetes probe (`livenessProbe`, `readinessProbe`) in the YAML:
/// the first `path:` in the lines indented below the probe's key.
fn probe_path(yaml: &str, probe: &str) -> Option<String> {
    let lines: Vec<&str> = yaml.lines().collect();
    let at = lines.iter().position(|l| l.trim() == format!("{probe}:"))?;
    let indent = |l: &str| l.len() - l.trim_start().len();
    let base = indent(lines[at]);
    for line in &lines[at + 1..] {
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        if indent(line) <= base {
            break;
        }
        if let Some(i) = line.find("path:") {
            let value = line[i + 5..]
                .trim_start()
                .split([',', '}', ' '])
                .next()?
                .trim_matches(|c| c == '"' || c == '\'');
            return Some(value.to_string());
        }
    }
    None
}

#[test]
fn container_config_validates_and_fits_the_kubernetes_deployment() {
    let text = read_repo_file("deploy/forkd.container.ron");
    let dir = TempDir::new();
    let www = dir.path().join("www");
    std::fs::create_dir_all(&www).unwrap();
    assert!(
        text.contains("\"/srv/www\""),
        "the container config no longer serves /srv/www"
    );
    let config = dir.path().join("forkd.container.ron");
    std::fs::write(
        &config,
        text.replace("\"/srv/www\"", &format!("\"{}\"", www.display())),
    )
    .unwrap();
    let out = Command::new(BIN)
        .arg("-c")
        .arg(&config)
        .arg("-t")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "forkd -t on the container config: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let yaml = read_repo_file("deploy/kubernetes.yaml");
    assert_eq!(
        probe_path(&yaml, "livenessProbe").as_deref(),
        Some("/healthz")
    );
    assert_eq!(
        probe_path(&yaml, "readinessProbe").as_deref(),
        Some("/readyz")
    );
    let grace: u64 = yaml
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix("terminationGracePeriodSeconds:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("terminationGracePeriodSeconds in deploy/kubernetes.yaml");
    let stop = ron_duration(&text, "shutdown_delay") + ron_duration(&text, "drain_timeout");
    assert!(
        stop < Duration::from_secs(grace),
        "shutdown_delay + drain_timeout = {stop:?} is not below terminationGracePeriodSeconds {grace}"
    );
    // The probes' routes exist in the container config.
    for route in [
        "(prefix: \"/healthz\", handler: Liveness)",
        "(prefix: \"/readyz\", handler: Readiness)",
    ] {
        assert!(text.contains(route), "the container config lacks {route}");
    }
}

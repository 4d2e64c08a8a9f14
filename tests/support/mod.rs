//! The end-to-end harness: run the real `forkd` binary on a config written into a temp
//! folder, on free loopback ports; wait for it to serve; talk raw HTTP to it; stop it
//! and check its error log when done.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_forkd");

/// A temp folder removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new() -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "forkd-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A port nothing listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// How to configure a test daemon. `{port}` in any text is replaced by `port`.
pub struct Builder {
    pub workers: usize,
    pub accept: &'static str,
    /// Extra top-level keys, e.g. `drain_timeout: "2s",`.
    pub top: String,
    /// Extra keys of the (single) server, e.g. `keepalive_requests: 3,`.
    pub server: String,
    /// The routes list body; default: liveness, readiness, static `www`.
    pub routes: String,
    /// Files to create below `www/` (path relative to www, content).
    pub files: Vec<(String, Vec<u8>)>,
    /// Alerts in the error log are expected (crash tests): do not fail on them.
    pub expect_alerts: bool,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            workers: 1,
            accept: "Shared",
            top: String::new(),
            server: String::new(),
            routes: r#"(prefix: "/healthz", handler: Liveness),
            (prefix: "/readyz", handler: Readiness),
            (prefix: "/", handler: Static(root: "www", index: ["index.html"])),"#
                .into(),
            files: vec![("index.html".into(), b"<h1>index</h1>\n".to_vec())],
            expect_alerts: false,
        }
    }
}

impl Builder {
    pub fn file(mut self, path: &str, content: &[u8]) -> Self {
        self.files.push((path.into(), content.to_vec()));
        self
    }
    pub fn top(mut self, keys: &str) -> Self {
        self.top.push_str(keys);
        self
    }
    pub fn server(mut self, keys: &str) -> Self {
        self.server.push_str(keys);
        self
    }
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = n;
        self
    }
    pub fn accept(mut self, mode: &'static str) -> Self {
        self.accept = mode;
        self
    }
    pub fn routes(mut self, routes: &str) -> Self {
        self.routes = routes.into();
        self
    }
    pub fn expect_alerts(mut self) -> Self {
        self.expect_alerts = true;
        self
    }

    /// The config text for `port`.
    pub fn config_text(&self, port: u16) -> String {
        let text = format!(
            r#"(
    workers: Count({workers}),
    accept: {accept},
    pid_file: "forkd.pid",
    shm_file: "forkd.shm",
    error_log: File("error.log"),
    log_level: Info,
    {top}
    servers: [(
        listen: ["127.0.0.1:{{port}}"],
        names: ["localhost"],
        access_log: Some(File("access.log")),
        {server}
        routes: [
            {routes}
        ],
    )],
)
"#,
            workers = self.workers,
            accept = self.accept,
            top = self.top,
            server = self.server,
            routes = self.routes,
        );
        text.replace("{port}", &port.to_string())
    }

    /// Writes the config and site into a temp folder, starts forkd, waits until it serves.
    /// Creates `dir/www` with the builder's files.
    pub fn write_files(&self, dir: &Path) {
        let www = dir.join("www");
        std::fs::create_dir_all(&www).unwrap();
        for (path, content) in &self.files {
            let p = www.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, content).unwrap();
        }
    }

    pub fn start(self) -> TestDaemon {
        let dir = TempDir::new();
        self.write_files(dir.path());
        let port = free_port();
        let config = dir.path().join("forkd.ron");
        std::fs::write(&config, self.config_text(port)).unwrap();
        let child = Command::new(BIN)
            .arg("-c")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn forkd");
        let mut d = TestDaemon {
            dir,
            child: Some(child),
            port,
            config,
            expect_alerts: self.expect_alerts,
            builder: self,
        };
        d.wait_ready();
        d
    }
}

pub struct TestDaemon {
    pub dir: TempDir,
    child: Option<Child>,
    pub port: u16,
    pub config: PathBuf,
    pub expect_alerts: bool,
    pub builder: Builder,
}

impl TestDaemon {
    pub fn builder() -> Builder {
        Builder::default()
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("running").id() as i32
    }

    pub fn pid_file(&self) -> PathBuf {
        self.dir.path().join("forkd.pid")
    }

    pub fn www(&self) -> PathBuf {
        self.dir.path().join("www")
    }

    /// Waits for the pid file and a served request (any HTTP response), at most 10 s.
    pub fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "forkd exited during startup ({status}): {}",
                    self.error_log()
                );
            }
            if self.pid_file().exists() && self.workers().len() == self.builder.workers {
                if let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) {
                    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
                    if s.write_all(b"GET /healthz HTTP/1.0\r\n\r\n").is_ok() {
                        let mut buf = [0u8; 16];
                        if s.read(&mut buf).is_ok_and(|n| n > 0) {
                            return;
                        }
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "forkd not ready within 10 s: {}",
                self.error_log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The master's live child processes (its workers).
    pub fn workers(&self) -> Vec<i32> {
        children_of(self.pid())
    }

    pub fn signal(&self, sig: &str) {
        signal(self.pid(), sig);
    }

    pub fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }

    pub fn access_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default()
    }

    /// Waits for the master to exit (at most `timeout`); None if it did not.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        let child = self.child.as_mut()?;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                self.child = None;
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Runs `forkd -c CONFIG ARGS...` and returns (exit code, stdout, stderr).
    pub fn ctl(&self, args: &[&str]) -> (i32, String, String) {
        run_forkd(&self.config, args)
    }

    pub fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    }

    /// Sends `request` on a new connection and reads one response.
    pub fn request(&self, request: &str) -> Response {
        let mut s = self.connect();
        s.write_all(request.as_bytes()).unwrap();
        read_response(&mut s, request.starts_with("HEAD ")).expect("a response")
    }

    /// GET `path` (HTTP/1.1, `Connection: close`) and read the response.
    pub fn get(&self, path: &str) -> Response {
        self.request(&format!(
            "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        ))
    }

    /// Graceful stop (QUIT), waiting for exit; SIGKILL after 10 s.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        self.child.as_ref()?;
        self.signal("QUIT");
        let status = self.wait_exit(Duration::from_secs(10));
        if status.is_none() {
            if let Some(c) = self.child.as_mut() {
                let _ = c.kill();
                let _ = c.wait();
            }
            self.child = None;
        }
        status
    }
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        let workers = if self.child.is_some() {
            self.workers()
        } else {
            vec![]
        };
        self.stop();
        for w in workers.into_iter().filter(|&w| alive(w)) {
            let _ = Command::new("kill")
                .arg("-KILL")
                .arg(w.to_string())
                .status();
        }
        if std::thread::panicking() || self.expect_alerts {
            return;
        }
        let log = self.error_log();
        for bad in ["[alert]", "[crit]", "[emerg]"] {
            assert!(
                !log.contains(bad),
                "unexpected {bad} in the error log:\n{log}"
            );
        }
    }
}

/// Children of `pid`, from /proc.
pub fn children_of(pid: i32) -> Vec<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

pub fn alive(pid: i32) -> bool {
    // A zombie is not alive for our purposes.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

pub fn signal(pid: i32, sig: &str) {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(status.success(), "kill -{sig} {pid}");
}

/// Runs forkd with `-c config` and `args`.
pub fn run_forkd(config: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN)
        .arg("-c")
        .arg(config)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `len` bytes of deterministic noise (xorshift, one stream per `seed`), so a misplaced
/// or repeated chunk of a body is noticed.
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15 ^ seed.wrapping_mul(0xD6E8_FEB8_6659_FD93);
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Polls `cond` every 10 ms until it holds or `timeout` passes.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// One parsed response.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    /// The status line and header fields as received, up to and including the empty line.
    pub head: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn body_str(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Reads one response from `s`: head, then a body by Content-Length (none for HEAD,
/// 1xx, 204 and 304; until EOF without a length). Interim 1xx responses are returned
/// as responses of their own. None on EOF before a head. Reads interrupted by a signal
/// are retried.
pub fn read_response(s: &mut TcpStream, head_request: bool) -> Option<Response> {
    struct Retry<'a>(&'a mut TcpStream);
    impl Read for Retry<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            loop {
                match self.0.read(buf) {
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    other => return other,
                }
            }
        }
    }
    let s = &mut Retry(s);
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(0) => return None,
            Ok(_) => head.push(byte[0]),
            Err(e) => panic!(
                "reading a response head: {e} (got {:?})",
                String::from_utf8_lossy(&head)
            ),
        }
    }
    let head = String::from_utf8(head).expect("ASCII head");
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap();
    let status: u16 = status_line.split(' ').nth(1).unwrap().parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (n, v) = l.split_once(':').expect("header line");
            (n.to_string(), v.trim().to_string())
        })
        .collect();
    let mut r = Response {
        status,
        head,
        headers,
        body: Vec::new(),
    };
    if head_request || status < 200 || status == 204 || status == 304 {
        return Some(r);
    }
    match r
        .header("Content-Length")
        .map(|v| v.parse::<usize>().unwrap())
    {
        Some(n) => {
            r.body = vec![0; n];
            s.read_exact(&mut r.body).expect("the whole body");
        }
        None => {
            s.read_to_end(&mut r.body).unwrap();
        }
    }
    Some(r)
}

/// Reads until the server closes the connection (or 10 s pass).
pub fn read_to_close(s: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    out
}

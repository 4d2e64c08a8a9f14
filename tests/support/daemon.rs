//! The daemon harness: a `Builder` writes a config and a site into a temp folder, a
//! `TestDaemon` runs the real `forkd` on it, waits until it serves, talks to it, and on
//! drop stops every master it started (upgrades included) and checks the error log.
//!
//! ```text
//! TestDaemon::builder().workers(2).file(..) ─ start() ─▶ reserved port, config, site,
//!                                                       forkd running and serving
//!                                          ─ prepare() ─▶ the same, nothing running:
//!                                                       spawn(command()) yourself
//! ```

use super::http::{read_response, Conn, Response};
use super::port::PortReservation;
use super::process::{
    alive, children_of, descendants_of, forkd_ctl, run_forkd, send_signal, signal, Ctl, BIN,
    PROTOCOL_ENV,
};
use super::stats::workers_serving;
use super::wait::wait_until;
use nix::sys::signal::Signal;
use std::io::Write;
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long a daemon may take to start serving, to stop, or to settle after a change
/// (a busy 2-core machine).
pub const SETTLE: Duration = Duration::from_secs(20);

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

impl Default for TempDir {
    fn default() -> Self {
        TempDir::new()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Overwrites `path` with `text` in place. Not `fs::write`: truncating a file to zero
/// and rewriting it makes ext4 (auto_da_alloc) flush it on close, which waits behind
/// the access logs' writeback under load, for seconds at a time.
pub fn write_config(path: &Path, text: &str) {
    let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f.set_len(text.len() as u64).unwrap();
}

/// Writes `builder`'s config and site into a new temp folder without starting forkd
/// (pid file `forkd.pid` there): the folder, the config file and the port it names.
pub fn write_site(builder: &Builder) -> (TempDir, PathBuf, u16) {
    let dir = TempDir::new();
    builder.write_files(dir.path());
    let port = super::port::free_port();
    let config = dir.path().join("forkd.ron");
    std::fs::write(&config, builder.config_text(port)).unwrap();
    (dir, config, port)
}

/// Copies `from` to `to` (mode 755) with `cp`, so that no descriptor open for writing on
/// `to` ever exists in this multi-threaded process: a child another test thread forks
/// meanwhile would inherit it until its exec, and exec'ing `to` would then fail with
/// ETXTBSY ("Text file busy").
pub fn copy_executable(from: &Path, to: &Path) {
    let status = Command::new("cp")
        .arg(from)
        .arg(to)
        .stdin(Stdio::null())
        .status()
        .expect("run cp");
    assert!(status.success(), "cp {} {}", from.display(), to.display());
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// How to configure a test daemon. `{port}` in any text is replaced by `port`.
pub struct Builder {
    pub workers: usize,
    /// The server's `listen` entry: `"127.0.0.1:{port}"` (quoted), or the long form,
    /// e.g. `(addr: "127.0.0.1:{port}", http2: PriorKnowledge)`.
    pub listen: String,
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
    /// Run from a copy of the binary at `<tmp>/bin/forkd` (a master execs whatever is at
    /// the path it was started from, so an upgrade test can put another binary there).
    pub own_binary: bool,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            workers: 1,
            listen: r#""127.0.0.1:{port}""#.into(),
            accept: "Shared",
            top: String::new(),
            server: String::new(),
            routes: r#"(prefix: "/healthz", handler: Liveness),
            (prefix: "/readyz", handler: Readiness),
            (prefix: "/", handler: Static(root: "www", index: ["index.html"])),"#
                .into(),
            files: vec![("index.html".into(), b"<h1>index</h1>\n".to_vec())],
            expect_alerts: false,
            own_binary: false,
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
    /// The server's one `listen` entry, as the config writes it (the `listen` field).
    pub fn listen(mut self, entry: &str) -> Self {
        self.listen = entry.into();
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
    pub fn own_binary(mut self) -> Self {
        self.own_binary = true;
        self
    }
    /// The address also speaks HTTP/2 to a client that starts with its preface (h2c).
    pub fn h2c(self) -> Self {
        self.listen(r#"(addr: "127.0.0.1:{port}", http2: PriorKnowledge)"#)
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
        listen: [{listen}],
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
            listen = self.listen,
            accept = self.accept,
            top = self.top,
            server = self.server,
            routes = self.routes,
        );
        text.replace("{port}", &port.to_string())
    }

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

    /// Writes the site and the config on a reserved port into a temp folder; starts
    /// nothing.
    pub fn prepare(self) -> TestDaemon {
        let reservation = PortReservation::new();
        let port = reservation.port();
        let mut d = self.prepare_on(port);
        d.ports.push(reservation);
        d
    }

    /// `prepare` on `port`, which the caller holds (a socket it passes to forkd).
    pub fn prepare_on(self, port: u16) -> TestDaemon {
        let dir = TempDir::new();
        self.write_files(dir.path());
        if self.own_binary {
            std::fs::create_dir_all(dir.path().join("bin")).unwrap();
            copy_executable(Path::new(BIN), &dir.path().join("bin/forkd"));
        }
        let config = dir.path().join("forkd.ron");
        std::fs::write(&config, self.config_text(port)).unwrap();
        TestDaemon {
            dir,
            child: None,
            port,
            config,
            expect_alerts: self.expect_alerts,
            builder: self,
            ports: Vec::new(),
            masters: Vec::new(),
        }
    }

    /// Writes the config and site into a temp folder, starts forkd, waits until it
    /// serves.
    pub fn start(self) -> TestDaemon {
        let mut d = self.prepare();
        let cmd = d.command();
        let pid = d.spawn(cmd);
        d.wait_serving(pid);
        d
    }
}

pub struct TestDaemon {
    pub dir: TempDir,
    /// The first master, our child (masters after an upgrade are children of their
    /// predecessor).
    child: Option<Child>,
    pub port: u16,
    pub config: PathBuf,
    pub expect_alerts: bool,
    pub builder: Builder,
    /// Ports held for the daemon while it lives (its `port` and any `reserve_port`).
    ports: Vec<PortReservation>,
    /// Every master seen, for the cleanup.
    masters: Vec<i32>,
}

impl TestDaemon {
    /// GET `path` on a new connection answers 200 with `body`: the daemon still
    /// serves after whatever the test did to it.
    pub fn assert_serves(&self, path: &str, body: &[u8]) {
        let r = self.get(path);
        assert_eq!(r.status, 200, "GET {path} afterwards: {}", r.head);
        assert_eq!(r.body, body, "GET {path} afterwards");
    }

    pub fn builder() -> Builder {
        Builder::default()
    }

    /// The first master's pid (the process `start` spawned).
    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("running").id() as i32
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn pid_file(&self) -> PathBuf {
        self.path("forkd.pid")
    }

    pub fn oldbin(&self) -> PathBuf {
        self.path("forkd.pid.oldbin")
    }

    pub fn shm(&self) -> PathBuf {
        self.path("forkd.shm")
    }

    pub fn www(&self) -> PathBuf {
        self.path("www")
    }

    /// The binary masters run from: the copy with `own_binary`, else `BIN`.
    pub fn bin(&self) -> PathBuf {
        if self.builder.own_binary {
            self.path("bin/forkd")
        } else {
            PathBuf::from(BIN)
        }
    }

    /// Another port held for the daemon's lifetime (for a reload that changes `listen`).
    pub fn reserve_port(&mut self) -> u16 {
        let r = PortReservation::new();
        let port = r.port();
        self.ports.push(r);
        port
    }

    /// The pid the pid file names.
    pub fn master(&self) -> Option<i32> {
        std::fs::read_to_string(self.pid_file())
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Records a master that took over (an upgrade), so the cleanup stops it too.
    pub fn adopt_master(&mut self, pid: i32) {
        if !self.masters.contains(&pid) {
            self.masters.push(pid);
        }
    }

    /// `-s upgrade`, which must succeed: the new master is adopted (stopped by the
    /// cleanup) and the old one has gone. Returns the new master's pid.
    pub fn upgrade(&mut self) -> i32 {
        let old = self.master().expect("a master");
        let (code, out, err) = self.ctl(&["-s", "upgrade"]);
        assert_eq!(code, 0, "upgrade: {out} {err}");
        let new = self.master().expect("a master after the upgrade");
        assert_ne!(new, old);
        self.adopt_master(new);
        assert!(
            wait_until(SETTLE, || {
                self.reap_first();
                !alive(old)
            }),
            "the old master {old} did not exit after the upgrade"
        );
        new
    }

    /// `BIN -c CONFIG` (or the copy), stderr appended to `<tmp>/stderr.txt`, no protocol
    /// variables.
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(self.bin());
        cmd.arg("-c").arg(&self.config);
        self.plumb(&mut cmd);
        cmd
    }

    /// Gives `cmd` the daemon's stdio (stderr to `<tmp>/stderr.txt`) and removes the
    /// protocol variables from its environment.
    pub fn plumb(&self, cmd: &mut Command) {
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

    /// Spawns `cmd` (which must become the master itself, by exec) as the first master;
    /// its pid.
    pub fn spawn(&mut self, mut cmd: Command) -> i32 {
        assert!(self.child.is_none(), "a first master was already spawned");
        let child = cmd.spawn().expect("spawn forkd");
        let pid = child.id() as i32;
        self.child = Some(child);
        self.masters.push(pid);
        pid
    }

    /// Reaps the first master once it has exited (it stays a zombie otherwise).
    pub fn reap_first(&mut self) {
        if let Some(c) = self.child.as_mut() {
            if let Ok(Some(_)) = c.try_wait() {
                self.child = None;
            }
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.path("stderr.txt")).unwrap_or_default()
    }

    /// Whether /healthz answers as a serving daemon does: 200 where the routes have
    /// the liveness route, any response otherwise.
    fn health_answers(&self) -> bool {
        let want_200 = self
            .builder
            .routes
            .contains(r#""/healthz", handler: Liveness"#);
        let Ok(mut c) = Conn::connect_timeout(self.port, Duration::from_secs(2)) else {
            return false;
        };
        c.exchange(b"GET /healthz HTTP/1.0\r\n\r\n")
            .is_ok_and(|r| !want_200 || r.status == 200)
    }

    /// Waits (at most `SETTLE`) until the pid file names `pid`, it has all its workers,
    /// each shows as serving in the stats region, and /healthz answers.
    pub fn wait_serving(&mut self, pid: i32) {
        let deadline = Instant::now() + SETTLE;
        loop {
            if let Some(c) = self.child.as_mut().filter(|c| c.id() as i32 == pid) {
                if let Some(status) = c.try_wait().unwrap() {
                    self.child = None;
                    panic!(
                        "master {pid} exited while starting ({status}); stderr:\n{}\nerror log:\n{}",
                        self.stderr(),
                        self.error_log()
                    );
                }
            }
            if self.master() == Some(pid)
                && alive(pid)
                && children_of(pid).len() == self.builder.workers
                && self.health_answers()
                && workers_serving(&self.shm(), &children_of(pid))
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "master {pid} not serving within {SETTLE:?}: pid file names {:?}, children {:?}; stderr:\n{}\nerror log:\n{}",
                self.master(),
                children_of(pid),
                self.stderr(),
                self.error_log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until the first master serves (see `wait_serving`).
    pub fn wait_ready(&mut self) {
        let pid = self.pid();
        self.wait_serving(pid);
    }

    /// The first master's live child processes (its workers).
    pub fn workers(&self) -> Vec<i32> {
        children_of(self.pid())
    }

    /// Waits (at most `timeout`) until the first master has exactly `n` workers, none of
    /// them in `old`: a new generation replaced the old one.
    pub fn wait_replaced(&self, old: &[i32], n: usize, timeout: Duration) -> bool {
        wait_until(timeout, || {
            let now = self.workers();
            now.len() == n && now.iter().all(|w| !old.contains(w))
        })
    }

    pub fn signal(&self, sig: &str) {
        signal(self.pid(), sig);
    }

    pub fn error_log(&self) -> String {
        std::fs::read_to_string(self.path("error.log")).unwrap_or_default()
    }

    pub fn access_log(&self) -> String {
        std::fs::read_to_string(self.path("access.log")).unwrap_or_default()
    }

    /// Polls the error log until it contains `needle` (at most `timeout`).
    pub fn wait_for_log(&self, needle: &str, timeout: Duration) -> bool {
        wait_until(timeout, || self.error_log().contains(needle))
    }

    /// Polls the access log until it contains `needle` (at most `timeout`).
    pub fn wait_for_access_log(&self, needle: &str, timeout: Duration) -> bool {
        wait_until(timeout, || self.access_log().contains(needle))
    }

    /// No alert, crit or emerg in the error log.
    pub fn assert_log_clean(&self) {
        let log = self.error_log();
        for bad in ["[alert]", "[crit]", "[emerg]"] {
            assert!(
                !log.contains(bad),
                "unexpected {bad} in the error log:\n{log}"
            );
        }
    }

    /// Waits for the first master to exit (at most `timeout`); None if it did not.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        let status = super::wait::wait_child(child, timeout);
        if status.is_some() {
            self.child = None;
        }
        status
    }

    /// Runs `forkd -c CONFIG ARGS...` and returns (exit code, stdout, stderr).
    pub fn ctl(&self, args: &[&str]) -> (i32, String, String) {
        run_forkd(&self.config, args)
    }

    /// Runs `forkd -c CONFIG ARGS...` with another config file (the real binary: the
    /// copy may be a script).
    pub fn ctl_with(&self, config: &Path, args: &[&str]) -> Ctl {
        forkd_ctl(config, args)
    }

    /// Rewrites the config from the builder (in place) and runs `forkd -s reload`.
    pub fn reload(&self) -> (i32, String, String) {
        write_config(&self.config, &self.builder.config_text(self.port));
        self.ctl(&["-s", "reload"])
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

    /// Puts an executable script at `<tmp>/bin/forkd` (written aside, renamed over it).
    pub fn install_script(&self, script: &str) {
        assert!(self.builder.own_binary, "install_script needs own_binary()");
        let source = self.path("script.src");
        std::fs::write(&source, script).unwrap();
        let tmp = self.path("bin/.forkd.new");
        copy_executable(&source, &tmp);
        std::fs::rename(&tmp, self.bin()).unwrap();
    }

    /// Puts the real binary back at `<tmp>/bin/forkd`.
    pub fn install_real_binary(&self) {
        let tmp = self.path("bin/.forkd.new");
        copy_executable(Path::new(BIN), &tmp);
        std::fs::rename(&tmp, self.bin()).unwrap();
    }

    /// Graceful stop (QUIT) of the first master, waiting for exit; SIGKILL after 10 s.
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

    /// Graceful stop (QUIT) of the master the pid file names (after upgrades, not the
    /// first one); asserts that it and its workers are gone within `SETTLE` and the pid
    /// file with them.
    pub fn stop_master(&mut self) {
        let pid = self.master().expect("a pid file to stop by");
        let workers = children_of(pid);
        send_signal(pid, Signal::SIGQUIT);
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
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        // Every master this daemon had that still runs on this config (a pid of an
        // exited later master may have been reused by now).
        let config = self.config.to_string_lossy().into_owned();
        let ours = |pid: i32| {
            alive(pid)
                && std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&config))
        };
        if let Some(m) = self.master() {
            self.adopt_master(m);
        }
        let masters: Vec<i32> = self.masters.iter().copied().filter(|&p| ours(p)).collect();
        let descendants: Vec<i32> = masters.iter().flat_map(|&m| descendants_of(m)).collect();
        for &m in &masters {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(m), Signal::SIGQUIT);
        }
        wait_until(Duration::from_secs(10), || {
            self.reap_first();
            masters.iter().all(|&m| !alive(m))
        });
        for &p in masters.iter().chain(&descendants) {
            if alive(p) {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), Signal::SIGKILL);
            }
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() || self.expect_alerts {
            return;
        }
        self.assert_log_clean();
    }
}

/// Writes `dir/second.ron`: a one-worker config on a port of its own that names `shm`
/// as its region (pid file `second.pid`, error log `error.log` in `dir`), to start a
/// second master beside a running one.
pub fn second_master_config(dir: &Path, shm: &Path) -> PathBuf {
    let port = super::port::free_port();
    let config = dir.join("second.ron");
    std::fs::write(
        &config,
        format!(
            r#"(
    workers: Count(1),
    pid_file: "second.pid",
    shm_file: "{}",
    error_log: File("error.log"),
    servers: [(
        listen: ["127.0.0.1:{port}"],
        routes: [(prefix: "/", handler: Liveness)],
    )],
)
"#,
            shm.display()
        ),
    )
    .unwrap();
    config
}

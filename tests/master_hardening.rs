//! The master's hardening: "running" is the pid file's lock (not whatever process the
//! file names), and inherited descriptors are checked before they are owned.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use support::*;

fn spawn_forkd(config: &Path) -> Child {
    forkd_command(config)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn forkd")
}

/// An unrelated live process (a child of the test), killed when dropped.
struct Bystander(Child);

impl Bystander {
    fn start() -> Bystander {
        Bystander(Command::new("sleep").arg("600").spawn().unwrap())
    }
    fn pid(&self) -> i32 {
        self.0.id() as i32
    }
    /// Still running: no signal reached it.
    fn untouched(&mut self) -> bool {
        self.0.try_wait().unwrap().is_none()
    }
}

impl Drop for Bystander {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn pid_in(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Waits until the master `pid` has written the pid file and serves `/healthz`.
fn wait_serving(child: &mut Child, pid_file: &Path, port: u16) {
    let pid = child.id() as i32;
    let ok = wait_until(Duration::from_secs(10), || {
        if child.try_wait().unwrap().is_some() {
            return true; // reported below
        }
        pid_in(pid_file) == Some(pid)
            && std::net::TcpStream::connect(("127.0.0.1", port)).is_ok_and(|mut s| {
                use std::io::{Read, Write};
                s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
                let mut buf = [0u8; 12];
                s.write_all(b"GET /healthz HTTP/1.0\r\n\r\n").is_ok()
                    && s.read(&mut buf).is_ok_and(|n| n > 0)
            })
    });
    assert!(ok, "forkd did not serve within 10 s");
    if let Some(status) = child.try_wait().unwrap() {
        let mut err = String::new();
        use std::io::Read;
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        panic!("forkd exited during start-up ({status}): {err}");
    }
}

fn wait_gone(child: &mut Child) -> std::process::ExitStatus {
    let mut status = None;
    let gone = wait_until(Duration::from_secs(15), || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    if !gone {
        let _ = child.kill();
        let _ = child.wait();
        panic!("forkd did not exit within 15 s");
    }
    status.unwrap()
}

#[test]
fn a_pid_file_naming_an_unrelated_live_process_neither_blocks_the_start_nor_gets_it_signalled() {
    let (dir, config, port) = write_site(&TestDaemon::builder());
    let pid_file = dir.path().join("forkd.pid");
    let mut bystander = Bystander::start();
    // What a crash leaves when the old master's pid has been reused.
    std::fs::write(&pid_file, format!("{}\n", bystander.pid())).unwrap();

    for sig in ["quit", "stop", "reopen"] {
        let (code, _out, err) = run_forkd(&config, &["-s", sig]);
        assert_eq!(code, 1, "-s {sig} with no master running: {err}");
        assert!(
            err.contains("not running (stale pid file)"),
            "-s {sig} says why: {err}"
        );
        assert!(
            bystander.untouched(),
            "-s {sig} signalled process {}",
            bystander.pid()
        );
    }

    let mut master = spawn_forkd(&config);
    wait_serving(&mut master, &pid_file, port);
    let (code, _out, err) = run_forkd(&config, &["-s", "quit"]);
    assert_eq!(code, 0, "-s quit to the running master: {err}");
    assert!(wait_gone(&mut master).success());
    assert!(
        bystander.untouched(),
        "-s quit signalled process {}",
        bystander.pid()
    );
    assert!(!pid_file.exists(), "the master removed its pid file");
}

#[test]
fn a_second_forkd_is_refused_while_the_first_holds_the_pid_file_whatever_it_names() {
    let (dir, config, port) = write_site(&TestDaemon::builder().workers(2));
    let pid_file = dir.path().join("forkd.pid");
    let mut first = spawn_forkd(&config);
    wait_serving(&mut first, &pid_file, port);
    // Even with the file's pid overwritten (a dead process), the lock decides.
    let dead = {
        let mut c = Command::new("true").spawn().unwrap();
        let pid = c.id() as i32;
        c.wait().unwrap();
        pid
    };
    for content in [format!("{dead}\n"), format!("{}\n", first.id())] {
        std::fs::write(&pid_file, &content).unwrap();
        let mut second = spawn_forkd(&config);
        let status = wait_gone(&mut second);
        let log = std::fs::read_to_string(dir.path().join("error.log")).unwrap_or_default();
        assert_eq!(
            status.code(),
            Some(1),
            "second forkd (pid file {content:?})"
        );
        assert!(
            log.contains("already running") && log.contains("is locked"),
            "the second forkd says why (pid file {content:?}): {log}"
        );
        assert!(
            first.try_wait().unwrap().is_none(),
            "the first forkd still runs"
        );
    }
    // The first still serves and stops cleanly (the pid file names it again).
    std::fs::write(&pid_file, format!("{}\n", first.id())).unwrap();
    let (code, _out, err) = run_forkd(&config, &["-s", "quit"]);
    assert_eq!(code, 0, "{err}");
    assert!(wait_gone(&mut first).success());
}

/// Descriptors of `pid` that name `path`.
fn fds_naming(pid: i32, path: &Path) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| {
            dir.filter_map(|e| e.ok())
                .filter(|e| std::fs::read_link(e.path()).is_ok_and(|t| t == path))
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn only_the_master_holds_the_pid_file_open_not_its_workers() {
    let d = TestDaemon::builder().workers(2).start();
    let pid_file = std::fs::canonicalize(d.pid_file()).unwrap();
    assert_eq!(
        fds_naming(d.pid(), &pid_file).len(),
        1,
        "the master holds its lock"
    );
    let workers = d.workers();
    assert_eq!(workers.len(), 2);
    for w in workers {
        // A worker outliving a SIGKILLed master would otherwise keep "running" true.
        assert!(
            fds_naming(w, &pid_file).is_empty(),
            "worker {w} holds the pid file"
        );
    }
}

#[test]
fn after_an_upgrade_the_new_master_holds_the_pid_file_and_after_a_rollback_the_old_one() {
    let mut d = TestDaemon::builder()
        .top(r#"upgrade_timeout: "10s","#)
        .expect_alerts()
        .start();
    let old = d.pid();
    let pid_file = d.pid_file();
    let oldbin = PathBuf::from(format!("{}.oldbin", pid_file.display()));

    // A rollback: the new binary cannot load the (now broken) config it is run with.
    let good = std::fs::read_to_string(&d.config).unwrap();
    let cli = d.dir.path().join("cli.ron");
    std::fs::write(&cli, &good).unwrap();
    std::fs::write(&d.config, good.replace("servers:", "servres:")).unwrap();
    let (code, _out, err) = run_forkd(&cli, &["-s", "upgrade"]);
    std::fs::write(&d.config, &good).unwrap();
    assert_eq!(code, 1, "the upgrade with a broken config fails: {err}");
    assert_eq!(pid_in(&pid_file), Some(old), "the pid file is back: {err}");
    assert!(!oldbin.exists());
    assert_eq!(d.get("/healthz").status, 200);
    // The restored file is still the old master's lock: a second forkd is refused.
    let mut second = spawn_forkd(&d.config);
    assert_eq!(
        wait_gone(&mut second).code(),
        Some(1),
        "a second forkd after the rollback is refused"
    );

    // A good upgrade: the new master's pid file is locked, the old one's is gone.
    let (code, out, err) = d.ctl(&["-s", "upgrade"]);
    assert_eq!(code, 0, "{out}{err}");
    let new = pid_in(&pid_file).expect("the new master's pid");
    assert_ne!(new, old);
    assert!(
        d.wait_exit(Duration::from_secs(15)).is_some(),
        "the old master exits"
    );
    assert!(
        !oldbin.exists(),
        "the old master removed {}",
        oldbin.display()
    );
    let canonical = std::fs::canonicalize(&pid_file).unwrap();
    assert_eq!(
        fds_naming(new, &canonical).len(),
        1,
        "the new master holds its lock"
    );
    let (code, _out, err) = d.ctl(&["-s", "quit"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        wait_until(Duration::from_secs(15), || !alive(new)),
        "the new master stops on -s quit"
    );
}

/// Runs `sh -c script BIN CONFIG` (the script execs forkd, so `$$` is forkd's pid)
/// with `env`; returns (exit code, stderr) once it exits.
fn forkd_in_shell(script: &str, config: &Path, env: &[(&str, String)]) -> (Option<i32>, String) {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg(BIN)
        .arg(config)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_gone(&mut child);
    let mut err = String::new();
    use std::io::Read;
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    (status.code(), err)
}

#[test]
fn inherited_descriptors_with_two_owners_or_out_of_range_are_refused_at_start() {
    let (dir, config, port) = write_site(&TestDaemon::builder());
    let listener = |fd: i32| format!("{fd}:0:127.0.0.1:{port};");
    // (what, shell script, environment, the error it must give)
    type Case<'a> = (&'a str, &'a str, Vec<(&'a str, String)>, &'a str);
    let cases: Vec<Case> = vec![
        (
            "a repeated fd in FORKD_LISTENERS",
            r#"exec "$0" -c "$1""#,
            vec![("FORKD_LISTENERS", format!("{}{}", listener(7), listener(7)))],
            "FORKD_LISTENERS names fd 7 more than once",
        ),
        (
            "FORKD_LISTENERS naming the ready pipe",
            // fd 8 is open (as the ready pipe would be) so that the new master owns it.
            r#"exec 8>/dev/null; exec "$0" -c "$1""#,
            vec![
                ("FORKD_LISTENERS", listener(8)),
                ("FORKD_READY_FD", "8".into()),
                ("FORKD_UPGRADE_FROM", std::process::id().to_string()),
            ],
            "FORKD_LISTENERS names fd 8, which is FORKD_READY_FD",
        ),
        (
            "a LISTEN_FDS past the descriptor range",
            r#"LISTEN_PID=$$ exec "$0" -c "$1""#,
            vec![("LISTEN_FDS", "2147483647".into())],
            "LISTEN_FDS=\"2147483647\" is not a descriptor count",
        ),
    ];
    for (what, script, env, message) in cases {
        let (code, err) = forkd_in_shell(script, &config, &env);
        assert_eq!(code, Some(1), "{what}: exit status; stderr: {err}");
        assert!(
            err.contains(message),
            "{what}: stderr says {message:?}: {err}"
        );
        let log = std::fs::read_to_string(dir.path().join("error.log")).unwrap_or_default();
        assert!(
            log.contains(message),
            "{what}: the error log says it: {log}"
        );
        assert!(
            !dir.path().join("forkd.pid").exists(),
            "{what}: no pid file left"
        );
    }
}

#[test]
fn an_upgrade_whose_binary_cannot_be_executed_is_rolled_back_and_the_master_keeps_serving() {
    let (dir, config, port) = write_site(&TestDaemon::builder().workers(2));
    let pid_file = dir.path().join("forkd.pid");
    // The master execs the path it was started from: a copy that is then removed.
    let copy = dir.path().join("forkd-copy");
    std::fs::copy(BIN, &copy).unwrap();
    let mut master = Command::new(&copy)
        .arg("-c")
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_serving(&mut master, &pid_file, port);
    std::fs::remove_file(&copy).unwrap();
    let (code, _out, err) = run_forkd(&config, &["-s", "upgrade"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("exec(") && err.contains("failed"),
        "-s upgrade says the exec failed: {err}"
    );
    assert_eq!(
        pid_in(&pid_file),
        Some(master.id() as i32),
        "the pid file is back"
    );
    let log = std::fs::read_to_string(dir.path().join("error.log")).unwrap();
    assert_eq!(
        log.matches("upgrade failed, rolled back").count(),
        1,
        "one rollback, reported once: {log}"
    );
    assert_eq!(
        log.matches("started: 2 worker(s)").count(),
        1,
        "nothing of the master's was written twice: {log}"
    );
    let (code, _out, err) = run_forkd(&config, &["-s", "quit"]);
    assert_eq!(code, 0, "the master still runs and stops: {err}");
    assert!(wait_gone(&mut master).success());
}

/// `forkd -s reload`, bounded: (exit code, stdout + stderr). A reload the workers do
/// not all adopt makes `-s reload` wait for them for a minute before it fails.
fn reload(d: &TestDaemon) -> (i32, String) {
    let (code, out, err) = d.ctl(&["-s", "reload"]);
    (code, format!("{out}{err}"))
}

fn rewrite_routes(d: &mut TestDaemon, routes: &str, server: &str) {
    d.builder.routes = routes.into();
    d.builder.server = server.into();
    std::fs::write(&d.config, d.builder.config_text(d.port)).unwrap();
}

#[test]
fn a_reload_the_workers_user_could_not_adopt_fails_whole_and_every_worker_keeps_the_old_config() {
    use std::os::unix::fs::PermissionsExt;
    let mut d = TestDaemon::builder()
        .workers(2)
        .top(r#"user: Some("nobody"),"#)
        .file("where.txt", b"old\n")
        .expect_alerts()
        .start();
    // A folder only the master's user (root) can enter.
    let private = d.dir.path().join("private");
    std::fs::create_dir_all(private.join("www")).unwrap();
    std::fs::write(private.join("www/where.txt"), "new\n").unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    let old_routes = d.builder.routes.clone();
    let old_generation = |d: &TestDaemon| d.get("/where.txt").body_str();
    assert_eq!(old_generation(&d), "old\n");

    let cases = [
        (
            "a root the workers cannot reach",
            r#"(prefix: "/healthz", handler: Liveness),
               (prefix: "/", handler: Static(root: "private/www")),"#
                .to_string(),
            String::new(),
            "private/www",
        ),
        (
            "an access log the workers cannot open",
            old_routes.clone(),
            r#"access_log: Some(File("private/access.log")),"#.to_string(),
            "access log",
        ),
    ];
    for (what, routes, server, names) in cases {
        rewrite_routes(&mut d, &routes, &server);
        // The server line has the access log already: replace, do not add, it.
        if !server.is_empty() {
            let text = std::fs::read_to_string(&d.config)
                .unwrap()
                .replace(r#"access_log: Some(File("access.log")),"#, "");
            std::fs::write(&d.config, text).unwrap();
        }
        let (code, out) = reload(&d);
        assert_eq!(code, 1, "{what}: -s reload fails: {out}");
        assert!(
            out.contains("user nobody") && out.contains("would refuse") && out.contains(names),
            "{what}: -s reload says which and why: {out}"
        );
        for _ in 0..4 {
            assert_eq!(old_generation(&d), "old\n", "{what}: the old config serves");
        }
    }
    // A good reload after them is adopted by every worker.
    rewrite_routes(&mut d, &old_routes.replace("www", "www2"), "");
    let www2 = d.dir.path().join("www2");
    std::fs::create_dir_all(&www2).unwrap();
    std::fs::write(www2.join("where.txt"), "www2\n").unwrap();
    let (code, out) = reload(&d);
    assert_eq!(code, 0, "the good reload: {out}");
    assert!(out.contains("in force in 2 worker(s)"), "{out}");
    for _ in 0..4 {
        assert_eq!(d.get("/where.txt").body_str(), "www2\n");
    }
}

#[test]
fn a_reload_whose_new_workers_could_not_start_is_refused_and_the_old_ones_keep_serving() {
    let mut d = TestDaemon::builder().workers(2).start();
    let before = {
        let mut w = d.workers();
        w.sort();
        w
    };
    // More workers (a new generation) logging to a path they cannot open for append.
    d.builder.workers = 3;
    let text = d.builder.config_text(d.port).replace(
        r#"access_log: Some(File("access.log")),"#,
        r#"access_log: Some(File("www")),"#,
    );
    std::fs::write(&d.config, text).unwrap();
    let (code, out) = reload(&d);
    assert_eq!(code, 1, "-s reload fails: {out}");
    assert!(
        out.contains("would refuse") && out.contains("access logs") && out.contains("www"),
        "-s reload says why: {out}"
    );
    assert_eq!(d.get("/healthz").status, 200, "the old workers serve");
    let mut after = d.workers();
    after.sort();
    assert_eq!(after, before, "the old workers are the ones serving");
    // Put the good file back: it is the config the harness stops with.
    d.builder.workers = 2;
    std::fs::write(&d.config, d.builder.config_text(d.port)).unwrap();
}

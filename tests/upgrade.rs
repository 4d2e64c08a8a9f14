//! Binary upgrade end to end (USR2 and `forkd -s upgrade`), nginx's manual flow (WINCH,
//! HUP), systemd integration (sd_notify, socket activation, the unit files) and the
//! container deployment files, against the real binary.
//!
//! The upgrade tests run forkd from a copy of the binary in their temp folder
//! (`Builder::own_binary`, `<tmp>/bin/forkd`): a master execs whatever is at the path it
//! was started from, so a test can put a broken "new binary" there.

mod support;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use support::*;

/// How much later than `upgrade_timeout` a rollback may be reported by `-s upgrade`.
const ROLLBACK_MARGIN: Duration = Duration::from_secs(5);

/// The harness's default site (liveness, readiness, static `www`) with the load files,
/// `workers` workers, `accept` mode and extra top-level keys, run from its own copy of
/// the binary.
fn site(workers: usize, accept: &'static str, top: &str) -> Builder {
    load_site(
        Builder::default()
            .workers(workers)
            .accept(accept)
            .top(top)
            .own_binary(),
    )
}

/// GET the small load file on a new connection, asserting the complete answer.
fn assert_serves(port: u16, context: &str) {
    let r =
        get_close(port, SMALL_PATH).unwrap_or_else(|e| panic!("{context}: GET {SMALL_PATH}: {e}"));
    check_small(&r).unwrap_or_else(|e| panic!("{context}: {e}"));
}

/// Starts `<tmp>/bin/forkd -c CONFIG` and waits until it serves; its pid.
fn start(srv: &mut TestDaemon) -> i32 {
    let cmd = srv.command();
    let pid = srv.spawn(cmd);
    srv.wait_serving(pid);
    pid
}

// ---------------------------------------------------------------------------------------
// Stats: `forkd stats --json` totals
// ---------------------------------------------------------------------------------------

/// `totals.requests` of `forkd stats --shm SHM --json`.
fn total_requests(shm: &Path) -> Result<u64, String> {
    let json = try_shm_json(shm)?;
    json["totals"]["requests"]
        .as_u64()
        .ok_or_else(|| format!("no totals.requests in {json}"))
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
fn good_upgrade(srv: &mut TestDaemon, cli_config: &Path, what: &str) -> i32 {
    let old = srv.master().expect("a pid file before the upgrade");
    let old_workers = children_of(old);
    assert_eq!(
        old_workers.len(),
        srv.builder.workers,
        "{what}: master {old} before the upgrade has children {old_workers:?}"
    );
    let r = srv.ctl_with(cli_config, &["-s", "upgrade"]);
    assert_eq!(
        r.code,
        0,
        "{what}: forkd -s upgrade: {r:?}\nerror log:\n{}",
        srv.error_log()
    );
    let new = srv.master().expect("a pid file after the upgrade");
    srv.adopt_master(new);
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
    srv: &mut TestDaemon,
    cli_config: &Path,
    upgrade_timeout: Duration,
    reason: &[&str],
    what: &str,
) {
    let old = srv.master().expect("a pid file before the upgrade");
    let mut workers = children_of(old);
    workers.sort_unstable();
    let r = srv.ctl_with(cli_config, &["-s", "upgrade"]);
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
    let mut srv = site(2, accept, r#"drain_timeout: "5s","#).prepare();
    let first = start(&mut srv);
    let load = Load::start_mix(srv.port, &LIGHT_MIX);
    let watch = StatsWatch::start(srv.shm(), load.tally());
    load.wait_for_requests(200);
    let config = srv.config.clone();
    let mut masters = vec![first];
    let mut last_total = 0;
    for round in 1..=10 {
        let what = format!("{scenario}: upgrade {round}");
        let at = load.elapsed();
        let new = good_upgrade(&mut srv, &config, &what);
        eprintln!(
            "[{scenario}] upgrade {round} at +{} ms, done at +{} ms: master {new}",
            at.as_millis(),
            load.elapsed().as_millis()
        );
        assert!(!masters.contains(&new), "{what}: master {new} again");
        masters.push(new);
        // The new master's workers carry the load before the next upgrade.
        load.wait_for_requests(100);
        let completed = load.ok();
        let total = total_requests(&srv.shm()).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(
            total >= last_total && total >= completed,
            "{what}: totals.requests {total}, after the previous upgrade {last_total}, completed by the client {completed}"
        );
        last_total = total;
    }
    let report = load.stop();
    watch.assert_clean(&scenario);
    report.assert_clean(&scenario, 0);
    srv.stop_master();
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

/// Binary upgrades under h2c load (3 connections, 8 streams in flight on each): the old
/// master's workers send the two-step GOAWAY and finish their streams, the clients
/// reconnect to the new master's.
#[test]
fn four_upgrades_under_h2_load_fail_no_stream() {
    let scenario = "4 upgrades under h2 load";
    let mut srv = site(2, "Shared", r#"drain_timeout: "5s","#).h2c().prepare();
    let first = start(&mut srv);
    let load = support::h2load::H2Load::start(srv.port, 3, 8);
    load.wait_for(200);
    let config = srv.config.clone();
    let mut masters = vec![first];
    for round in 1..=4 {
        let what = format!("{scenario}: upgrade {round}");
        let new = good_upgrade(&mut srv, &config, &what);
        assert!(!masters.contains(&new), "{what}: master {new} again");
        masters.push(new);
        load.wait_for(200);
    }
    let report = load.stop();
    report.assert_clean(scenario, 1000);
    assert!(
        report.connections > 3,
        "the clients reconnected after the old masters' GOAWAY: {}",
        report.summary()
    );
    srv.stop_master();
    srv.assert_log_clean();
}

// ---------------------------------------------------------------------------------------
// 2. Failed upgrades roll back
// ---------------------------------------------------------------------------------------

#[test]
fn failed_upgrades_roll_back_under_load_and_a_good_one_follows() {
    let scenario = "failed upgrades";
    let top = r#"drain_timeout: "5s", upgrade_timeout: "1s","#;
    let mut srv = site(2, "Shared", top).prepare();
    let port = srv.port;
    let good_text = srv.builder.config_text(port);
    // A second valid configuration naming the same pid_file and shm_file (relative to
    // the same folder), for `-s upgrade` while the master's own file is broken.
    let cli_config = srv.path("cli.ron");
    std::fs::write(&cli_config, &good_text).unwrap();
    let master = start(&mut srv);
    let timeout = Duration::from_secs(1);
    let load = Load::start_mix(port, &LIGHT_MIX);
    load.wait_for_requests(200);

    srv.install_script("#!/bin/sh\nexit 3\n");
    failed_upgrade(
        &mut srv,
        &cli_config,
        timeout,
        &["exited with code 3"],
        "a new binary that exits at once",
    );
    load.wait_for_requests(100);

    srv.install_script("#!/bin/sh\nexec sleep 60\n");
    failed_upgrade(
        &mut srv,
        &cli_config,
        timeout,
        &["not ready within upgrade_timeout"],
        "a new binary that never says ready",
    );
    load.wait_for_requests(100);

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
    load.wait_for_requests(100);
    assert_eq!(srv.master(), Some(master));

    // The final good upgrade, with room for a busy machine.
    std::fs::write(
        &srv.config,
        good_text.replace(r#"upgrade_timeout: "1s""#, r#"upgrade_timeout: "10s""#),
    )
    .unwrap();
    let config = srv.config.clone();
    let r = srv.ctl_with(&config, &["-s", "reload"]);
    assert_eq!(r.code, 0, "reload to upgrade_timeout 10s: {r:?}");
    let new = good_upgrade(&mut srv, &config, "the good upgrade after the failed ones");
    assert_ne!(new, master);
    load.wait_for_requests(100);
    load.stop().assert_clean(scenario, 0);
    srv.stop_master();
    srv.assert_log_clean();
}

// ---------------------------------------------------------------------------------------
// 3. nginx's manual flow: USR2 by kill, WINCH, HUP
// ---------------------------------------------------------------------------------------

#[test]
fn usr2_by_kill_hands_over_then_winch_parks_the_workers_and_hup_brings_them_back() {
    let mut srv = site(2, "Shared", r#"drain_timeout: "5s","#).prepare();
    let old = start(&mut srv);
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
    srv.adopt_master(new);
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
    srv.stop_master();
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
    let mut srv = site(2, "Shared", top).prepare();
    let port = srv.port;
    let first_text = srv.builder.config_text(port);
    let reloaded_text = site(2, "Shared", top)
        .server(r#"keepalive_timeout: "20s","#)
        .config_text(port);
    assert_ne!(first_text, reloaded_text);
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
    let r = srv.ctl_with(&config, &["-s", "reload"]);
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
    let r = srv.ctl_with(&cli_config, &["-s", "reload"]);
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
    srv.stop_master();
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

/// forkd started the way systemd starts a socket-activated service: `listener` as fd 3,
/// `LISTEN_PID` (the forkd process itself unless `listen_pid` says otherwise),
/// `LISTEN_FDS=1`, `LISTEN_FDNAMES=http`.
fn activated_command(srv: &TestDaemon, listener: &TcpListener, listen_pid: Option<u32>) -> Command {
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
    let mut srv = site(2, "Shared", r#"drain_timeout: "5s","#).prepare_on(port);
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
    srv.stop_master();
    srv.assert_log_clean();
}

#[test]
fn socket_activation_for_another_pid_is_ignored_and_forkd_binds_itself() {
    // fd 3 listens on one port; the configuration names another.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let passed_port = listener.local_addr().unwrap().port();
    let inode = fd_link("self", listener.as_raw_fd());
    let mut srv = site(1, "Shared", r#"drain_timeout: "5s","#).prepare();
    let port = srv.port;
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
    srv.stop_master();
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
    run_ok(
        Command::new(BIN).arg("-c").arg(&config).arg("-t"),
        "forkd -t on the container config",
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

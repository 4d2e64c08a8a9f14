//! Workers' credentials: `user`, `group`, no_new_privs, and log files the workers can
//! re-open after giving up root.

mod support;

use std::os::unix::fs::MetadataExt;
use std::time::Duration;
use support::*;

/// `(real, effective, saved, fs)` uids, gids, supplementary groups and NoNewPrivs of
/// `pid`, from /proc.
struct Creds {
    uids: Vec<u32>,
    gids: Vec<u32>,
    groups: Vec<u32>,
    no_new_privs: bool,
}

fn creds(pid: i32) -> Creds {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| -> Vec<u32> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("{name} missing in /proc/{pid}/status"))
            .split_whitespace()
            .map(|v| v.parse().unwrap())
            .collect()
    };
    Creds {
        uids: field("Uid:"),
        gids: field("Gid:"),
        groups: field("Groups:"),
        no_new_privs: field("NoNewPrivs:") == [1],
    }
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

#[test]
fn workers_run_as_user_and_group_with_no_new_privs() {
    if !is_root() {
        panic!("this test switches users and must run as root (as CI and the README do)");
    }
    let d = TestDaemon::builder()
        .workers(2)
        .top(r#"user: Some("nobody"), group: Some("nogroup"),"#)
        .start();
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    let nogroup = nix::unistd::Group::from_name("nogroup").unwrap().unwrap();
    let (uid, gid) = (nobody.uid.as_raw(), nogroup.gid.as_raw());
    // A worker switches once it has opened its files; the second one may still be
    // starting when the first answers.
    assert!(
        wait_until(Duration::from_secs(10), || d
            .workers()
            .iter()
            .all(|&w| creds(w).uids == [uid; 4])),
        "the workers never switched to nobody"
    );
    for w in d.workers() {
        let c = creds(w);
        assert_eq!(c.uids, [uid; 4], "worker {w} uids");
        assert_eq!(c.gids, [gid; 4], "worker {w} gids");
        assert_eq!(c.groups, [gid], "worker {w} supplementary groups");
        assert!(c.no_new_privs, "worker {w} lacks no_new_privs");
    }
    // The master keeps its credentials (it binds ports on reload).
    assert_eq!(creds(d.pid()).uids, [0; 4]);
    assert_eq!(d.get("/").status, 200);
    // The log files belong to the workers' user, and nobody else may write them.
    for log in ["access.log", "error.log"] {
        let meta = std::fs::metadata(d.dir.path().join(log)).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (uid, gid), "{log} owner");
        assert_eq!(meta.mode() & 0o022, 0, "{log} is writable by others");
    }
}

#[test]
fn workers_without_user_still_set_no_new_privs() {
    let d = TestDaemon::builder().workers(2).start();
    assert!(
        wait_until(Duration::from_secs(10), || d
            .workers()
            .iter()
            .all(|&w| creds(w).no_new_privs)),
        "a worker never set no_new_privs"
    );
}

#[test]
fn a_rotated_access_log_is_reopened_by_workers_that_gave_up_root() {
    if !is_root() {
        panic!("this test switches users and must run as root (as CI and the README do)");
    }
    let d = TestDaemon::builder()
        .top(r#"user: Some("nobody"),"#)
        .file("a.txt", b"a\n")
        .start();
    assert_eq!(d.get("/a.txt?before").status, 200);
    let log = d.dir.path().join("access.log");
    assert!(
        d.wait_for_access_log("?before", Duration::from_secs(10)),
        "first line never logged"
    );
    // logrotate: move the file away, then ask for a reopen. The folder belongs to
    // root, so a worker running as nobody cannot create the new file itself.
    std::fs::rename(&log, d.dir.path().join("access.log.1")).unwrap();
    let (code, _, err) = d.ctl(&["-s", "reopen"]);
    assert_eq!(code, 0, "{err}");
    // The reopen reaches the worker asynchronously: keep asking until a line lands in
    // the new file (a request served before the reopen goes to the old file).
    let mut n = 0;
    assert!(
        wait_until(Duration::from_secs(10), || {
            n += 1;
            assert_eq!(d.get(&format!("/a.txt?after{n}")).status, 200);
            d.access_log().contains("?after")
        }),
        "no line reached the new access.log: {}",
        d.error_log()
    );
    assert!(
        !d.error_log().contains("reopening access log"),
        "a worker failed to reopen: {}",
        d.error_log()
    );
}

#[test]
fn group_without_user_and_unknown_group_are_config_errors() {
    let dir = TempDir::new();
    let b = TestDaemon::builder().top(r#"group: Some("nogroup"),"#);
    b.write_files(dir.path());
    let config = dir.path().join("forkd.ron");
    std::fs::write(&config, b.config_text(free_port())).unwrap();
    let (code, _, err) = run_forkd(&config, &["-t"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("`group` needs `user`"), "{err}");
    assert!(err.contains("forkd.ron:"), "no location: {err}");

    let b =
        TestDaemon::builder().top(r#"user: Some("nobody"), group: Some("no-such-group-here"),"#);
    std::fs::write(&config, b.config_text(free_port())).unwrap();
    let (code, _, err) = run_forkd(&config, &["-t"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("no group named `no-such-group-here`"), "{err}");
}

/// `temp_dir` with `user`: `-t` refuses a folder the workers could not reach once
/// they gave up root (a folder above it they cannot search), naming it; the master
/// makes a missing one so that they can: the folders above 0755, its own 0700 and
/// theirs.
#[test]
fn temp_dir_must_be_reachable_by_the_workers_user() {
    use std::os::unix::fs::PermissionsExt;
    if !is_root() {
        panic!("this test switches users and must run as root (as CI and the README do)");
    }
    let proxied = |temp_dir: &str| {
        TestDaemon::builder()
            .top(&format!(
                r#"user: Some("nobody"), temp_dir: "{temp_dir}", upstreams: {{ "app": (servers: ["127.0.0.1:9"]) }},"#
            ))
            .routes(
                r#"(prefix: "/healthz", handler: Liveness),
                (prefix: "/app/", handler: Proxy(upstream: "app")),
                (prefix: "/", handler: Static(root: "www")),"#,
            )
    };
    let dir = TempDir::new();
    let locked = dir.path().join("locked");
    std::fs::create_dir(&locked).unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o700)).unwrap();
    let b = proxied("locked/tmp");
    b.write_files(dir.path());
    let config = dir.path().join("forkd.ron");
    std::fs::write(&config, b.config_text(free_port())).unwrap();
    let (code, _, err) = run_forkd(&config, &["-t"]);
    assert_eq!(code, 1, "-t passed a temp_dir nobody cannot reach: {err}");
    assert!(
        err.contains("temp_dir")
            && err.contains(&format!("{} is not searchable", locked.display())),
        "{err}"
    );

    let d = proxied("spool/run/tmp").start();
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    let above = std::fs::metadata(d.path("spool/run")).unwrap();
    let tmp = std::fs::metadata(d.path("spool/run/tmp")).unwrap();
    assert_eq!(
        above.mode() & 0o777,
        0o755,
        "a folder above temp_dir made by the master"
    );
    assert_eq!(
        (tmp.mode() & 0o777, tmp.uid()),
        (0o700, nobody.uid.as_raw()),
        "temp_dir made by the master"
    );
}

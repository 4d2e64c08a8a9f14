//! Processes as /proc shows them (children, state, descriptors, sockets), signals, and
//! running the `forkd` binary as a command-line tool.

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_forkd");

/// Environment variables of the upgrade and systemd protocols: a forkd the tests start
/// never inherits them by accident.
pub const PROTOCOL_ENV: [&str; 7] = [
    "LISTEN_PID",
    "LISTEN_FDS",
    "LISTEN_FDNAMES",
    "NOTIFY_SOCKET",
    "FORKD_LISTENERS",
    "FORKD_READY_FD",
    "FORKD_UPGRADE_FROM",
];

/// Children of `pid`, from /proc.
pub fn children_of(pid: i32) -> Vec<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Every descendant of `pid`, depth first.
pub fn descendants_of(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for c in children_of(pid) {
        out.push(c);
        out.extend(descendants_of(c));
    }
    out
}

/// A process's state letter (R, S, Z, ...) from /proc; None if it is gone.
pub fn proc_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')').next()?.trim_start().chars().next()
}

/// The process exists and is not a zombie.
pub fn alive(pid: i32) -> bool {
    proc_state(pid).is_some_and(|s| s != 'Z')
}

pub fn proc_comm(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// A field of /proc/PID/status, e.g. `VmRSS` (its first number) or `Threads`.
pub fn proc_status_u64(pid: i32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// `(fd, link target)` of every open descriptor of `pid`, by descriptor number.
pub fn fd_table(pid: i32) -> Vec<(i32, String)> {
    let mut fds: Vec<(i32, String)> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| {
            dir.filter_map(|e| {
                let e = e.ok()?;
                let fd = e.file_name().to_str()?.parse().ok()?;
                let link = std::fs::read_link(e.path()).ok()?;
                Some((fd, link.display().to_string()))
            })
            .collect()
        })
        .unwrap_or_default();
    fds.sort();
    fds
}

/// What the open descriptors of `pid` point to (`socket:[INODE]`, paths, ...).
pub fn fd_links(pid: i32) -> Vec<String> {
    fd_table(pid).into_iter().map(|(_, link)| link).collect()
}

/// What descriptor `fd` of `pid` ("self" for this process) points to.
pub fn fd_link(pid: &str, fd: i32) -> String {
    std::fs::read_link(format!("/proc/{pid}/fd/{fd}"))
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

/// `socket:[INODE]` of every TCP socket listening on 127.0.0.1:`port` (/proc/net/tcp).
pub fn listening_sockets(port: u16) -> Vec<String> {
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

/// The state of the server's end of the connection `client_port` → `server_port`
/// (/proc/net/tcp) and the processes holding it, for failure reports.
pub fn server_side(server_port: u16, client_port: u16) -> String {
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

/// `kill -SIG PID` by name ("HUP", "QUIT", ...); panics if it fails.
pub fn signal(pid: i32, sig: &str) {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(status.success(), "kill -{sig} {pid}");
}

/// kill(2); panics if it fails.
pub fn send_signal(pid: i32, sig: Signal) {
    kill(Pid::from_raw(pid), sig).unwrap_or_else(|e| panic!("kill({pid}, {sig}): {e}"));
}

/// What `forkd -c CONFIG ARGS...` answered.
#[derive(Debug)]
pub struct Ctl {
    pub code: i32,
    pub out: String,
    pub err: String,
    pub took: Duration,
}

/// Runs `forkd -c CONFIG ARGS...` (no protocol variables inherited).
pub fn forkd_ctl(config: &Path, args: &[&str]) -> Ctl {
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

/// `forkd -c CONFIG` with no stdio and no protocol variables, to spawn (the daemon
/// harness aside: for a second master, or one that is meant to fail).
pub fn forkd_command(config: &Path) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.arg("-c")
        .arg(config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    for name in PROTOCOL_ENV {
        cmd.env_remove(name);
    }
    cmd
}

/// Runs `cmd` (stdin from /dev/null) to its end; panics naming `what`, with its
/// output, unless it succeeds.
pub fn run_ok(cmd: &mut Command, what: &str) {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs forkd with `-c config` and `args`; (exit code, stdout, stderr).
pub fn run_forkd(config: &Path, args: &[&str]) -> (i32, String, String) {
    let r = forkd_ctl(config, args);
    (r.code, r.out, r.err)
}

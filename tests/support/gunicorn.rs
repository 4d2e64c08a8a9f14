//! A real application server for end-to-end tests: gunicorn (PyPI, pinned) with two
//! sync workers running `wsgi_app.py`, on a reserved loopback port.
//!
//! ```text
//! venv()            ─ once per machine ─▶ <target>/tmp/gunicorn-VERSION-venv, made under
//!                                         a lock so parallel test binaries share it
//! Gunicorn::start() ─ per test ─────────▶ the app written to a temp folder, gunicorn
//!                                         serving it, both workers up; killed on drop
//! ```
//!
//! A sync worker serves one request at a time and closes the connection after it, so
//! two of them are exactly what a slow client can hold hostage: what a proxy does not
//! buffer costs the application a worker. What the app answers is documented in
//! `wsgi_app.py`; `big_body` and `crc32` compute the same bytes and checksum here.

use super::daemon::TempDir;
use super::http::get_close;
use super::port::PortReservation;
use super::process::children_of;
use super::wait::wait_until;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// The gunicorn release installed; the venv's folder names it, so a new pin gets a new
/// venv instead of reusing one with another version.
pub const GUNICORN_VERSION: &str = "23.0.0";

/// The application, written beside each gunicorn's logs.
pub const WSGI_APP: &str = include_str!("wsgi_app.py");

/// How long gunicorn may take to answer once started (two Python processes booting
/// on a loaded 2-core machine).
const BOOT: Duration = Duration::from_secs(60);

/// The venv with gunicorn (`venv.rs`), made once per machine.
pub fn venv() -> &'static Path {
    static VENV: OnceLock<PathBuf> = OnceLock::new();
    VENV.get_or_init(|| {
        super::venv::pinned(
            &format!("gunicorn-{GUNICORN_VERSION}"),
            &[&format!("gunicorn=={GUNICORN_VERSION}")],
        )
    })
}

/// gunicorn serving `wsgi_app.py` with two sync workers; stopped on drop.
pub struct Gunicorn {
    child: Child,
    port: PortReservation,
    dir: TempDir,
}

impl Gunicorn {
    /// Starts it and returns once it answers `/tiny` and both workers are up.
    pub fn start() -> Gunicorn {
        let venv = venv();
        let dir = TempDir::new();
        std::fs::write(dir.path().join("wsgi_app.py"), WSGI_APP).unwrap();
        // gunicorn binds with SO_REUSEADDR, so it can listen on the reserved port.
        let port = PortReservation::new();
        let addr = format!("127.0.0.1:{}", port.port());
        let child = Command::new(venv.join("bin/python"))
            .args(["-m", "gunicorn", "--workers", "2", "--worker-class", "sync"])
            .args(["--bind", &addr, "--graceful-timeout", "1"])
            .arg("--error-logfile")
            .arg(dir.path().join("error.log"))
            .arg("--chdir")
            .arg(dir.path())
            .arg("wsgi_app:application")
            .env("APP_SELF", &addr)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its own group: on drop the workers go with the master even if it is stuck.
            .process_group(0)
            .spawn()
            .expect("spawn gunicorn");
        let mut g = Gunicorn { child, port, dir };
        g.wait_serving();
        g
    }

    fn wait_serving(&mut self) {
        let port = self.port();
        let served = wait_until(BOOT, || {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("gunicorn exited ({status}):\n{}", self.error_log());
            }
            children_of(self.pid()).len() == 2
                && get_close(port, "/tiny").is_ok_and(|r| r.status == 200 && r.body == b"tiny\n")
        });
        assert!(
            served,
            "gunicorn did not serve within {BOOT:?}:\n{}",
            self.error_log()
        );
    }

    pub fn port(&self) -> u16 {
        self.port.port()
    }

    /// `127.0.0.1:PORT`, as an upstream's `servers` entry names it.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port())
    }

    /// The master's pid.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// The worker processes now.
    pub fn workers(&self) -> Vec<i32> {
        children_of(self.pid())
    }

    pub fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }
}

impl Drop for Gunicorn {
    fn drop(&mut self) {
        let group = Pid::from_raw(self.pid());
        // TERM: the workers get --graceful-timeout to finish, then the master kills them.
        let _ = killpg(group, Signal::SIGTERM);
        let exited = wait_until(Duration::from_secs(10), || {
            self.child.try_wait().ok().flatten().is_some()
        });
        // Whatever is left of the group (all of it, if the master did not exit).
        let _ = killpg(group, Signal::SIGKILL);
        if !exited {
            let _ = self.child.wait();
        }
    }
}

/// What `/big?mb=N` answers: block i (64 KiB) is i as 8 big-endian bytes, then
/// `j % 251` for j in 8..65536.
pub fn big_body(mb: usize) -> Vec<u8> {
    const BLOCK: usize = 64 * 1024;
    let fill: Vec<u8> = (0..BLOCK).map(|j| (j % 251) as u8).collect();
    let mut out = Vec::with_capacity(mb << 20);
    for i in 0..(mb << 20) / BLOCK {
        out.extend_from_slice(&(i as u64).to_be_bytes());
        out.extend_from_slice(&fill[8..]);
    }
    out
}

/// CRC-32 (IEEE, as zlib's `crc32`), what `/upload` answers of the body it read.
pub fn crc32(bytes: &[u8]) -> u32 {
    let mut table = [0u32; 256];
    for (n, entry) in table.iter_mut().enumerate() {
        let mut c = n as u32;
        for _ in 0..8 {
            c = if c & 1 == 1 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
        }
        *entry = c;
    }
    !bytes.iter().fold(!0u32, |c, &b| {
        table[((c ^ b as u32) & 0xFF) as usize] ^ (c >> 8)
    })
}

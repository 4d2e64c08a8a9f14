//! `CheckedUpstream`: an HTTP/1.1 upstream for the active-check tests. It counts the
//! requests it gets per path, answers its check paths with a status the test sets
//! (`set_health`), and every other request with 200 and a body naming itself
//! (keep-alive, so the proxy's pools are used as in production).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

struct State {
    name: String,
    /// Paths answered with `health` (the check paths).
    check_paths: Mutex<Vec<String>>,
    health: AtomicU16,
    hits: Mutex<HashMap<String, u64>>,
    connections: AtomicU64,
    stop: AtomicBool,
}

pub struct CheckedUpstream {
    pub addr: SocketAddr,
    state: Arc<State>,
}

impl CheckedUpstream {
    /// Listens on `ip`:0; check paths `/healthz` and `/ready2`, answered 200.
    pub fn start(name: &str, ip: &str) -> CheckedUpstream {
        Self::start_on(name, &format!("{ip}:0"))
    }

    /// Listens on `addr` (`ip:port`).
    pub fn start_on(name: &str, addr: &str) -> CheckedUpstream {
        let listener = TcpListener::bind(addr).unwrap_or_else(|e| panic!("bind {addr}: {e}"));
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State {
            name: name.to_string(),
            check_paths: Mutex::new(vec!["/healthz".into(), "/ready2".into()]),
            health: AtomicU16::new(200),
            hits: Mutex::new(HashMap::new()),
            connections: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        });
        let s = state.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.stop.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                s.connections.fetch_add(1, Ordering::Relaxed);
                let s = s.clone();
                std::thread::spawn(move || serve(conn, &s));
            }
        });
        CheckedUpstream { addr, state }
    }

    /// The status the check paths answer from now on.
    pub fn set_health(&self, status: u16) {
        self.state.health.store(status, Ordering::Relaxed);
    }

    /// Requests for exactly `path` so far.
    pub fn hits(&self, path: &str) -> u64 {
        let hits = self.state.hits.lock().unwrap();
        hits.get(path).copied().unwrap_or(0)
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.state.connections.load(Ordering::Relaxed)
    }

    /// Requests for anything but the check paths so far (client requests).
    pub fn client_requests(&self) -> u64 {
        let checks = self.state.check_paths.lock().unwrap().clone();
        let hits = self.state.hits.lock().unwrap();
        hits.iter()
            .filter(|(p, _)| !checks.contains(p))
            .map(|(_, n)| n)
            .sum()
    }
}

impl Drop for CheckedUpstream {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Relaxed);
        // Wakes the accept loop so it sees `stop`.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
    }
}

fn serve(conn: TcpStream, s: &State) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
    let mut out = conn.try_clone().unwrap();
    let mut reader = BufReader::new(conn);
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let path = line.split(' ').nth(1).unwrap_or("").to_string();
        let mut length = 0usize;
        let mut close = false;
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            let lower = h.to_ascii_lowercase();
            if let Some(v) = lower.strip_prefix("content-length:") {
                length = v.trim().parse().unwrap_or(0);
            }
            if lower.starts_with("connection:") && lower.contains("close") {
                close = true;
            }
        }
        let mut body = vec![0u8; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        *s.hits.lock().unwrap().entry(path.clone()).or_insert(0) += 1;
        let is_check = s.check_paths.lock().unwrap().contains(&path);
        let (status, text) = if is_check {
            let status = s.health.load(Ordering::Relaxed);
            (status, format!("check {status}\n"))
        } else {
            (200, format!("{}\n", s.name))
        };
        let reply = format!(
            "HTTP/1.1 {status} X\r\nContent-Length: {}\r\n{}\r\n{text}",
            text.len(),
            if close { "Connection: close\r\n" } else { "" }
        );
        if out.write_all(reply.as_bytes()).is_err() || close {
            return;
        }
    }
}

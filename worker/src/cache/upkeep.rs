//! The worker's cache thread, started after `fork` (and after privileges are
//! dropped) when the configuration has cache zones. It does the work no request
//! waits for:
//!
//! - **Loader and manager.** Once a second, for each zone, it takes or renews the
//!   zone's lease (one process of the daemon holds it); the holder fills an index
//!   made anew from the body files (`forkd_shared::cache::upkeep::load`), then
//!   removes inactive entries and evicts the least recently used past `max_size`.
//! - **Background refreshes** (`stale-while-revalidate`): a stale entry was just
//!   served, and the request that served it took the key's lock and handed the
//!   fetch here. The thread sends the request the loop built (with the entry's
//!   validators) to the upstream's servers in turn over a blocking connection with
//!   the upstream's timeouts, and stores the answer, or refreshes the entry on a 304,
//!   through the same `fill::Plan` a fetch on the loop uses. A refresh bypasses the
//!   worker's connection pools and the balancer: it is one request per stale key
//!   for the whole daemon, and the client that triggered it has its answer already.

use super::fill::{AtHead, Plan};
use super::zones::Zone;
use crate::proxy::body::Decoder;
use crate::proxy::response_head::{self, Parsed, ResponseContext, UpstreamBody};
use forkd_shared::cache::upkeep::{give_lease, load, manage, take_lease};
use forkd_shared::config::UpstreamAddress;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A background refresh.
pub struct Refresh {
    pub plan: Box<Plan>,
    /// The request head to send (the loop wrote it as for a proxied request).
    pub head: Vec<u8>,
    /// The upstream's servers' addresses, tried in order.
    pub addrs: Vec<UpstreamAddress>,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
}

/// The loop's side of the thread.
pub struct Upkeep {
    zones: Arc<Mutex<Vec<Arc<Zone>>>>,
    jobs: Option<SyncSender<Refresh>>,
    /// The worker drains: the thread gives its leases up and takes no more.
    stopping: Arc<AtomicBool>,
}

/// Refreshes queued at most (more are dropped: the entry stays stale a little
/// longer, and the next request after it tries again).
const MAX_REFRESHES: usize = 256;

impl Upkeep {
    /// No thread (no zones yet, or before the worker serves).
    pub fn off() -> Upkeep {
        Upkeep {
            zones: Arc::new(Mutex::new(Vec::new())),
            jobs: None,
            stopping: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Starts the thread over `zones`.
    pub fn start(zones: Vec<Arc<Zone>>) -> Upkeep {
        let shared = Arc::new(Mutex::new(zones));
        let (tx, rx) = mpsc::sync_channel(MAX_REFRESHES);
        let for_thread = shared.clone();
        let stopping = Arc::new(AtomicBool::new(false));
        let stop = stopping.clone();
        let started = std::thread::Builder::new()
            .name("forkd-cache".into())
            .spawn(move || run(for_thread, rx, stop));
        match started {
            Ok(_) => Upkeep {
                zones: shared,
                jobs: Some(tx),
                stopping,
            },
            Err(e) => {
                forkd_shared::error!(
                    "starting the cache thread failed: no loader, manager or background refresh in this worker: {e}"
                );
                Upkeep {
                    zones: shared,
                    jobs: None,
                    stopping,
                }
            }
        }
    }

    /// The worker drains: another worker takes the loader's and manager's work
    /// (the leases are given up within a second).
    pub fn stop(&self) {
        self.stopping.store(true, Relaxed);
    }

    pub fn running(&self) -> bool {
        self.jobs.is_some()
    }

    /// The zones of a configuration just adopted.
    pub fn set_zones(&self, zones: Vec<Arc<Zone>>) {
        if let Ok(mut z) = self.zones.lock() {
            *z = zones;
        }
    }

    /// Hands a refresh to the thread (dropped, its lock given back, if it cannot).
    pub fn refresh(&self, job: Refresh) {
        if let Some(tx) = &self.jobs {
            // A full queue drops the job: its plan gives the lock back.
            let _ = tx.try_send(job);
        }
    }
}

fn run(zones: Arc<Mutex<Vec<Arc<Zone>>>>, jobs: Receiver<Refresh>, stopping: Arc<AtomicBool>) {
    let pid = std::process::id();
    let mut next_pass = std::time::Instant::now();
    loop {
        let wait = next_pass.saturating_duration_since(std::time::Instant::now());
        match jobs.recv_timeout(wait) {
            Ok(job) => {
                refresh(job);
                continue;
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        next_pass = std::time::Instant::now() + Duration::from_secs(1);
        let now_zones: Vec<Arc<Zone>> = zones.lock().map(|z| z.clone()).unwrap_or_default();
        for zone in now_zones {
            let ix = zone.index();
            if stopping.load(Relaxed) {
                give_lease(&ix, pid);
                continue;
            }
            if !take_lease(&ix, pid) {
                continue;
            }
            if ix.header.loaded.load(std::sync::atomic::Ordering::Acquire) == 0 {
                let l = load(&zone.dir, &ix);
                forkd_shared::info!(
                    "cache zone `{}`: {} entries ({} bytes) loaded from {}, {} damaged files removed",
                    zone.name,
                    l.entries,
                    l.bytes,
                    zone.dir.display(),
                    l.removed
                );
            }
            manage(
                &zone.dir,
                &ix,
                zone.max_size,
                zone.inactive,
                forkd_shared::cache::unix_now(),
            );
        }
    }
}

/// One background refresh: the first server that answers decides.
fn refresh(job: Refresh) {
    let Refresh {
        plan,
        head,
        addrs,
        connect_timeout,
        read_timeout,
    } = job;
    let mut plan = Some(plan);
    for addr in &addrs {
        match fetch(addr, &head, connect_timeout, read_timeout, &mut plan) {
            Ok(()) => return,
            Err(e) => {
                forkd_shared::warn!("cache refresh from {addr} failed: {e}; the stale entry stays")
            }
        }
        if plan.is_none() {
            return;
        }
    }
}

/// A blocking socket to an upstream server.
enum Socket {
    Tcp(std::net::TcpStream),
    Unix(std::os::unix::net::UnixStream),
}

impl Socket {
    fn open(addr: &UpstreamAddress, connect: Duration, read: Duration) -> std::io::Result<Socket> {
        let s = match addr {
            UpstreamAddress::Tcp(a) => {
                let s = std::net::TcpStream::connect_timeout(a, connect)?;
                s.set_read_timeout(Some(read))?;
                s.set_write_timeout(Some(read))?;
                Socket::Tcp(s)
            }
            UpstreamAddress::Unix(p) => {
                let s = std::os::unix::net::UnixStream::connect(p)?;
                s.set_read_timeout(Some(read))?;
                s.set_write_timeout(Some(read))?;
                Socket::Unix(s)
            }
        };
        Ok(s)
    }

    fn write_all(&mut self, b: &[u8]) -> std::io::Result<()> {
        match self {
            Socket::Tcp(s) => s.write_all(b),
            Socket::Unix(s) => s.write_all(b),
        }
    }

    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Socket::Tcp(s) => s.read(b),
            Socket::Unix(s) => s.read(b),
        }
    }
}

/// The response head and body of one attempt, into the plan's decision. `plan` is
/// taken once the upstream answered (whatever it answered).
fn fetch(
    addr: &UpstreamAddress,
    head: &[u8],
    connect: Duration,
    read: Duration,
    plan: &mut Option<Box<Plan>>,
) -> std::io::Result<()> {
    let mut sock = Socket::open(addr, connect, read)?;
    sock.write_all(head)?;
    let ctx = ResponseContext {
        head_request: false,
        client_http10: false,
        client_keep_alive: false,
        upstream_requests: 1,
        keepalive_requests: 1,
        max_head: 32 * 1024,
        upgrade: false,
    };
    let mut buf = Vec::with_capacity(16 * 1024);
    let mut chunk = [0u8; 16 * 1024];
    let (parsed, client_head) = loop {
        let n = sock.read(&mut chunk)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut client_head = Vec::new();
        match response_head::parse(&buf, &ctx, &mut client_head) {
            Ok(Some(Parsed::Final(h))) => break (h, client_head),
            Ok(Some(Parsed::Interim { head_len, .. })) => {
                buf.drain(..head_len);
            }
            Ok(None) => {}
            Err(e) => return Err(std::io::Error::other(e.reason())),
        }
    };
    let now = forkd_shared::cache::unix_now();
    let upstream_head = buf[..parsed.head_len].to_vec();
    let taken = plan.take().expect("one plan per refresh");
    match taken.at_head(parsed.status, &upstream_head, &client_head, now) {
        AtHead::NotModified(p) => {
            p.refresh(&upstream_head, now);
            Ok(())
        }
        AtHead::Store(mut fill) => {
            let mut decoder = match parsed.upstream_body {
                UpstreamBody::None => Decoder::length(0),
                UpstreamBody::Length(n) => Decoder::length(n),
                UpstreamBody::Chunked => Decoder::chunked(),
                UpstreamBody::UntilClose => Decoder::until_close(),
            };
            let mut pending = buf[parsed.head_len..].to_vec();
            loop {
                let mut at = 0;
                while at < pending.len() && !decoder.is_done() {
                    let step = decoder
                        .decode(&pending[at..])
                        .map_err(|e| std::io::Error::other(format!("{e:?}")))?;
                    fill.data(&pending[at + step.data.start..at + step.data.end]);
                    at += step.consumed;
                    if step.consumed == 0 {
                        break;
                    }
                }
                pending.drain(..at);
                if decoder.is_done() {
                    fill.complete();
                    return Ok(());
                }
                let n = sock.read(&mut chunk)?;
                if n == 0 {
                    decoder
                        .eof()
                        .map_err(|e| std::io::Error::other(format!("{e:?}")))?;
                    if decoder.is_done() {
                        fill.complete();
                        return Ok(());
                    }
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
                pending.extend_from_slice(&chunk[..n]);
            }
        }
        // Not storable, or the application failed: the stale entry stays.
        AtHead::Pass | AtHead::StaleOnError(_) => Ok(()),
    }
}

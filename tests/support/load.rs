//! A multi-threaded load client, and the site it asks for: it runs GETs and POSTs
//! against a daemon until stopped, and counts every request that does not get its
//! complete, expected answer as failed, with the first reasons.
//!
//! A server close after a complete response is no failure (the client reconnects); a
//! request cut short is one.

use super::daemon::Builder;
use super::http::{check_response, get_request, Conn};
use super::noise;
use super::wait::wait_until;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A small file, answered from the worker's memory cache.
pub const SMALL_PATH: &str = "/load.txt";
/// A file above the cache's memory limit (64 KiB): answered with `sendfile`, so
/// responses are in flight for longer.
pub const BIG_PATH: &str = "/load-big.bin";
/// A POST target below the `Static` route: the body is read and discarded, then the
/// route answers 405 (a `Static` route serves only GET and HEAD).
pub const POST_PATH: &str = "/upload";
pub const POST_BODY_LEN: usize = 4096;

/// No load runs longer than this, whatever the test does (a load that does is a
/// failure: something hung).
pub const LOAD_HARD_CAP: Duration = Duration::from_secs(180);
/// The shortest stretch of load between two steps of a scenario.
const LOAD_PHASE_MIN: Duration = Duration::from_millis(100);
/// How long `wait_for` waits for progress.
const PROGRESS_WAIT: Duration = Duration::from_secs(30);

pub fn small_body() -> &'static [u8] {
    static BODY: OnceLock<Vec<u8>> = OnceLock::new();
    BODY.get_or_init(|| {
        (0..60)
            .map(|i| format!("line {i:02} of the small load file: the quick brown fox\n"))
            .collect::<String>()
            .into_bytes()
    })
}

pub fn big_body() -> &'static [u8] {
    static BODY: OnceLock<Vec<u8>> = OnceLock::new();
    BODY.get_or_init(|| noise(200 * 1024, 1))
}

pub fn post_body() -> &'static [u8] {
    static BODY: OnceLock<Vec<u8>> = OnceLock::new();
    BODY.get_or_init(|| noise(POST_BODY_LEN, 2))
}

/// `builder`'s site plus the files the load client asks for.
pub fn load_site(builder: Builder) -> Builder {
    builder
        .file("load.txt", small_body())
        .file("load-big.bin", big_body())
}

/// Checks a GET of the small load file.
pub fn check_small(r: &super::http::Response) -> Result<(), String> {
    check_response(r, SMALL_PATH, 200, Some(small_body()))
}

/// Polls GET of the small load file on new connections until one is answered
/// completely and as expected (at most `timeout`); Err: the last failure.
pub fn wait_small_served(port: u16, timeout: Duration) -> Result<(), String> {
    let mut last = String::new();
    let served = wait_until(timeout, || {
        match super::http::get_close(port, SMALL_PATH).and_then(|r| check_small(&r)) {
            Ok(()) => true,
            Err(e) => {
                last = e;
                false
            }
        }
    });
    if served {
        Ok(())
    } else {
        Err(last)
    }
}

/// What one client thread does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// GETs back to back on a persistent connection (every 8th for the big file).
    KeepAlive,
    /// One GET per new connection; `http10`: an HTTP/1.0 request, else `Connection: close`.
    PerConnection { http10: bool },
    /// POSTs with a body on a persistent connection (answered 405 after the body).
    Post,
}

/// The default mix: 4 keep-alive GET threads, 2 connection-per-request GET threads
/// (HTTP/1.1 and HTTP/1.0), 1 keep-alive POST thread.
pub const FULL_MIX: [Kind; 7] = [
    Kind::KeepAlive,
    Kind::KeepAlive,
    Kind::KeepAlive,
    Kind::KeepAlive,
    Kind::PerConnection { http10: false },
    Kind::PerConnection { http10: true },
    Kind::Post,
];

/// A lighter mix for scenarios that also run several masters: 2 keep-alive GET, 1
/// connection-per-request GET, 1 POST.
pub const LIGHT_MIX: [Kind; 4] = [
    Kind::KeepAlive,
    Kind::KeepAlive,
    Kind::PerConnection { http10: false },
    Kind::Post,
];

/// The load's live counts, shared with its threads.
#[derive(Default)]
pub struct Tally {
    ok_keepalive: AtomicU64,
    ok_per_connection: AtomicU64,
    ok_post: AtomicU64,
    failed: AtomicU64,
    connections: AtomicU64,
    /// Keep-alive connections given up after a `Connection: close` answer.
    close_answers: AtomicU64,
    /// Keep-alive connections found closed by the server after a complete answer.
    server_closes: AtomicU64,
    /// The first failures, with when and where they happened.
    reasons: Mutex<Vec<String>>,
}

impl Tally {
    /// Requests answered completely and as expected so far.
    pub fn ok(&self) -> u64 {
        self.ok_keepalive.load(SeqCst)
            + self.ok_per_connection.load(SeqCst)
            + self.ok_post.load(SeqCst)
    }
    pub fn failed(&self) -> u64 {
        self.failed.load(SeqCst)
    }
    fn ok_of(&self, kind: Kind) -> &AtomicU64 {
        match kind {
            Kind::KeepAlive => &self.ok_keepalive,
            Kind::PerConnection { .. } => &self.ok_per_connection,
            Kind::Post => &self.ok_post,
        }
    }
}

/// What a load run came to.
#[derive(Debug)]
pub struct LoadReport {
    pub ok_keepalive: u64,
    pub ok_per_connection: u64,
    pub ok_post: u64,
    pub failed: u64,
    pub connections: u64,
    pub close_answers: u64,
    pub server_closes: u64,
    pub reasons: Vec<String>,
    pub elapsed: Duration,
    pub hit_hard_cap: bool,
    /// The kinds of request that ran.
    kinds: Vec<Kind>,
}

impl LoadReport {
    pub fn ok(&self) -> u64 {
        self.ok_keepalive + self.ok_per_connection + self.ok_post
    }

    pub fn summary(&self) -> String {
        format!(
            "{} ok ({} keep-alive GET, {} connection-per-request GET, {} POST) and {} FAILED \
             in {:.1?} over {} connections ({} closed after `Connection: close`, {} closed by \
             the server after a complete response){}; first failures:\n  {}",
            self.ok(),
            self.ok_keepalive,
            self.ok_per_connection,
            self.ok_post,
            self.failed,
            self.elapsed,
            self.connections,
            self.close_answers,
            self.server_closes,
            if self.hit_hard_cap {
                "; the load hit its hard time cap"
            } else {
                ""
            },
            self.reasons.join("\n  ")
        )
    }

    /// Zero failures, at least `min_ok` requests, and every kind of request in the mix
    /// answered at least once: the scenario really ran under load.
    pub fn assert_clean(&self, scenario: &str, min_ok: u64) {
        eprintln!("[{scenario}] load: {}", self.summary());
        assert!(
            self.failed == 0 && !self.hit_hard_cap,
            "{scenario}: {}",
            self.summary()
        );
        let ran = |k: &Kind| match k {
            Kind::KeepAlive => self.ok_keepalive,
            Kind::PerConnection { .. } => self.ok_per_connection,
            Kind::Post => self.ok_post,
        } > 0;
        assert!(
            self.ok() >= min_ok && self.kinds.iter().all(ran),
            "{scenario}: too little load ran: {}",
            self.summary()
        );
    }
}

/// Client threads running until stopped (or `LOAD_HARD_CAP`).
pub struct Load {
    stop: Arc<AtomicBool>,
    tally: Arc<Tally>,
    threads: Vec<JoinHandle<()>>,
    started: Instant,
    kinds: Vec<Kind>,
}

impl Load {
    /// The full mix (`FULL_MIX`) against `port`.
    pub fn start(port: u16) -> Load {
        Load::start_mix(port, &FULL_MIX)
    }

    /// One thread per entry of `kinds` against `port`.
    pub fn start_mix(port: u16, kinds: &[Kind]) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let tally = Arc::new(Tally::default());
        let started = Instant::now();
        let threads = kinds
            .iter()
            .enumerate()
            .map(|(index, &kind)| {
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
            kinds: kinds.to_vec(),
        }
    }

    /// The flag that stops the load (a load balancer taking the server out).
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }

    /// The live counts (for watchers running beside the load).
    pub fn tally(&self) -> Arc<Tally> {
        self.tally.clone()
    }

    /// Time since the load started.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    pub fn ok(&self) -> u64 {
        self.tally.ok()
    }

    pub fn failed(&self) -> u64 {
        self.tally.failed()
    }

    /// Keeps the load running until `more` requests more have succeeded and at least
    /// `LOAD_PHASE_MIN` has passed (at most `PROGRESS_WAIT`).
    pub fn wait_for(&self, more: u64) {
        self.wait_progress(more, LOAD_PHASE_MIN);
    }

    /// Keeps the load running until `more` requests more have succeeded, however soon
    /// (at most `PROGRESS_WAIT`).
    pub fn wait_for_requests(&self, more: u64) {
        self.wait_progress(more, Duration::ZERO);
    }

    fn wait_progress(&self, more: u64, at_least: Duration) {
        let target = self.ok() + more;
        let until = Instant::now() + at_least;
        assert!(
            wait_until(PROGRESS_WAIT, || self.ok() >= target
                && Instant::now() >= until),
            "the load made no progress: {} ok, {} failed; first failures: {:?}",
            self.ok(),
            self.failed(),
            self.tally.reasons.lock().unwrap()
        );
    }

    /// Stops the threads and reports.
    pub fn stop(mut self) -> LoadReport {
        self.stop.store(true, SeqCst);
        for t in self.threads.drain(..) {
            t.join().expect("a load thread panicked");
        }
        let t = &self.tally;
        LoadReport {
            ok_keepalive: t.ok_keepalive.load(SeqCst),
            ok_per_connection: t.ok_per_connection.load(SeqCst),
            ok_post: t.ok_post.load(SeqCst),
            failed: t.failed.load(SeqCst),
            connections: t.connections.load(SeqCst),
            close_answers: t.close_answers.load(SeqCst),
            server_closes: t.server_closes.load(SeqCst),
            reasons: t.reasons.lock().unwrap().clone(),
            elapsed: self.started.elapsed(),
            hit_hard_cap: self.started.elapsed() >= LOAD_HARD_CAP,
            kinds: std::mem::take(&mut self.kinds),
        }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        // A failing test: let the threads end on their own (they check the flag between
        // requests) rather than block the panic on them.
        self.stop.store(true, SeqCst);
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
        !self.stop.load(SeqCst) && self.started.elapsed() < LOAD_HARD_CAP
    }

    fn fail(&self, reason: String) {
        self.tally.failed.fetch_add(1, SeqCst);
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

    fn connect(&self) -> Result<Conn, String> {
        self.tally.connections.fetch_add(1, SeqCst);
        Conn::connect(self.port)
    }

    fn run(self) {
        match self.kind {
            Kind::KeepAlive | Kind::Post => self.run_keepalive(),
            Kind::PerConnection { http10 } => self.run_per_connection(http10),
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
        let mut n: u64 = 0;
        while self.running() {
            // A server close after a complete response is no failure: reconnect.
            if let Some(c) = &conn {
                match c.closed_by_server() {
                    Ok(false) => {}
                    Ok(true) => {
                        self.tally.server_closes.fetch_add(1, SeqCst);
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
                match self.connect() {
                    Ok(c) => conn = Some(c),
                    Err(reason) => {
                        self.fail(reason);
                        continue;
                    }
                }
            }
            let c = conn.as_mut().unwrap();
            n += 1;
            let began = Instant::now();
            let result = match self.kind {
                Kind::Post => c.exchange(&post).and_then(|r| {
                    check_response(&r, POST_PATH, 405, None)?;
                    if !r.body_str().contains("405 Method Not Allowed") {
                        return Err(format!("POST {POST_PATH}: 405 without its error page"));
                    }
                    Ok(r)
                }),
                _ if n % 8 == 7 => c
                    .exchange(&get_big)
                    .and_then(|r| check_response(&r, BIG_PATH, 200, Some(big_body())).map(|()| r)),
                _ => c
                    .exchange(&get_small)
                    .and_then(|r| check_small(&r).map(|()| r)),
            };
            match result {
                Ok(r) => {
                    self.tally.ok_of(self.kind).fetch_add(1, SeqCst);
                    if r.closes() {
                        // The whole response is read: reconnect for the next one.
                        self.tally.close_answers.fetch_add(1, SeqCst);
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

    fn run_per_connection(&self, http10: bool) {
        let request = if http10 {
            format!("GET {SMALL_PATH} HTTP/1.0\r\nHost: localhost\r\n\r\n").into_bytes()
        } else {
            get_request(SMALL_PATH, true)
        };
        while self.running() {
            let began = Instant::now();
            let result = self.connect().and_then(|mut c| {
                let r = c
                    .exchange(&request)
                    .map_err(|e| format!("{e} [{}]", c.describe(began)))?;
                check_small(&r)?;
                // The server closes first (no TIME_WAIT piles up on the client's ports);
                // whatever happens after a complete response is not a failed request.
                let _ = c.wait_close(Duration::from_secs(2));
                Ok(())
            });
            match result {
                Ok(()) => {
                    self.tally.ok_of(self.kind).fetch_add(1, SeqCst);
                }
                Err(reason) => self.fail(reason),
            }
        }
    }
}

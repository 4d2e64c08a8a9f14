//! An HTTP/2 load client for the lifecycle tests: threads that each keep one h2c
//! connection with several streams in flight (the `h2` crate's client on a one-thread
//! tokio runtime per thread; the server under test stays ours), asking for the same
//! site as the HTTP/1.1 load (`load.rs`): the small file, the big one (past the 64 KiB
//! stream window, so flow control runs) and a POST with a body.
//!
//! A stream that does not get its complete, expected answer is a failure. A
//! connection the server ends with GOAWAY is none: the client opens a new one, as a
//! browser does. A stream the server said it never processed (above the GOAWAY's last
//! stream id, or refused) would be safe to retry; it is counted apart, since the
//! two-step GOAWAY forkd sends should leave none.

use super::load::{
    big_body, post_body, small_body, BIG_PATH, LOAD_HARD_CAP, POST_PATH, SMALL_PATH,
};
use super::wait::wait_until;
use bytes::Bytes;
use h2::client::SendRequest;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long one stream may take, whatever happens to the server (a stream that takes
/// longer hung).
const STREAM_CAP: Duration = Duration::from_secs(60);
/// How long `wait_for` waits for progress.
const PROGRESS_WAIT: Duration = Duration::from_secs(30);

#[derive(Default)]
pub struct H2Tally {
    ok: AtomicU64,
    failed: AtomicU64,
    /// Streams the server did not process (REFUSED_STREAM, or above a GOAWAY's last id).
    unprocessed: AtomicU64,
    connections: AtomicU64,
    /// Connections the server ended gracefully (GOAWAY with NO_ERROR, then close).
    goaways: AtomicU64,
    /// Set once the server is told to stop: no new connection is opened from then on,
    /// the open ones run until the server ends them.
    closing: AtomicBool,
    reasons: Mutex<Vec<String>>,
}

impl H2Tally {
    fn fail(&self, started: Instant, what: String) {
        self.failed.fetch_add(1, SeqCst);
        let mut reasons = self.reasons.lock().unwrap();
        if reasons.len() < 10 {
            reasons.push(format!("+{} ms: {what}", started.elapsed().as_millis()));
        }
    }
}

#[derive(Debug)]
pub struct H2Report {
    pub ok: u64,
    pub failed: u64,
    pub unprocessed: u64,
    pub connections: u64,
    pub goaways: u64,
    pub reasons: Vec<String>,
    pub elapsed: Duration,
    pub hit_hard_cap: bool,
}

impl H2Report {
    pub fn summary(&self) -> String {
        format!(
            "{} streams ok and {} FAILED, {} unprocessed (safe to retry), in {:.1?} over {} \
             h2 connections ({} ended by the server's GOAWAY){}; first failures:\n  {}",
            self.ok,
            self.failed,
            self.unprocessed,
            self.elapsed,
            self.connections,
            self.goaways,
            if self.hit_hard_cap {
                "; the load hit its hard time cap"
            } else {
                ""
            },
            self.reasons.join("\n  ")
        )
    }

    /// No failed and no unprocessed stream, and at least `min_ok` streams answered.
    pub fn assert_clean(&self, scenario: &str, min_ok: u64) {
        eprintln!("[{scenario}] h2 load: {}", self.summary());
        assert!(
            self.failed == 0 && self.unprocessed == 0 && !self.hit_hard_cap,
            "{scenario}: {}",
            self.summary()
        );
        assert!(
            self.ok >= min_ok,
            "{scenario}: too little load ran: {}",
            self.summary()
        );
    }
}

/// `connections` threads, each with one h2c connection at a time and `streams`
/// streams in flight on it, until stopped (or `LOAD_HARD_CAP`).
pub struct H2Load {
    stop: Arc<AtomicBool>,
    tally: Arc<H2Tally>,
    threads: Vec<JoinHandle<()>>,
    started: Instant,
}

impl H2Load {
    pub fn start(port: u16, connections: usize, streams: usize) -> H2Load {
        let stop = Arc::new(AtomicBool::new(false));
        let tally = Arc::new(H2Tally::default());
        let started = Instant::now();
        let threads = (0..connections)
            .map(|index| {
                let client = Client {
                    port,
                    streams,
                    stop: stop.clone(),
                    tally: tally.clone(),
                    started,
                };
                std::thread::Builder::new()
                    .name(format!("h2load-{index}"))
                    .spawn(move || client.run())
                    .unwrap()
            })
            .collect();
        H2Load {
            stop,
            tally,
            threads,
            started,
        }
    }

    pub fn ok(&self) -> u64 {
        self.tally.ok.load(SeqCst)
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Runs until `more` streams more have been answered (at most `PROGRESS_WAIT`).
    pub fn wait_for(&self, more: u64) {
        let target = self.ok() + more;
        assert!(
            wait_until(PROGRESS_WAIT, || self.ok() >= target),
            "the h2 load made no progress: {} ok, {} failed; first failures: {:?}",
            self.ok(),
            self.tally.failed.load(SeqCst),
            self.tally.reasons.lock().unwrap()
        );
    }

    /// The server is about to be stopped: open no new connection (one in its accept
    /// queue when it stops listening would be reset unseen, as with any server), keep
    /// the streams of the open ones going until the server ends them.
    pub fn server_closing(&self) {
        self.tally.closing.store(true, SeqCst);
    }

    pub fn stop(mut self) -> H2Report {
        self.stop.store(true, SeqCst);
        for t in self.threads.drain(..) {
            t.join().expect("an h2 load thread panicked");
        }
        let t = &self.tally;
        H2Report {
            ok: t.ok.load(SeqCst),
            failed: t.failed.load(SeqCst),
            unprocessed: t.unprocessed.load(SeqCst),
            connections: t.connections.load(SeqCst),
            goaways: t.goaways.load(SeqCst),
            reasons: t.reasons.lock().unwrap().clone(),
            elapsed: self.started.elapsed(),
            hit_hard_cap: self.started.elapsed() >= LOAD_HARD_CAP,
        }
    }
}

impl Drop for H2Load {
    fn drop(&mut self) {
        self.stop.store(true, SeqCst);
    }
}

#[derive(Clone)]
struct Client {
    port: u16,
    streams: usize,
    stop: Arc<AtomicBool>,
    tally: Arc<H2Tally>,
    started: Instant,
}

/// What a stream asks for, by its number on the connection: every 8th the big file,
/// every 5th a POST, else the small file; the status and body it must get.
fn pick(n: u64) -> (&'static str, bool, u16, Expect) {
    if n % 8 == 7 {
        (BIG_PATH, false, 200, Expect::Exactly(big_body()))
    } else if n % 5 == 4 {
        // A Static route reads the body, then answers 405 with its error page.
        (
            POST_PATH,
            true,
            405,
            Expect::Contains("405 Method Not Allowed"),
        )
    } else {
        (SMALL_PATH, false, 200, Expect::Exactly(small_body()))
    }
}

#[derive(Clone, Copy)]
enum Expect {
    Exactly(&'static [u8]),
    Contains(&'static str),
}

impl Expect {
    fn matches(self, bytes: &[u8]) -> bool {
        match self {
            Expect::Exactly(body) => bytes == body,
            Expect::Contains(text) => String::from_utf8_lossy(bytes).contains(text),
        }
    }
}

impl Client {
    fn stopped(&self) -> bool {
        self.stop.load(SeqCst) || self.started.elapsed() >= LOAD_HARD_CAP
    }

    fn run(self) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .expect("a tokio runtime for the h2 client");
        runtime.block_on(self.connections());
    }

    /// One connection after another until stopped.
    async fn connections(&self) {
        while !self.stopped() && !self.tally.closing.load(SeqCst) {
            let tcp = match tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await {
                Ok(tcp) => tcp,
                Err(e) => {
                    self.tally.fail(self.started, format!("connect: {e}"));
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            self.tally.connections.fetch_add(1, SeqCst);
            let (send, connection) = match h2::client::handshake(tcp).await {
                Ok(pair) => pair,
                Err(e) => {
                    self.tally.fail(self.started, format!("h2 handshake: {e}"));
                    continue;
                }
            };
            let driver = tokio::spawn(connection);
            let streams: Vec<_> = (0..self.streams)
                .map(|i| tokio::spawn(self.clone().streams(send.clone(), i as u64)))
                .collect();
            drop(send);
            for s in streams {
                s.await.expect("a stream task panicked");
            }
            match driver.await.expect("the connection task panicked") {
                Ok(()) => {
                    self.tally.goaways.fetch_add(1, SeqCst);
                }
                Err(e) if e.is_go_away() && e.reason() == Some(h2::Reason::NO_ERROR) => {
                    self.tally.goaways.fetch_add(1, SeqCst);
                }
                // A connection error with every stream answered cost the user
                // nothing; a stream it cut is counted where it was cut.
                Err(_) => {}
            }
        }
    }

    /// Streams one after another on `send` until the connection goes away or the load
    /// stops; the `n`th asks for `pick(n)`.
    async fn streams(self, mut send: SendRequest<Bytes>, mut n: u64) {
        while !self.stopped() {
            send = match send.ready().await {
                Ok(send) => send,
                // Going away (GOAWAY received or closed): no stream was sent on it.
                Err(_) => return,
            };
            let (path, post, status, body) = pick(n);
            n += self.streams as u64;
            let request = http::Request::builder()
                .method(if post { "POST" } else { "GET" })
                .uri(format!("http://127.0.0.1:{}{path}", self.port))
                .body(())
                .unwrap();
            let (response, mut upload) = match send.send_request(request, !post) {
                Ok(pair) => pair,
                Err(_) => return,
            };
            if post {
                if let Err(e) = upload.send_data(Bytes::from_static(post_body()), true) {
                    self.tally
                        .fail(self.started, format!("POST {path}: body: {e}"));
                    return;
                }
            }
            let outcome = tokio::time::timeout(STREAM_CAP, read_answer(response)).await;
            match outcome {
                Ok(Ok((got, bytes))) if got == status && body.matches(&bytes) => {
                    self.tally.ok.fetch_add(1, SeqCst);
                }
                Ok(Ok((got, bytes))) => self.tally.fail(
                    self.started,
                    format!(
                        "{path}: status {got} (want {status}), {} body bytes: {:?}",
                        bytes.len(),
                        String::from_utf8_lossy(&bytes[..bytes.len().min(80)])
                    ),
                ),
                Ok(Err(e)) if unprocessed(&e) => {
                    self.tally.unprocessed.fetch_add(1, SeqCst);
                }
                Ok(Err(e)) => {
                    self.tally.fail(self.started, format!("{path}: {e:?}"));
                    return;
                }
                Err(_) => {
                    self.tally
                        .fail(self.started, format!("{path}: no answer in {STREAM_CAP:?}"));
                    return;
                }
            }
        }
    }
}

/// The server said it did not process the stream: REFUSED_STREAM, or a GOAWAY whose
/// last stream id is below it.
fn unprocessed(e: &h2::Error) -> bool {
    e.reason() == Some(h2::Reason::REFUSED_STREAM)
        || (e.is_go_away() && e.is_remote() && e.reason() == Some(h2::Reason::NO_ERROR))
}

/// The status and the whole body of a response.
async fn read_answer(response: h2::client::ResponseFuture) -> Result<(u16, Vec<u8>), h2::Error> {
    let answer = super::h2client::read_answer(response).await?;
    Ok((answer.status, answer.body))
}

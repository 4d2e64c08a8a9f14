//! Blocking file work off the event loop: a small pool of threads per worker
//! (`file_threads`) that opens, `fstat`s and reads the files of static routes.
//!
//! ```text
//!  dispatch: static route, not in the file cache ──▶ Files::request ──▶ Next::File(id)
//!        (one job per route and path: later requests join it)       │
//!                                                                   ▼
//!  the connection (or HTTP/2 stream) waits in its own state; the others run
//!                                                                   │
//!  thread: static_files::resolve ──▶ done list ──▶ Waker ──▶ Files::collect
//!                                                                   │
//!  each waiter is driven: Files::take(id) ──▶ dispatch::answer_after_file
//! ```
//!
//! A file already in the open-file cache is answered on the loop, with no hand-off.
//! At most `QUEUE_PER_THREAD` jobs per thread are handed out at once; the rest wait
//! here in order (a request is never refused for a full queue). Made after `fork`
//! and after privileges are dropped (`EventLoop::run`).
//!
//! - `queue`: the bookkeeping, sans-io (jobs by key, waiters, the bound);
//! - `threads`: the threads and the job they run.

mod queue;
mod threads;

use crate::handlers::static_files::Landed;
use crate::stats::Stats;
use forkd_shared::shm::counters;
pub use queue::JobId;
use queue::Jobs;
use rustc_hash::FxHashMap;
use threads::{Done, Job, Threads};

/// Jobs handed to the threads at once, per thread.
const QUEUE_PER_THREAD: usize = 16;
/// A result not taken by all its waiters (some left) is dropped this long after it
/// came (microseconds).
const LANDED_FOR: u64 = 10_000_000;

/// A job's key: the configuration it was made under, the route, the path.
type Key = (u64, usize, Box<[u8]>);

/// A job's result, kept until each connection waiting for it has taken it.
struct Arrived {
    landed: Landed,
    epoch: u64,
    /// Waiters that have not taken it yet.
    remaining: usize,
    submitted: u64,
    at: u64,
}

/// The worker's file pool.
pub struct Files {
    threads: Option<Threads>,
    jobs: Jobs<Key, Job>,
    arrived: FxHashMap<JobId, Arrived>,
    /// Bumped when a configuration is adopted: route numbers may mean other routes
    /// from then on, so older results are not served for newer requests.
    epoch: u64,
    done: Vec<Done>,
}

impl Files {
    /// No threads: files are opened on the event loop.
    pub fn off() -> Files {
        Files {
            threads: None,
            jobs: Jobs::new(1),
            arrived: FxHashMap::default(),
            epoch: 0,
            done: Vec::new(),
        }
    }

    /// `n` threads (none if 0) waking the loop through `waker`. A pool that cannot
    /// be started is logged, and files are opened on the loop.
    pub fn start(n: usize, waker: impl FnOnce() -> std::io::Result<mio::Waker>) -> Files {
        let mut files = Files::off();
        if n == 0 {
            return files;
        }
        match waker().and_then(|w| Threads::start(n, w)) {
            Ok(t) => {
                files.threads = Some(t);
                files.jobs = Jobs::new(n * QUEUE_PER_THREAD);
            }
            Err(e) => forkd_shared::error!(
                "starting {n} file thread(s) failed, files are opened on the event loop: {e}"
            ),
        }
        files
    }

    /// Whether files go to the threads.
    pub fn enabled(&self) -> bool {
        self.threads.is_some()
    }

    /// A job for `path` of the static route `route` (`root`, `index`, `fallback`),
    /// or the one under way for it; its id, to wait for with [`Files::wait`].
    #[allow(clippy::too_many_arguments)]
    pub fn request(
        &mut self,
        route: usize,
        path: &[u8],
        root: &std::path::Path,
        index: &[String],
        fallback: Option<&str>,
        now_us: u64,
        now_secs: u64,
        stats: &Stats,
    ) -> JobId {
        let key = (self.epoch, route, Box::from(path));
        let submitted = self.jobs.submit(key, now_us, || Job {
            root: root.to_path_buf(),
            index: index.to_vec(),
            path: Box::from(path),
            fallback: fallback.map(String::from),
            now_secs,
        });
        stats.bump(counters::FILE_QUEUE_DEPTH, submitted.ahead as u64);
        if submitted.joined {
            stats.bump(counters::FILE_JOBS_JOINED, 1);
        }
        if let (Some(job), Some(t)) = (submitted.send, &self.threads) {
            t.send(submitted.id, job);
        }
        submitted.id
    }

    /// Connection `key` waits for job `id`.
    pub fn wait(&mut self, id: JobId, key: usize) {
        self.jobs.wait(id, key);
    }

    /// The results that came back: kept for their waiters, whose connection keys
    /// are pushed to `wake` (each connection once per call). More jobs are handed
    /// out as room frees.
    pub fn collect(&mut self, now_us: u64, stats: &Stats, wake: &mut Vec<usize>) {
        let Some(threads) = &self.threads else {
            return;
        };
        threads.take_done(&mut self.done);
        let start = wake.len();
        for done in self.done.drain(..) {
            let Some(finished) = self.jobs.finish(done.id) else {
                continue;
            };
            stats.bump(counters::FILE_JOBS, 1);
            let (epoch, route, path) = finished.key;
            wake.extend_from_slice(&finished.waiters);
            if finished.waiters.is_empty() {
                continue;
            }
            let landed = Landed {
                route,
                path,
                found: done.found.shared(),
                fallback: done.fallback.map(|f| f.shared()),
            };
            self.arrived.insert(
                done.id,
                Arrived {
                    landed,
                    epoch,
                    remaining: finished.waiters.len(),
                    submitted: finished.submitted,
                    at: now_us,
                },
            );
        }
        while let Some((id, job)) = self.jobs.next_to_send() {
            threads.send(id, job);
        }
        let woken = &mut wake[start..];
        woken.sort_unstable();
        let mut n = 0;
        for i in 0..woken.len() {
            if i == 0 || woken[i] != woken[n - 1] {
                woken[n] = woken[i];
                n += 1;
            }
        }
        wake.truncate(start + n);
    }

    /// Whether job `id`'s result is here to take.
    pub fn arrived(&self, id: JobId) -> bool {
        self.arrived.contains_key(&id)
    }

    /// Job `id`'s result, for one of its waiters (`None` once it is not for the
    /// configuration in force: the waiter then opens the file itself). Counts the
    /// time it waited.
    pub fn take(&mut self, id: JobId, now_us: u64, stats: &Stats) -> Option<Landed> {
        let a = self.arrived.get_mut(&id)?;
        stats.bump(counters::FILE_WAIT_US, now_us.saturating_sub(a.submitted));
        a.remaining = a.remaining.saturating_sub(1);
        let landed = (a.epoch == self.epoch).then(|| a.landed.clone());
        if a.remaining == 0 {
            self.arrived.remove(&id);
        }
        landed
    }

    /// A configuration was adopted.
    pub fn adopted(&mut self) {
        self.epoch += 1;
    }

    /// Drops results whose waiters left without taking them.
    pub fn sweep(&mut self, now_us: u64) {
        self.arrived
            .retain(|_, a| now_us.saturating_sub(a.at) < LANDED_FOR);
    }
}

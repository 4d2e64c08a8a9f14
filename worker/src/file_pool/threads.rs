//! The pool's threads: they take jobs from a shared queue, do the blocking file
//! work, and hand each result back with a wake of the event loop (a mio `Waker`).
//! Made after `fork`, in the worker (the master never has threads).

use super::queue::JobId;
use crate::file_cache::CachedFile;
use crate::handlers::static_files::{self, Resolved};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// The file work for one route's path.
pub struct Job {
    pub root: PathBuf,
    pub index: Vec<String>,
    pub path: Box<[u8]>,
    /// The route's `fallback`, resolved too when the path is missing.
    pub fallback: Option<String>,
    pub now_secs: u64,
}

/// What a job found.
pub struct Done {
    pub id: JobId,
    pub found: Resolved<CachedFile>,
    pub fallback: Option<Resolved<CachedFile>>,
}

impl Job {
    fn run(self, id: JobId) -> Done {
        #[cfg(debug_assertions)]
        test_gate(&self.root, &self.path);
        let found = static_files::resolve(&self.root, &self.index, &self.path, self.now_secs);
        let fallback = match (&found, &self.fallback) {
            (Resolved::Missing, Some(f)) => Some(static_files::resolve(
                &self.root,
                &self.index,
                f.as_bytes(),
                self.now_secs,
            )),
            _ => None,
        };
        Done {
            id,
            found,
            fallback,
        }
    }
}

/// Debug builds only, for the tests (`tests/file_threads.rs`): a job for a file
/// named `forkd-test-gate-*` first opens `<that file>.gate`, a FIFO, for reading,
/// which blocks until the test opens it for writing: a file system exactly as slow
/// as the test wants, with no timing.
#[cfg(debug_assertions)]
fn test_gate(root: &std::path::Path, path: &[u8]) {
    use std::os::unix::ffi::OsStrExt;
    let name = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
    if !name.starts_with(b"forkd-test-gate-") {
        return;
    }
    let mut gate = root.as_os_str().as_bytes().to_vec();
    gate.extend_from_slice(path);
    gate.extend_from_slice(b".gate");
    let _ = std::fs::File::open(std::ffi::OsStr::from_bytes(&gate));
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<(JobId, Job)>,
    stop: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    ready: Condvar,
    done: Mutex<Vec<Done>>,
    waker: mio::Waker,
}

/// The threads of one worker.
pub struct Threads {
    shared: Arc<Shared>,
}

/// A poisoned lock only means a thread panicked holding it; the data (a queue of
/// jobs, a list of results) is still whole.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Threads {
    /// Starts `n` threads that wake the loop through `waker`.
    pub fn start(n: usize, waker: mio::Waker) -> std::io::Result<Threads> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            ready: Condvar::new(),
            done: Mutex::new(Vec::new()),
            waker,
        });
        for i in 0..n {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name(format!("forkd-files-{i}"))
                .spawn(move || work(&shared))?;
        }
        Ok(Threads { shared })
    }

    /// Hands a job to the threads (the caller bounds how many are out).
    pub fn send(&self, id: JobId, job: Job) {
        lock(&self.shared.queue).jobs.push_back((id, job));
        self.shared.ready.notify_one();
    }

    /// The results that came back since the last call, into `into`.
    pub fn take_done(&self, into: &mut Vec<Done>) {
        into.append(&mut lock(&self.shared.done));
    }
}

/// The threads stop after the job in hand (not joined: one stuck in a slow `open`
/// must not hold up the worker's exit).
impl Drop for Threads {
    fn drop(&mut self) {
        lock(&self.shared.queue).stop = true;
        self.shared.ready.notify_all();
    }
}

fn work(shared: &Shared) {
    loop {
        let (id, job) = {
            let mut q = lock(&shared.queue);
            loop {
                if q.stop {
                    return;
                }
                if let Some(next) = q.jobs.pop_front() {
                    break next;
                }
                q = shared.ready.wait(q).unwrap_or_else(|e| e.into_inner());
            }
        };
        let done = job.run(id);
        lock(&shared.done).push(done);
        if let Err(e) = shared.waker.wake() {
            forkd_shared::error!("waking the event loop for a file failed: {e}");
        }
    }
}

//! The pool's bookkeeping on the event loop, without threads or files: jobs by key
//! (one job however many requests want the same file), who waits for each, and
//! the bound on what is handed to the threads (the rest waits here, in order).

use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::hash::Hash;

/// A job's number, unique for the worker's life.
pub type JobId = u64;

/// What [`Jobs::submit`] did.
#[derive(Debug, PartialEq, Eq)]
pub struct Submitted<J> {
    pub id: JobId,
    /// A job for the same key was already under way: the request joined it.
    pub joined: bool,
    /// Jobs queued or running ahead of it when it was submitted.
    pub ahead: usize,
    /// To hand to the threads now; `None`: joined, or the threads' queue is full and
    /// it waits here until [`Jobs::next_to_send`] gives it.
    pub send: Option<J>,
}

/// A job done: its key, the connections waiting for it (in the order they came,
/// repeats possible), and when it was submitted.
#[derive(Debug, PartialEq, Eq)]
pub struct Finished<K> {
    pub key: K,
    pub waiters: Vec<usize>,
    pub submitted: u64,
}

struct Pending<K> {
    key: K,
    waiters: Vec<usize>,
    submitted: u64,
}

/// Jobs submitted and not finished.
pub struct Jobs<K, J> {
    next_id: JobId,
    by_key: FxHashMap<K, JobId>,
    pending: FxHashMap<JobId, Pending<K>>,
    /// Handed to the threads and not finished.
    in_flight: usize,
    /// The most handed to the threads at once.
    capacity: usize,
    /// Waiting for room in the threads' queue, oldest first.
    backlog: VecDeque<(JobId, J)>,
}

impl<K: Hash + Eq + Clone, J> Jobs<K, J> {
    pub fn new(capacity: usize) -> Jobs<K, J> {
        Jobs {
            next_id: 1,
            by_key: FxHashMap::default(),
            pending: FxHashMap::default(),
            in_flight: 0,
            capacity: capacity.max(1),
            backlog: VecDeque::new(),
        }
    }

    /// A job for `key` (made by `make` unless one is under way already), submitted
    /// at `now`.
    pub fn submit(&mut self, key: K, now: u64, make: impl FnOnce() -> J) -> Submitted<J> {
        let ahead = self.pending.len();
        if let Some(&id) = self.by_key.get(&key) {
            return Submitted {
                id,
                joined: true,
                ahead,
                send: None,
            };
        }
        let id = self.next_id;
        self.next_id += 1;
        self.by_key.insert(key.clone(), id);
        self.pending.insert(
            id,
            Pending {
                key,
                waiters: Vec::new(),
                submitted: now,
            },
        );
        let job = make();
        let send = if self.in_flight < self.capacity && self.backlog.is_empty() {
            self.in_flight += 1;
            Some(job)
        } else {
            self.backlog.push_back((id, job));
            None
        };
        Submitted {
            id,
            joined: false,
            ahead,
            send,
        }
    }

    /// Connection `waiter` waits for job `id` (false: no such job under way).
    pub fn wait(&mut self, id: JobId, waiter: usize) -> bool {
        match self.pending.get_mut(&id) {
            Some(p) => {
                p.waiters.push(waiter);
                true
            }
            None => false,
        }
    }

    /// Job `id` came back from a thread.
    pub fn finish(&mut self, id: JobId) -> Option<Finished<K>> {
        let p = self.pending.remove(&id)?;
        self.in_flight = self.in_flight.saturating_sub(1);
        if self.by_key.get(&p.key) == Some(&id) {
            self.by_key.remove(&p.key);
        }
        Some(Finished {
            key: p.key,
            waiters: p.waiters,
            submitted: p.submitted,
        })
    }

    /// The oldest job waiting here, if the threads' queue has room for it now.
    pub fn next_to_send(&mut self) -> Option<(JobId, J)> {
        if self.in_flight >= self.capacity {
            return None;
        }
        let next = self.backlog.pop_front()?;
        self.in_flight += 1;
        Some(next)
    }

    /// Jobs submitted and not finished (handed out or waiting here).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_for_one_file_share_one_job() {
        let mut jobs: Jobs<&str, &str> = Jobs::new(4);
        let a = jobs.submit("/hot", 10, || "job");
        assert!(!a.joined);
        assert_eq!(a.send, Some("job"));
        assert!(jobs.wait(a.id, 1));
        let b = jobs.submit("/hot", 11, || panic!("a second job for /hot"));
        assert!(b.joined);
        assert_eq!((b.id, b.ahead, b.send), (a.id, 1, None));
        assert!(jobs.wait(b.id, 2));
        let done = jobs.finish(a.id).unwrap();
        assert_eq!(done.key, "/hot");
        assert_eq!(done.waiters, vec![1, 2]);
        assert_eq!(done.submitted, 10);
        assert!(jobs.is_empty());
        // Finished: the next request for it is a new job.
        let c = jobs.submit("/hot", 12, || "again");
        assert!(!c.joined);
        assert_ne!(c.id, a.id);
    }

    #[test]
    fn a_full_queue_keeps_jobs_waiting_in_order() {
        let mut jobs: Jobs<u32, u32> = Jobs::new(2);
        let sent: Vec<_> = (0..5).map(|k| jobs.submit(k, 0, || k)).collect();
        assert_eq!(sent[0].send, Some(0));
        assert_eq!(sent[1].send, Some(1));
        assert!(sent[2..].iter().all(|s| s.send.is_none() && !s.joined));
        assert_eq!(sent[4].ahead, 4);
        assert_eq!(jobs.next_to_send(), None, "no room until one finishes");
        jobs.finish(sent[1].id).unwrap();
        assert_eq!(jobs.next_to_send(), Some((sent[2].id, 2)));
        assert_eq!(jobs.next_to_send(), None);
        // A new key waits behind the backlog even with room, so order holds.
        jobs.finish(sent[0].id).unwrap();
        let late = jobs.submit(9, 0, || 9);
        assert_eq!(late.send, None);
        assert_eq!(jobs.next_to_send(), Some((sent[3].id, 3)));
        jobs.finish(sent[2].id).unwrap();
        assert_eq!(jobs.next_to_send(), Some((sent[4].id, 4)));
        jobs.finish(sent[3].id).unwrap();
        assert_eq!(jobs.next_to_send(), Some((late.id, 9)));
        assert_eq!(jobs.len(), 2);
    }

    #[test]
    fn a_job_waiting_in_the_backlog_is_joined_too() {
        let mut jobs: Jobs<u32, u32> = Jobs::new(1);
        jobs.submit(1, 0, || 1);
        let queued = jobs.submit(2, 0, || 2);
        assert_eq!(queued.send, None);
        let joined = jobs.submit(2, 0, || panic!("merged"));
        assert!(joined.joined);
        assert_eq!(joined.id, queued.id);
    }

    #[test]
    fn unknown_jobs_are_refused() {
        let mut jobs: Jobs<u32, u32> = Jobs::new(1);
        assert!(!jobs.wait(7, 1));
        assert!(jobs.finish(7).is_none());
    }
}

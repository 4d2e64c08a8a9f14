//! Connection deadlines: a min-heap with lazy re-arming.
//!
//! A connection keeps its current deadline in a field; the heap holds at most one live
//! entry per connection, at or before that deadline. Pushing back a deadline (every
//! keep-alive request does) is a field write, not a heap operation: when the old entry
//! pops, it is re-armed at the connection's current deadline. Entries that no longer
//! match their connection (closed, or re-armed earlier) are skipped when they pop.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Instant;

#[derive(Default)]
pub struct Timers {
    heap: BinaryHeap<Reverse<(Instant, usize)>>,
}

/// A connection's side of the timer: its deadline and its heap entry.
#[derive(Debug, Default, Clone, Copy)]
pub struct Deadline {
    pub at: Option<Instant>,
    armed_at: Option<Instant>,
}

impl Deadline {
    /// Whether this deadline has passed.
    pub fn expired(&self, now: Instant) -> bool {
        self.at.is_some_and(|at| at <= now)
    }
}

impl Timers {
    /// Sets `deadline` to `at` for connection `key`, pushing a heap entry only when the
    /// connection has none at or before `at`.
    pub fn set(&mut self, key: usize, deadline: &mut Deadline, at: Instant) {
        deadline.at = Some(at);
        if deadline.armed_at.is_none_or(|armed| armed > at) {
            deadline.armed_at = Some(at);
            self.heap.push(Reverse((at, key)));
        }
    }

    /// The earliest time an entry is due (for the poll timeout).
    pub fn next_due(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse((at, _))| *at)
    }

    /// Takes the next heap entry due at `now`, if any.
    pub fn pop_due(&mut self, now: Instant) -> Option<(Instant, usize)> {
        match self.heap.peek() {
            Some(Reverse((at, _))) if *at <= now => self.heap.pop().map(|Reverse(e)| e),
            _ => None,
        }
    }

    /// Settles a popped entry `(entry_at, key)` against the connection's deadline:
    /// true when the deadline has passed; otherwise the entry was stale or is re-armed.
    pub fn settle(
        &mut self,
        (entry_at, key): (Instant, usize),
        deadline: &mut Deadline,
        now: Instant,
    ) -> bool {
        if deadline.armed_at != Some(entry_at) {
            return false; // superseded by an earlier entry, or a closed connection's
        }
        deadline.armed_at = None;
        match deadline.at {
            Some(at) if at <= now => true,
            Some(at) => {
                self.set(key, deadline, at);
                false
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn pushing_a_deadline_back_does_not_grow_the_heap() {
        let t0 = Instant::now();
        let mut timers = Timers::default();
        let mut d = Deadline::default();
        timers.set(7, &mut d, t0 + Duration::from_secs(1));
        for i in 2..100 {
            timers.set(7, &mut d, t0 + Duration::from_secs(i));
        }
        assert_eq!(timers.heap.len(), 1);
        // the old entry pops at 1s, is re-armed at 99s, and fires only then
        let e = timers.pop_due(t0 + Duration::from_secs(1)).unwrap();
        assert!(!timers.settle(e, &mut d, t0 + Duration::from_secs(1)));
        assert!(timers.pop_due(t0 + Duration::from_secs(98)).is_none());
        let e = timers.pop_due(t0 + Duration::from_secs(99)).unwrap();
        assert!(timers.settle(e, &mut d, t0 + Duration::from_secs(99)));
    }

    #[test]
    fn an_earlier_deadline_supersedes_the_entry() {
        let t0 = Instant::now();
        let mut timers = Timers::default();
        let mut d = Deadline::default();
        timers.set(1, &mut d, t0 + Duration::from_secs(10));
        timers.set(1, &mut d, t0 + Duration::from_secs(2));
        let e = timers.pop_due(t0 + Duration::from_secs(2)).unwrap();
        assert!(timers.settle(e, &mut d, t0 + Duration::from_secs(2)));
        // the 10s entry is stale now
        let e = timers.pop_due(t0 + Duration::from_secs(10)).unwrap();
        assert!(!timers.settle(e, &mut d, t0 + Duration::from_secs(10)));
    }

    #[test]
    fn a_new_connection_in_a_reused_slot_ignores_old_entries() {
        let t0 = Instant::now();
        let mut timers = Timers::default();
        let mut old = Deadline::default();
        timers.set(3, &mut old, t0 + Duration::from_secs(1));
        let mut new = Deadline::default();
        timers.set(3, &mut new, t0 + Duration::from_secs(5));
        let e = timers.pop_due(t0 + Duration::from_secs(1)).unwrap();
        assert!(!timers.settle(e, &mut new, t0 + Duration::from_secs(1)));
    }
}

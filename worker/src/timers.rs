//! Connection deadlines: a min-heap with lazy re-arming.
//!
//! Times are microseconds since the worker started (see `clock.rs`): 8 bytes where an
//! `Instant` takes 16, which matters at ten thousand idle connections. A connection
//! keeps its current deadline in a field; the heap holds at most one live entry per
//! connection, at or before that deadline. Pushing back a deadline (every keep-alive
//! request does) is a field write, not a heap operation: when the old entry pops, it
//! is re-armed at the connection's current deadline. Entries that no longer match
//! their connection (closed, or re-armed earlier) are skipped when they pop.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Microseconds since the worker started.
pub type Micros = u64;

const NONE: Micros = Micros::MAX;

#[derive(Default)]
pub struct Timers {
    heap: BinaryHeap<Reverse<(Micros, usize)>>,
}

/// A connection's side of the timer: its deadline and its heap entry.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    at: Micros,
    armed_at: Micros,
}

impl Default for Deadline {
    fn default() -> Self {
        Deadline {
            at: NONE,
            armed_at: NONE,
        }
    }
}

impl Timers {
    /// Sets `deadline` to `at` for connection `key`, pushing a heap entry only when the
    /// connection has none at or before `at`.
    pub fn set(&mut self, key: usize, deadline: &mut Deadline, at: Micros) {
        deadline.at = at;
        if deadline.armed_at > at {
            deadline.armed_at = at;
            self.heap.push(Reverse((at, key)));
        }
    }

    /// The earliest time an entry is due (for the poll timeout).
    pub fn next_due(&self) -> Option<Micros> {
        self.heap.peek().map(|Reverse((at, _))| *at)
    }

    /// Takes the next heap entry due at `now`, if any.
    pub fn pop_due(&mut self, now: Micros) -> Option<(Micros, usize)> {
        match self.heap.peek() {
            Some(Reverse((at, _))) if *at <= now => self.heap.pop().map(|Reverse(e)| e),
            _ => None,
        }
    }

    /// Settles a popped entry `(entry_at, key)` against the connection's deadline:
    /// true when the deadline has passed; otherwise the entry was stale or is re-armed.
    pub fn settle(
        &mut self,
        (entry_at, key): (Micros, usize),
        deadline: &mut Deadline,
        now: Micros,
    ) -> bool {
        if deadline.armed_at != entry_at {
            return false; // superseded by an earlier entry, or a closed connection's
        }
        deadline.armed_at = NONE;
        match deadline.at {
            NONE => false,
            at if at <= now => true,
            at => {
                self.set(key, deadline, at);
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Micros = 1_000_000;

    #[test]
    fn pushing_a_deadline_back_does_not_grow_the_heap() {
        let mut timers = Timers::default();
        let mut d = Deadline::default();
        timers.set(7, &mut d, S);
        for i in 2..100 {
            timers.set(7, &mut d, i * S);
        }
        assert_eq!(timers.heap.len(), 1);
        // the old entry pops at 1s, is re-armed at 99s, and fires only then
        let e = timers.pop_due(S).unwrap();
        assert!(!timers.settle(e, &mut d, S));
        assert!(timers.pop_due(98 * S).is_none());
        let e = timers.pop_due(99 * S).unwrap();
        assert!(timers.settle(e, &mut d, 99 * S));
    }

    #[test]
    fn an_earlier_deadline_supersedes_the_entry() {
        let mut timers = Timers::default();
        let mut d = Deadline::default();
        timers.set(1, &mut d, 10 * S);
        timers.set(1, &mut d, 2 * S);
        let e = timers.pop_due(2 * S).unwrap();
        assert!(timers.settle(e, &mut d, 2 * S));
        // the 10s entry is stale now
        let e = timers.pop_due(10 * S).unwrap();
        assert!(!timers.settle(e, &mut d, 10 * S));
    }

    #[test]
    fn a_new_connection_in_a_reused_slot_ignores_old_entries() {
        let mut timers = Timers::default();
        let mut old = Deadline::default();
        timers.set(3, &mut old, S);
        let mut new = Deadline::default();
        timers.set(3, &mut new, 5 * S);
        let e = timers.pop_due(S).unwrap();
        assert!(!timers.settle(e, &mut new, S));
    }
}

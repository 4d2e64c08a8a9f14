//! Making room at `worker_connections`: while clients wait in the accept queue, the
//! worker closes connections that are truly idle, then tells the connections that
//! have been served longest to close after their next response (`Connection: close`).
//! Nobody's request fails: an idle connection is closed only after one more look at
//! its socket (see `Conn::close_if_idle`), and a rotated one finishes its response.
//!
//! The choice is sans-io ([`plan`]); the event loop gathers the candidates and acts.

use crate::timers::Micros;

/// An idle keep-alive connection is closed to make room only after this much idleness:
/// a client in the middle of a request loop is not "idle" between two of them, and
/// closing it then races with its next request.
pub const IDLE_FOR: Micros = 1_000_000;
/// At the limit, the accept queues are looked at this often.
pub const CHECK_EVERY_US: Micros = 10_000;

/// What the event loop knows of one connection when choosing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    pub key: usize,
    /// How long it has been idle, if it is (between requests, nothing buffered).
    pub idle_for: Option<Micros>,
    /// Requests answered on it: "served longest".
    pub requests: u32,
    /// Already told to close after its next response.
    pub rotating: bool,
}

/// What to do to make room for `waiting` clients.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Idle connections to close now (after looking at their socket once more).
    pub close_idle: Vec<usize>,
    /// Connections to answer next with `Connection: close`.
    pub rotate: Vec<usize>,
}

/// Chooses connections to free for `waiting` queued clients: the longest-idle first,
/// then the longest-served, counting those already rotating as room on its way.
pub fn plan(waiting: usize, candidates: &[Candidate]) -> Plan {
    let mut plan = Plan::default();
    let on_the_way = candidates.iter().filter(|c| c.rotating).count();
    let mut need = waiting.saturating_sub(on_the_way);
    if need == 0 {
        return plan;
    }
    let mut idle: Vec<&Candidate> = candidates
        .iter()
        .filter(|c| !c.rotating && c.idle_for.is_some_and(|d| d >= IDLE_FOR))
        .collect();
    idle.sort_by_key(|c| std::cmp::Reverse(c.idle_for));
    for c in idle.into_iter().take(need) {
        plan.close_idle.push(c.key);
    }
    need -= plan.close_idle.len();
    if need == 0 {
        return plan;
    }
    let mut served: Vec<&Candidate> = candidates
        .iter()
        .filter(|c| !c.rotating && !plan.close_idle.contains(&c.key))
        .collect();
    served.sort_by_key(|c| std::cmp::Reverse(c.requests));
    plan.rotate = served.into_iter().take(need).map(|c| c.key).collect();
    plan
}

/// Time spent at the limit, accumulated for the `at_limit_ms` counter.
#[derive(Debug, Default)]
pub struct AtLimit {
    /// At the limit since then (µs on the worker's clock), or not at it.
    since: Option<Micros>,
    /// Microseconds at the limit not yet published (the counter counts milliseconds).
    unpublished: Micros,
    /// The accept queues were last looked at then.
    checked: Micros,
}

impl AtLimit {
    /// Records whether the worker is at its limit now. Returns milliseconds to add to
    /// the counter.
    pub fn observe(&mut self, at_limit: bool, now: Micros) -> u64 {
        if let Some(since) = self.since {
            self.unpublished += now.saturating_sub(since);
        }
        self.since = at_limit.then_some(now);
        let ms = self.unpublished / 1000;
        self.unpublished %= 1000;
        ms
    }

    pub fn at_limit(&self) -> bool {
        self.since.is_some()
    }

    /// Whether it is time to look at the accept queues again.
    pub fn check_due(&mut self, now: Micros) -> bool {
        if now.saturating_sub(self.checked) < CHECK_EVERY_US {
            return false;
        }
        self.checked = now;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn busy(key: usize, requests: u32) -> Candidate {
        Candidate {
            key,
            idle_for: None,
            requests,
            rotating: false,
        }
    }

    fn idle(key: usize, idle_for: Micros) -> Candidate {
        Candidate {
            key,
            idle_for: Some(idle_for),
            requests: 1,
            rotating: false,
        }
    }

    #[test]
    fn truly_idle_connections_go_first_longest_idle_first() {
        let c = [
            busy(0, 90),
            idle(1, 2 * IDLE_FOR),
            idle(2, 5 * IDLE_FOR),
            busy(3, 5),
        ];
        let p = plan(1, &c);
        assert_eq!(p.close_idle, vec![2]);
        assert!(p.rotate.is_empty());
    }

    #[test]
    fn a_connection_between_two_requests_is_not_idle_enough_to_close() {
        let c = [idle(0, IDLE_FOR - 1), busy(1, 3)];
        let p = plan(1, &c);
        assert!(p.close_idle.is_empty());
        // It may still be the one rotated: it finishes its next response first.
        assert_eq!(p.rotate, vec![1]);
    }

    #[test]
    fn then_the_longest_served_are_rotated() {
        let c = [
            busy(0, 10),
            busy(1, 300),
            idle(2, 3 * IDLE_FOR),
            busy(3, 200),
        ];
        let p = plan(3, &c);
        assert_eq!(p.close_idle, vec![2]);
        assert_eq!(p.rotate, vec![1, 3]);
    }

    #[test]
    fn connections_already_rotating_count_as_room_on_its_way() {
        let mut c = [busy(0, 10), busy(1, 300), busy(2, 20)];
        c[1].rotating = true;
        assert_eq!(plan(1, &c), Plan::default());
        let p = plan(2, &c);
        assert_eq!(p.rotate, vec![2]);
    }

    #[test]
    fn never_more_than_there_are() {
        let c = [busy(0, 1), idle(1, 2 * IDLE_FOR)];
        let p = plan(50, &c);
        assert_eq!(p.close_idle, vec![1]);
        assert_eq!(p.rotate, vec![0]);
    }

    #[test]
    fn time_at_the_limit_is_counted_in_milliseconds_without_losing_the_rest() {
        let mut a = AtLimit::default();
        assert_eq!(a.observe(true, 0), 0);
        assert_eq!(a.observe(true, 1_500), 1);
        assert_eq!(a.observe(false, 2_000), 1); // 0.5 + 0.5 ms carried over
        assert_eq!(a.observe(false, 90_000), 0); // not at the limit: nothing
        assert!(!a.at_limit());
    }
}

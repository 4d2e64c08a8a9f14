//! The deadlines of a proxied exchange: the upstream's (the exchange state's
//! timeout, held while forkd waits on the client, its clock restarted when such a
//! hold ends) and the client's (its idle timeout, and the end of its rate period
//! while forkd waits on it: `min_body_rate` / `min_send_rate`). [`note_client`] runs
//! after each `proxied::advance`; [`deadlines`] when the
//! connection arms its one deadline or finds it passed.

use crate::busy::{Busy, RateWindow};
use crate::proxy::exchange::{State, Timeout};
use crate::services::Services;
use crate::timers::Micros;
use crate::upstreams::{Proxied, Transfer};

/// Whether the exchange waits on the client now: writing the response to it (bytes
/// the session holds that it has not taken: the upstream is held back by it; bytes
/// in the exchange's spool are not the session's, and the upstream is read on), and
/// waiting for its body (wanted, none buffered).
fn client_waits(p: &Proxied, busy: &Busy) -> (bool, bool) {
    let writing = !busy.out.is_empty() || p.session.has_client_output();
    let waiting_body = p.session.wants_client_body() && !busy.has_input();
    (writing, waiting_body)
}

/// What the exchange waits on the client for now, if anything: the response first
/// (its bytes are there, whoever holds them: the output queue, the session, the
/// spool), then the body, once the client was told to send it (a client that asked
/// `Expect: 100-continue` waits for the `100 Continue`, which a streamed request
/// sends only when its upstream connection is up). Neither: the client waits for
/// forkd or the upstream.
fn client_transfer(p: &Proxied, (writing, waiting_body): (bool, bool)) -> Option<Transfer> {
    if writing || p.spooled() {
        Some(Transfer::Response)
    } else if waiting_body && !p.expect_continue {
        Some(Transfer::Body)
    } else {
        None
    }
}

/// The minimum rate of `transfer` on `server` (0: none).
pub fn min_rate(transfer: Transfer, server: &forkd_shared::config::Server) -> u64 {
    match transfer {
        Transfer::Body => server.min_body_rate,
        Transfer::Response => server.min_send_rate,
    }
}

/// Whether the upstream's deadline is held in `state`: the exchange waits on the
/// client (a slow reader, a slow body), which is not the upstream's delay.
fn held(state: &State, writing: bool, waiting_body: bool) -> bool {
    match state {
        State::StreamingResponseBody { .. } => writing,
        State::SendingHead { .. } | State::StreamingRequestBody { .. } => waiting_body,
        _ => false,
    }
}

/// Notes, after each `proxied::advance`, what the exchange waits on the client for,
/// from one look at both sides:
///
/// - whether the upstream's deadline is held, and when a hold ends (the client took
///   the last response bytes the session had, or sent the body bytes it waited for):
///   the moment forkd goes back to waiting on the upstream;
/// - what the client's rate is judged on: when that changes, the connection's rate
///   window starts again, so a period that began while the client waited for the
///   upstream (or moved the other way) is not held against it.
pub(super) fn note_client(p: &mut Proxied, busy: &mut Busy, now: Micros) {
    let waits = client_waits(p, busy);
    let held_now = held(&p.session.exchange().state, waits.0, waits.1);
    p.resumed = resumed_at(p.held, held_now, p.resumed, now);
    p.held = held_now;
    let transfer = client_transfer(p, waits);
    if transfer != p.rated {
        p.rated = transfer;
        busy.rate = RateWindow::starting(now);
    }
}

/// When forkd last went back to waiting on the upstream (`resumed`), after a look at
/// `now` that found the upstream's deadline `held`, and `was_held` at the look before.
fn resumed_at(was_held: bool, held: bool, resumed: Micros, now: Micros) -> Micros {
    if was_held && !held {
        now
    } else {
        resumed
    }
}

/// The times the upstream's deadline counts from.
#[derive(Debug, Clone, Copy)]
struct UpstreamClock {
    /// When the exchange entered its current state.
    state_since: Micros,
    /// The upstream's last progress (bytes read or written, the connect).
    progress: Micros,
    /// When forkd last went back to waiting on the upstream after a hold.
    resumed: Micros,
}

/// The upstream's deadline under the current state's `timeout`; never while `held`.
///
/// A whole wait (the connect, the response head) counts from the state's start, so
/// an upstream that dribbles cannot hold the exchange forever. A wait between two
/// reads (or writes) of forkd's counts from the later of its last one and the moment
/// forkd went back to waiting on the upstream after a hold: the time spent waiting on
/// the client is not the upstream's (nginx re-arms `proxy_read_timeout` whenever it
/// goes back to reading after the downstream wrote). Counted from the last read
/// alone, a client that kept forkd's buffers full for longer than `read_timeout`
/// would see its response cut the moment it drained them, the upstream having had
/// no time at all to send the next bytes.
fn upstream_deadline(timeout: Option<Timeout>, held: bool, clock: UpstreamClock) -> Micros {
    let Some(t) = timeout else {
        return Micros::MAX;
    };
    if held {
        return Micros::MAX;
    }
    let after = t.after.as_micros() as Micros;
    if t.rearm_on_progress {
        clock.state_since.max(clock.progress).max(clock.resumed) + after
    } else {
        clock.state_since + after
    }
}

/// The deadlines that apply now: the upstream's (the exchange's current state) and
/// the client's (writing the response, or waiting for the body). The earlier one is
/// the connection's deadline.
pub fn deadlines(
    p: &Proxied,
    busy: &Busy,
    svc: &Services,
    client_progress: Micros,
) -> (Micros, Micros) {
    let server = svc.server(p.client_server);
    let us = |d: std::time::Duration| d.as_micros() as Micros;
    let (writing, waiting_body) = client_waits(p, busy);
    let client = if writing || p.spooled() || p.upstream_done {
        client_progress + us(server.send_timeout)
    } else if waiting_body {
        client_progress + us(server.body_timeout)
    } else {
        Micros::MAX
    };
    // A client forkd waits on is judged at the end of each rate period.
    let grace = us(server.min_rate_grace);
    let client = match p.rated {
        Some(t) if min_rate(t, server) > 0 => client.min(busy.rate.since + grace),
        _ => client,
    };
    let state = &p.session.exchange().state;
    let clock = UpstreamClock {
        state_since: p.state_since,
        progress: p.upstream_progress,
        resumed: p.resumed,
    };
    let upstream = match svc.config.upstreams.get(p.upstream) {
        Some(u) if !p.upstream_done => upstream_deadline(
            p.session.exchange().timeout(&u.timeouts(&p.timeouts)),
            held(state, writing, waiting_body),
            clock,
        ),
        _ => Micros::MAX,
    };
    (upstream, client)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::retry::Failure;
    use std::time::Duration;

    const S: Micros = 1_000_000;

    fn timeout(secs: u64, rearm_on_progress: bool) -> Option<Timeout> {
        Some(Timeout {
            after: Duration::from_secs(secs),
            fires_as: Failure::Timeout,
            rearm_on_progress,
        })
    }

    fn clock(state_since: Micros, progress: Micros, resumed: Micros) -> UpstreamClock {
        UpstreamClock {
            state_since,
            progress,
            resumed,
        }
    }

    #[test]
    fn between_reads_the_deadline_counts_from_when_forkd_went_back_to_waiting() {
        // Last upstream read at 1 s, the client kept forkd's buffers full until 3 s.
        let read_timeout = timeout(1, true);
        assert_eq!(
            upstream_deadline(read_timeout, false, clock(0, S, 3 * S)),
            4 * S,
            "read_timeout after the hold ended, not after the last read"
        );
        // A read after the hold ended counts from that read.
        assert_eq!(
            upstream_deadline(read_timeout, false, clock(0, 5 * S, 3 * S)),
            6 * S
        );
        // A new state counts from its start.
        assert_eq!(
            upstream_deadline(read_timeout, false, clock(7 * S, 5 * S, 3 * S)),
            8 * S
        );
    }

    #[test]
    fn a_whole_wait_is_not_restarted_by_progress_or_a_hold() {
        // The head wait: a dribbling upstream, or a client, must not stretch it.
        assert_eq!(
            upstream_deadline(timeout(2, false), false, clock(S, 9 * S, 9 * S)),
            3 * S
        );
    }

    #[test]
    fn no_upstream_deadline_while_held_or_without_a_timeout() {
        assert_eq!(
            upstream_deadline(timeout(1, true), true, clock(0, 0, 0)),
            Micros::MAX
        );
        assert_eq!(upstream_deadline(None, false, clock(0, 0, 0)), Micros::MAX);
    }

    #[test]
    fn a_hold_is_only_waiting_on_the_client_in_a_state_that_can_be() {
        let (server, yes, no) = (0, true, false);
        let streaming = State::StreamingResponseBody { server };
        assert!(held(&streaming, yes, no), "a slow reader");
        assert!(!held(&streaming, no, yes), "the response is not the body's");
        let body = State::StreamingRequestBody { server };
        assert!(held(&body, no, yes), "a slow body");
        assert!(!held(&body, yes, no));
        assert!(held(&State::SendingHead { server }, no, yes));
        assert!(
            !held(&State::AwaitingHead { server }, yes, yes),
            "a whole wait"
        );
        assert!(!held(&State::Connecting { server }, yes, yes));
    }

    #[test]
    fn forkd_goes_back_to_waiting_on_the_upstream_when_a_hold_ends() {
        // Looks after each advance: (held, now) -> resumed.
        let looks = [(false, 1), (true, 2), (true, 3), (false, 4), (false, 5)];
        let (mut was, mut resumed) = (false, 0);
        let mut seen = Vec::new();
        for (held, now) in looks {
            resumed = resumed_at(was, held, resumed, now);
            was = held;
            seen.push(resumed);
        }
        assert_eq!(seen, [0, 0, 0, 4, 4], "only the end of the hold moves it");
    }
}

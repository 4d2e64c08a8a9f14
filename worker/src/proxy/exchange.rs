//! One proxied exchange as a sans-io state machine: the event loop reports what
//! happened on the sockets ([`Event`]), the exchange says what to do next ([`Action`]).
//!
//! ```text
//!            ┌────────── RetryFresh / NextServer ───────────┐
//!            ▼                                              │
//!  start ─▶ Connecting ─▶ SendingHead ─▶ StreamingRequestBody ─▶ AwaitingHead
//!  (a pooled connection starts at SendingHead)                     │   ▲ 1xx
//!                                                                  ▼   │
//!                                          StreamingResponseBody ◀─┴───┘
//!                                                   │
//!                                   Done { reusable } / Failed(Action)
//! ```
//!
//! The exchange belongs to the client connection. It holds what the retry rules need
//! (see `retry`): which servers were tried, whether the connection was reused, whether
//! request bytes left and response bytes arrived, whether the head went to the client.
//! The replay copy of the request head and both directions' relays (`body::Relay`)
//! sit beside it in the client connection's busy state; a request whose body bytes
//! already left the relay is not replayable.
//!
//! The response may start before the request body is complete: an application may
//! answer early (a 413) or stream while it reads the upload (an echo, a progress
//! report). `ResponseBytes` and the heads are accepted in every sending state, and
//! once the response began the rest of the request goes on in
//! `StreamingResponseBody` (`HeadWritten`, `RequestBodyDone` still come): both
//! directions move at once. A response that ends before the request was sent whole
//! releases the connection unpooled (its framing is off) and the request stops there.

use super::retry::{self, AttemptState, Budget, Decision, Failure};
use forkd_shared::config::Timeouts;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Waiting for a new connection to `server` to be established.
    Connecting { server: usize },
    /// Writing the request head (and what of the body fits in the same write).
    SendingHead { server: usize },
    /// Relaying the rest of the request body.
    StreamingRequestBody { server: usize },
    /// Request sent; waiting for the (final) response head.
    AwaitingHead { server: usize },
    /// Relaying the response body to the client (and the rest of the request body
    /// upstream, when the response began first).
    StreamingResponseBody { server: usize },
    /// Finished; `reusable`: the upstream connection may go back to its pool.
    Done { reusable: bool },
    /// Ended by a failure, with what was done about it.
    Failed(Action),
}

/// What happened, as reported by the event loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The new connection is established.
    Connected,
    /// The socket accepted `n` request bytes.
    Wrote { n: usize },
    /// The whole request head was written.
    HeadWritten,
    /// The whole request body was written (or there is none).
    RequestBodyDone,
    /// Response bytes arrived.
    ResponseBytes,
    /// An interim (1xx) head was read; `forwarded`: written for the client (not to
    /// a 1.0 client).
    InterimHead { forwarded: bool },
    /// The final response head was read and written to the client's buffer;
    /// `reusable`: `ResponseHead::upstream_reusable` (used at once when there is no
    /// body).
    FinalHead { has_body: bool, reusable: bool },
    /// The response body was read whole; `reusable` as `response_head` decided.
    ResponseDone { reusable: bool },
    /// Something failed.
    Failed(Failure),
}

/// What the event loop does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing new: keep driving the sockets the state implies.
    Continue,
    /// Open a new connection to `server` (of this exchange's upstream) and start again
    /// from the replay copy of the head. The failed connection is closed.
    Connect { server: usize },
    /// Pick the next untried server (`upstream_health::choose` with `tried()`) and
    /// connect to it; none left: answer 502.
    ConnectNext,
    /// Answer the client with this status (502, 504); close the upstream connection.
    Respond(u16),
    /// Close the client connection (part of the response was sent); close the upstream.
    CloseClient,
    /// Done: put the upstream connection back in its pool if `reusable`, else close it.
    Release { reusable: bool },
}

/// The deadline of an exchange's current state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeout {
    /// From the start of the state, or from the last progress if `rearm_on_progress`.
    pub after: Duration,
    /// What to report (`Event::Failed`) when it fires.
    pub fires_as: Failure,
    pub rearm_on_progress: bool,
}

/// One proxied exchange.
#[derive(Debug, Clone)]
pub struct Exchange {
    pub state: State,
    method_idempotent: bool,
    /// Servers of the upstream.
    servers: usize,
    /// The request body was written whole (else the connection cannot be reused).
    request_complete: bool,
    tried: u64,
    attempt: AttemptState,
    budget: Budget,
    /// The failure that ended the last attempt (the current one's once it failed),
    /// whoever reported it: an event the state does not expect fails here too.
    last_failure: Option<Failure>,
}

impl Exchange {
    /// An exchange for a request with method `method` to an upstream with `servers`
    /// servers and `retries`.
    pub fn new(method: &str, servers: usize, retries: u32) -> Exchange {
        Exchange {
            state: State::Done { reusable: false },
            method_idempotent: retry::is_idempotent(method),
            servers: servers.min(64),
            request_complete: false,
            tried: 0,
            attempt: AttemptState {
                reused: false,
                request_bytes_sent: false,
                response_bytes_seen: false,
                head_sent: false,
                replayable: true,
                whole_copy: false,
            },
            budget: Budget {
                counted: 0,
                stale_used: false,
                retries,
            },
            last_failure: None,
        }
    }

    /// Starts an attempt on `server`: on a pooled connection (`reused`) the head can
    /// be written at once; otherwise after `Connected`.
    pub fn start(&mut self, server: usize, reused: bool) {
        if server < 64 {
            self.tried |= 1 << server;
        }
        self.request_complete = false;
        self.attempt = AttemptState {
            reused,
            request_bytes_sent: false,
            response_bytes_seen: false,
            head_sent: false,
            replayable: self.attempt.replayable,
            whole_copy: self.attempt.whole_copy,
        };
        self.state = if reused {
            State::SendingHead { server }
        } else {
            State::Connecting { server }
        };
    }

    /// The deadline that applies in the current state, under `timeouts` (the
    /// upstream's, a route's own in their place). `connect_timeout` for the
    /// whole connect; `send_timeout` between writes that progress; `read_timeout` for
    /// the whole wait for the response head (an upstream that dribbles a head byte at
    /// a time does not hold the exchange forever), then between reads of the body.
    /// None once the exchange ended.
    pub fn timeout(&self, timeouts: &Timeouts) -> Option<Timeout> {
        let (after, fires_as, rearm_on_progress) = match self.state {
            State::Connecting { .. } => (timeouts.connect, Failure::ConnectTimeout, false),
            State::SendingHead { .. } | State::StreamingRequestBody { .. } => {
                (timeouts.send, Failure::Timeout, true)
            }
            State::AwaitingHead { .. } => (timeouts.read, Failure::Timeout, false),
            State::StreamingResponseBody { .. } => (timeouts.read, Failure::Timeout, true),
            State::Done { .. } | State::Failed(_) => return None,
        };
        Some(Timeout {
            after,
            fires_as,
            rearm_on_progress,
        })
    }

    /// What the current state's deadline becomes when it fires (see
    /// [`Exchange::timeout`]); None once the exchange ended.
    pub fn timeout_failure(&self) -> Option<Failure> {
        match self.state {
            State::Connecting { .. } => Some(Failure::ConnectTimeout),
            State::Done { .. } | State::Failed(_) => None,
            _ => Some(Failure::Timeout),
        }
    }

    /// Servers tried so far (bit i = server i), for `upstream_health::choose`.
    pub fn tried(&self) -> u64 {
        self.tried
    }

    /// Whether the method may be sent twice (`retry::is_idempotent`).
    pub fn idempotent(&self) -> bool {
        self.method_idempotent
    }

    /// The connection in use came from a pool (for stats and the access log).
    pub fn reused(&self) -> bool {
        self.attempt.reused
    }

    /// The whole request is held for resends (a buffered body read to its end).
    pub fn hold_whole_copy(&mut self, whole: bool) {
        self.attempt.whole_copy = whole;
    }

    /// The failure that ended the last failed attempt, for the error log and the
    /// server's failure count.
    pub fn last_failure(&self) -> Option<Failure> {
        self.last_failure
    }

    /// The request was written whole (head and body).
    pub fn request_complete(&self) -> bool {
        self.request_complete
    }

    /// Request body bytes left the replay copy: a retry could not resend them.
    pub fn body_not_replayable(&mut self) {
        self.attempt.replayable = false;
    }

    fn server(&self) -> Option<usize> {
        match self.state {
            State::Connecting { server }
            | State::SendingHead { server }
            | State::StreamingRequestBody { server }
            | State::AwaitingHead { server }
            | State::StreamingResponseBody { server } => Some(server),
            State::Done { .. } | State::Failed(_) => None,
        }
    }

    /// Applies `event`; returns what to do.
    pub fn on(&mut self, event: Event) -> Action {
        let Some(server) = self.server() else {
            return Action::Continue;
        };
        match (self.state, event) {
            (_, Event::Failed(failure)) => self.fail(failure),
            (State::Connecting { .. }, Event::Connected) => {
                self.state = State::SendingHead { server };
                Action::Continue
            }
            (_, Event::Wrote { n }) => {
                if n > 0 {
                    self.attempt.request_bytes_sent = true;
                }
                Action::Continue
            }
            (State::SendingHead { .. }, Event::HeadWritten) => {
                self.state = State::StreamingRequestBody { server };
                Action::Continue
            }
            (
                State::SendingHead { .. } | State::StreamingRequestBody { .. },
                Event::RequestBodyDone,
            ) => {
                self.request_complete = true;
                self.state = State::AwaitingHead { server };
                Action::Continue
            }
            // The response began first; the request goes on beside it.
            (State::StreamingResponseBody { .. }, Event::HeadWritten) => Action::Continue,
            (State::StreamingResponseBody { .. }, Event::RequestBodyDone) => {
                self.request_complete = true;
                Action::Continue
            }
            (_, Event::ResponseBytes) => {
                self.attempt.response_bytes_seen = true;
                Action::Continue
            }
            (_, Event::InterimHead { forwarded }) => {
                // A forwarded 1xx is part of the response the client has seen.
                self.attempt.head_sent |= forwarded;
                Action::Continue
            }
            (_, Event::FinalHead { has_body, reusable }) => {
                self.attempt.head_sent = true;
                self.state = State::StreamingResponseBody { server };
                if has_body {
                    Action::Continue
                } else {
                    self.finish(reusable)
                }
            }
            (State::StreamingResponseBody { .. }, Event::ResponseDone { reusable }) => {
                self.finish(reusable)
            }
            // An event that does not fit the state is a bug in the caller; treat it
            // as a broken exchange rather than guess.
            _ => self.fail(Failure::BadResponse),
        }
    }

    fn finish(&mut self, reusable: bool) -> Action {
        // The response ended before the request body was sent whole: the upstream
        // connection's framing is off, it cannot be reused.
        let reusable = reusable && self.request_complete;
        self.state = State::Done { reusable };
        Action::Release { reusable }
    }

    fn fail(&mut self, failure: Failure) -> Action {
        self.last_failure = Some(failure);
        let server = self.server().unwrap_or(0);
        let servers_left = (self.tried.count_ones() as usize) < self.servers;
        let decision = retry::decide(
            failure,
            self.attempt,
            self.method_idempotent,
            self.budget,
            servers_left,
        );
        match decision {
            Decision::RetryFresh => {
                self.budget.stale_used = true;
                self.state = State::Connecting { server };
                self.attempt.reused = false;
                self.attempt.request_bytes_sent = false;
                Action::Connect { server }
            }
            Decision::NextServer => {
                self.budget.counted += 1;
                Action::ConnectNext
            }
            Decision::Respond(status) => {
                self.state = State::Failed(Action::Respond(status));
                Action::Respond(status)
            }
            Decision::CloseClient => {
                self.state = State::Failed(Action::CloseClient);
                Action::CloseClient
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(x: &mut Exchange, events: &[Event]) -> Vec<Action> {
        events.iter().map(|e| x.on(*e)).collect()
    }

    #[test]
    fn a_get_on_a_new_connection_runs_to_a_reusable_end() {
        let mut x = Exchange::new("GET", 2, 1);
        x.start(0, false);
        assert_eq!(x.state, State::Connecting { server: 0 });
        let actions = run(
            &mut x,
            &[
                Event::Connected,
                Event::Wrote { n: 40 },
                Event::HeadWritten,
                Event::RequestBodyDone,
                Event::ResponseBytes,
                Event::FinalHead {
                    has_body: true,
                    reusable: true,
                },
                Event::ResponseDone { reusable: true },
            ],
        );
        assert_eq!(actions.last(), Some(&Action::Release { reusable: true }));
        assert_eq!(x.state, State::Done { reusable: true });
    }

    #[test]
    fn a_stale_pooled_connection_is_retried_on_a_fresh_one_then_gives_502() {
        let mut x = Exchange::new("GET", 2, 0);
        x.start(1, true);
        run(
            &mut x,
            &[
                Event::Wrote { n: 40 },
                Event::HeadWritten,
                Event::RequestBodyDone,
            ],
        );
        assert_eq!(
            x.on(Event::Failed(Failure::Reset)),
            Action::Connect { server: 1 }
        );
        assert_eq!(x.state, State::Connecting { server: 1 });
        assert!(!x.reused());
        run(&mut x, &[Event::Connected, Event::Wrote { n: 40 }]);
        assert_eq!(x.on(Event::Failed(Failure::Reset)), Action::Respond(502));
    }

    #[test]
    fn a_post_whose_bytes_left_is_not_retried() {
        let mut x = Exchange::new("POST", 2, 1);
        x.start(0, true);
        x.on(Event::Wrote { n: 10 });
        assert_eq!(x.on(Event::Failed(Failure::Reset)), Action::Respond(502));
        let mut y = Exchange::new("POST", 2, 1);
        y.start(0, true);
        assert_eq!(
            y.on(Event::Failed(Failure::Reset)),
            Action::Connect { server: 0 },
            "nothing had been written"
        );
    }

    #[test]
    fn an_idempotent_put_whose_body_left_the_replay_copy_is_not_retried() {
        let mut x = Exchange::new("PUT", 2, 1);
        x.start(0, true);
        x.on(Event::Wrote { n: 100_000 });
        x.body_not_replayable();
        assert_eq!(x.on(Event::Failed(Failure::Reset)), Action::Respond(502));
    }

    #[test]
    fn connect_failures_move_to_the_next_server_within_retries() {
        let mut x = Exchange::new("POST", 2, 1);
        x.start(0, false);
        assert_eq!(
            x.on(Event::Failed(Failure::ConnectRefused)),
            Action::ConnectNext
        );
        assert_eq!(x.tried(), 0b1);
        x.start(1, false);
        assert_eq!(x.tried(), 0b11);
        assert_eq!(
            x.on(Event::Failed(Failure::ConnectTimeout)),
            Action::Respond(504)
        );
        let mut all = Exchange::new("GET", 2, 5);
        all.start(0, false);
        assert_eq!(
            all.on(Event::Failed(Failure::ConnectRefused)),
            Action::ConnectNext
        );
        all.start(1, false);
        assert_eq!(
            all.on(Event::Failed(Failure::ConnectRefused)),
            Action::Respond(502),
            "every server was tried"
        );
    }

    #[test]
    fn failures_after_the_head_close_the_client() {
        let mut x = Exchange::new("GET", 2, 1);
        x.start(0, true);
        run(
            &mut x,
            &[
                Event::HeadWritten,
                Event::RequestBodyDone,
                Event::ResponseBytes,
                Event::FinalHead {
                    has_body: true,
                    reusable: true,
                },
            ],
        );
        assert_eq!(x.on(Event::Failed(Failure::Reset)), Action::CloseClient);
        assert_eq!(x.state, State::Failed(Action::CloseClient));
        assert_eq!(x.on(Event::ResponseBytes), Action::Continue, "ended");
    }

    #[test]
    fn a_forwarded_interim_head_means_the_client_has_seen_the_response() {
        let mut x = Exchange::new("GET", 1, 1);
        x.start(0, false);
        let seen = [
            Event::Connected,
            Event::HeadWritten,
            Event::RequestBodyDone,
            Event::ResponseBytes,
        ];
        run(&mut x, &seen);
        x.on(Event::InterimHead { forwarded: true });
        assert_eq!(x.on(Event::Failed(Failure::Reset)), Action::CloseClient);
        let mut y = Exchange::new("GET", 1, 1);
        y.start(0, false);
        run(&mut y, &seen);
        y.on(Event::InterimHead { forwarded: false });
        assert_eq!(y.on(Event::Failed(Failure::Reset)), Action::Respond(502));
    }

    #[test]
    fn a_read_timeout_before_the_head_is_504_and_bad_heads_502() {
        // With another server, a GET moves on to it; a POST, or a GET with nowhere
        // else to go, is answered 504.
        for (method, servers, want) in [
            ("GET", 2, Action::ConnectNext),
            ("POST", 2, Action::Respond(504)),
            ("GET", 1, Action::Respond(504)),
        ] {
            let mut x = Exchange::new(method, servers, 1);
            x.start(0, false);
            run(
                &mut x,
                &[Event::Connected, Event::HeadWritten, Event::RequestBodyDone],
            );
            assert_eq!(x.on(Event::Failed(Failure::Timeout)), want, "{method}");
        }
        let mut y = Exchange::new("GET", 2, 1);
        y.start(0, true);
        run(
            &mut y,
            &[
                Event::HeadWritten,
                Event::RequestBodyDone,
                Event::ResponseBytes,
            ],
        );
        assert_eq!(
            y.on(Event::Failed(Failure::BadResponse)),
            Action::Respond(502)
        );
    }

    #[test]
    fn each_phase_has_its_own_timeout() {
        let u = forkd_shared::config::Upstream {
            keepalive: 1,
            keepalive_requests: 10,
            send_timeout: Duration::from_secs(2),
            read_timeout: Duration::from_secs(3),
            ..crate::test_upstream::upstream("app", &[])
        }
        .timeouts(&Default::default());
        let t = |after: u64, fires_as, rearm_on_progress| {
            Some(Timeout {
                after: Duration::from_secs(after),
                fires_as,
                rearm_on_progress,
            })
        };
        let mut x = Exchange::new("GET", 2, 1);
        x.start(0, false);
        assert_eq!(x.timeout(&u), t(1, Failure::ConnectTimeout, false));
        x.on(Event::Connected);
        assert_eq!(x.timeout(&u), t(2, Failure::Timeout, true));
        run(&mut x, &[Event::HeadWritten, Event::RequestBodyDone]);
        assert_eq!(
            x.timeout(&u),
            t(3, Failure::Timeout, false),
            "the whole head wait"
        );
        x.on(Event::ResponseBytes);
        x.on(Event::FinalHead {
            has_body: true,
            reusable: true,
        });
        assert_eq!(
            x.timeout(&u),
            t(3, Failure::Timeout, true),
            "between body reads"
        );
        let fired = x.timeout(&u).unwrap().fires_as;
        assert_eq!(x.on(Event::Failed(fired)), Action::CloseClient);
        assert_eq!(x.timeout(&u), None);
        let mut y = Exchange::new("GET", 1, 1);
        y.start(0, true);
        run(&mut y, &[Event::HeadWritten, Event::RequestBodyDone]);
        let fired = y.timeout(&u).unwrap().fires_as;
        assert_eq!(y.on(Event::Failed(fired)), Action::Respond(504));
    }

    #[test]
    fn a_bodiless_response_releases_as_its_head_says() {
        for reusable in [true, false] {
            let mut x = Exchange::new("GET", 1, 1);
            x.start(0, true);
            run(
                &mut x,
                &[
                    Event::HeadWritten,
                    Event::RequestBodyDone,
                    Event::ResponseBytes,
                ],
            );
            let done = x.on(Event::FinalHead {
                has_body: false,
                reusable,
            });
            assert_eq!(done, Action::Release { reusable });
        }
    }

    #[test]
    fn a_response_that_begins_before_the_body_is_sent_goes_on_beside_it() {
        // The upstream streams while it reads the upload: head, body, then the end.
        let mut x = Exchange::new("POST", 1, 1);
        x.start(0, true);
        let actions = run(
            &mut x,
            &[
                Event::Wrote { n: 40 },
                Event::ResponseBytes,
                Event::FinalHead {
                    has_body: true,
                    reusable: true,
                },
                Event::HeadWritten,
                Event::Wrote { n: 5 },
                Event::RequestBodyDone,
                Event::ResponseBytes,
            ],
        );
        assert!(
            actions.iter().all(|a| *a == Action::Continue),
            "{actions:?}"
        );
        assert_eq!(x.state, State::StreamingResponseBody { server: 0 });
        assert!(x.request_complete());
        assert_eq!(
            x.on(Event::ResponseDone { reusable: true }),
            Action::Release { reusable: true },
            "both directions whole: the connection may be pooled"
        );
        assert_eq!(x.last_failure(), None);
    }

    #[test]
    fn an_event_the_state_does_not_expect_is_a_failure_the_exchange_records() {
        let mut x = Exchange::new("GET", 1, 1);
        x.start(0, false);
        assert_eq!(x.last_failure(), None);
        assert_eq!(
            x.on(Event::ResponseDone { reusable: true }),
            Action::Respond(502)
        );
        assert_eq!(x.last_failure(), Some(Failure::BadResponse));
        let mut y = Exchange::new("GET", 2, 1);
        y.start(0, false);
        y.on(Event::Failed(Failure::ConnectRefused));
        y.start(1, false);
        assert_eq!(
            y.last_failure(),
            Some(Failure::ConnectRefused),
            "the last failed attempt's until another fails"
        );
        y.on(Event::Failed(Failure::Reset));
        assert_eq!(y.last_failure(), Some(Failure::Reset));
    }

    #[test]
    fn an_early_response_ends_the_exchange_without_reuse() {
        let mut x = Exchange::new("POST", 2, 1);
        x.start(0, false);
        run(
            &mut x,
            &[Event::Connected, Event::HeadWritten, Event::ResponseBytes],
        );
        assert_eq!(
            x.on(Event::FinalHead {
                has_body: false,
                reusable: true
            }),
            Action::Release { reusable: false },
            "the request body was cut short: the connection's framing is off"
        );
        assert_eq!(x.on(Event::RequestBodyDone), Action::Continue);
    }
}

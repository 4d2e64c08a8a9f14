//! What a failed attempt becomes: another attempt (where), a status for the client,
//! or a closed client connection. Pure functions, so every rule is a table test.
//!
//! Rules (RFC 9110 §9.2.2 on retrying, RFC 9112 §9.5 on the stale-connection race):
//!
//! - Nothing is retried once a response byte has arrived: the upstream answered.
//! - A connect failure moves on to the next server: nothing was sent, so any method.
//! - A failure on a *reused* pooled connection before any response byte is the race
//!   with the upstream's idle close: retried once on a fresh connection to the same
//!   server, if the method is idempotent or no request byte reached the socket.
//!   A request whose body forkd holds whole (request buffering: the body was read
//!   to its end before the request went upstream) is retried so for every method:
//!   what the closing connection may have taken can be sent again byte for byte,
//!   and no response byte says the application acted on it.
//!   This one retry is allowed once per exchange on top of `retries` (so `retries: 0`
//!   still never fails a request on a stale connection), and never loops: the retry
//!   uses a fresh connection, which cannot be stale.
//! - An idempotent request whose attempt failed before any response byte (reset,
//!   closed, timed out) moves on to another server not tried yet, if all it sent can
//!   be sent again: the server died under it, and the request may run twice. A
//!   non-idempotent one never does once a byte of it left (it may have had effects).
//! - Every other retry counts against `retries`, the attempts beyond the first.
//! - Status: refused, reset, or a bad or premature response before the head: 502;
//!   a connect or read timeout before the head: 504; any failure after the head was
//!   sent to the client: close the client connection (a truncated response is
//!   noticed, a wrong one would not be).

/// How an attempt failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// `connect` failed (refused, unreachable, reset during the handshake).
    ConnectRefused,
    /// `connect` did not finish within `connect_timeout`.
    ConnectTimeout,
    /// The connection was reset or closed by the upstream (a write error, or EOF
    /// before the response was complete).
    Reset,
    /// No progress within `send_timeout` or `read_timeout`.
    Timeout,
    /// The response head was invalid (bad syntax, both framings, bad length...).
    BadResponse,
    /// The response body broke off or was badly framed.
    BadBody,
}

impl std::fmt::Display for Failure {
    /// For the error log line, which adds the upstream and server (nginx style:
    /// `upstream app 127.0.0.1:9000: connect() refused`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Failure::ConnectRefused => "connect() refused",
            Failure::ConnectTimeout => "connect() timed out",
            Failure::Reset => "connection closed or reset by the upstream",
            Failure::Timeout => "upstream timed out",
            Failure::BadResponse => "invalid response head from the upstream",
            Failure::BadBody => "invalid or truncated response body from the upstream",
        })
    }
}

/// What had happened on the attempt when it failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptState {
    /// The connection came from a pool.
    pub reused: bool,
    /// At least one request byte was accepted by the socket.
    pub request_bytes_sent: bool,
    /// At least one response byte arrived.
    pub response_bytes_seen: bool,
    /// The response head was already sent to the client.
    pub head_sent: bool,
    /// Everything sent so far can be sent again: the head always can, body bytes
    /// only while they are still in the exchange's replay copy.
    pub replayable: bool,
    /// The whole request (head and body) is held, for any number of resends: a
    /// buffered body read to its end.
    pub whole_copy: bool,
}

/// What the exchange does so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Retries made that count against `retries`.
    pub counted: u32,
    /// The one stale-connection retry was used.
    pub stale_used: bool,
    /// The upstream's `retries`.
    pub retries: u32,
}

/// The next step after a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Send the request again to the same server on a new connection (stale pooled
    /// connection); counts as the exchange's stale retry.
    RetryFresh,
    /// Connect to the next untried server; counts against `retries`.
    NextServer,
    /// Answer the client with this status (502 or 504) and end the exchange.
    Respond(u16),
    /// The client already has part of the response: close its connection.
    CloseClient,
}

pub const BAD_GATEWAY: u16 = 502;
pub const GATEWAY_TIMEOUT: u16 = 504;

/// RFC 9110 §9.2.2.
pub fn is_idempotent(method: &str) -> bool {
    matches!(
        method,
        "GET" | "HEAD" | "PUT" | "DELETE" | "OPTIONS" | "TRACE"
    )
}

/// Decides what follows `failure`. `idempotent`: [`is_idempotent`] of the method;
/// `servers_left`: whether an untried server remains.
pub fn decide(
    failure: Failure,
    attempt: AttemptState,
    idempotent: bool,
    budget: Budget,
    servers_left: bool,
) -> Decision {
    if attempt.head_sent {
        return Decision::CloseClient;
    }
    let status = status_for(failure);
    if attempt.response_bytes_seen {
        return Decision::Respond(status);
    }
    match failure {
        Failure::ConnectRefused | Failure::ConnectTimeout => {
            if servers_left && budget.counted < budget.retries {
                Decision::NextServer
            } else {
                Decision::Respond(status)
            }
        }
        Failure::Reset
            if attempt.reused
                && !budget.stale_used
                && attempt.replayable
                && (idempotent || !attempt.request_bytes_sent || attempt.whole_copy) =>
        {
            Decision::RetryFresh
        }
        Failure::Reset | Failure::Timeout
            if idempotent
                && attempt.replayable
                && servers_left
                && budget.counted < budget.retries =>
        {
            Decision::NextServer
        }
        _ => Decision::Respond(status),
    }
}

/// The status a failure before the response head becomes.
pub fn status_for(failure: Failure) -> u16 {
    match failure {
        Failure::ConnectTimeout | Failure::Timeout => GATEWAY_TIMEOUT,
        Failure::ConnectRefused | Failure::Reset | Failure::BadResponse | Failure::BadBody => {
            BAD_GATEWAY
        }
    }
}

/// The status line for a proxy error (`http::response::Status` has no 502/504).
pub fn status_line(status: u16) -> &'static str {
    match status {
        GATEWAY_TIMEOUT => "HTTP/1.1 504 Gateway Timeout",
        _ => "HTTP/1.1 502 Bad Gateway",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FRESH: AttemptState = AttemptState {
        reused: false,
        request_bytes_sent: true,
        response_bytes_seen: false,
        head_sent: false,
        replayable: true,
        whole_copy: false,
    };
    const REUSED: AttemptState = AttemptState {
        reused: true,
        ..FRESH
    };
    const BUDGET: Budget = Budget {
        counted: 0,
        stale_used: false,
        retries: 1,
    };

    #[test]
    fn a_stale_pooled_connection_is_retried_once_fresh() {
        assert_eq!(
            decide(Failure::Reset, REUSED, true, BUDGET, true),
            Decision::RetryFresh
        );
        let used = Budget {
            stale_used: true,
            ..BUDGET
        };
        assert_eq!(
            decide(Failure::Reset, REUSED, true, used, false),
            Decision::Respond(502)
        );
        let none = Budget {
            retries: 0,
            ..BUDGET
        };
        assert_eq!(
            decide(Failure::Reset, REUSED, true, none, false),
            Decision::RetryFresh,
            "retries: 0 still covers the stale race"
        );
    }

    #[test]
    fn non_idempotent_requests_are_retried_only_if_nothing_was_sent() {
        assert_eq!(
            decide(Failure::Reset, REUSED, false, BUDGET, true),
            Decision::Respond(502)
        );
        let unsent = AttemptState {
            request_bytes_sent: false,
            ..REUSED
        };
        assert_eq!(
            decide(Failure::Reset, unsent, false, BUDGET, true),
            Decision::RetryFresh
        );
        assert_eq!(
            decide(Failure::Reset, REUSED, true, BUDGET, true),
            Decision::RetryFresh
        );
    }

    #[test]
    fn a_request_held_whole_meets_the_stale_race_with_a_fresh_connection_whatever_its_method() {
        let held = AttemptState {
            whole_copy: true,
            ..REUSED
        };
        assert_eq!(
            decide(Failure::Reset, held, false, BUDGET, true),
            Decision::RetryFresh
        );
        // Never to another server, never after a response byte, never on a new one.
        let fresh = AttemptState {
            whole_copy: true,
            ..FRESH
        };
        assert_eq!(
            decide(Failure::Reset, fresh, false, BUDGET, true),
            Decision::Respond(502)
        );
        let answered = AttemptState {
            response_bytes_seen: true,
            ..held
        };
        assert_eq!(
            decide(Failure::Reset, answered, false, BUDGET, true),
            Decision::Respond(502)
        );
    }

    #[test]
    fn an_idempotent_request_without_an_answer_moves_to_another_server() {
        for f in [Failure::Reset, Failure::Timeout] {
            assert_eq!(decide(f, FRESH, true, BUDGET, true), Decision::NextServer);
            // No other server, or the budget spent: the failure's status.
            assert_eq!(
                decide(f, FRESH, true, BUDGET, false),
                Decision::Respond(status_for(f))
            );
            let spent = Budget {
                counted: 1,
                ..BUDGET
            };
            assert_eq!(
                decide(f, FRESH, true, spent, true),
                Decision::Respond(status_for(f))
            );
            // A body that left the replay copy cannot be sent again.
            let gone = AttemptState {
                replayable: false,
                whole_copy: false,
                ..FRESH
            };
            assert_eq!(
                decide(f, gone, true, BUDGET, true),
                Decision::Respond(status_for(f))
            );
        }
        let stale_used = Budget {
            stale_used: true,
            ..BUDGET
        };
        assert_eq!(
            decide(Failure::Reset, REUSED, true, stale_used, true),
            Decision::NextServer,
            "the fresh retry failed too: another server"
        );
        assert_eq!(
            decide(Failure::Timeout, REUSED, true, BUDGET, true),
            Decision::NextServer
        );
    }

    #[test]
    fn a_non_idempotent_request_that_left_never_moves_on() {
        for f in [Failure::Reset, Failure::Timeout] {
            assert_eq!(
                decide(f, FRESH, false, BUDGET, true),
                Decision::Respond(status_for(f))
            );
        }
        assert_eq!(
            decide(Failure::BadResponse, FRESH, true, BUDGET, true),
            Decision::Respond(502)
        );
    }

    #[test]
    fn connect_failures_move_on_within_retries() {
        let unsent = AttemptState {
            request_bytes_sent: false,
            ..FRESH
        };
        for f in [Failure::ConnectRefused, Failure::ConnectTimeout] {
            assert_eq!(decide(f, unsent, false, BUDGET, true), Decision::NextServer);
            assert_eq!(
                decide(f, unsent, false, BUDGET, false),
                Decision::Respond(status_for(f))
            );
            let spent = Budget {
                counted: 1,
                ..BUDGET
            };
            assert_eq!(
                decide(f, unsent, false, spent, true),
                Decision::Respond(status_for(f))
            );
        }
        assert_eq!(status_for(Failure::ConnectRefused), 502);
        assert_eq!(status_for(Failure::ConnectTimeout), 504);
    }

    #[test]
    fn nothing_is_retried_once_the_upstream_answered() {
        let answered = AttemptState {
            response_bytes_seen: true,
            ..REUSED
        };
        assert_eq!(
            decide(Failure::Reset, answered, true, BUDGET, true),
            Decision::Respond(502)
        );
        assert_eq!(
            decide(Failure::BadResponse, answered, true, BUDGET, true),
            Decision::Respond(502)
        );
        let streaming = AttemptState {
            head_sent: true,
            ..answered
        };
        for f in [Failure::Reset, Failure::Timeout, Failure::BadBody] {
            assert_eq!(
                decide(f, streaming, true, BUDGET, true),
                Decision::CloseClient
            );
        }
    }

    #[test]
    fn methods_and_status_lines() {
        assert!(is_idempotent("GET") && is_idempotent("DELETE"));
        assert!(!is_idempotent("POST") && !is_idempotent("PATCH") && !is_idempotent("get"));
        assert_eq!(status_line(502), "HTTP/1.1 502 Bad Gateway");
        assert_eq!(status_line(504), "HTTP/1.1 504 Gateway Timeout");
        assert_eq!(Failure::ConnectRefused.to_string(), "connect() refused");
    }
}

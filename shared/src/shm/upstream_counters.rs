//! The per-upstream-server counters, declared once like the worker counters of
//! `counters`: id (the cell of an upstream cell), JSON name, Prometheus family [label],
//! help. Everything else — the cells, reading, summing, folding, JSON, Prometheus,
//! the table of `forkd stats` and the name table of the upstream area — is derived
//! from it, so adding an upstream counter is its line and its increment
//! (`stats.upstream_bump(cell, upstream_counters::X, n)` in the worker).

use super::counters::{check_table, counters, Counter, CounterDef};

/// Counter cells of each upstream cell: the table's counters and room for more (part
/// of the layout: changing it is a new layout version).
pub const UPSTREAM_COUNTER_CELLS: usize = 16;

// id  constant             JSON name             Prometheus family [label]                           help
counters! { UPSTREAM_COUNTERS;
    0  REQUESTS             "requests"            "forkd_upstream_requests_total"                     "Requests sent to the upstream server (each attempt).";
    1  RESPONSES_1XX        "responses_1xx"       "forkd_upstream_responses_total" class = "1xx"      "Response heads from the upstream server by status class.";
    2  RESPONSES_2XX        "responses_2xx"       "forkd_upstream_responses_total" class = "2xx"      "Response heads from the upstream server by status class.";
    3  RESPONSES_3XX        "responses_3xx"       "forkd_upstream_responses_total" class = "3xx"      "Response heads from the upstream server by status class.";
    4  RESPONSES_4XX        "responses_4xx"       "forkd_upstream_responses_total" class = "4xx"      "Response heads from the upstream server by status class.";
    5  RESPONSES_5XX        "responses_5xx"       "forkd_upstream_responses_total" class = "5xx"      "Response heads from the upstream server by status class.";
    6  CONNECT_ERRORS       "connect_errors"      "forkd_upstream_connect_errors_total"               "Connections to the upstream server that failed (refused, reset, unreachable).";
    7  TIMEOUTS             "timeouts"            "forkd_upstream_timeouts_total"                     "Exchanges with the upstream server that timed out (connect, send or read).";
    8  RETRIES              "retries"             "forkd_upstream_retries_total"                      "Requests retried after a failure on this upstream server.";
    9  CONNECTIONS_NEW      "connections_new"     "forkd_upstream_connections_total" kind = "new"     "Upstream connections used for a request, by whether they were opened for it or reused from the pool.";
    10 CONNECTIONS_REUSED   "connections_reused"  "forkd_upstream_connections_total" kind = "reused"  "Upstream connections used for a request, by whether they were opened for it or reused from the pool.";
    // Proxy buffering (#20), the worker counters 14..=16, 20 and 21 by server. The
    // temporary files' bytes and counts stay per worker: its files and their bound
    // (`temp_max_bytes`) are the worker's, not a server's.
    11 BODIES_IN_MEMORY     "bodies_in_memory"    "forkd_upstream_buffered_bodies_total" kind = "memory" "Bodies of exchanges with the upstream server (requests read whole, responses a client fell behind on) buffered, by where they fit: memory only, or a temporary file too.";
    12 BODIES_ON_DISK       "bodies_on_disk"      "forkd_upstream_buffered_bodies_total" kind = "disk"   "Bodies of exchanges with the upstream server (requests read whole, responses a client fell behind on) buffered, by where they fit: memory only, or a temporary file too.";
    13 BUFFERING_FELL_BACK  "buffering_fell_back" "forkd_upstream_buffering_fell_back_total"          "Bodies of exchanges with the upstream server that streamed past a bound (max_temp_file_size, temp_max_bytes) or a temporary file that could not be written.";
    14 HELD_US              "held_us"             "forkd_upstream_held_microseconds_total"            "Microseconds the upstream server spent on proxied requests, from the request going upstream to the response read whole.";
    15 CLIENT_TRANSFER_US   "client_transfer_us"  "forkd_upstream_client_transfer_microseconds_total" "Microseconds clients took for the rest of the upstream server's responses after it was done with them.";
}

const _: () = check_table(UPSTREAM_COUNTERS, UPSTREAM_COUNTER_CELLS);

/// The counter of upstream responses of class `class` (1 to 5).
#[inline]
pub fn response_class(class: u16) -> Counter {
    const BY_CLASS: [Counter; 5] = [
        RESPONSES_1XX,
        RESPONSES_2XX,
        RESPONSES_3XX,
        RESPONSES_4XX,
        RESPONSES_5XX,
    ];
    BY_CLASS[(class.clamp(1, 5) - 1) as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_prometheus_samples_are_unique() {
        let mut names = std::collections::HashSet::new();
        let mut samples = std::collections::HashSet::new();
        for def in UPSTREAM_COUNTERS {
            assert!(names.insert(def.name), "{} twice", def.name);
            assert!(samples.insert((def.prometheus, def.label)));
        }
    }
}

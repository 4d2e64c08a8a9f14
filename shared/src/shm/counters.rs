//! The counters, declared once: the table below is the only list of them. Everything
//! else — the region's cells, reading, folding, zeroing, JSON, Prometheus, the name
//! table in the region header — is derived from it.
//!
//! Adding a counter is one line in [`counters!`] (a new id, never one used before) and
//! its increment where the event happens. Ids are region cell numbers: they are never
//! reused or renumbered, so builds with different counter sets share a region (see
//! `layout` on growing).

/// Counter cells in each row of the region: the counters of the table, and room for
/// those later builds add (part of the layout: changing it is a new layout version).
pub const COUNTER_CELLS: usize = 64;

/// A counter: the cell it lives in, in every row of the region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Counter(pub u16);

impl Counter {
    #[inline]
    pub const fn cell(self) -> usize {
        self.0 as usize
    }
}

/// What the table says about one counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CounterDef {
    pub counter: Counter,
    /// The JSON key (and the name in the region's name table).
    pub name: &'static str,
    /// The Prometheus metric family it is a sample of.
    pub prometheus: &'static str,
    /// An extra Prometheus label beside `worker`, for families of several counters.
    pub label: Option<(&'static str, &'static str)>,
    pub help: &'static str,
}

/// Longest counter name the region's name table holds.
pub const NAME_BYTES: usize = 32;

/// Declares a table of counters: `$table` (every `CounterDef`, in JSON order) and a
/// constant per counter. Also used for the per-upstream-server counters
/// (`upstream_counters`), whose ids are cells of an upstream cell instead.
macro_rules! counters {
    ($table:ident; $( $id:literal $konst:ident $name:literal $prom:literal $($lk:ident = $lv:literal)? $help:literal; )*) => {
        $(
            #[doc = $help]
            pub const $konst: Counter = Counter($id);
        )*
        /// Every counter this build knows, in JSON order.
        pub const $table: &[CounterDef] = &[$(
            CounterDef {
                counter: Counter($id),
                name: $name,
                prometheus: $prom,
                label: counters!(@label $($lk = $lv)?),
                help: $help,
            },
        )*];
    };
    (@label) => { None };
    (@label $lk:ident = $lv:literal) => { Some((stringify!($lk), $lv)) };
}
pub(super) use counters;

// id  constant               JSON name                Prometheus family [label]                    help
counters! { COUNTERS;
    0  CONNECTIONS_ACCEPTED   "connections_accepted"   "forkd_connections_accepted_total"           "Connections accepted.";
    1  CONNECTIONS_HANDLED    "connections_handled"    "forkd_connections_handled_total"            "Connections closed after being served.";
    2  REQUESTS               "requests"               "forkd_requests_total"                       "Requests answered.";
    3  RESPONSES_1XX          "responses_1xx"          "forkd_responses_total" class = "1xx"        "Responses by status class.";
    4  RESPONSES_2XX          "responses_2xx"          "forkd_responses_total" class = "2xx"        "Responses by status class.";
    5  RESPONSES_3XX          "responses_3xx"          "forkd_responses_total" class = "3xx"        "Responses by status class.";
    6  RESPONSES_4XX          "responses_4xx"          "forkd_responses_total" class = "4xx"        "Responses by status class.";
    7  RESPONSES_5XX          "responses_5xx"          "forkd_responses_total" class = "5xx"        "Responses by status class.";
    8  RESPONSES_499          "responses_499"          "forkd_client_closed_requests_total"         "Requests whose client went away before the response (499).";
    9  BYTES_IN               "bytes_in"               "forkd_received_bytes_total"                 "Bytes read from clients.";
    10 BYTES_OUT              "bytes_out"              "forkd_sent_bytes_total"                     "Bytes written to clients.";
    11 ACCEPT_EMPTY_WAKEUPS   "accept_empty_wakeups"   "forkd_accept_empty_wakeups_total"           "Accept wake-ups that found no connection.";
    12 CONNECTION_LIMIT_HITS  "connection_limit_hits"  "forkd_connection_limit_hits_total"          "Times a worker reached worker_connections.";
    13 SLOW_CLIENTS_CLOSED    "slow_clients_closed"    "forkd_slow_clients_closed_total"            "Connections closed below min_body_rate or min_send_rate.";
    // Proxy buffering (#20; ids 14..=21).
    14 BODIES_IN_MEMORY       "proxy_bodies_in_memory" "forkd_proxy_buffered_bodies_total" kind = "memory" "Proxied bodies (requests read whole, responses a client fell behind on) buffered, by where they fit: memory only, or a temporary file too.";
    15 BODIES_ON_DISK         "proxy_bodies_on_disk"   "forkd_proxy_buffered_bodies_total" kind = "disk"   "Proxied bodies (requests read whole, responses a client fell behind on) buffered, by where they fit: memory only, or a temporary file too.";
    16 BUFFERING_FELL_BACK    "proxy_buffering_fell_back" "forkd_proxy_buffering_fell_back_total"      "Proxied bodies that streamed past a bound (max_temp_file_size, temp_max_bytes) or a temporary file that could not be written.";
    17 TEMP_FILE_BYTES        "temp_file_bytes"        "forkd_temp_file_bytes_total"                "Bytes written to temporary files.";
    18 TEMP_FILES_OPENED      "temp_files_opened"      "forkd_temp_files_total" event = "opened"    "Temporary files opened and closed (open now: the difference).";
    19 TEMP_FILES_CLOSED      "temp_files_closed"      "forkd_temp_files_total" event = "closed"    "Temporary files opened and closed (open now: the difference).";
    20 UPSTREAM_HELD_US       "proxy_upstream_held_us" "forkd_proxy_upstream_held_microseconds_total" "Microseconds upstream servers spent on proxied requests, from the request going upstream to the response read whole.";
    21 CLIENT_TRANSFER_US     "proxy_client_transfer_us" "forkd_proxy_client_transfer_microseconds_total" "Microseconds clients took for the rest of a proxied response after the upstream was done with it.";
    // HTTP/2 (#22; ids 22..=29 and 56).
    22 H2_CONNECTIONS         "h2_connections"         "forkd_h2_connections_total"                 "Connections that spoke HTTP/2 (ALPN h2, or the h2c preface).";
    23 H2_STREAMS             "h2_streams"             "forkd_h2_streams_total"                     "HTTP/2 streams (requests) accepted.";
    24 H2_FLOOD_RAPID_RESET   "h2_flood_rapid_reset"   "forkd_h2_floods_total" kind = "rapid_reset"  "HTTP/2 connections closed with ENHANCE_YOUR_CALM, by flood: streams reset by the client (rapid reset) or opened too fast, control frames, header blocks.";
    25 H2_FLOOD_CONTROL       "h2_flood_control"       "forkd_h2_floods_total" kind = "control"      "HTTP/2 connections closed with ENHANCE_YOUR_CALM, by flood: streams reset by the client (rapid reset) or opened too fast, control frames, header blocks.";
    26 H2_FLOOD_HEADERS       "h2_flood_headers"       "forkd_h2_floods_total" kind = "headers"      "HTTP/2 connections closed with ENHANCE_YOUR_CALM, by flood: streams reset by the client (rapid reset) or opened too fast, control frames, header blocks.";
    27 H2_REFUSED_STREAMS     "h2_refused_streams"     "forkd_h2_refused_streams_total"             "HTTP/2 streams refused (REFUSED_STREAM): over h2_max_concurrent_streams, or after GOAWAY.";
    28 H2_PROTOCOL_ERRORS     "h2_protocol_errors"     "forkd_h2_connection_errors_total"           "HTTP/2 connections ended with a GOAWAY carrying an error (the client broke the protocol, or flooded).";
    29 H2_STREAM_ERRORS       "h2_stream_errors"       "forkd_h2_stream_errors_total"               "HTTP/2 streams reset with an error (a malformed request, say).";
    // TLS (#14; ids 30..=39).
    30 TLS_HANDSHAKES_FULL    "tls_handshakes_full"    "forkd_tls_handshakes_total" kind = "full"        "TLS handshakes completed, by kind (full, resumed with a session ticket) or failed.";
    31 TLS_HANDSHAKES_RESUMED "tls_handshakes_resumed" "forkd_tls_handshakes_total" kind = "resumed"     "TLS handshakes completed, by kind (full, resumed with a session ticket) or failed.";
    32 TLS_HANDSHAKES_FAILED  "tls_handshakes_failed"  "forkd_tls_handshakes_total" kind = "failed"      "TLS handshakes completed, by kind (full, resumed with a session ticket) or failed.";
    33 TLS_NOT_TLS            "tls_not_tls"            "forkd_tls_not_tls_total"                        "Connections to a TLS address that did not start with a TLS handshake (plain HTTP, say), closed.";
    34 TLS_VERSION_12         "tls_version_12"         "forkd_tls_handshakes_by_version_total" version = "TLSv1.2" "Completed TLS handshakes by protocol version.";
    35 TLS_VERSION_13         "tls_version_13"         "forkd_tls_handshakes_by_version_total" version = "TLSv1.3" "Completed TLS handshakes by protocol version.";
    36 TLS_CIPHER_AES128GCM   "tls_cipher_aes128gcm"   "forkd_tls_handshakes_by_cipher_total" cipher = "AES_128_GCM" "Completed TLS handshakes by the cipher of the negotiated suite.";
    37 TLS_CIPHER_AES256GCM   "tls_cipher_aes256gcm"   "forkd_tls_handshakes_by_cipher_total" cipher = "AES_256_GCM" "Completed TLS handshakes by the cipher of the negotiated suite.";
    38 TLS_CIPHER_CHACHA20    "tls_cipher_chacha20"    "forkd_tls_handshakes_by_cipher_total" cipher = "CHACHA20_POLY1305" "Completed TLS handshakes by the cipher of the negotiated suite.";
    39 TLS_ALERTS_RECEIVED    "tls_alerts_received"    "forkd_tls_alerts_received_total"                "TLS alerts received from clients that ended a connection (a client refusing the certificate, say).";
    // WebSocket / Upgrade tunnels (#12).
    44 TUNNELS_OPENED         "tunnels_opened"         "forkd_tunnels_opened_total"                 "Upgraded connections (WebSocket tunnels) opened after a 101 from an upstream.";
    45 TUNNELS_CLOSED         "tunnels_closed"         "forkd_tunnels_closed_total"                 "Upgraded connections (WebSocket tunnels) closed.";
    // Overload protection (ids from 48: other areas take the ones after 13; 40 is a test's "future" counter).
    48 AT_LIMIT_MS            "at_limit_ms"            "forkd_at_connection_limit_ms_total"         "Milliseconds a worker spent at worker_connections.";
    49 CONNECTIONS_ROTATED    "connections_rotated"    "forkd_connections_rotated_total"            "Connections told to close after their next response to make room at worker_connections.";
    50 IDLE_CLOSED_AT_LIMIT   "idle_closed_at_limit"   "forkd_idle_closed_at_limit_total"           "Idle keep-alive connections closed to make room at worker_connections.";
    51 RATE_LIMITED           "rate_limited"           "forkd_limited_total" limit = "rate"         "Requests answered 429 over a rate limit.";
    52 CONN_LIMITED           "conn_limited"           "forkd_limited_total" limit = "conn_per_ip"  "Connections answered 503 over conn_per_ip.";
    53 LIMITS_DRY_RUN_HITS    "limits_dry_run_hits"    "forkd_limits_dry_run_hits_total"            "Requests or connections over a DryRun limit (counted, not rejected).";
    54 PROXY_HEADER_REFUSED   "proxy_header_refused"   "forkd_proxy_header_refused_total"           "Connections closed for a missing or invalid PROXY protocol header, or from a peer not in proxy_protocol_from.";
    56 H2_GOAWAY_SENT         "h2_goaway_sent"         "forkd_h2_goaway_total"                      "Graceful GOAWAY frames sent (drain, reload, upgrade, h2_max_requests, h2_idle_timeout).";
    55 CONN_TABLE_FULL        "conn_table_full"        "forkd_limited_total" limit = "table_full"   "Connections answered 503 under conn_per_ip because every limits-table entry their client may use held other clients' connections.";
    // File pool (#23; ids 57..=60).
    57 FILE_JOBS              "file_jobs"              "forkd_file_jobs_total"                      "Jobs the file threads ran (open, fstat, read of a static file not in the open-file cache).";
    58 FILE_JOBS_JOINED       "file_jobs_joined"       "forkd_file_jobs_joined_total"               "Requests that waited for a file job already under way for the same file instead of starting one.";
    59 FILE_WAIT_US           "file_wait_us"           "forkd_file_wait_microseconds_total"         "Microseconds requests waited for the file threads (divided by file_jobs plus file_jobs_joined: the mean wait).";
    60 FILE_QUEUE_DEPTH       "file_queue_depth"       "forkd_file_queue_depth_total"               "Jobs already under way when each request went to the file threads (divided by requests that did: the mean queue depth).";
}

/// The counter of responses of class `class` (1 to 5).
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

/// A table's own rules, checked when compiling: ids fit `cells`, are unique, and
/// names fit the region's name table.
pub(super) const fn check_table(table: &[CounterDef], cells: usize) {
    let mut i = 0;
    while i < table.len() {
        assert!(table[i].counter.cell() < cells);
        assert!(!table[i].name.is_empty() && table[i].name.len() <= NAME_BYTES);
        let mut j = i + 1;
        while j < table.len() {
            assert!(table[i].counter.0 != table[j].counter.0);
            j += 1;
        }
        i += 1;
    }
}
const _: () = check_table(COUNTERS, COUNTER_CELLS);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_prometheus_samples_are_unique() {
        let mut names = std::collections::HashSet::new();
        let mut samples = std::collections::HashSet::new();
        for def in COUNTERS {
            assert!(names.insert(def.name), "{} twice", def.name);
            assert!(
                samples.insert((def.prometheus, def.label)),
                "{} {:?} twice",
                def.prometheus,
                def.label
            );
        }
    }

    #[test]
    fn response_classes_map_to_their_counters() {
        assert_eq!(response_class(1), RESPONSES_1XX);
        assert_eq!(response_class(4), RESPONSES_4XX);
        assert_eq!(response_class(9), RESPONSES_5XX);
    }
}

//! HTTP/2 conformance end to end (issue #22), h2spec's equivalent: raw frames sent
//! with Python's `hyperframe`/`hpack` (`tests/h2/*.py`) to a real forkd on an h2c
//! (`http2: PriorKnowledge`) listener, one test per group of RFC 9113 / RFC 7541
//! sections, the floods, the lifecycle, and a real client (httpx with HTTP/2) over
//! h2c and over TLS with ALPN h2.
//!
//! Each test starts its own daemon (and echo upstream), runs its group of checks,
//! and fails naming each failed check with what it expected and what it saw.
//! Deviations from the RFC's letter that h2spec accepts (the `h2` crate's choice of
//! error code, a connection error for a stream error) pass and are printed as notes.

mod support;
#[allow(dead_code)]
#[path = "support/tls.rs"]
mod tls_support;

use std::time::Duration;
use support::h2py::{run_group, GroupRun};
use support::upstream::{Reply, Settings, TestUpstream};
use support::*;
use tls_support::TestCa;

/// A group's run may take this long before it is killed (its own waits are bounded
/// far below; this is for a wedged check).
const LIMIT: Duration = Duration::from_secs(120);

/// The large file the checks download and stall on.
const BIG: usize = 1 << 20;

/// A daemon with an h2c listener, the static site (`index.html`, `big.bin`) and
/// `/echo` proxied to an upstream answering with the request it read.
struct H2Daemon {
    d: TestDaemon,
    _upstream: TestUpstream,
}

impl H2Daemon {
    /// With `top` keys (top-level) and `server` keys added to the builder's.
    fn start(top: &str, server: &str) -> H2Daemon {
        let upstream = TestUpstream::start(Settings::default(), |_| Reply::Echo);
        let d = builder(&upstream).top(top).server(server).start();
        H2Daemon {
            d,
            _upstream: upstream,
        }
    }

    /// What the checks are told: the port, the site, the binary and the config.
    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("H2_PORT", self.d.port.to_string()),
            ("H2_WWW", self.d.www().display().to_string()),
            ("H2_FORKD", BIN.to_string()),
            ("H2_CONFIG", self.d.config.display().to_string()),
        ]
    }

    fn run(&self, group: &str, only: &[&str]) -> GroupRun {
        run_group(group, only, &self.env(), LIMIT)
    }
}

fn builder(upstream: &TestUpstream) -> Builder {
    TestDaemon::builder()
        .h2c()
        .top(&format!(
            r#"upstreams: {{ "echo": (servers: ["{}"]) }},"#,
            upstream.addr()
        ))
        .routes(
            r#"(prefix: "/healthz", handler: Liveness),
            (prefix: "/echo", handler: Proxy(upstream: "echo")),
            (prefix: "/", handler: Static(root: "www", index: ["index.html"])),"#,
        )
        .file("big.bin", &noise(BIG, 22))
}

/// The concurrency limit the checks meet (5.1.2, the REFUSED_STREAM flood): small,
/// so that exceeding it is cheap.
const SERVER: &str = "h2_max_concurrent_streams: 8,";

#[test]
fn preface_frame_format_and_size_header_compression_stream_states() {
    // §3.5, §4.1–4.3, §5.1, §5.1.1, §5.1.2, §5.3.1, §5.4.1, §5.5
    H2Daemon::start("", SERVER)
        .run("connection", &[])
        .assert_passed();
}

#[test]
fn every_frame_type_settings_flow_control_and_error_codes() {
    // §6.1–6.10, §6.5.2, §6.5.3, §6.9.x, §7
    H2Daemon::start("", SERVER)
        .run("frames", &[])
        .assert_passed();
}

#[test]
fn request_rules_pseudo_headers_connection_fields_and_static_files() {
    // §8.1.x, §8.2, and a static file byte-identical, a range, HEAD, 404
    H2Daemon::start("", SERVER)
        .run("semantics", &[])
        .assert_passed();
}

#[test]
fn hpack_representations_and_errors() {
    // RFC 7541 §2.3.3, §4.2, §5.2, §6.1, §6.3
    H2Daemon::start("", SERVER)
        .run("hpack_checks", &[])
        .assert_passed();
}

#[test]
fn floods_are_closed_with_enhance_your_calm_and_counted() {
    // Rapid reset, CONTINUATION floods, an HPACK bomb, SETTINGS / PING / PRIORITY /
    // empty DATA floods, too many concurrent streams.
    H2Daemon::start("", SERVER)
        .run("floods", &[])
        .assert_passed();
}

#[test]
fn a_client_that_never_opens_its_window_is_closed_after_send_timeout() {
    let h = H2Daemon::start("", r#"send_timeout: "1s","#);
    h.run("lifecycle", &["life/1"]).assert_passed();
    h.d.assert_serves("/index.html", b"<h1>index</h1>\n");
}

#[test]
fn quit_sends_the_two_step_goaway_and_the_open_stream_completes() {
    let mut h = H2Daemon::start(r#"drain_timeout: "30s","#, "");
    h.run("lifecycle", &["life/2"]).assert_passed();
    assert!(
        h.d.wait_exit(SETTLE).is_some(),
        "forkd still running {SETTLE:?} after -s quit and the stream's end"
    );
}

#[test]
fn httpx_speaks_http2_over_h2c_and_over_tls_with_alpn() {
    let upstream = TestUpstream::start(Settings::default(), |_| Reply::Echo);
    let ca = TestCa::new();
    let mut d = builder(&upstream).prepare();
    let tls_port = d.reserve_port();
    ca.issue(&["localhost", "127.0.0.1"], 90)
        .write(d.dir.path(), "tls");
    std::fs::write(d.path("ca.pem"), ca.pem()).unwrap();
    // The builder's server (h2c), and beside it a TLS server on its own port with
    // the same routes; ALPN offers h2 by default.
    let text = d.builder.config_text(d.port);
    let tls_server = format!(
        r#"(
        listen: ["127.0.0.1:{tls_port}"],
        names: ["localhost"],
        tls: Some((certificates: [(cert: "tls.pem", key: "tls.key")])),
        routes: [
            (prefix: "/echo", handler: Proxy(upstream: "echo")),
            (prefix: "/", handler: Static(root: "www", index: ["index.html"])),
        ],
    )"#
    );
    let end = text.rfind(")],").expect("the servers list's end");
    let text = format!("{}), {tls_server}],{}", &text[..end], &text[end + 3..]);
    std::fs::write(&d.config, text).unwrap();
    let cmd = d.command();
    let pid = d.spawn(cmd);
    d.wait_serving(pid);
    let env = vec![
        ("H2_PORT", d.port.to_string()),
        ("H2_TLS_PORT", tls_port.to_string()),
        ("H2_CA", d.path("ca.pem").display().to_string()),
        ("H2_WWW", d.www().display().to_string()),
    ];
    run_group("clients", &[], &env, LIMIT).assert_passed();
    let received = upstream.received();
    assert!(
        received.iter().filter(|r| r.method() == "POST").count() >= 4,
        "the upstream read {} requests: {:?}",
        received.len(),
        received
            .iter()
            .map(|r| r.path().to_string())
            .collect::<Vec<_>>()
    );
}

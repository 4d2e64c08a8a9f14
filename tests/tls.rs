//! End-to-end tests of HTTPS (issue #14): handshakes with real clients (rustls,
//! curl, `openssl s_client`, Python's `ssl`), everything plain HTTP does working over
//! TLS (keep-alive, pipelining, large files, the proxy), SNI choosing the
//! certificate, session resumption on every worker and across `-s upgrade`, a renewed
//! certificate adopted by reload under load without a failed request, a bad one
//! refused, plain HTTP on a TLS port closed and counted, and `-t` on certificate
//! problems.
//!
//! Each daemon has a plain server on the harness's port (its probes) and the TLS
//! servers on a second reserved port.

mod support;
#[path = "support/tls.rs"]
mod tls_support;

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::*;
use tls_support::*;

const SETTLE: Duration = Duration::from_secs(30);

/// A running daemon with TLS servers on `tls_port`, and the CA of their certificates.
struct Https {
    d: TestDaemon,
    tls_port: u16,
    ca: TestCa,
}

/// The config: the plain probe server, then `tls_servers` (each `(...)`, with
/// `{tls}` standing for the TLS port).
fn config_text(workers: usize, accept: &str, plain: u16, tls: u16, tls_servers: &str) -> String {
    format!(
        r#"(
    workers: Count({workers}),
    accept: {accept},
    pid_file: "forkd.pid",
    shm_file: "forkd.shm",
    error_log: File("error.log"),
    log_level: Info,
    drain_timeout: "5s",
    servers: [
        (
            listen: ["127.0.0.1:{plain}"],
            names: ["localhost"],
            routes: [
                (prefix: "/healthz", handler: Liveness),
                (prefix: "/metrics", handler: Metrics),
                (prefix: "/", handler: Static(root: "www", index: ["index.html"])),
            ],
        ),
        {servers}
    ],
)
"#,
        servers = tls_servers.replace("{tls}", &tls.to_string())
    )
}

/// One TLS server named `names` with the certificate `<stem>.pem` / `<stem>.key`.
fn tls_server(names: &[&str], stem: &str, extra: &str, routes: &str) -> String {
    let names: Vec<String> = names.iter().map(|n| format!("\"{n}\"")).collect();
    format!(
        r#"(
            listen: ["127.0.0.1:{{tls}}"],
            names: [{names}],
            tls: Some((
                certificates: [(cert: "{stem}.pem", key: "{stem}.key")],
                versions: [Tls12, Tls13],
                session_tickets: true,
            )),
            {extra}
            routes: [{routes}],
        ),"#,
        names = names.join(", ")
    )
}

const STATIC: &str = r#"(prefix: "/", handler: Static(root: "www", index: ["index.html"]))"#;

impl Https {
    /// Starts `workers` workers with the TLS servers `servers` (the certificates they
    /// name issued by `issue` into the daemon's folder first).
    fn start(
        builder: Builder,
        accept: &'static str,
        servers: &str,
        issue: impl FnOnce(&TestCa, &Path),
    ) -> Https {
        let ca = TestCa::new();
        let workers = builder.workers;
        let mut d = builder.accept(accept).prepare();
        let tls_port = d.reserve_port();
        issue(&ca, d.dir.path());
        let text = config_text(workers, accept, d.port, tls_port, servers);
        std::fs::write(&d.config, text).unwrap();
        let cmd = d.command();
        let pid = d.spawn(cmd);
        d.wait_serving(pid);
        Https { d, tls_port, ca }
    }

    /// One TLS server, `a.test`, ECDSA, valid 90 days.
    fn simple(builder: Builder, accept: &'static str) -> Https {
        Https::start(
            builder,
            accept,
            &tls_server(&["a.test"], "a", "", STATIC),
            |ca, dir| ca.issue(&["a.test"], 90).write(dir, "a"),
        )
    }

    fn totals(&self) -> serde_json::Value {
        shm_json(&self.d.shm())["totals"].clone()
    }

    fn total(&self, name: &str) -> u64 {
        self.totals()[name]
            .as_u64()
            .unwrap_or_else(|| panic!("no counter {name} in {}", self.totals()))
    }
}

/// Writes `text` to `path` through a rename, as certbot replaces files.
fn replace_file(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[test]
fn keep_alive_pipelining_and_a_large_file_work_over_tls() {
    let big = noise(3 << 20, 14);
    let h = Https::simple(
        TestDaemon::builder()
            .file("big.bin", &big)
            .file("one.txt", b"one\n"),
        "Shared",
    );
    let client = h.ca.client();
    let mut c = TlsConn::connect(h.tls_port, "a.test", &client).unwrap();
    let hs = c.handshake();
    assert_eq!(hs.alpn.as_deref(), Some(&b"http/1.1"[..]), "{hs:?}");
    assert_eq!(hs.version, Some(rustls::ProtocolVersion::TLSv1_3));
    // Keep-alive: three requests on the connection, the large file among them.
    let r = c.get("a.test", "/").unwrap();
    assert_eq!((r.status, r.body_str().as_str()), (200, "<h1>index</h1>\n"));
    let r = c.get("a.test", "/big.bin").unwrap();
    assert_eq!(r.status, 200);
    assert!(r.body == big, "the 3 MiB file came back different over TLS");
    // Pipelining: three requests in one write, three answers in order.
    let one = "GET /one.txt HTTP/1.1\r\nHost: a.test\r\n\r\n";
    c.send(format!("{one}{one}{one}").as_bytes()).unwrap();
    for i in 0..3 {
        let r = c.response().unwrap();
        assert_eq!(
            (r.status, r.body_str().as_str()),
            (200, "one\n"),
            "pipelined {i}"
        );
    }
    // And TLS 1.2 is offered too.
    let tls12 = h.ca.client_with(&[&rustls::version::TLS12], true);
    let (hs, r) = tls_get(h.tls_port, "a.test", &tls12, "/one.txt").unwrap();
    assert_eq!(
        (hs.version, r.status),
        (Some(rustls::ProtocolVersion::TLSv1_2), 200)
    );
    assert!(h.total("tls_handshakes_full") >= 2, "{}", h.totals());
    assert!(h.total("tls_version_12") >= 1 && h.total("tls_version_13") >= 1);
    h.d.assert_log_clean();
}

#[test]
fn sni_picks_the_certificate_of_the_named_server_and_the_default_otherwise() {
    let servers = tls_server(
        &["a.test"],
        "a",
        "",
        r#"(prefix: "/", handler: Return(status: 200, body: "server a\n"))"#,
    ) + &tls_server(
        &["b.test", "*.wild.test"],
        "b",
        "",
        r#"(prefix: "/", handler: Return(status: 200, body: "server b\n"))"#,
    );
    let certs = Arc::new(Mutex::new(Vec::new()));
    let keep = certs.clone();
    let h = Https::start(TestDaemon::builder(), "Shared", &servers, move |ca, dir| {
        let a = ca.issue(&["a.test"], 90);
        let b = ca.issue(&["b.test", "*.wild.test"], 90);
        a.write(dir, "a");
        b.write(dir, "b");
        keep.lock().unwrap().extend([a.leaf, b.leaf]);
    });
    let (a_leaf, b_leaf) = {
        let c = certs.lock().unwrap();
        (c[0].clone(), c[1].clone())
    };
    let client = h.ca.client();
    for (name, leaf, body) in [
        ("a.test", &a_leaf, "server a\n"),
        ("b.test", &b_leaf, "server b\n"),
        ("x.wild.test", &b_leaf, "server b\n"),
    ] {
        let (hs, r) = tls_get(h.tls_port, name, &client, "/").unwrap();
        assert!(hs.leaf == *leaf, "SNI {name}: the wrong certificate");
        assert_eq!(r.body_str(), body, "SNI {name}");
    }
    // No SNI: the address's default server (the first), whose certificate names a.test.
    let no_sni = h.ca.client_with(&[&rustls::version::TLS13], false);
    let (hs, _) = tls_get(h.tls_port, "a.test", &no_sni, "/").unwrap();
    assert!(
        hs.leaf == a_leaf,
        "no SNI: not the default server's certificate"
    );
    // An unknown name gets the default server's certificate, which does not name it.
    let err = tls_get(h.tls_port, "unknown.test", &client, "/").unwrap_err();
    assert!(
        err.contains("certificate") || err.contains("NotValidForName"),
        "{err}"
    );
    // The client said why with an alert: counted as a failed handshake, not logged.
    assert!(
        wait_until(SETTLE, || h.total("tls_alerts_received") == 1
            && h.total("tls_handshakes_failed") == 1),
        "{}",
        h.totals()
    );
    assert!(
        !h.d.error_log().contains("unknown.test"),
        "{}",
        h.d.error_log()
    );
    h.d.assert_log_clean();
}

#[test]
fn session_tickets_resume_on_every_worker() {
    let h = Https::simple(TestDaemon::builder().workers(2), "ReusePort");
    let client = h.ca.client();
    let (first, _) = tls_get(h.tls_port, "a.test", &client, "/").unwrap();
    assert!(!first.resumed);
    // ReusePort spreads connections over both workers by their source port.
    for i in 0..24 {
        let (hs, r) = tls_get(h.tls_port, "a.test", &client, "/").unwrap();
        assert_eq!(r.status, 200);
        assert!(hs.resumed, "connection {i} was not resumed");
    }
    let stats = shm_json(&h.d.shm());
    let resumed: Vec<u64> = stats["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            w["counters"]["tls_handshakes_resumed"]
                .as_u64()
                .unwrap_or(0)
        })
        .collect();
    assert!(
        resumed.len() == 2 && resumed.iter().all(|&n| n > 0),
        "resumed handshakes per worker: {resumed:?} (each should have resumed sessions the other issued)"
    );
    // `openssl s_client` resumes from a saved session as well.
    if which("openssl") {
        let sess = h.d.dir.path().join("sess.pem");
        let ca = h.d.dir.path().join("ca.pem");
        std::fs::write(&ca, h.ca.pem()).unwrap();
        let out = s_client(h.tls_port, &ca, &["-sess_out", sess.to_str().unwrap()]);
        assert!(out.contains("New,"), "{out}");
        for _ in 0..4 {
            let out = s_client(h.tls_port, &ca, &["-sess_in", sess.to_str().unwrap()]);
            assert!(out.contains("Reused,"), "openssl s_client -sess_in:\n{out}");
        }
    }
    h.d.assert_log_clean();
}

fn which(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `openssl s_client` sending one request, its output.
fn s_client(port: u16, ca: &Path, extra: &[&str]) -> String {
    use std::io::Write;
    let mut child = Command::new("openssl")
        .args(["s_client", "-connect", &format!("127.0.0.1:{port}")])
        .args([
            "-servername",
            "a.test",
            "-CAfile",
            ca.to_str().unwrap(),
            "-ign_eof",
        ])
        .args(extra)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"GET / HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

#[test]
fn curl_openssl_and_python_complete_handshakes_and_get_the_page() {
    let h = Https::simple(TestDaemon::builder(), "Shared");
    let ca = h.d.dir.path().join("ca.pem");
    std::fs::write(&ca, h.ca.pem()).unwrap();
    let url = format!("https://a.test:{}/", h.tls_port);
    let resolve = format!("a.test:{}:127.0.0.1", h.tls_port);
    let mut tried = Vec::new();
    if which("curl") {
        let out = Command::new("curl")
            .args([
                "-sS",
                "--cacert",
                ca.to_str().unwrap(),
                "--resolve",
                &resolve,
                &url,
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "curl: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout), "<h1>index</h1>\n");
        tried.push("curl");
    }
    if which("openssl") {
        let out = s_client(h.tls_port, &ca, &["-verify_return_error"]);
        assert!(out.contains("Verify return code: 0 (ok)"), "{out}");
        assert!(out.contains("<h1>index</h1>"), "{out}");
        tried.push("openssl");
    }
    if which("python3") {
        let script = format!(
            r#"
import socket, ssl
ctx = ssl.create_default_context(cafile={ca:?})
ctx.set_alpn_protocols(["http/1.1"])
with socket.create_connection(("127.0.0.1", {port})) as raw:
    with ctx.wrap_socket(raw, server_hostname="a.test") as s:
        assert s.selected_alpn_protocol() == "http/1.1", s.selected_alpn_protocol()
        s.sendall(b"GET / HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n")
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
print(data.decode().split("\r\n\r\n", 1)[1], end="")
"#,
            ca = ca.to_str().unwrap(),
            port = h.tls_port
        );
        let out = Command::new("python3")
            .args(["-c", &script])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "python ssl: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout), "<h1>index</h1>\n");
        tried.push("python3");
    }
    eprintln!("real clients tried: {tried:?}");
    assert!(
        !tried.is_empty(),
        "none of curl, openssl, python3 is installed"
    );
    h.d.assert_log_clean();
}

#[test]
fn plain_http_to_a_tls_port_is_closed_and_counted_without_a_log_line_each() {
    let h = Https::simple(TestDaemon::builder(), "Shared");
    for _ in 0..5 {
        let mut c = Conn::connect(h.tls_port).unwrap();
        c.send(b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n").unwrap();
        // At most a TLS alert comes back, then the end of the stream.
        let got = read_until_closed(
            &mut c.s,
            "the TLS port did not close a plain HTTP connection",
        );
        assert!(
            got.len() < 16 && !got.starts_with(b"HTTP/"),
            "a plain HTTP request on the TLS port got {got:?}"
        );
    }
    assert!(
        wait_until(SETTLE, || h.total("tls_not_tls") == 5),
        "tls_not_tls: {}",
        h.totals()
    );
    // The TLS port still serves TLS.
    let (_, r) = tls_get(h.tls_port, "a.test", &h.ca.client(), "/").unwrap();
    assert_eq!(r.status, 200);
    let log = h.d.error_log();
    assert!(
        log.lines().filter(|l| l.contains("127.0.0.1")).count() < 5,
        "plain HTTP on the TLS port was logged per connection:\n{log}"
    );
    h.d.assert_log_clean();
}

#[test]
fn a_renewed_certificate_is_served_after_reload_under_load_without_a_failure() {
    let h = Https::simple(TestDaemon::builder().workers(2), "Shared");
    let workers = h.d.workers();
    let client = h.ca.client_without_resumption();
    let (before, _) = tls_get(h.tls_port, "a.test", &client, "/").unwrap();
    // Load: full handshakes (no resumption) and requests.
    let clients = (0..3).map(|_| h.ca.client_without_resumption()).collect();
    let load = TlsLoad::with_clients(h.tls_port, clients);
    load.wait_for(20);
    // Renewal: a new certificate and key in place of the old, then reload.
    let renewed = h.ca.issue(&["a.test"], 180);
    replace_file(&h.d.path("a.key"), &renewed.key_pem);
    replace_file(&h.d.path("a.pem"), &renewed.chain_pem);
    let (code, out, err) = h.d.ctl(&["-s", "reload"]);
    assert_eq!(code, 0, "reload: {out}{err}\n{}", h.d.error_log());
    let served = wait_until(SETTLE, || {
        (0..4).all(|_| {
            tls_get(h.tls_port, "a.test", &client, "/").is_ok_and(|(hs, _)| hs.leaf == renewed.leaf)
        })
    });
    load.wait_for(20);
    load.assert_clean("through the renewal");
    assert!(
        served,
        "the renewed certificate is not served after the reload"
    );
    assert!(before.leaf != renewed.leaf);
    assert_eq!(
        h.d.workers(),
        workers,
        "the renewal started new worker processes"
    );
    h.d.assert_log_clean();
}

#[test]
fn a_bad_certificate_fails_the_reload_and_the_old_one_keeps_serving() {
    let h = Https::simple(TestDaemon::builder(), "Shared");
    let client = h.ca.client_without_resumption();
    let (before, _) = tls_get(h.tls_port, "a.test", &client, "/").unwrap();
    // A renewal gone wrong: the new certificate beside the old key.
    let renewed = h.ca.issue(&["a.test"], 180);
    replace_file(&h.d.path("a.pem"), &renewed.chain_pem);
    let (code, out, err) = h.d.ctl(&["-s", "reload"]);
    assert_ne!(
        code, 0,
        "a reload with a mismatched key succeeded: {out}{err}"
    );
    let said = format!("{out}{err}");
    assert!(
        said.contains("does not match the certificate") && said.contains("forkd.ron:"),
        "reload said: {said}"
    );
    let (after, r) = tls_get(h.tls_port, "a.test", &client, "/").unwrap();
    assert_eq!(r.status, 200);
    assert!(
        after.leaf == before.leaf,
        "not the old certificate after a refused reload"
    );
    h.d.assert_log_clean();
}

#[test]
fn check_reports_certificate_problems_at_their_entry_and_warns_of_expiry() {
    let ca = TestCa::new();
    let dir = TempDir::new();
    let p = dir.path();
    std::fs::create_dir_all(p.join("www")).unwrap();
    let good = ca.issue(&["a.test"], 90);
    good.write(p, "good");
    let other = ca.issue(&["b.test"], 90);
    std::fs::write(p.join("mismatch.pem"), &good.chain_pem).unwrap();
    std::fs::write(p.join("mismatch.key"), &other.key_pem).unwrap();
    // The CA first, then the leaf: out of order.
    let leaf_pem =
        &good.chain_pem[..good.chain_pem.find("-----END CERTIFICATE-----").unwrap() + 26];
    std::fs::write(p.join("reversed.pem"), ca.pem() + leaf_pem).unwrap();
    std::fs::write(p.join("reversed.key"), &good.key_pem).unwrap();
    ca.issue(&["soon.test"], 10).write(p, "soon");
    let server =
        |stem: &str| tls_server(&[&format!("{stem}.test")], stem, "", STATIC).replace("{tls}", "1");
    let check = |servers: &str| {
        let config = p.join("forkd.ron");
        std::fs::write(&config, config_text(1, "Shared", 2, 3, servers)).unwrap();
        let (code, out, err) = run_forkd(&config, &["-t"]);
        (code, format!("{out}{err}"))
    };
    for (stem, says) in [
        ("missing", "cannot read"),
        ("mismatch", "does not match the certificate"),
        ("reversed", "out of order"),
    ] {
        let text = config_text(1, "Shared", 2, 3, &server(stem));
        let (code, said) = check(&server(stem));
        assert_eq!(code, 1, "{stem}: {said}");
        // Located at the entry's `cert: "..."` literal.
        let offset = text.find(&format!("\"{stem}.pem\"")).unwrap();
        let line = text[..offset].matches('\n').count() + 1;
        let col = offset - text[..offset].rfind('\n').unwrap();
        let at = format!("forkd.ron:{line}:{col}: servers[1].tls.certificates[0]: ");
        assert!(said.contains(&at) && said.contains(says), "{stem}: {said}");
    }
    let (code, said) = check(&server("soon"));
    assert_eq!(code, 0, "an expiring certificate is not an error: {said}");
    assert!(
        said.contains("warning") && said.contains("expires on") && said.contains("GMT"),
        "{said}"
    );
    let (code, said) = check(&server("good"));
    assert_eq!(code, 0, "{said}");
    assert!(!said.contains("warning"), "{said}");
}

#[test]
fn the_proxy_answers_over_tls_with_plain_http_to_the_upstream() {
    use support::upstream::{Reply, Settings, TestUpstream};
    let upstream = TestUpstream::start(Settings::default(), |req| {
        Reply::ok(format!("upstream saw {}\n", req.path()).as_bytes())
    });
    let top = format!(
        r#"upstreams: {{ "app": (servers: ["{}"]) }},"#,
        upstream.addr()
    );
    let servers = tls_server(
        &["a.test"],
        "a",
        "",
        r#"(prefix: "/api/", handler: Proxy(upstream: "app")), (prefix: "/", handler: Static(root: "www"))"#,
    );
    let ca = TestCa::new();
    let mut d = TestDaemon::builder().prepare();
    let tls_port = d.reserve_port();
    ca.issue(&["a.test"], 90).write(d.dir.path(), "a");
    let text = config_text(1, "Shared", d.port, tls_port, &servers)
        .replace("    servers: [", &format!("    {top}\n    servers: ["));
    std::fs::write(&d.config, text).unwrap();
    let cmd = d.command();
    let pid = d.spawn(cmd);
    d.wait_serving(pid);
    let mut c = TlsConn::connect(tls_port, "a.test", &ca.client()).unwrap();
    for i in 0..3 {
        let r = c.get("a.test", &format!("/api/echo{i}")).unwrap();
        assert_eq!(r.status, 200, "proxied request {i}: {}", r.head);
        assert_eq!(r.body_str(), format!("upstream saw /api/echo{i}\n"));
    }
    d.assert_log_clean();
}

/// Client threads doing GETs over TLS until stopped: full handshakes and resumed
/// ones; every failure kept with its reason.
struct TlsLoad {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    failures: Arc<Mutex<Vec<String>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl TlsLoad {
    /// One client without resumption and two with it.
    fn start(port: u16, ca: &TestCa) -> TlsLoad {
        let clients = vec![ca.client_without_resumption(), ca.client(), ca.client()];
        TlsLoad::with_clients(port, clients)
    }

    /// A thread per client in `clients`.
    fn with_clients(port: u16, clients: Vec<Arc<rustls::ClientConfig>>) -> TlsLoad {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicU64::new(0));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let threads = clients
            .into_iter()
            .map(|client| {
                let (stop, ok, failures) = (stop.clone(), ok.clone(), failures.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        match tls_get(port, "a.test", &client, "/") {
                            Ok((_, r)) if r.status == 200 => {
                                ok.fetch_add(1, Ordering::Relaxed);
                            }
                            Ok((_, r)) => failures
                                .lock()
                                .unwrap()
                                .push(format!("status {}", r.status)),
                            Err(e) => failures.lock().unwrap().push(e),
                        }
                    }
                })
            })
            .collect();
        TlsLoad {
            stop,
            ok,
            failures,
            threads,
        }
    }

    fn ok(&self) -> u64 {
        self.ok.load(Ordering::Relaxed)
    }

    fn wait_for(&self, more: u64) {
        let until = self.ok() + more;
        assert!(
            wait_until(SETTLE, || self.ok() >= until),
            "the TLS load made no progress: {} ok, failures {:?}",
            self.ok(),
            self.failures.lock().unwrap()
        );
    }

    /// Stops the threads and asserts no request failed.
    fn assert_clean(self, what: &str) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().unwrap();
        }
        let failures = self.failures.lock().unwrap();
        assert!(
            failures.is_empty(),
            "{what}: {} of {} requests failed: {:?}",
            failures.len(),
            self.ok.load(Ordering::Relaxed) + failures.len() as u64,
            &failures[..failures.len().min(5)]
        );
    }
}

#[test]
fn an_upgrade_under_tls_load_fails_nothing_and_tickets_issued_before_still_resume() {
    let mut h = Https::simple(TestDaemon::builder().workers(2).own_binary(), "Shared");
    // A ticket from the old master's workers, kept for after the upgrade.
    let keeper = h.ca.client();
    let (first, _) = tls_get(h.tls_port, "a.test", &keeper, "/").unwrap();
    assert!(!first.resumed);
    let load = TlsLoad::start(h.tls_port, &h.ca);
    load.wait_for(20);
    let old = h.d.master().unwrap();
    let old_workers = children_of(old);
    let config = h.d.config.clone();
    let r = h.d.ctl_with(&config, &["-s", "upgrade"]);
    assert_eq!(r.code, 0, "forkd -s upgrade: {r:?}\n{}", h.d.error_log());
    let new = h.d.master().unwrap();
    assert_ne!(new, old);
    h.d.adopt_master(new);
    assert!(wait_until(SETTLE, || {
        h.d.reap_first();
        !alive(old) && old_workers.iter().all(|&w| !alive(w))
    }));
    h.d.wait_serving(new);
    load.wait_for(20);
    load.assert_clean("-s upgrade under TLS load");
    let (after, r) = tls_get(h.tls_port, "a.test", &keeper, "/").unwrap();
    assert_eq!(r.status, 200);
    assert!(
        after.resumed,
        "a ticket issued before the upgrade was not accepted by the new master's workers"
    );
    h.d.stop_master();
    h.d.assert_log_clean();
}

#[test]
fn a_client_that_never_finishes_its_handshake_is_closed_after_header_timeout() {
    let h = Https::start(
        TestDaemon::builder(),
        "Shared",
        &tls_server(&["a.test"], "a", r#"header_timeout: "1s","#, STATIC),
        |ca, dir| ca.issue(&["a.test"], 90).write(dir, "a"),
    );
    // Half a ClientHello record header, then nothing.
    let mut c = Conn::connect(h.tls_port).unwrap();
    c.send(&[0x16, 0x03, 0x01]).unwrap();
    c.s.set_read_timeout(Some(SETTLE)).unwrap();
    let got = read_until_closed(&mut c.s, "a stalled handshake was not closed");
    assert!(got.is_empty(), "{got:?}");
    let (_, r) = tls_get(h.tls_port, "a.test", &h.ca.client(), "/").unwrap();
    assert_eq!(r.status, 200);
    h.d.assert_log_clean();
}

#[test]
fn a_graceful_stop_finishes_a_tls_response_under_way() {
    let big = noise(8 << 20, 3);
    let mut h = Https::simple(TestDaemon::builder().file("big.bin", &big), "Shared");
    let mut c = TlsConn::connect(h.tls_port, "a.test", &h.ca.client()).unwrap();
    c.send(b"GET /big.bin HTTP/1.1\r\nHost: a.test\r\n\r\n")
        .unwrap();
    // Read a little, so the response is under way when the stop comes.
    let mut head = [0u8; 1024];
    let n = std::io::Read::read(&mut c.s, &mut head).unwrap();
    assert!(n > 0);
    h.d.signal("QUIT");
    let mut rest = head[..n].to_vec();
    let _ = std::io::Read::read_to_end(&mut c.s, &mut rest);
    let end = rest.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    assert!(
        rest[end..] == big[..],
        "the response in flight at QUIT came back {} bytes of {}",
        rest.len() - end,
        big.len()
    );
    assert!(h.d.wait_exit(SETTLE).is_some_and(|s| s.success()));
}

#[test]
fn certificate_expiry_is_shown_by_forkd_stats_json_and_metrics() {
    let days = 45;
    let h = Https::start(
        TestDaemon::builder().file("x", b""),
        "Shared",
        &tls_server(&["a.test"], "a", "", STATIC),
        move |ca, dir| ca.issue(&["a.test"], days).write(dir, "a"),
    );
    let json = shm_json(&h.d.shm());
    let certs = json["tls_certificates"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(certs.len(), 1, "{json}");
    assert_eq!(certs[0]["server"], "a.test");
    assert!(certs[0]["file"].as_str().unwrap().ends_with("/a.pem"));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let not_after = certs[0]["not_after_s"].as_u64().unwrap();
    let left = (not_after - now) / 86400;
    assert!(
        left == days as u64 || left + 1 == days as u64,
        "{left} days left"
    );
    let (code, table, err) = h.d.ctl(&["stats"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        table.contains("TLS certificates:") && table.contains("a.test") && table.contains(" days)"),
        "{table}"
    );
    // The Metrics route (on the plain server).
    let r = get_close(h.d.port, "/metrics").unwrap();
    assert_eq!(r.status, 200);
    let text = r.body_str();
    let line = format!(
        "forkd_tls_certificate_expiry_timestamp_seconds{{server=\"a.test\",file=\"{}\"}} {not_after}",
        certs[0]["file"].as_str().unwrap()
    );
    assert!(text.contains(&line), "no {line} in:\n{text}");
    assert!(text.contains("forkd_tls_handshakes_total{"), "{text}");
}

#[test]
fn with_an_ecdsa_and_an_rsa_chain_each_client_gets_one_it_can_verify() {
    if !which("openssl") {
        eprintln!("openssl missing: no RSA certificate to test with (ring cannot make RSA keys)");
        return;
    }
    let servers = r#"(
            listen: ["127.0.0.1:{tls}"],
            names: ["a.test"],
            tls: Some((certificates: [(cert: "a.pem", key: "a.key"), (cert: "rsa.pem", key: "rsa.key")])),
            routes: [(prefix: "/", handler: Return(status: 200, body: "ok\n"))],
        ),"#;
    let h = Https::start(TestDaemon::builder(), "Shared", servers, |ca, dir| {
        ca.issue(&["a.test"], 90).write(dir, "a");
        let made = Command::new("openssl")
            .args([
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
            ])
            .output()
            .unwrap();
        assert!(
            made.status.success(),
            "{}",
            String::from_utf8_lossy(&made.stderr)
        );
        let key = String::from_utf8(made.stdout).unwrap();
        ca.issue_for_key(&["a.test"], 30, &key).write(dir, "rsa");
    });
    let rsa_pem = std::fs::read(h.d.path("rsa.pem")).unwrap();
    let rsa_der: Vec<u8> = {
        use rustls::pki_types::pem::PemObject;
        // The chain's first certificate: the leaf.
        rustls::pki_types::CertificateDer::pem_slice_iter(&rsa_pem)
            .next()
            .unwrap()
            .unwrap()
            .as_ref()
            .to_vec()
    };
    // A TLS 1.2 client offering only ECDHE-RSA suites gets the RSA chain ...
    let mut rsa_only = rustls::crypto::ring::default_provider();
    rsa_only.cipher_suites =
        vec![rustls::crypto::ring::cipher_suite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256];
    let client =
        h.ca.client_trusting(&[&rustls::version::TLS12], true, rsa_only, &[]);
    let (hs, r) = tls_get(h.tls_port, "a.test", &client, "/").unwrap();
    assert_eq!(r.status, 200);
    assert!(
        hs.leaf == rsa_der,
        "an RSA-only client did not get the RSA certificate"
    );
    // ... and any other the first entry, ECDSA.
    let client = h.ca.client_trusting(
        &[&rustls::version::TLS13],
        true,
        rustls::crypto::ring::default_provider(),
        &[],
    );
    let (hs, _) = tls_get(h.tls_port, "a.test", &client, "/").unwrap();
    assert!(
        hs.leaf != rsa_der,
        "a client that takes ECDSA got the RSA certificate"
    );
    h.d.assert_log_clean();
}

#[test]
fn without_tickets_tls12_sessions_resume_by_id_across_a_reload() {
    let servers = tls_server(&["a.test"], "a", "", STATIC)
        .replace("session_tickets: true", "session_tickets: false");
    let h = Https::start(TestDaemon::builder(), "Shared", &servers, |ca, dir| {
        ca.issue(&["a.test"], 90).write(dir, "a")
    });
    let workers = h.d.workers();
    let client = h.ca.client_with(&[&rustls::version::TLS12], true);
    let (first, _) = tls_get(h.tls_port, "a.test", &client, "/").unwrap();
    assert!(!first.resumed);
    let (again, _) = tls_get(h.tls_port, "a.test", &client, "/").unwrap();
    assert!(again.resumed, "no session-id resumption without tickets");
    let (code, out, err) = h.d.ctl(&["-s", "reload"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        h.d.workers(),
        workers,
        "the reload was not adopted in place"
    );
    let (after, r) = tls_get(h.tls_port, "a.test", &client, "/").unwrap();
    assert_eq!(r.status, 200);
    assert!(
        after.resumed,
        "the worker forgot its TLS 1.2 sessions on reload"
    );
    h.d.assert_log_clean();
}

/// Keys readable by root only (certbot's `privkey.pem` is 0600 root), workers running
/// as `nobody`: reloads still work, and a renewal is served.
#[test]
fn with_root_only_keys_and_a_user_reloads_work_and_a_renewal_is_served() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("not root: skipped");
        return;
    }
    let ca = TestCa::new();
    let mut d = TestDaemon::builder().workers(2).prepare();
    let tls_port = d.reserve_port();
    let dir = d.dir.path().to_path_buf();
    let write_pair = |issued: &Issued| {
        issued.write(&dir, "a");
        for f in ["a.pem", "a.key"] {
            std::fs::set_permissions(
                dir.join(f),
                std::os::unix::fs::PermissionsExt::from_mode(0o600),
            )
            .unwrap();
        }
    };
    write_pair(&ca.issue(&["a.test"], 90));
    let plain_port = d.port;
    let text = |body: &str| {
        config_text(
            2,
            "Shared",
            plain_port,
            tls_port,
            &tls_server(
                &["a.test"],
                "a",
                "",
                &format!(r#"(prefix: "/", handler: Return(status: 200, body: "{body}"))"#),
            ),
        )
        .replace(
            "    drain_timeout:",
            "    user: Some(\"nobody\"),\n    drain_timeout:",
        )
    };
    std::fs::write(&d.config, text("one")).unwrap();
    let cmd = d.command();
    let pid = d.spawn(cmd);
    d.wait_serving(pid);
    let client = ca.client_without_resumption();
    let (_, r) = tls_get(tls_port, "a.test", &client, "/").unwrap();
    assert_eq!(r.body_str(), "one");
    // A reload that changes a route, certificates untouched: in place.
    let workers = d.workers();
    write_config(&d.config, &text("two"));
    let (code, out, err) = d.ctl(&["-s", "reload"]);
    assert_eq!(
        code,
        0,
        "reload with root-only keys: {out}{err}\n{}",
        d.error_log()
    );
    let (_, r) = tls_get(tls_port, "a.test", &client, "/").unwrap();
    assert_eq!(r.body_str(), "two");
    assert_eq!(d.workers(), workers, "a route change started new workers");
    // A renewal the workers cannot read: the master starts workers that have it.
    let renewed = ca.issue(&["a.test"], 180);
    write_pair(&renewed);
    let (code, out, err) = d.ctl(&["-s", "reload"]);
    assert_eq!(
        code,
        0,
        "renewal with root-only keys: {out}{err}\n{}",
        d.error_log()
    );
    let served = wait_until(SETTLE, || {
        tls_get(tls_port, "a.test", &client, "/").is_ok_and(|(hs, _)| hs.leaf == renewed.leaf)
    });
    assert!(served, "the renewed certificate is not served");
    d.assert_log_clean();
}

#[test]
fn versions_limit_what_is_offered_and_an_address_is_all_tls_or_all_plain() {
    let servers = tls_server(&["a.test"], "a", "", STATIC).replace("[Tls12, Tls13]", "[Tls13]");
    let h = Https::start(TestDaemon::builder(), "Shared", &servers, |ca, dir| {
        ca.issue(&["a.test"], 90).write(dir, "a")
    });
    let tls12 = h.ca.client_with(&[&rustls::version::TLS12], true);
    let err = tls_get(h.tls_port, "a.test", &tls12, "/").unwrap_err();
    assert!(
        err.contains("handshake"),
        "a TLS 1.2 client on a Tls13-only server: {err}"
    );
    let (hs, _) = tls_get(h.tls_port, "a.test", &h.ca.client(), "/").unwrap();
    assert_eq!(hs.version, Some(rustls::ProtocolVersion::TLSv1_3));
    assert!(
        wait_until(SETTLE, || h.total("tls_handshakes_failed") == 1),
        "{}",
        h.totals()
    );
    h.d.assert_log_clean();
    // A plain server on the TLS address: refused by -t.
    let mixed = tls_server(&["a.test"], "a", "", STATIC)
        + r#"(listen: ["127.0.0.1:{tls}"], names: ["b.test"], routes: [(prefix: "/", handler: Liveness)]),"#;
    let config = h.d.dir.path().join("mixed.ron");
    std::fs::write(
        &config,
        config_text(1, "Shared", h.d.port, h.tls_port, &mixed),
    )
    .unwrap();
    let (code, out, err) = run_forkd(&config, &["-t"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains("mixed.ron:") && err.contains("all HTTPS or all plain HTTP"),
        "{err}"
    );
}

/// A TLS server whose address takes a PROXY protocol header from loopback peers, with
/// its own access log and a rate limit of one request a minute per client.
fn proxied_tls() -> Https {
    let server = tls_server(
        &["a.test"],
        "a",
        r#"access_log: Some(File("tls.log")),
            limits: Some((rates: [(key: ClientIp, rate: "1/m", burst: 1)])),"#,
        STATIC,
    )
    .replace(
        r#"listen: ["127.0.0.1:{tls}"]"#,
        r#"listen: [(addr: "127.0.0.1:{tls}", proxy_protocol: true, proxy_protocol_from: ["127.0.0.0/8"])]"#,
    );
    Https::start(TestDaemon::builder(), "Shared", &server, |ca, dir| {
        ca.issue(&["a.test"], 90).write(dir, "a")
    })
}

/// The PROXY header comes before the TLS handshake on the connection (issue #21): it
/// is read from the socket, the handshake then starts, and the header's client is the
/// one the access log and the limits see.
#[test]
fn a_proxy_header_before_the_tls_handshake_names_the_client() {
    let h = proxied_tls();
    let client = h.ca.client_without_resumption();
    let get = |preface: &[u8]| {
        let mut c = TlsConn::connect_after(h.tls_port, "a.test", &client, preface)?;
        c.get("a.test", "/").map(|r| r.status)
    };
    let v1 = b"PROXY TCP4 203.0.113.9 127.0.0.1 5555 443\r\n";
    let v2 = proxy_v2_header([198, 51, 100, 23], 6666);
    assert_eq!(get(v1), Ok(200), "PROXY v1, then TLS");
    assert_eq!(get(&v2), Ok(200), "PROXY v2, then TLS");
    // The limit counts the header's client, not the balancer (127.0.0.1).
    assert_eq!(get(v1), Ok(429), "203.0.113.9 again, over its rate");
    assert_eq!(
        get(b"PROXY TCP4 192.0.2.80 127.0.0.1 7777 443\r\n"),
        Ok(200)
    );
    assert_eq!(h.total("tls_handshakes_full"), 4, "{}", h.totals());
    let log = || std::fs::read_to_string(h.d.path("tls.log")).unwrap_or_default();
    assert!(
        wait_until(SETTLE, || {
            let text = log();
            ["203.0.113.9", "198.51.100.23", "192.0.2.80"]
                .iter()
                .all(|client| text.contains(client))
        }),
        "{}",
        log()
    );
    assert!(!log().contains("127.0.0.1 "), "{}", log());
    // A handshake without the header first is refused: the header is required.
    let err = TlsConn::connect(h.tls_port, "a.test", &client).err();
    assert!(
        err.is_some(),
        "a TLS client without a PROXY header was served"
    );
    assert!(
        wait_until(SETTLE, || h.total("proxy_header_refused") == 1),
        "{}",
        h.totals()
    );
    h.d.assert_log_clean();
}

/// What the server sent before it closed the connection (an EOF or a reset both
/// count as closed); panics with `what` if the read ends any other way.
fn read_until_closed(s: &mut std::net::TcpStream, what: &str) -> Vec<u8> {
    let mut got = Vec::new();
    let end = std::io::Read::read_to_end(s, &mut got);
    assert!(
        end.is_ok()
            || end
                .as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
        "{what}: {end:?}"
    );
    got
}

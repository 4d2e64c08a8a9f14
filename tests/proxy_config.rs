//! `forkd -t` on proxy configurations: every shipped example passes, and each mistake
//! in `upstreams` or a `Proxy` route is reported as FILE:LINE:COL with exit 1.

mod support;
use std::path::{Path, PathBuf};
use support::*;

/// Writes `text` as `forkd.ron` (with a `www` folder) into a fresh temp folder.
fn write_config(text: &str) -> (TempDir, PathBuf) {
    let dir = TempDir::new();
    std::fs::create_dir_all(dir.path().join("www")).unwrap();
    let config = dir.path().join("forkd.ron");
    std::fs::write(&config, text).unwrap();
    (dir, config)
}

/// A config with one upstream (`servers` as given) and a route to `route_upstream`.
fn proxy_config(servers: &str, route_upstream: &str) -> String {
    format!(
        r#"(
    upstreams: {{
        "app": (
            servers: [{servers}],
            keepalive: 4,
        ),
    }},
    servers: [(
        listen: ["127.0.0.1:{port}"],
        routes: [
            (prefix: "/api/", handler: Proxy(upstream: "{route_upstream}")),
            (prefix: "/", handler: Static(root: "www")),
        ],
    )],
)
"#,
        port = free_port()
    )
}

/// Runs `-t`; asserts it failed and returns stderr (stdout too, whichever carries it).
fn rejected(config: &Path) -> String {
    let (code, out, err) = run_forkd(config, &["-t"]);
    assert_eq!(code, 1, "-t should fail\nstdout: {out}\nstderr: {err}");
    format!("{out}{err}")
}

#[test]
fn every_example_config_passes_t() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../conf/examples");
    let mut checked = 0;
    for entry in std::fs::read_dir(&examples).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "ron") {
            let (code, out, err) = run_forkd(&path, &["-t"]);
            assert_eq!(code, 0, "{}:\nstdout: {out}\nstderr: {err}", path.display());
            checked += 1;
        }
    }
    assert!(checked >= 1, "no .ron file in {}", examples.display());
}

#[test]
fn proxy_config_with_tcp_and_unix_servers_passes_t() {
    let (_dir, config) = write_config(&proxy_config(
        r#""127.0.0.1:9000", "[::1]:9001", "localhost:9002", "unix:/run/app.sock""#,
        "app",
    ));
    let (code, out, err) = run_forkd(&config, &["-t"]);
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
}

#[test]
fn unknown_upstream_name_is_an_error_at_the_route() {
    let (_dir, config) = write_config(&proxy_config(r#""127.0.0.1:9000""#, "apps"));
    let err = rejected(&config);
    let want = format!(
        "{}:11:56: servers[0].routes[0].handler.upstream: no upstream named `apps` (known: app)",
        config.display()
    );
    assert!(err.contains(&want), "want {want}\ngot {err}");
}

#[test]
fn empty_server_list_is_an_error_in_its_upstream() {
    let (_dir, config) = write_config(&proxy_config("", "app"));
    let err = rejected(&config);
    let want = format!(
        "{}:4:13: upstreams.\"app\".servers: at least one server is needed",
        config.display()
    );
    assert!(err.contains(&want), "want {want}\ngot {err}");
}

#[test]
fn bad_upstream_addresses_are_errors_where_written() {
    for bad in [
        "127.0.0.1",
        "127.0.0.1:99999",
        "unix:run/app.sock",
        "http://127.0.0.1:9000",
        "app server:9000",
    ] {
        let servers = format!(r#""127.0.0.1:9000", "{bad}""#);
        let (_dir, config) = write_config(&proxy_config(&servers, "app"));
        let err = rejected(&config);
        let at = format!("{}:4:", config.display());
        assert!(err.contains(&at), "{bad}: want {at}\ngot {err}");
        assert!(err.contains(&format!("`{bad}`")), "{bad}: {err}");
    }
}

#[test]
fn unknown_upstream_key_is_an_error_at_the_key() {
    let text = proxy_config(r#""127.0.0.1:9000""#, "app").replace("keepalive: 4", "keep_alive: 4");
    let (_dir, config) = write_config(&text);
    let err = rejected(&config);
    let at = format!("{}:5:", config.display());
    assert!(err.contains(&at) && err.contains("keep_alive"), "{err}");
}

#[test]
fn an_upstream_defined_twice_is_an_error() {
    let text = proxy_config(r#""127.0.0.1:9000""#, "app").replacen(
        "    },\n    servers",
        "        \"app\": (servers: [\"127.0.0.1:9001\"]),\n    },\n    servers",
        1,
    );
    let (_dir, config) = write_config(&text);
    let err = rejected(&config);
    let at = format!("{}:7:", config.display());
    assert!(
        err.contains(&at) && err.contains("upstream `app` is defined twice"),
        "{err}"
    );
}

#[test]
fn zero_keepalive_requests_is_an_error_at_the_key() {
    let text = proxy_config(r#""127.0.0.1:9000""#, "app")
        .replace("keepalive: 4,", "keepalive: 4, keepalive_requests: 0,");
    let (_dir, config) = write_config(&text);
    let err = rejected(&config);
    let want = format!(
        "{}:5:27: upstreams.\"app\".keepalive_requests: must be at least 1",
        config.display()
    );
    assert!(err.contains(&want), "want {want}\ngot {err}");
}

#[test]
fn unknown_keys_inside_a_handler_are_errors_at_the_key() {
    for (written, misspelt) in [
        (
            r#"Proxy(upstream: "app")"#,
            r#"Proxy(upstream: "app", bufering: false)"#,
        ),
        (
            r#"Static(root: "www")"#,
            r#"Static(root: "www", indx: ["x"])"#,
        ),
    ] {
        let text = proxy_config(r#""127.0.0.1:9000""#, "app").replace(written, misspelt);
        let (_dir, config) = write_config(&text);
        let err = rejected(&config);
        let typo = if misspelt.starts_with("Proxy") {
            "bufering"
        } else {
            "indx"
        };
        let (line, text_line) = text
            .lines()
            .enumerate()
            .find(|(_, l)| l.contains(typo))
            .unwrap();
        let (line, col) = (line + 1, text_line.find(typo).unwrap() + 1);
        let want = format!("{}:{line}:{col}: ", config.display());
        assert!(
            err.contains(&want) && err.contains(&format!("`{typo}`")),
            "want {want}... `{typo}`\ngot {err}"
        );
    }
}

#[test]
fn more_upstream_servers_than_the_stats_region_has_cells_for_is_an_error_at_the_first_over() {
    // The region has 64 upstream cells; server 65 would be neither counted nor checked.
    let servers: Vec<String> = (0..66)
        .map(|i| format!("\"127.0.0.1:{}\"", 10000 + i))
        .collect();
    let text = proxy_config(&servers.join(", "), "app");
    let (_dir, config) = write_config(&text);
    let err = rejected(&config);
    let col = text
        .lines()
        .nth(3)
        .unwrap()
        .find("\"127.0.0.1:10064\"")
        .unwrap()
        + 1;
    let want = format!(
        "{}:4:{col}: upstreams.\"app\".servers: `127.0.0.1:10064` is upstream server 65 of 66",
        config.display()
    );
    assert!(err.contains(&want), "want {want}\ngot {err}");
    let (_dir, config) = write_config(&proxy_config(&servers[..64].join(", "), "app"));
    let (code, out, err) = run_forkd(&config, &["-t"]);
    assert_eq!(code, 0, "64 servers fit\nstdout: {out}\nstderr: {err}");
}

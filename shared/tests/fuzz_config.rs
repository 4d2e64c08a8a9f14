//! Property tests of the config loader: the shipped `conf/forkd.ron`, mutated the way
//! an operator's edits go wrong (a wrong value, a typo, a duplicated or deleted line,
//! a stray byte, a key mentioned in a comment), then parsed and validated.
//!
//! The property: every error points into the file, at the place it is about. The line
//! exists, the column is on it (counted in characters, as editors count), and for a
//! value that is well-formed but wrong the position is outside comments, on the key or
//! on the quoted value the message names.
//!
//! A fixed seed and case count keep `cargo test` fast and repeatable; `PROPTEST_CASES`
//! and `PROPTEST_RNG_SEED` run a longer or different hunt.

use forkd_shared::config::{Config, ConfigError, ConfigErrorKind};
use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, RngSeed};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

const BASE: &str = include_str!("../../conf/forkd.ron");

fn runner(cases: u32) -> RunnerConfig {
    let mut config = RunnerConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = cases;
    }
    if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
        config.rng_seed = RngSeed::Fixed(0x0066_6f72_6b64);
    }
    config.failure_persistence = None;
    config
}

/// A folder with the `www` the base config serves, so the unmutated base is valid.
fn config_file() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("forkd-fuzz-config-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("www")).unwrap();
        dir.join("forkd.ron")
    })
}

/// Values an operator might write, good and bad, for any key.
const VALUES: &[&str] = &[
    "Auto",
    "Off",
    "Count(0)",
    "Count(4)",
    "Count(100000)",
    "0",
    "1",
    "-1",
    "65536",
    "18446744073709551616",
    "None",
    "Some(0)",
    "Some(\"nobody-forkd-fuzz\")",
    "Some(\"root\")",
    "\"\"",
    "\"0s\"",
    "\"15s\"",
    "\"1h\"",
    "\"-5s\"",
    "\"10 seconds\"",
    "\"16KiB\"",
    "\"512B\"",
    "\"2GB\"",
    "\"1TiB\"",
    "\"www\"",
    "\"missing-dir\"",
    "\"/\"",
    "\"a\\u{2f}b\"",
    "\"\\\"\"",
    "\"caf\u{e9}\"",
    "[]",
    "[\"127.0.0.1:8080\"]",
    "[\"127.0.0.1:8080\", \"127.0.0.1:8080\"]",
    "[\"nonsense\"]",
    "[\"*:8081\"]",
    "[\"localhost\", \"localhost\"]",
    "[\"a/b\"]",
    "[\"\"]",
    "Shared",
    "ReusePort",
    "Stderr",
    "Syslog",
    "File(\"\")",
    "Some(File(\"x.log\"))",
    "Liveness",
    "Static(root: \"www\")",
    "Static(root: \"nope\", index: [\"a/b\"])",
    "Static(root: \"www\", index: [\"\"])",
    "Metrics",
    "Loud",
];

/// Keys, to misspell or to repeat.
const KEYS: &[&str] = &[
    "workers",
    "cpu_affinity",
    "accept",
    "worker_connections",
    "multi_accept",
    "rlimit_nofile",
    "user",
    "pid_file",
    "error_log",
    "log_level",
    "drain_timeout",
    "servers",
    "listen",
    "backlog",
    "names",
    "access_log",
    "keepalive_timeout",
    "max_header_bytes",
    "max_body_bytes",
    "routes",
    "prefix",
    "handler",
    "root",
    "index",
];

#[derive(Debug, Clone)]
enum Edit {
    /// Replace the value after the n-th `key:` (up to the next `,` or line end).
    Value(usize, &'static str),
    /// Insert `key: value,` at the start of the n-th line.
    AddField(usize, &'static str, &'static str),
    /// Insert a comment that mentions a key or a value at the start of the n-th line.
    Comment(usize, &'static str),
    DeleteLine(usize),
    DuplicateLine(usize),
    /// Insert a character at a relative position.
    Insert(u16, char),
    /// Delete a character at a relative position.
    Delete(u16),
    /// Add a server block that copies the first one.
    SecondServer,
    /// Add a route.
    Route(&'static str, &'static str),
}

fn edit() -> impl Strategy<Value = Edit> {
    let value = prop::sample::select(VALUES);
    let key = prop::sample::select(KEYS);
    prop_oneof![
        4 => (any::<usize>(), value.clone()).prop_map(|(n, v)| Edit::Value(n, v)),
        1 => (any::<usize>(), key.clone(), value.clone()).prop_map(|(n, k, v)| Edit::AddField(n, k, v)),
        2 => (any::<usize>(), prop_oneof![key, value.clone()]).prop_map(|(n, t)| Edit::Comment(n, t)),
        1 => any::<usize>().prop_map(Edit::DeleteLine),
        1 => any::<usize>().prop_map(Edit::DuplicateLine),
        1 => (any::<u16>(), prop::sample::select(vec!['(', ')', '[', ']', ',', ':', '"', '/', '*', 'x', '\u{e9}', '\n', '\0']))
            .prop_map(|(p, c)| Edit::Insert(p, c)),
        1 => any::<u16>().prop_map(Edit::Delete),
        1 => Just(Edit::SecondServer),
        1 => (prop::sample::select(vec!["\"/\"", "\"/healthz\"", "\"/x\"", "\"x\"", "\"\""]), value)
            .prop_map(|(p, h)| Edit::Route(p, h)),
    ]
}

fn char_boundary(text: &str, p: u16) -> usize {
    let mut i = text.len() * usize::from(p) / 65536;
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn line_start(text: &str, n: usize) -> usize {
    let starts: Vec<usize> = std::iter::once(0)
        .chain(text.match_indices('\n').map(|(i, _)| i + 1))
        .filter(|&i| i < text.len())
        .collect();
    starts[n % starts.len()]
}

fn apply(text: &mut String, edit: &Edit) {
    if text.is_empty() {
        return;
    }
    match edit {
        Edit::Value(n, v) => {
            let keys: Vec<usize> = KEYS
                .iter()
                .flat_map(|k| {
                    let needle = format!("{k}: ");
                    text.match_indices(&needle)
                        .map(|(i, m)| i + m.len())
                        .collect::<Vec<_>>()
                })
                .collect();
            if keys.is_empty() {
                return;
            }
            let at = keys[n % keys.len()];
            let end = text[at..].find([',', '\n']).map_or(text.len(), |e| at + e);
            text.replace_range(at..end, v);
        }
        Edit::AddField(n, k, v) => {
            let at = line_start(text, *n);
            text.insert_str(at, &format!("{k}: {v},\n"));
        }
        Edit::Comment(n, t) => {
            let at = line_start(text, *n);
            text.insert_str(at, &format!("// {t}: see {t}\n/* {t} */ "));
        }
        Edit::DeleteLine(n) => {
            let at = line_start(text, *n);
            let end = text[at..].find('\n').map_or(text.len(), |e| at + e + 1);
            text.replace_range(at..end, "");
        }
        Edit::DuplicateLine(n) => {
            let at = line_start(text, *n);
            let end = text[at..].find('\n').map_or(text.len(), |e| at + e + 1);
            let line = text[at..end].to_string();
            text.insert_str(end, &line);
        }
        Edit::Insert(p, c) => {
            let at = char_boundary(text, *p);
            text.insert(at, *c);
        }
        Edit::Delete(p) => {
            let at = char_boundary(text, *p);
            if let Some(c) = text[at..].chars().next() {
                text.replace_range(at..at + c.len_utf8(), "");
            }
        }
        Edit::SecondServer => {
            if let (Some(start), Some(end)) = (text.find("servers: [("), text.rfind(")],")) {
                let block = text[start + "servers: [".len()..end + 1].to_string();
                text.insert_str(end + 1, &format!(", {block}"));
            }
        }
        Edit::Route(prefix, handler) => {
            if let Some(at) = text.find("routes: [") {
                let at = at + "routes: [".len();
                text.insert_str(at, &format!("\n(prefix: {prefix}, handler: {handler}),"));
            }
        }
    }
}

/// For each byte of `text`, whether it is inside a comment (RON: `//` to the end of
/// the line, `/* */` nested).
fn comment_map(text: &str) -> Vec<bool> {
    let b = text.as_bytes();
    let mut map = vec![false; b.len()];
    let mut i = 0;
    let mut in_string = false;
    while i < b.len() {
        if in_string {
            match b[i] {
                b'\\' => i += 1,
                b'"' => in_string = false,
                _ => {}
            }
            i += 1;
            continue;
        }
        match (b[i], b.get(i + 1)) {
            (b'"', _) => in_string = true,
            (b'/', Some(b'/')) => {
                while i < b.len() && b[i] != b'\n' {
                    map[i] = true;
                    i += 1;
                }
                continue;
            }
            (b'/', Some(b'*')) => {
                let mut depth = 0;
                while i < b.len() {
                    map[i] = true;
                    if b[i..].starts_with(b"/*") {
                        depth += 1;
                        map[i + 1] = true;
                        i += 2;
                        continue;
                    }
                    if b[i..].starts_with(b"*/") {
                        depth -= 1;
                        map[i + 1] = true;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                        continue;
                    }
                    i += 1;
                }
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    map
}

/// The byte offset of 1-based `line` and character column `col`, if inside `text`
/// (the column just after a line's last character counts: an error at the end).
fn offset_of(text: &str, line: usize, col: usize) -> Option<usize> {
    let start = line_start_exact(text, line)?;
    let line_text = text[start..].split('\n').next().unwrap_or("");
    let chars = line_text.chars().count();
    if col == 0 || col > chars + 1 {
        return None;
    }
    Some(
        start
            + line_text
                .char_indices()
                .nth(col - 1)
                .map_or(line_text.len(), |(i, _)| i),
    )
}

fn line_start_exact(text: &str, line: usize) -> Option<usize> {
    if line == 0 {
        return None;
    }
    if line == 1 {
        return Some(0);
    }
    text.match_indices('\n').nth(line - 2).map(|(i, _)| i + 1)
}

/// `servers[0].routes[1].handler.root` -> `root`.
fn last_key(field: &str) -> &str {
    let last = field.rsplit('.').next().unwrap_or(field);
    last.split('[').next().unwrap_or(last)
}

fn check_error(text: &str, e: &ConfigError) -> Result<(), TestCaseError> {
    let Some(at) = offset_of(text, e.line, e.col) else {
        return Err(TestCaseError::fail(format!(
            "{}:{} is not in the file: {e}",
            e.line, e.col
        )));
    };
    if let ConfigErrorKind::Invalid { field, .. } = &e.kind {
        let comments = comment_map(text);
        prop_assert!(
            !comments.get(at).copied().unwrap_or(false),
            "{}:{} is inside a comment: {}",
            e.line,
            e.col,
            e
        );
        let here = &text[at..];
        let key = last_key(field);
        prop_assert!(
            here.starts_with('"') || here.starts_with(key),
            "{}:{} is not on `{}` or a quoted value but on {:?}: {}",
            e.line,
            e.col,
            key,
            here.chars().take(30).collect::<String>(),
            e
        );
    }
    prop_assert!(
        e.to_string()
            .starts_with(&format!("{}:{}:{}: ", e.file.display(), e.line, e.col)),
        "{e}"
    );
    Ok(())
}

proptest! {
    #![proptest_config(runner(1500))]

    #[test]
    fn every_error_points_into_the_file_at_what_it_is_about(
        edits in prop::collection::vec(edit(), 1..4),
    ) {
        let mut text = BASE.to_string();
        for e in &edits {
            apply(&mut text, e);
        }
        if let Err(errors) = Config::parse(config_file(), &text) {
            prop_assert!(!errors.0.is_empty());
            for e in &errors.0 {
                check_error(&text, e).map_err(|f| {
                    TestCaseError::fail(format!("{f}\n--- text ---\n{text}"))
                })?;
            }
        }
    }
}

#[test]
fn the_shipped_config_is_valid() {
    // Every mutation above starts from it: if it did not load, the property would be
    // tested only on errors it did not ask for.
    if let Err(e) = Config::parse(config_file(), BASE) {
        panic!("conf/forkd.ron: {e}");
    }
}

/// The errors of `text`, as `LINE:COL field`.
fn located(text: &str) -> Vec<String> {
    match Config::parse(config_file(), text) {
        Ok(_) => vec![],
        Err(errors) => errors
            .0
            .iter()
            .map(|e| match &e.kind {
                ConfigErrorKind::Invalid { field, .. } => format!("{}:{} {field}", e.line, e.col),
                _ => format!("{}:{} syntax", e.line, e.col),
            })
            .collect(),
    }
}

#[test]
fn an_error_is_not_located_in_a_comment_that_mentions_its_value() {
    // Found by this fuzzer: conf/forkd.ron's header comment lists "15s", and
    // `root: "15s"` was reported on that comment (5:14) instead of on the root.
    let text = "// Durations: \"15s\", workers\n(\n    workers: Count(100000),\n    servers: [(\n        listen: [\"127.0.0.1:8080\"],\n        routes: [(prefix: \"/\", handler: Static(root: \"15s\"))],\n    )],\n)\n";
    assert_eq!(
        located(text),
        ["3:5 workers", "6:54 servers[0].routes[0].handler.root"]
    );
}

#[test]
fn a_value_written_with_escapes_is_located_at_its_key() {
    // `"a\u{2f}b"` is the name `a/b`, which the text does not spell out: the error
    // used to fall back to 1:1.
    let text = "(\n    servers: [(\n        listen: [\"127.0.0.1:8080\"],\n        names: [\"a\\u{2f}b\"],\n        routes: [(prefix: \"/\", handler: Static(root: \"www\"))],\n    )],\n)\n";
    assert_eq!(located(text), ["4:9 servers[0].names"]);
}

//! The config loader: every error has a location inside the file (the line exists,
//! the column, in characters, is on it or just after its end).
#![no_main]

use forkd_shared::config::Config;
use libfuzzer_sys::fuzz_target;
use std::path::PathBuf;
use std::sync::OnceLock;

fn file() -> &'static PathBuf {
    static FILE: OnceLock<PathBuf> = OnceLock::new();
    FILE.get_or_init(|| {
        let dir = std::env::temp_dir().join("forkd-fuzz-config");
        std::fs::create_dir_all(dir.join("www")).unwrap();
        dir.join("forkd.ron")
    })
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let Err(errors) = Config::parse(file(), &text) else {
        return;
    };
    assert!(!errors.0.is_empty());
    for e in &errors.0 {
        let line = text.split('\n').nth(e.line.wrapping_sub(1));
        let Some(line) = line else {
            panic!("line {} is not in the file: {e}", e.line);
        };
        assert!(
            e.col >= 1 && e.col <= line.chars().count() + 1,
            "column {} is not on line {}: {e}",
            e.col,
            e.line
        );
    }
});

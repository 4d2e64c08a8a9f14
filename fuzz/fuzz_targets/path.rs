//! The path normaliser: a normalised path never climbs above the root (no `.`, `..`
//! or empty segment is left), holds no NUL, and is a fixed point of normalisation.
#![no_main]

use forkd_worker::http::path;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|raw: &[u8]| {
    let Ok(p) = path::normalize(raw) else {
        return;
    };
    assert!(p.starts_with(b"/"));
    assert!(!p.contains(&0));
    let segments: Vec<&[u8]> = p[1..].split(|&b| b == b'/').collect();
    for (i, s) in segments.iter().enumerate() {
        assert!(
            *s != b"." && *s != b"..",
            "{:?}",
            p.escape_ascii().to_string()
        );
        assert!(!s.is_empty() || i == segments.len() - 1);
    }
    let mut encoded = Vec::new();
    path::encode(&p, &mut encoded);
    assert_eq!(path::normalize(&encoded), Ok(p));
});

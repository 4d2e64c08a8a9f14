//! The request head parser: the verdict does not depend on where reads end, and an
//! accepted head obeys the framing rules.
//! Input: 2 bytes of `max_header_bytes`, 1 byte of read size, then the request.
#![no_main]

use forkd_worker::http::request::{self, BodyKind, Version};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [m0, m1, step, ref input @ ..] = *data else {
        return;
    };
    let max = 8 + usize::from(u16::from_le_bytes([m0, m1]) % 4096);
    let step = usize::from(step) + 1;
    let whole = request::parse(input, max);
    let mut in_reads = "Ok(None)".to_string();
    let mut len = 0;
    while len < input.len() {
        len = (len + step).min(input.len());
        match request::parse(&input[..len], max) {
            Ok(None) => {}
            other => {
                in_reads = format!("{other:?}");
                break;
            }
        }
    }
    assert_eq!(in_reads, format!("{whole:?}"), "reads of {step}");
    if let Ok(Some(req)) = whole {
        assert!(req.head_len <= max && req.head_len <= input.len());
        assert!(req.path.starts_with(b"/"));
        if req.body == BodyKind::Chunked {
            assert_eq!(
                req.version,
                Version::Http11,
                "Transfer-Encoding in HTTP/1.0"
            );
        }
        if req.version == Version::Http10 {
            assert!(!req.expect_continue);
        }
    }
});

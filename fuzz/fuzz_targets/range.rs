//! The `Range` parser: a partial answer is always inside the representation.
//! Input: 8 bytes of representation size, then the header value.
#![no_main]

use forkd_worker::http::range::{self, RangeSpec};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((size, value)) = data.split_first_chunk::<8>() else {
        return;
    };
    let size = u64::from_le_bytes(*size) % (1 << 40);
    if let RangeSpec::Partial { start, end } = range::parse(value, size) {
        assert!(start <= end && end < size, "{start}..={end} of {size}");
    }
});

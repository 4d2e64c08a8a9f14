//! The chunked decoder: the same bytes in any split decode alike, and never to more
//! body than the limit.
//! Input: 1 byte of body limit, 1 of trailer limit, 1 of piece size, then the body.
#![no_main]

use forkd_worker::http::chunked::ChunkedDecoder;
use libfuzzer_sys::fuzz_target;

fn feed(input: &[u8], step: usize, limit: u64, trailers: usize) -> (Vec<u8>, String) {
    let mut d = ChunkedDecoder::new(limit, trailers);
    let mut data = Vec::new();
    let mut consumed = 0;
    for piece in input.chunks(step) {
        match d.decode_into(piece, |b| data.extend_from_slice(b)) {
            Ok(n) => {
                consumed += n;
                if d.is_done() {
                    return (data, format!("done at {consumed}"));
                }
                assert_eq!(n, piece.len());
            }
            Err(e) => return (data, format!("{e:?}")),
        }
    }
    (data, format!("open after {consumed}"))
}

fuzz_target!(|data: &[u8]| {
    let [limit, trailers, step, ref input @ ..] = *data else {
        return;
    };
    let limit = if limit == 255 {
        u64::MAX
    } else {
        u64::from(limit) * 4
    };
    let trailers = usize::from(trailers) * 8;
    let whole = feed(input, input.len().max(1), limit, trailers);
    assert!(whole.0.len() as u64 <= limit);
    assert_eq!(feed(input, usize::from(step) + 1, limit, trailers), whole);
});

//! The chunked decoder: a model of a body is encoded, perhaps mutated, and fed in
//! pieces.

use super::mutate;
use forkd_worker::http::chunked::{
    ChunkedDecoder, ChunkedError, MAX_EXTENSIONS_TOTAL, MAX_EXTENSION_BYTES,
};
use forkd_worker::http::request::MAX_HEADERS;
use proptest::prelude::*;

/// A chunked body as a client would send it.
#[derive(Debug, Clone)]
struct Body {
    /// Each chunk: its data (never empty), how its size is spelled, its extension.
    chunks: Vec<(Vec<u8>, Spelling, Vec<u8>)>,
    last_extension: Vec<u8>,
    trailers: Vec<Vec<u8>>,
    /// Bytes after the body: the next request.
    after: Vec<u8>,
}

#[derive(Debug, Clone, Copy)]
enum Spelling {
    Lower,
    Upper,
    /// With this many leading zeros (the size stays within 16 digits).
    Zeros(usize),
}

fn extension() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => Just(Vec::new()),
        3 => prop::sample::select(vec![
            &b";a"[..],
            b";name=value",
            b"; x = \"quoted;\\\" value\"",
            b" ;bws",
            b"\t;tab",
        ])
        .prop_map(<[u8]>::to_vec),
        // Around the per-line limit.
        1 => (MAX_EXTENSION_BYTES - 2..=MAX_EXTENSION_BYTES + 2).prop_map(|n| {
            let mut e = b";".to_vec();
            e.resize(n, b'e');
            e
        }),
    ]
}

fn trailer() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::sample::select(vec![&b"X-Sum: 1"[..], b"Expires: never", b"a:"])
            .prop_map(<[u8]>::to_vec),
        (1..300usize).prop_map(|n| {
            let mut t = b"X-Pad: ".to_vec();
            t.resize(7 + n, b'p');
            t
        }),
    ]
}

fn body() -> impl Strategy<Value = Body> {
    let spelling = prop_oneof![
        Just(Spelling::Lower),
        Just(Spelling::Upper),
        (1..4usize).prop_map(Spelling::Zeros),
    ];
    let chunk = (
        prop::collection::vec(any::<u8>(), 1..40),
        spelling,
        extension(),
    );
    (
        prop::collection::vec(chunk, 0..6),
        extension(),
        prop_oneof![
            3 => prop::collection::vec(trailer(), 0..4),
            // Around the field limit.
            1 => (MAX_HEADERS - 1..=MAX_HEADERS + 1).prop_map(|n| vec![b"T: 1".to_vec(); n]),
        ],
        prop::sample::select(vec![&b""[..], b"GET / HTTP/1.1\r\n\r\n", b"0\r\n\r\n"])
            .prop_map(<[u8]>::to_vec),
    )
        .prop_map(|(chunks, last_extension, trailers, after)| Body {
            chunks,
            last_extension,
            trailers,
            after,
        })
}

impl Body {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for (data, spelling, ext) in &self.chunks {
            let size = match spelling {
                Spelling::Lower => format!("{:x}", data.len()),
                Spelling::Upper => format!("{:X}", data.len()),
                Spelling::Zeros(n) => format!("{}{:x}", "0".repeat(*n), data.len()),
            };
            out.extend_from_slice(size.as_bytes());
            out.extend_from_slice(ext);
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(data);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"0");
        out.extend_from_slice(&self.last_extension);
        out.extend_from_slice(b"\r\n");
        for t in &self.trailers {
            out.extend_from_slice(t);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"\r\n");
        out
    }

    /// What decoding must give, worked out from the model in the order a reader meets
    /// it: the data, or the first limit crossed.
    fn expected(&self, limit: u64, max_trailer: usize) -> Result<Vec<u8>, ChunkedError> {
        let mut data = Vec::new();
        let mut extensions = 0;
        let mut check_extension = |ext: &[u8]| {
            extensions += ext.len();
            if ext.len() > MAX_EXTENSION_BYTES || extensions > MAX_EXTENSIONS_TOTAL {
                Err(ChunkedError::ExtensionTooLong)
            } else {
                Ok(())
            }
        };
        for (chunk, _, ext) in &self.chunks {
            check_extension(ext)?;
            if (data.len() + chunk.len()) as u64 > limit {
                return Err(ChunkedError::TooLarge);
            }
            data.extend_from_slice(chunk);
        }
        check_extension(&self.last_extension)?;
        let section: usize = self.trailers.iter().map(|t| t.len() + 2).sum::<usize>() + 2;
        if section > max_trailer || self.trailers.len() > MAX_HEADERS {
            return Err(ChunkedError::TrailersTooLarge);
        }
        Ok(data)
    }
}

/// Everything decoding gave, fed piece by piece as a connection would: stop at an
/// error or at the end of the body. After an error only the data handed over so far
/// and the error count.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    data: Vec<u8>,
    consumed: usize,
    done: bool,
    error: Option<ChunkedError>,
}

fn feed(input: &[u8], cuts: &[u16], limit: u64, max_trailer: usize) -> Outcome {
    let mut d = ChunkedDecoder::new(limit, max_trailer);
    let mut out = Outcome {
        data: Vec::new(),
        consumed: 0,
        done: false,
        error: None,
    };
    for piece in mutate::pieces(input, cuts) {
        match d.decode_into(piece, |data| out.data.extend_from_slice(data)) {
            Ok(n) => {
                assert!(n <= piece.len());
                out.consumed += n;
                if d.is_done() {
                    out.done = true;
                    break;
                }
                assert_eq!(n, piece.len(), "stopped early without being done");
            }
            Err(e) => {
                out.error = Some(e);
                out.consumed = 0; // nothing after an error is used
                break;
            }
        }
    }
    out
}

fn limits() -> impl Strategy<Value = (u64, usize)> {
    (
        prop_oneof![1 => Just(u64::MAX), 2 => 0..250u64],
        prop_oneof![1 => Just(16384usize), 2 => 2..600usize],
    )
}

proptest! {
    #![proptest_config(crate::config(2000))]

    #[test]
    fn a_body_decodes_to_its_model(
        body in body(),
        cuts in mutate::cuts(),
        (limit, max_trailer) in limits(),
    ) {
        let encoded = body.encode();
        let mut input = encoded.clone();
        input.extend_from_slice(&body.after);
        let got = feed(&input, &cuts, limit, max_trailer);
        match body.expected(limit, max_trailer) {
            Ok(data) => {
                prop_assert_eq!(got.error, None);
                prop_assert!(got.done);
                prop_assert_eq!(got.consumed, encoded.len(), "must stop at the body's end");
                prop_assert_eq!(got.data, data);
            }
            Err(e) => {
                prop_assert_eq!(got.error, Some(e));
                prop_assert!(got.data.len() as u64 <= limit);
            }
        }
    }

    #[test]
    fn mutated_bodies_decode_alike_in_any_split_and_within_the_limit(
        body in body(),
        edits in mutate::edits(4),
        cuts in mutate::cuts(),
        (limit, max_trailer) in limits(),
    ) {
        let mut input = body.encode();
        input.extend_from_slice(&body.after);
        mutate::apply(&mut input, &edits);
        let whole = feed(&input, &[], limit, max_trailer);
        let split = feed(&input, &cuts, limit, max_trailer);
        prop_assert_eq!(&split, &whole, "input {:?}", input.escape_ascii().to_string());
        // Never more body than the limit, and never more than the sizes declared:
        // the data and the framing around it come from the input.
        prop_assert!(whole.data.len() as u64 <= limit);
        prop_assert!(whole.error.is_some() || whole.data.len() <= whole.consumed);
        if whole.done {
            prop_assert!(input[..whole.consumed].ends_with(b"\n"));
        }
    }

    #[test]
    fn arbitrary_bytes_decode_alike_in_any_split(
        input in prop::collection::vec(prop_oneof![
            3 => prop::sample::select(b"0123456789abcdefABCDEF;= \t\r\n".to_vec()),
            1 => any::<u8>(),
        ], 0..200),
        cuts in mutate::cuts(),
        (limit, max_trailer) in limits(),
    ) {
        let whole = feed(&input, &[], limit, max_trailer);
        prop_assert_eq!(feed(&input, &cuts, limit, max_trailer), whole);
    }
}

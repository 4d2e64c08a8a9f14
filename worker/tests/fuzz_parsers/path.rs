//! The path normaliser against a model that resolves segments on a stack.

use forkd_worker::http::path::{self, PathError};
use proptest::prelude::*;

/// A model decoder: `%XX` to a byte, in order, refusing what `normalize` documents.
fn decode(raw: &[u8]) -> Result<Vec<u8>, PathError> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < raw.len() {
        if raw[i] != b'%' {
            if raw[i] == 0 {
                return Err(PathError::Nul);
            }
            out.push(raw[i]);
            i += 1;
            continue;
        }
        let hex = raw
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        let byte = hex
            .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
            .and_then(|h| u8::from_str_radix(h, 16).ok())
            .ok_or(PathError::Malformed)?;
        match byte {
            0 => return Err(PathError::Nul),
            b'/' => return Err(PathError::EncodedSlash),
            b => out.push(b),
        }
        i += 3;
    }
    Ok(out)
}

/// The segments a path resolves to, and whether it names a directory (trailing `/`).
fn resolve(raw: &[u8]) -> Result<(Vec<Vec<u8>>, bool), PathError> {
    if raw.first() != Some(&b'/') {
        return Err(PathError::Malformed);
    }
    let decoded = decode(raw)?;
    let mut stack: Vec<Vec<u8>> = Vec::new();
    let mut dir = true;
    for segment in decoded.split(|&b| b == b'/').skip(1) {
        dir = true;
        match segment {
            b"" | b"." => {}
            b".." => {
                // Above the root: refused, never clamped.
                stack.pop().ok_or(PathError::Escapes)?;
            }
            s => {
                stack.push(s.to_vec());
                dir = false;
            }
        }
    }
    Ok((stack, dir))
}

fn raw_path() -> impl Strategy<Value = Vec<u8>> {
    let segment = prop_oneof![
        3 => prop::sample::select(vec![
            &b"a"[..], b"b", b"index.html", b"..", b".", b"", b"%2e%2e", b"%2E.", b".%2e",
            b"%2e", b"...", b"..a", b"%41", b"%25", b"%2f", b"%2F", b"%00", b"%", b"%4",
            b"%zz", b"a%20b", b"\xc3\xa9", b"%c3%a9", b"?", b"#", b";", b"\\", b"..\\",
        ])
        .prop_map(<[u8]>::to_vec),
        1 => prop::collection::vec(any::<u8>(), 0..4),
    ];
    (
        prop_oneof![6 => Just(b"/".to_vec()), 1 => Just(Vec::new()), 1 => Just(b"a/".to_vec())],
        prop::collection::vec(segment, 0..8),
        prop::bool::ANY,
    )
        .prop_map(|(start, segments, trailing)| {
            let mut out = start;
            out.extend_from_slice(&segments.join(&b'/'));
            if trailing {
                out.push(b'/');
            }
            out
        })
}

proptest! {
    #![proptest_config(crate::config(3000))]

    #[test]
    fn normalised_paths_stay_under_the_root_and_are_a_fixed_point(raw in raw_path()) {
        let got = path::normalize(&raw);
        let model = resolve(&raw);
        let shown = raw.escape_ascii().to_string();
        match (&got, &model) {
            (Ok(p), Ok((segments, dir))) => {
                let mut want = Vec::new();
                for s in segments {
                    want.push(b'/');
                    want.extend_from_slice(s);
                }
                if want.is_empty() || *dir {
                    want.push(b'/');
                }
                prop_assert_eq!(p, &want, "{}", shown);
                prop_assert!(!p.contains(&0));
                // Normalising again (after encoding, as a Location header carries it)
                // changes nothing.
                let mut encoded = Vec::new();
                path::encode(p, &mut encoded);
                prop_assert_eq!(&path::normalize(&encoded), &Ok(p.clone()), "{}", shown);
            }
            (Err(e), Err(m)) => prop_assert_eq!(e, m, "{}", shown),
            _ => prop_assert!(false, "{:?}: normalize {:?}, model {:?}", shown, got, model),
        }
    }
}

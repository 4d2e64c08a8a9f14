//! Where in the config text a value is: serde keeps no positions, so an error found
//! after parsing is located by searching the text for the key or literal it is about,
//! skipping what a reader would not point at (comments, and for a key, strings and
//! longer words that contain it).

/// 1-based line and column (in characters, as editors count) of the `nth` (0-based)
/// occurrence of `needle` in `text`, or of the last occurrence when there are fewer.
/// Only occurrences a reader of the file would point at count: outside comments, and a
/// key (a needle that is not a quoted literal) outside strings and as a whole word.
pub(super) fn locate(text: &str, needle: &str, nth: usize) -> Option<(usize, usize)> {
    let lexed = lex(text);
    let is_word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
    let literal = needle.starts_with('"');
    let mut found = None;
    let occurrences = text.match_indices(needle).map(|(i, _)| i).filter(|&i| {
        lexed[i] == Lexed::Code
            && (literal
                || (!is_word(text[..i].chars().next_back())
                    && !is_word(text[i + needle.len()..].chars().next())))
    });
    for (i, offset) in occurrences.enumerate() {
        found = Some(offset);
        if i == nth {
            break;
        }
    }
    let offset = found?;
    let line_start = text[..offset].rfind('\n').map_or(0, |nl| nl + 1);
    let line = text[..offset].matches('\n').count() + 1;
    let col = text[line_start..offset].chars().count() + 1;
    Some((line, col))
}

/// What each byte of a RON text is part of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lexed {
    /// Outside strings and comments (an opening quote is code).
    Code,
    /// Inside a string, its closing quote included.
    Str,
    /// `// ...` to the end of the line, or `/* ... */` (nested).
    Comment,
}

fn lex(text: &str) -> Vec<Lexed> {
    let b = text.as_bytes();
    let mut out = vec![Lexed::Code; b.len()];
    let mut i = 0;
    while i < b.len() {
        let end = match (b[i], b.get(i + 1)) {
            (b'"', _) => {
                let mut j = i + 1;
                while j < b.len() && b[j] != b'"' {
                    j += if b[j] == b'\\' { 2 } else { 1 };
                }
                let end = (j + 1).min(b.len());
                out[i + 1..end].fill(Lexed::Str);
                i = end;
                continue;
            }
            (b'r', Some(b'"' | b'#')) if i == 0 || !b[i - 1].is_ascii_alphanumeric() => {
                let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
                let open = i + 1 + hashes;
                if b.get(open) != Some(&b'"') {
                    i += 1;
                    continue;
                }
                let mut close = vec![b'"'];
                close.resize(1 + hashes, b'#');
                let end = b[open + 1..]
                    .windows(close.len())
                    .position(|w| w == close.as_slice())
                    .map_or(b.len(), |p| open + 1 + p + close.len());
                out[open + 1..end].fill(Lexed::Str);
                i = end;
                continue;
            }
            (b'/', Some(b'/')) => b[i..]
                .iter()
                .position(|&c| c == b'\n')
                .map_or(b.len(), |p| i + p),
            (b'/', Some(b'*')) => {
                let mut depth = 0usize;
                let mut j = i;
                while j < b.len() {
                    if b[j..].starts_with(b"/*") {
                        depth += 1;
                        j += 2;
                    } else if b[j..].starts_with(b"*/") {
                        depth -= 1;
                        j += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        j += 1;
                    }
                }
                j.min(b.len())
            }
            _ => {
                i += 1;
                continue;
            }
        };
        out[i..end].fill(Lexed::Comment);
        i = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::locate;

    #[test]
    fn comments_and_strings_are_skipped() {
        let text = "// workers: and \"www\" in a comment\n/* \"www\" /* nested */ workers */\n(workers: Count(1), root: \"www\", x: \"workers\")";
        assert_eq!(locate(text, "workers", 0), Some((3, 2)));
        assert_eq!(
            locate(text, "workers", 1),
            Some((3, 2)),
            "the string is not a key"
        );
        assert_eq!(locate(text, "\"www\"", 0), Some((3, 27)));
    }

    #[test]
    fn a_key_is_a_whole_word() {
        let text = "(worker_connections: 1, max_workers: 2, workers: 3)";
        assert_eq!(locate(text, "workers", 0), Some((1, 41)));
    }

    #[test]
    fn columns_count_characters() {
        let text = "(names: [\"caf\u{e9}\", \"b/c\"])";
        assert_eq!(
            locate(text, "\"b/c\"", 0),
            Some((1, 18)),
            "not 19: é is one character"
        );
    }

    #[test]
    fn raw_strings_are_strings() {
        let text = "(a: r#\"workers \"x\" \"#, workers: 1)";
        assert_eq!(locate(text, "workers", 0), Some((1, 24)));
    }

    #[test]
    fn what_is_not_there_is_none() {
        assert_eq!(locate("// \"www\"\n()", "\"www\"", 0), None);
    }
}

//! Where a head in pieces may end, so it is parsed when its end may have come and not
//! from byte 0 on every read (quadratic in `max_header_bytes` for a head sent a byte
//! at a time). Used for client request heads (`conn/io.rs`) and upstream response
//! heads (`proxy/stream.rs`).

/// Whether `buf` may hold the end of a head (an empty line: LF LF, or LF CR LF) in
/// what follows its first `scanned` bytes, which hold none. The end is at most 3
/// bytes long, so the scan starts 3 bytes before the new ones.
pub fn head_may_end(buf: &[u8], scanned: usize) -> bool {
    let from = scanned.saturating_sub(3);
    let tail = &buf[from.min(buf.len())..];
    tail.iter().enumerate().any(|(i, &b)| {
        b == b'\n'
            && match tail.get(i + 1) {
                Some(b'\n') => true,
                Some(b'\r') => tail.get(i + 2) == Some(&b'\n'),
                _ => false,
            }
    })
}

/// Whether the partial head `buf` is worth parsing now: its first bytes (garbage is
/// refused at once), once it may hold its end, or once it reached `max` (the parser
/// tells what is too large). `scanned`: how much of it was looked at before, 0 for a
/// new head; updated to all of it.
pub fn worth_parsing(buf: &[u8], scanned: &mut usize, max: usize) -> bool {
    let worth = *scanned == 0 || buf.len() >= max || head_may_end(buf, *scanned);
    *scanned = buf.len();
    worth
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_end_of_a_head_is_found_in_new_bytes_and_the_three_before_them() {
        let head = b"HTTP/1.1 200 OK\r\nA: b\r\n\r\n";
        assert!(head_may_end(head, 0));
        assert!(!head_may_end(&head[..head.len() - 1], 0));
        // The end straddles what was scanned and what is new, at every split.
        for scanned in 0..head.len() {
            assert!(head_may_end(head, scanned), "scanned {scanned}");
        }
        assert!(head_may_end(b"HTTP/1.1 200 OK\nA: b\n\n", 0), "bare LFs");
        assert!(!head_may_end(b"HTTP/1.1 200 OK\r\nA: b\r\n", 0));
        assert!(!head_may_end(b"\r\r\n", 0));
    }

    #[test]
    fn a_head_in_one_byte_pieces_is_worth_parsing_twice_not_once_a_byte() {
        let mut head = b"GET / HTTP/1.1\r\nHost: a\r\n".to_vec();
        for i in 0..90 {
            head.extend_from_slice(format!("X-Field-{i:03}: value\r\n").as_bytes());
        }
        head.extend_from_slice(b"\r\n");
        let mut scanned = 0;
        let worth: Vec<usize> = (1..=head.len())
            .filter(|&n| worth_parsing(&head[..n], &mut scanned, 64 * 1024))
            .collect();
        // The first byte (a bad request line is refused at once), then the last.
        assert_eq!(worth, [1, head.len()]);
        // A head that never ends is parsed once it reaches the limit.
        let mut scanned = 0;
        let endless = [b'a'; 100];
        let worth: Vec<usize> = (1..=endless.len())
            .filter(|&n| worth_parsing(&endless[..n], &mut scanned, 64))
            .collect();
        assert_eq!(worth[..2], [1, 64]);
    }
}

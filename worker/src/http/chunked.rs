//! The chunked transfer coding (RFC 9112 §7.1), decoded and discarded.
//!
//! Strict on framing, because a lenient decoder is how request smuggling starts: the
//! size must be hex (at most 16 digits), lines end in CRLF, data is followed by CRLF.
//! Chunk extensions and trailer fields are skipped.

/// Why a chunked body was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkedError {
    /// A chunk size that is not hex, too long, or a line not ended by CRLF.
    BadFraming,
    /// The body's decoded size went over the limit.
    TooLarge,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading hex digits of a chunk size; `digits` read so far.
    Size {
        digits: u8,
    },
    /// After the size: skipping a chunk extension up to CR.
    Extension,
    /// Expecting the LF of the size line.
    SizeLf,
    /// Skipping `remaining` bytes of chunk data.
    Data,
    /// Expecting CR after chunk data.
    DataCr,
    /// Expecting LF after chunk data.
    DataLf,
    /// At the start of a trailer line (or the final empty line).
    TrailerStart,
    /// Inside a trailer field line, skipping to CR.
    TrailerLine,
    /// Expecting LF of a trailer field line.
    TrailerLf,
    /// Expecting LF of the final empty line.
    EndLf,
    Done,
}

/// Decodes a chunked body incrementally, discarding the data.
#[derive(Debug, Clone)]
pub struct ChunkedDecoder {
    state: State,
    size: u64,
    remaining: u64,
    total: u64,
    limit: u64,
}

impl ChunkedDecoder {
    /// A decoder that rejects bodies larger than `limit` decoded bytes.
    pub fn new(limit: u64) -> Self {
        ChunkedDecoder {
            state: State::Size { digits: 0 },
            size: 0,
            remaining: 0,
            total: 0,
            limit,
        }
    }

    /// Whether the whole body, trailers included, has been read.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Consumes bytes of `input`; returns how many belong to the body. Stops at the end
    /// of the body, so any bytes after that are the next request.
    pub fn decode(&mut self, input: &[u8]) -> Result<usize, ChunkedError> {
        let mut i = 0;
        while i < input.len() {
            if self.state == State::Data {
                let take = self.remaining.min((input.len() - i) as u64) as usize;
                i += take;
                self.remaining -= take as u64;
                if self.remaining == 0 {
                    self.state = State::DataCr;
                }
                continue;
            }
            let b = input[i];
            i += 1;
            self.state = match self.state {
                State::Size { digits } => match hex_value(b) {
                    Some(v) => {
                        if digits >= 16 {
                            return Err(ChunkedError::BadFraming);
                        }
                        self.size = (self.size << 4) | u64::from(v);
                        State::Size { digits: digits + 1 }
                    }
                    None if digits == 0 => return Err(ChunkedError::BadFraming),
                    None => match b {
                        b'\r' => State::SizeLf,
                        b';' | b' ' | b'\t' => State::Extension,
                        _ => return Err(ChunkedError::BadFraming),
                    },
                },
                State::Extension => match b {
                    b'\r' => State::SizeLf,
                    b'\n' => return Err(ChunkedError::BadFraming),
                    _ => State::Extension,
                },
                State::SizeLf => {
                    if b != b'\n' {
                        return Err(ChunkedError::BadFraming);
                    }
                    self.total = self
                        .total
                        .checked_add(self.size)
                        .ok_or(ChunkedError::TooLarge)?;
                    if self.total > self.limit {
                        return Err(ChunkedError::TooLarge);
                    }
                    if self.size == 0 {
                        State::TrailerStart
                    } else {
                        self.remaining = self.size;
                        self.size = 0;
                        State::Data
                    }
                }
                State::DataCr if b == b'\r' => State::DataLf,
                State::DataLf if b == b'\n' => State::Size { digits: 0 },
                State::DataCr | State::DataLf => return Err(ChunkedError::BadFraming),
                State::TrailerStart => match b {
                    b'\r' => State::EndLf,
                    b'\n' => return Err(ChunkedError::BadFraming),
                    _ => State::TrailerLine,
                },
                State::TrailerLine => match b {
                    b'\r' => State::TrailerLf,
                    b'\n' => return Err(ChunkedError::BadFraming),
                    _ => State::TrailerLine,
                },
                State::TrailerLf if b == b'\n' => State::TrailerStart,
                State::EndLf if b == b'\n' => {
                    self.state = State::Done;
                    return Ok(i);
                }
                State::TrailerLf | State::EndLf => return Err(ChunkedError::BadFraming),
                State::Data | State::Done => unreachable!("handled above / loop ends at Done"),
            };
        }
        Ok(i)
    }
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(input: &[u8], limit: u64) -> Result<(usize, bool), ChunkedError> {
        let mut d = ChunkedDecoder::new(limit);
        let n = d.decode(input)?;
        Ok((n, d.is_done()))
    }

    #[test]
    fn simple_body_stops_at_its_end() {
        let body = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\nGET / HTTP/1.1\r\n";
        let end = body.len() - b"GET / HTTP/1.1\r\n".len();
        assert_eq!(decode_all(body, 100), Ok((end, true)));
    }

    #[test]
    fn trailers_are_skipped() {
        let body = b"3\r\nabc\r\n0\r\nX-Sum: 1\r\nY: 2\r\n\r\n";
        assert_eq!(decode_all(body, 100), Ok((body.len(), true)));
    }

    #[test]
    fn byte_at_a_time_gives_same_result() {
        let body = b"A\r\n0123456789\r\n0\r\n\r\n";
        let mut d = ChunkedDecoder::new(100);
        for (i, b) in body.iter().enumerate() {
            assert!(!d.is_done(), "done early at {i}");
            assert_eq!(d.decode(std::slice::from_ref(b)), Ok(1));
        }
        assert!(d.is_done());
    }

    #[test]
    fn bad_framing_is_rejected() {
        for bad in [
            &b"zz\r\n"[..],
            b"\r\n",
            b"5\nhello\r\n",
            b"5\r\nhelloX\r\n",
            b"11111111111111111\r\n",
            b"0\r\n\n",
            b"-5\r\n",
        ] {
            assert_eq!(
                decode_all(bad, u64::MAX),
                Err(ChunkedError::BadFraming),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn limit_is_enforced_on_declared_sizes() {
        assert_eq!(decode_all(b"10\r\n", 15), Err(ChunkedError::TooLarge));
        assert_eq!(
            decode_all(b"8\r\n12345678\r\n8\r\n", 15),
            Err(ChunkedError::TooLarge)
        );
        assert_eq!(
            decode_all(b"8\r\n12345678\r\n7\r\n1234567\r\n0\r\n\r\n", 15),
            Ok((30, true))
        );
        assert_eq!(
            decode_all(b"ffffffffffffffff\r\n", u64::MAX),
            Ok((18, false))
        );
    }
}

//! Bodies in transit, in both directions: a [`Decoder`] that yields the data of a
//! `Content-Length`, chunked or close-delimited body, an [`Encoder`] that frames data
//! for the other side, and a [`Relay`] that joins the two over a bounded buffer.
//!
//! A chunked body is decoded by `http::chunked`'s decoder, the worker's only one (the
//! same strict rules and bounds for a body forkd discards and one it relays): its
//! steps say where the data is, and it keeps the trailer fields (within
//! [`MAX_TRAILERS`]) so the body is re-encoded with them. Chunk extensions are
//! dropped: the body is re-chunked, never forwarded raw.
//!
//! Backpressure is the relay's whole point: [`Relay::feed`] takes only as many bytes
//! as fit in its buffer, so a slow reader on one side stops reads on the other, and an
//! exchange's memory stays at `capacity` (plus a chunk-size line) whatever the body.

use super::push_hex;
pub use crate::http::chunked::Step;
use crate::http::chunked::{ChunkedDecoder, ChunkedError};

/// The trailer section of a relayed chunked body (field lines and the final empty
/// line) may be at most this long; more is a framing error.
pub const MAX_TRAILERS: usize = 8 * 1024;

/// Why a body could not be relayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyError {
    /// Bad chunk framing (size, line ends, extensions or trailers too large, a
    /// trailer line that is not a field).
    BadChunk,
    /// The sender closed before the end of a `Content-Length` or chunked body.
    Truncated,
    /// A chunked body's data passed the decoder's limit (a client body over the
    /// server's `max_body_bytes`).
    TooLarge,
}

impl From<ChunkedError> for BodyError {
    fn from(e: ChunkedError) -> BodyError {
        match e {
            ChunkedError::TooLarge => BodyError::TooLarge,
            ChunkedError::BadFraming
            | ChunkedError::ExtensionTooLong
            | ChunkedError::TrailersTooLarge
            | ChunkedError::BadTrailer => BodyError::BadChunk,
        }
    }
}

#[derive(Debug, Clone)]
enum Decoding {
    /// `Content-Length`: this many bytes left.
    Length(u64),
    /// Boxed: the chunked state is large and most bodies have a length.
    Chunked(Box<ChunkedDecoder>),
    UntilClose,
    Done,
}

/// Reads a body's framing and yields its data.
#[derive(Debug, Clone)]
pub struct Decoder {
    state: Decoding,
}

impl Decoder {
    pub fn length(n: u64) -> Decoder {
        let state = if n == 0 {
            Decoding::Done
        } else {
            Decoding::Length(n)
        };
        Decoder { state }
    }

    pub fn chunked() -> Decoder {
        Decoder::chunked_within(u64::MAX)
    }

    /// A chunked body whose data may not pass `limit` bytes: refused on the size
    /// line that would cross it, before any of that chunk is relayed.
    pub fn chunked_within(limit: u64) -> Decoder {
        let chunked = ChunkedDecoder::new(limit, MAX_TRAILERS).keeping_trailers();
        Decoder {
            state: Decoding::Chunked(Box::new(chunked)),
        }
    }

    pub fn until_close() -> Decoder {
        Decoder {
            state: Decoding::UntilClose,
        }
    }

    /// The whole body has been read; bytes after it belong to the next message.
    pub fn is_done(&self) -> bool {
        match &self.state {
            Decoding::Done => true,
            Decoding::Chunked(c) => c.is_done(),
            _ => false,
        }
    }

    /// Trailer field lines of a chunked body, each ending in CRLF (once done).
    pub fn trailers(&self) -> &[u8] {
        match &self.state {
            Decoding::Chunked(c) => c.trailers(),
            _ => &[],
        }
    }

    /// The sender closed its side. Ends a close-delimited body; any other unfinished
    /// body was truncated.
    pub fn eof(&mut self) -> Result<(), BodyError> {
        match self.state {
            _ if self.is_done() => Ok(()),
            Decoding::UntilClose => {
                self.state = Decoding::Done;
                Ok(())
            }
            _ => Err(BodyError::Truncated),
        }
    }

    /// Decodes from the start of `input` up to and including the next run of data (or
    /// to the end of `input`, or of the body). Call again with the rest.
    pub fn decode(&mut self, input: &[u8]) -> Result<Step, BodyError> {
        match &mut self.state {
            Decoding::Done => Ok(Step {
                consumed: 0,
                data: 0..0,
            }),
            Decoding::UntilClose => Ok(Step {
                consumed: input.len(),
                data: 0..input.len(),
            }),
            Decoding::Length(remaining) => {
                let take = (*remaining).min(input.len() as u64) as usize;
                *remaining -= take as u64;
                if *remaining == 0 {
                    self.state = Decoding::Done;
                }
                Ok(Step {
                    consumed: take,
                    data: 0..take,
                })
            }
            Decoding::Chunked(c) if c.is_done() => Ok(Step {
                consumed: 0,
                data: 0..0,
            }),
            Decoding::Chunked(c) => Ok(c.step(input)?),
        }
    }
}

/// Frames data for the receiving side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoder {
    /// As is: a `Content-Length` body (its length was sent in the head) or a
    /// close-delimited one.
    Identity,
    Chunked,
}

impl Encoder {
    /// Appends `data`, framed.
    pub fn data(self, data: &[u8], out: &mut Vec<u8>) {
        if data.is_empty() {
            return;
        }
        if self == Encoder::Chunked {
            push_hex(out, data.len() as u64);
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(data);
            out.extend_from_slice(b"\r\n");
        } else {
            out.extend_from_slice(data);
        }
    }

    /// Appends the end of the body: the last chunk and `trailers` (field lines, each
    /// ending in CRLF) for chunked, nothing otherwise.
    pub fn finish(self, trailers: &[u8], out: &mut Vec<u8>) {
        if self == Encoder::Chunked {
            out.extend_from_slice(b"0\r\n");
            out.extend_from_slice(trailers);
            out.extend_from_slice(b"\r\n");
        }
    }
}

/// A body on its way from one socket to another, through a bounded buffer.
#[derive(Debug)]
pub struct Relay {
    decoder: Decoder,
    encoder: Encoder,
    /// `out[sent..end]` waits for the receiver. Past `end` is room a direct read
    /// ([`Relay::direct_room`]) made once and reuses without zeroing it again.
    out: Vec<u8>,
    end: usize,
    /// Bytes of `out` already written to the receiver.
    sent: usize,
    capacity: usize,
    finished: bool,
    /// Body bytes relayed so far (for the access log).
    pub data_bytes: u64,
    /// The response is also stored in the cache: every data byte goes here too.
    pub tee: Option<Box<crate::cache::fill::Fill>>,
    /// The body is read to its end but not relayed (the cache answers instead).
    pub discard: bool,
}

impl Relay {
    pub fn new(decoder: Decoder, encoder: Encoder, capacity: usize) -> Relay {
        let mut relay = Relay {
            decoder,
            encoder,
            out: Vec::new(),
            end: 0,
            sent: 0,
            capacity,
            finished: false,
            data_bytes: 0,
            tee: None,
            discard: false,
        };
        relay.finish_if_done();
        relay
    }

    /// Takes bytes from the sender; returns how many were taken. Takes none when the
    /// buffer is full or the body is complete (what is left belongs to the next message).
    pub fn feed(&mut self, input: &[u8]) -> Result<usize, BodyError> {
        let mut taken = 0;
        while taken < input.len() && !self.decoder.is_done() {
            let room = self.capacity.saturating_sub(self.pending().len());
            if room == 0 {
                break;
            }
            let end = input.len().min(taken + room);
            let step = self.decoder.decode(&input[taken..end])?;
            let data = &input[taken + step.data.start..taken + step.data.end];
            self.data_bytes += data.len() as u64;
            if let Some(tee) = self.tee.as_mut() {
                tee.data(data);
            }
            if !self.discard {
                self.out.truncate(self.end);
                self.encoder.data(data, &mut self.out);
                self.end = self.out.len();
            }
            taken += step.consumed;
            if step.consumed == 0 {
                break;
            }
        }
        self.finish_if_done();
        Ok(taken)
    }

    /// The sender closed its side.
    pub fn eof(&mut self) -> Result<(), BodyError> {
        self.decoder.eof()?;
        self.finish_if_done();
        Ok(())
    }

    /// Whether the sender should be read: the body is not complete and there is room.
    pub fn wants_input(&self) -> bool {
        !self.decoder.is_done() && self.pending().len() < self.capacity
    }

    /// Framed bytes waiting to be written to the receiver.
    pub fn pending(&self) -> &[u8] {
        &self.out[self.sent..self.end]
    }

    /// Where the sender's next bytes can be read straight into, sparing a copy: a
    /// body relayed as is (`Content-Length` or close-delimited, identity encoding) has
    /// framed bytes equal to its data. At most the room left and, for a length, the
    /// bytes left of the body, so nothing past the body lands here. None when the
    /// body is re-framed or there is no room. Then [`Relay::commit_direct`].
    pub fn direct_room(&mut self) -> Option<&mut [u8]> {
        if self.encoder != Encoder::Identity {
            return None;
        }
        let left = match self.decoder.state {
            Decoding::Length(n) => usize::try_from(n).unwrap_or(usize::MAX),
            Decoding::UntilClose => usize::MAX,
            Decoding::Chunked(_) | Decoding::Done => return None,
        };
        let want = self.capacity.saturating_sub(self.end - self.sent).min(left);
        if want == 0 {
            return None;
        }
        if self.out.len() < self.end + want {
            self.out.resize(self.end + want, 0);
        }
        Some(&mut self.out[self.end..self.end + want])
    }

    /// `n` bytes were read into [`Relay::direct_room`].
    pub fn commit_direct(&mut self, n: usize) -> Result<(), BodyError> {
        let end = (self.end + n).min(self.out.len());
        let step = self.decoder.decode(&self.out[self.end..end])?;
        debug_assert_eq!(
            step.consumed,
            end - self.end,
            "direct room is within the body"
        );
        self.data_bytes += step.consumed as u64;
        if let Some(tee) = self.tee.as_mut() {
            tee.data(&self.out[self.end..self.end + step.consumed]);
        }
        if !self.discard {
            self.end += step.consumed;
        }
        self.finish_if_done();
        Ok(())
    }

    /// How many bytes of the body may be spliced past this relay (upstream socket →
    /// pipe → client, never through memory): a body relayed as is, neither stored nor
    /// discarded, with nothing pending here (spliced bytes follow those already
    /// written). At most the body's rest for a length (so nothing past the body is
    /// ever taken from the socket), unbounded for a close-delimited body. None: copy.
    /// Then [`Relay::commit_spliced`].
    pub fn splice_room(&self) -> Option<usize> {
        if self.encoder != Encoder::Identity || self.tee.is_some() || self.discard {
            return None;
        }
        if !self.pending().is_empty() {
            return None;
        }
        match self.decoder.state {
            Decoding::Length(n) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
            Decoding::UntilClose => Some(usize::MAX),
            Decoding::Chunked(_) | Decoding::Done => None,
        }
    }

    /// `n` body bytes were spliced past the relay (at most [`Relay::splice_room`]):
    /// counted as relayed, the body's rest shortened by them.
    pub fn commit_spliced(&mut self, n: usize) {
        if let Decoding::Length(left) = &mut self.decoder.state {
            debug_assert!(n as u64 <= *left, "spliced within the body");
            *left -= (n as u64).min(*left);
            if *left == 0 {
                self.decoder.state = Decoding::Done;
            }
        }
        self.data_bytes += n as u64;
        self.finish_if_done();
    }

    /// `n` bytes of [`Relay::pending`] were written.
    pub fn advance(&mut self, n: usize) {
        self.sent += n;
        debug_assert!(self.sent <= self.end);
        if self.sent == self.end {
            self.end = 0;
            self.sent = 0;
        } else if self.sent >= self.capacity / 2 {
            self.out.copy_within(self.sent..self.end, 0);
            self.end -= self.sent;
            self.sent = 0;
        }
    }

    /// The whole body was read from the sender (some may still be pending).
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// The whole body was read and written.
    pub fn is_complete(&self) -> bool {
        self.finished && self.pending().is_empty()
    }

    fn finish_if_done(&mut self) {
        if self.decoder.is_done() && !self.finished {
            self.finished = true;
            if let Some(tee) = self.tee.take() {
                tee.complete();
            }
            if !self.discard {
                self.out.truncate(self.end);
                self.encoder.finish(self.decoder.trailers(), &mut self.out);
                self.end = self.out.len();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::chunked::{MAX_EXTENSIONS_TOTAL, MAX_EXTENSION_BYTES};

    /// Relays `input` split into pieces of `piece` bytes, draining the buffer after
    /// each; returns (output, input bytes taken).
    fn relay_all(mut relay: Relay, input: &[u8], piece: usize) -> (Vec<u8>, usize) {
        let mut out = Vec::new();
        let mut at = 0;
        while at < input.len() && !relay.is_complete() {
            let end = input.len().min(at + piece);
            let n = relay.feed(&input[at..end]).unwrap();
            out.extend_from_slice(relay.pending());
            let pending = relay.pending().len();
            relay.advance(pending);
            if n == 0 && !relay.wants_input() {
                break;
            }
            at += n;
        }
        (out, at)
    }

    #[test]
    fn splice_room_is_the_body_s_rest_and_only_after_what_was_copied() {
        let mut relay = Relay::new(Decoder::length(10), Encoder::Identity, 4);
        assert_eq!(relay.splice_room(), Some(10));
        // Bytes copied in first: none spliced before they are written.
        assert_eq!(relay.feed(b"abc").unwrap(), 3);
        assert_eq!(relay.splice_room(), None);
        relay.advance(3);
        assert_eq!(relay.splice_room(), Some(7), "never past the body");
        relay.commit_spliced(5);
        assert_eq!(relay.splice_room(), Some(2));
        assert!(!relay.is_finished());
        relay.commit_spliced(2);
        assert!(relay.is_complete(), "the length was honoured");
        assert_eq!(relay.splice_room(), None);
        assert_eq!(relay.data_bytes, 10);
        assert_eq!(relay.feed(b"NEXT").unwrap(), 0, "bytes past the body stay");

        let mut close = Relay::new(Decoder::until_close(), Encoder::Identity, 4);
        assert_eq!(close.splice_room(), Some(usize::MAX));
        close.commit_spliced(1 << 20);
        assert!(
            !close.is_finished(),
            "a close-delimited body ends at the close"
        );
        close.eof().unwrap();
        assert!(close.is_complete());
        assert_eq!(close.data_bytes, 1 << 20);
    }

    #[test]
    fn a_re_framed_stored_or_discarded_body_is_never_spliced() {
        let chunked = Relay::new(Decoder::chunked(), Encoder::Identity, 64);
        assert_eq!(chunked.splice_room(), None);
        let to_chunked = Relay::new(Decoder::until_close(), Encoder::Chunked, 64);
        assert_eq!(to_chunked.splice_room(), None);
        let mut discarded = Relay::new(Decoder::length(5), Encoder::Identity, 64);
        discarded.discard = true;
        assert_eq!(discarded.splice_room(), None);
        assert_eq!(
            Relay::new(Decoder::length(0), Encoder::Identity, 64).splice_room(),
            None
        );
    }

    #[test]
    fn a_trailer_line_that_is_not_a_field_is_a_bad_chunk_and_never_relayed() {
        for bad in [
            &b"0\r\nX: 1\r\n folded\r\n\r\n"[..],
            b"0\r\nX: a\0b\r\n\r\n",
            b"0\r\nHTTP/1.1 200 OK\r\n\r\n",
        ] {
            let mut body = b"3\r\nabc\r\n".to_vec();
            body.extend_from_slice(bad);
            let mut relay = Relay::new(Decoder::chunked(), Encoder::Chunked, 1024);
            assert_eq!(relay.feed(&body), Err(BodyError::BadChunk), "{bad:?}");
            assert_eq!(relay.pending(), b"3\r\nabc\r\n", "no end, no trailer");
            assert!(!relay.is_finished());
        }
    }

    #[test]
    fn chunked_is_decoded_with_trailers_and_re_encoded_at_any_split() {
        let body = b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Sum: 42\r\n\r\nNEXT";
        for piece in [1, 2, 3, 7, 64] {
            let relay = Relay::new(Decoder::chunked(), Encoder::Chunked, 1024);
            let (out, taken) = relay_all(relay, body, piece);
            assert_eq!(taken, body.len() - 4, "piece {piece}: stops at the end");
            // Re-chunked per piece of data: decode it again to compare the data.
            let mut d = Decoder::chunked();
            let mut data = Vec::new();
            let mut at = 0;
            while !d.is_done() {
                let s = d.decode(&out[at..]).unwrap();
                data.extend_from_slice(&out[at + s.data.start..at + s.data.end]);
                at += s.consumed;
            }
            assert_eq!(data, b"hello world", "piece {piece}");
            assert_eq!(d.trailers(), b"X-Sum: 42\r\n", "piece {piece}");
            assert!(!out.windows(3).any(|w| w == b"ext"), "extensions dropped");
        }
    }

    #[test]
    fn chunked_to_identity_yields_just_the_data() {
        let relay = Relay::new(Decoder::chunked(), Encoder::Identity, 1024);
        let (out, _) = relay_all(relay, b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n", 64);
        assert_eq!(out, b"abcde");
    }

    #[test]
    fn close_delimited_is_chunked_and_ended_at_eof() {
        let mut relay = Relay::new(Decoder::until_close(), Encoder::Chunked, 1024);
        assert_eq!(relay.feed(b"abc").unwrap(), 3);
        assert!(!relay.is_complete());
        relay.eof().unwrap();
        assert_eq!(relay.pending(), b"3\r\nabc\r\n0\r\n\r\n");
        relay.advance(relay.pending().len());
        assert!(relay.is_complete());
    }

    #[test]
    fn content_length_counts_down_and_leaves_the_rest() {
        let mut relay = Relay::new(Decoder::length(5), Encoder::Identity, 1024);
        assert_eq!(relay.feed(b"hel").unwrap(), 3);
        assert_eq!(relay.feed(b"loHTTP/1.1").unwrap(), 2);
        assert_eq!(relay.pending(), b"hello");
        assert!(!relay.wants_input());
        relay.advance(5);
        assert!(relay.is_complete());
        assert!(Relay::new(Decoder::length(0), Encoder::Identity, 8).is_complete());
    }

    #[test]
    fn a_full_buffer_stops_taking_input() {
        let mut relay = Relay::new(Decoder::length(100), Encoder::Identity, 16);
        assert_eq!(relay.feed(&[b'x'; 40]).unwrap(), 16);
        assert!(!relay.wants_input());
        assert_eq!(relay.feed(&[b'x'; 40]).unwrap(), 0, "nothing while full");
        relay.advance(10);
        assert!(relay.wants_input());
        assert_eq!(relay.feed(&[b'x'; 40]).unwrap(), 10);
        assert_eq!(relay.pending().len(), 16);
    }

    /// Reads `body` into the relay's direct room `piece` bytes at a time (as a socket
    /// would), draining `drain` bytes after each; returns what the receiver got.
    fn relay_direct(relay: &mut Relay, body: &[u8], piece: usize, drain: usize) -> Vec<u8> {
        let (mut out, mut at) = (Vec::new(), 0);
        while !relay.is_complete() {
            if let Some(room) = relay.direct_room() {
                let n = room.len().min(piece).min(body.len() - at);
                room[..n].copy_from_slice(&body[at..at + n]);
                relay.commit_direct(n).unwrap();
                at += n;
            }
            let n = relay.pending().len().min(drain);
            out.extend_from_slice(&relay.pending()[..n]);
            relay.advance(n);
        }
        out
    }

    #[test]
    fn a_length_body_read_in_place_is_relayed_whole_and_never_past_its_end() {
        let body: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        for (piece, drain) in [(7, 5), (4096, 1000), (100_000, 100_000), (30_000, 64)] {
            let mut relay = Relay::new(Decoder::length(100_000), Encoder::Identity, 16 * 1024);
            let out = relay_direct(&mut relay, &body, piece, drain);
            assert_eq!(out, body, "piece {piece}, drain {drain}");
            assert_eq!(relay.data_bytes, 100_000);
            assert!(relay.direct_room().is_none(), "no room past the body");
        }
    }

    #[test]
    fn room_in_place_is_bounded_by_the_buffer_and_the_body_left() {
        let mut relay = Relay::new(Decoder::length(100), Encoder::Identity, 64);
        assert_eq!(relay.feed(&[1; 10]).unwrap(), 10);
        assert_eq!(relay.direct_room().map(|r| r.len()), Some(54));
        relay.commit_direct(54).unwrap();
        assert!(relay.direct_room().is_none(), "full");
        relay.advance(64);
        assert_eq!(
            relay.direct_room().map(|r| r.len()),
            Some(36),
            "the body's rest"
        );
        let mut until_close = Relay::new(Decoder::until_close(), Encoder::Identity, 64);
        assert_eq!(until_close.direct_room().map(|r| r.len()), Some(64));
        let mut chunked = Relay::new(Decoder::chunked(), Encoder::Chunked, 64);
        assert!(
            chunked.direct_room().is_none(),
            "re-framed bodies go through feed"
        );
        let mut rechunked = Relay::new(Decoder::length(10), Encoder::Chunked, 64);
        assert!(rechunked.direct_room().is_none());
    }

    #[test]
    fn memory_stays_bounded_for_a_large_body() {
        let total: u64 = 64 << 20;
        let mut relay = Relay::new(Decoder::length(total), Encoder::Chunked, 64 * 1024);
        let piece = vec![7u8; 256 * 1024];
        let mut sent = 0u64;
        let mut fed = 0u64;
        while !relay.is_complete() {
            let want = ((total - fed) as usize).min(piece.len());
            fed += relay.feed(&piece[..want]).unwrap() as u64;
            assert!(relay.pending().len() <= 64 * 1024 + 32);
            // The receiver takes a little at a time.
            let n = relay.pending().len().min(10_000);
            sent += n as u64;
            relay.advance(n);
        }
        assert_eq!(fed, total);
        assert_eq!(relay.data_bytes, total);
        assert!(sent > total, "chunk framing was added");
        assert!(
            relay.out.capacity() <= 2 * 64 * 1024 + 64,
            "{}",
            relay.out.capacity()
        );
    }

    #[test]
    fn truncated_and_bad_bodies_are_errors() {
        let mut relay = Relay::new(Decoder::length(5), Encoder::Identity, 64);
        relay.feed(b"abc").unwrap();
        assert_eq!(relay.eof(), Err(BodyError::Truncated));
        let mut d = Decoder::chunked();
        d.decode(b"5\r\nab").unwrap();
        assert_eq!(d.eof(), Err(BodyError::Truncated));
        for bad in [
            &b"zz\r\n"[..],
            b"5\nhello",
            b"2\r\nabX",
            b"11111111111111111\r\n",
            b"0\r\n\n",
        ] {
            let mut d = Decoder::chunked();
            let mut at = 0;
            let result = loop {
                match d.decode(&bad[at..]) {
                    Err(e) => break Err(e),
                    Ok(s) if s.consumed == 0 => break Ok(()),
                    Ok(s) => at += s.consumed,
                }
            };
            assert_eq!(result, Err(BodyError::BadChunk), "{bad:?}");
        }
        let mut d = Decoder::chunked();
        let huge = [b"0\r\n".as_slice(), &[b'a'; MAX_TRAILERS + 1]].concat();
        let mut at = 0;
        let result = loop {
            match d.decode(&huge[at..]) {
                Err(e) => break Err(e),
                Ok(s) if s.consumed == 0 => break Ok(()),
                Ok(s) => at += s.consumed,
            }
        };
        assert_eq!(result, Err(BodyError::BadChunk));
    }

    /// Feeds `input` whole, step by step, to `d`.
    fn decode_all(d: &mut Decoder, mut input: &[u8]) -> Result<(), BodyError> {
        while !input.is_empty() && !d.is_done() {
            let step = d.decode(input)?;
            if step.consumed == 0 {
                break;
            }
            input = &input[step.consumed..];
        }
        Ok(())
    }

    #[test]
    fn chunk_extensions_are_bounded_like_http_chunked() {
        // One line at the limit (counted from the `;`) passes; one byte more is a
        // framing error at once.
        let mut ok = b"1;".to_vec();
        ok.extend(std::iter::repeat_n(b'x', MAX_EXTENSION_BYTES - 1));
        ok.extend_from_slice(b"\r\na\r\n0\r\n\r\n");
        let mut d = Decoder::chunked();
        assert_eq!(decode_all(&mut d, &ok), Ok(()));
        assert!(d.is_done());
        let mut long = b"1;".to_vec();
        long.extend(std::iter::repeat_n(b'x', MAX_EXTENSION_BYTES));
        assert_eq!(
            decode_all(&mut Decoder::chunked(), &long),
            Err(BodyError::BadChunk)
        );
        // Short extensions on many chunks add up to the per-body limit.
        let line = format!("1;{}\r\na\r\n", "e".repeat(1000));
        let within = line.repeat(MAX_EXTENSIONS_TOTAL / 1000);
        assert_eq!(
            decode_all(&mut Decoder::chunked(), within.as_bytes()),
            Ok(())
        );
        let over = line.repeat(MAX_EXTENSIONS_TOTAL / 1000 + 1);
        assert_eq!(
            decode_all(&mut Decoder::chunked(), over.as_bytes()),
            Err(BodyError::BadChunk)
        );
    }

    #[test]
    fn a_chunked_body_past_its_limit_is_refused_on_the_size_line() {
        let mut d = Decoder::chunked_within(10);
        assert_eq!(
            decode_all(&mut d, b"5\r\nhello\r\n5\r\nworld\r\n0\r\n\r\n"),
            Ok(())
        );
        assert!(d.is_done());
        let mut d = Decoder::chunked_within(10);
        assert_eq!(
            decode_all(&mut d, b"5\r\nhello\r\n6\r\n"),
            Err(BodyError::TooLarge)
        );
    }
}

//! One HTTP/2 connection's protocol state (RFC 9113), sans-io: bytes read go in
//! ([`Connection::input`]), events for the streams come out ([`Connection::poll`]),
//! and every frame forkd sends is written into [`Connection::out`], which the session
//! writes to the socket in one go per turn.
//!
//! It owns what is the connection's: the preface, both sides' SETTINGS, the
//! connection and stream flow-control windows both ways, stream states (idle, open,
//! half-closed, closed: RFC 9113 §5.1), header blocks across CONTINUATION frames and
//! their HPACK decoding, PING, GOAWAY (the two-step one for a graceful close), and
//! the errors: a connection error writes GOAWAY and ends the connection, a stream
//! error writes RST_STREAM and ends that stream. What a stream carries is the
//! session's and `stream.rs`'s; the flood rules are `meter.rs`'s.

use super::frame::{self, Code, Error, Frame, Head, HEAD_LEN, MAX_FRAME, MAX_WINDOW};
use super::hpack::{self, Fields};
use forkd_shared::config::H2Settings;
use std::collections::VecDeque;

/// The initial window of both directions before SETTINGS say otherwise.
const DEFAULT_WINDOW: i64 = 65_535;

/// The PING payload of the graceful close's first step.
const DRAIN_PING: [u8; 8] = *b"forkd-gw";

/// Received bytes given back before a WINDOW_UPDATE is sent for them: a part of the
/// window, so a large upload costs one update per few frames, not one per frame.
const UPDATE_DIVISOR: i64 = 4;

/// What the client's frames mean for the streams, one at a time from
/// [`Connection::poll`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A new stream's request head: its fields are [`Connection::fields`] until the
    /// next poll. `end`: the HEADERS ended the stream (no body).
    Request { id: u32, end: bool },
    /// Body bytes of a stream: [`Connection::data`] until the next poll. The stream
    /// gives them back with [`Connection::release`] once it has used them.
    Data { id: u32, end: bool },
    /// The request's trailers (ignored): the body is over.
    Trailers { id: u32 },
    /// The stream is over by the client's RST_STREAM, or by a stream error of ours
    /// (already answered with RST_STREAM).
    Reset { id: u32 },
    /// A send window grew (or SETTINGS changed them): streams waiting on it may go on.
    Window,
    /// The client sent GOAWAY: no new streams, the open ones finish.
    GoAway,
}

/// Where the connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The client's 24-octet preface is still to read.
    Preface,
    /// The first frame must be the client's SETTINGS.
    FirstSettings,
    Frames,
    /// A connection error was sent (or the peer's bytes can no longer be read):
    /// nothing more is read or sent but what is in `out`.
    Failed,
}

/// The graceful close (RFC 9113 §6.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Drain {
    None,
    /// GOAWAY(2^31-1) and a PING sent: new streams are still taken until the PING
    /// comes back.
    Announced,
    /// GOAWAY with the last stream id sent: no new stream is taken.
    Final,
}

/// A stream the connection still has state for (open or half-closed).
#[derive(Debug, Clone, Copy)]
struct StreamState {
    id: u32,
    /// What the client's window lets forkd send.
    send_window: i64,
    /// What the client may still send before forkd gives bytes back.
    recv_window: i64,
    /// Given back, not yet announced with WINDOW_UPDATE.
    released: i64,
    /// The client's END_STREAM came.
    remote_closed: bool,
    /// forkd's END_STREAM went out.
    local_closed: bool,
}

/// A header block read so far (HEADERS without END_HEADERS, then CONTINUATION).
struct Block {
    stream: u32,
    end_stream: bool,
    depends_on_self: bool,
    bytes: Vec<u8>,
}

/// Streams forkd reset (or refused) remembered, so the frames the client sent
/// before it saw the RST_STREAM are ignored (RFC 9113 §5.1) instead of being
/// taken for frames on a closed stream.
const RESET_MEMORY: usize = 32;

pub struct Connection {
    phase: Phase,
    drain: Drain,
    /// Bytes read, not yet taken as frames (from `at`).
    input: Vec<u8>,
    at: usize,
    /// Frames to write, in order.
    pub out: Vec<u8>,
    settings: H2Settings,
    /// The client's SETTINGS.
    peer_initial_window: i64,
    peer_max_frame: usize,
    streams: Vec<StreamState>,
    /// The highest stream id the client opened (or tried to).
    last_stream: u32,
    send_window: i64,
    recv_window: i64,
    /// Connection-level bytes given back, not yet announced.
    released: i64,
    /// What forkd's SETTINGS promised the client: the stream windows it may fill.
    local_window: i64,
    block: Option<Block>,
    decoder: hpack::Decoder,
    fields: Fields,
    /// The range of `input` the last `Data` event's bytes are.
    data: (usize, usize),
    /// No header block has been sent yet: the first starts with a dynamic table size
    /// update to 0 (forkd's encoder uses no dynamic table).
    first_block: bool,
    /// The client sent GOAWAY.
    peer_goaway: bool,
    /// The last streams forkd reset or refused (at most `RESET_MEMORY`).
    reset: VecDeque<u32>,
    /// The last stream id the graceful close's final GOAWAY named: a later GOAWAY
    /// may not name a higher one (RFC 9113 §6.8).
    goaway_last: Option<u32>,
    /// Why the connection failed, for the log (taken once logged).
    pub failure: Option<(Code, &'static str)>,
}

impl Connection {
    /// A server connection: forkd's SETTINGS and the raise of the connection window
    /// are in `out` at once (the server's preface may go before the client's).
    pub fn new(settings: H2Settings) -> Connection {
        let local_window = i64::from(settings.initial_window);
        // The connection window is raised to a window per stream the client may open
        // at once, as nginx does: one slow stream does not stall the others.
        let conn_window = (local_window * i64::from(settings.max_concurrent_streams))
            .clamp(DEFAULT_WINDOW, MAX_WINDOW);
        let mut out = Vec::with_capacity(64);
        frame::write_settings(
            &mut out,
            &[
                (
                    frame::SETTINGS_MAX_CONCURRENT_STREAMS,
                    settings.max_concurrent_streams,
                ),
                (frame::SETTINGS_INITIAL_WINDOW_SIZE, settings.initial_window),
                (
                    frame::SETTINGS_MAX_HEADER_LIST_SIZE,
                    settings.max_header_list,
                ),
            ],
        );
        if conn_window > DEFAULT_WINDOW {
            frame::write_window_update(&mut out, 0, (conn_window - DEFAULT_WINDOW) as u32);
        }
        Connection {
            phase: Phase::Preface,
            drain: Drain::None,
            input: Vec::new(),
            at: 0,
            out,
            settings,
            peer_initial_window: DEFAULT_WINDOW,
            peer_max_frame: MAX_FRAME,
            streams: Vec::new(),
            last_stream: 0,
            send_window: DEFAULT_WINDOW,
            recv_window: conn_window,
            released: 0,
            local_window,
            block: None,
            decoder: hpack::Decoder::new(),
            fields: Fields::new(),
            data: (0, 0),
            first_block: true,
            peer_goaway: false,
            reset: VecDeque::new(),
            goaway_last: None,
            failure: None,
        }
    }

    /// Bytes read from the client.
    pub fn input(&mut self, bytes: &[u8]) {
        if self.phase == Phase::Failed {
            return;
        }
        if self.at == self.input.len() {
            self.input.clear();
            self.at = 0;
        } else if self.at > 0 && self.at >= self.input.len() / 2 {
            self.input.drain(..self.at);
            self.at = 0;
        }
        self.input.extend_from_slice(bytes);
    }

    /// The fields of the last `Request` event.
    pub fn fields(&self) -> &Fields {
        &self.fields
    }

    /// The bytes of the last `Data` event.
    pub fn data(&self) -> &[u8] {
        &self.input[self.data.0..self.data.1]
    }

    /// A connection error was sent (or the client's bytes broke the protocol):
    /// once `out` is written, the connection closes.
    pub fn failed(&self) -> bool {
        self.phase == Phase::Failed
    }

    /// No new stream will be taken (GOAWAY went out with the last id, or came in).
    pub fn closing(&self) -> bool {
        self.drain == Drain::Final || self.peer_goaway
    }

    /// Nothing to wait for: closing with no stream left, or failed.
    pub fn done(&self) -> bool {
        self.failed() || (self.closing() && self.streams.is_empty())
    }

    /// Memory kept while nothing happens is given back (an idle connection).
    pub fn shrink(&mut self) {
        if self.at == self.input.len() {
            self.input = Vec::new();
            self.at = 0;
        }
        if self.out.is_empty() {
            self.out = Vec::new();
        }
        if self.streams.is_empty() {
            self.streams = Vec::new();
            self.fields = Fields::new();
        }
    }

    /// The next event of the input, `None` when more bytes are needed (or the
    /// connection failed).
    pub fn poll(&mut self) -> Option<Event> {
        loop {
            match self.phase {
                Phase::Failed => return None,
                Phase::Preface => {
                    let have = &self.input[self.at..];
                    let n = have.len().min(super::PREFACE.len());
                    if have[..n] != super::PREFACE[..n] {
                        self.fail(Code::PROTOCOL_ERROR, "not the HTTP/2 preface");
                        return None;
                    }
                    if n < super::PREFACE.len() {
                        return None;
                    }
                    self.at += n;
                    self.phase = Phase::FirstSettings;
                }
                Phase::FirstSettings | Phase::Frames => {
                    let have = self.input.len() - self.at;
                    if have < HEAD_LEN {
                        return None;
                    }
                    let h = Head::read(&self.input[self.at..]);
                    if h.len > MAX_FRAME {
                        self.fail(
                            Code::FRAME_SIZE_ERROR,
                            "frame larger than SETTINGS_MAX_FRAME_SIZE",
                        );
                        return None;
                    }
                    if have < HEAD_LEN + h.len {
                        return None;
                    }
                    if self.phase == Phase::FirstSettings {
                        if h.kind != frame::SETTINGS || h.has(frame::ACK) {
                            self.fail(
                                Code::PROTOCOL_ERROR,
                                "the preface is not followed by SETTINGS",
                            );
                            return None;
                        }
                        self.phase = Phase::Frames;
                    }
                    let start = self.at + HEAD_LEN;
                    self.at = start + h.len;
                    match self.frame(&h, start) {
                        Ok(Some(event)) => return Some(event),
                        Ok(None) => {}
                        Err(Error::Connection(code, why)) => {
                            self.fail(code, why);
                            return None;
                        }
                        Err(Error::Stream(id, code, _)) => {
                            if let Some(event) = self.stream_error(id, code) {
                                return Some(event);
                            }
                        }
                    }
                }
            }
        }
    }

    /// A connection error (the client's, or a flood): GOAWAY with the last stream
    /// id, then nothing more.
    pub fn fail(&mut self, code: Code, why: &'static str) {
        if self.phase == Phase::Failed {
            return;
        }
        let last = self.goaway_last.unwrap_or(self.last_stream);
        frame::write_goaway(&mut self.out, last, code);
        self.phase = Phase::Failed;
        self.failure = Some((code, why));
    }

    /// A stream error: RST_STREAM, the stream forgotten; `Reset` if it was one the
    /// session knows.
    fn stream_error(&mut self, id: u32, code: Code) -> Option<Event> {
        self.write_reset(id, code);
        let i = self.find(id)?;
        self.streams.swap_remove(i);
        Some(Event::Reset { id })
    }

    /// Writes RST_STREAM for `id` and remembers it.
    fn write_reset(&mut self, id: u32, code: Code) {
        frame::write_rst(&mut self.out, id, code);
        if !self.reset.contains(&id) {
            if self.reset.len() == RESET_MEMORY {
                self.reset.pop_front();
            }
            self.reset.push_back(id);
        }
    }

    fn find(&self, id: u32) -> Option<usize> {
        self.streams.iter().position(|s| s.id == id)
    }

    /// One frame whose payload is at `input[start..self.at]`.
    fn frame(&mut self, h: &Head, start: usize) -> Result<Option<Event>, Error> {
        let end = self.at;
        // Split borrows: the payload is read from `input` while the rest changes.
        let input = std::mem::take(&mut self.input);
        let result = frame::read(h, &input[start..end]).and_then(|f| self.on_frame(h, f, start));
        self.input = input;
        result
    }

    /// Acts on frame `f`, whose payload starts at `input[start]`.
    fn on_frame(&mut self, h: &Head, f: Frame, start: usize) -> Result<Option<Event>, Error> {
        if let Some(block) = &self.block {
            // Inside a header block only its CONTINUATION may come (§6.10).
            match f {
                Frame::Continuation { stream, .. } if stream == block.stream => {}
                _ => return Err(conn("a frame inside a header block")),
            }
        }
        match f {
            Frame::Data {
                stream,
                data,
                end: end_stream,
            } => {
                // The pad length octet, if any, comes before the data.
                let at = start + usize::from(h.has(frame::PADDED));
                self.on_data(h, stream, at, at + data.len(), end_stream)
            }
            Frame::Headers {
                stream,
                fragment,
                end_stream,
                end_headers,
                depends_on_self,
            } => {
                if end_headers {
                    return self.on_block(stream, fragment, end_stream, depends_on_self);
                }
                self.block = Some(Block {
                    stream,
                    end_stream,
                    depends_on_self,
                    bytes: fragment.to_vec(),
                });
                Ok(None)
            }
            Frame::Continuation {
                fragment,
                end_headers,
                ..
            } => {
                let Some(block) = self.block.as_mut() else {
                    return Err(conn("CONTINUATION without a header block"));
                };
                if block.bytes.len() + fragment.len() > self.settings.max_header_list as usize * 2 {
                    // The meter closes a header block flood first; this bounds memory
                    // whatever it decides.
                    return Err(Error::Connection(
                        Code::ENHANCE_YOUR_CALM,
                        "a header block past h2_max_header_list",
                    ));
                }
                block.bytes.extend_from_slice(fragment);
                if !end_headers {
                    return Ok(None);
                }
                let block = self.block.take().expect("checked");
                self.on_block(
                    block.stream,
                    &block.bytes,
                    block.end_stream,
                    block.depends_on_self,
                )
            }
            Frame::Priority | Frame::Unknown => Ok(None),
            Frame::RstStream { stream, .. } => {
                if stream > self.last_stream {
                    return Err(conn("RST_STREAM on an idle stream"));
                }
                match self.find(stream) {
                    Some(i) => {
                        self.streams.swap_remove(i);
                        Ok(Some(Event::Reset { id: stream }))
                    }
                    None => Ok(None),
                }
            }
            Frame::Settings { ack, payload } => {
                if ack {
                    return Ok(None);
                }
                self.on_settings(payload)
            }
            Frame::Ping { ack: true, data } => {
                if data == DRAIN_PING {
                    self.finish_drain();
                }
                Ok(None)
            }
            Frame::Ping { ack: false, data } => {
                frame::write_ping(&mut self.out, true, data);
                Ok(None)
            }
            Frame::GoAway { .. } => {
                self.peer_goaway = true;
                Ok(Some(Event::GoAway))
            }
            Frame::WindowUpdate { stream, increment } => self.on_window_update(stream, increment),
        }
    }

    fn on_data(
        &mut self,
        h: &Head,
        id: u32,
        data_at: usize,
        end: usize,
        end_stream: bool,
    ) -> Result<Option<Event>, Error> {
        let counted = h.len as i64;
        self.recv_window -= counted;
        if self.recv_window < 0 {
            return Err(Error::Connection(
                Code::FLOW_CONTROL_ERROR,
                "DATA past the connection window",
            ));
        }
        if id > self.last_stream {
            return Err(conn("DATA on an idle stream"));
        }
        let padding = counted - (end - data_at) as i64;
        debug_assert!(padding >= 0);
        let Some(i) = self.find(id).filter(|&i| !self.streams[i].remote_closed) else {
            // A closed stream's bytes still took connection window: given back.
            self.give_back(None, counted);
            if self.find(id).is_none() && self.reset.contains(&id) {
                // Sent before the client saw our RST_STREAM: ignored (§5.1).
                return Ok(None);
            }
            return Err(Error::Stream(
                id,
                Code::STREAM_CLOSED,
                "DATA on a closed stream",
            ));
        };
        let s = &mut self.streams[i];
        s.recv_window -= counted;
        if s.recv_window < 0 {
            self.give_back(None, counted);
            return Err(Error::Stream(
                id,
                Code::FLOW_CONTROL_ERROR,
                "DATA past the stream window",
            ));
        }
        if end_stream {
            s.remote_closed = true;
        }
        if padding > 0 {
            self.give_back(Some(i), padding);
        }
        self.data = (data_at, end);
        let finished = self.streams[i].remote_closed && self.streams[i].local_closed;
        if finished {
            self.streams.swap_remove(i);
        }
        Ok(Some(Event::Data {
            id,
            end: end_stream,
        }))
    }

    /// A whole header block of stream `id`.
    fn on_block(
        &mut self,
        id: u32,
        block: &[u8],
        end_stream: bool,
        depends_on_self: bool,
    ) -> Result<Option<Event>, Error> {
        if id.is_multiple_of(2) {
            return Err(conn("a stream id a client may not open"));
        }
        let max_list = self.settings.max_header_list as usize;
        if let Some(i) = self.find(id) {
            // Trailers (or a second head, which only trailers may be).
            self.decode(block, max_list)?;
            let pseudo = self
                .fields
                .iter()
                .any(|(name, _)| name.first() == Some(&b':'));
            let s = &mut self.streams[i];
            if s.remote_closed {
                return Err(Error::Stream(
                    id,
                    Code::STREAM_CLOSED,
                    "HEADERS on a half-closed stream",
                ));
            }
            if !end_stream {
                return Err(Error::Stream(
                    id,
                    Code::PROTOCOL_ERROR,
                    "trailers without END_STREAM",
                ));
            }
            if pseudo {
                // Pseudo-fields belong to the head only (RFC 9113 §8.1).
                return Err(Error::Stream(
                    id,
                    Code::PROTOCOL_ERROR,
                    "a pseudo-field in trailers",
                ));
            }
            s.remote_closed = true;
            let finished = s.local_closed;
            if finished {
                self.streams.swap_remove(i);
            }
            return Ok(Some(Event::Trailers { id }));
        }
        if id <= self.last_stream {
            self.decode(block, max_list)?;
            if self.reset.contains(&id) {
                // Sent before the client saw our RST_STREAM: ignored.
                return Ok(None);
            }
            return Err(conn("HEADERS on a closed stream"));
        }
        self.last_stream = id;
        // Decoded even when refused: the dynamic table must stay in step.
        self.decode(block, max_list)?;
        if self.drain == Drain::Final || self.peer_goaway {
            // After the last stream id went out, new streams are refused (§6.8):
            // the client may send them again on another connection.
            self.write_reset(id, Code::REFUSED_STREAM);
            return Ok(None);
        }
        if depends_on_self {
            self.write_reset(id, Code::PROTOCOL_ERROR);
            return Ok(None);
        }
        if self.streams.len() >= self.settings.max_concurrent_streams as usize {
            self.write_reset(id, Code::REFUSED_STREAM);
            return Ok(None);
        }
        self.streams.push(StreamState {
            id,
            send_window: self.peer_initial_window,
            recv_window: self.local_window.max(DEFAULT_WINDOW),
            released: 0,
            remote_closed: end_stream,
            local_closed: false,
        });
        Ok(Some(Event::Request {
            id,
            end: end_stream,
        }))
    }

    fn decode(&mut self, block: &[u8], max_list: usize) -> Result<(), Error> {
        self.fields.clear();
        self.decoder
            .decode(block, max_list, &mut self.fields)
            .map_err(|_| {
                Error::Connection(
                    Code::COMPRESSION_ERROR,
                    "a header block HPACK cannot decode",
                )
            })
    }

    fn on_settings(&mut self, payload: &[u8]) -> Result<Option<Event>, Error> {
        let mut window_changed = false;
        for (id, value) in frame::settings(payload) {
            match id {
                frame::SETTINGS_ENABLE_PUSH if value > 1 => {
                    return Err(conn("SETTINGS_ENABLE_PUSH other than 0 or 1"))
                }
                frame::SETTINGS_INITIAL_WINDOW_SIZE => {
                    let value = i64::from(value);
                    if value > MAX_WINDOW {
                        return Err(Error::Connection(
                            Code::FLOW_CONTROL_ERROR,
                            "SETTINGS_INITIAL_WINDOW_SIZE above 2^31-1",
                        ));
                    }
                    let delta = value - self.peer_initial_window;
                    for s in &mut self.streams {
                        s.send_window += delta;
                        if s.send_window > MAX_WINDOW {
                            return Err(Error::Connection(
                                Code::FLOW_CONTROL_ERROR,
                                "a stream window above 2^31-1",
                            ));
                        }
                    }
                    self.peer_initial_window = value;
                    window_changed = true;
                }
                frame::SETTINGS_MAX_FRAME_SIZE => {
                    if !(MAX_FRAME as u32..=(1 << 24) - 1).contains(&value) {
                        return Err(conn("SETTINGS_MAX_FRAME_SIZE out of range"));
                    }
                    self.peer_max_frame = value as usize;
                }
                // The encoder uses no dynamic table, so the client's table size does
                // not matter; pushes are never sent; forkd's responses are bounded by
                // what it writes, not by the client's header list size.
                _ => {}
            }
        }
        frame::write_settings_ack(&mut self.out);
        Ok(window_changed.then_some(Event::Window))
    }

    fn on_window_update(&mut self, id: u32, increment: u32) -> Result<Option<Event>, Error> {
        let inc = i64::from(increment);
        if id == 0 {
            if inc == 0 {
                return Err(conn("WINDOW_UPDATE of 0 on the connection"));
            }
            self.send_window += inc;
            if self.send_window > MAX_WINDOW {
                return Err(Error::Connection(
                    Code::FLOW_CONTROL_ERROR,
                    "the connection window above 2^31-1",
                ));
            }
            return Ok(Some(Event::Window));
        }
        if id > self.last_stream {
            return Err(conn("WINDOW_UPDATE on an idle stream"));
        }
        let Some(i) = self.find(id) else {
            return Ok(None);
        };
        if inc == 0 {
            return Err(Error::Stream(
                id,
                Code::PROTOCOL_ERROR,
                "WINDOW_UPDATE of 0",
            ));
        }
        self.streams[i].send_window += inc;
        if self.streams[i].send_window > MAX_WINDOW {
            return Err(Error::Stream(
                id,
                Code::FLOW_CONTROL_ERROR,
                "a stream window above 2^31-1",
            ));
        }
        Ok(Some(Event::Window))
    }

    /// `n` received bytes are given back to the client's windows (the connection's,
    /// and stream `i`'s if it is still there), announced once a part of the window
    /// has come back.
    fn give_back(&mut self, i: Option<usize>, n: i64) {
        self.released += n;
        let conn_threshold = (self.local_window * i64::from(self.settings.max_concurrent_streams))
            .clamp(DEFAULT_WINDOW, MAX_WINDOW)
            / UPDATE_DIVISOR;
        if self.released >= conn_threshold.min(self.local_window) {
            frame::write_window_update(&mut self.out, 0, self.released as u32);
            self.recv_window += self.released;
            self.released = 0;
        }
        if let Some(i) = i {
            let threshold = self.local_window / UPDATE_DIVISOR;
            let s = &mut self.streams[i];
            s.released += n;
            if !s.remote_closed && s.released >= threshold.max(1) {
                frame::write_window_update(&mut self.out, s.id, s.released as u32);
                s.recv_window += s.released;
                s.released = 0;
            }
        }
    }

    /// The connection window forkd announced (tests).
    #[cfg(test)]
    fn recv_window_start(&self) -> i64 {
        (self.local_window * i64::from(self.settings.max_concurrent_streams))
            .clamp(DEFAULT_WINDOW, MAX_WINDOW)
    }

    /// The stream used `n` bytes of its DATA: the client may send as much again.
    pub fn release(&mut self, id: u32, n: usize) {
        if n == 0 || self.phase == Phase::Failed {
            return;
        }
        let i = self.find(id);
        self.give_back(i, n as i64);
    }

    /// What stream `id` may send now: the smaller of its window and the connection's.
    pub fn window(&self, id: u32) -> usize {
        match self.find(id) {
            Some(i) if !self.streams[i].local_closed => {
                self.streams[i].send_window.min(self.send_window).max(0) as usize
            }
            _ => 0,
        }
    }

    /// The stream is still known (not reset, not closed both ways).
    pub fn is_open(&self, id: u32) -> bool {
        self.find(id).is_some()
    }

    /// Writes a response head (or 1xx, or trailers) of stream `id`: `block` is HPACK.
    pub fn send_headers(&mut self, id: u32, block: &[u8], end_stream: bool) {
        if self.phase == Phase::Failed || self.find(id).is_none() {
            // A stream reset (by either side) gets no more frames.
            return;
        }
        let prefix: &[u8] = if self.first_block {
            self.first_block = false;
            hpack::SIZE_UPDATE_ZERO
        } else {
            &[]
        };
        frame::write_headers(
            &mut self.out,
            id,
            prefix,
            block,
            end_stream,
            self.peer_max_frame,
        );
        if end_stream {
            self.local_end(id);
        }
    }

    /// Writes as much of `data` as the windows allow as DATA of stream `id`;
    /// END_STREAM with the last byte if `end` and all of it went. How much went.
    pub fn send_data(&mut self, id: u32, data: &[u8], end: bool) -> usize {
        if self.phase == Phase::Failed {
            return 0;
        }
        let n = data.len().min(self.window(id));
        if n == 0 && !(data.is_empty() && end) {
            return 0;
        }
        let ends = end && n == data.len();
        frame::write_data(&mut self.out, id, &data[..n], ends, self.peer_max_frame);
        self.send_window -= n as i64;
        if let Some(i) = self.find(id) {
            self.streams[i].send_window -= n as i64;
        }
        if ends {
            self.local_end(id);
        }
        n
    }

    /// forkd's END_STREAM went out on `id`: a stream whose request is still coming
    /// is told to stop sending (RST_STREAM(NO_ERROR), RFC 9113 §8.1).
    fn local_end(&mut self, id: u32) {
        let Some(i) = self.find(id) else {
            return;
        };
        if self.streams[i].remote_closed {
            self.streams.swap_remove(i);
        } else {
            self.streams[i].local_closed = true;
        }
    }

    /// The session is done with stream `id`: if the client is still sending, it is
    /// told to stop (RST_STREAM NO_ERROR after a complete response, `code` else).
    pub fn finish(&mut self, id: u32, code: Code) {
        if let Some(i) = self.find(id) {
            let s = self.streams.swap_remove(i);
            let code = if s.local_closed { Code::NO_ERROR } else { code };
            if self.phase != Phase::Failed {
                self.write_reset(id, code);
            }
        }
    }

    /// Starts the graceful close: GOAWAY(2^31-1) and a PING; the PING's answer sends
    /// the GOAWAY with the last stream id (RFC 9113 §6.8).
    pub fn drain(&mut self) {
        if self.drain != Drain::None || self.phase == Phase::Failed {
            return;
        }
        // Two steps even before the client's preface is read: its first requests
        // may be on their way behind it, and a GOAWAY naming stream 0 would leave
        // them unprocessed.
        self.drain = Drain::Announced;
        frame::write_goaway(&mut self.out, MAX_WINDOW as u32, Code::NO_ERROR);
        frame::write_ping(&mut self.out, false, DRAIN_PING);
    }

    /// The graceful close's second step: GOAWAY with the last stream id taken (when
    /// the PING comes back, or when the client does not answer it in time).
    pub fn finish_drain(&mut self) {
        if self.drain != Drain::Announced || self.phase == Phase::Failed {
            return;
        }
        self.drain = Drain::Final;
        self.goaway_last = Some(self.last_stream);
        frame::write_goaway(&mut self.out, self.last_stream, Code::NO_ERROR);
    }
}

fn conn(why: &'static str) -> Error {
    Error::Connection(Code::PROTOCOL_ERROR, why)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const SETTINGS: H2Settings = H2Settings {
        max_concurrent_streams: 2,
        initial_window: 65_536,
        max_header_list: 4096,
        idle_timeout: Duration::from_secs(180),
        max_requests: 1000,
    };

    /// GET / on authority "a" (static-table indices and one literal).
    const GET: &[u8] = b"\x82\x86\x84\x41\x01a";

    fn f(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        frame::head(&mut b, payload.len(), kind, flags, stream);
        b.extend_from_slice(payload);
        b
    }

    fn settings(pairs: &[(u16, u32)]) -> Vec<u8> {
        let mut b = Vec::new();
        frame::write_settings(&mut b, pairs);
        b
    }

    /// A connection past the preface and the client's SETTINGS (`pairs`), with what
    /// the server wrote so far taken.
    fn open(pairs: &[(u16, u32)]) -> Connection {
        let mut c = Connection::new(SETTINGS);
        c.input(super::super::PREFACE);
        c.input(&settings(pairs));
        while let Some(event) = c.poll() {
            assert_eq!(event, Event::Window);
        }
        assert!(!c.failed());
        c.out.clear();
        c
    }

    /// An open connection with stream 1's GET (ended) read and its output taken.
    fn open_with_get() -> Connection {
        let mut c = open(&[]);
        c.input(&f(
            frame::HEADERS,
            frame::END_HEADERS | frame::END_STREAM,
            1,
            GET,
        ));
        events(&mut c);
        c
    }

    /// The frames in `out` (header, payload), taken.
    fn sent(c: &mut Connection) -> Vec<(Head, Vec<u8>)> {
        let out = std::mem::take(&mut c.out);
        let mut at = 0;
        let mut frames = Vec::new();
        while at < out.len() {
            let h = Head::read(&out[at..]);
            frames.push((h, out[at + HEAD_LEN..at + HEAD_LEN + h.len].to_vec()));
            at += HEAD_LEN + h.len;
        }
        frames
    }

    fn events(c: &mut Connection) -> Vec<Event> {
        std::iter::from_fn(|| c.poll()).collect()
    }

    fn goaway_code(frames: &[(Head, Vec<u8>)]) -> Option<u32> {
        frames
            .iter()
            .find(|(h, _)| h.kind == frame::GOAWAY)
            .map(|(_, p)| u32::from_be_bytes([p[4], p[5], p[6], p[7]]))
    }

    fn rst(frames: &[(Head, Vec<u8>)]) -> Vec<(u32, u32)> {
        frames
            .iter()
            .filter(|(h, _)| h.kind == frame::RST_STREAM)
            .map(|(h, p)| (h.stream, u32::from_be_bytes([p[0], p[1], p[2], p[3]])))
            .collect()
    }

    #[test]
    fn the_server_preface_goes_first_and_a_request_comes_out_whole_however_its_bytes_split() {
        let c = Connection::new(SETTINGS);
        let h = Head::read(&c.out);
        assert_eq!((h.kind, h.stream, h.len), (frame::SETTINGS, 0, 18));
        let update = Head::read(&c.out[HEAD_LEN + 18..]);
        assert_eq!(update.kind, frame::WINDOW_UPDATE);
        let mut all = super::super::PREFACE.to_vec();
        all.extend_from_slice(&settings(&[]));
        all.extend_from_slice(&f(
            frame::HEADERS,
            frame::END_HEADERS | frame::END_STREAM,
            1,
            GET,
        ));
        for split in 1..all.len() {
            let mut c = Connection::new(SETTINGS);
            let mut got = Vec::new();
            c.input(&all[..split]);
            got.extend(events(&mut c));
            c.input(&all[split..]);
            got.extend(events(&mut c));
            assert_eq!(
                got,
                [Event::Request { id: 1, end: true }],
                "split at {split}"
            );
            let fields: Vec<_> = c
                .fields()
                .iter()
                .map(|(n, v)| (n.to_vec(), v.to_vec()))
                .collect();
            assert_eq!(fields[0], (b":method".to_vec(), b"GET".to_vec()));
            assert_eq!(fields[3], (b":authority".to_vec(), b"a".to_vec()));
            let acks = sent(&mut c)
                .iter()
                .filter(|(h, _)| h.kind == frame::SETTINGS && h.has(frame::ACK))
                .count();
            assert_eq!(acks, 1);
        }
    }

    #[test]
    fn a_bad_preface_or_a_first_frame_other_than_settings_is_a_connection_error() {
        let mut c = Connection::new(SETTINGS);
        c.out.clear();
        c.input(b"GET / HTTP/1.1\r\n\r\n");
        assert_eq!(c.poll(), None);
        assert!(c.failed());
        assert_eq!(goaway_code(&sent(&mut c)), Some(Code::PROTOCOL_ERROR.0));
        let mut c = Connection::new(SETTINGS);
        c.out.clear();
        c.input(super::super::PREFACE);
        c.input(&f(frame::PING, 0, 0, &[0; 8]));
        assert_eq!(c.poll(), None);
        assert_eq!(goaway_code(&sent(&mut c)), Some(Code::PROTOCOL_ERROR.0));
    }

    #[test]
    fn data_goes_within_the_clients_windows_and_waits_for_window_updates() {
        let mut c = open(&[(frame::SETTINGS_INITIAL_WINDOW_SIZE, 10)]);
        c.input(&f(
            frame::HEADERS,
            frame::END_HEADERS | frame::END_STREAM,
            1,
            GET,
        ));
        assert_eq!(events(&mut c), [Event::Request { id: 1, end: true }]);
        c.send_headers(1, b"\x88", false);
        assert_eq!(c.send_data(1, &[7; 25], true), 10);
        assert_eq!(c.window(1), 0);
        assert_eq!(c.send_data(1, &[7; 15], true), 0);
        let frames = sent(&mut c);
        // The first block starts with a table size update to 0.
        assert_eq!(frames[0].1, b"\x20\x88");
        assert_eq!((frames[1].0.kind, frames[1].0.len), (frame::DATA, 10));
        c.input(&f(frame::WINDOW_UPDATE, 0, 1, &100u32.to_be_bytes()));
        assert_eq!(events(&mut c), [Event::Window]);
        assert_eq!(c.send_data(1, &[7; 15], true), 15);
        let frames = sent(&mut c);
        assert!(frames[0].0.has(frame::END_STREAM));
        // Both sides ended: the stream is gone, its frames are STREAM_CLOSED.
        assert!(!c.is_open(1));
        c.input(&f(frame::DATA, frame::END_STREAM, 1, b"x"));
        assert_eq!(events(&mut c), []);
        assert_eq!(rst(&sent(&mut c)), [(1, Code::STREAM_CLOSED.0)]);
        assert!(!c.failed());
    }

    #[test]
    fn a_settings_change_moves_every_open_streams_window_and_an_overflow_is_an_error() {
        let mut c = open_with_get();
        c.input(&settings(&[(frame::SETTINGS_INITIAL_WINDOW_SIZE, 0)]));
        assert_eq!(events(&mut c), [Event::Window]);
        assert_eq!(c.window(1), 0);
        c.input(&f(
            frame::WINDOW_UPDATE,
            0,
            1,
            &(MAX_WINDOW as u32).to_be_bytes(),
        ));
        assert_eq!(events(&mut c), [Event::Window]);
        c.input(&f(frame::WINDOW_UPDATE, 0, 1, &1u32.to_be_bytes()));
        assert_eq!(events(&mut c), [Event::Reset { id: 1 }]);
        assert_eq!(rst(&sent(&mut c)), [(1, Code::FLOW_CONTROL_ERROR.0)]);
    }

    #[test]
    fn streams_past_the_concurrency_limit_are_refused_and_ids_must_grow_and_be_odd() {
        let mut c = open(&[]);
        for id in [1, 3, 5] {
            c.input(&f(frame::HEADERS, frame::END_HEADERS, id, GET));
        }
        assert_eq!(
            events(&mut c),
            [
                Event::Request { id: 1, end: false },
                Event::Request { id: 3, end: false }
            ]
        );
        assert_eq!(rst(&sent(&mut c)), [(5, Code::REFUSED_STREAM.0)]);
        c.input(&f(frame::HEADERS, frame::END_HEADERS, 4, GET));
        assert_eq!(events(&mut c), []);
        assert!(c.failed());
        assert_eq!(goaway_code(&sent(&mut c)), Some(Code::PROTOCOL_ERROR.0));
        let mut c = open(&[]);
        c.input(&f(
            frame::HEADERS,
            frame::END_HEADERS | frame::END_STREAM,
            5,
            GET,
        ));
        c.input(&f(
            frame::HEADERS,
            frame::END_HEADERS | frame::END_STREAM,
            3,
            GET,
        ));
        assert_eq!(events(&mut c), [Event::Request { id: 5, end: true }]);
        assert!(c.failed());
    }

    #[test]
    fn a_header_block_continues_only_in_continuation_frames_of_its_stream() {
        let mut c = open(&[]);
        c.input(&f(frame::HEADERS, frame::END_STREAM, 1, &GET[..3]));
        c.input(&f(frame::CONTINUATION, 0, 1, &GET[3..4]));
        c.input(&f(frame::CONTINUATION, frame::END_HEADERS, 1, &GET[4..]));
        assert_eq!(events(&mut c), [Event::Request { id: 1, end: true }]);
        for intruder in [
            f(frame::PRIORITY, 0, 3, &[0, 0, 0, 0, 16]),
            f(frame::CONTINUATION, frame::END_HEADERS, 5, &GET[3..]),
            f(frame::PING, 0, 0, &[0; 8]),
        ] {
            let mut c = open(&[]);
            c.input(&f(frame::HEADERS, 0, 3, &GET[..3]));
            c.input(&intruder);
            assert_eq!(events(&mut c), []);
            assert_eq!(goaway_code(&sent(&mut c)), Some(Code::PROTOCOL_ERROR.0));
        }
        let mut c = open(&[]);
        c.input(&f(
            frame::HEADERS,
            frame::END_HEADERS,
            1,
            b"\xff\xff\xff\xff\x0f",
        ));
        assert_eq!(events(&mut c), []);
        assert_eq!(goaway_code(&sent(&mut c)), Some(Code::COMPRESSION_ERROR.0));
    }

    #[test]
    fn body_bytes_count_against_both_windows_and_are_given_back_as_used() {
        let mut c = open(&[]);
        c.input(&f(frame::HEADERS, frame::END_HEADERS, 1, GET));
        events(&mut c);
        let chunk = vec![1u8; MAX_FRAME];
        for _ in 0..4 {
            c.input(&f(frame::DATA, 0, 1, &chunk));
            assert_eq!(events(&mut c), [Event::Data { id: 1, end: false }]);
            assert_eq!(c.data().len(), MAX_FRAME);
        }
        // 64 KiB taken: one more octet is past the stream's window.
        c.input(&f(frame::DATA, 0, 1, b"x"));
        assert_eq!(events(&mut c), [Event::Reset { id: 1 }]);
        assert_eq!(rst(&sent(&mut c)), [(1, Code::FLOW_CONTROL_ERROR.0)]);
        let mut c = open(&[]);
        c.input(&f(frame::HEADERS, frame::END_HEADERS, 1, GET));
        events(&mut c);
        for _ in 0..2 {
            c.input(&f(frame::DATA, 0, 1, &chunk));
            events(&mut c);
            c.release(1, MAX_FRAME);
        }
        // The stream's window comes back a quarter at a time, the connection's
        // (twice as large here) likewise.
        let updates: Vec<_> = sent(&mut c)
            .into_iter()
            .filter(|(h, _)| h.kind == frame::WINDOW_UPDATE)
            .map(|(h, p)| (h.stream, u32::from_be_bytes([p[0], p[1], p[2], p[3]])))
            .collect();
        assert_eq!(
            updates,
            [
                (1, MAX_FRAME as u32),
                (0, 2 * MAX_FRAME as u32),
                (1, MAX_FRAME as u32)
            ]
        );
    }

    #[test]
    fn a_padded_data_frame_gives_its_data_and_its_padding_back_at_once() {
        let mut c = open(&[]);
        c.input(&f(frame::HEADERS, frame::END_HEADERS, 1, GET));
        events(&mut c);
        c.input(&f(
            frame::DATA,
            frame::PADDED | frame::END_STREAM,
            1,
            b"\x03testPPP",
        ));
        assert_eq!(events(&mut c), [Event::Data { id: 1, end: true }]);
        assert_eq!(c.data(), b"test");
        c.release(1, 4);
        // All 8 octets the frame took came back: the 4 of data and the 4 of padding.
        assert_eq!(c.recv_window + c.released, c.recv_window_start());
    }

    #[test]
    fn the_graceful_close_announces_then_names_the_last_stream_once_the_ping_returns() {
        let mut c = open_with_get();
        c.drain();
        let frames = sent(&mut c);
        assert_eq!(frames[0].0.kind, frame::GOAWAY);
        assert_eq!(&frames[0].1[..4], &(MAX_WINDOW as u32).to_be_bytes());
        assert_eq!(frames[1].0.kind, frame::PING);
        // A stream opened before the PING returns is still taken.
        c.input(&f(
            frame::HEADERS,
            frame::END_HEADERS | frame::END_STREAM,
            3,
            GET,
        ));
        assert_eq!(events(&mut c), [Event::Request { id: 3, end: true }]);
        c.input(&f(frame::PING, frame::ACK, 0, &DRAIN_PING));
        assert_eq!(events(&mut c), []);
        let frames = sent(&mut c);
        assert_eq!(&frames[0].1[..8], &[0, 0, 0, 3, 0, 0, 0, 0]);
        assert!(c.closing());
        c.input(&f(
            frame::HEADERS,
            frame::END_HEADERS | frame::END_STREAM,
            5,
            GET,
        ));
        assert_eq!(events(&mut c), []);
        assert!(!c.done(), "streams 1 and 3 are still open");
        for id in [1, 3] {
            c.send_headers(id, b"\x88", true);
        }
        assert!(c.done());
    }

    #[test]
    fn a_drain_before_the_preface_still_takes_the_requests_behind_it() {
        let mut c = Connection::new(SETTINGS);
        c.out.clear();
        c.drain();
        let frames = sent(&mut c);
        assert_eq!(&frames[0].1[..4], &(MAX_WINDOW as u32).to_be_bytes());
        assert_eq!(frames[1].0.kind, frame::PING);
        c.input(super::super::PREFACE);
        c.input(&settings(&[]));
        c.input(&f(
            frame::HEADERS,
            frame::END_HEADERS | frame::END_STREAM,
            1,
            GET,
        ));
        assert_eq!(events(&mut c), [Event::Request { id: 1, end: true }]);
        c.input(&f(frame::PING, frame::ACK, 0, &DRAIN_PING));
        assert_eq!(events(&mut c), []);
        let last = sent(&mut c)
            .into_iter()
            .find(|(h, _)| h.kind == frame::GOAWAY)
            .unwrap();
        assert_eq!(&last.1[..4], &1u32.to_be_bytes());
    }

    #[test]
    fn frames_a_client_sent_before_it_saw_our_reset_are_ignored() {
        let mut c = open(&[]);
        c.input(&f(frame::HEADERS, frame::END_HEADERS, 1, GET));
        events(&mut c);
        // forkd answered early and let the stream go: RST_STREAM(NO_ERROR).
        c.send_headers(1, b"\x88", true);
        c.finish(1, Code::CANCEL);
        assert_eq!(rst(&sent(&mut c)), [(1, Code::NO_ERROR.0)]);
        // The client's body and trailers were on their way: ignored, not errors.
        c.input(&f(frame::DATA, 0, 1, b"more"));
        c.input(&f(
            frame::HEADERS,
            frame::END_HEADERS | frame::END_STREAM,
            1,
            b"\x40\x01x\x01y",
        ));
        assert_eq!(events(&mut c), []);
        assert!(!c.failed());
        assert!(rst(&sent(&mut c)).is_empty());
    }

    #[test]
    fn a_head_that_depends_on_itself_is_decoded_then_its_stream_refused() {
        let mut c = open(&[]);
        // A literal the table keeps (x: y), with a priority naming stream 1.
        let mut payload = vec![0, 0, 0, 1, 16];
        payload.extend_from_slice(GET);
        payload.extend_from_slice(b"\x40\x01x\x01y");
        c.input(&f(
            frame::HEADERS,
            frame::END_HEADERS | frame::PRIORITY_FLAG,
            1,
            &payload,
        ));
        assert_eq!(events(&mut c), []);
        assert_eq!(rst(&sent(&mut c)), [(1, Code::PROTOCOL_ERROR.0)]);
        // The table took `x: y`: the next request may use it (index 63 once that
        // request's own `:authority` literal is in front of it at 62).
        let mut next = GET.to_vec();
        next.push(0x80 | 63);
        c.input(&f(
            frame::HEADERS,
            frame::END_HEADERS | frame::END_STREAM,
            3,
            &next,
        ));
        assert_eq!(events(&mut c), [Event::Request { id: 3, end: true }]);
        let x: Vec<_> = c.fields().iter().filter(|(n, _)| *n == b"x").collect();
        assert_eq!(x, [(&b"x"[..], &b"y"[..])]);
    }

    #[test]
    fn pings_are_answered_and_unknown_frames_and_settings_ignored() {
        let mut c = open(&[(0x99, 5)]);
        c.input(&f(0x42, 0xff, 0, b"whatever"));
        c.input(&f(frame::PING, 0, 0, b"12345678"));
        assert_eq!(events(&mut c), []);
        let frames = sent(&mut c);
        assert_eq!(frames.len(), 1);
        assert!(frames[0].0.has(frame::ACK));
        assert_eq!(frames[0].1, b"12345678");
    }
}

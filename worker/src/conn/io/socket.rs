//! The client socket's bytes: reads into the input buffer and writes of the queued
//! output, through the connection's `Transport` (plain or TLS).

use super::*;
use std::os::fd::AsFd;

impl Conn {
    /// Reads what the socket has into the input buffer. `Ok(true)`: got bytes;
    /// `Ok(false)`: nothing more now; `Err`: EOF or error (close).
    pub(super) fn fill(&mut self, svc: &mut Services) -> io::Result<bool> {
        if !self.readable {
            return Ok(false);
        }
        let now = svc.clock.now_us;
        let starts_head = self.phase == Phase::ReadHead;
        let busy = self.busy.get_or_insert_with(|| svc.take_busy());
        if busy.in_end == busy.inbuf.len() {
            if busy.in_start == 0 {
                // A full buffer that holds no complete head: the parser reports
                // 414/431 before this; a body is consumed as it arrives.
                return Err(io::ErrorKind::OutOfMemory.into());
            }
            busy.inbuf.copy_within(busy.in_start..busy.in_end, 0);
            busy.in_end -= busy.in_start;
            busy.in_start = 0;
        }
        let space = busy.inbuf.len() - busy.in_end;
        loop {
            match Transport::new(&mut self.stream, &mut self.tls)
                .read_counted(&mut busy.inbuf[busy.in_end..], &svc.stats)
            {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    if busy.in_start == busy.in_end && starts_head {
                        self.head_since = now;
                    }
                    busy.in_end += n;
                    // In `Proxy` the client is read only for its body.
                    if matches!(self.phase, Phase::ReadBody | Phase::Proxy) {
                        busy.rate.bytes += n as u64;
                    }
                    self.progress = now;
                    svc.stats.bytes_in(n as u64);
                    // A short read drained the socket: the next edge will tell us of
                    // more, unless the client's FIN came with these bytes.
                    self.readable = busy.hung_up || self.tls.may_have_more(n, space);
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.readable = false;
                    return Ok(false);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Reads a proxied request's body: straight into the session's request stream
    /// when it has room for it there (`Session::client_body_room`: 64 KiB reads of a
    /// streamed `Content-Length` body, never past its end), else as [`Conn::fill`].
    /// The same results and the same counting as `fill`.
    pub(super) fn fill_body(&mut self, svc: &mut Services) -> io::Result<bool> {
        if !self.readable {
            return Ok(false);
        }
        let Some(busy) = self.busy.as_deref_mut().filter(|b| !b.has_input()) else {
            return self.fill(svc);
        };
        let hung_up = busy.hung_up;
        let Some(p) = busy.proxy.as_deref_mut() else {
            return self.fill(svc);
        };
        if !self.tls.is_tls() {
            p.session.allow_upload_splice();
        }
        if let Some(max) = p.session.client_splice_room() {
            let spliced = loop {
                match p.session.splice_from_client(self.stream.as_fd(), max) {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    other => break other,
                }
            };
            match spliced {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    busy.rate.bytes += n as u64;
                    self.progress = svc.clock.now_us;
                    svc.stats.bytes_in(n as u64);
                    // The socket counts as empty only when a splice into an empty
                    // pipe would block (with bytes held, the pipe may be full).
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if p.session.upload_piped() {
                        if p.session.upload_held() == 0 {
                            self.readable = hung_up;
                        }
                        return Ok(false);
                    }
                    // Splicing was refused: read the body instead.
                }
                Err(e) => return Err(e),
            }
        }
        if p.session.upload_piped() {
            return Ok(false); // the pipe is full: the upstream takes it first
        }
        let Some(room) = p.session.client_body_room() else {
            return self.fill(svc);
        };
        let space = room.len();
        let read = loop {
            match Transport::new(&mut self.stream, &mut self.tls).read_counted(room, &svc.stats) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => break other,
            }
        };
        match read {
            Ok(0) => Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                if p.session.commit_client_body(n).is_err() {
                    return Err(io::ErrorKind::InvalidData.into());
                }
                busy.rate.bytes += n as u64;
                self.progress = svc.clock.now_us;
                svc.stats.bytes_in(n as u64);
                // A short read drained the socket (as in `fill`).
                self.readable = hung_up || self.tls.may_have_more(n, space);
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                self.readable = false;
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Writes queued output, at most `budget` bytes (less what it wrote).
    pub(super) fn flush(&mut self, svc: &Services, budget: &mut u64) -> io::Result<Flush> {
        let Some(busy) = self.busy.as_deref_mut() else {
            return self.push_pending();
        };
        let mut sent = 0;
        let mut sink = Transport::new(&mut self.stream, &mut self.tls);
        let result = busy.out.flush(&mut sink, &mut sent, *budget);
        *budget = budget.saturating_sub(sent);
        if matches!(self.phase, Phase::Write(_)) {
            busy.rate.bytes += sent;
        }
        if sent > 0 {
            self.progress = svc.clock.now_us;
            svc.stats.bytes_out(sent);
        }
        match result {
            Ok(Flush::Done) => self.push_pending(),
            other => other,
        }
    }

    /// TLS records the socket has not taken yet are part of the output.
    pub(super) fn push_pending(&mut self) -> io::Result<Flush> {
        match Transport::new(&mut self.stream, &mut self.tls).push()? {
            true => Ok(Flush::Done),
            false => Ok(Flush::Blocked),
        }
    }
}

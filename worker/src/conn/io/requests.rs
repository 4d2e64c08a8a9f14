//! The requests in a connection's input: heads parsed (once their end may have
//! come) and dispatched, bodies of answered requests consumed.

use super::*;

impl Conn {
    /// Answers every complete request in the input buffer. Returns `Some(after)` when
    /// the connection must stop reading requests (it closes after the output);
    /// `None` when it needs more input or has entered `ReadBody`, or when a batch of
    /// output should be written first.
    pub(super) fn answer_buffered(&mut self, key: usize, svc: &mut Services) -> Option<After> {
        let from = self.origin();
        let busy = self.busy.as_deref_mut()?;
        // Until the head is complete its `Host` is unknown: read up to the largest
        // head any server on the address takes; `dispatch` then applies the limit of
        // the server the `Host` selects.
        let max_header = svc.routing[usize::from(self.listener)].max_header_bytes;
        loop {
            if !busy.has_input() {
                return None;
            }
            if busy.out.mem_len() >= BATCH_BYTES || busy.out.has_file() {
                return None; // write this batch first
            }
            // Borrow the input buffer and the output apart: the parsed request points
            // into the buffer while its answer is queued.
            let buf = &busy.inbuf[busy.in_start..busy.in_end];
            // A head in pieces is parsed once its end may have come: linear, not a
            // parse from byte 0 per read.
            if !head_scan::worth_parsing(buf, &mut busy.head_scanned, max_header) {
                return None;
            }
            let step = match request::parse(buf, max_header) {
                Ok(Some(req)) => {
                    let x =
                        Exchange::new(&mut busy.out, &mut self.requests, &mut self.server, from);
                    let next = dispatch::answer(x, svc, &req, &buf[..req.head_len]);
                    Ok(Some((req.head_len, next)))
                }
                Ok(None) => Ok(None),
                Err(e) => Err(e),
            };
            match step {
                Ok(Some((_, Next::File(job)))) => {
                    // The head stays in the input: answered once the file is in.
                    busy.file_wait = Some(job);
                    svc.files.wait(job, key);
                    self.phase = Phase::FileWait;
                    return None;
                }
                Ok(Some((_, Next::CacheWait))) => {
                    // The head stays in the input: dispatched again when the
                    // deadline (`CACHE_WAIT_POLL`) passes.
                    self.phase = Phase::CacheWait;
                    return None;
                }
                Ok(Some((head_len, next))) => {
                    busy.consume(head_len);
                    match next {
                        Next::Continue => continue,
                        Next::Body(pending) => {
                            busy.body = Some(pending);
                            busy.rate = RateWindow::starting(svc.clock.now_us);
                            self.phase = Phase::ReadBody;
                            return None;
                        }
                        Next::Finish(after) => return Some(after),
                        Next::Proxy(p) => {
                            busy.proxy = Some(p);
                            self.phase = Phase::Proxy;
                            return None;
                        }
                        Next::Reject(e) => {
                            self.reject(svc, e.status(), e);
                            return Some(After::Linger);
                        }
                        Next::File(_) | Next::CacheWait => unreachable!("matched above"),
                    }
                }
                Ok(None) => {
                    // Make room at the end of the buffer for the rest of the head.
                    busy.compact();
                    return None;
                }
                Err(e) => {
                    self.reject(svc, e.status(), e);
                    return Some(After::Linger);
                }
            }
        }
    }

    /// Consumes body bytes from the input buffer. When the body is complete, answers
    /// the request (`Some` if the connection then closes).
    pub(super) fn discard_body(&mut self, svc: &mut Services) -> Option<After> {
        let from = self.origin();
        let busy = self.busy.as_deref_mut()?;
        let pending = busy.body.as_mut()?;
        let server = pending.server;
        let available = &busy.inbuf[busy.in_start..busy.in_end];
        let (used, done) = match &mut pending.body {
            Body::Length(remaining) => {
                let used = (*remaining).min(available.len() as u64);
                *remaining -= used;
                (used as usize, *remaining == 0)
            }
            Body::Chunked(decoder) => match decoder.decode(available) {
                Ok(used) => (used, decoder.is_done()),
                Err(e) => {
                    let status = e.status();
                    busy.body = None;
                    busy.discard_input(); // the rest cannot be trusted
                    self.phase = Phase::ReadHead;
                    self.simple_error(svc, status, server);
                    return Some(After::Linger);
                }
            },
        };
        busy.consume(used);
        if !done {
            return None;
        }
        let head = busy.body.take().expect("checked above").head;
        self.phase = Phase::ReadHead;
        match request::parse(&head, head.len()) {
            Ok(Some(req)) => {
                let x = Exchange::new(&mut busy.out, &mut self.requests, &mut self.server, from);
                dispatch::answer_after_body(x, svc, &req, &head, server)
            }
            // It parsed before being copied; parsing it again cannot fail.
            _ => Some(After::Close),
        }
    }
}

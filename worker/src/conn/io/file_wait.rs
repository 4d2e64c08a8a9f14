//! A request waiting for the file pool (`Phase::FileWait`): its head stays at the
//! input's start until the job it waits for is done, then it is answered with what
//! the job found and the connection reads on. The loop drives the connection when
//! the job comes back (`EventLoop::files_done`); meanwhile the answers queued before
//! it are written, and nothing more is read.

use super::*;

impl Conn {
    /// The file came: answers the waiting request (`Some(Some(after))` if the
    /// connection then closes, `Some(None)` to read on). `None`: still waiting.
    pub(super) fn file_arrived(&mut self, svc: &mut Services) -> Option<Option<After>> {
        let from = self.origin();
        let busy = self.busy.as_deref_mut()?;
        let job = busy.file_wait?;
        if !svc.files.arrived(job) {
            return None;
        }
        busy.file_wait = None;
        self.phase = Phase::ReadHead;
        let max_header = svc.routing[usize::from(self.listener)].max_header_bytes;
        let buf = &busy.inbuf[busy.in_start..busy.in_end];
        let (head_len, after) = match request::parse(buf, max_header) {
            Ok(Some(req)) => {
                let x = Exchange::new(&mut busy.out, &mut self.requests, &mut self.server, from);
                let head = &buf[..req.head_len];
                (
                    req.head_len,
                    dispatch::answer_after_file(x, svc, &req, head, job),
                )
            }
            // It parsed when it was dispatched, and the input was not touched since.
            _ => (busy.in_end - busy.in_start, Some(After::Close)),
        };
        busy.consume(head_len);
        Some(after)
    }
}

//! `Return(status, body, content_type)`: a fixed answer from memory, for any method.

use super::reply::{Outcome, Reply};
use crate::http::response::{self, Status};

/// What a `Return` route answers.
pub struct Fixed<'a> {
    pub status: u16,
    pub body: &'a [u8],
    pub content_type: &'a str,
}

pub fn serve(fixed: &Fixed, reply: &mut Reply) -> Outcome {
    let status = Status(fixed.status);
    let out = reply.out.bytes();
    response::start(out, status, reply.date);
    // RFC 9110 §8.6 / §15.3.5: a 204 has no content and no Content-Length.
    let no_content = fixed.status == 204 || fixed.status == 304;
    if !no_content {
        response::header(out, "Content-Type", fixed.content_type.as_bytes());
        response::content_length(out, fixed.body.len() as u64);
    }
    response::finish_with(out, reply.site.headers, reply.persistence);
    let body_bytes = if reply.head_only || no_content {
        0
    } else {
        out.extend_from_slice(fixed.body);
        fixed.body.len() as u64
    };
    Outcome {
        status,
        body_bytes,
        logged: true,
    }
}

//! Access logs in nginx's `combined` format, buffered per worker.
//!
//! ```text
//! 127.0.0.1 - - [29/Nov/2026:22:10:00 +0000] "GET /a.html HTTP/1.1" 200 1024 "-" "curl/8.0"
//! ```
//!
//! Lines are appended to a buffer per destination and written when it fills, at least
//! once a second, and when the worker exits, so logging costs no syscall per request.
//! Each worker opens the file itself with `O_APPEND`, so lines from workers never
//! interleave mid-line.

use forkd_shared::config::{LogTarget, Server};
use std::fs::File;
use std::io::{self, Write};
use std::net::IpAddr;

/// Flush a destination's buffer once it holds this much.
const FLUSH_AT: usize = 64 * 1024;

enum Writer {
    Stderr,
    Stdout,
    File(File),
    Syslog(Box<forkd_shared::log::SyslogLogger>),
}

struct Sink {
    target: LogTarget,
    writer: Writer,
    buf: Vec<u8>,
}

/// Every access log this worker writes, and which server writes to which.
pub struct AccessLogs {
    sinks: Vec<Sink>,
    by_server: Vec<Option<usize>>,
}

/// One request, as the access log needs it.
pub struct Entry<'a> {
    pub peer: IpAddr,
    pub method: &'a str,
    pub target: &'a [u8],
    pub http10: bool,
    pub status: u16,
    pub body_bytes: u64,
    pub referer: Option<&'a [u8]>,
    pub user_agent: Option<&'a [u8]>,
}

fn open_writer(target: &LogTarget) -> io::Result<Writer> {
    Ok(match target {
        LogTarget::Stderr => Writer::Stderr,
        LogTarget::Stdout => Writer::Stdout,
        LogTarget::File(path) => Writer::File(forkd_shared::log::open_append(path)?),
        LogTarget::Syslog => Writer::Syslog(forkd_shared::log::syslog_logger()?),
    })
}

impl AccessLogs {
    /// Opens each distinct destination once.
    pub fn open(servers: &[Server]) -> io::Result<AccessLogs> {
        let mut sinks: Vec<Sink> = Vec::new();
        let mut by_server = Vec::with_capacity(servers.len());
        for server in servers {
            let Some(target) = &server.access_log else {
                by_server.push(None);
                continue;
            };
            let index = match sinks.iter().position(|s| &s.target == target) {
                Some(i) => i,
                None => {
                    sinks.push(Sink {
                        target: target.clone(),
                        writer: open_writer(target)?,
                        buf: Vec::new(),
                    });
                    sinks.len() - 1
                }
            };
            by_server.push(Some(index));
        }
        Ok(AccessLogs { sinks, by_server })
    }

    /// Whether `server` logs requests (so callers can skip building an entry).
    pub fn enabled(&self, server: usize) -> bool {
        self.by_server.get(server).is_some_and(Option::is_some)
    }

    /// Appends one line for `server`.
    pub fn record(&mut self, server: usize, entry: &Entry, time: &[u8]) {
        let Some(Some(index)) = self.by_server.get(server) else {
            return;
        };
        let sink = &mut self.sinks[*index];
        format_line(&mut sink.buf, entry, time);
        if sink.buf.len() >= FLUSH_AT {
            flush_sink(sink);
        }
    }

    /// Writes out every buffered line.
    pub fn flush(&mut self) {
        for sink in &mut self.sinks {
            flush_sink(sink);
        }
    }

    /// Flushes, then re-opens the files (after logrotate moved them).
    pub fn reopen(&mut self) {
        self.flush();
        for sink in &mut self.sinks {
            if let LogTarget::File(path) = &sink.target {
                match open_writer(&sink.target) {
                    Ok(w) => sink.writer = w,
                    Err(e) => {
                        forkd_shared::error!("reopening access log {} failed: {e}", path.display())
                    }
                }
            }
        }
    }
}

fn flush_sink(sink: &mut Sink) {
    if sink.buf.is_empty() {
        return;
    }
    let result = match &mut sink.writer {
        Writer::Stderr => io::stderr().write_all(&sink.buf),
        Writer::Stdout => io::stdout().write_all(&sink.buf),
        Writer::File(f) => f.write_all(&sink.buf),
        Writer::Syslog(logger) => {
            let mut r = Ok(());
            for line in sink.buf.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
                if let Err(e) = logger.info(String::from_utf8_lossy(line)) {
                    r = Err(io::Error::other(e.to_string()));
                }
            }
            r
        }
    };
    if let Err(e) = result {
        forkd_shared::error!(
            "writing the access log failed, {} bytes lost: {e}",
            sink.buf.len()
        );
    }
    sink.buf.clear();
}

/// `$remote_addr - - [$time_local] "$request" $status $body_bytes_sent "$http_referer" "$http_user_agent"`
pub fn format_line(out: &mut Vec<u8>, e: &Entry, time: &[u8]) {
    use std::io::Write as _;
    let _ = write!(out, "{} - - [", e.peer);
    out.extend_from_slice(time);
    out.extend_from_slice(b"] \"");
    if e.target.is_empty() {
        // No request line could be read (400, 408): nginx writes "-" too.
        out.extend_from_slice(b"-\" ");
    } else {
        escape(out, e.method.as_bytes());
        out.push(b' ');
        escape(out, e.target);
        out.extend_from_slice(if e.http10 {
            b" HTTP/1.0\" "
        } else {
            b" HTTP/1.1\" "
        });
    }
    let _ = write!(out, "{} {} \"", e.status, e.body_bytes);
    escape(out, e.referer.unwrap_or(b"-"));
    out.extend_from_slice(b"\" \"");
    escape(out, e.user_agent.unwrap_or(b"-"));
    out.extend_from_slice(b"\"\n");
}

/// nginx's escaping: `"`, `\`, control and non-ASCII bytes as `\xHH`.
fn escape(out: &mut Vec<u8>, value: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in value {
        if !(0x20..0x7f).contains(&b) || b == b'"' || b == b'\\' {
            out.extend_from_slice(&[b'\\', b'x', HEX[(b >> 4) as usize], HEX[(b & 15) as usize]]);
        } else {
            out.push(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_that_could_not_be_read_is_logged_as_dash() {
        let mut out = Vec::new();
        let e = Entry {
            peer: "127.0.0.1".parse().unwrap(),
            method: "-",
            target: b"",
            http10: false,
            status: 408,
            body_bytes: 95,
            referer: None,
            user_agent: None,
        };
        format_line(&mut out, &e, b"29/Nov/2026:22:10:00 +0000");
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "127.0.0.1 - - [29/Nov/2026:22:10:00 +0000] \"-\" 408 95 \"-\" \"-\"\n"
        );
    }

    #[test]
    fn combined_format_with_escaping() {
        let mut out = Vec::new();
        let e = Entry {
            peer: "127.0.0.1".parse().unwrap(),
            method: "GET",
            target: b"/a\"b",
            http10: false,
            status: 200,
            body_bytes: 1024,
            referer: None,
            user_agent: Some(b"curl/8.0 \x01"),
        };
        format_line(&mut out, &e, b"29/Nov/2026:22:10:00 +0000");
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "127.0.0.1 - - [29/Nov/2026:22:10:00 +0000] \"GET /a\\x22b HTTP/1.1\" 200 1024 \"-\" \"curl/8.0 \\x01\"\n"
        );
    }
}

//! Access logs, buffered per worker, in nginx's `combined` format (the default) or
//! as one JSON object per line (`access_log_format: Json`):
//!
//! ```text
//! 127.0.0.1 - - [29/Nov/2026:22:10:00 +0000] "GET /a.html HTTP/1.1" 200 1024 "-" "curl/8.0"
//! {"time":"2026-11-29T22:10:00Z","client":"127.0.0.1","method":"GET","target":"/a.html",
//!  "protocol":"HTTP/1.1","status":200,"bytes":1024,"request_time":0.000151,
//!  "request_id":null,"referer":null,"user_agent":"curl/8.0"}
//! ```
//!
//! JSON: `request_time` in seconds (from the request's first byte to its response
//! being queued); `request_id` null unless the request has one (the proxy's
//! `X-Request-Id`); for proxied requests also `upstream_addr`, `upstream_status`
//! (null: no response head), `upstream_response_time` (seconds from the request
//! going upstream to the response read whole: with buffering, the application's
//! time without the client's), `upstream_header_time` (seconds to the head) and
//! `upstream_connect` (`"new"` or `"reused"`), as nginx's variables of those names. Strings are escaped by serde_json;
//! bytes that are not UTF-8 are written as the text `\xHH`, as the combined format
//! writes them, so nothing is lost or replaced.
//!
//! Lines are appended to a buffer per destination and written when it fills, at least
//! once a second, and when the worker exits, so logging costs no syscall per request.
//! Each worker opens the file itself with `O_APPEND`, so lines from workers never
//! interleave mid-line.

use crate::http::request::{Request, Version};
use forkd_shared::config::{AccessLogFormat, LogTarget, Server};
use serde::Serialize;
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
    formats: Vec<AccessLogFormat>,
}

/// One request, as the access log needs it.
pub struct Entry<'a> {
    pub peer: IpAddr,
    pub method: &'a str,
    pub target: &'a [u8],
    pub version: Version,
    pub status: u16,
    pub body_bytes: u64,
    pub referer: Option<&'a [u8]>,
    pub user_agent: Option<&'a [u8]>,
    /// Microseconds from the request's first byte to its response being queued.
    pub request_time_us: Option<u64>,
    /// The request's id (`X-Request-Id`), when it has one.
    pub request_id: Option<&'a [u8]>,
    /// For a proxied request: the upstream exchange (filled in by the proxy).
    pub upstream: Option<UpstreamEntry<'a>>,
    /// On a cached route: what the cache did (`HIT`, `MISS`, `STALE`,
    /// `REVALIDATED`, `BYPASS`).
    pub cache: Option<&'static str>,
}

/// What an entry says of its request: the request line's parts, `Referer` and
/// `User-Agent`, as the client sent them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLine<'a> {
    pub method: &'a str,
    pub target: &'a [u8],
    pub version: Version,
    pub referer: Option<&'a [u8]>,
    pub user_agent: Option<&'a [u8]>,
}

impl<'a> RequestLine<'a> {
    pub fn of(req: &Request<'a>) -> RequestLine<'a> {
        RequestLine {
            method: req.method_name,
            target: req.target,
            version: req.version,
            referer: req.referer,
            user_agent: req.user_agent,
        }
    }

    /// A `HEAD` request: its answer has no body.
    pub fn is_head(&self) -> bool {
        self.method == "HEAD"
    }
}

/// A [`RequestLine`] kept past the buffer its head was read into (a proxied exchange
/// outlives it): its bytes in one allocation.
#[derive(Debug, Clone)]
pub struct KeptLine {
    /// The method, the target, `Referer` and `User-Agent`, one after the other.
    bytes: Box<[u8]>,
    /// Where the method, the target and `Referer` end in `bytes`.
    ends: [usize; 3],
    referer: bool,
    user_agent: bool,
    version: Version,
}

impl KeptLine {
    pub fn new(line: RequestLine) -> KeptLine {
        let referer = line.referer.unwrap_or_default();
        let user_agent = line.user_agent.unwrap_or_default();
        let mut bytes = Vec::with_capacity(
            line.method.len() + line.target.len() + referer.len() + user_agent.len(),
        );
        let mut ends = [0; 3];
        for (end, part) in ends
            .iter_mut()
            .zip([line.method.as_bytes(), line.target, referer])
        {
            bytes.extend_from_slice(part);
            *end = bytes.len();
        }
        bytes.extend_from_slice(user_agent);
        KeptLine {
            bytes: bytes.into_boxed_slice(),
            ends,
            referer: line.referer.is_some(),
            user_agent: line.user_agent.is_some(),
            version: line.version,
        }
    }

    pub fn line(&self) -> RequestLine<'_> {
        let [method, target, referer] = self.ends;
        RequestLine {
            // Copied from a `&str`: always UTF-8.
            method: std::str::from_utf8(&self.bytes[..method]).unwrap_or("-"),
            target: &self.bytes[method..target],
            version: self.version,
            referer: self.referer.then(|| &self.bytes[target..referer]),
            user_agent: self.user_agent.then(|| &self.bytes[referer..]),
        }
    }
}

/// The upstream part of a proxied request's entry (JSON format only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpstreamEntry<'a> {
    /// The server's label (its address as written in the configuration).
    pub addr: &'a str,
    /// The final response head's status; None if none arrived (502, 504).
    pub status: Option<u16>,
    /// Microseconds from sending the request to the response head.
    pub response_time_us: Option<u64>,
    /// Microseconds to the upstream's response head.
    pub header_time_us: Option<u64>,
    pub connect: UpstreamConnect,
}

/// Whether the upstream connection was opened for the request or reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum UpstreamConnect {
    New,
    Reused,
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
        let mut logs = AccessLogs {
            sinks,
            by_server,
            formats: Vec::new(),
        };
        logs.set_formats(servers);
        Ok(logs)
    }

    /// Takes the servers' `access_log_format`s (a reload that changes only formats
    /// keeps the open files).
    pub fn set_formats(&mut self, servers: &[Server]) {
        self.formats = servers.iter().map(|s| s.access_log_format).collect();
    }

    /// Whether `server` logs requests (so callers can skip building an entry).
    pub fn enabled(&self, server: usize) -> bool {
        self.by_server.get(server).is_some_and(Option::is_some)
    }

    /// Appends one line for `server`; `time`: the cached combined-format time,
    /// `unix_secs` the same second (for the JSON format's time).
    pub fn record(&mut self, server: usize, entry: &Entry, time: &[u8], unix_secs: u64) {
        let Some(Some(index)) = self.by_server.get(server) else {
            return;
        };
        let sink = &mut self.sinks[*index];
        match self.formats.get(server).copied().unwrap_or_default() {
            AccessLogFormat::Combined => format_line(&mut sink.buf, entry, time),
            AccessLogFormat::Json => format_json(&mut sink.buf, entry, unix_secs),
        }
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
        out.push(b' ');
        out.extend_from_slice(e.version.name().as_bytes());
        out.extend_from_slice(b"\" ");
    }
    let _ = write!(out, "{} {} \"", e.status, e.body_bytes);
    escape(out, e.referer.unwrap_or(b"-"));
    out.extend_from_slice(b"\" \"");
    escape(out, e.user_agent.unwrap_or(b"-"));
    out.extend_from_slice(b"\"\n");
}

/// One JSON object and a newline (see the module's doc for the fields).
pub fn format_json(out: &mut Vec<u8>, e: &Entry, unix_secs: u64) {
    let text = |b: &[u8]| -> String {
        let mut s = String::with_capacity(b.len());
        for chunk in b.utf8_chunks() {
            s.push_str(chunk.valid());
            for byte in chunk.invalid() {
                s.push_str(&format!("\\x{byte:02X}"));
            }
        }
        s
    };
    let seconds = |us: u64| us as f64 / 1e6;
    let line = JsonLine {
        time: iso8601(unix_secs),
        client: e.peer,
        method: (!e.target.is_empty()).then_some(e.method),
        target: (!e.target.is_empty()).then(|| text(e.target)),
        protocol: (!e.target.is_empty()).then_some(e.version.name()),
        status: e.status,
        bytes: e.body_bytes,
        request_time: e.request_time_us.map(seconds),
        request_id: e.request_id.map(text),
        referer: e.referer.map(text),
        user_agent: e.user_agent.map(text),
        upstream_addr: e.upstream.map(|u| u.addr),
        upstream_status: e.upstream.map(|u| u.status),
        upstream_response_time: e.upstream.map(|u| u.response_time_us.map(seconds)),
        upstream_header_time: e.upstream.map(|u| u.header_time_us.map(seconds)),
        upstream_connect: e.upstream.map(|u| u.connect),
        cache: e.cache,
    };
    // Plain fields, strings and numbers: serialising cannot fail.
    serde_json::to_writer(&mut *out, &line).expect("an access-log entry serialises");
    out.push(b'\n');
}

#[derive(Serialize)]
struct JsonLine<'a> {
    time: String,
    client: IpAddr,
    /// null when no request line could be read (400, 408).
    method: Option<&'a str>,
    target: Option<String>,
    protocol: Option<&'a str>,
    status: u16,
    bytes: u64,
    request_time: Option<f64>,
    request_id: Option<String>,
    referer: Option<String>,
    user_agent: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream_addr: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream_status: Option<Option<u16>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream_response_time: Option<Option<f64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream_header_time: Option<Option<f64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream_connect: Option<UpstreamConnect>,
    /// nginx's `$upstream_cache_status`, on cached routes.
    #[serde(skip_serializing_if = "Option::is_none")]
    cache: Option<&'a str>,
}

/// `unix_secs` as `YYYY-MM-DDTHH:MM:SSZ` (UTC).
fn iso8601(unix_secs: u64) -> String {
    let rem = unix_secs % 86_400;
    let (year, month, day) = forkd_shared::log::civil_from_days((unix_secs / 86_400) as i64);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
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
    fn a_kept_line_gives_back_the_line_it_kept() {
        let lines = [
            RequestLine {
                method: "GET",
                target: b"/a?b=1",
                version: Version::Http11,
                referer: Some(b"http://r/"),
                user_agent: Some(b"ua/1"),
            },
            RequestLine {
                method: "PROPFIND",
                target: b"*",
                version: Version::Http10,
                referer: None,
                user_agent: Some(b""),
            },
            RequestLine {
                method: "HEAD",
                target: b"/",
                version: Version::Http11,
                referer: Some(b""),
                user_agent: None,
            },
        ];
        for line in lines {
            assert_eq!(KeptLine::new(line).line(), line);
        }
        assert!(lines[2].is_head() && !lines[0].is_head());
    }

    #[test]
    fn an_http2_stream_is_logged_as_http_2_0_in_both_formats() {
        let e = Entry {
            peer: "127.0.0.1".parse().unwrap(),
            method: "GET",
            target: b"/a",
            version: Version::Http2,
            status: 200,
            body_bytes: 5,
            referer: None,
            user_agent: Some(b"h2load"),
            request_time_us: None,
            request_id: None,
            upstream: None,
            cache: None,
        };
        let mut out = Vec::new();
        format_line(&mut out, &e, b"29/Nov/2026:22:10:00 +0000");
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "127.0.0.1 - - [29/Nov/2026:22:10:00 +0000] \"GET /a HTTP/2.0\" 200 5 \"-\" \"h2load\"\n"
        );
        let mut out = Vec::new();
        format_json(&mut out, &e, 0);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["protocol"], "HTTP/2.0");
    }

    #[test]
    fn a_request_that_could_not_be_read_is_logged_as_dash() {
        let mut out = Vec::new();
        let e = Entry {
            peer: "127.0.0.1".parse().unwrap(),
            method: "-",
            target: b"",
            version: Version::Http11,
            status: 408,
            body_bytes: 95,
            referer: None,
            user_agent: None,
            request_time_us: None,
            request_id: None,
            upstream: None,
            cache: None,
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
            version: Version::Http11,
            status: 200,
            body_bytes: 1024,
            referer: None,
            user_agent: Some(b"curl/8.0 \x01"),
            request_time_us: None,
            request_id: None,
            upstream: None,
            cache: None,
        };
        format_line(&mut out, &e, b"29/Nov/2026:22:10:00 +0000");
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "127.0.0.1 - - [29/Nov/2026:22:10:00 +0000] \"GET /a\\x22b HTTP/1.1\" 200 1024 \"-\" \"curl/8.0 \\x01\"\n"
        );
    }

    fn json(e: &Entry) -> serde_json::Value {
        let mut out = Vec::new();
        format_json(&mut out, e, 1_795_990_200); // 2026-11-29T22:10:00Z
        assert_eq!(out.iter().filter(|&&b| b == b'\n').count(), 1, "one line");
        assert_eq!(out.last(), Some(&b'\n'));
        serde_json::from_slice(&out).expect("a JSON object")
    }

    fn entry<'a>(target: &'a [u8], user_agent: Option<&'a [u8]>) -> Entry<'a> {
        Entry {
            peer: "::1".parse().unwrap(),
            method: "GET",
            target,
            version: Version::Http10,
            status: 200,
            body_bytes: 12,
            referer: None,
            user_agent,
            request_time_us: Some(1500),
            request_id: None,
            upstream: None,
            cache: None,
        }
    }

    #[test]
    fn json_has_the_fields_and_no_upstream_part_for_a_static_request() {
        let v = json(&entry(b"/a.html", Some(b"curl/8.0")));
        assert_eq!(v["time"], "2026-11-29T22:10:00Z");
        assert_eq!(v["client"], "::1");
        assert_eq!(v["method"], "GET");
        assert_eq!(v["target"], "/a.html");
        assert_eq!(v["protocol"], "HTTP/1.0");
        assert_eq!(v["status"], 200);
        assert_eq!(v["bytes"], 12);
        assert_eq!(v["request_time"], 0.0015);
        assert!(v["request_id"].is_null() && v.get("request_id").is_some());
        assert_eq!(v["user_agent"], "curl/8.0");
        assert!(v.get("upstream_addr").is_none());
        assert!(v.get("upstream_connect").is_none());
    }

    #[test]
    fn json_escapes_quotes_controls_newlines_and_bytes_that_are_not_utf8() {
        let target: &[u8] = b"/a\"b\\c\n{\"x\":1}\x00\xff\xfe/\xc3\xa9";
        let ua: &[u8] = b"evil\"}\n{\"status\":999, \x1b[31m";
        let mut out = Vec::new();
        format_json(&mut out, &entry(target, Some(ua)), 0);
        let v = json(&entry(target, Some(ua)));
        assert_eq!(v["target"], "/a\"b\\c\n{\"x\":1}\u{0}\\xFF\\xFE/é");
        assert_eq!(v["user_agent"], "evil\"}\n{\"status\":999, \u{1b}[31m");
        assert_eq!(v["status"], 200, "a user agent cannot inject fields");
        assert!(!out[..out.len() - 1].contains(&b'\n'));
    }

    #[test]
    fn json_of_a_proxied_request_has_the_upstream_part() {
        let mut e = entry(b"/api/x", None);
        e.request_id = Some(b"abc-123");
        e.upstream = Some(UpstreamEntry {
            addr: "unix:/run/app.sock",
            status: Some(503),
            response_time_us: Some(2_000_000),
            header_time_us: Some(500_000),
            connect: UpstreamConnect::Reused,
        });
        let v = json(&e);
        assert_eq!(v["request_id"], "abc-123");
        assert_eq!(v["upstream_addr"], "unix:/run/app.sock");
        assert_eq!(v["upstream_status"], 503);
        assert_eq!(v["upstream_response_time"], 2.0);
        assert_eq!(v["upstream_header_time"], 0.5);
        assert_eq!(v["upstream_connect"], "reused");
        e.upstream = Some(UpstreamEntry {
            addr: "127.0.0.1:9000",
            status: None,
            response_time_us: None,
            header_time_us: None,
            connect: UpstreamConnect::New,
        });
        let v = json(&e);
        assert!(v["upstream_status"].is_null() && v.get("upstream_status").is_some());
        assert_eq!(v["upstream_connect"], "new");
    }

    #[test]
    fn json_of_a_request_that_could_not_be_read() {
        let mut e = entry(b"", None);
        e.status = 408;
        let v = json(&e);
        assert!(v["method"].is_null() && v["target"].is_null());
        assert_eq!(v["status"], 408);
    }

    #[test]
    fn iso8601_dates() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00Z");
        assert_eq!(iso8601(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(iso8601(1_795_990_200), "2026-11-29T22:10:00Z");
        assert_eq!(iso8601(4_107_542_399), "2100-02-28T23:59:59Z");
    }
}

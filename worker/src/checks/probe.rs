//! One active health check: a `GET` of the check path over a new connection, with
//! blocking sockets bounded by the check's `timeout` (it runs on the checks thread,
//! never on the event loop). The head is parsed with httparse; the body is not read.

use forkd_shared::config::HealthCheck;
use forkd_shared::shm::health::{CheckError, Outcome};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// Where a check connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target<'a> {
    Tcp(SocketAddr),
    Unix(&'a Path),
}

/// The request a check sends: `Connection: close`, so the server ends it.
pub fn request(check: &HealthCheck, label: &str) -> Vec<u8> {
    let host = check.host.as_deref().unwrap_or(label);
    format!(
        "GET {} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: forkd-health-check\r\nAccept: */*\r\nConnection: close\r\n\r\n",
        check.path
    )
    .into_bytes()
}

/// Runs one check against `target`.
pub fn run(target: &Target, check: &HealthCheck, request: &[u8]) -> Outcome {
    let deadline = Instant::now() + check.timeout;
    let fail = |error| Outcome {
        status: None,
        error: Some(error),
    };
    let result = match target {
        Target::Tcp(addr) => match TcpStream::connect_timeout(addr, check.timeout) {
            Ok(s) => exchange(s, deadline, request),
            Err(e) if e.kind() == io::ErrorKind::TimedOut => return fail(CheckError::Timeout),
            Err(_) => return fail(CheckError::Connect),
        },
        Target::Unix(path) => match UnixStream::connect(path) {
            Ok(s) => exchange(s, deadline, request),
            Err(_) => return fail(CheckError::Connect),
        },
    };
    match result {
        Ok(status) if (check.expect_status.0..=check.expect_status.1).contains(&status) => {
            Outcome {
                status: Some(status),
                error: None,
            }
        }
        Ok(status) => Outcome {
            status: Some(status),
            error: Some(CheckError::Status),
        },
        Err(e) => fail(e),
    }
}

/// A connected socket with per-call timeouts.
trait Timed: Read + Write {
    fn set_timeouts(&self, t: Duration) -> io::Result<()>;
}

impl Timed for TcpStream {
    fn set_timeouts(&self, t: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(t))?;
        self.set_write_timeout(Some(t))
    }
}

impl Timed for UnixStream {
    fn set_timeouts(&self, t: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(t))?;
        self.set_write_timeout(Some(t))
    }
}

/// Writes the request and reads until a complete final response head (a `1xx`
/// head is skipped); its status.
fn exchange(mut s: impl Timed, deadline: Instant, request: &[u8]) -> Result<u16, CheckError> {
    let left = |deadline: Instant| {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or(CheckError::Timeout)
    };
    let timed_out = |e: &io::Error| {
        matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        )
    };
    s.set_timeouts(left(deadline)?)
        .map_err(|_| CheckError::Connect)?;
    match s.write_all(request) {
        Ok(()) => {}
        Err(e) if timed_out(&e) => return Err(CheckError::Timeout),
        Err(_) => return Err(CheckError::Closed),
    }
    let mut buf = vec![0u8; 4096];
    let mut len = 0;
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut head = httparse::Response::new(&mut headers);
        match head.parse(&buf[..len]) {
            Ok(httparse::Status::Complete(end)) => {
                let status = head.code.ok_or(CheckError::BadResponse)?;
                if (100..200).contains(&status) && status != 101 {
                    buf.copy_within(end..len, 0);
                    len -= end;
                    continue;
                }
                return Ok(status);
            }
            Ok(httparse::Status::Partial) if len < buf.len() => {}
            Ok(httparse::Status::Partial) | Err(_) => return Err(CheckError::BadResponse),
        }
        s.set_timeouts(left(deadline)?)
            .map_err(|_| CheckError::Closed)?;
        match s.read(&mut buf[len..]) {
            Ok(0) => return Err(CheckError::Closed),
            Ok(n) => len += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if timed_out(&e) => return Err(CheckError::Timeout),
            Err(_) => return Err(CheckError::Closed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn check(timeout_ms: u64) -> HealthCheck {
        HealthCheck {
            path: "/healthz".into(),
            host: None,
            interval: Duration::from_secs(1),
            timeout: Duration::from_millis(timeout_ms),
            rise: 2,
            fall: 3,
            expect_status: (200, 399),
        }
    }

    /// A one-connection server answering `answer` (None: reads and never answers).
    fn serve(answer: Option<&'static [u8]>) -> (SocketAddr, std::thread::JoinHandle<Vec<u8>>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut got = vec![0u8; 1024];
            let n = s.read(&mut got).unwrap();
            got.truncate(n);
            match answer {
                Some(a) => s.write_all(a).unwrap(),
                None => std::thread::sleep(Duration::from_millis(500)),
            }
            got
        });
        (addr, t)
    }

    #[test]
    fn a_status_in_range_passes_and_one_outside_fails_with_it() {
        let c = check(2000);
        let req = request(&c, "app:9000");
        let (addr, t) = serve(Some(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
        ));
        let out = run(&Target::Tcp(addr), &c, &req);
        assert_eq!(
            out,
            Outcome {
                status: Some(204),
                error: None
            }
        );
        let sent = String::from_utf8(t.join().unwrap()).unwrap();
        assert!(
            sent.starts_with("GET /healthz HTTP/1.1\r\nHost: app:9000\r\n"),
            "{sent}"
        );
        let (addr, _t) = serve(Some(b"HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n"));
        let out = run(&Target::Tcp(addr), &c, &req);
        assert_eq!(
            out,
            Outcome {
                status: Some(500),
                error: Some(CheckError::Status)
            }
        );
    }

    #[test]
    fn the_check_request_names_the_host_configured_or_the_server() {
        let mut c = check(100);
        let req = String::from_utf8(request(&c, "10.0.0.1:9000")).unwrap();
        assert!(
            req.starts_with("GET /healthz HTTP/1.1\r\nHost: 10.0.0.1:9000\r\n"),
            "{req}"
        );
        assert!(req.ends_with("Connection: close\r\n\r\n"), "{req}");
        c.host = Some("app.example".into());
        let req = String::from_utf8(request(&c, "10.0.0.1:9000")).unwrap();
        assert!(req.contains("\r\nHost: app.example\r\n"), "{req}");
    }

    #[test]
    fn silence_is_a_timeout_garbage_a_bad_response_and_nobody_a_connect_error() {
        let c = check(100);
        let req = request(&c, "x");
        let (addr, _t) = serve(None);
        assert_eq!(
            run(&Target::Tcp(addr), &c, &req).error,
            Some(CheckError::Timeout)
        );
        let (addr, _t) = serve(Some(b"SSH-2.0-OpenSSH\r\n\r\n"));
        assert_eq!(
            run(&Target::Tcp(addr), &c, &req).error,
            Some(CheckError::BadResponse)
        );
        let closed = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        assert_eq!(
            run(&Target::Tcp(closed), &c, &req).error,
            Some(CheckError::Connect)
        );
    }
}

//! The kernel's TCP counters the master publishes (`/proc/net/netstat`), read through
//! one descriptor held for the master's lifetime: opening the file on every loop turn
//! would show the master's descriptor set changing from one moment to the next.

use std::fs::File;
use std::os::unix::fs::FileExt;

const PATH: &str = "/proc/net/netstat";

pub struct Netstat {
    file: Option<File>,
    buf: Vec<u8>,
}

impl Netstat {
    /// Opens the file (close-on-exec); without it, nothing is published.
    pub fn open() -> Netstat {
        let file = File::open(PATH);
        if let Err(e) = &file {
            forkd_shared::warn!("cannot open {PATH}: {e}; listen overflows are not published");
        }
        Netstat {
            file: file.ok(),
            buf: Vec::with_capacity(8192),
        }
    }

    /// `TcpExt: ListenOverflows` now.
    pub fn listen_overflows(&mut self) -> Option<u64> {
        let file = self.file.as_ref()?;
        self.buf.clear();
        let mut chunk = [0u8; 4096];
        loop {
            // procfs regenerates the text when read from offset 0.
            match file.read_at(&mut chunk, self.buf.len() as u64) {
                Ok(0) => break,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => return None,
            }
        }
        listen_overflows(std::str::from_utf8(&self.buf).ok()?)
    }
}

/// `ListenOverflows` from the text of `/proc/net/netstat` (pairs of lines: names, values).
fn listen_overflows(text: &str) -> Option<u64> {
    let mut lines = text.lines();
    while let Some(names) = lines.next() {
        let values = lines.next()?;
        if !names.starts_with("TcpExt:") {
            continue;
        }
        let i = names
            .split_whitespace()
            .position(|n| n == "ListenOverflows")?;
        return values.split_whitespace().nth(i)?.parse().ok();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_listen_overflows_in_the_tcpext_pair() {
        let text = "TcpExt: SyncookiesSent ListenOverflows ListenDrops\n\
                    TcpExt: 0 17 19\n\
                    IpExt: InNoRoutes\n\
                    IpExt: 3\n";
        assert_eq!(listen_overflows(text), Some(17));
        assert_eq!(listen_overflows("IpExt: A\nIpExt: 1\n"), None);
    }

    #[test]
    fn reads_the_live_file_twice_through_one_descriptor() {
        let mut netstat = Netstat::open();
        assert!(netstat.listen_overflows().is_some());
        assert!(netstat.listen_overflows().is_some());
    }
}

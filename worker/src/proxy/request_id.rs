//! `X-Request-Id` values: unique per worker without coordination.
//!
//! An id is 32 lower-case hex digits: the worker's pid (8), the low 32 bits of the
//! Unix time it started at (8), and a per-worker counter (16). The pid tells workers
//! apart, the start time tells apart two processes that had the same pid, the counter
//! tells apart requests. Making one is a counter increment and 16 hex digits.

/// The longest client-sent `X-Request-Id` forwarded as is; a longer one is replaced.
pub const MAX_CLIENT_ID: usize = 200;

#[derive(Debug, Clone)]
pub struct RequestIds {
    prefix: [u8; 16],
    counter: u64,
}

impl RequestIds {
    /// Ids for the process `pid`, started at `start_unix_secs`.
    pub fn new(pid: u32, start_unix_secs: u64) -> RequestIds {
        let mut prefix = [0u8; 16];
        write_hex(&mut prefix[..8], u64::from(pid));
        write_hex(&mut prefix[8..], start_unix_secs & 0xffff_ffff);
        RequestIds { prefix, counter: 0 }
    }

    /// Ids for this process, started now.
    pub fn for_this_process() -> RequestIds {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        RequestIds::new(std::process::id(), now)
    }

    /// Appends the next id (32 bytes) to `out`.
    pub fn push_next(&mut self, out: &mut Vec<u8>) {
        self.counter = self.counter.wrapping_add(1);
        let mut id = [0u8; 32];
        id[..16].copy_from_slice(&self.prefix);
        write_hex(&mut id[16..], self.counter);
        out.extend_from_slice(&id);
    }
}

/// Whether a client's `X-Request-Id` may be forwarded as is: visible ASCII, not empty,
/// not too long (it ends up in logs and in other servers' heads).
pub fn acceptable(value: &[u8]) -> bool {
    !value.is_empty() && value.len() <= MAX_CLIENT_ID && value.iter().all(|b| b.is_ascii_graphic())
}

/// Writes `n` as exactly `out.len()` hex digits (the low bits of `n`).
fn write_hex(out: &mut [u8], mut n: u64) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for slot in out.iter_mut().rev() {
        *slot = HEX[(n & 15) as usize];
        n >>= 4;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_carry_pid_start_and_counter() {
        let mut ids = RequestIds::new(0x1234, 0x1_6000_0001);
        let mut out = Vec::new();
        ids.push_next(&mut out);
        ids.push_next(&mut out);
        assert_eq!(
            out,
            b"0000123460000001000000000000000100001234600000010000000000000002"
        );
    }

    #[test]
    fn two_workers_never_make_the_same_id() {
        let (mut a, mut b) = (RequestIds::new(10, 5), RequestIds::new(11, 5));
        let mut seen = std::collections::HashSet::new();
        for _ in 0..1000 {
            let (mut x, mut y) = (Vec::new(), Vec::new());
            a.push_next(&mut x);
            b.push_next(&mut y);
            assert!(seen.insert(x) && seen.insert(y));
        }
    }

    #[test]
    fn only_plain_client_ids_are_kept() {
        assert!(acceptable(b"abc-123"));
        assert!(!acceptable(b""));
        assert!(!acceptable(b"a b"));
        assert!(!acceptable(b"a\x01"));
        assert!(!acceptable(&[b'a'; MAX_CLIENT_ID + 1]));
    }
}

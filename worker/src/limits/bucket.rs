//! The token bucket, as GCRA (the generic cell rate algorithm): the whole state is one
//! number, the theoretical arrival time (TAT) of the next request at the sustained
//! rate, so a bucket fits one atomic and is updated with one compare-and-swap.
//!
//! A request at `now` is admitted when `max(tat, now) + interval <= now + burst ×
//! interval`, and then `tat` becomes the left side: `burst` requests pass at once from
//! a full bucket, then one per `interval`. A rejection leaves `tat` alone (refused
//! requests do not dig the hole deeper), and the excess is exactly the wait until the
//! next token.

/// The outcome of asking for one token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Take {
    /// Admitted: store `tat`.
    Admit { tat: u64 },
    /// Over the rate: the next token comes in `retry_after_us`.
    Over { retry_after_us: u64 },
}

/// One token at `now` (µs) from the bucket whose state is `tat` (0: full), refilled
/// one token per `interval_us`, holding `burst`.
pub fn take(tat: u64, now: u64, interval_us: u64, burst: u32) -> Take {
    let next = tat.max(now).saturating_add(interval_us);
    let allowed = now.saturating_add(interval_us.saturating_mul(u64::from(burst)));
    if next <= allowed {
        Take::Admit { tat: next }
    } else {
        Take::Over {
            retry_after_us: next - allowed,
        }
    }
}

/// `Retry-After` in whole seconds, rounded up (at least 1: 0 would invite a retry now).
pub fn retry_after_secs(us: u64) -> u64 {
    us.div_ceil(1_000_000).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs requests at the given times against one bucket; returns how many passed.
    fn admitted(times: &[u64], interval: u64, burst: u32) -> usize {
        let mut tat = 0;
        let mut n = 0;
        for &t in times {
            if let Take::Admit { tat: next } = take(tat, t, interval, burst) {
                tat = next;
                n += 1;
            }
        }
        n
    }

    #[test]
    fn a_full_bucket_admits_the_burst_at_once_then_nothing() {
        let t0 = 1_000_000_000;
        assert_eq!(admitted(&[t0; 100], 1_000_000, 10), 10);
    }

    #[test]
    fn then_one_per_interval() {
        let t0 = 1_000_000_000;
        // 1/s, burst 10: 10 at once, then one more for each second that passes.
        let times: Vec<u64> = (0..1000).map(|i| t0 + i * 10_000).collect(); // 10 s
        assert_eq!(admitted(&times, 1_000_000, 10), 10 + 9);
    }

    #[test]
    fn retry_after_is_the_wait_until_the_next_token() {
        let t0 = 5_000_000;
        let mut tat = 0;
        for _ in 0..2 {
            match take(tat, t0, 1_000_000, 2) {
                Take::Admit { tat: t } => tat = t,
                Take::Over { .. } => panic!("within the burst"),
            }
        }
        assert_eq!(
            take(tat, t0 + 250_000, 1_000_000, 2),
            Take::Over {
                retry_after_us: 750_000
            }
        );
        assert!(matches!(
            take(tat, t0 + 1_000_000, 1_000_000, 2),
            Take::Admit { .. }
        ));
        assert_eq!(retry_after_secs(750_000), 1);
        assert_eq!(retry_after_secs(1_000_001), 2);
        assert_eq!(retry_after_secs(0), 1);
    }

    #[test]
    fn a_rejection_does_not_consume() {
        let t0 = 5_000_000;
        let Take::Admit { tat } = take(0, t0, 1_000_000, 1) else {
            panic!()
        };
        for i in 0..50 {
            assert!(matches!(take(tat, t0 + i, 1_000_000, 1), Take::Over { .. }));
        }
        assert!(matches!(
            take(tat, t0 + 1_000_000, 1_000_000, 1),
            Take::Admit { .. }
        ));
    }

    #[test]
    fn an_idle_bucket_refills_to_the_burst_and_no_more() {
        let t0 = 5_000_000;
        let mut times = vec![t0; 3];
        times.extend([t0 + 3_600_000_000; 20]);
        assert_eq!(admitted(&times, 1_000_000, 3), 3 + 3);
    }
}

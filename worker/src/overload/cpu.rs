//! The worker's CPU use over each sample period, from `getrusage(RUSAGE_SELF)`
//! deltas (a worker is one thread, so the process's time is the worker's).

use nix::sys::resource::{getrusage, UsageWho};

#[derive(Debug, Default)]
pub struct CpuMeter {
    /// CPU µs (user + system) and the clock's µs at the last reading.
    last: Option<(u64, u64)>,
}

/// CPU time used by this process so far, µs.
fn cpu_us() -> Option<u64> {
    let u = getrusage(UsageWho::RUSAGE_SELF).ok()?;
    let us = |t: nix::sys::time::TimeVal| t.tv_sec() as u64 * 1_000_000 + t.tv_usec() as u64;
    Some(us(u.user_time()) + us(u.system_time()))
}

impl CpuMeter {
    /// The share of one CPU used since the last call (None the first time).
    pub fn read(&mut self, now_us: u64) -> Option<f64> {
        let cpu = cpu_us()?;
        let share = share(self.last, (cpu, now_us));
        self.last = Some((cpu, now_us));
        share
    }
}

/// CPU µs over wall µs between two readings.
fn share(before: Option<(u64, u64)>, now: (u64, u64)) -> Option<f64> {
    let (cpu0, t0) = before?;
    let wall = now.1.checked_sub(t0).filter(|&w| w > 0)?;
    Some(now.0.saturating_sub(cpu0) as f64 / wall as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_share_is_cpu_time_over_wall_time() {
        assert_eq!(share(None, (5, 5)), None);
        assert_eq!(share(Some((1000, 0)), (81_000, 100_000)), Some(0.8));
        assert_eq!(share(Some((0, 10)), (0, 10)), None);
        let mut m = CpuMeter::default();
        assert_eq!(m.read(0), None);
        let spin = std::time::Instant::now();
        while spin.elapsed() < std::time::Duration::from_millis(20) {}
        let s = m.read(spin.elapsed().as_micros() as u64).unwrap();
        assert!(s > 0.0, "{s}");
    }
}

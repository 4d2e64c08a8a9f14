//! The worker's clock: one reading per loop turn, and the textual dates that change
//! once a second (`Date` header, access-log time) formatted only when they change.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

pub struct Clock {
    /// Monotonic time of this loop turn.
    pub now: Instant,
    /// The same, in microseconds since the worker started: connection deadlines are
    /// measured in it (see `timers.rs`).
    pub now_us: u64,
    origin: Instant,
    /// `CLOCK_MONOTONIC` in microseconds at `origin` (the clock `Instant` reads).
    origin_mono_us: u64,
    /// Wall-clock seconds since the epoch of this loop turn.
    pub unix_secs: u64,
    /// `now_us` when the wall clock's second next changes: turns before it do not
    /// read the wall clock (a step of the wall clock is seen at that moment).
    wall_check_us: u64,
    http_date: [u8; 29],
    log_time: [u8; 26],
}

/// `CLOCK_MONOTONIC` in microseconds: one read, no `Instant` arithmetic (a loop turn
/// and each precise time of an exchange read it).
fn monotonic_us() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |t| {
        t.tv_sec() as u64 * 1_000_000 + t.tv_nsec() as u64 / 1_000
    })
}

impl Clock {
    pub fn new() -> Clock {
        let origin = Instant::now();
        let mut clock = Clock {
            now: origin,
            now_us: 0,
            origin,
            origin_mono_us: monotonic_us(),
            unix_secs: u64::MAX,
            wall_check_us: 0,
            http_date: [b' '; 29],
            log_time: [b' '; 26],
        };
        clock.tick();
        clock
    }

    /// Reads the clocks; reformats the dates when the second changed.
    /// Returns true when a new second started.
    pub fn tick(&mut self) -> bool {
        self.now_us = self.precise_us();
        self.now = self.instant(self.now_us);
        if self.now_us < self.wall_check_us {
            return false;
        }
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        self.wall_check_us = self.now_us + 1_000_000 - u64::from(wall.subsec_micros());
        let secs = wall.as_secs();
        if secs == self.unix_secs {
            return false;
        }
        self.unix_secs = secs;
        let date = httpdate::fmt_http_date(UNIX_EPOCH + std::time::Duration::from_secs(secs));
        self.http_date.copy_from_slice(&date.as_bytes()[..29]);
        self.log_time
            .copy_from_slice(format_log_time(secs).as_bytes());
        true
    }

    /// `at` in microseconds since the worker started.
    pub fn micros(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.origin).as_micros() as u64
    }

    /// Microseconds since the worker started, read now (not at the loop turn).
    pub fn precise_us(&self) -> u64 {
        monotonic_us().saturating_sub(self.origin_mono_us)
    }

    /// The `Instant` of a time in microseconds since the worker started.
    pub fn instant(&self, us: u64) -> Instant {
        self.origin + std::time::Duration::from_micros(us)
    }

    /// `Sun, 29 Nov 2026 22:10:00 GMT`
    pub fn http_date(&self) -> &[u8] {
        &self.http_date
    }

    /// The same, by value-friendly array reference.
    pub fn http_date_array(&self) -> &[u8; 29] {
        &self.http_date
    }

    /// `29/Nov/2026:22:10:00 +0000` (nginx's `$time_local`, in UTC).
    pub fn log_time(&self) -> &[u8] {
        &self.log_time
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

fn format_log_time(secs: u64) -> String {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let (y, m, d) = forkd_shared::log::civil_from_days((secs / 86400) as i64);
    let rem = secs % 86400;
    format!(
        "{d:02}/{}/{y:04}:{:02}:{:02}:{:02} +0000",
        MONTHS[(m - 1) as usize],
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_time_format() {
        assert_eq!(
            format_log_time(20_786 * 86400 + 3661),
            "29/Nov/2026:01:01:01 +0000"
        );
    }

    #[test]
    fn turns_follow_the_monotonic_clock_and_the_wall_clock_second() {
        let mut c = Clock::new();
        let before = c.now_us;
        let unix = c.unix_secs;
        std::thread::sleep(std::time::Duration::from_millis(1100));
        assert!(c.tick(), "a new second started");
        assert!(c.now_us >= before + 1_100_000);
        assert!(c.unix_secs > unix);
        assert_eq!(
            c.micros(c.now),
            c.now_us,
            "the instant and the microseconds agree"
        );
    }

    #[test]
    fn dates_are_filled() {
        let c = Clock::new();
        assert!(c.http_date().ends_with(b" GMT"));
        assert_eq!(c.log_time().len(), 26);
    }
}

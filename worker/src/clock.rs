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
    /// Wall-clock seconds since the epoch of this loop turn.
    pub unix_secs: u64,
    http_date: [u8; 29],
    log_time: [u8; 26],
}

impl Clock {
    pub fn new() -> Clock {
        let origin = Instant::now();
        let mut clock = Clock {
            now: origin,
            now_us: 0,
            origin,
            unix_secs: u64::MAX,
            http_date: [b' '; 29],
            log_time: [b' '; 26],
        };
        clock.tick();
        clock
    }

    /// Reads the clocks; reformats the dates when the second changed.
    /// Returns true when a new second started.
    pub fn tick(&mut self) -> bool {
        self.now = Instant::now();
        self.now_us = self.micros(self.now);
        let wall = SystemTime::now();
        let secs = wall.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
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
        self.micros(Instant::now())
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
    fn dates_are_filled() {
        let c = Clock::new();
        assert!(c.http_date().ends_with(b" GMT"));
        assert_eq!(c.log_time().len(), 26);
    }
}

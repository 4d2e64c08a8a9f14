//! Dates as a client expects them, computed without the server's own date code: the
//! IMF-fixdate of `Date` and `Last-Modified` (RFC 9110 §5.6.7) and the access log's
//! `$time_local`.

use std::time::{SystemTime, UNIX_EPOCH};

pub fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];
const WEEKDAYS: [&str; 7] = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];

/// The UTC calendar fields of a Unix time.
struct Civil {
    year: i64,
    /// 1..=12
    month: usize,
    day: i64,
    /// 0 = Sunday
    weekday: usize,
    hour: i64,
    minute: i64,
    second: i64,
}

/// H. Hinnant's `civil_from_days`, written out here so the expectations do not borrow
/// the server's own date code.
impl Civil {
    /// `HH:MM:SS`.
    fn clock(&self) -> String {
        format!("{:02}:{:02}:{:02}", self.hour, self.minute, self.second)
    }
}

fn civil(secs: i64) -> Civil {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    Civil {
        year: yoe + era * 400 + i64::from(month <= 2),
        month: month as usize,
        day,
        // 1970-01-01 was a Thursday.
        weekday: (days + 4).rem_euclid(7) as usize,
        hour: rem / 3600,
        minute: rem / 60 % 60,
        second: rem % 60,
    }
}

/// RFC 9110 IMF-fixdate: `Sun, 06 Nov 1994 08:49:37 GMT`.
pub fn http_date(secs: i64) -> String {
    let c = civil(secs);
    let (day, month) = (WEEKDAYS[c.weekday], MONTHS[c.month - 1]);
    format!(
        "{day}, {:02} {month} {:04} {} GMT",
        c.day,
        c.year,
        c.clock()
    )
}

/// nginx's `$time_local` in UTC: `29/Nov/2026:22:10:00 +0000`.
pub fn log_time(secs: i64) -> String {
    let c = civil(secs);
    let month = MONTHS[c.month - 1];
    format!("{:02}/{month}/{:04}:{} +0000", c.day, c.year, c.clock())
}

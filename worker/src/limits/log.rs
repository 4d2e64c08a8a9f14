//! The throttled log line of limits (and of refused PROXY protocol headers): at most
//! one a second per worker, with a count of the lines held back. Held by the
//! worker's services, written by `admit` and the accept path.

use crate::timers::Micros;

/// At most one log line about limits per worker this often: an attack must not turn
/// into a flood of the error log.
const LOG_EVERY_US: Micros = 1_000_000;

/// Per-worker state of the limits: when the next log line may be written, and lines
/// held back since the last.
#[derive(Debug, Default)]
pub struct LimitLog {
    next_at: Micros,
    suppressed: u64,
}

impl LimitLog {
    /// Logs `line` unless a line was logged less than a second ago (then counts it).
    pub fn note(&mut self, now: Micros, line: impl FnOnce() -> String) {
        if now < self.next_at {
            self.suppressed += 1;
            return;
        }
        let held = std::mem::take(&mut self.suppressed);
        if held > 0 {
            forkd_shared::info!("{} ({held} more since the last such line)", line());
        } else {
            forkd_shared::info!("{}", line());
        }
        self.next_at = now + LOG_EVERY_US;
    }
}

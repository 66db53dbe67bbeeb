//! The live one-line progress display: on standard error, once a second,
//! only when standard error is a terminal and `--quiet` is not given.

use std::io::Write;
use std::time::{Duration, Instant};

/// The progress line.
#[derive(Debug)]
pub struct Progress {
    enabled: bool,
    label: String,
    last_print: Option<Instant>,
    last_completed: u64,
    shown: bool,
}

/// Whether standard error is a terminal.
pub fn stderr_is_tty() -> bool {
    // SAFETY: isatty only inspects the descriptor.
    unsafe { libc::isatty(libc::STDERR_FILENO) == 1 }
}

impl Progress {
    /// A display labelled `label`, shown when `enabled`.
    pub fn new(label: String, enabled: bool) -> Self {
        Progress {
            enabled,
            label,
            last_print: None,
            last_completed: 0,
            shown: false,
        }
    }

    /// A display that never shows.
    pub fn disabled() -> Self {
        Self::new(String::new(), false)
    }

    /// Reports `completed` operations (warm-up included) and `errors` at
    /// `now` of a run that started at `t0`; prints at most once a second.
    pub fn update(
        &mut self,
        now: Instant,
        t0: Instant,
        warmup: Duration,
        completed: u64,
        errors: u64,
    ) {
        if !self.enabled {
            return;
        }
        let since = self.last_print.unwrap_or(t0);
        let dt = now.saturating_duration_since(since);
        if dt < Duration::from_secs(1) {
            return;
        }
        let rate = completed.saturating_sub(self.last_completed) as f64 / dt.as_secs_f64();
        let el = now.saturating_duration_since(t0);
        let phase = if el < warmup { "warm-up" } else { "measuring" };
        let mut err = std::io::stderr().lock();
        let _ = write!(
            err,
            "\r\x1b[2K{} {:>6.1} s {phase}: {completed} ops, {rate:.0} ops/s, {errors} errors",
            self.label,
            el.as_secs_f64()
        );
        let _ = err.flush();
        self.shown = true;
        self.last_print = Some(now);
        self.last_completed = completed;
    }

    /// Clears the line, if one was shown.
    pub fn finish(&mut self) {
        if self.shown {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
            self.shown = false;
        }
    }
}

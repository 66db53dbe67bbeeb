//! Operator log lines on stderr, filtered by `--log-level`. Only the control
//! plane logs (workers report events over their rings), so logging never
//! touches the I/O path.

use std::sync::atomic::{AtomicU8, Ordering};

/// Severity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Something failed.
    Error = 0,
    /// A peer misbehaved or a limit was hit.
    Warn = 1,
    /// Normal events (connections closing).
    Info = 2,
}

static LEVEL: AtomicU8 = AtomicU8::new(Level::Info as u8);

/// Sets the most verbose level printed.
pub fn set_level(l: Level) {
    LEVEL.store(l as u8, Ordering::Relaxed);
}

/// Parses `error`, `warn` or `info`.
pub fn parse_level(s: &str) -> Option<Level> {
    match s {
        "error" => Some(Level::Error),
        "warn" | "warning" => Some(Level::Warn),
        "info" => Some(Level::Info),
        _ => None,
    }
}

/// Whether `l` is printed.
pub fn enabled(l: Level) -> bool {
    (l as u8) <= LEVEL.load(Ordering::Relaxed)
}

/// Prints a line at `level` (prefer the macros).
pub fn log(level: Level, args: std::fmt::Arguments<'_>) {
    if enabled(level) {
        let tag = match level {
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
        };
        eprintln!("smbdirectd: {tag}: {args}");
    }
}

/// Logs at warn.
#[macro_export]
macro_rules! warn {
    ($($t:tt)*) => { $crate::log::log($crate::log::Level::Warn, format_args!($($t)*)) };
}

/// Logs at info.
#[macro_export]
macro_rules! info {
    ($($t:tt)*) => { $crate::log::log($crate::log::Level::Info, format_args!($($t)*)) };
}

/// Logs at error.
#[macro_export]
macro_rules! error {
    ($($t:tt)*) => { $crate::log::log($crate::log::Level::Error, format_args!($($t)*)) };
}

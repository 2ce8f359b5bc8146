//! Logging of the shim, to stderr: `VGPU_LOG=debug` traces every call,
//! `VGPU_LOG=off` silences even the warnings (the default shows warnings, such
//! as why `cuInit` could not reach vgpud).

use std::sync::OnceLock;

/// Log levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Nothing.
    Off,
    /// Problems the user should know about.
    Warn,
    /// Every call and its result.
    Debug,
}

/// The level from `VGPU_LOG`.
pub fn level() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(|| match std::env::var("VGPU_LOG").as_deref() {
        Ok("debug") | Ok("trace") => Level::Debug,
        Ok("off") | Ok("none") | Ok("0") => Level::Off,
        _ => Level::Warn,
    })
}

/// Logs at debug level.
#[macro_export]
macro_rules! debug {
    ($($t:tt)*) => {
        if $crate::log::level() >= $crate::log::Level::Debug {
            eprintln!("vgpu[{}]: {}", std::process::id(), format_args!($($t)*));
        }
    };
}

/// Logs at warn level, and keeps the warning in CUDA's error log ([`crate::logs`]).
#[macro_export]
macro_rules! warn {
    ($($t:tt)*) => {{
        let text = format!($($t)*);
        if $crate::log::level() >= $crate::log::Level::Warn {
            eprintln!("vgpu[{}]: {}", std::process::id(), text);
        }
        $crate::logs::warning(text);
    }};
}

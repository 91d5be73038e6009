//! Test-only crash points: `BANLIEUE_CRASH_AT=<point>` aborts the process at that named step,
//! so crash-safety tests can prove that every intermediate state is one the next run completes
//! (the controller's bind and release, a provider between defining and starting a domain).
//! Unset, each check is one cached environment lookup.

use std::sync::OnceLock;

/// The environment variable naming the crash point.
pub const CRASH_AT_ENV: &str = "BANLIEUE_CRASH_AT";

/// Aborts the process when `BANLIEUE_CRASH_AT` is `point`. `abort` rather than `exit`: no
/// destructor, no flush, no graceful shutdown, as with SIGKILL.
pub fn crash_at(point: &str) {
    static SELECTED: OnceLock<Option<String>> = OnceLock::new();
    let selected = SELECTED.get_or_init(|| std::env::var(CRASH_AT_ENV).ok());
    if selected.as_deref() == Some(point) {
        eprintln!("{CRASH_AT_ENV}={point}: aborting");
        std::process::abort();
    }
}

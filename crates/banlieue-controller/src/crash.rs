//! Test-only crash points: `BANLIEUE_CRASH_AT=<point>` aborts the process at that step of a
//! bind or a release, so crash-safety tests can prove that every intermediate state is one the
//! next controller run completes. Unset, each check is one cached environment lookup.

use std::sync::OnceLock;

/// The environment variable naming the crash point.
pub const CRASH_AT_ENV: &str = "BANLIEUE_CRASH_AT";

/// Steps of a bind and a release where a process may die.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashPoint {
    /// The member carries the claim, the claim's status does not say Bound yet.
    AfterMemberPatch,
    /// The claim's status says Bound; nothing after it (events) has happened.
    AfterClaimStatus,
    /// The claim's status says Releasing; the member has not been deleted yet.
    AfterReleasingStatus,
    /// The member's deletion was requested; the claim still holds its finalizer.
    AfterMemberDelete,
}

impl CrashPoint {
    /// Every point, for tests that iterate over them.
    pub const ALL: [CrashPoint; 4] = [
        CrashPoint::AfterMemberPatch,
        CrashPoint::AfterClaimStatus,
        CrashPoint::AfterReleasingStatus,
        CrashPoint::AfterMemberDelete,
    ];

    /// The value of `BANLIEUE_CRASH_AT` that selects this point.
    pub fn name(self) -> &'static str {
        match self {
            CrashPoint::AfterMemberPatch => "after-member-patch",
            CrashPoint::AfterClaimStatus => "after-claim-status",
            CrashPoint::AfterReleasingStatus => "after-releasing-status",
            CrashPoint::AfterMemberDelete => "after-member-delete",
        }
    }
}

/// Aborts the process when `BANLIEUE_CRASH_AT` names `point`. `abort` rather than `exit`:
/// no destructor, no flush, no graceful shutdown, as with SIGKILL.
pub(crate) fn crash_at(point: CrashPoint) {
    static SELECTED: OnceLock<Option<String>> = OnceLock::new();
    let selected = SELECTED.get_or_init(|| std::env::var(CRASH_AT_ENV).ok());
    if selected.as_deref() == Some(point.name()) {
        eprintln!("{CRASH_AT_ENV}={}: aborting", point.name());
        std::process::abort();
    }
}

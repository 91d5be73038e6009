//! The controller's crash points ([`banlieue_runtime::crash`]): the steps of a bind or a
//! release where a process may die.

pub use banlieue_runtime::crash::CRASH_AT_ENV;

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

/// Aborts the process when `BANLIEUE_CRASH_AT` names `point`.
pub(crate) fn crash_at(point: CrashPoint) {
    banlieue_runtime::crash::crash_at(point.name());
}

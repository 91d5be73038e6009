//! What a claim does next (pure): which member to take, how its phase may move, and the words
//! of its Bound condition.

use std::cmp::Ordering;
use std::time::Duration;

use banlieue_api::conditions::{self, reasons, types};
use banlieue_api::{
    ClaimPhase, Standby, VirtualMachine, VirtualMachineClaim, VirtualMachineClaimStatus,
    VirtualMachinePool,
};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;

use crate::hosts::HostState;
use crate::member::MemberView;

/// Orders candidates for a bind: current revision first, then longest available (the member
/// closest to idle expiry), then name so the choice is deterministic.
pub fn bind_order(current_revision: &str, a: &MemberView, b: &MemberView) -> Ordering {
    let stale = |m: &MemberView| m.revision.as_deref() != Some(current_revision);
    stale(a)
        .cmp(&stale(b))
        .then_with(|| match (a.available_since, b.available_since) {
            (Some(x), Some(y)) => x.cmp(&y),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => Ordering::Equal,
        })
        .then_with(|| a.name.cmp(&b.name))
}

/// The members a claim may take, best first: available, not being deleted, not skipped
/// (reserved by another bind in flight or already tried).
pub fn candidates<'a>(
    members: &'a [MemberView],
    current_revision: &str,
    skip: impl Fn(&str) -> bool,
) -> Vec<&'a MemberView> {
    let mut list: Vec<&MemberView> = members
        .iter()
        .filter(|m| m.available && !m.deleting && !m.failed && !skip(&m.name))
        .collect();
    list.sort_by(|a, b| bind_order(current_revision, a, b));
    list
}

fn rank(phase: Option<ClaimPhase>) -> u8 {
    match phase {
        None => 0,
        Some(ClaimPhase::Pending) => 1,
        Some(ClaimPhase::Bound) => 2,
        Some(ClaimPhase::Releasing) | Some(ClaimPhase::Failed) => 3,
    }
}

/// The phase after proposing `proposed` to a claim in `current`. Nothing moves backwards, and
/// Failed and Releasing are final: a claim never leaves them for another phase.
pub fn advance(current: Option<ClaimPhase>, proposed: ClaimPhase) -> Option<ClaimPhase> {
    match current {
        Some(ClaimPhase::Failed) | Some(ClaimPhase::Releasing) => current,
        // Failed only follows Bound: a claim that never held a member cannot lose it.
        Some(ClaimPhase::Pending) | None if proposed == ClaimPhase::Failed => current,
        _ if rank(Some(proposed)) >= rank(current) => Some(proposed),
        _ => current,
    }
}

/// The claim's deadline: `bound_at + ttl_seconds`, saturating at the latest representable time.
/// The CRD caps ttlSeconds, but a claim stored before the cap (or written past it) must never
/// have its sum overflow into "expires now", which would destroy a sandbox at bind.
pub fn expires_at(bound_at: Timestamp, ttl_seconds: i64) -> Timestamp {
    bound_at
        .checked_add(SignedDuration::from_secs(ttl_seconds.max(0)))
        .unwrap_or(Timestamp::MAX)
}

/// The message of `Bound=False, NoMemberAvailable`: the pool's own diagnosis in parentheses,
/// then how many unclaimed members are held back because their Provider is not Ready (the
/// pool's count may still include them: it is written on the pool's own schedule).
pub fn no_member_message(
    pool: &str,
    pool_reason: &str,
    pool_message: &str,
    on_unready_hosts: usize,
) -> String {
    let mut message =
        format!("no Ready, unclaimed member in pool {pool} (pool: {pool_reason}: {pool_message})");
    if on_unready_hosts > 0 {
        message.push_str(&format!(
            "; {on_unready_hosts} unclaimed member(s) on a Provider that is not Ready"
        ));
    }
    message
}

/// [`no_member_message`] for `pool` and its unclaimed `members`, quoting the pool's Ready
/// condition (or that it has not reported yet).
pub fn no_member_message_of(pool: &VirtualMachinePool, members: &[MemberView]) -> String {
    let (reason, message) = pool
        .status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, types::READY))
        .map_or((reasons::FILLING, "the pool has not reported yet"), |c| {
            (c.reason.as_str(), c.message.as_str())
        });
    no_member_message(&pool.name_any(), reason, message, on_unready_hosts(members))
}

/// How many of `members` are neither deleting nor failed but on a host that is not Ready.
pub fn on_unready_hosts(members: &[MemberView]) -> usize {
    members
        .iter()
        .filter(|m| !m.deleting && !m.failed && m.host != HostState::Ready)
        .count()
}

/// The least time between two status writes of one waiting claim that change only the count
/// its message quotes. A pool filling behind a burst writes its status every second with a new
/// count, and each waiting claim rewriting its own in step cost several writes per claim. A
/// change of meaning (the phase, the claim's reason, the pool's reason) is written at once.
pub const WAITING_COUNTS_INTERVAL: Duration = Duration::from_secs(10);

/// When a waiting claim's changed status should be written: `None` now, else after the delay.
/// Only a change of the pool's own message under the same pool reason waits, and only when
/// this process wrote the claim within [`WAITING_COUNTS_INTERVAL`].
pub fn waiting_write_delay(
    current: &VirtualMachineClaimStatus,
    next: &VirtualMachineClaimStatus,
    since_last_write: Option<Duration>,
) -> Option<Duration> {
    /// All but the quoted pool message of a waiting claim's status.
    fn waiting(
        s: &VirtualMachineClaimStatus,
    ) -> Option<(VirtualMachineClaimStatus, &str, Option<i64>, &str)> {
        let bound = conditions::find(&s.conditions, types::BOUND)?;
        if bound.reason != reasons::NO_MEMBER_AVAILABLE {
            return None;
        }
        let diagnosis = quoted_pool_reason(&bound.message)?;
        let mut rest = s.clone();
        rest.conditions.retain(|c| c.type_ != types::BOUND);
        Some((
            rest,
            bound.status.as_str(),
            bound.observed_generation,
            diagnosis,
        ))
    }
    let (before, after) = (waiting(current)?, waiting(next)?);
    if before != after || next.phase != Some(ClaimPhase::Pending) {
        return None;
    }
    WAITING_COUNTS_INTERVAL
        .checked_sub(since_last_write?)
        .filter(|rest| !rest.is_zero())
}

/// The pool reason a [`no_member_message`] quotes.
fn quoted_pool_reason(message: &str) -> Option<&str> {
    let (_, diagnosis) = message.split_once(" (pool: ")?;
    diagnosis.split_once(": ").map(|(reason, _)| reason)
}

/// The message of `Bound=False, PoolNotFound`.
pub fn pool_not_found_message(pool: &str) -> String {
    format!("pool {pool} does not exist")
}

/// Whether a claim found its member waiting: `warm` when it was bound without ever waiting (a
/// pool hit), `cold` when it first recorded that no member was available (a miss). Judged by
/// the claim's own status rather than by timestamps, which the API server keeps to the second.
pub fn start_of(status: &VirtualMachineClaimStatus) -> &'static str {
    let waited = conditions::find(&status.conditions, types::BOUND).is_some_and(|c| {
        c.status == conditions::status::FALSE && c.reason == reasons::NO_MEMBER_AVAILABLE
    });
    if waited {
        crate::metrics::START_COLD
    } else {
        crate::metrics::START_WARM
    }
}

/// The claim's `Resumed` condition for a member of a `standby: Saved` pool (ADR-0073): True
/// once its machine runs again for the spec the bind made; `None` for a member of any other
/// pool, whose claims carry no such condition.
pub fn resumed(member: &VirtualMachine, generation: Option<i64>) -> Option<conditions::Condition> {
    if member.spec.standby != Some(Standby::Saved) {
        return None;
    }
    let name = member.name_any();
    let reported = member.status.as_ref().and_then(|s| s.standby);
    let (state, reason, message) = match reported {
        Some(Standby::Running) => (
            conditions::status::TRUE,
            reasons::RESUMED,
            format!("member {name} runs"),
        ),
        Some(Standby::Saved) => (
            conditions::status::FALSE,
            reasons::RESUMING,
            format!("member {name} is saved; its provider restores it"),
        ),
        None => (
            conditions::status::FALSE,
            reasons::RESUMING,
            format!("member {name} is being restored"),
        ),
    };
    Some(conditions::new(
        types::RESUMED,
        state,
        reason,
        message,
        generation,
    ))
}

/// The challenge to copy to the bound `member`: the claim's `spec.handover` when the
/// member's differs. A claim that withdraws its challenge leaves the member's as it is: the
/// guest answered it already, or will, and nothing is gained by unsaying it.
pub fn handover_to_relay<'a>(
    claim: &'a VirtualMachineClaim,
    member: &VirtualMachine,
) -> Option<&'a banlieue_api::handover::HandoverChallenge> {
    let challenge = claim.spec.handover.as_ref()?;
    (member.spec.handover.as_ref() != Some(challenge)).then_some(challenge)
}

/// The claim's `AccessReady` condition: the member's, once its machine has the claim's keys
/// to install; `AccessPending` until then. `None` for a claim without `spec.access`.
pub fn access_ready(
    claim: &VirtualMachineClaim,
    member: &VirtualMachine,
) -> Option<conditions::Condition> {
    claim.spec.access.as_ref()?;
    let generation = claim.metadata.generation;
    let reported = member
        .status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, types::ACCESS_READY));
    // The member's condition speaks of the keys only once the bind gave it the claim's.
    let its_keys = member.spec.access == claim.spec.access;
    Some(match reported {
        Some(condition) if its_keys => conditions::new(
            types::ACCESS_READY,
            &condition.status,
            &condition.reason,
            conditions::bounded_message(condition.message.clone(), conditions::MAX_MESSAGE_BYTES),
            generation,
        ),
        _ => conditions::new(
            types::ACCESS_READY,
            conditions::status::FALSE,
            reasons::ACCESS_PENDING,
            format!(
                "member {} has not reported the keys installed yet",
                member.name_any()
            ),
            generation,
        ),
    })
}

/// The claims of `claim`'s subject on its pool that come before it under the pool's
/// `maxClaimsPerSubject`: those Bound, and those still waiting that were created earlier
/// (creation time, then name), so the subject's claims bind first created first served and
/// two reconciles of one subject's claims agree on which may bind. A claim being deleted,
/// Releasing or Failed holds nothing.
pub fn subject_claims_ahead<'a>(
    claim: &VirtualMachineClaim,
    others: impl IntoIterator<Item = &'a VirtualMachineClaim>,
) -> usize {
    let key = |c: &VirtualMachineClaim| {
        (
            c.metadata.creation_timestamp.as_ref().map(|t| t.0),
            c.name_any(),
        )
    };
    let mine = key(claim);
    others
        .into_iter()
        .filter(|other| {
            other.metadata.uid != claim.metadata.uid
                && other.metadata.namespace == claim.metadata.namespace
                && other.metadata.deletion_timestamp.is_none()
                && other.spec.pool_ref.name == claim.spec.pool_ref.name
                && other.spec.subject == claim.spec.subject
        })
        .filter(|other| match other.status.as_ref().and_then(|s| s.phase) {
            Some(ClaimPhase::Bound) => true,
            Some(ClaimPhase::Pending) | None => key(other) < mine,
            Some(ClaimPhase::Releasing) | Some(ClaimPhase::Failed) => false,
        })
        .count()
}

/// The message of `Bound=False, SubjectLimitReached`.
pub fn subject_limit_message(claim: &VirtualMachineClaim, ahead: usize, max: i32) -> String {
    format!(
        "subject {} at {} holds or waits for {ahead} claim(s) of pool {} before this one, and \
         the pool's maxClaimsPerSubject is {max}: this claim waits until one is released",
        claim.spec.subject.id, claim.spec.subject.issuer, claim.spec.pool_ref.name
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn subjects_claim(
        name: &str,
        subject: &str,
        pool: &str,
        created: i64,
        phase: Option<ClaimPhase>,
    ) -> VirtualMachineClaim {
        let mut claim: VirtualMachineClaim = serde_json::from_value(serde_json::json!({
            "apiVersion": "banlieue.io/v1alpha1",
            "kind": "VirtualMachineClaim",
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                         "creationTimestamp": Timestamp::from_second(1_800_000_000 + created)
                             .expect("valid time").to_string()},
            "spec": {"poolRef": {"name": pool},
                     "subject": {"issuer": "https://issuer.test", "id": subject},
                     "ttlSeconds": 600},
        }))
        .expect("a claim");
        claim.status = phase.map(|phase| VirtualMachineClaimStatus {
            phase: Some(phase),
            ..VirtualMachineClaimStatus::default()
        });
        claim
    }

    #[test]
    fn a_subjects_claims_bind_first_created_first_served() {
        let bound = subjects_claim("a", "alice", "p", 0, Some(ClaimPhase::Bound));
        let first = subjects_claim("b", "alice", "p", 5, Some(ClaimPhase::Pending));
        let second = subjects_claim("c", "alice", "p", 5, None);
        let all = [bound.clone(), first.clone(), second.clone()];
        // The bound claim is ahead of both; the earlier of two waiting ones (by name at the
        // same second) is ahead of the later, never the other way round.
        assert_eq!(subject_claims_ahead(&first, &all), 1);
        assert_eq!(subject_claims_ahead(&second, &all), 2);
        assert_eq!(subject_claims_ahead(&bound, &all), 0);
    }

    #[test]
    fn only_the_same_subject_on_the_same_pool_holding_a_member_counts() {
        let mine = subjects_claim("m", "alice", "p", 10, None);
        let mut deleting = subjects_claim("d", "alice", "p", 0, Some(ClaimPhase::Bound));
        deleting.metadata.deletion_timestamp = mine.metadata.creation_timestamp.clone();
        let others = [
            subjects_claim("x", "bob", "p", 0, Some(ClaimPhase::Bound)),
            subjects_claim("y", "alice", "q", 0, Some(ClaimPhase::Bound)),
            subjects_claim("z", "alice", "p", 0, Some(ClaimPhase::Releasing)),
            subjects_claim("f", "alice", "p", 0, Some(ClaimPhase::Failed)),
            deleting,
            mine.clone(),
        ];
        assert_eq!(subject_claims_ahead(&mine, &others), 0);
        let issuer = {
            let mut other = subjects_claim("i", "alice", "p", 0, Some(ClaimPhase::Bound));
            other.spec.subject.issuer = "https://elsewhere.test".into();
            other
        };
        assert_eq!(subject_claims_ahead(&mine, [&issuer]), 0);
        let same = subjects_claim("s", "alice", "p", 0, Some(ClaimPhase::Bound));
        assert_eq!(subject_claims_ahead(&mine, [&same]), 1);
        assert!(subject_limit_message(&mine, 1, 1).contains(
            "subject alice at https://issuer.test holds or waits for 1 claim(s) of pool p"
        ));
    }

    fn member(name: &str, revision: &str, since: Option<i64>) -> MemberView {
        MemberView {
            name: name.to_owned(),
            revision: Some(revision.to_owned()),
            created: None,
            available: since.is_some(),
            available_since: since
                .map(|s| Timestamp::from_second(1_800_000_000 + s).expect("valid time")),
            infrastructure_ready: since.is_some(),
            infrastructure_ready_since: None,
            running_since: None,
            published_guest_ready: false,
            deleting: false,
            failed: false,
            host: Default::default(),
            resource_version: None,
        }
    }

    #[test]
    fn members_held_back_by_their_host_are_counted_for_the_message() {
        let ready = member("a", "r1", Some(1));
        let unready = member("b", "r1", Some(1)).on_host(HostState::Unready);
        let mut gone = member("c", "r1", Some(1)).on_host(HostState::Unready);
        gone.deleting = true;
        assert_eq!(on_unready_hosts(&[ready.clone(), unready.clone(), gone]), 1);
        assert!(candidates(&[ready, unready], "r1", |_| false).len() == 1);
    }

    fn names(list: Vec<&MemberView>) -> Vec<&str> {
        list.into_iter().map(|m| m.name.as_str()).collect()
    }

    #[test]
    fn current_revision_then_longest_ready_then_name() {
        let members = vec![
            member("stale-oldest", "r1", Some(1)),
            member("fresh-b", "r2", Some(20)),
            member("fresh-a", "r2", Some(20)),
            member("fresh-old", "r2", Some(10)),
            member("not-ready", "r2", None),
        ];
        assert_eq!(
            names(candidates(&members, "r2", |_| false)),
            vec!["fresh-old", "fresh-a", "fresh-b", "stale-oldest"]
        );
    }

    #[test]
    fn a_stale_member_is_handed_out_when_nothing_fresher_is_ready() {
        let members = vec![member("stale", "r1", Some(1)), member("fresh", "r2", None)];
        assert_eq!(names(candidates(&members, "r2", |_| false)), vec!["stale"]);
    }

    #[test]
    fn held_deleting_and_failed_members_are_skipped() {
        let mut deleting = member("deleting", "r2", Some(1));
        deleting.deleting = true;
        let mut failed = member("failed", "r2", Some(1));
        failed.failed = true;
        let members = vec![
            deleting,
            failed,
            member("held", "r2", Some(1)),
            member("free", "r2", Some(2)),
        ];
        assert_eq!(
            names(candidates(&members, "r2", |n| n == "held")),
            vec!["free"]
        );
    }

    #[test]
    fn phases_never_move_backwards() {
        use ClaimPhase::*;
        assert_eq!(advance(None, Pending), Some(Pending));
        assert_eq!(advance(Some(Pending), Bound), Some(Bound));
        assert_eq!(advance(Some(Bound), Pending), Some(Bound));
        assert_eq!(advance(Some(Bound), Releasing), Some(Releasing));
        assert_eq!(advance(Some(Bound), Failed), Some(Failed));
        assert_eq!(advance(Some(Releasing), Bound), Some(Releasing));
        assert_eq!(advance(Some(Releasing), Pending), Some(Releasing));
        // Failed is terminal: never rebound, never released into another phase.
        for proposed in [Pending, Bound, Releasing] {
            assert_eq!(advance(Some(Failed), proposed), Some(Failed));
        }
        // A claim that never held a member cannot fail for losing it.
        assert_eq!(advance(Some(Pending), Failed), Some(Pending));
        assert_eq!(advance(Some(Pending), Releasing), Some(Releasing));
    }

    #[test]
    fn a_ttl_near_i64_max_does_not_expire_at_bind() {
        let bound_at = Timestamp::from_second(1_790_000_000).unwrap();
        for ttl in [i64::MAX, i64::MAX - 1, 1 << 40] {
            let deadline = expires_at(bound_at, ttl);
            assert_eq!(deadline, Timestamp::MAX, "{ttl}");
            assert!(deadline > bound_at);
        }
        assert_eq!(
            expires_at(bound_at, 900),
            Timestamp::from_second(1_790_000_900).unwrap()
        );
        assert_eq!(
            expires_at(bound_at, banlieue_api::pool::MAX_TTL_SECONDS),
            Timestamp::from_second(1_790_000_000 + banlieue_api::pool::MAX_TTL_SECONDS).unwrap()
        );
    }

    #[test]
    fn messages_embed_the_pool_diagnosis() {
        assert_eq!(
            no_member_message(
                "sandbox-pool",
                "ReadinessSignalAbsent",
                r#"no member has published the "GuestReady" condition"#,
                0
            ),
            r#"no Ready, unclaimed member in pool sandbox-pool (pool: ReadinessSignalAbsent: no member has published the "GuestReady" condition)"#
        );
        assert_eq!(
            no_member_message("p", "AtCapacity", "1/1 members available", 1),
            "no Ready, unclaimed member in pool p (pool: AtCapacity: 1/1 members available); \
             1 unclaimed member(s) on a Provider that is not Ready"
        );
        assert_eq!(
            pool_not_found_message("sandbox-pool"),
            "pool sandbox-pool does not exist"
        );
    }

    fn waiting(pool_reason: &str, pool_message: &str) -> VirtualMachineClaimStatus {
        VirtualMachineClaimStatus {
            phase: Some(ClaimPhase::Pending),
            conditions: vec![conditions::new(
                types::BOUND,
                conditions::status::FALSE,
                reasons::NO_MEMBER_AVAILABLE,
                no_member_message("p", pool_reason, pool_message, 0),
                Some(1),
            )],
            ..Default::default()
        }
    }

    #[test]
    fn a_waiting_claim_quotes_a_new_count_at_most_every_interval() {
        let before = waiting("Filling", "3 of 300 members available");
        let after = waiting("Filling", "4 of 300 members available");
        let recently = Some(Duration::from_secs(3));
        assert_eq!(
            waiting_write_delay(&before, &after, recently),
            Some(WAITING_COUNTS_INTERVAL - Duration::from_secs(3))
        );
        // Not written by this process lately (or ever, since it started): written now.
        assert_eq!(waiting_write_delay(&before, &after, None), None);
        assert_eq!(
            waiting_write_delay(&before, &after, Some(WAITING_COUNTS_INTERVAL)),
            None
        );
    }

    #[test]
    fn a_change_of_meaning_in_a_waiting_claim_is_written_at_once() {
        let recently = Some(Duration::from_millis(10));
        let filling = waiting("Filling", "3 of 300 members available");
        let never = waiting(
            "ReadinessSignalAbsent",
            r#"no member has published the "GuestReady" condition"#,
        );
        assert_eq!(waiting_write_delay(&filling, &never, recently), None);
        // The first wait, and a claim that is no longer waiting.
        assert_eq!(
            waiting_write_delay(&VirtualMachineClaimStatus::default(), &filling, recently),
            None
        );
        let mut gone = filling.clone();
        gone.conditions[0].reason = reasons::POOL_NOT_FOUND.to_owned();
        gone.conditions[0].message = pool_not_found_message("p");
        assert_eq!(waiting_write_delay(&filling, &gone, recently), None);
        // A new generation of the claim is a new spec to report on.
        let mut newer = waiting("Filling", "4 of 300 members available");
        newer.conditions[0].observed_generation = Some(2);
        assert_eq!(waiting_write_delay(&filling, &newer, recently), None);
        let mut bound = filling.clone();
        bound.phase = Some(ClaimPhase::Bound);
        assert_eq!(waiting_write_delay(&filling, &bound, recently), None);
    }

    #[test]
    fn the_quoted_pool_reason_is_read_back_from_the_message() {
        let message = no_member_message("a-pool", "Filling", "waiting: 3 of 5: soon", 2);
        assert_eq!(quoted_pool_reason(&message), Some("Filling"));
        assert_eq!(quoted_pool_reason(&pool_not_found_message("a-pool")), None);
        assert_eq!(quoted_pool_reason(""), None);
    }

    #[test]
    fn a_saved_pools_member_is_resumed_only_once_its_machine_runs_again() {
        let member = |spec: Option<Standby>, reported: Option<Standby>| {
            let mut vm: VirtualMachine = serde_json::from_value(serde_json::json!({
                "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
                "metadata": {"name": "web-abc", "namespace": "ns"},
                "spec": {"classRef": {"name": "small"}, "imageRef": {"name": "img"},
                         "storageClassName": "fast", "networkClassName": "prod"}
            }))
            .unwrap();
            vm.spec.standby = spec;
            vm.status = Some(banlieue_api::VirtualMachineStatus {
                standby: reported,
                ..Default::default()
            });
            vm
        };
        let saved = Some(Standby::Saved);
        let running = Some(Standby::Running);
        assert_eq!(resumed(&member(None, running), Some(1)), None);
        assert_eq!(resumed(&member(running, running), Some(1)), None);
        let of = |reported| resumed(&member(saved, reported), Some(4)).unwrap();
        assert_eq!(of(running).status, conditions::status::TRUE);
        assert_eq!(of(running).reason, reasons::RESUMED);
        assert_eq!(of(saved).status, conditions::status::FALSE);
        assert_eq!(of(saved).reason, reasons::RESUMING);
        assert_eq!(of(None).status, conditions::status::FALSE);
        assert_eq!(of(None).observed_generation, Some(4));
    }

    #[test]
    fn a_claim_is_cold_only_when_it_waited_for_a_member() {
        let at = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::UNIX_EPOCH);
        let mut status = VirtualMachineClaimStatus::default();
        assert_eq!(start_of(&status), crate::metrics::START_WARM);
        let waiting = |reason: &str| {
            conditions::new(types::BOUND, conditions::status::FALSE, reason, "", None)
        };
        conditions::set(
            &mut status.conditions,
            waiting(reasons::POOL_NOT_FOUND),
            at.clone(),
        );
        assert_eq!(start_of(&status), crate::metrics::START_WARM);
        conditions::set(
            &mut status.conditions,
            waiting(reasons::NO_MEMBER_AVAILABLE),
            at,
        );
        assert_eq!(start_of(&status), crate::metrics::START_COLD);
    }

    /// A member as the pool made it: no claim's keys or challenge yet.
    fn unbound_member() -> VirtualMachine {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
            "metadata": {"name": "web-abc", "namespace": "ns"},
            "spec": {"classRef": {"name": "small"}, "imageRef": {"name": "img"},
                     "storageClassName": "fast", "networkClassName": "prod"}
        }))
        .unwrap()
    }

    #[test]
    fn access_ready_is_the_members_once_it_holds_the_claims_keys() {
        let claim: VirtualMachineClaim = serde_json::from_value(serde_json::json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachineClaim",
            "metadata": {"name": "c", "namespace": "ns", "generation": 3},
            "spec": {"poolRef": {"name": "p"}, "subject": {"issuer": "i", "id": "alice"},
                     "ttlSeconds": 60,
                     "access": {"sshAuthorizedKeys": ["ssh-ed25519 AAAA"]}}
        }))
        .unwrap();
        let mut member = unbound_member();
        let installed = conditions::new(
            types::ACCESS_READY,
            conditions::status::TRUE,
            reasons::ACCESS_INSTALLED,
            "installed for alice",
            Some(9),
        );
        member.status = Some(banlieue_api::VirtualMachineStatus {
            conditions: vec![installed],
            ..Default::default()
        });
        // The member's condition is about other keys (or none) until the bind gave it these.
        let pending = access_ready(&claim, &member).unwrap();
        assert_eq!(pending.reason, reasons::ACCESS_PENDING);
        member.spec.access = claim.spec.access.clone();
        let ready = access_ready(&claim, &member).unwrap();
        assert_eq!(ready.status, conditions::status::TRUE);
        assert_eq!(ready.reason, reasons::ACCESS_INSTALLED);
        assert_eq!(ready.observed_generation, Some(3));
        // A claim without access has no such condition.
        let mut plain = claim.clone();
        plain.spec.access = None;
        assert_eq!(access_ready(&plain, &member), None);
    }

    #[test]
    fn the_subjects_latest_challenge_is_relayed_and_a_withdrawn_one_is_not_unsaid() {
        let challenge = |credential: &str| banlieue_api::handover::HandoverChallenge {
            credential: credential.into(),
            binding: "0".repeat(64),
            sealed: None,
        };
        let mut claim: VirtualMachineClaim = serde_json::from_value(serde_json::json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachineClaim",
            "metadata": {"name": "c", "namespace": "ns"},
            "spec": {"poolRef": {"name": "p"}, "subject": {"issuer": "i", "id": "alice"},
                     "ttlSeconds": 60}
        }))
        .unwrap();
        let mut member = unbound_member();
        assert_eq!(handover_to_relay(&claim, &member), None);
        claim.spec.handover = Some(challenge("AAAA"));
        assert_eq!(
            handover_to_relay(&claim, &member),
            claim.spec.handover.as_ref()
        );
        member.spec.handover = claim.spec.handover.clone();
        assert_eq!(handover_to_relay(&claim, &member), None);
        // A new challenge replaces the last.
        claim.spec.handover = Some(challenge("BBBB"));
        assert_eq!(
            handover_to_relay(&claim, &member),
            claim.spec.handover.as_ref()
        );
        claim.spec.handover = None;
        assert_eq!(handover_to_relay(&claim, &member), None);
    }
}

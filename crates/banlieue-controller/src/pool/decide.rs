//! What a pool does next (pure): how many members to create, which to delete, what its status
//! says. Its input is a snapshot; the acting layer is `pool::reconcile`.

use std::collections::BTreeSet;
use std::time::Duration;

use banlieue_api::conditions::{self, reasons, status, types};
use banlieue_api::names;
use banlieue_api::{PoolReadiness, PoolUpdateType, VirtualMachinePool, VirtualMachinePoolStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;

use super::startup::{StartupStreak, startup_backoff};
use crate::member::MemberView;

/// The message of a GuestReady pool whose members never publish the signal.
pub const READINESS_SIGNAL_ABSENT_MESSAGE: &str =
    r#"no member has published the "GuestReady" condition"#;

/// A snapshot of one pool.
#[derive(Clone, Debug)]
pub struct PoolSnapshot {
    pub replicas: i32,
    pub max_surge: i32,
    pub update: PoolUpdateType,
    pub readiness: PoolReadiness,
    pub max_idle: Option<Duration>,
    pub current_revision: String,
    /// Unclaimed members controlled by the pool.
    pub members: Vec<MemberView>,
    /// Creates issued whose members the cache has not shown yet (expectations).
    pub pending_creates: usize,
    /// Members a claim is binding right now: never deleted, whatever else holds.
    pub reserved: BTreeSet<String>,
    /// Members bound to the pool's claims.
    pub claimed: i32,
    pub readiness_signal_grace: Duration,
    /// A member not available this long after its creation failed to start: it is deleted and
    /// replaced. `None`: members may take as long as they take.
    pub startup_deadline: Option<Duration>,
    /// The most members being built at once (created, not yet available, pending creates
    /// included): a burst of claims refills at this pace. `None`: no cap.
    pub max_provisioning: Option<usize>,
    /// No member is created before this instant: the backoff after startup failures.
    pub creates_not_before: Option<Timestamp>,
    /// `standby: Saved` was asked, and a member's machine is of this kind, which cannot be
    /// saved (ADR-0073): the pool says so and creates no more members.
    pub standby_not_supported_by: Option<String>,
    pub now: Timestamp,
}

/// The pool's Ready condition, as decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadyVerdict {
    pub status: &'static str,
    pub reason: &'static str,
    pub message: String,
}

/// What the pool does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolPlan {
    pub creates: usize,
    /// Members to delete, in order.
    pub deletes: Vec<String>,
    /// Unclaimed members, not being deleted.
    pub replicas: i32,
    pub ready_replicas: i32,
    pub available_replicas: i32,
    pub ready: ReadyVerdict,
    /// When a time-based decision next changes by itself (idle expiry, the readiness grace).
    pub revisit_after: Option<Duration>,
    /// Members deleted because they did not become available within the startup deadline.
    pub startup_failures: Vec<String>,
}

fn age(now: Timestamp, since: Option<Timestamp>) -> Option<Duration> {
    let since = since?;
    let elapsed: SignedDuration = now.duration_since(since);
    Some(elapsed.unsigned_abs()).filter(|_| !elapsed.is_negative())
}

/// The slack added to every revisit, so the decision it wakes for has surely changed.
const REVISIT_SLACK: Duration = Duration::from_millis(100);

/// Decides the pool's next step.
///
/// - Members that failed or vanished, or whose host is lost, are replaced (they no longer
///   count) and the failed and lost ones deleted.
/// - Creates never overshoot: pending creates count as members.
/// - Stale members (an older revision under `Replace`, or idle for longer than `maxIdleSeconds`)
///   are replaced with at most `maxSurge` extra members, and an available stale member is
///   deleted only once the pool keeps `replicas` available without it, oldest first.
/// - A reserved member (being bound) is never deleted: the bind wins.
pub fn decide(pool: &PoolSnapshot) -> PoolPlan {
    let replicas = pool.replicas.max(0) as usize;
    let live = live_members(pool);
    let limit = replicas + surge(pool, &live);

    let backoff_left = backoff_left(pool);
    let startup_failures = startup_failures(pool);
    // A failure found now starts (or extends) the backoff: its replacement waits for the next
    // round, which sees the backoff the reconciler records.
    let creates = if backoff_left.is_some()
        || !startup_failures.is_empty()
        || pool.standby_not_supported_by.is_some()
    {
        0
    } else {
        creates(pool, &live, replicas, limit)
    };

    let mut deletes = Deletes {
        names: broken_members(pool)
            .chain(startup_failures.iter().cloned())
            .collect(),
        live: live.len(),
        available: live.iter().filter(|m| m.available).count(),
    };
    let unreserved: Vec<&MemberView> = live
        .iter()
        .copied()
        .filter(|m| !pool.is_reserved(m))
        .collect();
    let remaining = delete_over_limit(pool, &mut deletes, unreserved, limit);
    delete_stale(pool, &mut deletes, remaining, replicas);

    let ready_count = live.iter().filter(|m| m.infrastructure_ready).count();
    let available_count = live.iter().filter(|m| m.available).count();
    let ready = verdict(pool, &live, available_count, replicas);
    let revisit_after = revisit_after(pool, &live, backoff_left, &startup_failures, &ready);

    PoolPlan {
        creates,
        deletes: deletes.names,
        replicas: live.len() as i32,
        ready_replicas: ready_count as i32,
        available_replicas: available_count as i32,
        ready,
        revisit_after,
        startup_failures,
    }
}

/// What the rules ask of one member.
impl PoolSnapshot {
    /// Not available within the startup deadline of its creation.
    fn timed_out(&self, m: &MemberView) -> bool {
        !m.available
            && !m.deleting
            && self
                .startup_deadline
                .zip(age(self.now, m.created))
                .is_some_and(|(deadline, age)| age > deadline)
    }

    /// Available for longer than `maxIdleSeconds`.
    fn is_idle(&self, m: &MemberView) -> bool {
        m.available
            && self
                .max_idle
                .zip(age(self.now, m.available_since))
                .is_some_and(|(limit, age)| age > limit)
    }

    /// Of an older revision, under `Replace`.
    fn is_old(&self, m: &MemberView) -> bool {
        self.update == PoolUpdateType::Replace
            && m.revision.as_deref() != Some(self.current_revision.as_str())
    }

    fn is_stale(&self, m: &MemberView) -> bool {
        self.is_old(m) || self.is_idle(m)
    }

    fn is_reserved(&self, m: &MemberView) -> bool {
        self.reserved.contains(&m.name)
    }
}

/// The members that still count: not deleting, failed, on a lost host or timed out.
fn live_members(pool: &PoolSnapshot) -> Vec<&MemberView> {
    pool.members
        .iter()
        .filter(|m| !m.deleting && !m.failed && !m.host_lost() && !pool.timed_out(m))
        .collect()
}

/// The extra members allowed above `replicas` while stale ones are being replaced.
fn surge(pool: &PoolSnapshot, live: &[&MemberView]) -> usize {
    if live.iter().any(|m| pool.is_stale(m)) {
        pool.max_surge.max(1) as usize
    } else {
        0
    }
}

/// The members to create: enough for `replicas` fresh ones, never above `limit` (pending
/// creates count as members), nor above `maxProvisioning` members being built.
fn creates(pool: &PoolSnapshot, live: &[&MemberView], replicas: usize, limit: usize) -> usize {
    let pending = pool.pending_creates;
    let fresh_count = live.iter().filter(|m| !pool.is_stale(m)).count();
    let creates = replicas
        .saturating_sub(fresh_count + pending)
        .min(limit.saturating_sub(live.len() + pending));
    match pool.max_provisioning {
        Some(cap) => {
            let building = live.iter().filter(|m| !m.available).count() + pending;
            creates.min(cap.saturating_sub(building))
        }
        None => creates,
    }
}

/// What is left of the backoff after startup failures, if any.
fn backoff_left(pool: &PoolSnapshot) -> Option<Duration> {
    pool.creates_not_before
        .and_then(|until| age(until, Some(pool.now)))
        .filter(|left| !left.is_zero())
}

/// The members that did not start in time, to delete (not a reserved one).
fn startup_failures(pool: &PoolSnapshot) -> Vec<String> {
    pool.members
        .iter()
        .filter(|m| pool.timed_out(m) && !pool.is_reserved(m))
        .map(|m| m.name.clone())
        .collect()
}

/// The failed members and those of a lost host, to delete (not a reserved one).
fn broken_members(pool: &PoolSnapshot) -> impl Iterator<Item = String> + '_ {
    pool.members
        .iter()
        .filter(|m| (m.failed || m.host_lost()) && !m.deleting && !pool.is_reserved(m))
        .map(|m| m.name.clone())
}

/// The deletes chosen so far, and what the pool keeps without them: each delete is weighed
/// against the members the previous ones left.
struct Deletes {
    names: Vec<String>,
    /// Live members not deleted.
    live: usize,
    /// Available members not deleted.
    available: usize,
}

impl Deletes {
    fn delete(&mut self, member: &MemberView) {
        self.names.push(member.name.clone());
        self.live -= 1;
        self.available -= usize::from(member.available);
    }
}

/// Over the limit (replicas lowered): deletes unavailable members first, then stale ones, then
/// the longest idle (the next to expire anyway). Returns the members left, in that order.
fn delete_over_limit<'a>(
    pool: &PoolSnapshot,
    deletes: &mut Deletes,
    mut members: Vec<&'a MemberView>,
    limit: usize,
) -> Vec<&'a MemberView> {
    let over = (deletes.live + pool.pending_creates).saturating_sub(limit);
    members.sort_by(|a, b| {
        (a.available, !pool.is_stale(a), a.available_since)
            .cmp(&(b.available, !pool.is_stale(b), b.available_since))
            .then_with(|| b.created.cmp(&a.created))
            .then_with(|| a.name.cmp(&b.name))
    });
    for member in members.drain(..over.min(members.len())) {
        deletes.delete(member);
    }
    members
}

/// Stale members: deletes unavailable ones when others cover them, available ones oldest first
/// when `replicas` stay available without them.
fn delete_stale(
    pool: &PoolSnapshot,
    deletes: &mut Deletes,
    members: Vec<&MemberView>,
    replicas: usize,
) {
    let mut stale: Vec<&MemberView> = members.into_iter().filter(|m| pool.is_stale(m)).collect();
    stale.sort_by(|a, b| {
        (a.available, a.available_since)
            .cmp(&(b.available, b.available_since))
            .then_with(|| a.name.cmp(&b.name))
    });
    for member in stale {
        let keeps_enough = if member.available {
            deletes.available > replicas
        } else {
            deletes.live + pool.pending_creates > replicas
        };
        if keeps_enough {
            deletes.delete(member);
        }
    }
}

/// When a time-based decision next changes by itself: an idle expiry, the end of the backoff,
/// the next round after a startup failure, a startup deadline, the readiness grace.
fn revisit_after(
    pool: &PoolSnapshot,
    live: &[&MemberView],
    backoff_left: Option<Duration>,
    startup_failures: &[String],
    ready: &ReadyVerdict,
) -> Option<Duration> {
    let mut revisit: Option<Duration> = None;
    let mut sooner = |d: Duration| revisit = Some(revisit.map_or(d, |r: Duration| r.min(d)));
    if let Some(limit) = pool.max_idle {
        for member in live.iter().filter(|m| m.available && !pool.is_idle(m)) {
            if let Some(age) = age(pool.now, member.available_since) {
                sooner(limit.saturating_sub(age) + REVISIT_SLACK);
            }
        }
    }
    if let Some(left) = backoff_left {
        sooner(left + REVISIT_SLACK);
    }
    if !startup_failures.is_empty() {
        sooner(REVISIT_SLACK);
    }
    if let Some(deadline) = pool.startup_deadline {
        for member in live.iter().filter(|m| !m.available) {
            if let Some(age) = age(pool.now, member.created) {
                sooner(deadline.saturating_sub(age) + REVISIT_SLACK);
            }
        }
    }
    if pool.readiness == PoolReadiness::GuestReady
        && ready.reason != reasons::READINESS_SIGNAL_ABSENT
    {
        for member in live {
            if let Some(age) = age(pool.now, member.running_since) {
                sooner(pool.readiness_signal_grace.saturating_sub(age) + REVISIT_SLACK);
            }
        }
    }
    revisit
}

fn verdict(
    pool: &PoolSnapshot,
    live: &[&MemberView],
    available: usize,
    replicas: usize,
) -> ReadyVerdict {
    if let Some(kind) = &pool.standby_not_supported_by {
        return ReadyVerdict {
            status: status::FALSE,
            reason: reasons::STANDBY_NOT_SUPPORTED,
            message: format!(
                "standby: Saved: members are {kind}s, which their provider cannot save; \
                 they keep running and no more are created"
            ),
        };
    }
    if available >= replicas {
        return ReadyVerdict {
            status: status::TRUE,
            reason: reasons::AT_CAPACITY,
            message: format!("{available}/{replicas} members available"),
        };
    }
    let signal_absent = pool.readiness == PoolReadiness::GuestReady
        && !pool.members.iter().any(|m| m.published_guest_ready)
        && live.iter().any(|m| {
            age(pool.now, m.running_since).is_some_and(|age| age >= pool.readiness_signal_grace)
        });
    if signal_absent {
        return ReadyVerdict {
            status: status::FALSE,
            reason: reasons::READINESS_SIGNAL_ABSENT,
            message: READINESS_SIGNAL_ABSENT_MESSAGE.to_owned(),
        };
    }
    let starting = live.len().saturating_sub(available) + pool.pending_creates;
    ReadyVerdict {
        status: status::FALSE,
        reason: reasons::FILLING,
        message: format!("{available}/{replicas} members available, {starting} starting"),
    }
}

/// The pool's next status: the counts of `plan`, and its Ready, Filling and Degraded
/// conditions (Degraded while a streak of members that did not start in time lasts).
pub(crate) fn next_status(
    pool: &VirtualMachinePool,
    current: &VirtualMachinePoolStatus,
    plan: &PoolPlan,
    claimed: i32,
    revision: &str,
    streak: Option<&StartupStreak>,
    now: Time,
) -> VirtualMachinePoolStatus {
    let generation = pool.metadata.generation;
    let mut next = VirtualMachinePoolStatus {
        replicas: plan.replicas,
        ready_replicas: plan.ready_replicas,
        available_replicas: plan.available_replicas,
        claimed_replicas: claimed,
        current_revision: Some(revision.to_owned()),
        selector: Some(format!("{}={}", names::LABEL_POOL, pool.name_any())),
        conditions: current.conditions.clone(),
        observed_generation: generation,
    };
    let ready = &plan.ready;
    let condition = |type_, status, reason, message: String| {
        conditions::new(type_, status, reason, message, generation)
    };
    conditions::set(
        &mut next.conditions,
        condition(
            types::READY,
            ready.status,
            ready.reason,
            ready.message.clone(),
        ),
        now.clone(),
    );
    let filling = if ready.status != status::TRUE {
        status::TRUE
    } else {
        status::FALSE
    };
    conditions::set(
        &mut next.conditions,
        condition(types::FILLING, filling, ready.reason, ready.message.clone()),
        now.clone(),
    );
    let degraded = match streak {
        Some(streak) => Some(condition(
            types::DEGRADED,
            status::TRUE,
            reasons::STARTUP_DEADLINE_EXCEEDED,
            format!(
                "{} members in a row were not available within {} s (the last: {}); the next is \
                 created {} s after the last failure",
                streak.failures,
                pool.spec.startup_deadline_seconds.unwrap_or_default(),
                streak.last_members.join(", "),
                startup_backoff(streak.failures).as_secs(),
            ),
        )),
        None if conditions::is_true(&next.conditions, types::DEGRADED) => Some(condition(
            types::DEGRADED,
            status::FALSE,
            reasons::MEMBERS_STARTING,
            "the pool is back at capacity".to_owned(),
        )),
        None => None,
    };
    if let Some(degraded) = degraded {
        conditions::set(&mut next.conditions, degraded, now);
    }
    next
}

/// The least time between two status writes of one pool that change only its counts. Under a
/// steady stream of claims every bind and every refill changes a count; written each time, the
/// pool's status alone cost three writes per claim.
pub const STATUS_COUNTS_INTERVAL: Duration = Duration::from_secs(1);

/// When a changed pool status should be written: `None` now, else after the delay. A change
/// of meaning (Ready's status or reason, the revision, the observed generation) is written at
/// once, and so is everything when this process has not written the pool within
/// [`STATUS_COUNTS_INTERVAL`]. Within it, a change of counts waits out the interval, and so
/// does a pool at capacity starting to fill (a claim took a member and its replacement is on
/// the way): at a few claims a second that happens on every claim and is undone a moment
/// later, and written each time it cost two status writes per claim. The status is then at
/// most that interval behind, as it is for counts. The reconcile is requeued for the delay.
pub fn status_write_delay(
    current: &VirtualMachinePoolStatus,
    next: &VirtualMachinePoolStatus,
    since_last_write: Option<Duration>,
) -> Option<Duration> {
    let rest = |s: &VirtualMachinePoolStatus| {
        (
            s.current_revision.clone(),
            s.observed_generation,
            s.selector.clone(),
        )
    };
    if rest(current) != rest(next) {
        return None;
    }
    let (before, after) = (ready_of(current), ready_of(next));
    if before != after && !is_refill(before.as_ref(), after.as_ref()) {
        return None;
    }
    let since = since_last_write?;
    STATUS_COUNTS_INTERVAL
        .checked_sub(since)
        .filter(|d| !d.is_zero())
}

/// Ready's status and reason in `status`.
pub fn ready_of(status: &VirtualMachinePoolStatus) -> Option<(String, String)> {
    conditions::find(&status.conditions, types::READY).map(|c| (c.status.clone(), c.reason.clone()))
}

/// Whether Ready going from `before` to `after` is a pool at capacity starting to refill.
pub fn is_refill(before: Option<&(String, String)>, after: Option<&(String, String)>) -> bool {
    let is = |c: Option<&(String, String)>, status: &str, reason: &str| {
        c.is_some_and(|(s, r)| s == status && r == reason)
    };
    is(before, status::TRUE, reasons::AT_CAPACITY) && is(after, status::FALSE, reasons::FILLING)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CURRENT: &str = "rev-2";

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).expect("valid time")
    }

    fn member(name: &str, revision: &str, available_since: Option<i64>) -> MemberView {
        MemberView {
            name: name.to_owned(),
            revision: Some(revision.to_owned()),
            created: Some(t(0)),
            available: available_since.is_some(),
            available_since: available_since.map(t),
            infrastructure_ready: available_since.is_some(),
            infrastructure_ready_since: available_since.map(t),
            running_since: available_since.map(t),
            published_guest_ready: available_since.is_some(),
            deleting: false,
            failed: false,
            host: Default::default(),
            resource_version: Some("1".to_owned()),
        }
    }

    fn pool(replicas: i32, members: Vec<MemberView>) -> PoolSnapshot {
        PoolSnapshot {
            replicas,
            max_surge: 1,
            update: PoolUpdateType::Replace,
            readiness: PoolReadiness::InfrastructureReady,
            max_idle: None,
            current_revision: CURRENT.to_owned(),
            members,
            pending_creates: 0,
            reserved: BTreeSet::new(),
            claimed: 0,
            readiness_signal_grace: Duration::from_secs(60),
            startup_deadline: None,
            max_provisioning: None,
            creates_not_before: None,
            standby_not_supported_by: None,
            now: t(1000),
        }
    }

    #[test]
    fn a_saved_pool_on_a_kind_that_cannot_save_says_so_and_creates_nothing() {
        let mut snapshot = pool(3, vec![member("a", CURRENT, Some(10))]);
        snapshot.standby_not_supported_by = Some("MemoryMachine".to_owned());
        let plan = decide(&snapshot);
        assert_eq!(plan.creates, 0);
        assert_eq!(plan.ready.status, status::FALSE);
        assert_eq!(plan.ready.reason, reasons::STANDBY_NOT_SUPPORTED);
        assert!(
            plan.ready.message.contains("MemoryMachines"),
            "{}",
            plan.ready.message
        );
        snapshot.standby_not_supported_by = None;
        assert_eq!(decide(&snapshot).creates, 2);
    }

    #[test]
    fn an_empty_pool_creates_replicas() {
        let plan = decide(&pool(3, vec![]));
        assert_eq!(plan.creates, 3);
        assert!(plan.deletes.is_empty());
        assert_eq!(plan.ready.reason, reasons::FILLING);
        assert_eq!(plan.ready.message, "0/3 members available, 0 starting");
    }

    #[test]
    fn pending_creates_are_counted_so_the_pool_never_overshoots() {
        let mut p = pool(3, vec![member("a", CURRENT, None)]);
        p.pending_creates = 2;
        assert_eq!(decide(&p).creates, 0);
        // Even members that never become ready count.
        p.pending_creates = 0;
        p.members.push(member("b", CURRENT, None));
        p.members.push(member("c", CURRENT, None));
        assert_eq!(decide(&p).creates, 0);
    }

    #[test]
    fn members_of_a_lost_host_are_replaced_and_deleted_and_an_unready_one_only_waits() {
        let lost = member("a", CURRENT, Some(5)).on_host(crate::hosts::HostState::Lost);
        let unready = member("b", CURRENT, Some(5)).on_host(crate::hosts::HostState::Unready);
        let plan = decide(&pool(3, vec![lost, unready, member("c", CURRENT, Some(5))]));
        assert_eq!(plan.creates, 1, "only the lost member is replaced");
        assert_eq!(plan.deletes, vec!["a".to_owned()]);
        assert_eq!(plan.replicas, 2);
        assert_eq!(plan.available_replicas, 1, "b is not handed out meanwhile");
    }

    #[test]
    fn failed_and_deleting_members_are_replaced() {
        let mut failed = member("a", CURRENT, None);
        failed.failed = true;
        let mut deleting = member("b", CURRENT, Some(1));
        deleting.deleting = true;
        let plan = decide(&pool(
            2,
            vec![failed, deleting, member("c", CURRENT, Some(5))],
        ));
        assert_eq!(plan.creates, 1);
        assert_eq!(plan.deletes, vec!["a".to_owned()]);
        assert_eq!(plan.replicas, 1);
    }

    #[test]
    fn a_full_pool_is_at_capacity() {
        let plan = decide(&pool(
            2,
            vec![member("a", CURRENT, Some(1)), member("b", CURRENT, Some(2))],
        ));
        assert_eq!(plan.creates, 0);
        assert!(plan.deletes.is_empty());
        assert_eq!(plan.ready.status, status::TRUE);
        assert_eq!(plan.ready.reason, reasons::AT_CAPACITY);
    }

    #[test]
    fn old_revisions_roll_with_bounded_surge_keeping_replicas_available() {
        let old = "rev-1";
        // Two old members: one surge member is created, nothing deleted yet.
        let p = pool(
            2,
            vec![member("a", old, Some(1)), member("b", old, Some(2))],
        );
        let plan = decide(&p);
        assert_eq!((plan.creates, plan.deletes.clone()), (1, vec![]));
        // The surge member is not available yet: still nothing deleted, nothing more created.
        let p = pool(
            2,
            vec![
                member("a", old, Some(1)),
                member("b", old, Some(2)),
                member("c", CURRENT, None),
            ],
        );
        let plan = decide(&p);
        assert_eq!((plan.creates, plan.deletes.clone()), (0, vec![]));
        // Once it is available, the oldest old member goes.
        let p = pool(
            2,
            vec![
                member("a", old, Some(1)),
                member("b", old, Some(2)),
                member("c", CURRENT, Some(50)),
            ],
        );
        let plan = decide(&p);
        assert_eq!(
            (plan.creates, plan.deletes.clone()),
            (0, vec!["a".to_owned()])
        );
    }

    #[test]
    fn on_delete_keeps_old_revisions() {
        let mut p = pool(
            2,
            vec![member("a", "rev-1", Some(1)), member("b", "rev-1", Some(2))],
        );
        p.update = PoolUpdateType::OnDelete;
        let plan = decide(&p);
        assert_eq!((plan.creates, plan.deletes), (0, vec![]));
    }

    #[test]
    fn idle_members_are_replaced_oldest_first_never_a_reserved_one() {
        let mut p = pool(
            2,
            vec![
                member("a", CURRENT, Some(10)),
                member("b", CURRENT, Some(5)),
                member("c", CURRENT, Some(900)),
            ],
        );
        p.max_idle = Some(Duration::from_secs(500));
        // Three members, two idle, replicas 2: one surplus goes, the oldest idle one (b).
        let plan = decide(&p);
        assert_eq!(plan.deletes.first().map(String::as_str), Some("b"));
        // b is being bound: it is never reaped; a (the next oldest) is.
        p.reserved.insert("b".to_owned());
        let plan = decide(&p);
        assert!(
            !plan.deletes.contains(&"b".to_owned()),
            "{:?}",
            plan.deletes
        );
        assert_eq!(plan.deletes.first().map(String::as_str), Some("a"));
        // The idle limit of c is the next time to look.
        assert_eq!(
            plan.revisit_after,
            Some(Duration::from_secs(400) + Duration::from_millis(100))
        );
    }

    #[test]
    fn idle_member_at_replicas_waits_for_its_replacement() {
        let mut p = pool(1, vec![member("a", CURRENT, Some(0))]);
        p.max_idle = Some(Duration::from_secs(10));
        let plan = decide(&p);
        assert_eq!((plan.creates, plan.deletes.clone()), (1, vec![]));
        p.members.push(member("b", CURRENT, Some(999)));
        let plan = decide(&p);
        assert_eq!((plan.creates, plan.deletes), (0, vec!["a".to_owned()]));
    }

    #[test]
    fn readiness_signal_absent_after_the_grace_without_any_guest_ready() {
        let mut a = member("a", CURRENT, None);
        a.infrastructure_ready = true;
        a.infrastructure_ready_since = Some(t(990));
        a.running_since = Some(t(990));
        let mut p = pool(1, vec![a.clone()]);
        p.readiness = PoolReadiness::GuestReady;
        p.readiness_signal_grace = Duration::from_secs(30);
        // Within the grace: still Filling.
        assert_eq!(decide(&p).ready.reason, reasons::FILLING);
        p.now = t(1100);
        let plan = decide(&p);
        assert_eq!(plan.ready.reason, reasons::READINESS_SIGNAL_ABSENT);
        assert_eq!(
            plan.ready.message,
            r#"no member has published the "GuestReady" condition"#
        );
        // One member publishing the condition (even False) means the signal exists.
        a.published_guest_ready = true;
        p.members = vec![a];
        assert_eq!(decide(&p).ready.reason, reasons::FILLING);
    }

    #[test]
    fn scale_down_deletes_unavailable_members_first_then_the_longest_idle() {
        let p = pool(
            1,
            vec![
                member("a", CURRENT, Some(1)),
                member("b", CURRENT, None),
                member("c", CURRENT, Some(2)),
            ],
        );
        let plan = decide(&p);
        assert_eq!(plan.deletes, vec!["b".to_owned(), "a".to_owned()]);
    }

    fn pool_status(available: i32, reason: &str) -> VirtualMachinePoolStatus {
        let mut s = VirtualMachinePoolStatus {
            available_replicas: available,
            current_revision: Some("r1".into()),
            observed_generation: Some(1),
            ..Default::default()
        };
        conditions::set(
            &mut s.conditions,
            conditions::new(
                types::READY,
                status::TRUE,
                reason,
                format!("{available} available"),
                Some(1),
            ),
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
        );
        s
    }

    /// `pool_status` with Ready's status as a real pool has it for `reason`.
    fn pool_status_as_decided(available: i32, reason: &'static str) -> VirtualMachinePoolStatus {
        let mut s = pool_status(available, reason);
        if reason != reasons::AT_CAPACITY {
            for c in &mut s.conditions {
                c.status = status::FALSE.to_owned();
            }
        }
        s
    }

    fn pool_object(startup_deadline_seconds: Option<i64>) -> VirtualMachinePool {
        let spec = serde_json::json!({
            "replicas": 3,
            "template": {"spec": {
                "classRef": {"name": "small"}, "imageRef": {"name": "debian"},
                "storageClassName": "fast", "networkClassName": "isolated"
            }},
            "updateStrategy": {"type": "Replace", "maxSurge": 1},
            "readiness": "InfrastructureReady",
            "startupDeadlineSeconds": startup_deadline_seconds,
        });
        let mut pool = VirtualMachinePool::new("web", serde_json::from_value(spec).unwrap());
        pool.metadata.generation = Some(4);
        pool
    }

    fn plan_with(ready: ReadyVerdict) -> PoolPlan {
        PoolPlan {
            creates: 1,
            deletes: Vec::new(),
            replicas: 3,
            ready_replicas: 2,
            available_replicas: 2,
            ready,
            revisit_after: None,
            startup_failures: Vec::new(),
        }
    }

    #[test]
    fn next_status_mirrors_the_plan_and_reports_a_startup_streak_until_it_ends() {
        let pool = pool_object(Some(90));
        let filling = plan_with(ReadyVerdict {
            status: status::FALSE,
            reason: reasons::FILLING,
            message: "2/3 members available".into(),
        });
        let now = Time(t(0));
        let streak = StartupStreak {
            failures: 2,
            last_at: t(0),
            last_members: vec!["web-a".into(), "web-b".into()],
        };
        let current = VirtualMachinePoolStatus::default();
        let next = next_status(
            &pool,
            &current,
            &filling,
            1,
            "rev-9",
            Some(&streak),
            now.clone(),
        );
        assert_eq!(
            (
                next.replicas,
                next.available_replicas,
                next.claimed_replicas
            ),
            (3, 2, 1)
        );
        assert_eq!(next.current_revision.as_deref(), Some("rev-9"));
        assert_eq!(next.selector.as_deref(), Some("banlieue.io/pool=web"));
        assert_eq!(next.observed_generation, Some(4));
        let find = |status: &VirtualMachinePoolStatus, type_| {
            let c = conditions::find(&status.conditions, type_)
                .expect(type_)
                .clone();
            (c.status, c.reason, c.message, c.observed_generation)
        };
        let (ready, reason, ..) = find(&next, types::READY);
        assert_eq!(
            (ready.as_str(), reason.as_str()),
            (status::FALSE, reasons::FILLING)
        );
        assert_eq!(find(&next, types::FILLING).0, status::TRUE);
        let (degraded, reason, message, generation) = find(&next, types::DEGRADED);
        assert_eq!(
            (degraded.as_str(), reason.as_str(), generation),
            (status::TRUE, reasons::STARTUP_DEADLINE_EXCEEDED, Some(4))
        );
        assert!(message.contains("2 members in a row"), "{message}");
        assert!(
            message.contains("within 90 s (the last: web-a, web-b)"),
            "{message}"
        );
        let backoff = startup_backoff(2).as_secs();
        assert!(message.contains(&format!("{backoff} s after")), "{message}");

        // Back at capacity, the streak over: Degraded turns False, Filling False.
        let full = plan_with(ReadyVerdict {
            status: status::TRUE,
            reason: reasons::AT_CAPACITY,
            message: "3/3 members available".into(),
        });
        let after = next_status(&pool, &next, &full, 1, "rev-9", None, now.clone());
        assert_eq!(find(&after, types::FILLING).0, status::FALSE);
        let (degraded, reason, ..) = find(&after, types::DEGRADED);
        assert_eq!(
            (degraded.as_str(), reason.as_str()),
            (status::FALSE, reasons::MEMBERS_STARTING)
        );
        // A pool that was never degraded gets no Degraded condition at all.
        let quiet = next_status(&pool, &current, &full, 0, "rev-9", None, now);
        assert!(conditions::find(&quiet.conditions, types::DEGRADED).is_none());
    }

    #[test]
    fn count_changes_are_written_at_most_once_per_interval_and_meaning_at_once() {
        let current = pool_status(5, reasons::AT_CAPACITY);
        let counts = pool_status(4, reasons::AT_CAPACITY);
        // Never written by this process: write now.
        assert_eq!(status_write_delay(&current, &counts, None), None);
        // Written 300 ms ago: the counts wait out the rest of the interval.
        assert_eq!(
            status_write_delay(&current, &counts, Some(Duration::from_millis(300))),
            Some(Duration::from_millis(700))
        );
        assert_eq!(
            status_write_delay(&current, &counts, Some(STATUS_COUNTS_INTERVAL)),
            None
        );
        // A new reason is written at once, however recent the last write.
        let degraded = pool_status_as_decided(4, reasons::READINESS_SIGNAL_ABSENT);
        assert_eq!(
            status_write_delay(&current, &degraded, Some(Duration::ZERO)),
            None
        );
        let mut new_revision = counts.clone();
        new_revision.current_revision = Some("r2".into());
        assert_eq!(
            status_write_delay(&current, &new_revision, Some(Duration::ZERO)),
            None
        );
    }

    #[test]
    fn a_pool_at_capacity_starting_to_refill_is_written_as_counts_are() {
        let at_capacity = pool_status(5, reasons::AT_CAPACITY);
        let filling = pool_status_as_decided(4, reasons::FILLING);
        // Not written within the interval: at once.
        assert_eq!(status_write_delay(&at_capacity, &filling, None), None);
        assert_eq!(
            status_write_delay(&at_capacity, &filling, Some(STATUS_COUNTS_INTERVAL)),
            None
        );
        // Written 300 ms ago: it waits out the interval (and is gone if the refill is done).
        assert_eq!(
            status_write_delay(&at_capacity, &filling, Some(Duration::from_millis(300))),
            Some(Duration::from_millis(700))
        );
        // Back at capacity, or filling from anything else: at once.
        assert_eq!(
            status_write_delay(&filling, &at_capacity, Some(Duration::ZERO)),
            None
        );
        let signal_absent = pool_status_as_decided(4, reasons::READINESS_SIGNAL_ABSENT);
        assert_eq!(
            status_write_delay(&signal_absent, &filling, Some(Duration::ZERO)),
            None
        );
    }

    #[test]
    fn a_member_not_available_by_the_startup_deadline_is_replaced() {
        // Created at t(0); the pool looks at t(1000).
        let mut p = pool(
            2,
            vec![
                member("slow", CURRENT, None),
                member("ok", CURRENT, Some(5)),
            ],
        );
        p.startup_deadline = Some(Duration::from_secs(1200));
        let plan = decide(&p);
        assert!(plan.startup_failures.is_empty());
        assert_eq!(plan.creates, 0);
        assert_eq!(plan.revisit_after, Some(Duration::from_millis(200_100)));
        p.startup_deadline = Some(Duration::from_secs(600));
        let plan = decide(&p);
        assert_eq!(plan.startup_failures, vec!["slow".to_owned()]);
        assert_eq!(plan.deletes, vec!["slow".to_owned()]);
        assert_eq!(plan.creates, 0, "the replacement waits for the backoff");
        assert_eq!(plan.replicas, 1);
        p.creates_not_before = Some(t(990));
        p.members.retain(|m| m.name == "ok");
        assert_eq!(decide(&p).creates, 1);
    }

    #[test]
    fn refills_are_capped_by_members_in_flight_and_held_by_the_backoff() {
        let mut p = pool(5, vec![member("building", CURRENT, None)]);
        p.max_provisioning = Some(3);
        p.pending_creates = 1;
        assert_eq!(
            decide(&p).creates,
            1,
            "3 in flight at most: 1 building, 1 pending"
        );
        p.max_provisioning = None;
        assert_eq!(decide(&p).creates, 3);
        p.creates_not_before = Some(t(1030));
        let plan = decide(&p);
        assert_eq!(plan.creates, 0);
        assert_eq!(plan.revisit_after, Some(Duration::from_millis(30_100)));
        p.creates_not_before = Some(t(1000));
        assert_eq!(decide(&p).creates, 3, "the backoff is over");
    }
}

//! The election's decision, with no I/O and no clock of its own: what to do given the Lease as
//! last read, when this process first saw it that way, and the time now. The shell in
//! [`super`] reads and writes the Lease and owns the clocks.
//!
//! Expiry is judged by the observer's clock only, as client-go does: a record is expired when
//! this process has seen it unchanged for longer than its `leaseDurationSeconds`. The
//! `renewTime` written by another process is never compared with a local clock, so clock skew
//! between nodes cannot make a live leader look expired.

use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;

/// The election fields of a Lease's spec, as read or as to be written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseRecord {
    /// Who holds the lease; `None` when nobody does (never held, or released).
    pub holder: Option<String>,
    /// How long the holder's claim lasts after each renewal, as the holder wrote it.
    pub lease_duration_seconds: i32,
    /// When the current holder took the lease.
    pub acquire_time: Option<Timestamp>,
    /// When the holder last renewed it, by the holder's clock (informative only).
    pub renew_time: Option<Timestamp>,
    /// How many times the lease changed hands.
    pub transitions: i32,
}

impl LeaseRecord {
    /// How long the record's holder keeps the lease after a renewal. A negative duration from
    /// the API counts as zero: the record is expired as soon as it is seen.
    pub fn lease_duration(&self) -> Duration {
        Duration::from_secs(u64::try_from(self.lease_duration_seconds).unwrap_or(0))
    }
}

/// The record as last read, and when this process first saw it exactly so.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observation {
    /// The record.
    pub record: LeaseRecord,
    /// When, by this process's monotonic clock, the record was first seen as it is.
    pub since: Instant,
}

impl Observation {
    /// Folds a freshly read `record` into what was observed before: the clock restarts only
    /// when the record changed, so a holder that stopped renewing ages, one that renews stays
    /// young.
    pub fn update(previous: Option<Observation>, record: LeaseRecord, now: Instant) -> Self {
        match previous {
            Some(previous) if previous.record == record => previous,
            _ => Observation { record, since: now },
        }
    }

    /// When the record expires by this observer's clock; `None` if that is beyond what the
    /// clock can represent (a duration of decades: never, in practice).
    pub fn expires_at(&self) -> Option<Instant> {
        self.since.checked_add(self.record.lease_duration())
    }
}

/// What to do after reading the Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// There is no Lease: create it, held by this identity.
    Create,
    /// This identity holds it: renew it.
    Renew,
    /// Nobody holds it, or its holder let it expire by this observer's clock: take it over.
    TakeOver {
        /// The holder whose expired lease is taken over, if any.
        previous: Option<String>,
    },
    /// Another identity holds it and it has not expired: wait.
    Wait {
        /// The holder.
        holder: String,
        /// How long until it expires by this observer's clock unless renewed meanwhile.
        expires_in: Duration,
    },
}

/// Decides what `identity` does about the Lease observed as `observed` (`None`: there is none)
/// at `now`.
pub fn decide(observed: Option<&Observation>, now: Instant, identity: &str) -> Decision {
    let Some(observed) = observed else {
        return Decision::Create;
    };
    match observed.record.holder.as_deref() {
        Some(holder) if holder == identity => Decision::Renew,
        None => Decision::TakeOver { previous: None },
        Some(holder) => {
            let expires_in = match observed.expires_at() {
                Some(at) => at.saturating_duration_since(now),
                None => Duration::MAX,
            };
            if expires_in.is_zero() {
                Decision::TakeOver {
                    previous: Some(holder.to_owned()),
                }
            } else {
                Decision::Wait {
                    holder: holder.to_owned(),
                    expires_in,
                }
            }
        }
    }
}

/// The record to write to carry out `decision` (none for [`Decision::Wait`]): this identity
/// holding the lease for `lease_duration`, renewed at `wall_now`. A renewal keeps the
/// acquisition time and the transition count; a creation starts the count at zero; a takeover
/// increments it, whether the lease was released or expired.
pub fn next_record(
    decision: &Decision,
    current: Option<&LeaseRecord>,
    identity: &str,
    lease_duration: Duration,
    wall_now: Timestamp,
) -> Option<LeaseRecord> {
    let seconds = i32::try_from(lease_duration.as_secs()).unwrap_or(i32::MAX);
    let holding = |acquire_time, transitions| LeaseRecord {
        holder: Some(identity.to_owned()),
        lease_duration_seconds: seconds,
        acquire_time: Some(acquire_time),
        renew_time: Some(wall_now),
        transitions,
    };
    let transitions = current.map_or(0, |c| c.transitions);
    match decision {
        Decision::Wait { .. } => None,
        Decision::Create => Some(holding(wall_now, 0)),
        Decision::Renew => Some(holding(
            current.and_then(|c| c.acquire_time).unwrap_or(wall_now),
            transitions,
        )),
        Decision::TakeOver { .. } => Some(holding(wall_now, transitions.saturating_add(1))),
    }
}

/// The record a holder writes on a graceful release: nobody holds it, so an observer takes it
/// over at its next read instead of waiting out the lease. The duration of one second is what
/// client-go writes; the transition count is kept, the taker increments it.
pub fn released_record(current: &LeaseRecord, wall_now: Timestamp) -> LeaseRecord {
    LeaseRecord {
        holder: None,
        lease_duration_seconds: 1,
        acquire_time: Some(wall_now),
        renew_time: Some(wall_now),
        transitions: current.transitions,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: &str = "controller-a";
    const OTHER: &str = "controller-b";
    const SECOND: Duration = Duration::from_secs(1);

    fn held_by(holder: Option<&str>, transitions: i32) -> LeaseRecord {
        LeaseRecord {
            holder: holder.map(str::to_owned),
            lease_duration_seconds: 15,
            acquire_time: Some(Timestamp::from_second(1_000).unwrap()),
            renew_time: Some(Timestamp::from_second(1_010).unwrap()),
            transitions,
        }
    }

    fn wall(second: i64) -> Timestamp {
        Timestamp::from_second(second).unwrap()
    }

    #[test]
    fn an_absent_lease_is_created_with_no_transitions() {
        let now = Instant::now();
        let decision = decide(None, now, ME);
        assert_eq!(decision, Decision::Create);
        let record = next_record(&decision, None, ME, 15 * SECOND, wall(2_000)).unwrap();
        assert_eq!(
            record,
            LeaseRecord {
                holder: Some(ME.into()),
                lease_duration_seconds: 15,
                acquire_time: Some(wall(2_000)),
                renew_time: Some(wall(2_000)),
                transitions: 0,
            }
        );
    }

    #[test]
    fn a_lease_held_by_another_and_fresh_is_waited_on() {
        let t0 = Instant::now();
        let observed = Observation::update(None, held_by(Some(OTHER), 3), t0);
        assert_eq!(
            decide(Some(&observed), t0 + 5 * SECOND, ME),
            Decision::Wait {
                holder: OTHER.into(),
                expires_in: 10 * SECOND
            }
        );
        let wait = decide(Some(&observed), t0 + 14 * SECOND, ME);
        assert!(next_record(&wait, Some(&observed.record), ME, 15 * SECOND, wall(0)).is_none());
    }

    #[test]
    fn a_lease_unchanged_for_its_duration_is_taken_over_with_one_more_transition() {
        let t0 = Instant::now();
        let observed = Observation::update(None, held_by(Some(OTHER), 3), t0);
        let decision = decide(Some(&observed), t0 + 15 * SECOND, ME);
        assert_eq!(
            decision,
            Decision::TakeOver {
                previous: Some(OTHER.into())
            }
        );
        let record = next_record(
            &decision,
            Some(&observed.record),
            ME,
            15 * SECOND,
            wall(3_000),
        )
        .unwrap();
        assert_eq!(record.holder.as_deref(), Some(ME));
        assert_eq!(record.transitions, 4);
        assert_eq!(record.acquire_time, Some(wall(3_000)));
        assert_eq!(record.renew_time, Some(wall(3_000)));
    }

    #[test]
    fn a_released_lease_is_taken_over_at_once() {
        let t0 = Instant::now();
        let released = released_record(&held_by(Some(OTHER), 3), wall(2_000));
        assert_eq!(released.holder, None);
        assert_eq!(released.transitions, 3);
        let observed = Observation::update(None, released, t0);
        let decision = decide(Some(&observed), t0, ME);
        assert_eq!(decision, Decision::TakeOver { previous: None });
        let record = next_record(
            &decision,
            Some(&observed.record),
            ME,
            15 * SECOND,
            wall(2_001),
        )
        .unwrap();
        assert_eq!(record.transitions, 4);
    }

    #[test]
    fn a_lease_held_by_me_is_renewed_keeping_acquisition_and_transitions() {
        let t0 = Instant::now();
        let observed = Observation::update(None, held_by(Some(ME), 7), t0);
        // Held by me: renewed even when my own record looks expired (a restart with the same
        // identity, e.g. a container restarted in its pod).
        for now in [t0, t0 + 60 * SECOND] {
            assert_eq!(decide(Some(&observed), now, ME), Decision::Renew);
        }
        let record = next_record(
            &Decision::Renew,
            Some(&observed.record),
            ME,
            15 * SECOND,
            wall(5_000),
        )
        .unwrap();
        assert_eq!(record.acquire_time, Some(wall(1_000)));
        assert_eq!(record.renew_time, Some(wall(5_000)));
        assert_eq!(record.transitions, 7);
    }

    #[test]
    fn expiry_runs_from_when_the_record_last_changed_by_the_observers_clock() {
        let t0 = Instant::now();
        // The holder's renewTime says long ago (a skewed clock): not trusted, the record is
        // seen for the first time now, so it is fresh.
        let mut record = held_by(Some(OTHER), 0);
        record.renew_time = Some(wall(0));
        let first = Observation::update(None, record.clone(), t0);
        assert!(matches!(
            decide(Some(&first), t0, ME),
            Decision::Wait { .. }
        ));

        // Read again unchanged 10 s later: the clock keeps running from t0.
        let same = Observation::update(Some(first.clone()), record.clone(), t0 + 10 * SECOND);
        assert_eq!(same.since, t0);
        assert!(matches!(
            decide(Some(&same), t0 + 16 * SECOND, ME),
            Decision::TakeOver { .. }
        ));

        // Renewed (the record changed) at t0 + 10 s: the clock restarts there.
        record.renew_time = Some(wall(1));
        let renewed = Observation::update(Some(first), record, t0 + 10 * SECOND);
        assert_eq!(renewed.since, t0 + 10 * SECOND);
        assert_eq!(
            decide(Some(&renewed), t0 + 16 * SECOND, ME),
            Decision::Wait {
                holder: OTHER.into(),
                expires_in: 9 * SECOND
            }
        );
    }

    #[test]
    fn the_observed_lease_duration_is_the_holders_not_mine() {
        let t0 = Instant::now();
        let mut record = held_by(Some(OTHER), 0);
        record.lease_duration_seconds = 60;
        let observed = Observation::update(None, record, t0);
        assert!(matches!(
            decide(Some(&observed), t0 + 30 * SECOND, ME),
            Decision::Wait { .. }
        ));
    }

    #[test]
    fn odd_durations_from_the_api_do_not_panic() {
        let t0 = Instant::now();
        let mut record = held_by(Some(OTHER), i32::MAX);
        record.lease_duration_seconds = -5;
        let expired = Observation::update(None, record.clone(), t0);
        let decision = decide(Some(&expired), t0, ME);
        assert!(matches!(decision, Decision::TakeOver { .. }));
        // The count saturates rather than overflowing.
        let next = next_record(&decision, Some(&record), ME, 15 * SECOND, wall(0)).unwrap();
        assert_eq!(next.transitions, i32::MAX);

        record.lease_duration_seconds = i32::MAX;
        let long = Observation::update(None, record, t0);
        assert!(matches!(
            decide(Some(&long), t0 + 3_600 * SECOND, ME),
            Decision::Wait { .. }
        ));
    }

    #[test]
    fn a_renewal_of_a_record_without_acquire_time_starts_it_now() {
        let mut record = held_by(Some(ME), 2);
        record.acquire_time = None;
        let next = next_record(&Decision::Renew, Some(&record), ME, 15 * SECOND, wall(9)).unwrap();
        assert_eq!(next.acquire_time, Some(wall(9)));
    }
}

//! Leader election on a `coordination.k8s.io/v1` Lease, with client-go's semantics: several
//! replicas run, one holds the Lease and acts, the others stand by and take over when it is
//! released or expires.
//!
//! ```no_run
//! # async fn example(client: kube::Client) {
//! use banlieue_runtime::leader::{LeaderElector, LeaseConfig, identity_from_environment};
//! let config = LeaseConfig::new("banlieue-system", "banlieue-controller", identity_from_environment());
//! let leadership = LeaderElector::new(client, config).unwrap().acquire().await;
//! tokio::select! {
//!     _ = leadership.lost() => std::process::exit(1), // fencing: stop writing at once
//!     _ = async { /* run the reconcilers until asked to stop */ } => {}
//! }
//! leadership.release().await; // after the reconcilers stopped writing
//! # }
//! ```
//!
//! **Timing.** The holder renews every `retry_period`. An observer takes the Lease over once it
//! has seen the record unchanged for `lease_duration`, by its own clock (the decision core,
//! [`decide`], never compares a remote timestamp with a local clock). A holder that has not
//! renewed within `renew_deadline` of the start of its last successful renewal considers the
//! lease lost: [`Leadership::lost`] resolves. Because `renew_deadline < lease_duration`, a
//! holder that stops writing when `lost` resolves has stopped before anyone else can acquire:
//! the observer's clock for that record started no earlier than the write it saw, which began
//! no earlier than the holder's attempt. The gap (`lease_duration - renew_deadline`, 5 s by
//! default) is the margin for the holder to act on the loss, which is why the caller should
//! exit rather than drain.
//!
//! **Conflicts.** Every write is a create (409 if someone created it first) or a replace
//! guarded by the `resourceVersion` just read (409 if someone wrote it since): two candidates
//! can never both believe their write won.

pub mod decide;

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

pub use decide::{Decision, LeaseRecord, Observation, decide, next_record, released_record};

/// client-go's defaults (and kube-controller-manager's).
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
/// See [`DEFAULT_LEASE_DURATION`].
pub const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// See [`DEFAULT_LEASE_DURATION`].
pub const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(2);
/// client-go's jitter of the acquisition retries: a wait of up to `(1 + JITTER) × retry_period`,
/// so standbys started together do not poll in lockstep.
const JITTER: f64 = 1.2;

/// The namespace a pod runs in when nothing says otherwise.
pub const DEFAULT_NAMESPACE: &str = "banlieue-system";
/// Where Kubernetes mounts the pod's namespace next to its ServiceAccount token.
const IN_CLUSTER_NAMESPACE_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// Errors of leader election.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The timing cannot fence: see [`LeaseConfig::validate`].
    #[error("invalid leader election timing: {0}")]
    InvalidTiming(&'static str),
    /// An identity or lease name is empty.
    #[error("leader election needs a non-empty {0}")]
    Empty(&'static str),
    /// A call to the API server failed.
    #[error("{verb} lease {lease}")]
    Api {
        /// What was being done.
        verb: &'static str,
        /// The Lease, `namespace/name`.
        lease: String,
        /// What the API server or the connection said.
        #[source]
        source: Box<kube::Error>,
    },
    /// A release took longer than the renew deadline.
    #[error("releasing the lease timed out after {0:?}")]
    ReleaseTimedOut(Duration),
}

/// `Result` of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Which Lease to hold, as whom, and the election's timing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseConfig {
    /// The Lease's namespace.
    pub namespace: String,
    /// The Lease's name.
    pub name: String,
    /// This candidate's identity, written as `holderIdentity`; unique among the candidates.
    pub identity: String,
    /// How long a holder keeps the Lease without renewing it, as observers count.
    pub lease_duration: Duration,
    /// How long a holder keeps acting without a successful renewal.
    pub renew_deadline: Duration,
    /// How often a holder renews and a candidate tries to acquire.
    pub retry_period: Duration,
}

impl LeaseConfig {
    /// The Lease `namespace/name` held as `identity`, with client-go's default timing.
    pub fn new(
        namespace: impl Into<String>,
        name: impl Into<String>,
        identity: impl Into<String>,
    ) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: DEFAULT_LEASE_DURATION,
            renew_deadline: DEFAULT_RENEW_DEADLINE,
            retry_period: DEFAULT_RETRY_PERIOD,
        }
    }

    /// Checks what fencing relies on, as client-go does: `lease_duration > renew_deadline`
    /// (a holder gives up before an observer may take over) and `renew_deadline >
    /// (1 + jitter) × retry_period` (a holder gets more than one try before giving up).
    /// Durations are whole seconds on the Lease, so `lease_duration` must be at least 1 s.
    pub fn validate(&self) -> Result<()> {
        for (value, what) in [
            (&self.namespace, "namespace"),
            (&self.name, "lease name"),
            (&self.identity, "identity"),
        ] {
            if value.is_empty() {
                return Err(Error::Empty(what));
            }
        }
        if self.lease_duration < Duration::from_secs(1) || self.lease_duration.subsec_nanos() != 0 {
            return Err(Error::InvalidTiming(
                "the lease duration must be a whole number of seconds, at least 1",
            ));
        }
        if self.lease_duration <= self.renew_deadline {
            return Err(Error::InvalidTiming(
                "the lease duration must exceed the renew deadline",
            ));
        }
        if self.renew_deadline.as_secs_f64() <= (1.0 + JITTER) * self.retry_period.as_secs_f64()
            || self.retry_period.is_zero()
        {
            return Err(Error::InvalidTiming(
                "the renew deadline must exceed 2.2 retry periods, and the retry period be positive",
            ));
        }
        Ok(())
    }
}

/// This process's identity as a candidate: the pod's name (`POD_NAME`, from the downward API),
/// else the host name and the process id, unique among processes of one host.
pub fn identity_from_environment() -> String {
    if let Some(pod) = std::env::var("POD_NAME").ok().filter(|p| !p.is_empty()) {
        return pod;
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    format!("{host}_{}", std::process::id())
}

/// The namespace this process runs in: `POD_NAMESPACE` (downward API), else the in-cluster
/// ServiceAccount's namespace file, else [`DEFAULT_NAMESPACE`].
pub fn namespace_from_environment() -> String {
    std::env::var("POD_NAMESPACE")
        .ok()
        .or_else(|| std::fs::read_to_string(IN_CLUSTER_NAMESPACE_FILE).ok())
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned())
}

/// A candidate for a Lease. [`acquire`](Self::acquire) waits until it holds it.
#[derive(Debug)]
pub struct LeaderElector {
    elector: Elector,
}

impl LeaderElector {
    /// A candidate for the Lease of `config`, talking to the API server through `client`.
    pub fn new(client: Client, config: LeaseConfig) -> Result<Self> {
        config.validate()?;
        Ok(Self {
            elector: Elector {
                api: Api::namespaced(client, &config.namespace),
                config,
                observed: None,
                written: None,
            },
        })
    }

    /// Waits until this candidate holds the Lease, retrying every retry period (with jitter)
    /// through API errors and conflicts; then renews it in a task of its own until the
    /// returned [`Leadership`] is released or lost. Cancel-safe: dropping the future before it
    /// completes leaves nothing running.
    pub async fn acquire(self) -> Leadership {
        let mut elector = self.elector;
        let started = Instant::now();
        let mut standing_by_for: Option<String> = None;
        loop {
            let attempt_started = Instant::now();
            let mut wait = jittered(elector.config.retry_period);
            match elector.try_acquire_or_renew().await {
                Ok(Outcome::Holding(decision)) => {
                    let transitions = elector.written_transitions();
                    tracing::info!(
                        identity = %elector.config.identity,
                        lease = %elector.lease_key(),
                        after = ?started.elapsed(),
                        ?decision,
                        transitions,
                        "became leader"
                    );
                    return Leadership::start(elector, attempt_started);
                }
                Ok(Outcome::HeldBy { holder, expires_in }) => {
                    if standing_by_for.as_deref() != Some(holder.as_str()) {
                        tracing::info!(
                            identity = %elector.config.identity,
                            lease = %elector.lease_key(),
                            %holder,
                            "standing by: another replica holds the lease"
                        );
                        standing_by_for = Some(holder);
                    }
                    // Try again as soon as it would expire, not a whole period later.
                    wait = wait.min(expires_in + Duration::from_millis(10));
                }
                Ok(Outcome::Conflict) => {
                    tracing::debug!(lease = %elector.lease_key(), "another candidate wrote the lease first");
                }
                Err(error) => {
                    tracing::warn!(lease = %elector.lease_key(), error = %error_chain(&error), "could not acquire the lease");
                }
            }
            tokio::time::sleep(wait).await;
        }
    }
}

/// The Lease, held. It is renewed in the background until [`release`](Self::release) or
/// until [`lost`](Self::lost) resolves.
#[derive(Debug)]
pub struct Leadership {
    identity: String,
    lease: String,
    lost: CancellationToken,
    stop: CancellationToken,
    /// `None` once [`release`](Self::release) took it.
    renewer: Option<JoinHandle<Elector>>,
}

/// Dropping a leadership stops renewing without releasing, as a process that dies would: the
/// Lease expires after its duration.
impl Drop for Leadership {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Leadership {
    fn start(elector: Elector, renewed_at: Instant) -> Self {
        let lost = CancellationToken::new();
        let stop = CancellationToken::new();
        let identity = elector.config.identity.clone();
        let lease = elector.lease_key();
        let renewer = tokio::spawn(renew(elector, renewed_at, lost.clone(), stop.clone()));
        Self {
            identity,
            lease,
            lost,
            stop,
            renewer: Some(renewer),
        }
    }

    /// This holder's identity.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Resolves when leadership is lost: no successful renewal within the renew deadline,
    /// another identity seen holding the Lease, or the renewing task gone. From then on this
    /// process must not write: another may acquire once `lease_duration - renew_deadline` has
    /// passed. Never resolves after a [`release`](Self::release) began.
    pub fn lost(&self) -> WaitForCancellationFutureOwned {
        self.lost.clone().cancelled_owned()
    }

    /// Whether leadership was lost.
    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }

    /// Stops renewing and gives the Lease up (no holder), so a standby takes over at its next
    /// try instead of waiting for the lease to expire. Call it only once this process stopped
    /// writing. A lost Lease is left as it is; a Lease someone else wrote meanwhile is theirs
    /// (the write is guarded by its resourceVersion and fails harmlessly).
    pub async fn release(mut self) -> Result<()> {
        self.stop.cancel();
        let Some(renewer) = self.renewer.take() else {
            return Ok(());
        };
        let Ok(elector) = renewer.await else {
            return Ok(());
        };
        if self.lost.is_cancelled() {
            return Ok(());
        }
        let deadline = elector.config.renew_deadline;
        let released = tokio::time::timeout(deadline, elector.release())
            .await
            .map_err(|_| Error::ReleaseTimedOut(deadline))?;
        if released? {
            tracing::info!(identity = %self.identity, lease = %self.lease, "released the lease");
        }
        Ok(())
    }
}

/// Renews every retry period until `stop`; cancels `lost` and returns when no renewal
/// succeeded within the renew deadline of the last successful one's start, or when another
/// identity holds the Lease.
async fn renew(
    mut elector: Elector,
    mut renewed_at: Instant,
    lost: CancellationToken,
    stop: CancellationToken,
) -> Elector {
    // A panic in here must not leave the holder acting with nobody renewing.
    let guard = lost.clone().drop_guard();
    let identity = elector.config.identity.clone();
    let lease = elector.lease_key();
    let lose = |reason: &str, renewed_at: Instant| {
        tracing::error!(
            %identity,
            %lease,
            reason,
            since_last_renewal = ?renewed_at.elapsed(),
            "lost leadership"
        );
    };
    loop {
        let deadline = renewed_at + elector.config.renew_deadline;
        let next = (Instant::now() + elector.config.retry_period).min(deadline);
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep_until(next) => {}
        }
        if Instant::now() >= deadline {
            lose("no renewal within the renew deadline", renewed_at);
            return elector;
        }
        let attempt_started = Instant::now();
        let attempt = tokio::select! {
            _ = stop.cancelled() => break,
            attempt = tokio::time::timeout_at(deadline, elector.try_acquire_or_renew()) => attempt,
        };
        match attempt {
            Ok(Ok(Outcome::Holding(_))) => renewed_at = attempt_started,
            Ok(Ok(Outcome::HeldBy { holder, .. })) => {
                lose(&format!("the lease is held by {holder}"), renewed_at);
                return elector;
            }
            Ok(Ok(Outcome::Conflict)) => {
                tracing::warn!(lease = %elector.lease_key(), "renewal conflicted with another write; retrying");
            }
            Ok(Err(error)) => {
                tracing::warn!(lease = %elector.lease_key(), error = %error_chain(&error), "could not renew the lease; retrying");
            }
            Err(_) => {
                lose("no renewal within the renew deadline", renewed_at);
                return elector;
            }
        }
    }
    guard.disarm();
    elector
}

/// What one try achieved.
#[derive(Debug)]
enum Outcome {
    /// This candidate holds the Lease now, by this decision.
    Holding(Decision),
    /// Another holds it and it has not expired.
    HeldBy {
        holder: String,
        expires_in: Duration,
    },
    /// Someone else wrote first (409).
    Conflict,
}

/// The shell around [`decide`]: reads and writes the Lease, keeps the observation.
#[derive(Debug)]
struct Elector {
    api: Api<Lease>,
    config: LeaseConfig,
    observed: Option<Observation>,
    /// The Lease as this candidate last wrote it, for the release's guarded write.
    written: Option<Lease>,
}

impl Elector {
    fn lease_key(&self) -> String {
        format!("{}/{}", self.config.namespace, self.config.name)
    }

    fn written_transitions(&self) -> Option<i32> {
        self.written
            .as_ref()
            .and_then(|l| l.spec.as_ref())
            .and_then(|s| s.lease_transitions)
    }

    fn api_error(&self, verb: &'static str, source: kube::Error) -> Error {
        Error::Api {
            verb,
            lease: self.lease_key(),
            source: Box::new(source),
        }
    }

    /// One round of client-go's `tryAcquireOrRenew`.
    async fn try_acquire_or_renew(&mut self) -> Result<Outcome> {
        let current = self
            .api
            .get_opt(&self.config.name)
            .await
            .map_err(|e| self.api_error("read", e))?;
        // After the read: the record was written before this instant, so expiry counted from
        // here is never earlier than its holder's own deadline.
        let now = Instant::now().into_std();
        let identity = self.config.identity.as_str();
        let wall_now = Timestamp::now();
        let Some(current) = current else {
            self.observed = None;
            let Some(record) = next_record(
                &Decision::Create,
                None,
                identity,
                self.config.lease_duration,
                wall_now,
            ) else {
                return Ok(Outcome::Conflict);
            };
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(with_record(LeaseSpec::default(), &record)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => {
                    self.wrote(created, record, now);
                    Ok(Outcome::Holding(Decision::Create))
                }
                Err(e) if is_conflict(&e) => Ok(Outcome::Conflict),
                Err(e) => Err(self.api_error("create", e)),
            };
        };
        let record = record_of(&current);
        let observed = Observation::update(self.observed.take(), record, now);
        let decision = decide(Some(&observed), now, identity);
        let next = next_record(
            &decision,
            Some(&observed.record),
            identity,
            self.config.lease_duration,
            wall_now,
        );
        self.observed = Some(observed);
        let Some(record) = next else {
            return Ok(match decision {
                Decision::Wait { holder, expires_in } => Outcome::HeldBy { holder, expires_in },
                _ => Outcome::Conflict,
            });
        };
        let mut update = current;
        update.spec = Some(with_record(update.spec.unwrap_or_default(), &record));
        // `update` carries the resourceVersion just read: a replace fails with 409 if anyone
        // wrote the Lease since.
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &update)
            .await
        {
            Ok(written) => {
                self.wrote(written, record, now);
                Ok(Outcome::Holding(decision))
            }
            Err(e) if is_conflict(&e) => Ok(Outcome::Conflict),
            Err(e) => Err(self.api_error("update", e)),
        }
    }

    fn wrote(&mut self, lease: Lease, record: LeaseRecord, now: std::time::Instant) {
        self.observed = Some(Observation { record, since: now });
        self.written = Some(lease);
    }

    /// Writes the released record over the Lease as last written; `Ok(false)` when someone
    /// wrote it since (409), which means it is no longer this candidate's to release.
    async fn release(mut self) -> Result<bool> {
        let Some(mut lease) = self.written.take() else {
            return Ok(false);
        };
        let spec = lease.spec.take().unwrap_or_default();
        let released = released_record(&record_of_spec(&spec), Timestamp::now());
        lease.spec = Some(with_record(spec, &released));
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if is_conflict(&e) => Ok(false),
            Err(e) => Err(self.api_error("release", e)),
        }
    }
}

fn is_conflict(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 409)
}

/// The election fields of `lease`; an empty `holderIdentity` means nobody holds it.
fn record_of(lease: &Lease) -> LeaseRecord {
    record_of_spec(lease.spec.as_ref().unwrap_or(&LeaseSpec::default()))
}

fn record_of_spec(spec: &LeaseSpec) -> LeaseRecord {
    LeaseRecord {
        holder: spec.holder_identity.clone().filter(|h| !h.is_empty()),
        lease_duration_seconds: spec.lease_duration_seconds.unwrap_or(0),
        acquire_time: spec.acquire_time.as_ref().map(|t| t.0),
        renew_time: spec.renew_time.as_ref().map(|t| t.0),
        transitions: spec.lease_transitions.unwrap_or(0),
    }
}

/// `spec` with the election fields of `record`; the others (`preferredHolder`, `strategy`)
/// are left as they were.
fn with_record(spec: LeaseSpec, record: &LeaseRecord) -> LeaseSpec {
    LeaseSpec {
        // client-go writes an empty string, not null, for "nobody".
        holder_identity: Some(record.holder.clone().unwrap_or_default()),
        lease_duration_seconds: Some(record.lease_duration_seconds),
        acquire_time: record.acquire_time.map(MicroTime),
        renew_time: record.renew_time.map(MicroTime),
        lease_transitions: Some(record.transitions),
        ..spec
    }
}

/// `period` stretched by a random factor in `[1, 1 + JITTER)`.
fn jittered(period: Duration) -> Duration {
    // A randomly keyed hasher is a random number without another dependency.
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let fraction = (random >> 11) as f64 / (1u64 << 53) as f64;
    period.mul_f64(1.0 + JITTER * fraction)
}

/// `error` and its sources, joined: the log line carries why, not only what.
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> LeaseConfig {
        LeaseConfig::new("ns", "lease", "me")
    }

    #[test]
    fn the_default_timing_is_client_gos_and_valid() {
        let c = config();
        assert_eq!(
            (c.lease_duration, c.renew_deadline, c.retry_period),
            (
                Duration::from_secs(15),
                Duration::from_secs(10),
                Duration::from_secs(2)
            )
        );
        c.validate().unwrap();
    }

    #[test]
    fn timing_that_cannot_fence_is_refused() {
        let mut c = config();
        c.renew_deadline = c.lease_duration;
        assert!(matches!(c.validate(), Err(Error::InvalidTiming(_))));
        let mut c = config();
        c.retry_period = Duration::from_secs(5);
        assert!(matches!(c.validate(), Err(Error::InvalidTiming(_))));
        let mut c = config();
        c.lease_duration = Duration::from_millis(15_500);
        assert!(matches!(c.validate(), Err(Error::InvalidTiming(_))));
        let mut c = config();
        c.identity.clear();
        assert!(matches!(c.validate(), Err(Error::Empty("identity"))));
    }

    #[test]
    fn jitter_stays_within_its_factor() {
        for _ in 0..1000 {
            let d = jittered(Duration::from_secs(2));
            assert!(
                d >= Duration::from_secs(2) && d < Duration::from_millis(4_400),
                "{d:?}"
            );
        }
    }

    #[test]
    fn a_record_round_trips_through_a_lease_spec_and_an_empty_holder_is_nobody() {
        let record = LeaseRecord {
            holder: Some("me".into()),
            lease_duration_seconds: 15,
            acquire_time: Some(Timestamp::from_second(1).unwrap()),
            renew_time: Some(Timestamp::from_second(2).unwrap()),
            transitions: 3,
        };
        let spec = with_record(
            LeaseSpec {
                preferred_holder: Some("kept".into()),
                ..LeaseSpec::default()
            },
            &record,
        );
        assert_eq!(spec.preferred_holder.as_deref(), Some("kept"));
        assert_eq!(record_of_spec(&spec), record);
        let released = with_record(spec, &released_record(&record, Timestamp::UNIX_EPOCH));
        assert_eq!(released.holder_identity.as_deref(), Some(""));
        assert_eq!(record_of_spec(&released).holder, None);
    }

    #[test]
    fn identity_and_namespace_have_defaults() {
        // The test process has no POD_NAME: host name and pid.
        if std::env::var_os("POD_NAME").is_none() {
            let identity = identity_from_environment();
            assert!(
                identity.ends_with(&format!("_{}", std::process::id())),
                "{identity}"
            );
        }
        assert!(!namespace_from_environment().is_empty());
    }
}

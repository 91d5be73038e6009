//! One machine reconcile for every backend. A backend says how to realise, observe and tear
//! down its machine kind ([`Backend`]); the skeleton here decides everything around it, the
//! same way for each:
//!
//! 1. a machine another Provider serves is left alone;
//! 2. a deleted machine is torn down under the backend's finalizer, which is removed only once
//!    the backend says nothing of the machine is left;
//! 3. otherwise the finalizer is added first (a JSON patch that tests the list it read), then
//!    what the backend must record before acting ([`Backend::before_realise`]), then the
//!    machine is realised;
//! 4. the status is a pure function of the machine and the outcome ([`Backend::status_after`])
//!    and is written only when it changed, guarded by the resourceVersion the reconcile read:
//!    the cache can lag behind this workload's own last write, and a stale status must never
//!    replace a newer one;
//! 5. every backend call runs under a deadline; a call past it is an error like any other,
//!    reported in the Ready condition;
//! 6. failures are retried with a per-object backoff, successes look again on the schedule of
//!    [`look_again`].

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use banlieue_api::Standby;
use banlieue_api::backend::MachineObject;
use banlieue_api::conditions::{self, Condition, error_message, types};
/// Why a write of the skeleton's failed; a backend maps it into its own error.
pub use banlieue_runtime::reconcile::PatchError;
use banlieue_runtime::reconcile::{self, ErrorBackoff};
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;

use crate::error::Core;

/// How a teardown step ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Teardown {
    /// Nothing of the machine is left on the backend: its finalizer may go.
    Done,
    /// The backend acted but cannot confirm yet (a destroyed VM still listed): look again.
    Again(Duration),
}

/// What one backend implements for its machine kind. Everything else about reconciling a
/// machine is [`run`]'s, and what every kind answers the same way (its finalizer, whether this
/// workload serves it, its status and conditions, the errors of the skeleton's own writes and
/// deadline) is provided from [`MachineObject`] and [`Core`].
pub trait Backend: Send + Sync + 'static {
    /// The machine kind (`LibvirtMachine`, `VSphereMachine`).
    type Machine: MachineObject<Status = Self::Status>
        + Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static;
    /// Its status, as the backend writes it.
    type Status: Serialize + PartialEq + Send + Sync;
    /// What realising a machine observed on the backend.
    type Observed: Send + Sync;
    /// The backend's error: the shared failures ([`Core`]) beside its own; its condition
    /// reason is the backend's to say.
    type Error: std::error::Error + From<Core> + Send + Sync + 'static;

    /// The Provider this workload serves.
    fn provider(&self) -> &str;

    /// The finalizer the backend's teardown runs under.
    fn finalizer(&self) -> &'static str {
        <Self::Machine as MachineObject>::FINALIZER
    }
    /// Whether this workload serves `machine`: its `spec.providerRef` names [`Self::provider`].
    fn serves(&self, machine: &Self::Machine) -> bool {
        machine.provider_name() == self.provider()
    }
    /// The status `machine` carries.
    fn status_of(machine: &Self::Machine) -> Option<&Self::Status> {
        machine.status()
    }
    /// The conditions of a status, for the look-again schedule. A saved machine has none: no
    /// backend asks a saved machine's guest anything (ADR-0073), so a GuestReady recorded while
    /// it still settled never settles, and must not make the skeleton look again sooner than
    /// the resync. `standby` is the contract's, so this holds for every backend that saves.
    fn conditions_of(status: &Self::Status) -> &[Condition] {
        let contract = <Self::Machine as MachineObject>::contract(status);
        if contract.standby == Some(Standby::Saved) {
            return &[];
        }
        &contract.conditions
    }
    /// Whether what was observed is a running machine.
    fn running(observed: &Self::Observed) -> bool;
    /// How often a running, settled machine is looked at again.
    fn resync(&self) -> Duration;

    /// A status merge patch the backend needs recorded before it acts, such as an identity
    /// chosen once that must survive a crash between two calls; `None` when nothing is
    /// missing. The skeleton writes it, guarded, and reconciles again.
    fn before_realise(&self, _machine: &Self::Machine) -> Option<serde_json::Value> {
        None
    }
    /// Makes the machine exist and run on the backend, and observes it.
    fn realise(
        &self,
        machine: &Self::Machine,
    ) -> impl Future<Output = Result<Self::Observed, Self::Error>> + Send;
    /// The status after a reconcile: what was observed, or the error as the Ready condition,
    /// with everything recorded before kept.
    fn status_after(
        &self,
        machine: &Self::Machine,
        outcome: &Result<Self::Observed, Self::Error>,
        now: Time,
    ) -> Self::Status;
    /// Removes what the machine holds on the backend.
    fn teardown(
        &self,
        machine: &Self::Machine,
    ) -> impl Future<Output = Result<Teardown, Self::Error>> + Send;
    /// The status of a machine whose teardown failed with `error` (Ready=False, TeardownFailed).
    fn teardown_failed(
        &self,
        machine: &Self::Machine,
        error: &Self::Error,
        now: Time,
    ) -> Self::Status;

    /// Called with every error a backend call ended with, before the status is written: a
    /// backend drops a connection the error shows is lost.
    fn recover(&self, _error: &Self::Error) -> impl Future<Output = ()> + Send {
        async {}
    }
    /// Called with every error, the API server's included (metrics).
    fn record_error(&self, _error: &Self::Error) {}
    /// Called after a status write, with the status before it (metrics of transitions).
    fn status_written(
        &self,
        _machine: &Self::Machine,
        _before: Option<&Self::Status>,
        _after: &Self::Status,
    ) {
    }
    /// The backend's error for a write to the API server that failed.
    fn patch_failed(what: String, error: PatchError) -> Self::Error {
        Core::patch_failed(what, error).into()
    }
    /// The backend's error for a backend call that did not end within `after`.
    fn deadline_exceeded(what: &'static str, after: Duration) -> Self::Error {
        Core::Deadline { what, after }.into()
    }
}

/// Settings of the skeleton, the same for every backend unless a workload says otherwise.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Deadline of one realise or teardown, every backend call in it included.
    pub deadline: Duration,
    /// First retry after a failed reconcile; doubles on each further failure.
    pub backoff_min: Duration,
    /// Longest wait between retries.
    pub backoff_max: Duration,
}

impl Default for Settings {
    /// Ten minutes per reconcile (a full clone on slow storage, a large volume upload),
    /// retries from 5 s, doubling, to a minute.
    fn default() -> Settings {
        Settings {
            deadline: Duration::from_secs(600),
            backoff_min: crate::MIN_ERROR_BACKOFF,
            backoff_max: crate::MAX_ERROR_BACKOFF,
        }
    }
}

struct Context<B: Backend> {
    backend: Arc<B>,
    api: Api<B::Machine>,
    settings: Settings,
    backoff: ErrorBackoff,
}

/// Reconciles the machines `api` lists until `shutdown` completes. Every message on `wake`
/// reconciles every machine again (the backend's own change feed: domain events, property
/// waits), beside the watch on the machines themselves; a channel of one is enough, since one
/// pending pass covers a burst of changes.
pub async fn run<B: Backend>(
    backend: Arc<B>,
    api: Api<B::Machine>,
    settings: Settings,
    wake: mpsc::Receiver<()>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let wake = futures::stream::unfold(wake, |mut rx| async move {
        rx.recv().await.map(|tick| (tick, rx))
    });
    let ctx = Arc::new(Context {
        backend,
        api: api.clone(),
        backoff: ErrorBackoff::new(settings.backoff_min, settings.backoff_max),
        settings,
    });
    Controller::new(api, watcher::Config::default())
        .reconcile_all_on(wake)
        .graceful_shutdown_on(shutdown)
        .run(
            |machine, ctx: Arc<Context<B>>| async move {
                let key = ErrorBackoff::key_of("machine", machine.as_ref());
                Ok(match reconcile(machine.as_ref(), &ctx).await? {
                    Step::Settled(action) => {
                        ctx.backoff.succeeded(&key);
                        action
                    }
                    // Reported in the status already: retried on the same backoff as an error.
                    Step::Failed => Action::requeue(ctx.backoff.failed(&key)),
                })
            },
            error_policy,
            ctx,
        )
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %error_message(&e), "machine reconcile");
            }
        })
        .await;
}

/// How a reconcile ended, for the backoff.
enum Step {
    /// Nothing failed: the action is the schedule's.
    Settled(Action),
    /// A backend call failed and the status says so: retry on the backoff.
    Failed,
}

fn error_policy<B: Backend>(
    machine: Arc<B::Machine>,
    error: &B::Error,
    ctx: Arc<Context<B>>,
) -> Action {
    ctx.backend.record_error(error);
    let delay = ctx
        .backoff
        .failed(&ErrorBackoff::key_of("machine", machine.as_ref()));
    tracing::warn!(error = %error_message(error), ?delay, "machine reconcile failed");
    Action::requeue(delay)
}

#[tracing::instrument(skip_all, fields(machine = %machine.name_any()))]
async fn reconcile<B: Backend>(machine: &B::Machine, ctx: &Context<B>) -> Result<Step, B::Error> {
    let backend = ctx.backend.as_ref();
    if !backend.serves(machine) {
        return Ok(Step::Settled(Action::await_change()));
    }
    let finalizer = backend.finalizer();
    if machine.meta().deletion_timestamp.is_some() {
        return tear_down(machine, ctx).await;
    }
    if !machine.finalizers().iter().any(|f| f == finalizer) {
        reconcile::add_finalizer(&ctx.api, machine, finalizer)
            .await
            .map_err(|e| B::patch_failed(what("update the finalizers of", machine), e))?;
        // The patch wakes the controller again with the new object.
        return Ok(Step::Settled(Action::await_change()));
    }
    if let Some(record) = backend.before_realise(machine) {
        return Ok(Step::Settled(
            if write_status(machine, ctx, &record).await? {
                Action::await_change()
            } else {
                Action::requeue(AFTER_CONFLICT)
            },
        ));
    }

    let outcome = within::<B, _>(ctx.settings.deadline, "realise", backend.realise(machine)).await;
    if let Err(e) = &outcome {
        backend.record_error(e);
        backend.recover(e).await;
    }
    let status = backend.status_after(machine, &outcome, now());
    let before = B::status_of(machine);
    if Some(&status) != before {
        if !write_status(machine, ctx, &status).await? {
            return Ok(Step::Settled(Action::requeue(AFTER_CONFLICT)));
        }
        backend.status_written(machine, before, &status);
    }
    Ok(match &outcome {
        Ok(observed) => Step::Settled(Action::requeue(look_again(
            B::running(observed),
            B::conditions_of(&status),
            backend.resync(),
            now(),
        ))),
        Err(_) => Step::Failed,
    })
}

async fn tear_down<B: Backend>(machine: &B::Machine, ctx: &Context<B>) -> Result<Step, B::Error> {
    let backend = ctx.backend.as_ref();
    let finalizer = backend.finalizer();
    if !machine.finalizers().iter().any(|f| f == finalizer) {
        return Ok(Step::Settled(Action::await_change()));
    }
    match within::<B, _>(ctx.settings.deadline, "teardown", backend.teardown(machine)).await {
        Ok(Teardown::Done) => {
            reconcile::remove_finalizer(&ctx.api, machine, finalizer)
                .await
                .map_err(|e| B::patch_failed(what("update the finalizers of", machine), e))?;
            Ok(Step::Settled(Action::await_change()))
        }
        Ok(Teardown::Again(after)) => Ok(Step::Settled(Action::requeue(after))),
        Err(e) => {
            backend.record_error(&e);
            backend.recover(&e).await;
            let status = backend.teardown_failed(machine, &e, now());
            if Some(&status) != B::status_of(machine) {
                write_status(machine, ctx, &status).await?;
            }
            Ok(Step::Failed)
        }
    }
}

/// Writes `status` guarded by the resourceVersion the reconcile read. False when the object
/// changed meanwhile (409): the caller looks again at the fresh object.
async fn write_status<B: Backend>(
    machine: &B::Machine,
    ctx: &Context<B>,
    status: &impl Serialize,
) -> Result<bool, B::Error> {
    let name = machine.name_any();
    let version = machine.resource_version();
    match reconcile::patch_status(&ctx.api, &name, status, version.as_deref()).await {
        Ok(_) => Ok(true),
        Err(e) if e.is_stale() => Ok(false),
        Err(e) => Err(B::patch_failed(
            format!("patch {} {name} status", B::Machine::kind(&())),
            e,
        )),
    }
}

/// `call`, or the backend's deadline error when it has not ended within `deadline`.
async fn within<B: Backend, T>(
    deadline: Duration,
    what: &'static str,
    call: impl Future<Output = Result<T, B::Error>>,
) -> Result<T, B::Error> {
    match tokio::time::timeout(deadline, call).await {
        Ok(result) => result,
        Err(_) => Err(B::deadline_exceeded(what, deadline)),
    }
}

fn what<K: Resource<DynamicType = ()>>(action: &str, object: &K) -> String {
    format!("{action} {} {}", K::kind(&()), object.name_any())
}

/// When a machine is looked at again after a reconcile that succeeded. A machine not running
/// yet (starting, powering on): in 5 s. A running machine whose guest has not said its final
/// word for this boot ([`crate::guest::still_settling`]): after a quarter of the time its
/// GuestReady has been unchanged, between 2 s and the resync, so a booting guest is asked
/// often and a guest without the phase layer (or without an agent) soon only at the resync.
/// Otherwise at the resync. The backend's change feed wakes it sooner; this is the backstop.
pub fn look_again(
    running: bool,
    conditions: &[Condition],
    resync: Duration,
    now: Time,
) -> Duration {
    let resync = resync.max(Duration::from_secs(2));
    if !running {
        return Duration::from_secs(5).min(resync);
    }
    let Some(guest) = conditions::find(conditions, types::GUEST_READY)
        .filter(|c| crate::guest::still_settling(c))
    else {
        return resync;
    };
    let unchanged =
        Duration::try_from(now.0.duration_since(guest.last_transition_time.0)).unwrap_or_default();
    (unchanged / 4).clamp(Duration::from_secs(2), resync)
}

/// Retry soon after a write lost to a concurrent change.
const AFTER_CONFLICT: Duration = Duration::from_millis(500);

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::conditions::{reasons, status};

    fn at(seconds: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000 + seconds).expect("time"))
    }

    fn guest_ready(reason: &str, since: i64) -> Vec<Condition> {
        let mut list = Vec::new();
        conditions::set(
            &mut list,
            conditions::new(types::GUEST_READY, status::FALSE, reason, "x", None),
            at(since),
        );
        list
    }

    #[test]
    fn a_machine_not_running_is_looked_at_in_five_seconds_or_the_resync() {
        let resync = Duration::from_secs(60);
        assert_eq!(
            look_again(false, &[], resync, at(0)),
            Duration::from_secs(5)
        );
        assert_eq!(
            look_again(false, &[], Duration::from_secs(3), at(0)),
            Duration::from_secs(3)
        );
    }

    #[test]
    fn a_settling_guest_is_asked_often_then_less_and_a_settled_one_at_the_resync() {
        let resync = Duration::from_secs(60);
        let booting = guest_ready(reasons::GUEST_PHASE_PENDING, 0);
        assert_eq!(
            look_again(true, &booting, resync, at(1)),
            Duration::from_secs(2)
        );
        assert_eq!(
            look_again(true, &booting, resync, at(40)),
            Duration::from_secs(10)
        );
        assert_eq!(look_again(true, &booting, resync, at(1000)), resync);
        let failed = guest_ready(reasons::GUEST_PHASE_FAILED, 0);
        assert_eq!(look_again(true, &failed, resync, at(1)), resync, "final");
        assert_eq!(
            look_again(true, &[], resync, at(1)),
            resync,
            "no GuestReady"
        );
    }
}

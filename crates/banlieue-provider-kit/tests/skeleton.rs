//! The machine-reconcile skeleton against a real API server, with a backend that only records
//! what it was asked and answers as each test says: the finalizer comes first and another
//! writer's survives, what must be recorded before acting is recorded before the first
//! realise, the status follows the outcome, a call past the deadline is reported like an
//! error, a machine of another Provider is never touched, and the finalizer goes only when
//! the backend says the teardown is done.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use banlieue_api::conditions::{self, Condition, status, types};
use banlieue_api::{
    Firmware, LibvirtDisk, LibvirtMachine, LibvirtMachineSpec, LibvirtMachineStatus,
    LocalObjectReference,
};
use banlieue_provider_kit::error::Core;
use banlieue_provider_kit::machine::{self, Backend, Settings, Teardown};
use banlieue_testenv::control_plane::{ControlPlane, wait_established, wait_for};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

type TestResult<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const PROVIDER: &str = "edge";
const FINALIZER: &str = "banlieue.io/test-protection";
const THEIRS: &str = "example.com/keep";
const WAIT: Duration = Duration::from_secs(30);

/// What the backend does when asked about one machine.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Answer {
    Succeed,
    Fail,
    Hang,
}

#[derive(Debug, thiserror::Error)]
enum TestError {
    #[error("the backend said no")]
    Refused,
    #[error(transparent)]
    Core(#[from] Core),
}

impl TestError {
    fn reason(&self) -> &'static str {
        match self {
            TestError::Refused => "Refused",
            TestError::Core(core) => core.reason("Deadline"),
        }
    }
}

#[derive(Default)]
struct Recorder {
    realise: HashMap<String, Answer>,
    teardown: HashMap<String, Answer>,
    /// Teardowns still to answer `Again` before the first `Done`.
    again: HashMap<String, u32>,
    /// Per machine: the domain UUID each realise saw recorded.
    realised: HashMap<String, Vec<Option<String>>>,
    torn_down: HashMap<String, u32>,
}

struct Fake(Mutex<Recorder>);

impl Fake {
    fn with<T>(&self, f: impl FnOnce(&mut Recorder) -> T) -> T {
        f(&mut self.0.lock().expect("recorder"))
    }
}

async fn answer(answer: Answer) -> Result<(), TestError> {
    match answer {
        Answer::Succeed => Ok(()),
        Answer::Fail => Err(TestError::Refused),
        Answer::Hang => std::future::pending().await,
    }
}

impl Backend for Fake {
    type Machine = LibvirtMachine;
    type Status = LibvirtMachineStatus;
    type Observed = ();
    type Error = TestError;

    fn finalizer(&self) -> &'static str {
        FINALIZER
    }

    fn provider(&self) -> &str {
        PROVIDER
    }

    fn running(_: &()) -> bool {
        true
    }

    fn resync(&self) -> Duration {
        Duration::from_secs(60)
    }

    fn before_realise(&self, machine: &LibvirtMachine) -> Option<serde_json::Value> {
        let recorded = machine.status.as_ref().and_then(|s| s.domain_uuid.as_ref());
        recorded
            .is_none()
            .then(|| json!({ "domainUuid": format!("uuid-of-{}", machine.name_any()) }))
    }

    async fn realise(&self, machine: &LibvirtMachine) -> Result<(), TestError> {
        let name = machine.name_any();
        let uuid = machine.status.as_ref().and_then(|s| s.domain_uuid.clone());
        let mode = self.with(|r| {
            r.realised.entry(name.clone()).or_default().push(uuid);
            r.realise.get(&name).copied().unwrap_or(Answer::Succeed)
        });
        answer(mode).await
    }

    fn status_after(
        &self,
        machine: &LibvirtMachine,
        outcome: &Result<(), TestError>,
        now: Time,
    ) -> LibvirtMachineStatus {
        let mut new = machine.status.clone().unwrap_or_default();
        new.contract.ready = outcome.is_ok();
        let ready = match outcome {
            Ok(()) => conditions::new(types::READY, status::TRUE, "Running", "running", None),
            Err(e) => conditions::new(
                types::READY,
                status::FALSE,
                e.reason(),
                conditions::error_message(e),
                None,
            ),
        };
        conditions::set(&mut new.contract.conditions, ready, now);
        new
    }

    async fn teardown(&self, machine: &LibvirtMachine) -> Result<Teardown, TestError> {
        let name = machine.name_any();
        let (mode, again) = self.with(|r| {
            *r.torn_down.entry(name.clone()).or_default() += 1;
            let again = r.again.get_mut(&name).filter(|n| **n > 0).map(|n| {
                *n -= 1;
            });
            (
                r.teardown.get(&name).copied().unwrap_or(Answer::Succeed),
                again.is_some(),
            )
        });
        answer(mode).await?;
        Ok(if again {
            Teardown::Again(Duration::from_millis(200))
        } else {
            Teardown::Done
        })
    }

    fn teardown_failed(
        &self,
        machine: &LibvirtMachine,
        error: &TestError,
        now: Time,
    ) -> LibvirtMachineStatus {
        let mut new = machine.status.clone().unwrap_or_default();
        new.contract.ready = false;
        let failed = conditions::new(
            types::READY,
            status::FALSE,
            "TeardownFailed",
            conditions::error_message(error),
            None,
        );
        conditions::set(&mut new.contract.conditions, failed, now);
        new
    }
}

struct Harness {
    api: Api<LibvirtMachine>,
    fake: Arc<Fake>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn start(deadline: Duration) -> TestResult<Harness> {
    let cp = ControlPlane::shared().await?;
    // The administrator's client: this tests the skeleton's protocol with the API server, not
    // a role's grants. Each backend's workload runs it as its own ServiceAccount under the
    // shipped RBAC in the providers' tests (`machine.rs`, `vcsim.rs`).
    let client = cp.client()?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = banlieue_api::crds()
        .into_iter()
        .find(|crd| crd.spec.names.kind == LibvirtMachine::kind(&()))
        .ok_or("no LibvirtMachine CRD")?;
    let name = crd.metadata.name.clone().ok_or("unnamed CRD")?;
    crds.patch(
        &name,
        &PatchParams::apply("banlieue-kit-tests").force(),
        &Patch::Apply(&crd),
    )
    .await?;
    wait_established(&client, &name).await?;
    let api = Api::namespaced(client, &cp.fresh_namespace().await?);
    let fake = Arc::new(Fake(Mutex::default()));
    let (stop, stopped) = tokio::sync::oneshot::channel();
    // Nothing wakes the machines but their own changes and the schedule.
    let (_, wake) = tokio::sync::mpsc::channel(1);
    let settings = Settings {
        deadline,
        backoff_min: Duration::from_millis(200),
        backoff_max: Duration::from_secs(1),
    };
    tokio::spawn(machine::run(
        fake.clone(),
        api.clone(),
        settings,
        wake,
        async move {
            let _ = stopped.await;
        },
    ));
    Ok(Harness {
        api,
        fake,
        stop: Some(stop),
    })
}

fn libvirt_machine(name: &str, provider: &str, finalizers: &[&str]) -> LibvirtMachine {
    let mut machine = LibvirtMachine::new(
        name,
        LibvirtMachineSpec {
            provider_ref: LocalObjectReference::new(provider),
            pool: "default".into(),
            network: "default".into(),
            disk: LibvirtDisk {
                backing_volume: Some("base.qcow2".into()),
                install_media: None,
                size: Quantity("64Mi".into()),
            },
            firmware: Firmware::Bios,
            tpm_enabled: false,
            secure_boot: false,
            cpu: 1,
            memory: Quantity("256Mi".into()),
            user_data: None,
            user_data_secret_ref: None,
            standby: None,
            access: None,
            handover: None,
            egress: None,
        },
    );
    machine.metadata = ObjectMeta {
        name: Some(name.into()),
        finalizers: Some(finalizers.iter().map(|f| (*f).to_owned()).collect()),
        ..ObjectMeta::default()
    };
    machine
}

fn ready(machine: &LibvirtMachine) -> Option<&Condition> {
    conditions::find(&machine.status.as_ref()?.contract.conditions, types::READY)
}

async fn ready_reason(h: &Harness, name: &str, reason: &str) -> TestResult<LibvirtMachine> {
    let api = h.api.clone();
    Ok(
        wait_for(&format!("{name} Ready reason {reason}"), WAIT, || {
            let api = api.clone();
            async move {
                let m = api.get(name).await?;
                Ok(ready(&m).is_some_and(|c| c.reason == reason).then_some(m))
            }
        })
        .await?,
    )
}

async fn gone(h: &Harness, name: &str) -> TestResult {
    let api = h.api.clone();
    wait_for(&format!("{name} deleted"), WAIT, || {
        let api = api.clone();
        async move { Ok(api.get_opt(name).await?.is_none().then_some(())) }
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_machine_is_protected_recorded_then_realised_and_another_providers_is_left_alone()
-> TestResult {
    let h = start(Duration::from_secs(30)).await?;
    let post = PostParams::default();
    h.api
        .create(&post, &libvirt_machine("theirs", "elsewhere", &[]))
        .await?;
    h.api
        .create(&post, &libvirt_machine("ours", PROVIDER, &[THEIRS]))
        .await?;

    let ours = ready_reason(&h, "ours", "Running").await?;
    assert_eq!(
        ours.finalizers(),
        [THEIRS, FINALIZER],
        "another writer's finalizer is kept"
    );
    let status = ours.status.as_ref().ok_or("status")?;
    assert!(status.contract.ready);
    assert_eq!(status.domain_uuid.as_deref(), Some("uuid-of-ours"));
    let seen = h
        .fake
        .with(|r| r.realised.get("ours").cloned())
        .unwrap_or_default();
    assert!(
        !seen.is_empty()
            && seen
                .iter()
                .all(|uuid| uuid.as_deref() == Some("uuid-of-ours")),
        "every realise ran with the UUID recorded first: {seen:?}"
    );

    // The same watch delivered both machines; the one another Provider serves is untouched.
    let theirs = h.api.get("theirs").await?;
    assert!(theirs.finalizers().is_empty(), "{:?}", theirs.finalizers());
    assert!(theirs.status.is_none());
    assert!(h.fake.with(|r| !r.realised.contains_key("theirs")));

    // Deleted: the finalizer goes once the teardown is done, and only ours.
    h.fake.with(|r| r.again.insert("ours".into(), 2));
    h.api.delete("ours", &Default::default()).await?;
    let api = h.api.clone();
    let left = wait_for("our finalizer removed", WAIT, || {
        let api = api.clone();
        async move {
            let m = api.get("ours").await?;
            Ok((m.finalizers() == [THEIRS]).then_some(m))
        }
    })
    .await?;
    assert!(left.metadata.deletion_timestamp.is_some());
    let teardowns = h
        .fake
        .with(|r| r.torn_down.get("ours").copied().unwrap_or(0));
    assert!(
        teardowns >= 3,
        "twice not yet confirmed, then done: {teardowns}"
    );
    h.api
        .patch(
            "ours",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await?;
    gone(&h, "ours").await?;
    h.api.delete("theirs", &Default::default()).await?;
    gone(&h, "theirs").await
}

#[tokio::test]
async fn failures_and_a_call_past_the_deadline_are_reported_and_retried() -> TestResult {
    let h = start(Duration::from_secs(2)).await?;
    let post = PostParams::default();
    h.fake.with(|r| {
        r.realise.insert("failing".into(), Answer::Fail);
        r.realise.insert("hanging".into(), Answer::Hang);
    });
    h.api
        .create(&post, &libvirt_machine("failing", PROVIDER, &[]))
        .await?;
    h.api
        .create(&post, &libvirt_machine("hanging", PROVIDER, &[]))
        .await?;

    let failing = ready_reason(&h, "failing", "Refused").await?;
    assert_eq!(
        ready(&failing).map(|c| c.message.as_str()),
        Some("the backend said no")
    );
    let hanging = ready_reason(&h, "hanging", "Deadline").await?;
    assert_eq!(
        ready(&hanging).map(|c| c.message.as_str()),
        Some("realise: not done within 2s")
    );
    // A failure is retried on the backoff, without a change to the object.
    let api = h.api.clone();
    let fake = h.fake.clone();
    wait_for("the failing machine retried", WAIT, || {
        let fake = fake.clone();
        async move {
            Ok(fake
                .with(|r| r.realised.get("failing").map_or(0, Vec::len) >= 3)
                .then_some(()))
        }
    })
    .await?;
    // Once the backend recovers, the next retry clears the condition.
    h.fake
        .with(|r| r.realise.insert("failing".into(), Answer::Succeed));
    ready_reason(&h, "failing", "Running").await?;

    // A teardown that fails keeps the finalizer and says why; once it succeeds, the machine goes.
    h.fake
        .with(|r| r.teardown.insert("failing".into(), Answer::Fail));
    api.delete("failing", &Default::default()).await?;
    let stuck = ready_reason(&h, "failing", "TeardownFailed").await?;
    assert!(stuck.finalizers().iter().any(|f| f == FINALIZER));
    h.fake
        .with(|r| r.teardown.insert("failing".into(), Answer::Succeed));
    gone(&h, "failing").await?;

    h.fake
        .with(|r| r.teardown.insert("hanging".into(), Answer::Succeed));
    api.delete("hanging", &Default::default()).await?;
    gone(&h, "hanging").await
}

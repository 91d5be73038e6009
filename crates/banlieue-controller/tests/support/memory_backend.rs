//! A third machine backend that exists only in tests: MemoryMachines, realised by a fake
//! hypervisor that holds its machines in this process's memory. It is what
//! `docs/guides/provider-internals.md` ("Adding a backend") asks of a new backend, and nothing
//! more:
//!
//! 1. a CRD ([`crd`]): `test.banlieue.io/v1alpha1` MemoryMachine, whose spec is the placement
//!    the controller writes ([`PlacementSpec`]) and whose status flattens the machine contract;
//! 2. a builder the controller is given ([`builder`], `MachineBackend::of_placement`);
//! 3. a provider written with the kit alone: [`MemoryProvider`] implements
//!    `banlieue_provider_kit::machine::Backend`, and `machine::run` does the finalizer, the
//!    guarded status writes, the deadline, the backoff and the look-again schedule.
//!
//! The hypervisor obeys the same switches as the fake provider of the other kinds
//! ([`Controls`]), so the controller's integration suite runs unchanged against it
//! (`BANLIEUE_TEST_MACHINE_KIND=MemoryMachine`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use banlieue_api::backend::{MachineBackend, MachineObject, PlacementSpec};
use banlieue_api::conditions::{self, reasons, status, types};
use banlieue_api::{MachineAddress, MachineStatusContract};
use banlieue_provider_kit::error::Core;
use banlieue_provider_kit::guest::{self, Phase};
use banlieue_provider_kit::machine::{self, Backend, Settings, Teardown};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::{Client, CustomResource, ResourceExt};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::mpsc;

use super::fake_provider::{Controls, FAKE_EK_PEM};

pub const GROUP: &str = "test.banlieue.io";
pub const KIND: &str = "MemoryMachine";
pub const PLURAL: &str = "memorymachines";
pub const FINALIZER: &str = "test.banlieue.io/memory-protection";
/// The Ready reason of a running MemoryMachine.
pub const RUNNING: &str = "Running";

/// A machine held in memory: placed by the controller, realised by [`MemoryProvider`].
#[derive(CustomResource, Clone, Debug, Serialize, Deserialize)]
#[kube(
    group = "test.banlieue.io",
    version = "v1alpha1",
    kind = "MemoryMachine",
    namespaced,
    status = "MemoryMachineStatus",
    schema = "disabled"
)]
pub struct MemoryMachineSpec {
    #[serde(flatten)]
    pub placement: PlacementSpec,
}

/// The machine contract, and the hypervisor's serial number of the machine.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryMachineStatus {
    #[serde(flatten)]
    pub contract: MachineStatusContract,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_id: Option<u32>,
}

impl MachineObject for MemoryMachine {
    type Status = MemoryMachineStatus;
    const FINALIZER: &'static str = FINALIZER;

    fn provider_name(&self) -> &str {
        &self.spec.placement.provider_ref.name
    }

    fn status(&self) -> Option<&MemoryMachineStatus> {
        self.status.as_ref()
    }

    fn contract(status: &MemoryMachineStatus) -> &MachineStatusContract {
        &status.contract
    }
}

/// The controller's builder of MemoryMachines.
pub fn builder() -> MachineBackend {
    MachineBackend::of_placement(&format!("{GROUP}/v1alpha1"), KIND, PLURAL, FINALIZER)
}

/// `--placement-kind` for the standalone controller: the same builder in a child process.
pub fn placement_kind_flag() -> String {
    format!("{GROUP}/v1alpha1/{KIND}/{PLURAL}/{FINALIZER}")
}

/// The CRD: the schema is left open (the controller writes the spec, the provider the status;
/// neither is what this backend tests), with the status subresource both write through.
pub fn crd() -> CustomResourceDefinition {
    let open = json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{PLURAL}.{GROUP}")},
        "spec": {
            "group": GROUP,
            "names": {"kind": KIND, "plural": PLURAL, "singular": "memorymachine",
                      "listKind": "MemoryMachineList"},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1alpha1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": open, "status": open,
                }}},
            }],
        },
    }))
    .expect("a valid CRD")
}

/// The controller's rights on MemoryMachines, granted beside its shipped ClusterRole, as an
/// administrator adding a backend grants them.
pub fn controller_rules(role: &str) -> serde_json::Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": role},
        "rules": [{"apiGroups": [GROUP], "resources": [PLURAL],
                   "verbs": ["get", "list", "watch", "create", "patch", "delete"]}],
    })
}

/// A machine the hypervisor runs.
#[derive(Debug)]
struct Held {
    serial: u32,
    /// Whether its guest reports ready: decided when it boots, as a real guest's would be.
    guest_ready: bool,
}

/// The fake hypervisor: machines by namespace and name, and when each teardown began.
#[derive(Debug, Default)]
struct Hypervisor {
    running: HashMap<String, Held>,
    tearing_down: HashMap<String, Instant>,
}

/// The provider of MemoryMachines.
pub struct MemoryProvider {
    hypervisor: Mutex<Hypervisor>,
    next_serial: AtomicU32,
    controls: Arc<Controls>,
}

/// What realising a machine found.
#[derive(Debug)]
pub struct Observed {
    /// `None` while the hypervisor does not start machines ([`Controls::ready_gate`]).
    running: Option<(u32, bool)>,
}

#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    #[error(transparent)]
    Core(#[from] Core),
}

impl MemoryError {
    fn reason(&self) -> &'static str {
        match self {
            MemoryError::Core(core) => core.reason("DeadlineExceeded"),
        }
    }
}

fn key(machine: &MemoryMachine) -> String {
    format!(
        "{}/{}",
        machine.namespace().unwrap_or_default(),
        machine.name_any()
    )
}

/// The address the hypervisor gives the machine with `serial`.
fn address(serial: u32) -> String {
    format!("10.0.{}.{}", serial / 250, serial % 250 + 1)
}

impl MemoryProvider {
    fn hypervisor(&self) -> std::sync::MutexGuard<'_, Hypervisor> {
        self.hypervisor.lock().expect("hypervisor")
    }
}

impl Backend for MemoryProvider {
    type Machine = MemoryMachine;
    type Status = MemoryMachineStatus;
    type Observed = Observed;
    type Error = MemoryError;

    /// Asked by nobody: this provider serves every machine ([`Backend::serves`] below).
    fn provider(&self) -> &str {
        "memory"
    }

    /// One provider serves every machine of the namespace, as the fake provider does.
    fn serves(&self, _: &MemoryMachine) -> bool {
        true
    }

    fn running(observed: &Observed) -> bool {
        observed.running.is_some()
    }

    fn resync(&self) -> Duration {
        Duration::from_secs(60)
    }

    async fn realise(&self, machine: &MemoryMachine) -> Result<Observed, MemoryError> {
        let key = key(machine);
        let mut hypervisor = self.hypervisor();
        if let Some(held) = hypervisor.running.get(&key) {
            return Ok(Observed {
                running: Some((held.serial, held.guest_ready)),
            });
        }
        if !self.controls.ready_gate.load(Ordering::SeqCst) {
            return Ok(Observed { running: None });
        }
        let held = Held {
            serial: self.next_serial.fetch_add(1, Ordering::SeqCst),
            guest_ready: self.controls.guest_ready.load(Ordering::SeqCst),
        };
        let running = Some((held.serial, held.guest_ready));
        hypervisor.running.insert(key, held);
        Ok(Observed { running })
    }

    fn status_after(
        &self,
        machine: &MemoryMachine,
        outcome: &Result<Observed, MemoryError>,
        now: Time,
    ) -> MemoryMachineStatus {
        let generation = machine.metadata.generation;
        let mut new = machine.status.clone().unwrap_or_default();
        let ready = match outcome {
            Err(error) => conditions::new(
                types::READY,
                status::FALSE,
                error.reason(),
                conditions::error_message(error),
                generation,
            ),
            Ok(Observed { running: None }) => conditions::new(
                types::READY,
                status::FALSE,
                reasons::PROVISIONING,
                "the hypervisor starts no machine yet",
                generation,
            ),
            Ok(Observed {
                running: Some((serial, guest_ready)),
            }) => {
                let tpm = machine.spec.placement.tpm_enabled;
                let contract = &mut new.contract;
                contract.ready = true;
                contract.initialization.provisioned = true;
                contract.provider_id = Some(format!("memory://{}/{serial}", key(machine)));
                contract.addresses = vec![MachineAddress {
                    type_: "InternalIP".to_owned(),
                    address: address(*serial),
                }];
                // Not a real certificate: the controller copies the recorded bytes.
                if tpm {
                    contract.tpm_endorsement_certificates = vec![FAKE_EK_PEM.to_owned()];
                    contract.tpm_endorsement_key_digests =
                        vec![format!("sha256:{}", "00".repeat(32))];
                }
                // A guest that says nothing publishes no GuestReady, like the fake provider's.
                if *guest_ready {
                    let recorded = contract.tpm_endorsement_certificates.len();
                    let condition = guest::guest_ready(
                        &Phase::Ready,
                        tpm,
                        recorded,
                        || "the hypervisor recorded no EK certificate".to_owned(),
                        generation,
                    );
                    conditions::set(&mut contract.conditions, condition, now.clone());
                }
                new.memory_id = Some(*serial);
                conditions::new(types::READY, status::TRUE, RUNNING, "", generation)
            }
        };
        if ready.status != status::TRUE {
            new.contract.ready = false;
        }
        conditions::set(&mut new.contract.conditions, ready, now);
        new
    }

    async fn teardown(&self, machine: &MemoryMachine) -> Result<Teardown, MemoryError> {
        let key = key(machine);
        let mut hypervisor = self.hypervisor();
        let since = *hypervisor
            .tearing_down
            .entry(key.clone())
            .or_insert_with(Instant::now);
        if self.controls.hold_teardown.load(Ordering::SeqCst) {
            return Ok(Teardown::Again(Duration::from_millis(100)));
        }
        let delay = Duration::from_millis(
            self.controls
                .teardown_delay_ms
                .load(Ordering::SeqCst)
                .into(),
        );
        if let Some(left) = delay.checked_sub(since.elapsed()).filter(|d| !d.is_zero()) {
            return Ok(Teardown::Again(left));
        }
        hypervisor.running.remove(&key);
        hypervisor.tearing_down.remove(&key);
        Ok(Teardown::Done)
    }

    fn teardown_failed(
        &self,
        machine: &MemoryMachine,
        error: &MemoryError,
        now: Time,
    ) -> MemoryMachineStatus {
        let mut new = machine.status.clone().unwrap_or_default();
        new.contract.ready = false;
        let failed = conditions::new(
            types::READY,
            status::FALSE,
            reasons::TEARDOWN_FAILED,
            conditions::error_message(error),
            machine.metadata.generation,
        );
        conditions::set(&mut new.contract.conditions, failed, now);
        new
    }
}

/// Runs the provider of `namespace`'s MemoryMachines until the task is aborted. `client` is the
/// admin's: a test-only backend has no shipped role to run as.
pub fn start(
    client: Client,
    namespace: &str,
    controls: Arc<Controls>,
) -> tokio::task::JoinHandle<()> {
    let provider = Arc::new(MemoryProvider {
        hypervisor: Mutex::default(),
        next_serial: AtomicU32::new(0),
        controls: controls.clone(),
    });
    let api: Api<MemoryMachine> = Api::namespaced(client, namespace);
    let (wake, woken) = mpsc::channel(1);
    tokio::spawn(async move {
        // The hypervisor's change feed: a switch a test flips changes what every machine would
        // observe, as a domain event would.
        let _feed = AbortOnDrop(tokio::spawn(watch_controls(controls, wake)));
        machine::run(
            provider,
            api,
            Settings::default(),
            woken,
            std::future::pending(),
        )
        .await;
    })
}

/// Sends a wake-up whenever one of `controls` changes.
async fn watch_controls(controls: Arc<Controls>, wake: mpsc::Sender<()>) {
    let read = |c: &Controls| {
        (
            c.ready_gate.load(Ordering::SeqCst),
            c.hold_teardown.load(Ordering::SeqCst),
            c.guest_ready.load(Ordering::SeqCst),
            c.teardown_delay_ms.load(Ordering::SeqCst),
        )
    };
    let mut last = read(&controls);
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    loop {
        tick.tick().await;
        let now = read(&controls);
        if now != last {
            last = now;
            let _ = wake.try_send(());
        }
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

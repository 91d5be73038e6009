//! A stand-in for the provider of the machine kind under test ([`super::backend`]) that plays
//! only the machine contract: it holds the kind's finalizer (`banlieue.io/domain-protection` on
//! LibvirtMachines, `banlieue.io/vm-protection` on VSphereMachines) on every machine, marks
//! machines ready with an address (and optionally GuestReady) and the name of their domain or
//! VM, and releases the finalizer a little after deletion, as a provider does once the domain
//! or VM is destroyed. It reads and writes machines as `DynamicObject`s, only the contract's
//! fields and that name, and never reads a VirtualMachine.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use banlieue_api::{MachineSpecContract, MachineStatusContract, Standby};
use futures::StreamExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;

use super::backend::{Backend, backend};

/// Switches a test flips while the fake provider runs.
#[derive(Debug)]
pub struct Controls {
    /// New machines become ready only while this is true.
    pub ready_gate: AtomicBool,
    /// Deleted machines keep their finalizer while this is true (a slow teardown).
    pub hold_teardown: AtomicBool,
    /// Ready machines also publish GuestReady.
    pub guest_ready: AtomicBool,
    /// How long after deletion the finalizer is released.
    pub teardown_delay_ms: AtomicU32,
    /// A machine asked to run again after a save stays saved while this is true (a slow
    /// restore).
    pub hold_resume: AtomicBool,
    /// A machine asked to run again after a save reports `Ready=False RestoreFailed`, as a
    /// provider whose save image no longer restores does.
    pub fail_resume: AtomicBool,
}

/// A running fake provider; stops when dropped.
pub struct FakeProvider {
    pub controls: Arc<Controls>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeProvider {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeProvider {
    pub fn start(admin: Client, namespace: &str) -> Self {
        let controls = Arc::new(Controls {
            ready_gate: AtomicBool::new(true),
            hold_teardown: AtomicBool::new(false),
            guest_ready: AtomicBool::new(true),
            teardown_delay_ms: AtomicU32::new(300),
            hold_resume: AtomicBool::new(false),
            fail_resume: AtomicBool::new(false),
        });
        // The test-only kind has a real provider, written with the kit: it plays the same
        // switches.
        let task = if backend().is_memory() {
            super::memory_backend::start(admin, namespace, controls.clone())
        } else {
            let api: Api<DynamicObject> =
                Api::namespaced_with(admin, namespace, &backend().resource());
            tokio::spawn(serve(api, backend(), controls.clone()))
        };
        Self { controls, task }
    }
}

async fn serve(api: Api<DynamicObject>, backend: &'static Backend, controls: Arc<Controls>) {
    let writer = reflector::store::Writer::new(backend.resource());
    let store = writer.as_reader();
    let events = reflector::reflector(
        writer,
        watcher(api.clone(), watcher::Config::default()).default_backoff(),
    )
    .for_each(|_| futures::future::ready(()));
    // Stops with this task, so a dropped fake leaves no watch behind.
    let _events = AbortOnDrop(tokio::spawn(events));
    let mut seen_deleting: HashMap<String, Instant> = HashMap::new();
    let mut addresses: HashMap<String, (u32, String)> = HashMap::new();
    // Machines (by uid) whose ready status was written: a provider reports a state once, and
    // the cache may not show the write by the next tick.
    let mut reported: std::collections::HashSet<String> = std::collections::HashSet::new();
    let next_address = AtomicU32::new(0);
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        tick.tick().await;
        for machine in store.state() {
            let name = machine.name_any();
            let has_finalizer = machine.finalizers().iter().any(|f| f == backend.finalizer);
            if machine.metadata.deletion_timestamp.is_some() {
                let since = *seen_deleting
                    .entry(name.clone())
                    .or_insert_with(Instant::now);
                let delay =
                    Duration::from_millis(controls.teardown_delay_ms.load(Ordering::SeqCst).into());
                if has_finalizer
                    && !controls.hold_teardown.load(Ordering::SeqCst)
                    && since.elapsed() >= delay
                {
                    let patch = json!({"metadata": {"finalizers": null}});
                    let _ = api
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await;
                }
                continue;
            }
            if !has_finalizer {
                let patch = json!({"metadata": {"finalizers": [backend.finalizer]}});
                let _ = api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await;
                continue;
            }
            let Some((spec, status)) = contract(&machine) else {
                continue;
            };
            let ready = status.ready;
            let uid = machine.uid().unwrap_or_default();
            if ready {
                play_standby(&api, &machine, &spec, &status, &controls).await;
            }
            if !ready && !reported.contains(&uid) && controls.ready_gate.load(Ordering::SeqCst) {
                let (serial, address) = addresses.entry(name.clone()).or_insert_with(|| {
                    let n = next_address.fetch_add(1, Ordering::SeqCst);
                    (n, format!("10.0.{}.{}", n / 250, n % 250 + 1))
                });
                let mut conditions = vec![json!({"type": "Ready", "status": "True",
                    "reason": backend.running_reason, "message": "", "lastTransitionTime": now()})];
                if controls.guest_ready.load(Ordering::SeqCst) {
                    conditions.push(json!({"type": "GuestReady", "status": "True",
                        "reason": backend.guest_ready_reason, "message": "",
                        "lastTransitionTime": now()}));
                }
                let mut status = json!({"status": {
                    "ready": true,
                    "initialization": {"provisioned": true},
                    "addresses": [{"type": "InternalIP", "address": address}],
                    "conditions": conditions,
                }});
                let identity =
                    backend.host_identity(&machine.namespace().unwrap_or_default(), &name, *serial);
                if let (Some(status), Some(identity)) =
                    (status["status"].as_object_mut(), identity.as_object())
                {
                    status.extend(identity.clone());
                }
                // A vTPM's EK certificate, as both providers record it (ADR-0045): a
                // tpmEnabled member is not available without one.
                if spec.tpm_enabled {
                    status["status"]["tpmEndorsementCertificates"] = json!([FAKE_EK_PEM]);
                    status["status"]["tpmEndorsementKeyDigests"] =
                        json!([format!("sha256:{}", "00".repeat(32))]);
                }
                if api
                    .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                    .await
                    .is_ok()
                {
                    reported.insert(uid);
                }
            }
        }
    }
}

/// Does what `spec.standby` asks of a ready machine, at once (ADR-0073): reports it, for the
/// machine's generation, as a provider does once it saved or restored the domain. Kinds whose
/// provider cannot save never see the field written.
async fn play_standby(
    api: &Api<DynamicObject>,
    machine: &DynamicObject,
    spec: &MachineSpecContract,
    status: &MachineStatusContract,
    controls: &Controls,
) {
    let Some(wanted) = spec.standby else { return };
    let generation = machine.metadata.generation;
    let reported = status.standby == Some(wanted) && status.observed_generation >= generation;
    let held = wanted == Standby::Running && controls.hold_resume.load(Ordering::SeqCst);
    if reported || held {
        return;
    }
    let resuming = wanted == Standby::Running && status.standby == Some(Standby::Saved);
    let patch = if resuming && controls.fail_resume.load(Ordering::SeqCst) {
        if status.observed_generation >= generation {
            return;
        }
        json!({"status": {"observedGeneration": generation, "conditions": [{
            "type": "Ready", "status": "False", "reason": "RestoreFailed",
            "message": "the save image no longer restores; it was removed",
            "lastTransitionTime": now()}]}})
    } else {
        json!({"status": {"standby": wanted, "observedGeneration": generation}})
    };
    let _ = api
        .patch_status(
            &machine.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await;
}

/// The contract a machine of any kind carries: its spec's and its status's (the default until a
/// status is written). `None` for an object that does not carry it, which no provider acts on.
fn contract(machine: &DynamicObject) -> Option<(MachineSpecContract, MachineStatusContract)> {
    let spec = serde_json::from_value(machine.data.get("spec")?.clone()).ok()?;
    let status = match machine.data.get("status") {
        None | Some(serde_json::Value::Null) => MachineStatusContract::default(),
        Some(status) => serde_json::from_value(status.clone()).ok()?,
    };
    Some((spec, status))
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Not a real certificate: the controller copies the recorded bytes and never parses them.
pub const FAKE_EK_PEM: &str = "-----BEGIN CERTIFICATE-----\nZmFrZQ==\n-----END CERTIFICATE-----\n";

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

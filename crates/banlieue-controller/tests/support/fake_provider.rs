//! A stand-in for the libvirt provider that plays only the LibvirtMachine contract: it holds
//! `banlieue.io/domain-protection` on every machine, marks machines ready with an address (and
//! optionally GuestReady), and releases the finalizer a little after deletion, as a provider
//! does once the domain is destroyed. It never reads a VirtualMachine.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use banlieue_api::LibvirtMachine;
use banlieue_api::names::FINALIZER_DOMAIN_PROTECTION;
use futures::StreamExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;

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
        });
        let api: Api<LibvirtMachine> = Api::namespaced(admin, namespace);
        let task = tokio::spawn(serve(api, controls.clone()));
        Self { controls, task }
    }
}

async fn serve(api: Api<LibvirtMachine>, controls: Arc<Controls>) {
    let (store, writer) = reflector::store();
    let events = reflector::reflector(
        writer,
        watcher(api.clone(), watcher::Config::default()).default_backoff(),
    )
    .for_each(|_| futures::future::ready(()));
    tokio::spawn(events);
    let mut seen_deleting: HashMap<String, Instant> = HashMap::new();
    let mut addresses: HashMap<String, String> = HashMap::new();
    // Machines (by uid) whose ready status was written: a provider reports a state once, and
    // the cache may not show the write by the next tick.
    let mut reported: std::collections::HashSet<String> = std::collections::HashSet::new();
    let next_address = AtomicU32::new(0);
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        tick.tick().await;
        for machine in store.state() {
            let name = machine.name_any();
            let has_finalizer = machine
                .finalizers()
                .iter()
                .any(|f| f == FINALIZER_DOMAIN_PROTECTION);
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
                let patch = json!({"metadata": {"finalizers": [FINALIZER_DOMAIN_PROTECTION]}});
                let _ = api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await;
                continue;
            }
            let ready = machine.status.as_ref().is_some_and(|s| s.contract.ready);
            let uid = machine.uid().unwrap_or_default();
            if !ready && !reported.contains(&uid) && controls.ready_gate.load(Ordering::SeqCst) {
                let address = addresses.entry(name.clone()).or_insert_with(|| {
                    let n = next_address.fetch_add(1, Ordering::SeqCst);
                    format!("10.0.{}.{}", n / 250, n % 250 + 1)
                });
                let mut conditions = vec![
                    json!({"type": "Ready", "status": "True", "reason": "DomainRunning",
                    "message": "", "lastTransitionTime": now()}),
                ];
                if controls.guest_ready.load(Ordering::SeqCst) {
                    conditions.push(
                        json!({"type": "GuestReady", "status": "True", "reason": "GuestReady",
                        "message": "", "lastTransitionTime": now()}),
                    );
                }
                let mut status = json!({"status": {
                    "ready": true,
                    "initialization": {"provisioned": true},
                    "domainName": format!("{}-{name}", machine.namespace().unwrap_or_default()),
                    "addresses": [{"type": "InternalIP", "address": address}],
                    "conditions": conditions,
                }});
                // A vTPM's EK certificate, as the libvirt provider records it (ADR-0045): a
                // tpmEnabled member is not available without one.
                if machine.spec.tpm_enabled {
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

/// Not a real certificate: the controller copies the recorded bytes and never parses them.
pub const FAKE_EK_PEM: &str = "-----BEGIN CERTIFICATE-----\nZmFrZQ==\n-----END CERTIFICATE-----\n";

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

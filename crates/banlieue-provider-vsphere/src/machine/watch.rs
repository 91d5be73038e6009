//! The property wait that wakes machines: one PropertyCollector of the workload's own, one
//! filter over every VM (a container view) reading the name, `runtime.powerState`,
//! `guest.net` and what the guest writes in `config.extraConfig` (its phase, its answer to a
//! claim's keys, its SSH host keys). Each change to a VM named
//! `<namespace>-<machine>` wakes the machines, whose reconciles read their VMs afresh: the
//! status is never built from a partial update, and a missed one is caught by the resync.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use banlieue_api::VSphereMachine;
use banlieue_api::vsphere::{GUESTINFO_ACCESS_STATE, GUESTINFO_PHASE, GUESTINFO_SSH_HOST_KEYS};
use banlieue_provider_kit::pump::{self, Feed};
use banlieue_vsphere::{
    Client, ObjectUpdateKind, PropertyFilterSpec, PropertyValue, extra_config_path,
};
use kube::runtime::reflector::ObjectRef;
use tokio::sync::mpsc;

use crate::error::{Error, Result};
use crate::session::Session;

/// How long one WaitForUpdatesEx waits on the server before it is asked again.
pub const MAX_WAIT: Duration = Duration::from_secs(30);

/// The most VMs whose names are remembered: a bound on what a server can make this hold.
const MAX_TRACKED_VMS: usize = 100_000;

/// Wakes the machines when one of their VMs changes, until the receiver of `wake` is dropped
/// or the task is aborted. A failed wait (a lost session takes its collector with it) starts
/// over with a new collector, on the kit's backoff.
pub async fn run(session: Arc<Session>, namespace: String, wake: mpsc::Sender<()>) {
    pump::run("vSphere property wait", wake, |feed| {
        follow(session.clone(), namespace.clone(), feed)
    })
    .await
}

/// One property wait, until it fails; a failure that lost the session forgets it, so the next
/// wait logs in again.
async fn follow(session: Arc<Session>, namespace: String, feed: Feed) -> Result<()> {
    let client = session.client().await?;
    let Err(e) = collect_changes(&client, &namespace, &feed).await;
    if e.is_session_lost() {
        session.forget().await;
    }
    Err(e)
}

/// The machine a VM of `vm_name` belongs to, if the name is `<namespace>-<machine>`.
pub fn machine_of(namespace: &str, vm_name: &str) -> Option<ObjectRef<VSphereMachine>> {
    vm_name
        .strip_prefix(namespace)
        .and_then(|rest| rest.strip_prefix('-'))
        .filter(|name| !name.is_empty())
        .map(|name| ObjectRef::new(name).within(namespace))
}

async fn collect_changes(
    client: &Client,
    namespace: &str,
    feed: &Feed,
) -> Result<std::convert::Infallible> {
    let collector = client
        .create_property_collector()
        .await
        .map_err(Error::vsphere("create a property collector"))?;
    let result = watch(client, &collector, namespace, feed).await;
    // The collector's filters go with it; the view is the session's until it ends.
    let _ = client.destroy_property_collector(&collector).await;
    result
}

async fn watch(
    client: &Client,
    collector: &banlieue_vsphere::ManagedObjectRef,
    namespace: &str,
    feed: &Feed,
) -> Result<std::convert::Infallible> {
    let root = client.service_content().root_folder.clone();
    let view = client
        .create_container_view(&root, &["VirtualMachine"], true)
        .await
        .map_err(Error::vsphere("create a view of the VMs"))?;
    // What the guest writes: its phase, and its answer to a claim's keys with its host keys.
    let guest_written = [
        GUESTINFO_PHASE,
        GUESTINFO_ACCESS_STATE,
        GUESTINFO_SSH_HOST_KEYS,
    ]
    .map(extra_config_path);
    let mut paths = vec!["name", "runtime.powerState", "guest.net"];
    paths.extend(guest_written.iter().map(String::as_str));
    let spec = PropertyFilterSpec::container_view(&view, "VirtualMachine", &paths);
    client
        .create_filter(collector, &spec, true)
        .await
        .map_err(Error::vsphere("create the VM filter"))?;
    feed.subscribed();
    let mut names: HashMap<String, String> = HashMap::new();
    let mut version: Option<String> = None;
    loop {
        let Some(update) = client
            .wait_for_updates(collector, version.as_deref(), MAX_WAIT)
            .await
            .map_err(Error::vsphere("wait for VM changes"))?
        else {
            continue;
        };
        version = Some(update.version.clone());
        for object in update.object_updates() {
            let named = object
                .changes
                .iter()
                .find(|c| c.path == "name")
                .and_then(|c| c.value.as_ref())
                .and_then(PropertyValue::text);
            if let Some(name) = named
                && (names.len() < MAX_TRACKED_VMS || names.contains_key(&object.obj.value))
            {
                names.insert(object.obj.value.clone(), name.to_owned());
            }
            let name = names.get(&object.obj.value).cloned();
            if matches!(object.kind, ObjectUpdateKind::Leave) {
                names.remove(&object.obj.value);
            }
            if name
                .as_deref()
                .and_then(|n| machine_of(namespace, n))
                .is_some()
            {
                feed.wake();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_names_map_back_to_machines_of_the_namespace() {
        let m = machine_of("team-a", "team-a-web-01").unwrap();
        assert_eq!(m.name, "web-01");
        assert_eq!(m.namespace.as_deref(), Some("team-a"));
        assert!(machine_of("team-a", "team-ab-web").is_none());
        assert!(machine_of("team-a", "team-a-").is_none());
        assert!(machine_of("team-a", "DC0_C0_RP0_VM0").is_none());
    }
}

//! Whether the host under a member can be trusted (pure): a claim never takes a member whose
//! Provider is not Ready, and a pool replaces the unclaimed members of a Provider that has not
//! been Ready for `provider_lost_after`.
//!
//! Unreachable is not gone. A member on a lost host keeps existing until its deletion completes,
//! which waits for the provider to destroy the domain when the host is back (its machine's
//! finalizer); a claim bound to such a member stays Bound, and fails only when the member is
//! really deleted (ADR-0068).

use std::collections::HashMap;
use std::time::Duration;

use banlieue_api::conditions::{self, types};
use banlieue_api::{Provider, VirtualMachine};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

/// What a member's Provider says about its host.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HostState {
    /// Ready, or the member is not placed yet.
    #[default]
    Ready,
    /// Not Ready (or no longer listed) for less than the grace: its members are not handed
    /// out, and not replaced yet.
    Unready,
    /// Not Ready for longer than the grace: its unclaimed members are replaced elsewhere.
    Lost,
}

/// The state of each Provider of one namespace, at one instant.
#[derive(Debug, Default)]
pub struct HostStates {
    by_provider: HashMap<String, HostState>,
    /// When the first Unready Provider turns Lost, if any: the pool looks again then.
    pub next_change: Option<Duration>,
}

impl HostStates {
    /// Judges `providers` (those of the namespace) at `now`.
    pub fn judge<'a>(
        providers: impl IntoIterator<Item = &'a Provider>,
        now: Timestamp,
        lost_after: Duration,
    ) -> Self {
        let mut states = Self::default();
        for provider in providers {
            let ready = provider
                .status
                .as_ref()
                .and_then(|s| conditions::find(&s.conditions, types::READY));
            let state = match ready {
                Some(c) if c.status == conditions::status::TRUE => HostState::Ready,
                Some(c) => {
                    let unready_for = now.duration_since(c.last_transition_time.0);
                    let unready_for = Duration::try_from(unready_for).unwrap_or_default();
                    if unready_for >= lost_after {
                        HostState::Lost
                    } else {
                        let left = lost_after - unready_for;
                        states.next_change =
                            Some(states.next_change.map_or(left, |n: Duration| n.min(left)));
                        HostState::Unready
                    }
                }
                // A Provider whose workload never reported has no members yet.
                None => HostState::Unready,
            };
            states.by_provider.insert(provider.name_any(), state);
        }
        states
    }

    /// The state of the host `vm` was placed on.
    pub fn of(&self, vm: &VirtualMachine) -> HostState {
        let Some(provider) = vm.status.as_ref().and_then(|s| s.provider_ref.as_ref()) else {
            return HostState::Ready;
        };
        self.by_provider
            .get(&provider.name)
            .copied()
            // Deleted while it still has members: they cannot be handed out, and the
            // Provider's own finalizer decides what happens to them (MachinesRemain).
            .unwrap_or(HostState::Unready)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn provider(name: &str, ready: Option<(&str, i64)>) -> Provider {
        let mut p: Provider = serde_json::from_value(serde_json::json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"providerClassRef": {"name": "libvirt"},
                     "connection": {"endpoint": "qemu+tls://h/system", "credentialsRef": {"name": "c"},
                                    "caBundle": {"inline": "x"}}}
        }))
        .expect("valid provider");
        if let Some((status, since)) = ready {
            let mut s = banlieue_api::ProviderStatus::default();
            conditions::set(
                &mut s.conditions,
                conditions::new(types::READY, status, "ConnectFailed", "", None),
                Time(Timestamp::from_second(since).expect("time")),
            );
            p.status = Some(s);
        }
        p
    }

    fn vm_on(provider: Option<&str>) -> VirtualMachine {
        let mut vm: VirtualMachine = serde_json::from_value(serde_json::json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
            "metadata": {"name": "m", "namespace": "ns"},
            "spec": {"classRef": {"name": "c"}, "imageRef": {"name": "i"},
                     "storageClassName": "s", "networkClassName": "n"}
        }))
        .expect("valid vm");
        vm.status = Some(banlieue_api::VirtualMachineStatus {
            provider_ref: provider.map(banlieue_api::LocalObjectReference::new),
            ..Default::default()
        });
        vm
    }

    #[test]
    fn a_provider_is_unready_then_lost_after_the_grace() {
        let now = Timestamp::from_second(1_000).expect("time");
        let grace = Duration::from_secs(60);
        let providers = [
            provider("up", Some((conditions::status::TRUE, 0))),
            provider("flapping", Some((conditions::status::FALSE, 990))),
            provider("down", Some((conditions::status::FALSE, 900))),
            provider("silent", None),
        ];
        let states = HostStates::judge(&providers, now, grace);
        assert_eq!(states.of(&vm_on(Some("up"))), HostState::Ready);
        assert_eq!(states.of(&vm_on(Some("flapping"))), HostState::Unready);
        assert_eq!(states.of(&vm_on(Some("down"))), HostState::Lost);
        assert_eq!(states.of(&vm_on(Some("silent"))), HostState::Unready);
        assert_eq!(states.of(&vm_on(Some("deleted"))), HostState::Unready);
        assert_eq!(states.of(&vm_on(None)), HostState::Ready);
        // "flapping" turns Lost 50 s from now: the pool looks again then.
        assert_eq!(states.next_change, Some(Duration::from_secs(50)));
    }
}

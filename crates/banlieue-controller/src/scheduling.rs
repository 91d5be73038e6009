//! Where a VirtualMachine runs: the choice of Provider and failure domain (pure). The result,
//! a [`Placement`], names no backend; [`crate::machine_builder`] turns it into a machine of the
//! ProviderClass's kind with the builder the kind's backend descriptor gives.

use std::collections::BTreeMap;

use banlieue_api::backend::{PlacedImage, Placement};
use banlieue_api::conditions::{self, reasons, types};
use banlieue_api::provider::DEFAULT_MEMORY_OVERCOMMIT_PERCENT;
use banlieue_api::quantity;
use banlieue_api::{
    FailureDomain, MachineKind, Provider, ProviderClass, VMClass, VMImage, VirtualMachine,
    ZonePhase,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::machine_builder::MachineBackends;
use crate::spread::Occupancy;

/// Disk size when neither the class nor the image sets one.
pub const DEFAULT_DISK_SIZE: &str = "10Gi";
/// The failure-domain feature a tpmEnabled class needs. Declared by the administrator, never
/// discovered (ADR-0039).
pub const FEATURE_VTPM: &str = "vtpm";

/// Why nothing fits: a condition reason from the guides and a message naming the culprit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unschedulable {
    pub reason: &'static str,
    pub message: String,
}

/// How far a candidate failure domain got through the checks. Later stages are more specific,
/// so the furthest failure is the one reported.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Stage {
    StorageOrNetwork,
    Feature,
    Builder,
    Image,
    Capacity,
}

/// Everything scheduling reads, as snapshots.
#[derive(Clone, Copy, Debug)]
pub struct ScheduleInput<'a> {
    pub vm: &'a VirtualMachine,
    pub class: Option<&'a VMClass>,
    pub image: Option<&'a VMImage>,
    /// Providers of the VirtualMachine's namespace.
    pub providers: &'a [&'a Provider],
    /// ProviderClasses by name.
    pub provider_classes: &'a BTreeMap<String, &'a ProviderClass>,
    /// The machine kinds this controller builds.
    pub machine_backends: &'a MachineBackends,
    /// What each (provider, failure domain) already holds: members of the VirtualMachine's
    /// pool (empty outside a pool) and memory promised.
    pub occupancy: &'a Occupancy,
}

/// Chooses, among the failure domains that satisfy the VirtualMachine and have its memory to
/// spare, the one with the fewest members of its pool, ties going to the first in
/// Provider-name order; when none does, says why in the words of the guides.
pub fn schedule(input: ScheduleInput<'_>) -> Result<Placement, Unschedulable> {
    let spec = &input.vm.spec;
    let Some(class) = input.class else {
        return Err(Unschedulable {
            reason: reasons::CLASS_NOT_FOUND,
            message: format!("vmclass {} does not exist", spec.class_ref.name),
        });
    };
    let Some(image) = input.image else {
        return Err(Unschedulable {
            reason: reasons::IMAGE_NOT_READY,
            message: format!("vmimage {} does not exist", spec.image_ref.name),
        });
    };
    let mut providers: Vec<&Provider> = input
        .providers
        .iter()
        .copied()
        .filter(|p| {
            p.status
                .as_ref()
                .is_some_and(|s| conditions::is_true(&s.conditions, types::READY))
        })
        .collect();
    providers.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    if providers.is_empty() {
        return Err(Unschedulable {
            reason: reasons::NO_MATCHING_FAILURE_DOMAIN,
            message: "no Ready provider".to_owned(),
        });
    }

    let wanted = Wanted {
        input: &input,
        class,
        image,
        memory: quantity::to_bytes(&class.spec.memory.0).unwrap_or(0),
        saves: crate::spread::holds_save_storage(input.vm),
    };
    // Each satisfying domain, with the memory it has to spare (0 when its capacity is
    // unknown: such a domain is never preferred for room it may not have).
    let mut candidates: Vec<(Placement, u64)> = Vec::new();
    let mut short: Vec<Shortage> = Vec::new();
    let mut furthest: Option<(Stage, Unschedulable)> = None;
    for provider in providers {
        let status = provider.status.as_ref();
        for domain in status.map(|s| s.failure_domains.as_slice()).unwrap_or(&[]) {
            match wanted.fit(provider, domain) {
                Ok(candidate) => candidates.push(candidate),
                Err(miss) => {
                    short.extend(miss.short);
                    if furthest.as_ref().is_none_or(|(s, _)| miss.stage > *s) {
                        furthest = Some((miss.stage, miss.failure));
                    }
                }
            }
        }
    }
    // Fewest members of the pool, then the most memory to spare; `min_by_key` keeps the first
    // of equals, so the Provider-name order breaks the remaining ties.
    if let Some((best, _)) = candidates.into_iter().min_by_key(|(c, spare)| {
        let members = input
            .occupancy
            .members
            .get(&(c.provider.clone(), c.failure_domain.clone()))
            .copied()
            .unwrap_or(0);
        (members, std::cmp::Reverse(*spare))
    }) {
        return Ok(best);
    }
    if let Some((Stage::Capacity, failure)) = &mut furthest {
        let needs = if short.iter().any(|s| s.of == Resource::SaveStorage) {
            format!(
                "{0} of memory and {0} of save storage (its pool keeps members saved)",
                gib(wanted.memory)
            )
        } else {
            format!("{} of memory", gib(wanted.memory))
        };
        let shorts: Vec<&str> = short.iter().map(|s| s.words.as_str()).collect();
        failure.message = format!(
            "class {} needs {needs} and no failure domain has it to spare: {}",
            spec.class_ref.name,
            shorts.join("; ")
        );
    }
    Err(furthest.map(|(_, f)| f).unwrap_or_else(|| Unschedulable {
        reason: reasons::NO_MATCHING_FAILURE_DOMAIN,
        message: "no Ready provider publishes a failure domain".to_owned(),
    }))
}

/// What one VirtualMachine asks of a failure domain.
struct Wanted<'a> {
    input: &'a ScheduleInput<'a>,
    class: &'a VMClass,
    image: &'a VMImage,
    /// The class's memory, in bytes.
    memory: u64,
    /// Whether it will be saved, and so needs as much save storage (ADR-0073).
    saves: bool,
}

/// What a failure domain ran out of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Resource {
    Memory,
    SaveStorage,
}

/// A capacity shortfall of one failure domain: what ran out, and the words naming what it
/// has free.
struct Shortage {
    of: Resource,
    words: String,
}

/// Why one failure domain does not fit: how far it got through the checks, in the guides'
/// words, and for a capacity shortfall what it has free.
struct Miss {
    stage: Stage,
    failure: Unschedulable,
    short: Option<Shortage>,
}

impl Miss {
    /// A capacity shortfall, worded once every domain is known: see `schedule`.
    fn capacity(of: Resource, words: String) -> Self {
        Miss {
            stage: Stage::Capacity,
            failure: Unschedulable {
                reason: reasons::INSUFFICIENT_CAPACITY,
                message: String::new(),
            },
            short: Some(Shortage { of, words }),
        }
    }

    fn at(stage: Stage, reason: &'static str, message: String) -> Self {
        Miss {
            stage,
            failure: Unschedulable { reason, message },
            short: None,
        }
    }
}

impl Wanted<'_> {
    /// The placement in `domain` of `provider` and the memory it leaves to spare, or why the
    /// domain does not fit: storage and network classes, features, a builder for the class,
    /// the image Ready there, then memory, then save storage, in that order.
    fn fit(&self, provider: &Provider, domain: &FailureDomain) -> Result<(Placement, u64), Miss> {
        let spec = &self.input.vm.spec;
        let provider_name = provider.metadata.name.clone().unwrap_or_default();
        let storage = domain
            .storage_classes
            .iter()
            .find(|c| c.name == spec.storage_class_name);
        let network = domain
            .network_classes
            .iter()
            .find(|c| c.name == spec.network_class_name);
        let (Some(storage), Some(network)) = (storage, network) else {
            return Err(Miss::at(
                Stage::StorageOrNetwork,
                reasons::NO_MATCHING_FAILURE_DOMAIN,
                format!(
                    "no failure domain offers storage class {} and network class {}",
                    spec.storage_class_name, spec.network_class_name
                ),
            ));
        };
        if self.class.spec.tpm_enabled && !domain.features.iter().any(|f| f == FEATURE_VTPM) {
            return Err(Miss::at(
                Stage::Feature,
                reasons::NO_PROVIDER_WITH_FEATURE,
                format!(
                    "class {} is tpmEnabled and no provider advertises {FEATURE_VTPM:?} in \
                     capabilities.features",
                    spec.class_ref.name
                ),
            ));
        }
        let class_name = &provider.spec.provider_class_ref.name;
        let machine_kind = builder_for(
            self.input.provider_classes.get(class_name).copied(),
            self.input.machine_backends,
        )
        .map_err(|missing| {
            Miss::at(
                Stage::Builder,
                reasons::NO_BUILDER_FOR_CLASS,
                match missing {
                    None => format!(
                        "no machine builder for provider class {class_name:?} (provider \
                         {provider_name})"
                    ),
                    Some(kind) => format!(
                        "no machine builder for provider class {class_name:?} (provider \
                         {provider_name}): this controller does not build {kind} machines"
                    ),
                },
            )
        })?;
        let pool = &storage.target.pool;
        let Some(volume) = ready_volume(self.image, &provider_name, pool) else {
            return Err(Miss::at(
                Stage::Image,
                reasons::IMAGE_NOT_READY,
                format!(
                    "vmimage {} is not Ready on provider {provider_name} pool {pool}",
                    spec.image_ref.name
                ),
            ));
        };
        let spare = self.spare_memory(provider, &provider_name, domain)?;
        self.check_save_storage(provider, &provider_name, domain)?;
        let disk_size = self
            .class
            .spec
            .disk_size
            .clone()
            .or_else(|| self.image.spec.disk_size.clone())
            .unwrap_or_else(|| Quantity(DEFAULT_DISK_SIZE.to_owned()));
        let placement = Placement {
            provider: provider_name,
            provider_class: class_name.clone(),
            machine_kind,
            failure_domain: domain.name.clone(),
            storage_target: pool.clone(),
            network_target: network.target.network.clone(),
            image: PlacedImage {
                volume,
                install_mode: self.image.spec.install_mode,
                disk_size,
            },
            image_revision: image_revision(self.image),
        };
        Ok((placement, spare))
    }

    /// The memory `domain` has to spare once this VirtualMachine's is promised (0 when its
    /// capacity is unknown), or the capacity miss naming what it has free.
    fn spare_memory(
        &self,
        provider: &Provider,
        provider_name: &str,
        domain: &FailureDomain,
    ) -> Result<u64, Miss> {
        let Some(capacity) = &domain.capacity else {
            return Ok(0);
        };
        let percent = provider
            .spec
            .capabilities
            .memory_overcommit_percent
            .unwrap_or(DEFAULT_MEMORY_OVERCOMMIT_PERCENT);
        let limit = u64::try_from(u128::from(capacity.memory_bytes) * u128::from(percent) / 100)
            .unwrap_or(u64::MAX);
        let key = (provider_name.to_owned(), domain.name.clone());
        // Saved members hold no memory; what their resumes need is kept free (ADR-0073).
        let reserve = provider
            .spec
            .capabilities
            .resume_reserve
            .as_ref()
            .and_then(|q| banlieue_api::quantity::to_bytes(&q.0))
            .or_else(|| self.input.occupancy.largest_saved.get(&key).copied())
            .unwrap_or(0);
        let used = self
            .input
            .occupancy
            .memory
            .get(&key)
            .copied()
            .unwrap_or(0)
            .saturating_add(reserve);
        if used.saturating_add(self.memory) > limit {
            return Err(Miss::capacity(
                Resource::Memory,
                if reserve > 0 {
                    format!(
                        "{provider_name} has {} of {} free, {} of it kept for resuming saved members",
                        gib(limit.saturating_sub(used)),
                        gib(limit),
                        gib(reserve)
                    )
                } else {
                    format!(
                        "{provider_name} has {} of {} free",
                        gib(limit.saturating_sub(used)),
                        gib(limit)
                    )
                },
            ));
        }
        Ok(limit - used - self.memory)
    }

    /// For a VirtualMachine that will be saved, whether `domain` has its class's memory free
    /// in the save storage the Provider gives saved members (`capabilities.saveStorage`;
    /// unset, not limited), or the capacity miss naming what it has free.
    fn check_save_storage(
        &self,
        provider: &Provider,
        provider_name: &str,
        domain: &FailureDomain,
    ) -> Result<(), Miss> {
        let limit = provider
            .spec
            .capabilities
            .save_storage
            .as_ref()
            .and_then(|q| quantity::to_bytes(&q.0));
        let (true, Some(limit)) = (self.saves, limit) else {
            return Ok(());
        };
        let key = (provider_name.to_owned(), domain.name.clone());
        let used = self
            .input
            .occupancy
            .save_storage
            .get(&key)
            .copied()
            .unwrap_or(0);
        if used.saturating_add(self.memory) > limit {
            return Err(Miss::capacity(
                Resource::SaveStorage,
                format!(
                    "{provider_name} has {} of {} of save storage free",
                    gib(limit.saturating_sub(used)),
                    gib(limit)
                ),
            ));
        }
        Ok(())
    }
}

/// Bytes as GiB with one decimal, for messages.
fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / f64::from(1u32 << 30))
}

/// The machine kind a ProviderClass is built into, when this controller has its builder; else
/// the kind it has no builder for (`None`: the class does not exist).
fn builder_for(
    class: Option<&ProviderClass>,
    backends: &MachineBackends,
) -> Result<MachineKind, Option<MachineKind>> {
    let kind = &class.ok_or(None)?.spec.machine_kind;
    match backends.get(kind) {
        Some(_) => Ok(kind.clone()),
        None => Err(Some(kind.clone())),
    }
}

/// The image's volume on one provider's pool, when the import there is Ready.
fn ready_volume(image: &VMImage, provider: &str, pool: &str) -> Option<String> {
    image
        .status
        .as_ref()?
        .per_provider
        .iter()
        .find(|p| p.provider == provider)?
        .zones
        .iter()
        .find(|z| z.pool == pool && z.phase == ZonePhase::Ready)?
        .volume
        .clone()
}

/// The image's effective revision: the published one, else the one its spec yields (what a
/// provider will publish for it). Never absent for an image that exists: a pool created
/// together with its image would otherwise see its revision change when the first status
/// arrives, and replace the members it had just made.
pub fn image_revision(image: &VMImage) -> Option<String> {
    image
        .status
        .as_ref()
        .and_then(|s| s.revision.clone())
        .or_else(|| Some(banlieue_api::image::revision(image)))
}

/// A controller owner reference to `owner`, blocking its deletion until the dependent is gone.
pub fn controller_owner_reference<K>(
    owner: &K,
) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>
where
    K: kube::Resource<DynamicType = ()>,
{
    let mut reference = owner.controller_owner_ref(&())?;
    reference.block_owner_deletion = Some(true);
    Some(reference)
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::InstallMode;
    use serde_json::json;

    fn vm() -> VirtualMachine {
        serde_json::from_value(json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
            "metadata": {"name": "web-01", "namespace": "ns", "uid": "vm-uid"},
            "spec": {"classRef": {"name": "small"}, "imageRef": {"name": "img"},
                     "storageClassName": "gold", "networkClassName": "prod"}
        }))
        .expect("valid VirtualMachine")
    }

    fn class(tpm: bool, disk: Option<&str>) -> VMClass {
        serde_json::from_value(json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass",
            "metadata": {"name": "small"},
            "spec": {"cpu": 2, "memory": "2Gi", "tpmEnabled": tpm, "diskSize": disk}
        }))
        .expect("valid VMClass")
    }

    fn image(mode: &str, zones: serde_json::Value) -> VMImage {
        serde_json::from_value(json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage",
            "metadata": {"name": "img"},
            "spec": {"installMode": mode, "diskSize": "8Gi",
                     "sources": [{"providerClass": "libvirt", "kind": "BackingFile", "volume": "v"}]},
            "status": {"revision": "r7", "perProvider": zones}
        }))
        .expect("valid VMImage")
    }

    #[test]
    fn an_image_not_yet_published_has_the_revision_a_provider_will_publish() {
        let mut fresh = image("Immediate", json!([]));
        fresh.status = None;
        let expected = banlieue_api::image::revision(&fresh);
        assert_eq!(image_revision(&fresh).as_deref(), Some(expected.as_str()));
        // Published: what the providers say wins (during a rebuild it lags the spec).
        assert_eq!(
            image_revision(&image("Immediate", json!([]))).as_deref(),
            Some("r7")
        );
    }

    fn provider(name: &str, class: &str, features: &[&str], ready: bool) -> Provider {
        serde_json::from_value(json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"providerClassRef": {"name": class},
                     "connection": {"endpoint": "qemu+tls://h/system", "credentialsRef": {"name": "c"},
                                    "caBundle": {"inline": "x"}}},
            "status": {
                "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}, "reason": "Connected",
                                "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                "failureDomains": [{"name": name,
                    "storageClasses": [{"name": "gold", "target": {"pool": "nvme"}}],
                    "networkClasses": [{"name": "prod", "target": {"network": "br-prod"}}],
                    "features": features}]
            }
        }))
        .expect("valid Provider")
    }

    fn libvirt_class() -> ProviderClass {
        serde_json::from_value(json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "ProviderClass",
            "metadata": {"name": "libvirt"},
            "spec": {"image": "banlieue", "machineKind": "LibvirtMachine"}
        }))
        .expect("valid ProviderClass")
    }

    fn ready_zone(provider: &str) -> serde_json::Value {
        json!([{"provider": provider, "zones": [{"pool": "nvme", "phase": "Ready", "volume": "img.qcow2"}]}])
    }

    fn run(
        class: &VMClass,
        image: &VMImage,
        providers: &[&Provider],
    ) -> Result<Placement, Unschedulable> {
        run_spread(class, image, providers, &BTreeMap::new())
    }

    fn run_spread(
        class: &VMClass,
        image: &VMImage,
        providers: &[&Provider],
        spread: &BTreeMap<(String, String), usize>,
    ) -> Result<Placement, Unschedulable> {
        let occupancy = Occupancy {
            members: spread.clone(),
            memory: BTreeMap::new(),
            largest_saved: BTreeMap::new(),
            save_storage: BTreeMap::new(),
        };
        run_with(class, image, providers, &occupancy)
    }

    fn run_with(
        class: &VMClass,
        image: &VMImage,
        providers: &[&Provider],
        occupancy: &Occupancy,
    ) -> Result<Placement, Unschedulable> {
        run_vm(&vm(), class, image, providers, occupancy)
    }

    fn run_vm(
        vm: &VirtualMachine,
        class: &VMClass,
        image: &VMImage,
        providers: &[&Provider],
        occupancy: &Occupancy,
    ) -> Result<Placement, Unschedulable> {
        let pc = libvirt_class();
        let classes: BTreeMap<String, &ProviderClass> = [("libvirt".to_owned(), &pc)].into();
        schedule(ScheduleInput {
            vm,
            class: Some(class),
            image: Some(image),
            providers,
            provider_classes: &classes,
            machine_backends: &crate::machine_builder::in_tree_backends(),
            occupancy,
        })
    }

    /// A class naming a kind this controller has no builder for, or no class at all, places
    /// nothing, and says which.
    #[test]
    fn a_class_of_a_kind_without_a_builder_places_nothing() {
        let p = provider("host-1", "libvirt", &[], true);
        let (class, image) = (class(false, None), image("Immediate", ready_zone("host-1")));
        let memory: ProviderClass = serde_json::from_value(json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "ProviderClass",
            "metadata": {"name": "libvirt"},
            "spec": {"image": "banlieue", "machineKind": "MemoryMachine"}
        }))
        .expect("valid ProviderClass");
        let attempt = |classes: &BTreeMap<String, &ProviderClass>| {
            schedule(ScheduleInput {
                vm: &vm(),
                class: Some(&class),
                image: Some(&image),
                providers: &[&p],
                provider_classes: classes,
                machine_backends: &crate::machine_builder::in_tree_backends(),
                occupancy: &Occupancy::default(),
            })
        };
        let failure = attempt(&[("libvirt".to_owned(), &memory)].into()).expect_err("no builder");
        assert_eq!(failure.reason, reasons::NO_BUILDER_FOR_CLASS);
        assert!(
            failure
                .message
                .contains("does not build MemoryMachine machines"),
            "{}",
            failure.message
        );
        let failure = attempt(&BTreeMap::new()).expect_err("no class");
        assert_eq!(failure.reason, reasons::NO_BUILDER_FOR_CLASS);
        assert!(
            failure
                .message
                .contains("no machine builder for provider class \"libvirt\""),
            "{}",
            failure.message
        );
    }

    #[test]
    fn immediate_images_get_an_overlay_and_deferred_ones_install_media() {
        let p = provider("host-1", "libvirt", &[], true);
        let placed = run(
            &class(false, Some("20Gi")),
            &image("Immediate", ready_zone("host-1")),
            &[&p],
        )
        .expect("schedulable");
        assert_eq!(placed.image.volume, "img.qcow2");
        assert_eq!(placed.image.install_mode, InstallMode::Immediate);
        assert_eq!(placed.image.disk_size.0, "20Gi");
        assert_eq!(
            (
                placed.storage_target.as_str(),
                placed.network_target.as_str()
            ),
            ("nvme", "br-prod")
        );
        assert_eq!(placed.image_revision.as_deref(), Some("r7"));
        let placed = run(
            &class(false, None),
            &image("Deferred", ready_zone("host-1")),
            &[&p],
        )
        .expect("schedulable");
        assert_eq!(placed.image.volume, "img.qcow2");
        assert_eq!(placed.image.install_mode, InstallMode::Deferred);
        assert_eq!(
            placed.image.disk_size.0, "8Gi",
            "the image's size when the class sets none"
        );
    }

    #[test]
    fn tpm_needs_vtpm_which_is_never_assumed() {
        let plain = provider("a", "libvirt", &[], true);
        let failure = run(
            &class(true, None),
            &image("Immediate", ready_zone("a")),
            &[&plain],
        )
        .expect_err("no vtpm");
        assert_eq!(failure.reason, "NoProviderWithFeature");
        let with_tpm = provider("b", "libvirt", &["vtpm"], true);
        let placed = run(
            &class(true, None),
            &image("Immediate", ready_zone("b")),
            &[&plain, &with_tpm],
        )
        .expect("b advertises vtpm");
        assert_eq!(placed.provider, "b");
    }

    #[test]
    fn no_builder_names_the_class_and_image_not_ready_names_the_pool() {
        let vsphere = provider("a", "vsphere", &[], true);
        let failure = run(
            &class(false, None),
            &image("Immediate", ready_zone("a")),
            &[&vsphere],
        )
        .expect_err("no builder");
        assert_eq!(failure.reason, "NoBuilderForClass");
        assert!(
            failure.message.contains("\"vsphere\""),
            "{}",
            failure.message
        );
        let p = provider("a", "libvirt", &[], true);
        let failure = run(&class(false, None), &image("Immediate", json!([])), &[&p])
            .expect_err("not imported");
        assert_eq!(failure.reason, "ImageNotReady");
        assert!(failure.message.contains("nvme"), "{}", failure.message);
    }

    #[test]
    fn members_spread_to_the_domain_with_the_fewest_ties_by_name() {
        let zones = serde_json::json!([
            {"provider": "h1", "zones": [{"pool": "nvme", "phase": "Ready", "volume": "v"}]},
            {"provider": "h2", "zones": [{"pool": "nvme", "phase": "Ready", "volume": "v"}]},
            {"provider": "h3", "zones": [{"pool": "nvme", "phase": "Ready", "volume": "v"}]},
        ]);
        let image = image("Immediate", zones);
        let (h1, h2, h3) = (
            provider("h1", "libvirt", &[], true),
            provider("h2", "libvirt", &[], true),
            provider("h3", "libvirt", &[], true),
        );
        let providers = [&h3, &h1, &h2];
        let at = |counts: &[(&str, usize)]| {
            let spread = counts
                .iter()
                .map(|(p, n)| (((*p).to_owned(), (*p).to_owned()), *n))
                .collect();
            run_spread(&class(false, None), &image, &providers, &spread)
                .expect("placed")
                .provider
        };
        assert_eq!(at(&[]), "h1", "no members yet: the first by name");
        assert_eq!(at(&[("h1", 1)]), "h2");
        assert_eq!(at(&[("h1", 1), ("h2", 1)]), "h3");
        assert_eq!(at(&[("h1", 2), ("h2", 1), ("h3", 1)]), "h2");
        // A domain that does not satisfy the VirtualMachine is never chosen, however empty.
        let narrow = image_with_one_ready_provider(&["h3"]);
        let spread = [
            (("h1".to_owned(), "h1".to_owned()), 0),
            (("h3".to_owned(), "h3".to_owned()), 9),
        ]
        .into();
        assert_eq!(
            run_spread(&class(false, None), &narrow, &providers, &spread)
                .expect("placed")
                .provider,
            "h3"
        );
    }

    /// A provider whose host has `gib` GiB, overcommitted to `percent`.
    fn sized(name: &str, gib: u64, percent: Option<u32>) -> Provider {
        let mut p = provider(name, "libvirt", &[], true);
        p.spec.capabilities.memory_overcommit_percent = percent;
        if let Some(status) = p.status.as_mut() {
            status.failure_domains[0].capacity = Some(banlieue_api::DomainCapacity {
                memory_bytes: gib << 30,
                cpus: 4,
            });
        }
        p
    }

    #[test]
    fn saved_members_hold_no_memory_but_a_resume_is_kept_free() {
        let image = image_with_one_ready_provider(&["h1"]);
        let h1 = sized("h1", 4, None);
        let key = ("h1".to_owned(), "h1".to_owned());
        // 1 GiB running, any number of saved members of at most 1 GiB: the 2 GiB class fits
        // in 4 - 1 - 1 (one resume kept).
        let occupancy = |running: u64, largest_saved: Option<u64>| Occupancy {
            members: BTreeMap::new(),
            memory: [(key.clone(), running << 30)].into(),
            largest_saved: largest_saved
                .map(|gib| [(key.clone(), gib << 30)].into())
                .unwrap_or_default(),
            save_storage: BTreeMap::new(),
        };
        let two_gib = class(false, None);
        assert!(run_with(&two_gib, &image, &[&h1], &occupancy(1, Some(1))).is_ok());
        // A 2 GiB saved member needs 2 GiB to come back: nothing left for a new 2 GiB one.
        let e = run_with(&two_gib, &image, &[&h1], &occupancy(1, Some(2))).expect_err("full");
        assert_eq!(e.reason, reasons::INSUFFICIENT_CAPACITY);
        assert!(
            e.message.contains("kept for resuming saved members"),
            "{}",
            e.message
        );
        // The administrator's reserve replaces the default, larger or smaller.
        let mut reserved = h1.clone();
        reserved.spec.capabilities.resume_reserve = Some(
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("512Mi".into()),
        );
        assert!(run_with(&two_gib, &image, &[&reserved], &occupancy(1, Some(2))).is_ok());
        reserved.spec.capabilities.resume_reserve = Some(
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("2Gi".into()),
        );
        assert!(run_with(&two_gib, &image, &[&reserved], &occupancy(1, None)).is_err());
    }

    #[test]
    fn a_member_that_will_be_saved_needs_its_memory_in_save_storage() {
        let image = image_with_one_ready_provider(&["h1", "h2"]);
        let (mut h1, mut h2) = (sized("h1", 16, None), sized("h2", 16, None));
        let two_gib = class(false, None);
        let mut saving = vm();
        saving.spec.standby = Some(banlieue_api::Standby::Saved);
        let stored = |h1: u64, h2: u64| Occupancy {
            save_storage: [
                (("h1".to_owned(), "h1".to_owned()), h1 << 30),
                (("h2".to_owned(), "h2".to_owned()), h2 << 30),
            ]
            .into(),
            ..Occupancy::default()
        };
        // Unset: not limited.
        assert!(run_vm(&saving, &two_gib, &image, &[&h1, &h2], &stored(100, 100)).is_ok());
        let quantity = |q: &str| Some(Quantity(q.to_owned()));
        h1.spec.capabilities.save_storage = quantity("4Gi");
        h2.spec.capabilities.save_storage = quantity("3Gi");
        // h1 has 2 GiB of save storage left: the 2 GiB class fits there and nowhere else.
        let placed = run_vm(&saving, &two_gib, &image, &[&h1, &h2], &stored(2, 2));
        assert_eq!(placed.expect("fits h1").provider, "h1");
        let e = run_vm(&saving, &two_gib, &image, &[&h1, &h2], &stored(3, 2))
            .expect_err("no save storage");
        assert_eq!(e.reason, reasons::INSUFFICIENT_CAPACITY);
        assert_eq!(
            e.message,
            "class small needs 2.0 GiB of memory and 2.0 GiB of save storage (its pool keeps \
             members saved) and no failure domain has it to spare: h1 has 1.0 GiB of 4.0 GiB of \
             save storage free; h2 has 1.0 GiB of 3.0 GiB of save storage free"
        );
        // A VirtualMachine that is not saved needs none, and a claimed member is not saved.
        assert!(run_with(&two_gib, &image, &[&h1, &h2], &stored(4, 3)).is_ok());
        saving
            .metadata
            .labels
            .get_or_insert_default()
            .insert(banlieue_api::names::LABEL_CLAIM.to_owned(), "c".to_owned());
        assert!(run_vm(&saving, &two_gib, &image, &[&h1, &h2], &stored(4, 3)).is_ok());
    }

    #[test]
    fn memory_is_never_promised_beyond_the_limit() {
        let image = image_with_one_ready_provider(&["h1", "h2", "h3"]);
        let (h1, h2) = (sized("h1", 4, None), sized("h2", 3, Some(150)));
        let h3 = provider("h3", "libvirt", &[], true); // capacity not read yet: not limited
        let occupancy = |used: &[(&str, u64)]| Occupancy {
            members: BTreeMap::new(),
            memory: used
                .iter()
                .map(|(p, gib)| (((*p).to_owned(), (*p).to_owned()), gib << 30))
                .collect(),
            largest_saved: BTreeMap::new(),
            save_storage: BTreeMap::new(),
        };
        let two_gib = class(false, None);
        // h1 has 2 of 4 GiB free: the 2 GiB class fits exactly (h2 has 1.5 of 4.5).
        let placed = run_with(
            &two_gib,
            &image,
            &[&h1, &h2],
            &occupancy(&[("h1", 2), ("h2", 3)]),
        );
        assert_eq!(placed.expect("fits").provider, "h1");
        // h1 full; h2's 3 GiB at 150% is 4.5 GiB, 2.5 used: 2 GiB fits.
        let placed = run_with(
            &two_gib,
            &image,
            &[&h1, &h2],
            &occupancy(&[("h1", 3), ("h2", 2)]),
        );
        assert_eq!(placed.expect("overcommitted h2").provider, "h2");
        // Both full: the reason names each host and what it has.
        let e = run_with(
            &two_gib,
            &image,
            &[&h1, &h2],
            &occupancy(&[("h1", 3), ("h2", 3)]),
        )
        .expect_err("nothing fits");
        assert_eq!(e.reason, reasons::INSUFFICIENT_CAPACITY);
        assert_eq!(
            e.message,
            "class small needs 2.0 GiB of memory and no failure domain has it to spare: \
             h1 has 1.0 GiB of 4.0 GiB free; h2 has 1.5 GiB of 4.5 GiB free"
        );
        // Equal members: the domain with more memory to spare goes first, whatever its name.
        let big = sized("h2", 8, None);
        let placed = run_with(
            &two_gib,
            &image,
            &[&h1, &big],
            &occupancy(&[("h1", 1), ("h2", 1)]),
        );
        assert_eq!(
            placed.expect("fits both").provider,
            "h2",
            "5 GiB spare beats 1 GiB"
        );
        let spread = Occupancy {
            members: [(("h1".to_owned(), "h1".to_owned()), 0)].into(),
            memory: [(("h2".to_owned(), "h2".to_owned()), 1 << 30)].into(),
            largest_saved: BTreeMap::new(),
            save_storage: BTreeMap::new(),
        };
        let mut one_member_on_h2 = spread.clone();
        one_member_on_h2
            .members
            .insert(("h2".to_owned(), "h2".to_owned()), 1);
        assert_eq!(
            run_with(&two_gib, &image, &[&h1, &big], &one_member_on_h2)
                .expect("fits")
                .provider,
            "h1",
            "fewer members first, spare room second"
        );
        // A host whose capacity is unknown is not limited.
        let placed = run_with(
            &two_gib,
            &image,
            &[&h1, &h3],
            &occupancy(&[("h1", 4), ("h3", 99)]),
        );
        assert_eq!(placed.expect("unlimited").provider, "h3");
        // A more specific failure elsewhere does not hide the capacity reason, and vice versa:
        // an image not ready on a full host is still ImageNotReady only if no host is fuller.
        let narrow = image_with_one_ready_provider(&["h2"]);
        let e = run_with(&two_gib, &narrow, &[&h1, &h2], &occupancy(&[("h2", 3)]))
            .expect_err("h1 lacks the image, h2 the memory");
        assert_eq!(e.reason, reasons::INSUFFICIENT_CAPACITY);
        assert!(
            e.message.contains("h2 has 1.5 GiB") && !e.message.contains("h1"),
            "{}",
            e.message
        );
    }

    fn image_with_one_ready_provider(ready: &[&str]) -> VMImage {
        let zones: Vec<serde_json::Value> = ready
            .iter()
            .map(|p| serde_json::json!({"provider": p, "zones": [{"pool": "nvme", "phase": "Ready", "volume": "v"}]}))
            .collect();
        image("Immediate", serde_json::Value::Array(zones))
    }

    #[test]
    fn unready_providers_are_never_chosen() {
        let down = provider("a", "libvirt", &[], false);
        let failure = run(
            &class(false, None),
            &image("Immediate", ready_zone("a")),
            &[&down],
        )
        .expect_err("down");
        assert_eq!(failure.reason, "NoMatchingFailureDomain");
    }

    #[test]
    fn the_machine_is_owned_by_its_virtual_machine() {
        let p = provider("host-1", "libvirt", &[], true);
        let c = class(true, None);
        let mut with_tpm = p.clone();
        if let Some(s) = with_tpm.status.as_mut() {
            s.failure_domains[0].features = vec!["vtpm".into()];
        }
        let placed =
            run(&c, &image("Immediate", ready_zone("host-1")), &[&with_tpm]).expect("schedulable");
        assert_eq!(placed.machine_kind, MachineKind::LIBVIRT_MACHINE);
        let vm = vm();
        let backends = crate::machine_builder::in_tree_backends();
        let backend = backends.get(&placed.machine_kind).expect("built in");
        let machine = crate::machine_builder::build(
            backend,
            &crate::machine_builder::MachineInput {
                vm: &vm,
                class: &c,
                placement: &placed,
            },
        )
        .expect("buildable");
        let owner = &machine.metadata.owner_references.as_ref().expect("owned")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("VirtualMachine", "vm-uid")
        );
        assert_eq!(
            (owner.controller, owner.block_owner_deletion),
            (Some(true), Some(true))
        );
        assert_eq!(machine.data["spec"]["tpmEnabled"], true);
        assert_eq!(machine.metadata.namespace.as_deref(), Some("ns"));
    }

    /// A Provider of another backend with several failure domains (a vCenter's clusters),
    /// each of which publishes its targets and capacity as a libvirt host does.
    fn clusters(name: &str, domains: &[(&str, u64)]) -> Provider {
        let mut p = provider(name, "vsphere", &[], true);
        if let Some(status) = p.status.as_mut() {
            let template = status.failure_domains[0].clone();
            status.failure_domains = domains
                .iter()
                .map(|(domain, gib)| banlieue_api::FailureDomain {
                    name: (*domain).to_owned(),
                    capacity: Some(banlieue_api::DomainCapacity {
                        memory_bytes: gib << 30,
                        cpus: 8,
                    }),
                    ..template.clone()
                })
                .collect();
        }
        p
    }

    #[test]
    fn every_backend_is_placed_by_its_failure_domains_and_capacity() {
        let host = sized("host-1", 4, None);
        let vcenter = clusters("vc", &[("DC0/C0", 2), ("DC0/C1", 16)]);
        let libvirt = libvirt_class();
        let vsphere: ProviderClass = serde_json::from_value(json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "ProviderClass",
            "metadata": {"name": "vsphere"},
            "spec": {"image": "banlieue", "machineKind": "VSphereMachine"}
        }))
        .expect("valid ProviderClass");
        let classes: BTreeMap<String, &ProviderClass> = [
            ("libvirt".to_owned(), &libvirt),
            ("vsphere".to_owned(), &vsphere),
        ]
        .into();
        let image = image_with_one_ready_provider(&["host-1", "vc"]);
        let schedule_with = |occupancy: &Occupancy| {
            schedule(ScheduleInput {
                vm: &vm(),
                class: Some(&class(false, None)),
                image: Some(&image),
                providers: &[&host, &vcenter],
                provider_classes: &classes,
                machine_backends: &crate::machine_builder::in_tree_backends(),
                occupancy,
            })
        };
        let key = |p: &str, d: &str| (p.to_owned(), d.to_owned());
        // The host has 4 GiB spare, the clusters 2 and 16: the roomiest cluster wins, and the
        // placement carries the class's kind and the cluster's name.
        let placed = schedule_with(&Occupancy::default()).expect("placed");
        assert_eq!(
            (placed.provider.as_str(), placed.failure_domain.as_str()),
            ("vc", "DC0/C1")
        );
        assert_eq!(placed.machine_kind, MachineKind::VSPHERE_MACHINE);
        assert_eq!(placed.provider_class, "vsphere");
        // Spread counts members per failure domain, whatever the backend.
        let placed = schedule_with(&Occupancy {
            members: [(key("vc", "DC0/C1"), 1), (key("vc", "DC0/C0"), 1)].into(),
            memory: BTreeMap::new(),
            largest_saved: BTreeMap::new(),
            save_storage: BTreeMap::new(),
        })
        .expect("placed");
        assert_eq!(placed.provider, "host-1");
        assert_eq!(placed.machine_kind, MachineKind::LIBVIRT_MACHINE);
        // A full cluster is named like a full host.
        let failure = schedule_with(&Occupancy {
            members: BTreeMap::new(),
            memory: [
                (key("host-1", "host-1"), 4 << 30),
                (key("vc", "DC0/C0"), 2 << 30),
                (key("vc", "DC0/C1"), 15 << 30),
            ]
            .into(),
            largest_saved: BTreeMap::new(),
            save_storage: BTreeMap::new(),
        })
        .expect_err("full everywhere");
        assert_eq!(failure.reason, reasons::INSUFFICIENT_CAPACITY);
        assert!(
            failure.message.contains("vc has 1.0 GiB of 16.0 GiB free"),
            "{}",
            failure.message
        );
    }
}

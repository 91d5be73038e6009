//! The guide's quick start: a pool and a claim, and the claim is Bound with everything a
//! consumer needs in one GET.

use banlieue_api::conditions::{self, types};
use banlieue_api::names;
use banlieue_api::{VirtualMachine, vsphere};
use k8s_openapi::jiff::SignedDuration;
use kube::ResourceExt;
use serde_json::json;

use crate::support::backend::KindSpec;
use crate::support::fake_provider::FakeProvider;
use crate::support::*;

#[tokio::test]
async fn quick_start_claim_is_bound_with_vm_addresses_and_deadline() -> TestResult {
    let h = Harness::new().await?;
    let _provider = FakeProvider::start(h.admin.clone(), &h.namespace);
    let controller = h.start_controller().await?;
    let pool = h
        .create_pool("sandbox-pool", 2, "InfrastructureReady", json!({}))
        .await?;
    h.wait_available("sandbox-pool", 2).await?;

    h.create_claim("sandbox-for-alice", "sandbox-pool", 900)
        .await?;
    let claim = h
        .wait_claim("sandbox-for-alice", "claim Bound", is_bound)
        .await?;
    let status = claim.status.clone().ok_or("no status")?;
    let member_name = member_name(&claim).ok_or("no virtualMachineRef")?;
    assert!(member_name.starts_with("sandbox-pool-"), "{member_name}");
    let bound_at = status.bound_at.ok_or("no boundAt")?.0;
    let expires_at = status.expires_at.ok_or("no expiresAt")?.0;
    assert_eq!(
        expires_at.duration_since(bound_at),
        SignedDuration::from_secs(900)
    );
    assert!(
        bound_at
            >= claim.creation_timestamp().ok_or("no creationTimestamp")?.0
                - SignedDuration::from_secs(1)
    );
    assert_eq!(status.addresses.len(), 1, "{:?}", status.addresses);
    assert_eq!(status.addresses[0].type_, "InternalIP");
    assert_eq!(status.nonce, None, "no nonce is minted");

    // The member: bound once, to this claim, for this subject, re-parented to the claim.
    let member = h.api::<VirtualMachine>().get(&member_name).await?;
    assert_eq!(
        member.labels().get(names::LABEL_CLAIM).map(String::as_str),
        Some("sandbox-for-alice")
    );
    assert!(!member.labels().contains_key(names::LABEL_POOL));
    assert_eq!(
        member
            .annotations()
            .get(names::ANNOTATION_SUBJECT_ISSUER)
            .map(String::as_str),
        Some("https://issuer.example.com")
    );
    assert_eq!(
        member
            .annotations()
            .get(names::ANNOTATION_SUBJECT_ID)
            .map(String::as_str),
        Some("subject-sandbox-for-alice")
    );
    assert!(
        member
            .annotations()
            .contains_key(names::ANNOTATION_BOUND_AT)
    );
    let owners = member.owner_references();
    assert_eq!(owners.len(), 1, "{owners:?}");
    assert_eq!(owners[0].kind, "VirtualMachineClaim");
    assert_eq!(Some(owners[0].uid.as_str()), claim.uid().as_deref());
    assert_eq!(owners[0].controller, Some(true));
    assert_eq!(owners[0].block_owner_deletion, Some(true));
    assert_eq!(
        member.status.as_ref().map(|s| s.addresses.clone()),
        Some(status.addresses.clone())
    );

    // The claim holds its finalizer.
    assert!(
        claim
            .finalizers()
            .iter()
            .any(|f| f == names::FINALIZER_CLAIM_PROTECTION)
    );

    // The machine the provider realises: the contract fields.
    let machine = h.machine(&member_name).await?;
    let backend = backend();
    assert_eq!(machine.provider, PROVIDER);
    assert_eq!(machine.cpu, 2);
    assert_eq!(machine.memory.0, "2Gi");
    match &machine.spec {
        KindSpec::Libvirt(spec) => {
            assert_eq!(spec.pool, backend.storage_target);
            assert_eq!(spec.network, backend.network_target);
            assert_eq!(
                spec.disk.backing_volume.as_deref(),
                Some(backend.image_volume)
            );
            assert_eq!(spec.disk.install_media, None);
            assert_eq!(spec.disk.size.0, "20Gi");
            assert_eq!(spec.firmware, banlieue_api::Firmware::Efi);
        }
        // A clone keeps its template's disk, firmware and network adapters (ADR-0069), so
        // the placement shows only as the failure domain's datacenter and cluster, the
        // storage class's datastore and the image's template.
        KindSpec::VSphere(spec) => {
            let domain = backend.failure_domain(PROVIDER);
            assert_eq!(
                vsphere::parse_failure_domain_name(&domain),
                Some((spec.datacenter.as_str(), spec.cluster.as_str()))
            );
            assert_eq!(spec.datastore.as_deref(), Some(backend.storage_target));
            assert_eq!(spec.template, backend.image_volume);
        }
        // A kind whose spec is the placement itself (the test-only MemoryMachine).
        KindSpec::Placement(spec) => {
            assert_eq!(spec.failure_domain, backend.failure_domain(PROVIDER));
            assert_eq!(spec.storage_target, backend.storage_target);
            assert_eq!(spec.network_target, backend.network_target);
            assert_eq!(spec.image_volume, backend.image_volume);
            assert_eq!(spec.disk_size.0, "20Gi");
        }
    }
    let machine_owner = &machine.owner_references[0];
    assert_eq!(machine_owner.kind, "VirtualMachine");
    assert_eq!(Some(machine_owner.uid.as_str()), member.uid().as_deref());
    let vm_status = member.status.clone().ok_or("member has no status")?;
    assert_eq!(
        vm_status.machine_ref.as_ref().map(|r| r.name.as_str()),
        Some(member_name.as_str())
    );
    assert_eq!(
        vm_status.provider_ref.as_ref().map(|r| r.name.as_str()),
        Some(PROVIDER)
    );
    assert_eq!(vm_status.image_revision.as_deref(), Some("r1"));
    assert!(conditions::is_true(
        &vm_status.conditions,
        types::INFRASTRUCTURE_READY
    ));
    assert!(conditions::is_true(
        &vm_status.conditions,
        types::GUEST_READY
    ));
    assert!(vm_status.ready_since.is_some());

    // The pool refills behind the claim and counts it.
    h.wait_pool("sandbox-pool", "2 available and 1 claimed", |s| {
        s.available_replicas == 2 && s.replicas == 2 && s.claimed_replicas == 1
    })
    .await?;
    assert_eq!(pool.name_any(), "sandbox-pool");
    controller.stop().await?;
    Ok(())
}

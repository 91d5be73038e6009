//! Scheduling a standalone VirtualMachine: the machine contract, the reasons it says why
//! nothing fits, and deletion blocking on the machine.

use std::sync::atomic::Ordering;

use banlieue_api::VirtualMachine;
use banlieue_api::conditions::{self, reasons, types};
use banlieue_testenv::control_plane::wait_for;
use kube::api::DeleteParams;

use crate::support::fake_provider::FakeProvider;
use crate::support::*;

fn scheduled_reason(vm: &VirtualMachine) -> Option<(String, String, String)> {
    let status = vm.status.as_ref()?;
    let c = conditions::find(&status.conditions, types::SCHEDULED)?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

#[tokio::test]
async fn unschedulable_reasons_name_the_cause_then_schedule_and_delete_blocks_on_machine()
-> TestResult {
    let h = Harness::new().await?;
    let provider = FakeProvider::start(h.admin.clone(), &h.namespace);
    let controller = h.start_controller().await?;

    // An image not Ready on the only provider's pool. One of its own, never Ready before: the
    // fixtures' image turned not Ready here could still be Ready in the controller's cache when
    // the VM arrives, and a VM once placed stays placed.
    const PENDING_IMAGE: &str = "pending-image";
    h.apply_image(PENDING_IMAGE, "r1", false).await?;
    h.create_vm_of("web-01", CLASS, PENDING_IMAGE).await?;
    let vm = h
        .wait_vm(
            "web-01",
            "Scheduled=False ImageNotReady naming the provider",
            |vm| {
                scheduled_reason(vm).is_some_and(|(s, r, m)| {
                    s == "False" && r == reasons::IMAGE_NOT_READY && m.contains(PROVIDER)
                })
            },
        )
        .await?;
    let (_, _, message) = scheduled_reason(&vm).ok_or("no condition")?;
    assert!(
        message.contains(PENDING_IMAGE) && message.contains(PROVIDER),
        "{message}"
    );

    // A tpmEnabled class needs vtpm, which the provider does not advertise.
    h.apply_class("tpm", true).await?;
    h.apply_image(PENDING_IMAGE, "r1", true).await?;
    h.create_vm("tpm-01", "tpm").await?;
    let vm = h
        .wait_vm("tpm-01", "Scheduled=False NoProviderWithFeature", |vm| {
            scheduled_reason(vm)
                .is_some_and(|(s, r, _)| s == "False" && r == reasons::NO_PROVIDER_WITH_FEATURE)
        })
        .await?;
    assert!(scheduled_reason(&vm).is_some_and(|(_, _, m)| m.contains("vtpm")));

    // A provider whose class has no builder: the reason names the class.
    h.apply_provider(PROVIDER, UNREGISTERED_PROVIDER_CLASS, &["vtpm"])
        .await?;
    let vm = h
        .wait_vm("tpm-01", "Scheduled=False NoBuilderForClass", |vm| {
            scheduled_reason(vm)
                .is_some_and(|(s, r, _)| s == "False" && r == reasons::NO_BUILDER_FOR_CLASS)
        })
        .await?;
    assert!(
        scheduled_reason(&vm)
            .is_some_and(|(_, _, m)| m.contains(&format!("{UNREGISTERED_PROVIDER_CLASS:?}"))),
        "{:?}",
        scheduled_reason(&vm)
    );

    // Fix the provider: both schedule, and the tpm one gets a TPM.
    h.apply_provider(PROVIDER, backend().provider_class, &["vtpm"])
        .await?;
    for name in ["web-01", "tpm-01"] {
        h.wait_vm(name, "Ready", |vm| {
            vm.status.as_ref().is_some_and(|s| {
                conditions::is_true(&s.conditions, types::READY) && !s.addresses.is_empty()
            })
        })
        .await?;
    }
    let tpm_machine = h.machine("tpm-01").await?;
    assert!(tpm_machine.tpm_enabled);
    let tpm_vm = h.api::<VirtualMachine>().get("tpm-01").await?;
    assert_eq!(
        tpm_vm
            .status
            .map(|s| s.tpm_endorsement_certificates)
            .unwrap_or_default(),
        vec![crate::support::fake_provider::FAKE_EK_PEM.to_owned()],
        "the tpm member carries its machine's EK certificate"
    );
    let web_machine = h.machine("web-01").await?;
    assert!(!web_machine.tpm_enabled);
    assert_eq!(web_machine.user_data.as_deref(), Some("#cloud-config\n"));

    // Deleting the VM blocks while the machine's finalizer holds.
    provider
        .controls
        .hold_teardown
        .store(true, Ordering::SeqCst);
    let vms = h.api::<VirtualMachine>();
    vms.delete("web-01", &DeleteParams::default()).await?;
    wait_for("the machine to be deleting", DEADLINE, || async {
        Ok(h.machine_opt("web-01")
            .await?
            .filter(|m| m.deleting)
            .map(|_| ()))
    })
    .await?;
    let vm = vms.get_opt("web-01").await?;
    assert!(
        vm.is_some_and(|vm| vm.metadata.deletion_timestamp.is_some()),
        "the VM waits for its machine"
    );
    provider
        .controls
        .hold_teardown
        .store(false, Ordering::SeqCst);
    gone(&vms, "web-01", "the VM to be gone").await?;
    assert!(
        h.machine_opt("web-01").await?.is_none(),
        "the machine went first"
    );
    controller.stop().await?;
    Ok(())
}

#[tokio::test]
async fn a_machine_created_before_a_lost_status_write_is_adopted_not_rewritten() -> TestResult {
    let h = Harness::new().await?;
    let _provider = FakeProvider::start(h.admin.clone(), &h.namespace);
    // The state a crash between "apply the machine" and "write Scheduled" leaves behind.
    let vm = h.create_vm("web-01", CLASS).await?;
    let uid = kube::ResourceExt::uid(&vm).ok_or("no uid")?;
    h.create_machine(
        serde_json::json!({"name": "web-01", "ownerReferences": [{
            "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "name": "web-01",
            "uid": uid, "controller": true, "blockOwnerDeletion": true}]}),
        backend().machine_spec(PROVIDER, 7),
    )
    .await?;

    let controller = h.start_controller().await?;
    let vm = h
        .wait_vm("web-01", "Scheduled and Ready", |vm| {
            vm.status.as_ref().is_some_and(|s| {
                s.machine_ref.is_some() && conditions::is_true(&s.conditions, types::READY)
            })
        })
        .await?;
    let status = vm.status.ok_or("no status")?;
    assert_eq!(
        status.provider_ref.map(|p| p.name),
        Some(PROVIDER.to_owned())
    );
    assert_eq!(
        status.failure_domain,
        Some(backend().failure_domain(PROVIDER))
    );
    let machine = h.machine("web-01").await?;
    assert_eq!(machine.cpu, 7, "the existing machine was not rewritten");
    controller.stop().await?;
    Ok(())
}

#[tokio::test]
async fn a_pools_members_spread_across_providers() -> TestResult {
    let h = Harness::new().await?;
    let hosts = ["host-1", "host-2", "host-3"];
    for host in hosts {
        h.apply_provider(host, backend().provider_class, &[])
            .await?;
    }
    h.apply_image_on(IMAGE, "r1", true, &hosts).await?;
    let controller = h.start_controller().await?;
    h.create_pool("spread", 6, "InfrastructureReady", serde_json::json!({}))
        .await?;
    let placed = wait_for("six members placed", DEADLINE, || async {
        let placed: Vec<String> = h
            .placements("spread")
            .await?
            .into_iter()
            .filter_map(|m| m.provider)
            .collect();
        Ok((placed.len() == 6).then_some(placed))
    })
    .await?;
    for host in hosts {
        assert_eq!(
            placed.iter().filter(|p| *p == host).count(),
            2,
            "two members on {host}: {placed:?}"
        );
    }
    // The machines agree with the statuses.
    let machines = h.machines().await?;
    for host in hosts {
        assert_eq!(
            machines.iter().filter(|m| m.provider == host).count(),
            2,
            "{host}"
        );
    }
    controller.stop().await
}

#[tokio::test]
async fn a_full_host_takes_no_more_and_the_member_says_which_hosts_lack_what() -> TestResult {
    let h = Harness::new().await?;
    let hosts = ["host-1", "host-2"];
    for host in hosts {
        h.apply_provider(host, backend().provider_class, &[])
            .await?;
        // Room for two members of the harness class (2 GiB each), no overcommit.
        h.set_capacity(host, 4 << 30).await?;
    }
    h.apply_image_on(IMAGE, "r1", true, &hosts).await?;
    let controller = h.start_controller().await?;
    h.create_pool("full", 5, "InfrastructureReady", serde_json::json!({}))
        .await?;
    let vms = h.api::<VirtualMachine>();
    let selector = format!("{}=full", banlieue_api::names::LABEL_POOL);
    let (placed, refused) = wait_for("four placed and one refused", DEADLINE, || {
        let (vms, selector) = (vms.clone(), selector.clone());
        async move {
            let members = vms
                .list(&kube::api::ListParams::default().labels(&selector))
                .await?
                .items;
            let placed: Vec<String> = members
                .iter()
                .filter_map(|vm| Some(vm.status.as_ref()?.provider_ref.as_ref()?.name.clone()))
                .collect();
            let refused: Vec<String> = members
                .iter()
                .filter_map(scheduled_reason)
                .filter(|(s, r, _)| s == "False" && r == reasons::INSUFFICIENT_CAPACITY)
                .map(|(_, _, m)| m)
                .collect();
            Ok((placed.len() == 4 && refused.len() == 1).then_some((placed, refused)))
        }
    })
    .await?;
    for host in hosts {
        assert_eq!(
            placed.iter().filter(|p| *p == host).count(),
            2,
            "{placed:?}"
        );
    }
    assert_eq!(
        refused[0],
        "class small needs 2.0 GiB of memory and no failure domain has it to spare: \
         host-1 has 0.0 GiB of 4.0 GiB free; host-2 has 0.0 GiB of 4.0 GiB free"
    );
    // A host that grows takes the waiting member.
    h.set_capacity("host-2", 6 << 30).await?;
    wait_for("the fifth member placed on host-2", DEADLINE, || async {
        let on_2 = h
            .placements("full")
            .await?
            .iter()
            .filter(|m| m.provider.as_deref() == Some("host-2"))
            .count();
        Ok((on_2 == 3).then_some(()))
    })
    .await?;
    controller.stop().await
}

#[tokio::test]
async fn a_lost_hosts_unclaimed_members_are_replaced_elsewhere_and_its_claims_stay_bound()
-> TestResult {
    let h = Harness::new().await?;
    let hosts = ["host-1", "host-2", "host-3"];
    for host in hosts {
        h.apply_provider(host, backend().provider_class, &[])
            .await?;
    }
    h.apply_image_on(IMAGE, "r1", true, &hosts).await?;
    let provider = FakeProvider::start(h.admin.clone(), &h.namespace);
    // test_config: a Provider not Ready for 3 s is lost.
    let controller = h.start_controller().await?;
    h.create_pool("lost", 6, "InfrastructureReady", serde_json::json!({}))
        .await?;
    h.wait_available("lost", 6).await?;
    h.create_claim("kept", "lost", 3600).await?;
    let kept = h.wait_claim("kept", "Bound", is_bound).await?;
    let kept_member = member_name(&kept).ok_or("no member")?;
    // A bound member leaves its pool's selector; its placement is on the VM itself.
    let kept_vm = h.api::<VirtualMachine>().get(&kept_member).await?;
    let down = kept_vm
        .status
        .and_then(|s| s.provider_ref)
        .map(|p| p.name)
        .ok_or("the bound member has no provider")?;
    h.wait_available("lost", 6).await?;
    let on_down = |placed: &[Placed]| -> Vec<String> {
        placed
            .iter()
            .filter(|m| !m.claimed && m.provider.as_deref() == Some(down.as_str()))
            .map(|m| m.name.clone())
            .collect()
    };
    let stranded = on_down(&h.placements("lost").await?);
    assert!(
        !stranded.is_empty(),
        "an unclaimed member shares the claimed one's host"
    );

    // The host goes away (its workload says so, as a real one does when libvirtd is gone);
    // the fake provider can no longer tear anything down there either.
    provider
        .controls
        .hold_teardown
        .store(true, Ordering::SeqCst);
    h.set_provider_ready(&down, false).await?;
    // Within the grace, nothing is replaced, but a claim is not handed a member of that host.
    h.create_claim("meanwhile", "lost", 3600).await?;
    let meanwhile = h.wait_claim("meanwhile", "Bound", is_bound).await?;
    let meanwhile_member = member_name(&meanwhile).ok_or("no member")?;
    assert!(
        !stranded.contains(&meanwhile_member),
        "bound {meanwhile_member} on the unready host"
    );

    // Past the grace: the stranded members are being deleted and replaced on the other hosts.
    wait_for("replacements on the other hosts", DEADLINE, || async {
        let placed = h.placements("lost").await?;
        let live: Vec<&Placed> = placed
            .iter()
            .filter(|m| !m.claimed && !m.deleting)
            .collect();
        let deleting: Vec<String> = placed
            .iter()
            .filter(|m| m.deleting)
            .map(|m| m.name.clone())
            .collect();
        let done = live.len() == 6
            && live
                .iter()
                .all(|m| m.provider.as_deref().is_some_and(|p| p != down))
            && stranded.iter().all(|s| deleting.contains(s));
        Ok(done.then_some(()))
    })
    .await?;
    h.wait_available("lost", 6).await?;
    // The claim on the lost host is still Bound: its member exists, only its host is away.
    let kept = h
        .api::<banlieue_api::VirtualMachineClaim>()
        .get("kept")
        .await?;
    assert!(is_bound(&kept), "{:?}", kept.status);
    let kept_vm = h.api::<VirtualMachine>().get(&kept_member).await?;
    assert!(kept_vm.metadata.deletion_timestamp.is_none());

    // The host comes back: the provider tears the stranded members down, and they are gone.
    h.set_provider_ready(&down, true).await?;
    provider
        .controls
        .hold_teardown
        .store(false, Ordering::SeqCst);
    wait_for("the stranded members gone", DEADLINE, || async {
        let placed = h.placements("lost").await?;
        Ok(stranded
            .iter()
            .all(|s| !placed.iter().any(|m| &m.name == s))
            .then_some(()))
    })
    .await?;
    let kept = h
        .api::<banlieue_api::VirtualMachineClaim>()
        .get("kept")
        .await?;
    assert!(is_bound(&kept), "{:?}", kept.status);
    controller.stop().await
}

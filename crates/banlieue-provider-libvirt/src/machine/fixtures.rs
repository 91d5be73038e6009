//! What the tests of the LibvirtMachine's pure modules share: a machine and its two kinds of
//! disk, what a reconcile saw of its domain, and a machine whose guest was ready.

use banlieue_api::common::address_type;
use banlieue_api::conditions::{self, Condition};
use banlieue_api::{
    Firmware, LibvirtDisk, LibvirtMachine, LibvirtMachineSpec, LibvirtMachineStatus,
    LocalObjectReference, MachineAddress, Standby,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::standby::StandbySight;
use super::status::{Observed, status_after};

pub(super) fn machine(disk: LibvirtDisk, user_data: Option<&str>) -> LibvirtMachine {
    let mut m = LibvirtMachine::new(
        "web-01",
        LibvirtMachineSpec {
            provider_ref: LocalObjectReference::new("edge-7"),
            pool: "default".into(),
            network: "br-prod".into(),
            disk,
            firmware: Firmware::Bios,
            tpm_enabled: false,
            secure_boot: false,
            cpu: 2,
            memory: Quantity("1Gi".into()),
            user_data: user_data.map(str::to_owned),
            user_data_secret_ref: None,
            standby: None,
            access: None,
            handover: None,
            egress: None,
        },
    );
    m.metadata.namespace = Some("banlieue-system".into());
    m
}

pub(super) fn immediate() -> LibvirtDisk {
    LibvirtDisk {
        backing_volume: Some("ubuntu-2404.raw".into()),
        install_media: None,
        size: Quantity("10Gi".into()),
    }
}

pub(super) fn deferred() -> LibvirtDisk {
    LibvirtDisk {
        backing_volume: None,
        install_media: Some("installer.iso".into()),
        size: Quantity("20Gi".into()),
    }
}

pub(super) const UUID: &str = "6f1c3b0e-6a7e-4c5b-9f53-0d7b1e2a9c11";

pub(super) fn at(second: i64) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::from_second(second).unwrap(),
    )
}

pub(super) fn running() -> Observed {
    Observed {
        running: true,
        addresses: vec![MachineAddress {
            type_: address_type::INTERNAL_IP.into(),
            address: "10.0.0.5".into(),
        }],
        addresses_from_guest: false,
        guest: super::guest::GuestSight::Phase {
            phase: super::guest::Phase::Ready,
            ek: super::guest::EkReading::NotRead,
        },
        standby: StandbySight::Running,
        host_keys: None,
        attestation_key: None,
        access: None,
        handover: None,
    }
}

/// A machine whose domain ran and whose guest said `ready`, with an EK certificate and
/// an address recorded: what the controller asks to save. `standby` is its spec's.
pub(super) fn ready_machine(standby: Option<Standby>) -> LibvirtMachine {
    let mut m = machine(immediate(), None);
    m.metadata.generation = Some(1);
    m.status = Some(LibvirtMachineStatus {
        domain_uuid: Some(UUID.into()),
        contract: banlieue_api::MachineStatusContract {
            tpm_endorsement_certificates: vec!["PEM".into()],
            tpm_endorsement_key_digests: vec!["sha256:00".into()],
            ..Default::default()
        },
        ..Default::default()
    });
    let s = status_after(&m, "banlieue-system", "edge-7", &Ok(running()), at(10));
    m.status = Some(s);
    m.spec.standby = standby;
    m.metadata.generation = Some(2);
    m
}

pub(super) fn condition(s: &LibvirtMachineStatus, type_: &str) -> Condition {
    conditions::find(&s.contract.conditions, type_)
        .cloned()
        .unwrap_or_else(|| panic!("no {type_} condition"))
}

pub(super) fn saved_domain() -> Observed {
    Observed {
        running: false,
        addresses: vec![],
        addresses_from_guest: false,
        guest: super::guest::GuestSight::NotRunning,
        standby: StandbySight::Saved,
        host_keys: None,
        attestation_key: None,
        access: None,
        handover: None,
    }
}

/// A ready machine whose domain was saved (its status written at second 20), now asked to run
/// again by a new spec (generation 3).
pub(super) fn saved_then_asked_to_run() -> LibvirtMachine {
    let mut m = ready_machine(Some(Standby::Saved));
    m.status = Some(status_after(
        &m,
        "banlieue-system",
        "edge-7",
        &Ok(saved_domain()),
        at(20),
    ));
    m.spec.standby = Some(Standby::Running);
    m.metadata.generation = Some(3);
    m
}

//! What the tests of the VSphereMachine's pure modules share: a machine, what a reconcile saw
//! of its VM, and a machine with a standby asked and reported.

use banlieue_api::{LocalObjectReference, Standby, VSphereMachine, VSphereMachineSpec};
use banlieue_vsphere::GuestNic;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::error::Error;

use super::power::StandbySight;
use super::status::{Observed, status_after};

pub(super) fn machine() -> VSphereMachine {
    let mut m = VSphereMachine::new(
        "web-01",
        VSphereMachineSpec {
            provider_ref: LocalObjectReference::new("vc"),
            datacenter: "DC0".into(),
            cluster: "DC0_C1".into(),
            template: "DC0/vm/DC0_C0_RP0_VM0".into(),
            folder: None,
            datastore: None,
            cpu: 2,
            memory: Quantity("1Gi".into()),
            user_data: None,
            user_data_secret_ref: None,
            tpm_enabled: false,
            secure_boot: false,
            standby: None,
            access: None,
            handover: None,
        },
    );
    m.metadata.namespace = Some("team-a".into());
    m.metadata.generation = Some(2);
    m
}

pub(super) fn observed() -> Observed {
    Observed {
        vm_name: "team-a-web-01".into(),
        moref: "vm-42".into(),
        instance_uuid: Some("5003-abcd".into()),
        powered_on: true,
        power_state: "poweredOn".into(),
        nics: vec![GuestNic {
            mac_address: None,
            network: None,
            connected: true,
            ip_addresses: vec![
                "192.0.2.10".into(),
                "fe80::1".into(),
                "127.0.0.1".into(),
                "not an address".into(),
                "2001:db8::10".into(),
                "192.0.2.10".into(),
            ],
        }],
        phase: None,
        access_written: None,
        access_state: None,
        host_keys: None,
        ek_certificates: vec![],
        standby: StandbySight::Running,
    }
}

/// A machine whose spec asks for `standby`, and whose status last reported `reported`.
pub(super) fn with_standby(standby: Option<Standby>, reported: Option<Standby>) -> VSphereMachine {
    let mut m = machine();
    m.spec.standby = standby;
    let mut status = status_after(&m, &Ok(observed()), Time(Default::default()));
    status.contract.standby = reported;
    m.status = Some(status);
    m
}

/// vSphere's refusal of a power task, with the fault `kind`.
pub(super) fn refusal(kind: &str) -> Error {
    Error::VSphere {
        what: "power on VM DC0/vm/team-a-web-01".into(),
        source: banlieue_vsphere::Error::Task {
            task: banlieue_vsphere::ManagedObjectRef::new("Task", "task-7"),
            fault: banlieue_vsphere::Fault {
                kind: kind.into(),
                message: "the host said no".into(),
            },
        },
    }
}

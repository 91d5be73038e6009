//! What a reconcile saw of a LibvirtMachine's domain and its guest's addresses, and the status
//! and conditions that follow. No I/O here.

use banlieue_api::common::address_type;
use banlieue_api::conditions::{self, Condition, reasons, status, types};
use banlieue_api::{LibvirtMachine, LibvirtMachineStatus, MachineAddress};
use banlieue_libvirt::InterfaceAddresses;
use banlieue_provider_kit::access::AccessSight;
use banlieue_provider_kit::handover::HandoverSight;
use banlieue_provider_kit::machine_status::{self, Failure, Live, Observation, Sight};

use super::domain::MachineNames;
use super::standby::{StandbySight, reports_standby};
use crate::error::{Error, Result};

/// `libvirt://<provider namespace>/<provider>/<domain uuid>`.
pub fn provider_id(namespace: &str, provider: &str, uuid: &str) -> String {
    format!("libvirt://{namespace}/{provider}/{uuid}")
}

/// Addresses of the guest's interfaces, loopback and link-local left out.
pub fn addresses(interfaces: &[InterfaceAddresses]) -> Vec<MachineAddress> {
    let mut out: Vec<MachineAddress> = Vec::new();
    for iface in interfaces.iter().filter(|i| i.name != "lo") {
        for a in &iface.addrs {
            let ip: Option<std::net::IpAddr> = a.addr.parse().ok();
            let keep = match ip {
                Some(std::net::IpAddr::V4(v4)) => !v4.is_loopback() && !v4.is_link_local(),
                Some(std::net::IpAddr::V6(v6)) => {
                    !v6.is_loopback() && (v6.segments()[0] & 0xffc0) != 0xfe80
                }
                None => false,
            };
            let address = MachineAddress {
                type_: address_type::INTERNAL_IP.to_owned(),
                address: a.addr.clone(),
            };
            if keep && !out.contains(&address) {
                out.push(address);
            }
        }
    }
    out
}

/// What the host said about the machine's domain, as far as status is concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    pub running: bool,
    pub addresses: Vec<MachineAddress>,
    /// The addresses are what the guest's agent reports, not the host's DHCP leases: the
    /// guest chose them, and the Ready message says so.
    pub addresses_from_guest: bool,
    /// What the guest says about itself through its agent.
    pub guest: super::guest::GuestSight,
    /// What became of the domain's standby (ADR-0073).
    pub standby: StandbySight,
    /// The guest's SSH host keys, read this reconcile (the first that saw it `ready`);
    /// `None` keeps those recorded.
    pub host_keys: Option<Vec<String>>,
    /// What became of the claim's keys, for a machine given some whose guest has not yet
    /// settled them; `None` otherwise.
    pub access: Option<AccessSight>,
    /// The guest's attestation key, read this reconcile (the first that saw it `ready`);
    /// `None` keeps the one recorded.
    pub attestation_key: Option<String>,
    /// What became of a handover challenge not yet answered; `None` when there is none.
    pub handover: Option<HandoverSight>,
}

impl Observed {
    /// Whether the skeleton may look again only at the resync: a running domain, or a saved
    /// one, which waits for its spec to change (a watch event) and is never started on a
    /// timer. Only a domain on its way to running is looked at sooner.
    pub fn settled(&self) -> bool {
        let access_pending = matches!(self.access, Some(AccessSight::Pending(_)));
        let handover_pending = matches!(self.handover, Some(HandoverSight::Pending(_)));
        (self.running && !access_pending && !handover_pending)
            || self.standby == StandbySight::Saved
    }
}

/// The status after a reconcile: `outcome` is what the host showed, or the error that stopped
/// the reconcile. Conditions keep their transition time unless their status changes.
pub fn status_after(
    machine: &LibvirtMachine,
    provider_namespace: &str,
    provider: &str,
    outcome: &Result<Observed>,
    now: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> LibvirtMachineStatus {
    let old = machine.status.clone().unwrap_or_default();
    let names = MachineNames::of(machine);
    let generation = machine.metadata.generation;
    let mut new = LibvirtMachineStatus {
        domain_name: Some(names.domain.clone()),
        ..old.clone()
    };
    let standby = reports_standby(machine, &old);
    let outcome = match outcome {
        Ok(observed) => Ok(Observation {
            provider_id: old
                .domain_uuid
                .as_deref()
                .map(|uuid| provider_id(provider_namespace, provider, uuid)),
            sight: sight(machine, &old, &names.domain, observed, standby),
        }),
        Err(e) => {
            if standby && e.reason() == reasons::RESTORE_FAILED {
                // Neither saved (the image is gone) nor running. `status.standby` stays as it
                // was: `Running` would read as resumed, and a merge patch cannot unset it.
                conditions::set(
                    &mut new.contract.conditions,
                    conditions::new(
                        types::SAVED,
                        status::FALSE,
                        reasons::DOMAIN_NOT_SAVED,
                        format!(
                            "domain {} could not be restored and its save image was removed",
                            names.domain
                        ),
                        generation,
                    ),
                    now.clone(),
                );
            }
            Err(Failure {
                reason: e.reason(),
                message: conditions::error_message(e),
            })
        }
    };
    machine_status::fill(&mut new.contract, outcome, standby, generation, now);
    new
}

/// What the host showed of the domain, in the contract's terms and libvirt's words.
fn sight(
    machine: &LibvirtMachine,
    old: &LibvirtMachineStatus,
    domain: &str,
    observed: &Observed,
    standby: bool,
) -> Sight {
    let generation = machine.metadata.generation;
    if observed.standby == StandbySight::Saved {
        return Sight::Saved {
            reason: reasons::DOMAIN_SAVED,
            saved_message: format!(
                "domain {domain} is saved (managed save) and holds no host memory"
            ),
            ready_message: format!(
                "domain {domain} is saved (managed save) and holds no host memory; it is \
                 restored when its spec says Running"
            ),
        };
    }
    let guest =
        super::guest::guest_status(&observed.guest, machine.spec.tpm_enabled, old, generation);
    let not_saved = standby.then(|| {
        (
            reasons::DOMAIN_NOT_SAVED,
            not_saved(old, domain, &observed.standby),
        )
    });
    let ready_message = if observed.running {
        let mut message = if observed.addresses_from_guest {
            format!(
                "domain {domain} is running; its addresses are as its guest agent reports \
                 them (the host holds no DHCP lease for it)"
            )
        } else {
            format!("domain {domain} is running")
        };
        if let Some(restore) = restored(&observed.standby) {
            message.push_str("; ");
            message.push_str(&restore);
        }
        message
    } else {
        format!("domain {domain} is defined but not running yet")
    };
    let mut guest_conditions = vec![guest.guest_ready, guest.agent_connected];
    let mut login_user = None;
    if let Some(sight) = &observed.access {
        guest_conditions.push(banlieue_provider_kit::access::condition(sight, generation));
        if let AccessSight::Installed { user } = sight {
            login_user = Some(user.clone());
        }
    }
    Sight::Live(Box::new(Live {
        running: observed.running,
        addresses: observed.addresses.clone(),
        guest_phase: guest.guest_phase,
        endorsement: Some((guest.certificates, guest.key_digests)),
        ssh_host_keys: observed.host_keys.clone(),
        login_user,
        attestation_key: observed.attestation_key.clone(),
        handover_answer: match &observed.handover {
            Some(HandoverSight::Answered(answer)) => Some(answer.clone()),
            _ => None,
        },
        guest_conditions,
        not_saved,
        running_reason: reasons::DOMAIN_RUNNING,
        ready_message,
    }))
}

/// What a restore in this reconcile did, for the Ready message.
fn restored(sight: &StandbySight) -> Option<String> {
    match sight {
        StandbySight::Restored { clock: Ok(()) } => Some(
            "restored from its managed save image, its guest's clock set to the host's time"
                .to_owned(),
        ),
        StandbySight::Restored { clock: Err(why) } => Some(format!(
            "restored from its managed save image, but its guest's clock was not set ({why}): \
             it is behind by the time it was saved"
        )),
        _ => None,
    }
}

/// The message of `Saved=False` while the domain runs: a restore or a fresh start of a domain
/// asked to be saved says so, and the message stays until the next one (later reconciles of a
/// running domain keep it).
fn not_saved(old: &LibvirtMachineStatus, domain: &str, sight: &StandbySight) -> String {
    match sight {
        StandbySight::Restored { .. } => restored(sight)
            .map(|r| format!("domain {domain} runs: {r}"))
            .unwrap_or_default(),
        StandbySight::StartedAfresh => format!(
            "domain {domain} had no managed save image (its host restarted, or it was \
             stopped) and was started afresh; it is saved again once its guest is ready"
        ),
        StandbySight::Running | StandbySight::Saved => {
            match conditions::find(&old.contract.conditions, types::SAVED) {
                // What the last restore or fresh start said stays while the domain runs.
                Some(c) if c.status == status::FALSE && c.reason == reasons::DOMAIN_NOT_SAVED => {
                    c.message.clone()
                }
                _ => format!("domain {domain} runs"),
            }
        }
    }
}

/// The Ready=False condition for an error, with the whole error chain as its message.
pub fn condition_for(e: &Error, generation: Option<i64>) -> Condition {
    conditions::new(
        types::READY,
        status::FALSE,
        e.reason(),
        banlieue_api::conditions::error_message(e),
        generation,
    )
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{
        UUID, at, condition, immediate, machine, ready_machine, running, saved_domain,
        saved_then_asked_to_run,
    };
    use super::super::standby::{StandbyAct, standby_act, started};
    use super::super::targets::volume_missing;
    use super::*;
    use banlieue_api::Standby;
    use banlieue_libvirt::{IpAddress, IpAddressType};

    #[test]
    fn status_reports_running_domain() {
        let mut m = machine(immediate(), None);
        m.status = Some(LibvirtMachineStatus {
            domain_uuid: Some(UUID.into()),
            ..Default::default()
        });
        let at = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::from_second(10).unwrap(),
        );
        let s = status_after(
            &m,
            "banlieue-system",
            "edge-7",
            &Ok(Observed {
                running: true,
                addresses: vec![],
                addresses_from_guest: false,
                guest: super::super::guest::GuestSight::NoPhaseFile,
                standby: StandbySight::Running,
                host_keys: None,
                attestation_key: None,
                access: None,
                handover: None,
            }),
            at.clone(),
        );
        assert!(s.contract.ready);
        let ready = conditions::find(&s.contract.conditions, "Ready").unwrap();
        assert_eq!(ready.message, "domain banlieue-system-web-01 is running");
        let from_guest = status_after(
            &m,
            "banlieue-system",
            "edge-7",
            &Ok(Observed {
                running: true,
                addresses: vec![],
                addresses_from_guest: true,
                guest: super::super::guest::GuestSight::NoPhaseFile,
                standby: StandbySight::Running,
                host_keys: None,
                attestation_key: None,
                access: None,
                handover: None,
            }),
            at.clone(),
        );
        let ready = conditions::find(&from_guest.contract.conditions, "Ready").unwrap();
        assert!(
            ready.message.ends_with("its addresses are as its guest agent reports them (the host holds no DHCP lease for it)"),
            "{}",
            ready.message
        );
        assert!(s.contract.initialization.provisioned);
        assert_eq!(
            s.contract.provider_id.as_deref(),
            Some(format!("libvirt://banlieue-system/edge-7/{UUID}").as_str())
        );
        assert_eq!(s.domain_name.as_deref(), Some("banlieue-system-web-01"));
        assert!(conditions::is_true(&s.contract.conditions, "Ready"));

        m.status = Some(s);
        let s = status_after(
            &m,
            "banlieue-system",
            "edge-7",
            &Err(volume_missing("a", "b")),
            at,
        );
        assert!(!s.contract.ready);
        let c = conditions::find(&s.contract.conditions, "Ready").unwrap();
        assert_eq!(c.reason, "VolumeNotInPool");
        assert_eq!(c.message, "volume a is not in pool b");
    }

    #[test]
    fn addresses_skip_loopback_and_link_local() {
        let ifaces = vec![
            InterfaceAddresses::new(
                "lo",
                None,
                vec![IpAddress::new(IpAddressType::Ipv4, "127.0.0.1", 8)],
            ),
            InterfaceAddresses::new(
                "eth0",
                Some("52:54:00:00:00:01".into()),
                vec![
                    IpAddress::new(IpAddressType::Ipv4, "10.0.0.5", 24),
                    IpAddress::new(IpAddressType::Ipv6, "fe80::1", 64),
                    IpAddress::new(IpAddressType::Ipv6, "fd00::5", 64),
                ],
            ),
        ];
        let a = addresses(&ifaces);
        let got: Vec<&str> = a.iter().map(|a| a.address.as_str()).collect();
        assert_eq!(got, ["10.0.0.5", "fd00::5"]);
    }

    #[test]
    fn a_saved_machine_is_ready_and_keeps_what_its_guest_said() {
        let m = ready_machine(Some(Standby::Saved));
        let before = m.status.clone().unwrap();
        let s = status_after(&m, "banlieue-system", "edge-7", &Ok(saved_domain()), at(20));
        assert_eq!(s.contract.standby, Some(Standby::Saved));
        assert!(
            s.contract.ready,
            "a saved machine is resumed, not provisioned"
        );
        assert_eq!(s.contract.observed_generation, Some(2));
        let ready = condition(&s, types::READY);
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            (status::TRUE, reasons::DOMAIN_SAVED)
        );
        assert!(
            ready.message.starts_with(
                "domain banlieue-system-web-01 is saved (managed save) and holds no host memory"
            ),
            "{}",
            ready.message
        );
        let saved = condition(&s, types::SAVED);
        assert_eq!(
            (saved.status.as_str(), saved.reason.as_str()),
            (status::TRUE, reasons::DOMAIN_SAVED)
        );
        assert_eq!(saved.observed_generation, Some(2));
        // The guest is not asked anything: what it said before the save stays.
        assert_eq!(s.contract.guest_phase.as_deref(), Some("ready"));
        assert_eq!(s.contract.addresses, before.contract.addresses);
        assert_eq!(
            s.contract.tpm_endorsement_certificates,
            before.contract.tpm_endorsement_certificates
        );
        for type_ in [types::GUEST_READY, types::AGENT_CONNECTED] {
            assert_eq!(condition(&s, type_), condition(&before, type_), "{type_}");
        }
        assert!(conditions::is_true(
            &s.contract.conditions,
            types::GUEST_READY
        ));
        // Found saved again on the next look: nothing to write.
        let mut again = m.clone();
        again.status = Some(s.clone());
        assert_eq!(
            status_after(
                &again,
                "banlieue-system",
                "edge-7",
                &Ok(saved_domain()),
                at(30)
            ),
            s
        );
    }

    #[test]
    fn a_restored_machine_runs_and_says_whether_its_clock_was_set() {
        let m = saved_then_asked_to_run();
        let restored = |clock: std::result::Result<(), String>| Observed {
            standby: StandbySight::Restored { clock },
            ..running()
        };
        let s = status_after(
            &m,
            "banlieue-system",
            "edge-7",
            &Ok(restored(Err("QEMU guest agent is not connected".into()))),
            at(40),
        );
        assert_eq!(s.contract.standby, Some(Standby::Running));
        assert!(s.contract.ready);
        let saved = condition(&s, types::SAVED);
        assert_eq!(
            (saved.status.as_str(), saved.reason.as_str()),
            (status::FALSE, reasons::DOMAIN_NOT_SAVED)
        );
        assert_eq!(saved.last_transition_time, at(40));
        let ready = condition(&s, types::READY);
        assert_eq!(ready.reason, reasons::DOMAIN_RUNNING);
        assert!(
            ready.message.contains(
                "restored from its managed save image, but its guest's clock was not set \
                 (QEMU guest agent is not connected)"
            ),
            "{}",
            ready.message
        );
        assert!(
            saved.message.contains("clock was not set"),
            "{}",
            saved.message
        );
        // Read again, not the recorded ones.
        assert_eq!(s.contract.addresses, running().addresses);

        let s = status_after(
            &m,
            "banlieue-system",
            "edge-7",
            &Ok(restored(Ok(()))),
            at(40),
        );
        let ready = condition(&s, types::READY);
        assert!(
            ready.message.ends_with(
                "restored from its managed save image, its guest's clock set to the host's time"
            ),
            "{}",
            ready.message
        );
        // The next look at the running domain: Saved=False keeps what the restore said.
        let mut later = m.clone();
        later.status = Some(s.clone());
        let next = status_after(&later, "banlieue-system", "edge-7", &Ok(running()), at(50));
        assert_eq!(condition(&next, types::SAVED), condition(&s, types::SAVED));
        assert_eq!(
            condition(&next, types::READY).message,
            "domain banlieue-system-web-01 is running"
        );
    }

    #[test]
    fn a_machine_without_standby_sees_no_status_change() {
        let m = ready_machine(None);
        let before = m.status.clone().unwrap();
        let mut same_generation = m.clone();
        same_generation.metadata.generation = Some(1);
        let s = status_after(
            &same_generation,
            "banlieue-system",
            "edge-7",
            &Ok(running()),
            at(30),
        );
        assert_eq!(s, before, "nothing to write");
        assert_eq!(s.contract.standby, None);
        assert!(conditions::find(&s.contract.conditions, types::SAVED).is_none());
        let json = serde_json::to_value(&s).unwrap();
        assert!(json.get("standby").is_none(), "{json}");
        // Started after its host restarted: still nothing about standby.
        assert_eq!(standby_act(&m, false, true, false), StandbyAct::Start);
        assert_eq!(started(&m), StandbySight::Running);

        // Asked to run explicitly (a claimed member never saved): it says so.
        let mut asked = same_generation.clone();
        asked.spec.standby = Some(Standby::Running);
        let s = status_after(&asked, "banlieue-system", "edge-7", &Ok(running()), at(30));
        assert_eq!(s.contract.standby, Some(Standby::Running));
        assert_eq!(
            condition(&s, types::SAVED).message,
            "domain banlieue-system-web-01 runs"
        );
    }
}

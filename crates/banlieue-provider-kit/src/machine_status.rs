//! The contract half of a machine's status after a reconcile, the same for every backend: the
//! provider ID, provisioning, the guest's fields and conditions, the standby marks and Ready.
//! A backend says what it saw, in its own reasons and messages ([`Observation`]); this says
//! where each goes. What only a backend records (a domain's UUID, a VM's moref) stays its own.

use banlieue_api::conditions::{self, Condition, reasons, status, types};
use banlieue_api::{MachineAddress, MachineStatusContract};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::standby;

/// What a reconcile that succeeded saw of a machine.
#[derive(Clone, Debug)]
pub struct Observation {
    /// The backend's id of the machine, once known; the status keeps the one it had otherwise.
    pub provider_id: Option<String>,
    /// Whether the machine is saved or live.
    pub sight: Sight,
}

/// A saved machine, or one that is not.
#[derive(Clone, Debug)]
pub enum Sight {
    /// Saved (a managed save, a suspended VM). The guest is not asked anything while saved:
    /// its phase, its conditions, its EK certificates and its addresses stay as recorded. It
    /// is ready: a claim resumes it, nothing provisions it.
    Saved {
        /// The reason of `Saved=True` and of `Ready=True`.
        reason: &'static str,
        /// `Saved=True`'s message.
        saved_message: String,
        /// `Ready=True`'s message.
        ready_message: String,
    },
    /// Running, or on its way to running.
    Live(Box<Live>),
}

/// A machine that is not saved, read afresh.
#[derive(Clone, Debug)]
pub struct Live {
    /// Whether it runs: Ready=True with [`Live::running_reason`], else `Provisioning`.
    pub running: bool,
    pub addresses: Vec<MachineAddress>,
    pub guest_phase: Option<String>,
    /// The EK certificates (PEM) and their key digests to record; `None` keeps those recorded.
    pub endorsement: Option<(Vec<String>, Vec<String>)>,
    /// The guest's SSH host keys to record; `None` keeps those recorded.
    pub ssh_host_keys: Option<Vec<String>>,
    /// The login the guest installed the claim's keys for; `None` keeps the one recorded.
    pub login_user: Option<String>,
    /// The guest's attestation key (TPM2B_PUBLIC, base64); `None` keeps the one recorded.
    pub attestation_key: Option<String>,
    /// The guest's answer to the machine's handover challenge; `None` keeps the one recorded.
    pub handover_answer: Option<banlieue_api::handover::HandoverAnswer>,
    /// The guest's conditions (GuestReady, and whatever else the backend observes of its
    /// guest), set in this order.
    pub guest_conditions: Vec<Condition>,
    /// `Saved=False`'s reason and message, when the status reports standby and says so now.
    pub not_saved: Option<(&'static str, String)>,
    /// Ready=True's reason while it runs.
    pub running_reason: &'static str,
    /// Ready's message.
    pub ready_message: String,
}

/// Why a reconcile failed: Ready=False with `reason` and `message` (the error's whole chain).
#[derive(Clone, Debug)]
pub struct Failure {
    pub reason: &'static str,
    pub message: String,
}

/// Fills `contract` after a reconcile, keeping what was recorded before where the outcome
/// says nothing of it. `reports_standby` is [`standby::reports_standby`]'s answer for the
/// machine. Conditions keep their transition time unless their status changes.
pub fn fill(
    contract: &mut MachineStatusContract,
    outcome: Result<Observation, Failure>,
    reports_standby: bool,
    generation: Option<i64>,
    now: Time,
) {
    contract.observed_generation = generation;
    let ready = match outcome {
        Ok(observation) => {
            if let Some(id) = observation.provider_id {
                contract.provider_id = Some(id);
            }
            contract.initialization.provisioned = true;
            match observation.sight {
                Sight::Saved {
                    reason,
                    saved_message,
                    ready_message,
                } => {
                    standby::mark_saved(
                        contract,
                        reports_standby,
                        reason,
                        saved_message,
                        generation,
                        &now,
                    );
                    conditions::new(
                        types::READY,
                        status::TRUE,
                        reason,
                        ready_message,
                        generation,
                    )
                }
                Sight::Live(live) => fill_live(contract, *live, generation, &now),
            }
        }
        Err(failure) => {
            contract.ready = false;
            conditions::new(
                types::READY,
                status::FALSE,
                failure.reason,
                failure.message,
                generation,
            )
        }
    };
    conditions::set(&mut contract.conditions, ready, now);
}

/// The contract of a machine that is not saved, and its Ready condition.
fn fill_live(
    contract: &mut MachineStatusContract,
    live: Live,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    contract.ready = live.running;
    contract.addresses = live.addresses;
    contract.guest_phase = live.guest_phase;
    if let Some((pems, digests)) = live.endorsement {
        contract.tpm_endorsement_certificates = pems;
        contract.tpm_endorsement_key_digests = digests;
    }
    if let Some(keys) = live.ssh_host_keys {
        contract.ssh_host_keys = keys;
    }
    if let Some(user) = live.login_user {
        contract.login_user = Some(user);
    }
    if live.attestation_key.is_some() || live.handover_answer.is_some() {
        let attestation = contract.attestation.get_or_insert_default();
        if let Some(key) = live.attestation_key {
            attestation.attestation_key = Some(key);
        }
        if let Some(answer) = live.handover_answer {
            attestation.answer = Some(answer);
        }
    }
    for condition in live.guest_conditions {
        conditions::set(&mut contract.conditions, condition, now.clone());
    }
    if let Some((reason, message)) = live.not_saved {
        standby::mark_running(contract, reason, message, generation, now);
    }
    if live.running {
        conditions::new(
            types::READY,
            status::TRUE,
            live.running_reason,
            live.ready_message,
            generation,
        )
    } else {
        conditions::new(
            types::READY,
            status::FALSE,
            reasons::PROVISIONING,
            live.ready_message,
            generation,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::Standby;

    fn at(second: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000 + second).expect("time"))
    }

    fn live(running: bool) -> Live {
        Live {
            running,
            addresses: vec![],
            guest_phase: Some("ready".into()),
            endorsement: None,
            ssh_host_keys: None,
            login_user: None,
            attestation_key: None,
            handover_answer: None,
            guest_conditions: vec![conditions::new(
                types::GUEST_READY,
                status::TRUE,
                "GuestReady",
                "ready",
                Some(1),
            )],
            not_saved: Some(("NotSaved", "runs".into())),
            running_reason: "Running",
            ready_message: "runs".into(),
        }
    }

    #[test]
    fn a_saved_machine_keeps_what_its_guest_said_and_a_failure_keeps_everything_but_ready() {
        let mut contract = MachineStatusContract::default();
        let observed = |sight| Observation {
            provider_id: Some("test://m".into()),
            sight,
        };
        fill(
            &mut contract,
            Ok(observed(Sight::Live(Box::new(live(true))))),
            true,
            Some(1),
            at(0),
        );
        assert!(contract.ready && contract.initialization.provisioned);
        assert_eq!(contract.standby, Some(Standby::Running));
        assert_eq!(contract.provider_id.as_deref(), Some("test://m"));

        let saved = Sight::Saved {
            reason: "Saved",
            saved_message: "saved".into(),
            ready_message: "saved, ready".into(),
        };
        fill(&mut contract, Ok(observed(saved)), true, Some(2), at(1));
        assert_eq!(contract.standby, Some(Standby::Saved));
        assert_eq!(contract.guest_phase.as_deref(), Some("ready"));
        assert!(conditions::is_true(
            &contract.conditions,
            types::GUEST_READY
        ));
        assert!(conditions::is_true(&contract.conditions, types::READY));

        let failure = Failure {
            reason: "Broken",
            message: "broke".into(),
        };
        fill(&mut contract, Err(failure), true, Some(3), at(2));
        assert!(!contract.ready);
        assert_eq!(contract.standby, Some(Standby::Saved));
        assert_eq!(contract.observed_generation, Some(3));
        let ready = conditions::find(&contract.conditions, types::READY).expect("Ready");
        assert_eq!(
            (ready.reason.as_str(), ready.message.as_str()),
            ("Broken", "broke")
        );
    }
}

//! Records every watch event of VirtualMachines and claims, to check invariants over the whole
//! history rather than a final snapshot.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use banlieue_api::names;
use banlieue_api::{VirtualMachine, VirtualMachineClaim};
use futures::StreamExt;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};

/// Everything seen: claims each member carried, members each claim named.
#[derive(Debug, Default)]
pub struct Seen {
    pub claims_of_member: BTreeMap<String, BTreeSet<String>>,
    pub members_of_claim: BTreeMap<String, BTreeSet<String>>,
    /// Every VirtualMachine ever seen, by name.
    pub vms: BTreeSet<String>,
    pub events: usize,
}

pub struct History {
    pub seen: Arc<Mutex<Seen>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for History {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl History {
    pub fn record(admin: Client, namespace: &str) -> Self {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let vms: Api<VirtualMachine> = Api::namespaced(admin.clone(), namespace);
        let claims: Api<VirtualMachineClaim> = Api::namespaced(admin, namespace);
        let s1 = seen.clone();
        let vm_task = tokio::spawn(async move {
            let mut stream = watcher(vms, watcher::Config::default()).boxed();
            while let Some(event) = stream.next().await {
                let Ok(watcher::Event::Apply(vm) | watcher::Event::InitApply(vm)) = event else {
                    continue;
                };
                let mut seen = s1.lock().unwrap_or_else(|e| e.into_inner());
                seen.events += 1;
                seen.vms.insert(vm.name_any());
                if let Some(claim) = vm.labels().get(names::LABEL_CLAIM) {
                    seen.claims_of_member
                        .entry(vm.name_any())
                        .or_default()
                        .insert(claim.clone());
                }
            }
        });
        let s2 = seen.clone();
        let claim_task = tokio::spawn(async move {
            let mut stream = watcher(claims, watcher::Config::default()).boxed();
            while let Some(event) = stream.next().await {
                let Ok(watcher::Event::Apply(claim) | watcher::Event::InitApply(claim)) = event
                else {
                    continue;
                };
                let mut seen = s2.lock().unwrap_or_else(|e| e.into_inner());
                seen.events += 1;
                if let Some(member) = claim
                    .status
                    .as_ref()
                    .and_then(|s| s.virtual_machine_ref.as_ref())
                {
                    seen.members_of_claim
                        .entry(claim.name_any())
                        .or_default()
                        .insert(member.name.clone());
                }
            }
        });
        Self {
            seen,
            tasks: vec![vm_task, claim_task],
        }
    }

    /// Panics naming the member or claim when a member ever carried two claims or a claim ever
    /// named two members.
    pub fn assert_bound_at_most_once(&self) {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        for (member, claims) in &seen.claims_of_member {
            assert!(
                claims.len() <= 1,
                "member {member} carried claims {claims:?}"
            );
        }
        for (claim, members) in &seen.members_of_claim {
            assert!(
                members.len() <= 1,
                "claim {claim} named members {members:?}"
            );
        }
    }
}

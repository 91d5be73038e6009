//! What each failure domain already holds: the members of each pool (what scheduling spreads a
//! new member by, topology-spread style: the domain with the fewest members of the same pool)
//! and the memory promised to every VirtualMachine placed there (what a domain's capacity
//! limits).
//!
//! The VirtualMachine cache says where a member is once its status is written, which is a
//! moment after the machine was created; a burst of members scheduled in that moment would all
//! see the same counts and land in one domain. So this process also remembers the placements
//! it made until the cache shows them, and counting, choosing and remembering happen under one
//! lock.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use banlieue_api::VirtualMachine;
use banlieue_api::names::{LABEL_CLAIM, LABEL_POOL};

/// A failure domain: (provider, failure domain name).
pub type Domain = (String, String);

/// How long a placement is remembered when the cache never shows it (its VirtualMachine was
/// deleted, or its status write failed and a retry will place it again).
const REMEMBER: Duration = Duration::from_secs(300);

#[derive(Debug)]
struct Recent {
    domain: Domain,
    at: Instant,
}

/// What the VirtualMachines placed so far hold, by failure domain.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Occupancy {
    /// Members of the pool being scheduled for (empty outside a pool).
    pub members: BTreeMap<Domain, usize>,
    /// Memory, in bytes, of every VirtualMachine of the namespace placed there, but for
    /// saved ones, which hold none (ADR-0073).
    pub memory: BTreeMap<Domain, u64>,
    /// The memory of the largest saved VirtualMachine placed there: what one resume needs,
    /// which the scheduler keeps free unless the Provider sets `resumeReserve`.
    pub largest_saved: BTreeMap<Domain, u64>,
    /// Save storage, in bytes, promised to the VirtualMachines placed there that are or will
    /// be saved (see [`holds_save_storage`]): each its class's memory, what its save writes.
    pub save_storage: BTreeMap<Domain, u64>,
}

/// Whether `vm` holds save storage where it is placed: a member of a `standby: Saved` pool
/// that no claim holds is saved once ready, or already is. A claimed one was restored, and a
/// restore deletes its saved state.
pub fn holds_save_storage(vm: &VirtualMachine) -> bool {
    vm.spec.standby == Some(banlieue_api::Standby::Saved)
        && !vm
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(LABEL_CLAIM))
}

/// Placements made by this process, by (namespace, VirtualMachine name).
#[derive(Debug, Default)]
pub struct RecentPlacements {
    recent: Mutex<HashMap<(String, String), Recent>>,
}

impl RecentPlacements {
    /// Counts what each domain holds in `namespace` (from `vms`, the cached VirtualMachines,
    /// and the placements this process made that the cache does not show yet; `memory_of`
    /// says what a VirtualMachine holds), lets `choose` pick a domain for `vm`, and remembers
    /// the choice. One lock around the three, so concurrent reconciles see each other's
    /// choices.
    #[allow(clippy::too_many_arguments)]
    pub fn place<T, E>(
        &self,
        namespace: &str,
        vm: &str,
        pool: Option<&str>,
        vms: &[std::sync::Arc<VirtualMachine>],
        memory_of: impl Fn(&VirtualMachine) -> u64,
        now: Instant,
        choose: impl FnOnce(&Occupancy) -> Result<(T, Domain), E>,
    ) -> Result<T, E> {
        let mut recent = self
            .recent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        recent.retain(|_, r| now.duration_since(r.at) < REMEMBER);
        let occupancy = occupancy(namespace, vm, pool, vms, &memory_of, &mut recent);
        let (chosen, domain) = choose(&occupancy)?;
        recent.insert(
            (namespace.to_owned(), vm.to_owned()),
            Recent { domain, at: now },
        );
        Ok(chosen)
    }
}

/// What each domain holds, `vm` itself left out. A VirtualMachine whose status names its
/// domain counts there (and its remembered placement is forgotten: the cache has caught up);
/// one without counts where this process placed it.
fn occupancy(
    namespace: &str,
    vm: &str,
    pool: Option<&str>,
    vms: &[std::sync::Arc<VirtualMachine>],
    memory_of: &impl Fn(&VirtualMachine) -> u64,
    recent: &mut HashMap<(String, String), Recent>,
) -> Occupancy {
    let mut occupancy = Occupancy::default();
    for member in vms {
        let name = member.metadata.name.as_deref().unwrap_or_default();
        if name == vm || member.metadata.namespace.as_deref() != Some(namespace) {
            continue;
        }
        let key = (namespace.to_owned(), name.to_owned());
        let status = member.status.as_ref();
        let from_status = status.and_then(|s| {
            Some((
                s.provider_ref.as_ref()?.name.clone(),
                s.failure_domain.clone()?,
            ))
        });
        let domain = match from_status {
            Some(domain) => {
                recent.remove(&key);
                domain
            }
            None => match recent.get(&key) {
                Some(r) => r.domain.clone(),
                None => continue,
            },
        };
        let in_pool = pool.is_some_and(|pool| {
            member
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_POOL))
                .is_some_and(|p| p == pool)
        });
        if in_pool {
            *occupancy.members.entry(domain.clone()).or_insert(0) += 1;
        }
        let memory = memory_of(member);
        let saved = status.and_then(|s| s.standby) == Some(banlieue_api::Standby::Saved);
        if saved {
            let largest = occupancy.largest_saved.entry(domain.clone()).or_insert(0);
            *largest = (*largest).max(memory);
        } else {
            *occupancy.memory.entry(domain.clone()).or_insert(0) += memory;
        }
        if holds_save_storage(member) {
            *occupancy.save_storage.entry(domain).or_insert(0) += memory;
        }
    }
    occupancy
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn member(name: &str, pool: &str, placed: Option<(&str, &str)>) -> Arc<VirtualMachine> {
        let mut vm: VirtualMachine = serde_json::from_value(serde_json::json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
            "metadata": {"name": name, "namespace": "ns", "labels": {LABEL_POOL: pool}},
            "spec": {"classRef": {"name": "c"}, "imageRef": {"name": "i"},
                     "storageClassName": "s", "networkClassName": "n"}
        }))
        .expect("vm");
        if let Some((provider, domain)) = placed {
            vm.status = Some(
                serde_json::from_value(serde_json::json!({
                    "providerRef": {"name": provider}, "failureDomain": domain
                }))
                .expect("status"),
            );
        }
        Arc::new(vm)
    }

    const GIB: u64 = 1 << 30;

    fn domain(p: &str) -> Domain {
        (p.to_owned(), p.to_owned())
    }

    /// Places `vm`, choosing the least-loaded of `domains` (first on ties), and returns it.
    fn place(
        placements: &RecentPlacements,
        vm: &str,
        vms: &[Arc<VirtualMachine>],
        domains: &[&str],
    ) -> String {
        placements
            .place(
                "ns",
                vm,
                Some("p"),
                vms,
                |_| GIB,
                Instant::now(),
                |o| {
                    let best = domains
                        .iter()
                        .min_by_key(|d| o.members.get(&domain(d)).copied().unwrap_or(0))
                        .expect("a domain");
                    Ok::<_, ()>((best.to_string(), domain(best)))
                },
            )
            .expect("placed")
    }

    /// What a new member `new` of pool `p` would see, each VirtualMachine holding `memory_of`.
    fn seen_by_new(
        vms: &[Arc<VirtualMachine>],
        memory_of: impl Fn(&VirtualMachine) -> u64,
    ) -> Occupancy {
        let mut seen = Occupancy::default();
        RecentPlacements::default()
            .place(
                "ns",
                "new",
                Some("p"),
                vms,
                memory_of,
                Instant::now(),
                |o| {
                    seen = o.clone();
                    Err::<((), Domain), ()>(())
                },
            )
            .expect_err("nothing chosen");
        seen
    }

    #[test]
    fn a_burst_spreads_before_the_cache_shows_it() {
        let placements = RecentPlacements::default();
        let vms: Vec<_> = (0..6)
            .map(|i| member(&format!("m{i}"), "p", None))
            .collect();
        let chosen: Vec<String> = (0..6)
            .map(|i| place(&placements, &format!("m{i}"), &vms, &["a", "b", "c"]))
            .collect();
        assert_eq!(chosen, ["a", "b", "c", "a", "b", "c"]);
    }

    #[test]
    fn statuses_count_and_other_pools_do_not() {
        let placements = RecentPlacements::default();
        let vms = vec![
            member("m0", "p", Some(("a", "a"))),
            member("m1", "p", Some(("a", "a"))),
            member("m2", "p", Some(("b", "b"))),
            member("x0", "other", Some(("c", "c"))),
            member("x1", "other", Some(("c", "c"))),
            member("new", "p", None),
        ];
        assert_eq!(place(&placements, "new", &vms, &["a", "b", "c"]), "c");
        // Memory counts every placed VirtualMachine, whatever its pool.
        let memory = seen_by_new(&vms, |_| GIB).memory;
        assert_eq!(memory.get(&domain("a")), Some(&(2 * GIB)));
        assert_eq!(
            memory.get(&domain("c")),
            Some(&(2 * GIB)),
            "the other pool's two"
        );
        // A member scheduled again (its status lost) does not count against itself.
        assert_eq!(place(&placements, "m2", &vms, &["a", "b"]), "b");
    }

    #[test]
    fn a_saved_member_holds_no_memory_and_the_largest_is_kept_for_its_resume() {
        let saved = |name: &str| {
            let mut vm = member(name, "p", Some(("a", "a"))).as_ref().clone();
            if let Some(status) = vm.status.as_mut() {
                status.standby = Some(banlieue_api::Standby::Saved);
            }
            Arc::new(vm)
        };
        let vms = vec![
            member("m0", "p", Some(("a", "a"))),
            saved("s0"),
            saved("s1"),
            saved("s2"),
        ];
        // s1 is a bigger class.
        let seen = seen_by_new(&vms, |vm| {
            if vm.metadata.name.as_deref() == Some("s1") {
                4 * GIB
            } else {
                GIB
            }
        });
        assert_eq!(seen.memory.get(&domain("a")), Some(&GIB), "the running one");
        assert_eq!(seen.largest_saved.get(&domain("a")), Some(&(4 * GIB)));
        assert_eq!(
            seen.members.get(&domain("a")),
            Some(&4),
            "saved members are members"
        );
    }

    #[test]
    fn unclaimed_members_of_a_saved_pool_hold_save_storage_from_their_placement() {
        let of_saved_pool = |name: &str, claimed: bool, reported_saved: bool| {
            let mut vm = member(name, "p", Some(("a", "a"))).as_ref().clone();
            vm.spec.standby = Some(banlieue_api::Standby::Saved);
            if claimed {
                vm.metadata
                    .labels
                    .get_or_insert_default()
                    .insert(LABEL_CLAIM.to_owned(), "c".to_owned());
            }
            if let (true, Some(status)) = (reported_saved, vm.status.as_mut()) {
                status.standby = Some(banlieue_api::Standby::Saved);
            }
            Arc::new(vm)
        };
        let vms = vec![
            // Booting, not saved yet: its save is coming.
            of_saved_pool("booting", false, false),
            of_saved_pool("saved", false, true),
            // Resumed for a claim: its saved state is gone.
            of_saved_pool("claimed", true, false),
            // A running pool's member holds none.
            member("running", "q", Some(("a", "a"))),
        ];
        let seen = seen_by_new(&vms, |_| 2 * GIB);
        assert_eq!(seen.save_storage.get(&domain("a")), Some(&(4 * GIB)));
        assert_eq!(
            seen.memory.get(&domain("a")),
            Some(&(6 * GIB)),
            "booting, claimed and running hold memory; the saved one does not"
        );
    }

    #[test]
    fn remembered_placements_expire_and_give_way_to_the_status() {
        let placements = RecentPlacements::default();
        let vms = vec![member("m0", "p", None), member("m1", "p", None)];
        let start = Instant::now();
        placements
            .place(
                "ns",
                "m0",
                Some("p"),
                &vms,
                |_| GIB,
                start,
                |_| Ok::<_, ()>(((), domain("a"))),
            )
            .expect("placed");
        let seen = |at| {
            let mut counts = BTreeMap::new();
            placements
                .place(
                    "ns",
                    "m1",
                    Some("p"),
                    &vms,
                    |_| GIB,
                    at,
                    |o| {
                        counts = o.members.clone();
                        Err::<((), Domain), ()>(())
                    },
                )
                .expect_err("nothing chosen");
            counts
        };
        assert_eq!(seen(start).get(&domain("a")), Some(&1));
        assert_eq!(seen(start + REMEMBER).get(&domain("a")), None, "forgotten");
        // A failed choice is not remembered.
        assert!(seen(start).is_empty());
    }
}

//! Deletion under `banlieue.io/domain-protection`: destroy → undefine NVRAM|TPM|MANAGED_SAVE →
//! delete the machine's own volumes → look the domain up again. Each step accepts that its
//! object is already gone; a failing step is reported in Ready (TeardownFailed) and retried.

use banlieue_api::conditions::reasons;
use banlieue_api::names::FINALIZER_DOMAIN_PROTECTION;
use banlieue_api::{LibvirtMachine, LibvirtMachineStatus};
use banlieue_libvirt::flags::DomainUndefineFlags;
use banlieue_libvirt::{Domain, StoragePool, StorageVol};
use banlieue_provider_kit::error::Core;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::Context;
use super::domain::{self, Existing, MachineNames};
use super::status;
use super::targets;
use crate::error::{Error, Result};
use banlieue_api::conditions::error_message;

/// libvirt fails an undefine of a UEFI domain without NVRAM, and without TPM the swtpm state
/// (the per-VM secret the vTPM exists to isolate) stays behind.
pub const UNDEFINE_FLAGS: DomainUndefineFlags = DomainUndefineFlags::NVRAM
    .union(DomainUndefineFlags::TPM)
    .union(DomainUndefineFlags::MANAGED_SAVE);

/// The status of a machine whose teardown failed: Ready=False, TeardownFailed, the error's
/// chain as its message.
pub(super) fn failed_status(
    machine: &LibvirtMachine,
    error: &Error,
    now: Time,
) -> LibvirtMachineStatus {
    let failed = Error::Core(Core::Invalid {
        reason: reasons::TEARDOWN_FAILED,
        message: error_message(error),
    });
    let mut status = machine.status.clone().unwrap_or_default();
    status.contract.ready = false;
    banlieue_api::conditions::set(
        &mut status.contract.conditions,
        status::condition_for(&failed, machine.metadata.generation),
        now,
    );
    status
}

pub(super) async fn run(machine: &LibvirtMachine, ctx: &Context) -> Result<()> {
    let names = MachineNames::of(machine);
    let recorded = machine.status.as_ref().and_then(|s| s.domain_uuid.clone());
    let Some(uuid) = recorded else {
        // No UUID was ever recorded, so nothing was ever made on the host.
        return Ok(());
    };
    let session = ctx.host.connection().await?;
    let client = &session.client;

    let found = Domain::lookup_by_name(client, &names.domain)
        .await
        .map_err(Error::libvirt(format!("look up domain {}", names.domain)))?;
    let existing = domain::classify(
        found.as_ref().map(|d| d.uuid_string()).as_deref(),
        Some(&uuid),
    );
    match &existing {
        // Another domain holds the name: it is not ours and is left alone. The volumes this
        // machine recorded are still its own (made before the other domain took the name).
        Existing::Foreign { .. } | Existing::Absent => {}
        Existing::Ours => {
            if let Some(domain) = &found {
                domain
                    .destroy_if_running()
                    .await
                    .map_err(Error::libvirt(format!("destroy domain {}", names.domain)))?;
                match domain.undefine_flags(UNDEFINE_FLAGS).await {
                    Ok(()) => {
                        ctx.metrics.domains_undefined.inc();
                    }
                    Err(e) if e.is_not_found() => {}
                    Err(e) => {
                        return Err(Error::Libvirt {
                            what: format!("undefine domain {}", names.domain),
                            source: e,
                        });
                    }
                }
            }
        }
    }

    // The domain that referenced it is gone (a filter in use cannot be undefined); a
    // namesake's domain may use one of the same name, which is then left alone.
    if matches!(existing, Existing::Ours | Existing::Absent) {
        super::egress::remove(client, &names.domain).await?;
    }

    // Only the machine's own volumes, proven so; the image (backing file or install media)
    // belongs to the VMImage and other machines use it, and a volume of the same name made by
    // a namesake machine is that machine's.
    let owned = targets::owned_volumes(machine, &names, existing == Existing::Ours);
    if !owned.is_empty() {
        let pool = StoragePool::lookup_by_name(client, &machine.spec.pool)
            .await
            .map_err(Error::libvirt(format!(
                "look up storage pool {}",
                machine.spec.pool
            )))?
            // A missing pool is not a deleted volume: the pool may be back after a host
            // repair, and dropping the finalizer now would orphan the volumes for good.
            .ok_or_else(|| {
                Error::Core(Core::Invalid {
                    reason: reasons::TEARDOWN_FAILED,
                    message: format!(
                        "storage pool {} does not exist, so volumes {} of this machine cannot be \
                     deleted; the finalizer {FINALIZER_DOMAIN_PROTECTION} stays until the pool \
                     is back (or is removed by hand once the volumes are known to be gone)",
                        machine.spec.pool,
                        owned.join(", ")
                    ),
                })
            })?;
        for name in &owned {
            let vol = StorageVol::lookup_by_name(&pool, name)
                .await
                .map_err(Error::libvirt(format!("look up volume {name}")))?;
            if let Some(vol) = vol {
                match vol.delete().await {
                    Ok(()) => {}
                    Err(e) if e.is_not_found() => {}
                    Err(e) => {
                        return Err(Error::Libvirt {
                            what: format!("delete volume {name}"),
                            source: e,
                        });
                    }
                }
            }
        }
    }

    // Trust the host, not the undefine's reply: a domain left defined would be inherited by
    // the next machine of this name.
    let again = Domain::lookup_by_name(client, &names.domain)
        .await
        .map_err(Error::libvirt(format!("look up domain {}", names.domain)))?;
    if let Some(d) = again
        && domain::classify(Some(&d.uuid_string()), Some(&uuid)) == Existing::Ours
    {
        return Err(Error::Core(Core::Invalid {
            reason: reasons::TEARDOWN_FAILED,
            message: format!("domain {} is still defined after undefine", names.domain),
        }));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn undefine_removes_nvram_tpm_and_managed_save() {
        // virDomainUndefineFlagsValues: MANAGED_SAVE 1<<0, NVRAM 1<<2, TPM 1<<5.
        assert_eq!(super::UNDEFINE_FLAGS.bits(), 1 | 4 | 32);
    }
}

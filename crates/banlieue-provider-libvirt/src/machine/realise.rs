//! Acting on the host for a machine that is not being deleted: volumes, seed, define, start,
//! and what the host then shows. Each step first looks at what exists, so a reconcile
//! interrupted anywhere resumes where it stopped.

use banlieue_api::{LibvirtMachine, LibvirtMachineSpec, Provider};
use banlieue_libvirt::flags::{DomainSaveRestoreFlags, DomainSetTimeFlags, StorageVolCreateFlags};
use banlieue_libvirt::stream::TransferOptions;
use banlieue_libvirt::{
    Client, Domain, DomainState, InterfaceAddressesSource, Network, StoragePool, StorageVol,
};
use banlieue_provider_kit::access::{self, AccessSight};
use banlieue_provider_kit::error::Core;
use banlieue_provider_kit::handover::{self, HandoverSight};
use kube::{Api, ResourceExt};
use serde_json::json;

use super::Context;
use super::agent;
use super::domain::{self, Existing, MachineNames};
use super::egress;
use super::guest::{GuestSight, Phase};
use super::standby::{self, StandbyAct, StandbySight};
use super::status::{self, Observed};
use super::targets;
use crate::error::{Error, Result};
use crate::image::{decide, marker};
use crate::volume_xml::{self, Backing, BackingFormat};

/// Brings the machine's domain into existence and running, or saved when its spec says so
/// (ADR-0073); returns what the host shows.
pub(super) async fn run(machine: &LibvirtMachine, uuid: &str, ctx: &Context) -> Result<Observed> {
    let session = ctx.host.connection().await?;
    let client = &session.client;
    let names = MachineNames::of(machine);

    let found = Domain::lookup_by_name(client, &names.domain)
        .await
        .map_err(Error::libvirt(format!("look up domain {}", names.domain)))?;
    let domain = match domain::classify(
        found.as_ref().map(|d| d.uuid_string()).as_deref(),
        Some(uuid),
    ) {
        Existing::Foreign { uuid } => return Err(domain::name_taken(&names.domain, &uuid)),
        Existing::Ours => found.ok_or_else(|| {
            Error::Core(Core::Invalid {
                reason: banlieue_api::conditions::reasons::LIBVIRT_ERROR,
                message: "the domain vanished between two calls".into(),
            })
        })?,
        Existing::Absent => {
            provision(machine, uuid, &names, client, ctx, session.domain_type).await?
        }
    };

    let (state, _) = domain.get_state().await.map_err(Error::libvirt(format!(
        "read the state of domain {}",
        names.domain
    )))?;
    let shut_off = state == DomainState::Shutoff || state == DomainState::Crashed;
    // Asked only of a stopped domain: a running one has no image to restore from.
    let save_image = shut_off
        && domain
            .has_managed_save_image()
            .await
            .map_err(Error::libvirt(format!(
                "ask whether domain {} has a managed save image",
                names.domain
            )))?;
    let running = state == DomainState::Running;
    let sight = match standby::standby_act(machine, running, shut_off, save_image) {
        StandbyAct::Save => {
            save(&domain, &names.domain).await?;
            return Ok(saved());
        }
        StandbyAct::KeepSaved => return Ok(saved()),
        StandbyAct::StillFailed { message } => {
            return Err(Error::Core(Core::Invalid {
                reason: banlieue_api::conditions::reasons::RESTORE_FAILED,
                message,
            }));
        }
        StandbyAct::Restore => {
            let started = std::time::Instant::now();
            restore(&domain, &names.domain).await?;
            ctx.metrics
                .restore_latency
                .observe(started.elapsed().as_secs_f64());
            // The clock is set below, once the domain is seen running.
            StandbySight::Restored {
                clock: Err("the domain is not running".to_owned()),
            }
        }
        StandbyAct::Start => {
            domain
                .create()
                .await
                .map_err(Error::libvirt(format!("start domain {}", names.domain)))?;
            standby::started(machine)
        }
        StandbyAct::Observe => StandbySight::Running,
    };
    let (state, _) = domain.get_state().await.map_err(Error::libvirt(format!(
        "read the state of domain {}",
        names.domain
    )))?;
    let running = state == DomainState::Running;
    if !running {
        return Ok(Observed {
            running,
            addresses: Vec::new(),
            addresses_from_guest: false,
            guest: GuestSight::NotRunning,
            standby: sight,
            host_keys: None,
            attestation_key: None,
            access: access_waiting(machine, &GuestSight::NotRunning),
            handover: None,
        });
    }
    let calls = &ctx.metrics.agent_commands;
    let until = tokio::time::Instant::now() + agent::CONVERSATION_DEADLINE;
    // The guest slept for as long as it was saved: its clock is the first thing it is told.
    let sight = match sight {
        StandbySight::Restored { .. } => {
            let started = std::time::Instant::now();
            let clock = set_clock(&domain, standby::agent_expected(machine), calls, until).await;
            ctx.metrics
                .clock_set_latency
                .observe(started.elapsed().as_secs_f64());
            StandbySight::Restored { clock }
        }
        other => other,
    };
    let talk = talk_to_guest(machine, &domain, calls, until).await;
    let agent_answers = !matches!(talk.guest, GuestSight::AgentUnavailable(_));
    if agent_answers {
        calls.inc();
    }
    let agent_until = agent_answers.then_some(until);
    let (addresses, addresses_from_guest) = observe_addresses(&domain, agent_until).await;
    Ok(Observed {
        running,
        addresses,
        addresses_from_guest,
        guest: talk.guest,
        standby: sight,
        host_keys: talk.host_keys,
        attestation_key: talk.attestation_key,
        access: talk.access,
        handover: talk.handover,
    })
}

/// What one conversation with a running guest's agent brought back.
struct Talk {
    guest: GuestSight,
    host_keys: Option<Vec<String>>,
    attestation_key: Option<String>,
    access: Option<AccessSight>,
    handover: Option<HandoverSight>,
}

/// One conversation with a running guest's agent, by `until`: what it says of itself (and,
/// when due, its EK certificates, SSH host keys and attestation key), the claim's keys handed
/// to it once it is ready, and the subject's handover challenge relayed to it.
async fn talk_to_guest(
    machine: &LibvirtMachine,
    domain: &banlieue_libvirt::Domain,
    calls: &prometheus_client::metrics::counter::Counter,
    until: tokio::time::Instant,
) -> Talk {
    let recorded = machine
        .status
        .as_ref()
        .is_some_and(|s| !s.contract.tpm_endorsement_certificates.is_empty());
    let guest = agent::look(domain, machine.spec.tpm_enabled && !recorded, calls, until).await;
    let first_ready = is_first_ready(machine, &guest);
    let host_keys = if first_ready {
        read_host_keys(machine, domain, calls, until).await
    } else {
        None
    };
    let attestation_key = if first_ready && machine.spec.tpm_enabled {
        read_attestation_key(machine, domain, calls, until).await
    } else {
        None
    };
    let access = match (access_waiting(machine, &guest), &machine.spec.access) {
        (Some(_), Some(wanted)) if is_ready(&guest) => {
            Some(agent::deliver_access(domain, wanted, calls, until).await)
        }
        (waiting, _) => waiting,
    };
    let recorded_attestation = machine
        .status
        .as_ref()
        .and_then(|s| s.contract.attestation.as_ref());
    let handover = match handover::to_relay(machine.spec.handover.as_ref(), recorded_attestation) {
        None => None,
        Some(challenge) => Some(match handover::unrelayable(challenge) {
            Some(answer) => HandoverSight::Answered(answer),
            None if is_ready(&guest) => {
                agent::relay_handover(domain, challenge, calls, until).await
            }
            None => HandoverSight::Pending(format!(
                "waiting for the guest to be ready to take the challenge ({})",
                guest_state(&guest)
            )),
        }),
    };
    Talk {
        guest,
        host_keys,
        attestation_key,
        access,
        handover,
    }
}

/// Whether this reconcile is the first to see the guest `ready`: what the layer published
/// before it (SSH host keys, the attestation key) is read then, and kept for the boot (a
/// saved guest resumes with them).
fn is_first_ready(machine: &LibvirtMachine, guest: &GuestSight) -> bool {
    let was_ready = machine.status.as_ref().is_some_and(|s| {
        banlieue_api::conditions::is_true(
            &s.contract.conditions,
            banlieue_api::conditions::types::GUEST_READY,
        )
    });
    !was_ready && is_ready(guest)
}

fn is_ready(guest: &GuestSight) -> bool {
    matches!(
        guest,
        GuestSight::Phase {
            phase: Phase::Ready,
            ..
        }
    )
}

/// The guest's SSH host keys, read in the reconcile that first sees its guest `ready`: `None`
/// when they could not be read (logged; the next first sight tries again).
async fn read_host_keys(
    machine: &LibvirtMachine,
    domain: &banlieue_libvirt::Domain,
    calls: &prometheus_client::metrics::counter::Counter,
    until: tokio::time::Instant,
) -> Option<Vec<String>> {
    match agent::read_host_keys(domain, calls, until).await {
        Ok(keys) => Some(keys),
        Err(why) => {
            tracing::warn!(machine = %machine.name_any(), error = %why, "the guest's SSH host keys");
            None
        }
    }
}

/// The guest's attestation key, read with its host keys: `None` when the guest published
/// none (an image without the layer's attestation step) or it could not be read (logged).
async fn read_attestation_key(
    machine: &LibvirtMachine,
    domain: &banlieue_libvirt::Domain,
    calls: &prometheus_client::metrics::counter::Counter,
    until: tokio::time::Instant,
) -> Option<String> {
    match agent::read_attestation_key(domain, calls, until).await {
        Ok(key) => key,
        Err(why) => {
            tracing::warn!(machine = %machine.name_any(), error = %why, "the guest's attestation key");
            None
        }
    }
}

/// What becomes of the claim's keys while `guest` is not ready to take them: `None` for a
/// machine given none, or whose guest already installed or refused them; otherwise why
/// they wait (a ready guest is handed them by [`agent::deliver_access`]).
fn access_waiting(machine: &LibvirtMachine, guest: &GuestSight) -> Option<AccessSight> {
    machine.spec.access.as_ref()?;
    let recorded = machine
        .status
        .as_ref()
        .map(|s| s.contract.conditions.as_slice())
        .unwrap_or_default();
    if access::settled(recorded) {
        return None;
    }
    Some(AccessSight::Pending(match guest {
        GuestSight::Phase {
            phase: Phase::Ready,
            ..
        } => "the keys are being handed to the guest".to_owned(),
        other => guest_state(other),
    }))
}

/// Why a guest that is not ready cannot take what a claim sends it.
fn guest_state(guest: &GuestSight) -> String {
    match guest {
        GuestSight::NotRunning => "waiting for the domain to run".to_owned(),
        GuestSight::AgentUnavailable(why) => format!("the guest agent does not answer: {why}"),
        GuestSight::NoPhaseFile => "the guest publishes no phase: its image lacks the \
                                    guest-phase layer, which takes what a claim sends"
            .to_owned(),
        GuestSight::Phase { phase, .. } => match phase {
            Phase::Ready => "the guest is ready".to_owned(),
            Phase::Failed(why) => format!("the guest failed its boot ({why})"),
            Phase::Pending(phase) => format!("waiting for the guest to be ready (it is {phase})"),
        },
    }
}

/// What a saved domain shows: nothing is asked of its guest.
fn saved() -> Observed {
    Observed {
        running: false,
        addresses: Vec::new(),
        addresses_from_guest: false,
        guest: GuestSight::NotRunning,
        standby: StandbySight::Saved,
        host_keys: None,
        attestation_key: None,
        access: None,
        handover: None,
    }
}

/// Saves the running domain with libvirt's managed save: its memory goes to the image libvirt
/// keeps for it, and it stops.
async fn save(domain: &Domain, name: &str) -> Result<()> {
    let started = std::time::Instant::now();
    domain
        .managed_save(DomainSaveRestoreFlags::empty())
        .await
        .map_err(Error::libvirt(format!("save domain {name} (managed save)")))?;
    tracing::info!(
        domain = name,
        seconds = started.elapsed().as_secs_f64(),
        "domain saved"
    );
    Ok(())
}

/// Starts the saved domain, which restores it from its managed save image. An image that
/// cannot be restored (a QEMU upgrade, corruption, no memory) is removed: it is tried once,
/// and the machine is reported `RestoreFailed` for the controller to replace.
async fn restore(domain: &Domain, name: &str) -> Result<()> {
    let started = std::time::Instant::now();
    let Err(e) = domain.create().await else {
        tracing::info!(
            domain = name,
            seconds = started.elapsed().as_secs_f64(),
            "domain restored from its managed save image"
        );
        return Ok(());
    };
    let said = banlieue_api::conditions::error_message(&e);
    let removed = domain.managed_save_remove().await.map_err(|e| {
        let why = banlieue_api::conditions::error_message(&e);
        tracing::warn!(domain = name, error = %why, "could not remove a save image that failed to restore");
        why
    });
    Err(standby::restore_failed(name, &said, removed))
}

/// How often setting the clock is tried again while an agent that answered before the save
/// has not reconnected since the restore. libvirt answers at once while the agent is not
/// connected, so a short step costs a few cheap calls and answers the claim as soon as the
/// agent is back (the clock is the last step before `Resumed`).
const SET_TIME_RETRY: std::time::Duration = std::time::Duration::from_millis(50);

/// Sets the restored guest's clock to the host's time through its agent, by `until`. A guest
/// whose agent answered before the save is given until then to answer again (its channel
/// reconnects after the restore); one that never had an agent is asked once. `Err` says why
/// the clock was not set.
async fn set_clock(
    domain: &Domain,
    agent_expected: bool,
    calls: &prometheus_client::metrics::counter::Counter,
    until: tokio::time::Instant,
) -> std::result::Result<(), String> {
    let attempts = async {
        loop {
            calls.inc();
            // Taken right before each call: the time the guest is told is the host's now.
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            let Err(e) = domain
                .set_time(
                    i64::try_from(now.as_secs()).unwrap_or(i64::MAX),
                    now.subsec_nanos(),
                    DomainSetTimeFlags::empty(),
                )
                .await
            else {
                return Ok(());
            };
            let unresponsive =
                e.remote().map(|r| r.code) == Some(banlieue_libvirt::ErrorCode::AgentUnresponsive);
            if !(agent_expected && unresponsive) {
                return Err(banlieue_api::conditions::error_message(&e));
            }
            tokio::time::sleep(SET_TIME_RETRY).await;
        }
    };
    tokio::time::timeout_at(until, attempts)
        .await
        .unwrap_or_else(|_| Err(agent::deadline_message()))
}

/// The network's DHCP leases, which the host hands out, else what the guest agent reports
/// (`guest-network-get-interfaces`, asked only with `agent_until`, the end of the agent
/// conversation), which the guest chooses: true when the addresses are the guest's word.
/// Neither is an error when absent: an isolated network has no leases and a guest may run no
/// agent.
async fn observe_addresses(
    domain: &Domain,
    agent_until: Option<tokio::time::Instant>,
) -> (Vec<banlieue_api::MachineAddress>, bool) {
    if let Ok(ifaces) = domain
        .interface_addresses(InterfaceAddressesSource::Lease)
        .await
    {
        let found = status::addresses(&ifaces);
        if !found.is_empty() {
            return (found, false);
        }
    }
    if let Some(until) = agent_until {
        let asked = domain.interface_addresses(InterfaceAddressesSource::Agent);
        if let Ok(Ok(ifaces)) = tokio::time::timeout_at(until, asked).await {
            let found = status::addresses(&ifaces);
            if !found.is_empty() {
                return (found, true);
            }
        }
    }
    (Vec::new(), false)
}

/// Refuses an image volume a machine may not boot from. Whoever writes a LibvirtMachine names
/// its volumes, so the VMImage's check is not enough: the volume must be one the Provider
/// declared for BackingFile sources, or one its import made (it has the import's completion
/// record), and never a machine's own disk or seed.
async fn check_image_volume(volume: &str, pool: &StoragePool, ctx: &Context) -> Result<()> {
    let refused = |message: String| {
        Error::Core(Core::Invalid {
            reason: crate::error::provider_reasons::IMAGE_VOLUME_REFUSED,
            message,
        })
    };
    let provider = read_provider(ctx).await?;
    let declared = &provider.spec.capabilities.backing_file_volumes;
    match decide::backing_file_refusal(volume, &ctx.cfg.provider, declared) {
        None => return Ok(()),
        Some(never @ decide::BackingFileRefusal::MachineVolume(_)) => {
            return Err(refused(never.message().to_owned()));
        }
        // An import's own volume is the machine writer's to name: its marker says so.
        Some(decide::BackingFileRefusal::Undeclared(_)) => {}
    }
    let marker = marker::marker_volume_name(volume);
    if lookup_volume(pool, &marker).await?.is_some() {
        return Ok(());
    }
    Err(refused(format!(
        "volume {volume} is neither declared for BackingFile sources on Provider {} \
         (spec.capabilities.backingFileVolumes) nor imported by it",
        ctx.cfg.provider
    )))
}

/// This provider's Provider, as it is now (what it declares may have changed since start).
async fn read_provider(ctx: &Context) -> Result<Provider> {
    let providers: Api<Provider> = Api::namespaced(ctx.kube.clone(), &ctx.cfg.namespace);
    providers
        .get(&ctx.cfg.provider)
        .await
        .map_err(Error::kube(format!("read Provider {}", ctx.cfg.provider)))
}

/// The crash point (`BANLIEUE_CRASH_AT`, [`banlieue_runtime::crash`]) right after a domain is
/// defined and before it is started: a provider that dies there leaves a defined, stopped
/// domain its next run must adopt and start, never define twice.
pub const CRASH_AFTER_DOMAIN_DEFINE: &str = "after-domain-define";

/// The crash point right after one of the machine's volumes is created: a provider that dies
/// there (or whose create reply is lost) leaves a volume its next run must take as its own.
pub const CRASH_AFTER_VOLUME_CREATE: &str = "after-volume-create";

/// Creates the volumes and the seed, then defines the domain with the recorded UUID.
async fn provision(
    machine: &LibvirtMachine,
    uuid: &str,
    names: &MachineNames,
    client: &Client,
    ctx: &Context,
    domain_type: crate::domain_xml::DomainType,
) -> Result<Domain> {
    let spec = &machine.spec;
    let mut definition = domain::definition(machine, uuid, domain_type)?;
    let capacity = domain::disk_bytes(machine)?;
    // Read (and judged) before anything is made: a refused Secret leaves nothing behind.
    let user_data = user_data(machine, ctx).await?;
    let pool = pool_with_network(client, spec).await?;
    // Existing on the host is not enough: a pool or network the Provider did not declare is
    // refused, still before anything is made.
    let provider = read_provider(ctx).await?;
    if let Some(refused) =
        targets::undeclared_target(spec, &ctx.cfg.provider, &provider.spec.capabilities)
    {
        return Err(refused);
    }
    let image = image_volume(spec, &pool, ctx).await?;
    let mut owned = OwnedVolumes::read(machine, ctx).await?;
    create_os_volume(spec, names, &pool, &image, capacity, &mut owned).await?;
    create_seed(spec, names, uuid, user_data.as_deref(), &pool, &mut owned).await?;
    // The filter exists before the domain that references it: the guest never runs without
    // it, and one that cannot be defined leaves no domain (EgressFilterFailed).
    definition.egress_filter = egress::apply(client, machine, &names.domain).await?;
    define_domain(client, names, uuid, &definition, ctx).await
}

/// The machine's storage pool, once both it and the machine's network are known to exist.
async fn pool_with_network(client: &Client, spec: &LibvirtMachineSpec) -> Result<StoragePool> {
    let pool = StoragePool::lookup_by_name(client, &spec.pool)
        .await
        .map_err(Error::libvirt(format!(
            "look up storage pool {}",
            spec.pool
        )))?
        .ok_or_else(|| targets::pool_missing(&spec.pool))?;
    if Network::lookup_by_name(client, &spec.network)
        .await
        .map_err(Error::libvirt(format!("look up network {}", spec.network)))?
        .is_none()
    {
        return Err(targets::network_missing(&spec.network));
    }
    Ok(pool)
}

/// The image volume: the overlay's backing file, or the install media, once the machine is
/// known to be allowed to boot from it.
async fn image_volume(
    spec: &LibvirtMachineSpec,
    pool: &StoragePool,
    ctx: &Context,
) -> Result<StorageVol> {
    let image_name = spec
        .disk
        .backing_volume
        .as_deref()
        .or(spec.disk.install_media.as_deref())
        .ok_or_else(|| {
            Error::Core(Core::Invalid {
                reason: banlieue_api::conditions::reasons::PROVISIONING,
                message: "exactly one of disk.backingVolume or disk.installMedia must be set"
                    .into(),
            })
        })?;
    check_image_volume(image_name, pool, ctx).await?;
    lookup_volume(pool, image_name)
        .await?
        .ok_or_else(|| targets::volume_missing(image_name, &spec.pool))
}

/// Creates the machine's OS disk of `capacity` bytes (an overlay on `image` when it has a
/// backing volume) unless it exists; an existing one must be this machine's.
async fn create_os_volume(
    spec: &LibvirtMachineSpec,
    names: &MachineNames,
    pool: &StoragePool,
    image: &StorageVol,
    capacity: u64,
    owned: &mut OwnedVolumes,
) -> Result<()> {
    if lookup_volume(pool, &names.os_volume).await?.is_some() {
        if !owned.contains(&names.os_volume) {
            return Err(targets::volume_not_owned(&names.os_volume, &spec.pool));
        }
        return Ok(());
    }
    let backing = match spec.disk.backing_volume.as_deref() {
        Some(name) => Some(Backing {
            path: image
                .get_path()
                .await
                .map_err(Error::libvirt(format!("read the path of volume {name}")))?,
            format: BackingFormat::from_volume_name(name),
        }),
        None => None,
    };
    let xml = volume_xml::qcow2(&names.os_volume, capacity, backing.as_ref());
    owned
        .create(&names.os_volume, &spec.pool, || {
            StorageVol::create_xml(pool, &xml, StorageVolCreateFlags::empty())
        })
        .await?;
    Ok(())
}

/// Writes the cloud-init seed volume afresh.
async fn create_seed(
    spec: &LibvirtMachineSpec,
    names: &MachineNames,
    uuid: &str,
    user_data: Option<&[u8]>,
    pool: &StoragePool,
    owned: &mut OwnedVolumes,
) -> Result<()> {
    // The seed is rebuilt whenever the domain is not defined yet: a previous attempt may have
    // died mid-upload, and the bytes are a pure function of the UUID and user-data. Only a
    // seed this machine made is deleted.
    if let Some(stale) = lookup_volume(pool, &names.cidata_volume).await? {
        if !owned.contains(&names.cidata_volume) {
            return Err(targets::volume_not_owned(&names.cidata_volume, &spec.pool));
        }
        stale.delete().await.map_err(Error::libvirt(format!(
            "delete stale volume {}",
            names.cidata_volume
        )))?;
    }
    let seed = domain::seed(&names.domain, uuid, user_data)
        .to_bytes()
        .map_err(Error::Seed)?;
    let xml = volume_xml::raw(&names.cidata_volume, seed.len() as u64);
    let cidata = owned
        .create(&names.cidata_volume, &spec.pool, || {
            StorageVol::create_xml(pool, &xml, StorageVolCreateFlags::empty())
        })
        .await?;
    let mut reader: &[u8] = &seed;
    cidata
        .upload(
            &mut reader,
            TransferOptions::new().length(seed.len() as u64),
        )
        .await
        .map_err(Error::libvirt(format!("upload {}", names.cidata_volume)))?;
    Ok(())
}

/// Defines the domain, unless someone else's domain took its name meanwhile.
async fn define_domain(
    client: &Client,
    names: &MachineNames,
    uuid: &str,
    definition: &crate::domain_xml::DomainDefinition,
    ctx: &Context,
) -> Result<Domain> {
    // Looked up once more right before the upsert: DOMAIN_DEFINE_XML would silently take over
    // a domain someone defined under this name while the volumes were being made.
    if let Some(d) = Domain::lookup_by_name(client, &names.domain)
        .await
        .map_err(Error::libvirt(format!("look up domain {}", names.domain)))?
        && domain::classify(Some(&d.uuid_string()), Some(uuid)) != Existing::Ours
    {
        return Err(domain::name_taken(&names.domain, &d.uuid_string()));
    }
    let xml = crate::domain_xml::render(definition);
    let domain = Domain::define_xml(client, &xml)
        .await
        .map_err(Error::libvirt(format!("define domain {}", names.domain)))?;
    ctx.metrics.domains_defined.inc();
    banlieue_runtime::crash::crash_at(CRASH_AFTER_DOMAIN_DEFINE);
    Ok(domain)
}

/// The volumes this machine made, as its status records them: the ones it may reuse and
/// delete.
struct OwnedVolumes {
    api: Api<LibvirtMachine>,
    machine: String,
    volumes: Vec<String>,
}

impl OwnedVolumes {
    async fn read(machine: &LibvirtMachine, ctx: &Context) -> Result<OwnedVolumes> {
        // What this machine made is what its status records; the cache may lag behind the
        // record of a volume made by the previous reconcile, so it is read fresh.
        let api: Api<LibvirtMachine> = Api::namespaced(ctx.kube.clone(), &ctx.cfg.namespace);
        let machine = machine.name_any();
        let volumes = recorded_volumes(&api, &machine).await?;
        Ok(OwnedVolumes {
            api,
            machine,
            volumes,
        })
    }

    fn contains(&self, volume: &str) -> bool {
        self.volumes.iter().any(|v| v == volume)
    }

    /// Creates `volume`, which the caller found absent, recording it in `status.volumes`
    /// first. A create whose reply is lost (the call timed out while libvirtd went on, or the
    /// provider died) may still leave the volume behind, and a volume recorded only after its
    /// create would then be no one's: refused as `VolumeNotOwned` for ever. Recorded before,
    /// it is this machine's to reuse or delete whatever became of the call. A volume that
    /// appeared between the look-up and the create is someone else's: its record is taken back.
    async fn create<F>(
        &mut self,
        volume: &str,
        pool: &str,
        create: impl FnOnce() -> F,
    ) -> Result<StorageVol>
    where
        F: Future<Output = std::result::Result<StorageVol, banlieue_libvirt::Error>>,
    {
        let recorded_now = !self.contains(volume);
        if recorded_now {
            self.volumes = update_recorded(&self.api, &self.machine, |volumes| {
                if !volumes.iter().any(|v| v == volume) {
                    volumes.push(volume.to_owned());
                }
            })
            .await?;
        }
        match create().await {
            Ok(vol) => {
                banlieue_runtime::crash::crash_at(CRASH_AFTER_VOLUME_CREATE);
                Ok(vol)
            }
            Err(e) if e.is_already_exists() && recorded_now => {
                self.volumes = update_recorded(&self.api, &self.machine, |volumes| {
                    volumes.retain(|v| v != volume);
                })
                .await?;
                Err(targets::volume_not_owned(volume, pool))
            }
            Err(e) => Err(Error::Libvirt {
                what: format!("create volume {volume}"),
                source: e,
            }),
        }
    }
}

/// `status.volumes` of the machine as the API server has it now.
async fn recorded_volumes(api: &Api<LibvirtMachine>, name: &str) -> Result<Vec<String>> {
    let fresh = api
        .get(name)
        .await
        .map_err(Error::kube(format!("read LibvirtMachine {name}")))?;
    Ok(fresh.status.map(|s| s.volumes).unwrap_or_default())
}

/// Changes `status.volumes` of the machine as the API server has it now, guarded by its
/// resourceVersion and retried on conflicts (the controller writes the same object); the
/// list written.
async fn update_recorded(
    api: &Api<LibvirtMachine>,
    name: &str,
    change: impl Fn(&mut Vec<String>),
) -> Result<Vec<String>> {
    let mut last = None;
    for _ in 0..RECORD_ATTEMPTS {
        let fresh = match api.get(name).await {
            Ok(m) => m,
            Err(e) => {
                last = Some(Error::kube(format!("read LibvirtMachine {name}"))(e));
                continue;
            }
        };
        let recorded = fresh
            .status
            .as_ref()
            .map(|s| s.volumes.clone())
            .unwrap_or_default();
        let mut volumes = recorded.clone();
        change(&mut volumes);
        if volumes == recorded {
            return Ok(volumes);
        }
        match super::patch_status(api, &fresh, json!({ "volumes": volumes })).await {
            Ok(true) => return Ok(volumes),
            Ok(false) => {}
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        Error::Core(Core::Invalid {
            reason: banlieue_api::conditions::reasons::PROVISIONING,
            message: format!("LibvirtMachine {name} kept changing while its volumes were recorded"),
        })
    }))
}

/// Conflicting writes tolerated while recording one volume.
const RECORD_ATTEMPTS: usize = 5;

async fn lookup_volume(pool: &StoragePool, name: &str) -> Result<Option<StorageVol>> {
    StorageVol::lookup_by_name(pool, name)
        .await
        .map_err(Error::libvirt(format!(
            "look up volume {name} in pool {}",
            pool.name()
        )))
}

/// Inline user-data, or the bytes of the Secret key it names, under the kit's policy
/// (`banlieue_provider_kit::user_data`): the Secret opted in, its own Provider does not
/// reference it, and it holds no credentials.
async fn user_data(machine: &LibvirtMachine, ctx: &Context) -> Result<Option<Vec<u8>>> {
    Ok(banlieue_provider_kit::user_data::read(
        &ctx.kube,
        &ctx.cfg.namespace,
        &ctx.cfg.provider,
        machine.spec.user_data.as_deref(),
        machine.spec.user_data_secret_ref.as_ref(),
    )
    .await?)
}

//! LibvirtMachine realisation against a real control plane and a real libvirtd (QEMU under
//! TCG): machines run, their devices and seed are what the guide says, deletion leaves nothing
//! of the machine behind and never touches the image, and the failure paths report the
//! guide's messages. The provider runs as the ServiceAccount the operator gives it, under
//! the shipped RBAC (ADR-0063).

mod common;

use std::time::Duration;

use anyhow::{Context as _, Result};
use banlieue_api::conditions::{self, Condition};
use banlieue_api::{
    Firmware, LibvirtDisk, LibvirtMachine, LibvirtMachineSpec, LocalObjectReference, Provider,
    ProviderClass, SecretKeySelector, Standby,
};
use banlieue_libvirt::flags;
use banlieue_libvirt::stream::TransferOptions;
use banlieue_libvirt::{Domain, DomainState, StoragePool, StorageVol};
use banlieue_provider_libvirt::domain_xml::DomainType;
use banlieue_provider_libvirt::machine::{ProviderConfig, run_provider};
use banlieue_provider_libvirt::metrics::Metrics;
use banlieue_testenv::poll;
use common::{
    Host, control_plane, credentials, grant_user_data, libvirt_class, none_left, provider,
    provider_identity,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use prometheus_client::registry::Registry;
use tokio::sync::oneshot;

const PROVIDER: &str = "edge";

/// What [`provider_namespace`] returns: the test's admin client (it plays the administrator
/// and the controller), the namespace, the sender whose drop stops the provider workload, and
/// the registry its metrics are in.
type Running = (kube::Client, String, oneshot::Sender<()>, Registry);

/// A namespace with the credentials and a Provider for `host`, and the provider workload
/// running for it, as the ServiceAccount the operator gives it, until the returned sender is
/// dropped.
async fn provider_namespace(host: &Host) -> Result<Running> {
    provider_namespace_with_resync(host, Duration::from_secs(3)).await
}

/// The value of the sample `name` (with its labels, as exposed) in `registry`'s text format.
fn sample(registry: &Registry, name: &str) -> Option<f64> {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

async fn provider_namespace_with_resync(host: &Host, resync: Duration) -> Result<Running> {
    let (kube, ns, workload) = provider_workload(host, resync).await?;
    Ok((kube, ns, workload.stop, workload.registry))
}

/// Like [`provider_namespace`], with the workload's handle.
async fn provider_workload(
    host: &Host,
    resync: Duration,
) -> Result<(kube::Client, String, Workload)> {
    let cp = control_plane().await;
    // Admin: the test plays the administrator (credentials, ProviderClass, Provider) and the
    // controller (LibvirtMachines). The provider runs as its own ServiceAccount.
    let kube = cp.client()?;
    let ns = cp.fresh_namespace().await?;
    credentials(&kube, &ns, host).await?;
    let class = libvirt_class(cp).await?;
    let provider = Api::<Provider>::namespaced(kube.clone(), &ns)
        .create(
            &PostParams::default(),
            &provider(
                PROVIDER,
                &class.name_any(),
                &host.libvirtd.tls_uri(),
                host.capabilities(),
            ),
        )
        .await?;
    let identity = provider_identity(cp, &provider, &class).await?;
    let workload = start_provider(&identity, &ns, resync);
    Ok((kube, ns, workload))
}

/// A running provider workload: sending on (or dropping) `stop` ends it, `done` then
/// completes.
struct Workload {
    stop: oneshot::Sender<()>,
    done: tokio::task::JoinHandle<()>,
    registry: Registry,
    /// The client of the workload's ServiceAccount, to start it again.
    identity: kube::Client,
}

impl Workload {
    /// Stops the workload and waits until it no longer acts on the host.
    async fn stop(self) -> Result<()> {
        let _ = self.stop.send(());
        self.done.await?;
        Ok(())
    }
}

/// Runs the provider workload for the Provider in `ns` as `identity`, the ServiceAccount the
/// operator gives it ([`provider_identity`]).
fn start_provider(identity: &kube::Client, ns: &str, resync: Duration) -> Workload {
    let (tx, rx) = oneshot::channel::<()>();
    let mut cfg = ProviderConfig::new(PROVIDER, ns);
    // /dev/kvm exists on these machines but cannot run guests.
    cfg.domain_type = Some(DomainType::Qemu);
    cfg.resync = resync;
    cfg.call_timeout = Duration::from_secs(30);
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let client = identity.clone();
    let done = tokio::spawn(async move {
        let _ = run_provider(client, cfg, metrics, async move {
            let _ = rx.await;
        })
        .await;
    });
    Workload {
        stop: tx,
        done,
        registry,
        identity: identity.clone(),
    }
}

fn machine(name: &str, host: &Host, disk: LibvirtDisk) -> LibvirtMachine {
    LibvirtMachine::new(
        name,
        LibvirtMachineSpec {
            provider_ref: LocalObjectReference::new(PROVIDER),
            pool: host.pool.clone(),
            network: host.network.clone(),
            disk,
            firmware: Firmware::Bios,
            tpm_enabled: false,
            secure_boot: false,
            cpu: 1,
            memory: Quantity("256Mi".into()),
            user_data: None,
            user_data_secret_ref: None,
            standby: None,
            access: None,
            handover: None,
            egress: None,
        },
    )
}

fn backing(volume: &str) -> LibvirtDisk {
    LibvirtDisk {
        backing_volume: Some(volume.into()),
        install_media: None,
        size: Quantity("64Mi".into()),
    }
}

fn install_media(volume: &str) -> LibvirtDisk {
    LibvirtDisk {
        backing_volume: None,
        install_media: Some(volume.into()),
        size: Quantity("64Mi".into()),
    }
}

fn ready(m: &LibvirtMachine) -> Option<Condition> {
    m.status
        .as_ref()
        .and_then(|s| conditions::find(&s.contract.conditions, "Ready"))
        .cloned()
}

async fn wait_machine(
    api: &Api<LibvirtMachine>,
    name: &str,
    what: &str,
    secs: u64,
    check: impl Fn(&Condition) -> bool,
) -> Result<LibvirtMachine> {
    Ok(poll::until(what, Duration::from_secs(secs), || async {
        let m = api.get(name).await?;
        Ok(ready(&m).filter(&check).map(|_| m))
    })
    .await?)
}

async fn volume_names(host: &Host) -> Result<Vec<String>> {
    let client = host.client().await?;
    let pool = StoragePool::lookup_by_name(&client, &host.pool)
        .await?
        .context("the test pool exists")?;
    pool.refresh().await?;
    let names = pool
        .list_all_volumes()
        .await?
        .iter()
        .map(|v| v.name().to_owned())
        .collect();
    let _ = client.close().await;
    Ok(names)
}

async fn domain_names(host: &Host) -> Result<Vec<String>> {
    let client = host.client().await?;
    let names = client
        .list_all_domains(flags::ConnectListAllDomainsFlags::empty())
        .await?
        .iter()
        .map(|d| d.name().to_owned())
        .collect();
    let _ = client.close().await;
    Ok(names)
}

/// Reads `/meta-data` of the seed volume through the client (a volume download) and isoinfo's
/// Joliet reader.
async fn seed_meta_data(host: &Host, volume: &str) -> Result<String> {
    seed_file(host, volume, "/meta-data").await
}

/// Reads `file` of the seed volume.
async fn seed_file(host: &Host, volume: &str, file: &str) -> Result<String> {
    let client = host.client().await?;
    let pool = StoragePool::lookup_by_name(&client, &host.pool)
        .await?
        .context("pool")?;
    let vol = StorageVol::lookup_by_name(&pool, volume)
        .await?
        .context("the seed volume exists")?;
    let mut bytes = Vec::new();
    vol.download(&mut bytes, TransferOptions::new()).await?;
    let _ = client.close().await;
    let dir = tempfile::tempdir()?;
    let iso = dir.path().join("seed.iso");
    std::fs::write(&iso, &bytes)?;
    let out = std::process::Command::new("isoinfo")
        .args(["-J", "-x", file, "-i"])
        .arg(&iso)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "isoinfo: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn immediate_and_deferred_machines_run_and_are_torn_down() -> Result<()> {
    let host = Host::start().await?;
    host.create_raw_volume("base.raw", 1 << 20).await?;
    host.create_raw_volume("installer.iso", 1 << 20).await?;
    let (kube, ns, _provider, metrics) = provider_namespace(&host).await?;
    let api: Api<LibvirtMachine> = Api::namespaced(kube.clone(), &ns);

    api.create(
        &PostParams::default(),
        &machine("imm", &host, backing("base.raw")),
    )
    .await?;
    let mut deferred = machine("def", &host, install_media("installer.iso"));
    deferred.spec.firmware = Firmware::Efi;
    deferred.spec.tpm_enabled = true;
    deferred.spec.user_data = Some("#cloud-config\nhostname: def\n".into());
    api.create(&PostParams::default(), &deferred).await?;

    let imm = wait_machine(&api, "imm", "imm running", 180, |c| c.status == "True").await?;
    let def = wait_machine(&api, "def", "def running", 180, |c| c.status == "True").await?;
    for (m, name) in [(&imm, "imm"), (&def, "def")] {
        let s = m.status.clone().unwrap();
        let domain = format!("{ns}-{name}");
        let uuid = s.domain_uuid.clone().context("a recorded UUID")?;
        assert!(s.contract.ready);
        assert!(s.contract.initialization.provisioned);
        assert_eq!(s.domain_name.as_deref(), Some(domain.as_str()));
        assert_eq!(
            s.contract.provider_id,
            Some(format!("libvirt://{ns}/{PROVIDER}/{uuid}"))
        );
        assert_eq!(ready(m).unwrap().reason, "DomainRunning");

        // The seed carries the UUID as instance-id and the domain name as hostname.
        let meta = seed_meta_data(&host, &format!("{domain}-cidata.iso")).await?;
        // Spelled as banlieue-iso spells YAML scalars (a UUID starting with a digit is quoted).
        let line =
            |key: &str, value: &str| format!("{key}: {}\n", banlieue_iso::yaml_string(value));
        assert!(meta.contains(&line("instance-id", &uuid)), "{meta}");
        assert!(meta.contains(&line("local-hostname", &domain)), "{meta}");
    }

    // dumpxml through the client: the devices the guide promises.
    let client = host.client().await?;
    let d = Domain::lookup_by_name(&client, &format!("{ns}-imm"))
        .await?
        .context("imm")?;
    assert_eq!(d.get_state().await?.0, DomainState::Running);
    assert_eq!(
        Some(d.uuid_string()),
        imm.status.as_ref().unwrap().domain_uuid
    );
    let xml = d.get_xml_desc(flags::DomainXmlFlags::empty()).await?;
    assert!(xml.contains("<domain type='qemu'"), "{xml}");
    assert!(
        xml.contains(&format!("volume='{ns}-imm-os.qcow2'")),
        "{xml}"
    );
    assert!(
        xml.contains(&format!("volume='{ns}-imm-cidata.iso'")),
        "{xml}"
    );
    assert!(xml.contains("<target dev='sda' bus='scsi'/>"), "{xml}");
    assert!(
        xml.contains(&format!("<source network='{}'", host.network)),
        "{xml}"
    );
    assert!(xml.contains("<serial type='pty'>"), "{xml}");
    assert!(!xml.contains("<graphics"), "{xml}");
    // The overlay's backing format comes from the name: base.raw → raw.
    let pool = StoragePool::lookup_by_name(&client, &host.pool)
        .await?
        .context("pool")?;
    let os = StorageVol::lookup_by_name(&pool, &format!("{ns}-imm-os.qcow2"))
        .await?
        .context("os volume")?;
    let vol_xml = os.get_xml_desc().await?;
    assert!(vol_xml.contains("base.raw</path>"), "{vol_xml}");
    assert!(vol_xml.contains("<format type='raw'/>"), "{vol_xml}");

    let d = Domain::lookup_by_name(&client, &format!("{ns}-def"))
        .await?
        .context("def")?;
    let def_uuid = d.uuid_string();
    let xml = d.get_xml_desc(flags::DomainXmlFlags::empty()).await?;
    assert!(xml.contains("volume='installer.iso'"), "{xml}");
    assert!(
        xml.contains(&format!("volume='{ns}-def-cidata.iso'")),
        "{xml}"
    );
    assert!(xml.contains("<os firmware='efi'>"), "{xml}");
    assert!(xml.contains("<nvram"), "a per-domain varstore: {xml}");
    assert!(xml.contains("<tpm model='tpm-crb'>"), "{xml}");
    let os_disk = xml.find("-def-os.qcow2").unwrap();
    let media = xml.find("installer.iso").unwrap();
    let seed = xml.find("-def-cidata.iso").unwrap();
    assert!(os_disk < media && media < seed, "disk order: {xml}");
    let _ = client.close().await;
    let vars = host
        .libvirtd
        .state_dir()
        .join(format!("qemu/nvram/{ns}-def_VARS.fd"));
    let swtpm = host.libvirtd.state_dir().join(format!("swtpm/{def_uuid}"));
    assert!(
        vars.exists(),
        "{} exists while the domain does",
        vars.display()
    );
    assert!(
        swtpm.exists(),
        "{} exists while the domain does",
        swtpm.display()
    );

    // Deletion: blocks until the domain and the machine's volumes are gone.
    api.delete("imm", &DeleteParams::default()).await?;
    api.delete("def", &DeleteParams::default()).await?;
    none_left(&api, "machines gone from the API", 120).await?;
    let domains = domain_names(&host).await?;
    assert!(domains.is_empty(), "domains left: {domains:?}");
    let volumes = volume_names(&host).await?;
    assert!(
        volumes.iter().all(|v| !v.starts_with(&ns)),
        "machine volumes left: {volumes:?}"
    );
    assert!(
        volumes.contains(&"base.raw".to_owned()),
        "the image stays: {volumes:?}"
    );
    assert!(
        volumes.contains(&"installer.iso".to_owned()),
        "the image stays: {volumes:?}"
    );
    assert!(!vars.exists(), "{} left behind", vars.display());
    assert!(!swtpm.exists(), "{} left behind", swtpm.display());

    // What the provider's /metrics says about it.
    let value = |name: &str| sample(&metrics, name);
    assert_eq!(
        value("banlieue_provider_libvirt_domains_defined_total"),
        Some(2.0)
    );
    assert_eq!(
        value("banlieue_provider_libvirt_domains_undefined_total"),
        Some(2.0)
    );
    assert_eq!(
        value("banlieue_provider_libvirt_machine_ready_seconds_count"),
        Some(2.0)
    );
    assert_eq!(value("banlieue_provider_libvirt_host_connected"), Some(1.0));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_name_in_two_namespaces_makes_two_domains() -> Result<()> {
    let host = Host::start().await?;
    host.create_raw_volume("base.raw", 1 << 20).await?;
    let (kube_a, ns_a, _a, _) = provider_namespace(&host).await?;
    let (kube_b, ns_b, _b, _) = provider_namespace(&host).await?;
    let a: Api<LibvirtMachine> = Api::namespaced(kube_a, &ns_a);
    let b: Api<LibvirtMachine> = Api::namespaced(kube_b, &ns_b);
    a.create(
        &PostParams::default(),
        &machine("web", &host, backing("base.raw")),
    )
    .await?;
    b.create(
        &PostParams::default(),
        &machine("web", &host, backing("base.raw")),
    )
    .await?;
    let ma = wait_machine(&a, "web", "web in a", 180, |c| c.status == "True").await?;
    let mb = wait_machine(&b, "web", "web in b", 180, |c| c.status == "True").await?;
    let uuid = |m: &LibvirtMachine| m.status.as_ref().and_then(|s| s.domain_uuid.clone());
    assert_ne!(uuid(&ma), uuid(&mb));
    let mut domains = domain_names(&host).await?;
    domains.sort();
    let mut expected = vec![format!("{ns_a}-web"), format!("{ns_b}-web")];
    expected.sort();
    assert_eq!(domains, expected);
    a.delete("web", &DeleteParams::default()).await?;
    b.delete("web", &DeleteParams::default()).await?;
    poll::until("both deleted", Duration::from_secs(120), || async {
        Ok((a.get_opt("web").await?.is_none() && b.get_opt("web").await?.is_none()).then_some(()))
    })
    .await?;
    assert!(domain_names(&host).await?.is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_paths_report_the_guides_messages() -> Result<()> {
    let host = Host::start().await?;
    let (kube, ns, _provider, metrics) = provider_namespace(&host).await?;
    let api: Api<LibvirtMachine> = Api::namespaced(kube.clone(), &ns);

    // The backing volume is absent.
    api.create(
        &PostParams::default(),
        &machine("nobase", &host, backing("missing.raw")),
    )
    .await?;
    let m = wait_machine(&api, "nobase", "VolumeNotInPool", 60, |c| {
        c.reason == "VolumeNotInPool"
    })
    .await?;
    assert_eq!(
        ready(&m).unwrap().message,
        format!("volume missing.raw is not in pool {}", host.pool)
    );

    // Image volumes a machine's writer may not name, refused before anything is made: a
    // victim machine's seed and OS disk, and a volume the Provider did not declare. Written
    // by bob, who may write LibvirtMachines in this namespace and nothing else.
    let bob = control_plane()
        .await
        .tenant_writing(&ns, "bob", "libvirtmachines")
        .await?;
    let as_bob: Api<LibvirtMachine> = Api::namespaced(bob, &ns);
    let victim = format!("{ns}-victim");
    let rows = [
        (
            "seed",
            format!("{victim}-cidata.iso"),
            "a machine's own disk or seed",
        ),
        (
            "osdisk",
            format!("{victim}-os.qcow2"),
            "a machine's own disk or seed",
        ),
        (
            "undeclared",
            "undeclared.raw".to_owned(),
            "neither declared for BackingFile sources",
        ),
    ];
    for (_, volume, _) in &rows {
        host.create_raw_volume(volume, 1 << 20).await?;
    }
    for (name, volume, why) in &rows {
        as_bob
            .create(
                &PostParams::default(),
                &machine(name, &host, backing(volume)),
            )
            .await?;
        let m = wait_machine(&api, name, "ImageVolumeRefused", 60, |c| {
            c.reason == "ImageVolumeRefused"
        })
        .await?;
        let message = ready(&m).unwrap().message;
        assert!(
            message.contains(volume.as_str()) && message.contains(why),
            "{name}: {message}"
        );
        assert!(
            !volume_names(&host)
                .await?
                .contains(&format!("{ns}-{name}-os.qcow2")),
            "{name}: a disk was made over a refused image"
        );
    }
    // What an import made (it has the completion record) is an image without a declaration:
    // the machine gets past the check, here to the missing volume itself.
    host.create_raw_volume("imported.raw.complete", 4096)
        .await?;
    as_bob
        .create(
            &PostParams::default(),
            &machine("imported", &host, backing("imported.raw")),
        )
        .await?;
    wait_machine(&api, "imported", "VolumeNotInPool", 60, |c| {
        c.reason == "VolumeNotInPool"
    })
    .await?;
    for (name, _, _) in rows.iter().chain([&("imported", String::new(), "")]) {
        api.delete(name, &DeleteParams::default()).await?;
    }

    // The pool is absent.
    let mut nopool = machine("nopool", &host, backing("missing.raw"));
    nopool.spec.pool = "nvme-pool".into();
    api.create(&PostParams::default(), &nopool).await?;
    let m = wait_machine(&api, "nopool", "StoragePoolNotFound", 60, |c| {
        c.reason == "StoragePoolNotFound"
    })
    .await?;
    assert_eq!(
        ready(&m).unwrap().message,
        "storage pool nvme-pool does not exist"
    );

    // A pool and a network the host has but the Provider did not declare (another tenant's
    // isolated network, a bridge onto the management LAN): refused naming the field, before
    // any volume or domain is made. Defined only: a lookup finds them, nothing runs.
    let undeclared_dir = host.libvirtd.create_pool_dir("undeclared-pool")?;
    host.libvirtd
        .virsh([
            "pool-define-as",
            "undeclared-pool",
            "dir",
            "--target",
            &undeclared_dir.display().to_string(),
        ])
        .await?;
    let net_xml = host.libvirtd.dir().join("undeclared-net.xml");
    std::fs::write(
        &net_xml,
        "<network><name>undeclared-net</name><bridge name='bnlundecl0' stp='off'/></network>",
    )?;
    host.libvirtd
        .virsh(["net-define", &net_xml.display().to_string()])
        .await?;
    host.create_raw_volume("declared-check.raw", 1 << 20)
        .await?;
    let mut other_pool = machine("otherpool", &host, backing("declared-check.raw"));
    other_pool.spec.pool = "undeclared-pool".into();
    let mut other_net = machine("othernet", &host, backing("declared-check.raw"));
    other_net.spec.network = "undeclared-net".into();
    for (candidate, field) in [
        (
            other_pool,
            "spec.pool undeclared-pool is not a storage pool",
        ),
        (other_net, "spec.network undeclared-net is not a network"),
    ] {
        let name = candidate.metadata.name.clone().unwrap_or_default();
        api.create(&PostParams::default(), &candidate).await?;
        let m = wait_machine(&api, &name, "TargetNotDeclared", 60, |c| {
            c.reason == "TargetNotDeclared"
        })
        .await?;
        let message = ready(&m).unwrap().message;
        assert!(message.contains(field), "{name}: {message}");
        assert!(
            !volume_names(&host)
                .await?
                .iter()
                .any(|v| v.starts_with(&format!("{ns}-{name}"))),
            "{name}: a volume was made for a refused target"
        );
        api.delete(&name, &DeleteParams::default()).await?;
    }

    // A foreign domain holds the machine's name: it is never redefined nor deleted.
    let foreign = format!("{ns}-taken");
    let foreign_uuid = "0b6f1e0c-0000-4000-8000-000000000042";
    let xml_path = host.libvirtd.dir().join("foreign.xml");
    std::fs::write(
        &xml_path,
        format!(
            "<domain type='qemu'><name>{foreign}</name><uuid>{foreign_uuid}</uuid>\
             <memory unit='MiB'>64</memory><os><type arch='x86_64'>hvm</type></os></domain>"
        ),
    )?;
    host.libvirtd
        .virsh(["define", &xml_path.display().to_string()])
        .await?;
    let before = host.libvirtd.virsh(["dumpxml", &foreign]).await?;
    host.create_raw_volume("base.raw", 1 << 20).await?;
    api.create(
        &PostParams::default(),
        &machine("taken", &host, backing("base.raw")),
    )
    .await?;
    let m = wait_machine(&api, "taken", "DomainNameTaken", 60, |c| {
        c.reason == "DomainNameTaken"
    })
    .await?;
    let message = ready(&m).unwrap().message;
    assert!(
        message.contains(&foreign) && message.contains(foreign_uuid),
        "{message}"
    );
    assert_eq!(host.libvirtd.virsh(["dumpxml", &foreign]).await?, before);

    for name in ["nobase", "nopool", "taken"] {
        api.delete(name, &DeleteParams::default()).await?;
    }
    none_left(&api, "machines deleted", 60).await?;
    // The foreign domain survives the machine's deletion, untouched.
    assert_eq!(host.libvirtd.virsh(["dumpxml", &foreign]).await?, before);
    let volumes = volume_names(&host).await?;
    assert!(
        !volumes.iter().any(|v| v.starts_with(&foreign)),
        "{volumes:?}"
    );

    // Each failure is counted under the reason it was reported with; nothing was defined.
    for reason in [
        "VolumeNotInPool",
        "StoragePoolNotFound",
        "TargetNotDeclared",
        "DomainNameTaken",
    ] {
        let failures = sample(
            &metrics,
            &format!(
                "banlieue_provider_libvirt_machine_reconcile_errors_total{{reason=\"{reason}\"}}"
            ),
        );
        assert!(failures.is_some_and(|n| n >= 1.0), "{reason}: {failures:?}");
    }
    assert_eq!(
        sample(&metrics, "banlieue_provider_libvirt_domains_defined_total"),
        Some(0.0)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_libvirtd_is_reported_and_recovered_from() -> Result<()> {
    let mut host = Host::start().await?;
    host.create_raw_volume("base.raw", 1 << 20).await?;
    let (kube, ns, _provider, metrics) = provider_namespace(&host).await?;
    let api: Api<LibvirtMachine> = Api::namespaced(kube.clone(), &ns);
    api.create(
        &PostParams::default(),
        &machine("web", &host, backing("base.raw")),
    )
    .await?;
    // Stop the daemon as soon as the machine has its UUID: the reconcile is under way.
    poll::until("UUID recorded", Duration::from_secs(60), || async {
        let m = api.get("web").await?;
        Ok(m.status.and_then(|s| s.domain_uuid))
    })
    .await?;
    host.libvirtd.suspend()?;
    let outcome = wait_machine(
        &api,
        "web",
        "ConnectFailed while libvirtd is stopped",
        120,
        |c| c.reason == "ConnectFailed",
    )
    .await;
    let connected_while_stopped = sample(&metrics, "banlieue_provider_libvirt_host_connected");
    host.libvirtd.resume()?;
    let m = outcome?;
    assert_eq!(connected_while_stopped, Some(0.0));
    assert!(
        sample(
            &metrics,
            "banlieue_provider_libvirt_machine_reconcile_errors_total{reason=\"ConnectFailed\"}"
        )
        .is_some_and(|n| n >= 1.0)
    );
    let message = ready(&m).unwrap().message;
    assert!(
        message.contains("connection lost") || message.contains("timed out"),
        "{message}"
    );
    let m = wait_machine(&api, "web", "running after libvirtd is back", 180, |c| {
        c.status == "True"
    })
    .await?;
    assert!(m.status.unwrap().contract.ready);
    assert_eq!(
        sample(&metrics, "banlieue_provider_libvirt_host_connected"),
        Some(1.0)
    );
    assert_eq!(domain_names(&host).await?, vec![format!("{ns}-web")]);
    api.delete("web", &DeleteParams::default()).await?;
    poll::until("deleted", Duration::from_secs(120), || async {
        Ok(api.get_opt("web").await?.is_none().then_some(()))
    })
    .await?;
    Ok(())
}

/// Chaos: libvirtd restarts in the middle of a teardown. The deletion begins while the daemon
/// is down, so the machine keeps its finalizer and says why (`TeardownFailed`, naming the
/// connection); once the daemon is back (same state, the guest still running) the teardown
/// completes and nothing of the machine is left on the host: no domain, no volume but the
/// image's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_teardown_across_a_libvirtd_restart_leaves_nothing_behind() -> Result<()> {
    let mut host = Host::start().await?;
    host.create_raw_volume("base.raw", 1 << 20).await?;
    let (kube, ns, _provider, _metrics) = provider_namespace(&host).await?;
    let api: Api<LibvirtMachine> = Api::namespaced(kube.clone(), &ns);
    api.create(
        &PostParams::default(),
        &machine("web", &host, backing("base.raw")),
    )
    .await?;
    wait_machine(&api, "web", "running", 180, |c| c.status == "True").await?;
    assert_eq!(domain_names(&host).await?, vec![format!("{ns}-web")]);
    assert!(
        volume_names(&host).await?.len() > 1,
        "the machine's volumes"
    );

    host.libvirtd.stop();
    api.delete("web", &DeleteParams::default()).await?;
    let held = wait_machine(
        &api,
        "web",
        "the teardown to report TeardownFailed while libvirtd is down",
        120,
        |c| c.reason == "TeardownFailed",
    )
    .await;
    host.libvirtd.start_again().await?;
    let held = held?;
    assert!(held.metadata.deletion_timestamp.is_some());
    let why = ready(&held).map(|c| c.message).unwrap_or_default();
    assert!(why.contains("connect"), "{why}");
    assert!(
        held.finalizers()
            .contains(&"banlieue.io/domain-protection".to_owned()),
        "the finalizer is released only once the host is clean"
    );

    poll::until(
        "the machine to be gone",
        Duration::from_secs(180),
        || async { Ok(api.get_opt("web").await?.is_none().then_some(())) },
    )
    .await?;
    assert_eq!(domain_names(&host).await?, Vec::<String>::new());
    assert_eq!(volume_names(&host).await?, vec!["base.raw".to_owned()]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_domain_stopped_behind_the_providers_back_is_started_on_its_event() -> Result<()> {
    let host = Host::start().await?;
    host.create_raw_volume("base.raw", 1 << 20).await?;
    // A resync far beyond the test's deadlines: only the lifecycle event can wake the provider.
    let (kube, ns, _provider, _) =
        provider_namespace_with_resync(&host, Duration::from_secs(3600)).await?;
    let api: Api<LibvirtMachine> = Api::namespaced(kube.clone(), &ns);
    api.create(
        &PostParams::default(),
        &machine("web", &host, backing("base.raw")),
    )
    .await?;
    wait_machine(&api, "web", "running", 180, |c| c.status == "True").await?;
    let domain = format!("{ns}-web");
    let client = host.client().await?;
    let d = Domain::lookup_by_name(&client, &domain)
        .await?
        .context("domain")?;
    let first_id = d.id();
    d.destroy().await?;
    let restarted = poll::until(
        "the domain started again",
        Duration::from_secs(60),
        || async {
            let d = Domain::lookup_by_name(&client, &domain)
                .await?
                .context("domain")?;
            Ok((d.get_state().await?.0 == DomainState::Running).then_some(d))
        },
    )
    .await?;
    assert_ne!(restarted.id(), first_id, "a new QEMU process");
    let _ = client.close().await;
    api.delete("web", &DeleteParams::default()).await?;
    poll::until("deleted", Duration::from_secs(120), || async {
        Ok(api.get_opt("web").await?.is_none().then_some(()))
    })
    .await?;
    Ok(())
}

/// A Secret in `ns` holding `user-data`, with `labels`.
fn user_data_secret(name: &str, labels: &[(&str, &str)], type_: Option<&str>) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..Default::default()
        },
        string_data: Some(
            [(
                "user-data".to_owned(),
                format!("#cloud-config\nhostname: {name}\n"),
            )]
            .into(),
        ),
        type_: type_.map(str::to_owned),
        ..Default::default()
    }
}

fn with_secret(mut m: LibvirtMachine, name: &str, key: &str) -> LibvirtMachine {
    m.spec.user_data_secret_ref = Some(SecretKeySelector {
        name: name.into(),
        key: key.into(),
    });
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_data_comes_only_from_opted_in_secrets_never_a_providers() -> Result<()> {
    let host = Host::start().await?;
    host.create_raw_volume("base.raw", 1 << 20).await?;
    let (kube, ns, _provider, _) = provider_namespace(&host).await?;
    let api: Api<LibvirtMachine> = Api::namespaced(kube.clone(), &ns);
    let secrets: Api<Secret> = Api::namespaced(kube.clone(), &ns);
    // Opting the Provider's credentials in changes nothing: a Provider's Secret is never
    // user-data.
    secrets
        .patch(
            "libvirt-creds",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({
                "metadata": { "labels": { "banlieue.io/user-data": "true" } }
            })),
        )
        .await?;
    secrets
        .create(
            &PostParams::default(),
            &user_data_secret("plain", &[], None),
        )
        .await?;
    // Another Provider's credentials, opted in: the workload cannot read other Providers
    // (ADR-0063) but knows credentials by their private key.
    let mut other = user_data_secret("other-creds", &[("banlieue.io/user-data", "true")], None);
    other
        .string_data
        .get_or_insert_default()
        .insert("tls.key".into(), "a key".into());
    secrets.create(&PostParams::default(), &other).await?;
    secrets
        .create(
            &PostParams::default(),
            &user_data_secret("labelled", &[("banlieue.io/user-data", "true")], None),
        )
        .await?;
    secrets
        .create(
            &PostParams::default(),
            &user_data_secret("typed", &[], Some("banlieue.io/user-data")),
        )
        .await?;
    // The operator grants the provider each Secret its machines name (but another Provider's
    // credentials), so what is refused below is the provider's own check.
    let provider = Api::<Provider>::namespaced(kube.clone(), &ns)
        .get(PROVIDER)
        .await?;
    let class = Api::<ProviderClass>::all(kube.clone())
        .get(&provider.spec.provider_class_ref.name)
        .await?;
    grant_user_data(
        control_plane().await,
        &provider,
        &class,
        &["plain", "other-creds", "labelled", "typed"],
    )
    .await?;

    api.create(
        &PostParams::default(),
        &with_secret(
            machine("key", &host, backing("base.raw")),
            "libvirt-creds",
            "tls.key",
        ),
    )
    .await?;
    api.create(
        &PostParams::default(),
        &with_secret(
            machine("plain", &host, backing("base.raw")),
            "plain",
            "user-data",
        ),
    )
    .await?;
    let m = wait_machine(&api, "key", "the credentials refused", 60, |c| {
        c.reason == "UserDataSecretRefused"
    })
    .await?;
    let message = ready(&m).unwrap().message;
    assert!(
        message.contains("Secret libvirt-creds is referenced by Provider edge"),
        "{message}"
    );
    api.create(
        &PostParams::default(),
        &with_secret(
            machine("other", &host, backing("base.raw")),
            "other-creds",
            "user-data",
        ),
    )
    .await?;
    let m = wait_machine(
        &api,
        "other",
        "another Provider's credentials refused",
        60,
        |c| c.reason == "UserDataSecretRefused",
    )
    .await?;
    let message = ready(&m).unwrap().message;
    assert!(
        message.contains("Secret other-creds holds a private key (tls.key)"),
        "{message}"
    );
    let m = wait_machine(&api, "plain", "a Secret without opt-in refused", 60, |c| {
        c.reason == "UserDataSecretRefused"
    })
    .await?;
    let message = ready(&m).unwrap().message;
    assert!(
        message.contains("Secret plain has not opted in")
            && message.contains("banlieue.io/user-data=\"true\""),
        "{message}"
    );
    // Refused before anything was made on the host.
    let volumes = volume_names(&host).await?;
    assert!(
        !volumes.iter().any(|v| ["key", "plain", "other"]
            .iter()
            .any(|m| v.starts_with(&format!("{ns}-{m}")))),
        "{volumes:?}"
    );
    assert!(domain_names(&host).await?.is_empty());

    // Opted in by label or by type: the guest gets the Secret's user-data.
    for name in ["labelled", "typed"] {
        api.create(
            &PostParams::default(),
            &with_secret(machine(name, &host, backing("base.raw")), name, "user-data"),
        )
        .await?;
    }
    for name in ["labelled", "typed"] {
        wait_machine(&api, name, "running with user-data", 180, |c| {
            c.status == "True"
        })
        .await?;
        let data = seed_file(&host, &format!("{ns}-{name}-cidata.iso"), "/user-data").await?;
        assert_eq!(data, format!("#cloud-config\nhostname: {name}\n"));
    }
    for name in ["key", "plain", "other", "labelled", "typed"] {
        api.delete(name, &DeleteParams::default()).await?;
    }
    none_left(&api, "machines deleted", 120).await?;
    Ok(())
}

/// Defines a domain of `name` that no machine made.
async fn define_foreign(host: &Host, name: &str, uuid: &str) -> Result<String> {
    let xml_path = host.libvirtd.dir().join(format!("{name}.xml"));
    std::fs::write(
        &xml_path,
        format!(
            "<domain type='qemu'><name>{name}</name><uuid>{uuid}</uuid>\
             <memory unit='MiB'>64</memory><os><type arch='x86_64'>hvm</type></os></domain>"
        ),
    )?;
    host.libvirtd
        .virsh(["define", &xml_path.display().to_string()])
        .await?;
    Ok(host.libvirtd.virsh(["dumpxml", name]).await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volumes_are_reused_and_deleted_only_with_proof_of_ownership() -> Result<()> {
    let host = Host::start().await?;
    host.create_raw_volume("base.raw", 1 << 20).await?;
    let (kube, ns, workload) = provider_workload(&host, Duration::from_secs(3)).await?;
    let api: Api<LibvirtMachine> = Api::namespaced(kube.clone(), &ns);

    // Namespace a-b with machine c and namespace a with machine b-c both derive domain a-b-c:
    // here the other machine's volumes are already in the pool, its domain not defined yet.
    let squatted = format!("{ns}-squat-os.qcow2");
    host.libvirtd
        .virsh([
            "vol-create-as",
            &host.pool,
            &squatted,
            "2097152",
            "--format",
            "qcow2",
        ])
        .await?;
    let seeded = format!("{ns}-seed-cidata.iso");
    host.create_raw_volume(&seeded, 4096).await?;
    let before = host
        .libvirtd
        .virsh(["vol-dumpxml", "--pool", &host.pool, &seeded])
        .await?;
    api.create(
        &PostParams::default(),
        &machine("squat", &host, backing("base.raw")),
    )
    .await?;
    api.create(
        &PostParams::default(),
        &machine("seed", &host, backing("base.raw")),
    )
    .await?;
    let m = wait_machine(&api, "squat", "VolumeNotOwned", 60, |c| {
        c.reason == "VolumeNotOwned"
    })
    .await?;
    let message = ready(&m).unwrap().message;
    assert!(
        message.contains(&format!(
            "volume {squatted} already exists in pool {}",
            host.pool
        )),
        "{message}"
    );
    let m = wait_machine(&api, "seed", "VolumeNotOwned for the seed", 60, |c| {
        c.reason == "VolumeNotOwned"
    })
    .await?;
    let message = ready(&m).unwrap().message;
    assert!(message.contains(&format!("volume {seeded}")), "{message}");
    // The seed machine made its own OS disk and recorded it; the other seed is not deleted.
    assert_eq!(
        m.status.as_ref().unwrap().volumes,
        vec![format!("{ns}-seed-os.qcow2")]
    );
    assert_eq!(
        host.libvirtd
            .virsh(["vol-dumpxml", "--pool", &host.pool, &seeded])
            .await?,
        before
    );

    // A machine that ran, and then lost its name to a foreign domain: deleting it still
    // deletes the volumes it made, and never the foreign domain.
    api.create(
        &PostParams::default(),
        &machine("web", &host, backing("base.raw")),
    )
    .await?;
    let web = wait_machine(&api, "web", "web running", 180, |c| c.status == "True").await?;
    let mut recorded = web.status.clone().unwrap().volumes;
    recorded.sort();
    assert_eq!(
        recorded,
        vec![format!("{ns}-web-cidata.iso"), format!("{ns}-web-os.qcow2")]
    );
    let domain = format!("{ns}-web");
    // Stopped so that it does not start the machine again while the name changes hands.
    let identity = workload.identity.clone();
    workload.stop().await?;
    host.libvirtd
        .virsh(["undefine", &domain, "--nvram"])
        .await?;
    host.libvirtd.virsh(["destroy", &domain]).await?;
    let foreign = define_foreign(&host, &domain, "0b6f1e0c-0000-4000-8000-0000000000a7").await?;
    let _workload = start_provider(&identity, &ns, Duration::from_secs(3));
    wait_machine(&api, "web", "DomainNameTaken", 60, |c| {
        c.reason == "DomainNameTaken"
    })
    .await?;

    for name in ["squat", "seed", "web"] {
        api.delete(name, &DeleteParams::default()).await?;
    }
    none_left(&api, "machines deleted", 120).await?;
    assert_eq!(host.libvirtd.virsh(["dumpxml", &domain]).await?, foreign);
    let volumes = volume_names(&host).await?;
    for gone in [
        format!("{ns}-web-os.qcow2"),
        format!("{ns}-web-cidata.iso"),
        format!("{ns}-seed-os.qcow2"),
    ] {
        assert!(!volumes.contains(&gone), "{gone} left: {volumes:?}");
    }
    for kept in [&squatted, &seeded, &"base.raw".to_owned()] {
        assert!(volumes.contains(kept), "{kept} deleted: {volumes:?}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_pool_keeps_the_finalizer_and_names_the_pool() -> Result<()> {
    let host = Host::start().await?;
    host.create_raw_volume("base.raw", 1 << 20).await?;
    let (kube, ns, _provider, _) = provider_namespace(&host).await?;
    let api: Api<LibvirtMachine> = Api::namespaced(kube.clone(), &ns);
    api.create(
        &PostParams::default(),
        &machine("web", &host, backing("base.raw")),
    )
    .await?;
    wait_machine(&api, "web", "running", 180, |c| c.status == "True").await?;

    // The pool goes away (its files stay on disk), then the machine is deleted.
    host.libvirtd.virsh(["pool-destroy", &host.pool]).await?;
    host.libvirtd.virsh(["pool-undefine", &host.pool]).await?;
    api.delete("web", &DeleteParams::default()).await?;
    let m = wait_machine(&api, "web", "TeardownFailed", 120, |c| {
        c.reason == "TeardownFailed"
    })
    .await?;
    let message = ready(&m).unwrap().message;
    assert!(
        message.contains(&format!("storage pool {} does not exist", host.pool))
            && message.contains(&format!("{ns}-web-os.qcow2")),
        "{message}"
    );
    assert!(
        m.metadata
            .finalizers
            .unwrap_or_default()
            .contains(&"banlieue.io/domain-protection".to_owned())
    );
    assert!(
        domain_names(&host).await?.is_empty(),
        "the domain itself went"
    );

    // The pool back: the teardown finishes and deletes the volumes.
    host.libvirtd
        .virsh([
            "pool-define-as",
            &host.pool,
            "dir",
            "--target",
            &host.pool_dir.display().to_string(),
        ])
        .await?;
    host.libvirtd.virsh(["pool-start", &host.pool]).await?;
    none_left(&api, "machine deleted once the pool is back", 120).await?;
    let volumes = volume_names(&host).await?;
    assert!(
        volumes.iter().all(|v| !v.starts_with(&ns)),
        "machine volumes left: {volumes:?}"
    );
    Ok(())
}

/// The condition `type_` of `m`.
fn condition(m: &LibvirtMachine, type_: &str) -> Option<Condition> {
    m.status
        .as_ref()
        .and_then(|s| conditions::find(&s.contract.conditions, type_))
        .cloned()
}

/// Writes `spec.standby` of machine `name` with a JSON merge patch, as the VirtualMachine
/// reconciler does (ADR-0073): the test stands in for the controller, as admin.
async fn set_standby(api: &Api<LibvirtMachine>, name: &str, standby: Standby) -> Result<i64> {
    let patched = api
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "spec": { "standby": standby } })),
        )
        .await?;
    patched.metadata.generation.context("a generation")
}

/// Waits until machine `name` reports `standby` for `generation`, with `Saved` as `saved`
/// and Ready as `ready_reason`.
async fn wait_standby(
    api: &Api<LibvirtMachine>,
    name: &str,
    generation: i64,
    standby: Option<Standby>,
    ready_reason: &str,
) -> Result<LibvirtMachine> {
    Ok(poll::until(
        &format!("{name} reports {standby:?} ({ready_reason}) for generation {generation}"),
        Duration::from_secs(120),
        || async {
            let m = api.get(name).await?;
            let s = m.status.as_ref().context("a status")?;
            let done = s.contract.observed_generation == Some(generation)
                && s.contract.standby == standby
                && ready(&m).is_some_and(|c| c.reason == ready_reason);
            if !done {
                return Err(format!(
                    "generation {:?}, standby {:?}, Ready {:?}",
                    s.contract.observed_generation,
                    s.contract.standby,
                    ready(&m).map(|c| (c.reason, c.message))
                )
                .into());
            }
            Ok(Some(m))
        },
    )
    .await?)
}

/// Truncates a managed save image right after libvirt's header and the domain XML it carries
/// (`virQEMUSaveHeader`: 16 bytes of magic, then u32 version, data_len, was_running, format,
/// cookieOffset and 14 unused; data_len bytes of XML, cookie and padding follow), so QEMU
/// gets only the first bytes of its migration stream. A shorter file would be taken by
/// libvirt as an incomplete save, silently removed and booted afresh.
fn truncate_save_image(path: &std::path::Path) -> Result<()> {
    const HEADER: u64 = 16 + 4 * 19;
    let bytes = std::fs::read(path)?;
    anyhow::ensure!(bytes.starts_with(b"LibvirtQemudSave"), "not a save image");
    let data_len = u32::from_le_bytes(bytes[20..24].try_into()?) as u64;
    let keep = HEADER + data_len + 16;
    anyhow::ensure!(keep < bytes.len() as u64, "the image holds no QEMU stream");
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)?
        .set_len(keep)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_is_saved_and_restored_as_its_spec_says_and_a_bad_image_is_removed() -> Result<()>
{
    let host = Host::start().await?;
    host.create_raw_volume("base.raw", 1 << 20).await?;
    let (kube, ns, _provider, _) = provider_namespace(&host).await?;
    let api: Api<LibvirtMachine> = Api::namespaced(kube.clone(), &ns);
    // `warm` is saved, restored, saved, and fails its restore; `cold` is deleted while saved.
    for name in ["warm", "cold"] {
        api.create(
            &PostParams::default(),
            &machine(name, &host, backing("base.raw")),
        )
        .await?;
    }
    for name in ["warm", "cold"] {
        let m = wait_machine(&api, name, "running", 180, |c| c.status == "True").await?;
        // A machine whose spec never said standby reports none.
        let s = m.status.clone().unwrap();
        assert_eq!(s.contract.standby, None);
        assert!(condition(&m, "Saved").is_none());
    }
    let save_dir = host.libvirtd.state_dir().join("qemu/save");
    let image = |name: &str| save_dir.join(format!("{ns}-{name}.save"));
    let client = host.client().await?;
    let domain = |name: &'static str| {
        let client = &client;
        let ns = &ns;
        async move {
            Domain::lookup_by_name(client, &format!("{ns}-{name}"))
                .await?
                .context("the domain exists")
        }
    };

    // Saved: shut off with its image, still ready, and the guest's record kept.
    let saving = std::time::Instant::now();
    let mut generation = 0;
    for name in ["warm", "cold"] {
        generation = set_standby(&api, name, Standby::Saved).await?;
    }
    let before = api.get("warm").await?;
    let warm = wait_standby(
        &api,
        "warm",
        generation,
        Some(Standby::Saved),
        "DomainSaved",
    )
    .await?;
    let saved_in = saving.elapsed();
    wait_standby(
        &api,
        "cold",
        generation,
        Some(Standby::Saved),
        "DomainSaved",
    )
    .await?;
    let s = warm.status.clone().unwrap();
    assert!(
        s.contract.ready,
        "a saved machine is resumed, not provisioned"
    );
    let ready_now = ready(&warm).unwrap();
    assert_eq!(ready_now.status, "True");
    assert_eq!(
        ready_now.message,
        format!(
            "domain {ns}-warm is saved (managed save) and holds no host memory; it is restored \
             when its spec says Running"
        )
    );
    let saved = condition(&warm, "Saved").context("Saved")?;
    assert_eq!(
        (saved.status.as_str(), saved.reason.as_str()),
        ("True", "DomainSaved")
    );
    for type_ in ["GuestReady", "AgentConnected"] {
        assert_eq!(
            condition(&warm, type_),
            condition(&before, type_),
            "{type_}"
        );
    }
    let d = domain("warm").await?;
    assert_eq!(d.get_state().await?.0, DomainState::Shutoff);
    assert!(d.has_managed_save_image().await?);
    assert!(image("warm").exists(), "{} exists", image("warm").display());
    // Looked at again (the resync is 3 s) and left saved: not started, nothing written.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(d.get_state().await?.0, DomainState::Shutoff);
    assert_eq!(
        api.get("warm").await?.resource_version(),
        warm.resource_version(),
        "a saved machine's status does not change while it waits"
    );

    // Running: restored from the image (not booted), which libvirt then removes.
    let restoring = std::time::Instant::now();
    let generation = set_standby(&api, "warm", Standby::Running).await?;
    let warm = wait_standby(
        &api,
        "warm",
        generation,
        Some(Standby::Running),
        "DomainRunning",
    )
    .await?;
    let restored_in = restoring.elapsed();
    assert!(warm.status.as_ref().unwrap().contract.ready);
    let (state, reason) = d.get_state().await?;
    assert_eq!(state, DomainState::Running);
    assert_eq!(
        reason, 3,
        "VIR_DOMAIN_RUNNING_RESTORED: restored, not booted"
    );
    assert!(!d.has_managed_save_image().await?);
    assert!(
        !image("warm").exists(),
        "libvirt removes the restored image"
    );
    let saved = condition(&warm, "Saved").context("Saved")?;
    assert_eq!(
        (saved.status.as_str(), saved.reason.as_str()),
        ("False", "DomainNotSaved")
    );
    // This guest runs no agent: its clock could not be set, and the condition says so.
    assert!(
        saved
            .message
            .contains("restored from its managed save image, but its guest's clock was not set"),
        "{}",
        saved.message
    );
    eprintln!(
        "256 MiB TCG domain, patch to status: saved in {:.0} ms, restored in {:.0} ms",
        saved_in.as_secs_f64() * 1000.0,
        restored_in.as_secs_f64() * 1000.0
    );

    // Saved again, its image corrupted, then asked to run: RestoreFailed, the image removed,
    // and the domain left down (the controller replaces the machine).
    let generation = set_standby(&api, "warm", Standby::Saved).await?;
    wait_standby(
        &api,
        "warm",
        generation,
        Some(Standby::Saved),
        "DomainSaved",
    )
    .await?;
    truncate_save_image(&image("warm"))?;
    let generation = set_standby(&api, "warm", Standby::Running).await?;
    // `standby` stays Saved: never Running, which the controller would read as resumed.
    let warm = wait_standby(
        &api,
        "warm",
        generation,
        Some(Standby::Saved),
        "RestoreFailed",
    )
    .await?;
    assert!(!warm.status.as_ref().unwrap().contract.ready);
    let failed = ready(&warm).unwrap();
    assert_eq!(failed.status, "False");
    assert!(
        failed.message.starts_with(&format!(
            "restoring domain {ns}-warm from its managed save image failed: "
        )) && failed.message.contains("its save image was removed"),
        "{}",
        failed.message
    );
    assert!(!d.has_managed_save_image().await?);
    assert!(!image("warm").exists(), "the bad image is removed");
    let saved = condition(&warm, "Saved").context("Saved")?;
    assert_eq!(saved.status, "False");
    // Retried on the backoff: not booted afresh for the same spec.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(d.get_state().await?.0, DomainState::Shutoff);
    assert_eq!(
        ready(&api.get("warm").await?).unwrap().reason,
        "RestoreFailed"
    );

    // A saved machine deleted: its domain and its image go.
    assert!(image("cold").exists());
    api.delete("cold", &DeleteParams::default()).await?;
    api.delete("warm", &DeleteParams::default()).await?;
    none_left(&api, "machines gone from the API", 120).await?;
    let _ = client.close().await;
    let domains = domain_names(&host).await?;
    assert!(domains.is_empty(), "domains left: {domains:?}");
    assert!(
        !image("cold").exists(),
        "{} left behind",
        image("cold").display()
    );
    let left: Vec<_> = std::fs::read_dir(&save_dir)?
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "save images left: {left:?}");
    Ok(())
}

/// A machine that asks for Secure Boot boots the test guest image (shim and grub signed, the
/// kernel signed) through the provider's own domain XML: libvirt picks the SMM-enabled
/// firmware with the default keys enrolled, and the guest itself reports Secure Boot enforced.
/// The one real boot in this file; the image's boot without Secure Boot is
/// banlieue-testenv's guest test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secure_boot_machine_boots_the_signed_guest_with_secure_boot_on() -> Result<()> {
    let image = banlieue_testenv::guest_image::path().await?;
    let host = Host::start().await?;
    // Copied into the pool: QEMU runs as libvirt-qemu, which cannot reach root's cache.
    std::fs::copy(&image, host.pool_dir.join("guest.qcow2"))
        .with_context(|| format!("copy {}", image.display()))?;
    host.libvirtd.virsh(["pool-refresh", &host.pool]).await?;
    let (kube, ns, _provider, _metrics) = provider_namespace(&host).await?;
    let api: Api<LibvirtMachine> = Api::namespaced(kube.clone(), &ns);

    let mut secure = machine(
        "sb",
        &host,
        LibvirtDisk {
            backing_volume: Some("guest.qcow2".into()),
            install_media: None,
            size: Quantity("4Gi".into()),
        },
    );
    secure.spec.firmware = Firmware::Efi;
    secure.spec.secure_boot = true;
    secure.spec.memory = Quantity("1Gi".into());
    api.create(&PostParams::default(), &secure).await?;
    wait_machine(&api, "sb", "sb running", 180, |c| c.status == "True").await?;
    let domain = format!("{ns}-sb");

    // libvirt resolved the features to a secure loader; SMM is on as the XML asked.
    let xml = host.libvirtd.virsh(["dumpxml", &domain]).await?;
    assert!(xml.contains("secure='yes'"), "{xml}");
    assert!(xml.contains("<smm state='on'/>"), "{xml}");

    // From inside: the agent answers once the guest is up (30–60 s under TCG).
    let enforced = poll::until(
        "the guest agent reads SecureBoot",
        Duration::from_secs(240),
        || async {
            Ok(Some(
                banlieue_testenv::guest_agent::secure_boot(&host.libvirtd, &domain).await?,
            ))
        },
    )
    .await?;
    assert!(enforced, "the guest reports Secure Boot off");

    api.delete("sb", &DeleteParams::default()).await?;
    none_left(&api, "the machine deleted", 120).await?;
    assert!(!domain_names(&host).await?.contains(&domain));
    Ok(())
}

/// A machine with egress (its class's, ADR-0078) runs with a network filter of its own,
/// defined before its domain and referenced from its interface (libvirt instantiates it as the
/// domain starts): the filter denies link-local and allows what the class allows, then drops
/// the rest. A filter of that name someone else defined is not taken over: that machine
/// gets no domain and says `EgressFilterFailed`. Deleting a machine removes its filter only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_is_a_filter_of_the_machines_own_from_before_its_domain() -> Result<()> {
    use banlieue_api::egress::{ClassEgress, EgressProtocol, EgressRule};
    use banlieue_libvirt::NwFilter;
    let host = Host::start().await?;
    host.create_raw_volume("base.raw", 1 << 20).await?;
    let (kube, ns, _provider, _metrics) = provider_namespace(&host).await?;
    let api: Api<LibvirtMachine> = Api::namespaced(kube.clone(), &ns);
    let egress = ClassEgress {
        allow: vec![EgressRule {
            cidr: "10.0.0.0/8".into(),
            protocol: EgressProtocol::Tcp,
            port: Some(443),
            end_port: None,
        }],
        ..ClassEgress::default()
    };
    let client = host.client().await?;
    // Someone else's filter under the name the second machine's would take.
    let taken = format!("banlieue-egress-{ns}-taken");
    let foreign = format!(
        "<filter name='{taken}' chain='root'><rule action='accept' direction='out'><all/></rule></filter>"
    );
    NwFilter::define_xml(&client, &foreign).await?;

    for name in ["filtered", "taken"] {
        let mut m = machine(name, &host, backing("base.raw"));
        m.spec.egress = Some(egress.clone());
        api.create(&PostParams::default(), &m).await?;
    }
    wait_machine(&api, "filtered", "filtered running", 180, |c| {
        c.status == "True"
    })
    .await?;
    let domain = Domain::lookup_by_name(&client, &format!("{ns}-filtered"))
        .await?
        .context("the domain")?;
    assert_eq!(domain.get_state().await?.0, DomainState::Running);
    let xml = domain.get_xml_desc(flags::DomainXmlFlags::empty()).await?;
    let name = format!("banlieue-egress-{ns}-filtered");
    assert!(
        xml.contains(&format!("<filterref filter='{name}'/>")),
        "{xml}"
    );
    let filter = NwFilter::lookup_by_name(&client, &name)
        .await?
        .context("the machine's filter")?
        .xml_desc()
        .await?;
    // The test's network is isolated and has no address of the host's (no `<ip>`): of the
    // always-denied, link-local is what applies here (the network's own rows are the unit
    // tests' of `machine::egress`).
    let network = host.libvirtd.virsh(["net-dumpxml", &host.network]).await?;
    assert!(!network.contains("<ip"), "{network}");
    for expected in [
        "<all dstipaddr='169.254.0.0' dstipmask='16'/>",
        "<tcp dstipaddr='10.0.0.0' dstipmask='8' dstportstart='443'/>",
        "<all state='ESTABLISHED,RELATED'/>",
        "<rule action='drop' direction='out' priority='900'>",
    ] {
        assert!(filter.contains(expected), "{expected} not in {filter}");
    }

    let refused = wait_machine(&api, "taken", "taken refused", 120, |c| {
        c.reason == "EgressFilterFailed"
    })
    .await?;
    let message = ready(&refused).map(|c| c.message).unwrap_or_default();
    assert!(message.contains(&taken), "{message}");
    assert!(
        Domain::lookup_by_name(&client, &format!("{ns}-taken"))
            .await?
            .is_none(),
        "a domain without its filter was defined"
    );

    for name in ["filtered", "taken"] {
        api.delete(name, &DeleteParams::default()).await?;
    }
    none_left(&api, "machines deleted", 120).await?;
    assert!(NwFilter::lookup_by_name(&client, &name).await?.is_none());
    let kept = NwFilter::lookup_by_name(&client, &taken).await?;
    assert!(kept.is_some(), "someone else's filter was removed");
    Ok(())
}

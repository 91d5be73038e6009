//! The typed handles against a real libvirtd: connection calls, a domain's lifecycle, pools and
//! volumes (with ranged and sparse transfers), networks, network filters, lookups of missing
//! objects, a managed save and its restore, and the guest-agent calls without an agent.

use banlieue_libvirt::proto::remote::{self, procedures as rp};
use banlieue_libvirt::stream::{STREAM_CHUNK, TransferOptions};
use banlieue_libvirt::{
    Domain, DomainState, ErrorCode, Network, NwFilter, StoragePool, StorageVol, StorageVolType,
    flags, uuid_string,
};
use banlieue_testenv::libvirtd::LibvirtdOptions;

mod peer;

use peer::{connect, daemon, dir_pool, raw_volume_xml, tiny_domain_xml};

#[tokio::test]
async fn connection_calls_name_the_hypervisor_and_host() {
    let Some(d) = daemon(LibvirtdOptions::default()).await else {
        return;
    };
    let c = connect(&d).await;
    let version = c.version().await.expect("version");
    assert!(version >= 10_000_000, "QEMU 10 reports {version}");
    assert_eq!(c.lib_version().await.expect("lib version"), 11_003_000);
    let caps = c.capabilities().await.expect("capabilities");
    assert!(caps.contains("<capabilities>") && caps.contains("<arch>x86_64</arch>"));
    let host = c.hostname().await.expect("hostname");
    let virsh = d.virsh(["hostname"]).await.expect("virsh hostname");
    assert_eq!(host, virsh.trim(), "the same host name as virsh");
    let node = c.node_info().await.expect("node info");
    let nodeinfo = d.virsh(["nodeinfo"]).await.expect("virsh nodeinfo");
    let field = |name: &str| -> u64 {
        nodeinfo
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("{name} in {nodeinfo}"))
    };
    assert_eq!(
        node.memory_kib,
        field("Memory size:"),
        "the same memory as virsh"
    );
    assert_eq!(u64::from(node.cpus), field("CPU(s):"));
    assert_eq!(node.model, "x86_64");
}

#[tokio::test]
async fn a_tiny_domain_is_defined_started_destroyed_and_undefined() {
    let Some(d) = daemon(LibvirtdOptions::default()).await else {
        return;
    };
    let c = connect(&d).await;
    let name = "banlieue-handles-tiny";
    assert!(
        Domain::lookup_by_name(&c, name)
            .await
            .expect("lookup")
            .is_none(),
        "no such domain yet"
    );
    let dom = Domain::define_xml(&c, &tiny_domain_xml(name))
        .await
        .expect("defined");
    assert_eq!(dom.name(), name);
    assert_eq!(
        dom.get_state().await.expect("state").0,
        DomainState::Shutoff
    );
    let listed = c
        .list_all_domains(flags::ConnectListAllDomainsFlags::empty())
        .await
        .expect("list");
    assert!(listed.iter().any(|x| x.uuid() == dom.uuid()));
    let inactive = c
        .list_all_domains(flags::ConnectListAllDomainsFlags::ACTIVE)
        .await
        .expect("list active");
    assert!(inactive.iter().all(|x| x.name() != name), "not running yet");

    dom.create().await.expect("started");
    let (state, _) = dom.get_state().await.expect("state");
    assert_eq!(state, DomainState::Running);
    let running = Domain::lookup_by_name(&c, name)
        .await
        .expect("lookup")
        .expect("found");
    assert!(running.id() > 0, "a running domain has an id");
    assert_eq!(running.uuid_string(), dom.uuid_string());
    let xml = dom
        .get_xml_desc(flags::DomainXmlFlags::empty())
        .await
        .expect("xml");
    assert!(xml.contains(&format!("<name>{name}</name>")), "{xml}");
    assert!(xml.contains("52:54:00:12:34:56"), "{xml}");
    let inactive_xml = dom
        .get_xml_desc(flags::DomainXmlFlags::INACTIVE)
        .await
        .expect("inactive xml");
    assert!(
        !inactive_xml.contains("<alias"),
        "no live aliases in the inactive XML"
    );

    // A user-mode interface has no lease and no ARP entry: the call works and finds nothing
    // to report, or names only our MAC.
    let arp = dom
        .interface_addresses(banlieue_libvirt::InterfaceAddressesSource::Arp)
        .await
        .expect("ARP source");
    assert!(
        arp.iter()
            .all(|i| i.hwaddr.as_deref() == Some("52:54:00:12:34:56")),
        "{arp:?}"
    );
    let err = dom
        .interface_addresses(banlieue_libvirt::InterfaceAddressesSource::Agent)
        .await
        .expect_err("no agent in this guest");
    assert_eq!(
        err.remote().map(|r| r.code),
        Some(ErrorCode::AgentUnresponsive),
        "{err}"
    );

    assert!(dom.destroy_if_running().await.expect("destroyed"), "it ran");
    assert!(
        !dom.destroy_if_running().await.expect("idempotent"),
        "a second destroy finds it stopped"
    );
    let err = dom
        .destroy()
        .await
        .expect_err("raw destroy of a stopped domain");
    assert_eq!(
        err.remote().map(|r| r.code),
        Some(ErrorCode::OperationInvalid),
        "{err}"
    );
    assert_eq!(
        dom.get_state().await.expect("state").0,
        DomainState::Shutoff
    );
    dom.undefine_flags(
        flags::DomainUndefineFlags::NVRAM | flags::DomainUndefineFlags::MANAGED_SAVE,
    )
    .await
    .expect("undefined");
    assert!(
        Domain::lookup_by_name(&c, name)
            .await
            .expect("lookup")
            .is_none(),
        "gone"
    );
    let err = dom.get_state().await.expect_err("a stale handle");
    assert!(err.is_not_found(), "{err}");
}

#[tokio::test]
async fn the_agent_command_without_an_agent_is_a_typed_error() {
    let Some(d) = daemon(LibvirtdOptions::default()).await else {
        return;
    };
    let c = connect(&d).await;
    let dom = Domain::define_xml(&c, &tiny_domain_xml("banlieue-handles-agent"))
        .await
        .expect("defined");
    // Not running: libvirt refuses before looking for an agent.
    let err = dom
        .agent_command(r#"{"execute":"guest-ping"}"#, 5)
        .await
        .expect_err("not running");
    assert_eq!(
        err.remote().map(|r| r.code),
        Some(ErrorCode::OperationInvalid),
        "{err}"
    );
    dom.create().await.expect("started");
    // Running with an agent channel that no agent opened.
    let err = dom
        .agent_command(r#"{"execute":"guest-ping"}"#, 5)
        .await
        .expect_err("no agent");
    let remote = err.remote().expect("a libvirt error");
    assert_eq!(remote.code, ErrorCode::AgentUnresponsive, "{err}");
    assert!(
        remote
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("agent"),
        "{remote:?}"
    );
    dom.destroy().await.expect("destroyed");
    dom.undefine_flags(flags::DomainUndefineFlags::empty())
        .await
        .expect("undefined");
}

#[tokio::test]
async fn volumes_are_created_filled_read_back_and_deleted() {
    let Some(d) = daemon(LibvirtdOptions::default()).await else {
        return;
    };
    let c = connect(&d).await;
    assert!(
        StoragePool::lookup_by_name(&c, "vols")
            .await
            .expect("lookup")
            .is_none()
    );
    let pool = dir_pool(&c, &d, "vols").await;
    assert!(pool.is_active().await.expect("active"));
    let found = StoragePool::lookup_by_name(&c, "vols")
        .await
        .expect("lookup")
        .expect("found");
    assert_eq!(found.uuid(), pool.uuid());
    let pools = StoragePool::list_all(&c, flags::ConnectListAllStoragePoolsFlags::empty())
        .await
        .expect("pools");
    assert!(pools.iter().any(|p| p.name() == "vols"));
    let pool_xml = pool
        .get_xml_desc(flags::StorageXmlFlags::empty())
        .await
        .expect("pool xml");
    let dir = d.create_pool_dir("vols").expect("same dir");
    assert!(pool_xml.contains(&dir.display().to_string()), "{pool_xml}");

    assert!(
        StorageVol::lookup_by_name(&pool, "disk.raw")
            .await
            .expect("lookup")
            .is_none()
    );
    let size: u64 = 6 << 20;
    let vol = StorageVol::create_xml(
        &pool,
        &raw_volume_xml("disk.raw", size),
        flags::StorageVolCreateFlags::empty(),
    )
    .await
    .expect("created");
    let info = vol.get_info().await.expect("info");
    assert_eq!(info.kind, StorageVolType::File);
    assert_eq!(info.capacity, size);
    let path = vol.get_path().await.expect("path");
    assert_eq!(path, dir.join("disk.raw").display().to_string());
    assert_eq!(vol.key(), path, "a dir pool keys volumes by path");
    let vol_xml = vol.get_xml_desc().await.expect("volume xml");
    assert!(vol_xml.contains("<name>disk.raw</name>"), "{vol_xml}");

    // 1 MiB of data at 2 MiB, then 1 MiB of zeros and 1 MiB of data at 4 MiB, sparse, up to
    // the end (a sparse upload leaves the file ending where the stream ended).
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8 + 1).collect();
    let sent = vol
        .upload(
            &mut &data[..],
            TransferOptions::new()
                .offset(2 << 20)
                .length(data.len() as u64),
        )
        .await
        .expect("upload at an offset");
    assert_eq!(sent.data, data.len() as u64);
    let mut mixed = vec![0u8; 1 << 20];
    mixed.extend_from_slice(&data);
    let mut reports = Vec::new();
    let sent = vol
        .upload(
            &mut &mixed[..],
            TransferOptions::new()
                .offset(4 << 20)
                .length(mixed.len() as u64)
                .sparse(true)
                .progress(|t| reports.push(t)),
        )
        .await
        .expect("sparse upload");
    // One report per packet-sized chunk read, the last one the transfer's total.
    assert_eq!(
        reports.len(),
        mixed.len().div_ceil(STREAM_CHUNK),
        "{reports:?}"
    );
    assert_eq!(reports.last(), Some(&sent));
    assert!(
        reports
            .windows(2)
            .all(|w| w[0].data + w[0].holes < w[1].data + w[1].holes)
    );
    assert_eq!(sent.data + sent.holes, mixed.len() as u64);
    // Holes are found within each packet's chunk, so a few bytes at a chunk edge go as data.
    assert!(
        sent.holes >= (1 << 20) - 4096,
        "the zero MiB travels as a hole: {sent:?}"
    );

    let mut whole = Vec::new();
    vol.download(&mut whole, TransferOptions::new())
        .await
        .expect("download");
    assert_eq!(whole.len() as u64, size);
    assert!(whole[..2 << 20].iter().all(|&b| b == 0));
    assert!(whole[2 << 20..3 << 20] == data[..]);
    assert!(whole[3 << 20..5 << 20].iter().all(|&b| b == 0));
    assert!(whole[5 << 20..6 << 20] == data[..]);
    let local = d.dir().join("sparse-copy.raw");
    std::fs::write(&local, b"old bytes that must go").expect("a file with old data");
    let file = tokio::fs::OpenOptions::new()
        .write(true)
        .open(&local)
        .await
        .expect("open");
    let got = vol
        .download_to_file(file, TransferOptions::new().sparse(true))
        .await
        .expect("download to a sparse file");
    assert!(got.holes >= 3 << 20, "{got:?}");
    assert!(std::fs::read(&local).expect("read") == whole);
    let allocated =
        std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(&local).expect("stat")) * 512;
    assert!(
        allocated <= (3 << 20) + (64 << 10),
        "holes stay holes on disk: {allocated} bytes allocated for {size}"
    );
    let mut range = Vec::new();
    vol.download(
        &mut range,
        TransferOptions::new()
            .offset((2 << 20) + 10)
            .length(100)
            .sparse(true),
    )
    .await
    .expect("ranged download");
    assert!(range == data[10..110], "100 bytes from the offset");
    assert_eq!(
        vol.read_small(size - 1).await.expect("read_small"),
        None,
        "a volume over the limit is not read"
    );
    assert_eq!(
        vol.read_small(size).await.expect("read_small").as_deref(),
        Some(&whole[..]),
        "a volume within the limit is read whole"
    );
    assert!(
        std::fs::read(&path).expect("the file on the host") == whole,
        "the host file holds what was uploaded"
    );

    // A file dropped into the directory appears after a refresh.
    std::fs::write(dir.join("dropped.img"), b"x").expect("write");
    assert!(
        StorageVol::lookup_by_name(&pool, "dropped.img")
            .await
            .expect("lookup")
            .is_none()
    );
    pool.refresh().await.expect("refresh");
    let dropped = StorageVol::lookup_by_name(&pool, "dropped.img")
        .await
        .expect("lookup")
        .expect("found after refresh");
    assert_eq!(pool.list_all_volumes().await.expect("vols").len(), 2);

    vol.delete().await.expect("deleted");
    dropped.delete().await.expect("deleted");
    assert!(
        StorageVol::lookup_by_name(&pool, "disk.raw")
            .await
            .expect("lookup")
            .is_none()
    );
    assert!(!std::path::Path::new(&path).exists());
    let err = vol.get_info().await.expect_err("a stale handle");
    assert_eq!(
        err.remote().map(|r| r.code),
        Some(ErrorCode::NoStorageVol),
        "{err}"
    );
    pool.destroy().await.expect("pool stopped");
    pool.undefine().await.expect("pool undefined");
}

#[tokio::test]
async fn networks_are_listed_and_missing_ones_are_none() {
    let Some(d) = daemon(LibvirtdOptions::default()).await else {
        return;
    };
    let c = connect(&d).await;
    assert!(
        Network::lookup_by_name(&c, "no-such-network")
            .await
            .expect("lookup")
            .is_none()
    );
    // Defined, never started: no bridge is made.
    let defined = c
        .call::<rp::NetworkDefineXml>(&remote::RemoteNetworkDefineXmlArgs {
            xml: "<network><name>banlieue-handles-net</name><bridge name='virbr-bl9'/></network>"
                .into(),
        })
        .await
        .expect("network defined")
        .net;
    let net = Network::lookup_by_name(&c, "banlieue-handles-net")
        .await
        .expect("lookup")
        .expect("found");
    assert_eq!(net.uuid(), defined.uuid);
    assert!(!net.is_active().await.expect("is active"), "never started");
    let nets = Network::list_all(&c, flags::ConnectListAllNetworksFlags::empty())
        .await
        .expect("networks");
    let virsh = d
        .virsh(["net-list", "--all", "--name"])
        .await
        .expect("virsh net-list");
    let mut ours: Vec<&str> = nets.iter().map(Network::name).collect();
    let mut theirs: Vec<&str> = virsh.lines().filter(|l| !l.trim().is_empty()).collect();
    ours.sort_unstable();
    theirs.sort_unstable();
    assert_eq!(ours, theirs, "the same networks as virsh");
    assert!(ours.contains(&"banlieue-handles-net"));
    c.call::<rp::NetworkUndefine>(&remote::RemoteNetworkUndefineArgs { net: defined })
        .await
        .expect("undefined");
    assert!(
        Network::lookup_by_name(&c, "banlieue-handles-net")
            .await
            .expect("lookup")
            .is_none()
    );
}

#[tokio::test]
async fn nwfilters_are_defined_replaced_listed_and_undefined() {
    let Some(d) = daemon(LibvirtdOptions::default()).await else {
        return;
    };
    let c = connect(&d).await;
    let name = "banlieue-handles-nwfilter";
    assert!(
        NwFilter::lookup_by_name(&c, name)
            .await
            .expect("lookup")
            .is_none(),
        "no such filter yet"
    );
    // Outgoing TCP to 10.0.0.0/8 on `port`, then nothing else; `uuid` names the filter that a
    // definition replaces.
    let filter_xml = |uuid: Option<&str>, port: u16| {
        let uuid = uuid
            .map(|u| format!("<uuid>{u}</uuid>"))
            .unwrap_or_default();
        format!(
            "<filter name='{name}' chain='root'>{uuid}\
             <rule action='accept' direction='out' priority='100'>\
             <tcp dstipaddr='10.0.0.0' dstipmask='8' dstportstart='{port}'/></rule>\
             <rule action='drop' direction='inout' priority='1000'><all/></rule>\
             </filter>"
        )
    };
    let filter = NwFilter::define_xml(&c, &filter_xml(None, 443))
        .await
        .expect("defined");
    assert_eq!(filter.name(), name);
    let found = NwFilter::lookup_by_name(&c, name)
        .await
        .expect("lookup")
        .expect("found");
    assert_eq!(found.uuid(), filter.uuid());
    let uuid = uuid_string(&filter.uuid());
    let xml = found.xml_desc().await.expect("xml");
    assert!(xml.contains(&format!("<uuid>{uuid}</uuid>")), "{xml}");
    assert!(
        xml.contains("<tcp dstipaddr='10.0.0.0' dstipmask='8' dstportstart='443'/>"),
        "{xml}"
    );
    assert!(
        xml.contains("<rule action='drop' direction='inout' priority='1000'>"),
        "{xml}"
    );

    // Without the UUID, libvirt makes one up and finds the name taken by another filter.
    let err = NwFilter::define_xml(&c, &filter_xml(None, 22))
        .await
        .expect_err("a second filter of the name");
    assert_eq!(
        err.remote().map(|r| r.code),
        Some(ErrorCode::OperationFailed),
        "{err}"
    );
    assert!(
        filter
            .xml_desc()
            .await
            .expect("xml")
            .contains("dstportstart='443'"),
        "a refused definition leaves the filter as it was"
    );
    let replaced = NwFilter::define_xml(&c, &filter_xml(Some(&uuid), 22))
        .await
        .expect("replaced");
    assert_eq!(replaced.uuid(), filter.uuid());
    let xml = filter.xml_desc().await.expect("xml");
    assert!(
        xml.contains("dstportstart='22'") && !xml.contains("dstportstart='443'"),
        "{xml}"
    );

    let filters = NwFilter::list_all(&c).await.expect("filters");
    assert!(
        filters
            .iter()
            .any(|f| f.name() == name && f.uuid() == filter.uuid()),
        "listed"
    );
    // virsh prints a header, a rule, then one `UUID  name` line per filter.
    let virsh = d
        .virsh(["nwfilter-list"])
        .await
        .expect("virsh nwfilter-list");
    let mut theirs: Vec<(String, String)> = virsh
        .lines()
        .skip(2)
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            Some((words.next()?.to_string(), words.next()?.to_string()))
        })
        .collect();
    let mut ours: Vec<(String, String)> = filters
        .iter()
        .map(|f| (uuid_string(&f.uuid()), f.name().to_string()))
        .collect();
    ours.sort_unstable();
    theirs.sort_unstable();
    assert_eq!(ours, theirs, "the same filters as virsh");

    // XML that does not parse, and XML that parses with a value libvirt does not know.
    let bad = "banlieue-handles-nwfilter-bad";
    let err = NwFilter::define_xml(&c, &format!("<filter name='{bad}'><rule action='accept'"))
        .await
        .expect_err("not XML");
    assert_eq!(
        err.remote().map(|r| r.code),
        Some(ErrorCode::XmlDetail),
        "{err}"
    );
    let err = NwFilter::define_xml(
        &c,
        &format!(
            "<filter name='{bad}'><rule action='maybe' direction='out'><all/></rule></filter>"
        ),
    )
    .await
    .expect_err("no such action");
    assert_eq!(
        err.remote().map(|r| r.code),
        Some(ErrorCode::XmlError),
        "{err}"
    );
    assert!(
        NwFilter::lookup_by_name(&c, bad)
            .await
            .expect("lookup")
            .is_none(),
        "nothing was defined"
    );

    filter.undefine().await.expect("undefined");
    assert!(
        NwFilter::lookup_by_name(&c, name)
            .await
            .expect("lookup")
            .is_none(),
        "gone"
    );
    // What the lookup turned into `None`: libvirt's "no nwfilter".
    let err = c
        .call::<rp::NwfilterLookupByName>(&remote::RemoteNwfilterLookupByNameArgs {
            name: name.into(),
        })
        .await
        .expect_err("raw lookup of a missing filter");
    assert_eq!(
        err.remote().map(|r| r.code),
        Some(ErrorCode::NoNwfilter),
        "{err}"
    );
    assert!(err.is_not_found(), "{err}");
    let err = filter.xml_desc().await.expect_err("a stale handle");
    assert_eq!(
        err.remote().map(|r| r.code),
        Some(ErrorCode::NoNwfilter),
        "{err}"
    );
}

#[tokio::test]
async fn a_managed_save_stops_the_domain_and_create_restores_it() {
    let Some(d) = daemon(LibvirtdOptions::default()).await else {
        return;
    };
    let c = connect(&d).await;
    let name = "banlieue-handles-managed-save";
    let dom = Domain::define_xml(&c, &tiny_domain_xml(name))
        .await
        .expect("defined");
    dom.create().await.expect("started");
    assert!(!dom.has_managed_save_image().await.expect("asked"));

    let saving = std::time::Instant::now();
    dom.managed_save(flags::DomainSaveRestoreFlags::empty())
        .await
        .expect("saved");
    let saved_in = saving.elapsed();
    assert_eq!(
        dom.get_state().await.expect("state").0,
        DomainState::Shutoff
    );
    assert!(dom.has_managed_save_image().await.expect("asked"));
    // virsh, a client independent of this one, sees the same.
    let info = d.virsh(["dominfo", name]).await.expect("virsh dominfo");
    assert!(
        info.lines()
            .any(|l| l.starts_with("Managed save:") && l.trim_end().ends_with("yes")),
        "{info}"
    );

    let restoring = std::time::Instant::now();
    dom.create().await.expect("restored");
    let restored_in = restoring.elapsed();
    let (state, reason) = dom.get_state().await.expect("state");
    assert_eq!(state, DomainState::Running);
    // VIR_DOMAIN_RUNNING_RESTORED: it came back from the image, not from a fresh boot.
    assert_eq!(reason, 3, "running reason");
    assert!(
        !dom.has_managed_save_image().await.expect("asked"),
        "libvirt removes the image once restored"
    );
    eprintln!(
        "tiny domain: managed save {:.0} ms, restore {:.0} ms",
        saved_in.as_secs_f64() * 1000.0,
        restored_in.as_secs_f64() * 1000.0
    );

    // A removed image: the next start is a fresh boot.
    dom.managed_save(flags::DomainSaveRestoreFlags::empty())
        .await
        .expect("saved again");
    dom.managed_save_remove().await.expect("removed");
    assert!(!dom.has_managed_save_image().await.expect("asked"));
    dom.create().await.expect("booted");
    let (state, reason) = dom.get_state().await.expect("state");
    assert_eq!(state, DomainState::Running);
    // VIR_DOMAIN_RUNNING_BOOTED.
    assert_eq!(reason, 1, "running reason");

    // Undefined while saved, with MANAGED_SAVE: the image goes with the domain.
    dom.managed_save(flags::DomainSaveRestoreFlags::empty())
        .await
        .expect("saved a third time");
    let image = find_file(d.dir(), &format!("{name}.save")).expect("the image on disk");
    // Without MANAGED_SAVE, libvirt refuses to undefine a domain that has an image.
    let refused = dom
        .undefine_flags(flags::DomainUndefineFlags::empty())
        .await
        .expect_err("an image keeps its domain");
    assert_eq!(
        refused.remote().map(|r| r.code),
        Some(ErrorCode::OperationInvalid),
        "{refused}"
    );
    assert!(image.exists(), "a refused undefine keeps the image");
    dom.undefine_flags(flags::DomainUndefineFlags::MANAGED_SAVE)
        .await
        .expect("undefined");
    assert!(
        Domain::lookup_by_name(&c, name)
            .await
            .expect("lookup")
            .is_none()
    );
    assert!(!image.exists(), "{} outlived its domain", image.display());
}

#[tokio::test]
async fn setting_the_time_without_an_agent_is_a_typed_error() {
    let Some(d) = daemon(LibvirtdOptions::default()).await else {
        return;
    };
    let c = connect(&d).await;
    let dom = Domain::define_xml(&c, &tiny_domain_xml("banlieue-handles-set-time"))
        .await
        .expect("defined");
    dom.create().await.expect("started");
    let err = dom
        .set_time(1_800_000_000, 0, flags::DomainSetTimeFlags::empty())
        .await
        .expect_err("no agent");
    assert_eq!(
        err.remote().map(|r| r.code),
        Some(ErrorCode::AgentUnresponsive),
        "{err}"
    );
    dom.destroy().await.expect("destroyed");
    dom.undefine_flags(flags::DomainUndefineFlags::empty())
        .await
        .expect("undefined");
}

/// The first file named `name` below `dir`.
fn find_file(dir: &std::path::Path, name: &str) -> Option<std::path::PathBuf> {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).ok()?.flatten() {
            let path = entry.path();
            let kind = entry.file_type().ok()?;
            if kind.is_dir() && !kind.is_symlink() {
                stack.push(path);
            } else if entry.file_name().to_string_lossy() == name {
                return Some(path);
            }
        }
    }
    None
}

//! Typed events and typed statistics against a real libvirtd: each event here is caused by a
//! real call and must arrive typed as the daemon sent it; the statistics of a running domain
//! must agree with the domain's own calls. Events that need a guest operating system (watchdog,
//! power management, balloon, device removal: a USB unplug of a guest without one did not
//! reliably complete) or hardware faults are decoded in the crate's unit tests only.

use std::time::Duration;

use banlieue_libvirt::events::{
    DeviceAddedEvent, EventKind, EventStream, MetadataChangeEvent, MetadataType, NetworkEventType,
    NetworkEvents, RebootEvent, StoragePoolEventType, StoragePoolEvents, StoragePoolRefreshEvent,
    TunableEvent,
};
use banlieue_libvirt::flags::{
    ConnectGetAllDomainStatsFlags, DomainModificationImpact, DomainStatsTypes, DomainUndefineFlags,
    StorageVolCreateFlags,
};
use banlieue_libvirt::{Domain, DomainState, Network, StorageVol};
use banlieue_testenv::libvirtd::LibvirtdOptions;

mod peer;

use peer::{connect, daemon, dir_pool, raw_volume_xml, tiny_domain_xml};

/// The next event of the stream, within a deadline generous for TCG.
async fn next<E: EventKind>(events: &mut EventStream<E>) -> E {
    tokio::time::timeout(Duration::from_secs(30), events.next())
        .await
        .expect("an event within 30 s")
        .expect("the connection stays up")
        .expect("the event decodes")
}

#[tokio::test]
async fn domain_events_arrive_typed_from_real_calls() {
    let Some(d) = daemon(LibvirtdOptions::default()).await else {
        return;
    };
    let c = connect(&d).await;
    let pool = dir_pool(&c, &d, "events").await;
    let name = "banlieue-events";
    let dom = Domain::define_xml(&c, &tiny_domain_xml(name))
        .await
        .expect("defined");
    dom.create().await.expect("started");

    let mut reboots = EventStream::<RebootEvent>::subscribe(&c)
        .await
        .expect("reboot events");
    let mut metadata = EventStream::<MetadataChangeEvent>::subscribe(&c)
        .await
        .expect("metadata events");
    let mut tunables = EventStream::<TunableEvent>::subscribe(&c)
        .await
        .expect("tunable events");
    let mut added = EventStream::<DeviceAddedEvent>::subscribe(&c)
        .await
        .expect("device-added events");

    dom.reset().await.expect("reset");
    let e = next(&mut reboots).await;
    assert_eq!((e.domain.as_str(), e.uuid), (name, dom.uuid()));

    dom.set_metadata(
        MetadataType::Title,
        Some("a title"),
        None,
        DomainModificationImpact::LIVE,
    )
    .await
    .expect("set title");
    let e = next(&mut metadata).await;
    assert_eq!(e.domain, name);
    assert_eq!(e.kind, MetadataType::Title);
    assert_eq!(e.nsuri, None);
    let title = dom
        .get_metadata(MetadataType::Title, None, DomainModificationImpact::LIVE)
        .await
        .expect("get title");
    assert_eq!(title, "a title");

    dom.pin_vcpu(0, &[0], DomainModificationImpact::LIVE)
        .await
        .expect("pin vCPU 0 to host CPU 0");
    let e = next(&mut tunables).await;
    assert_eq!(e.domain, name);
    assert_eq!(
        e.params.str("cputune.vcpupin0"),
        Some("0"),
        "the pinning arrives as a typed string parameter: {:?}",
        e.params
    );

    let vol = StorageVol::create_xml(
        &pool,
        &raw_volume_xml("hotplug.raw", 1 << 20),
        StorageVolCreateFlags::empty(),
    )
    .await
    .expect("volume");
    let disk = format!(
        "<disk type='file' device='disk'><driver name='qemu' type='raw'/>\
         <source file='{}'/><target dev='sdb' bus='usb'/></disk>",
        vol.get_path().await.expect("path")
    );
    // A USB disk: the machine has a USB controller, and unlike PCI, USB hot-plug needs
    // neither ACPI nor the guest's consent.
    dom.attach_device(&disk, DomainModificationImpact::LIVE)
        .await
        .expect("hot-plug a disk");
    let e = next(&mut added).await;
    assert_eq!(e.domain, name);
    assert!(e.dev_alias.starts_with("usb-disk"), "{e:?}");

    // The statistics of the running domain agree with its own calls.
    let stats = c
        .all_domain_stats(
            DomainStatsTypes::STATE
                | DomainStatsTypes::CPU_TOTAL
                | DomainStatsTypes::BALLOON
                | DomainStatsTypes::VCPU
                | DomainStatsTypes::BLOCK,
            ConnectGetAllDomainStatsFlags::ACTIVE,
        )
        .await
        .expect("all domain stats");
    let ours = stats
        .iter()
        .find(|s| s.domain.name() == name)
        .expect("the running domain has a record");
    assert_eq!(ours.domain.uuid(), dom.uuid());
    assert_eq!(ours.state(), Some(DomainState::Running));
    assert_eq!(
        ours.state(),
        Some(dom.get_state().await.expect("state").0),
        "the same state as virDomainGetState"
    );
    assert!(
        ours.cpu_time_ns().is_some_and(|t| t > 0),
        "{:?}",
        ours.params
    );
    assert_eq!(
        ours.balloon_current_kib(),
        Some(64 * 1024),
        "the 64 MiB defined"
    );
    assert_eq!(ours.vcpu_current(), Some(1));
    assert_eq!(ours.block_count(), Some(1), "the hot-plugged disk");
    assert_eq!(ours.params.str("block.0.name"), Some("sdb"));
    let listed = c
        .domain_list_stats(
            std::slice::from_ref(&dom),
            DomainStatsTypes::STATE,
            ConnectGetAllDomainStatsFlags::empty(),
        )
        .await
        .expect("stats of one domain");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].state(), Some(DomainState::Running));

    dom.destroy().await.expect("destroyed");
    dom.undefine_flags(DomainUndefineFlags::empty())
        .await
        .expect("undefined");
    let none = c
        .all_domain_stats(
            DomainStatsTypes::STATE,
            ConnectGetAllDomainStatsFlags::ACTIVE,
        )
        .await
        .expect("stats");
    assert!(none.iter().all(|s| s.domain.name() != name));
}

#[tokio::test]
async fn storage_pool_and_network_events_follow_their_lifecycles() {
    let Some(d) = daemon(LibvirtdOptions::default()).await else {
        return;
    };
    let c = connect(&d).await;
    let mut pools = StoragePoolEvents::subscribe(&c).await.expect("pool events");
    let mut refreshes = EventStream::<StoragePoolRefreshEvent>::subscribe(&c)
        .await
        .expect("refresh events");
    let mut nets = NetworkEvents::subscribe(&c).await.expect("network events");

    // dir_pool defines, builds and starts.
    let pool = dir_pool(&c, &d, "evpool").await;
    let mut seen = Vec::new();
    for _ in 0..3 {
        let e = next(&mut pools).await;
        assert_eq!((e.pool.as_str(), e.uuid), ("evpool", pool.uuid()));
        seen.push(e.event);
    }
    assert_eq!(
        seen,
        [
            StoragePoolEventType::Defined,
            StoragePoolEventType::Created,
            StoragePoolEventType::Started
        ]
    );
    pool.refresh().await.expect("refresh");
    assert_eq!(next(&mut refreshes).await.pool, "evpool");
    pool.destroy().await.expect("stopped");
    assert_eq!(next(&mut pools).await.event, StoragePoolEventType::Stopped);
    pool.undefine().await.expect("undefined");
    assert_eq!(
        next(&mut pools).await.event,
        StoragePoolEventType::Undefined
    );

    // An isolated network with no addresses: nothing for dnsmasq to serve.
    let net = Network::define_xml(
        &c,
        "<network><name>banlieue-evnet</name><bridge name='blvev0'/></network>",
    )
    .await
    .expect("network defined");
    let e = next(&mut nets).await;
    assert_eq!((e.network.as_str(), e.uuid), ("banlieue-evnet", net.uuid()));
    assert_eq!(e.event, NetworkEventType::Defined);
    net.create().await.expect("network started");
    assert_eq!(next(&mut nets).await.event, NetworkEventType::Started);
    net.destroy().await.expect("network stopped");
    assert_eq!(next(&mut nets).await.event, NetworkEventType::Stopped);
    net.undefine().await.expect("network undefined");
    assert_eq!(next(&mut nets).await.event, NetworkEventType::Undefined);
}

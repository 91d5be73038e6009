//! The client's core behaviours against each libvirt it is tested with, by the same test
//! bodies: Debian 12's own libvirt 9.0 with QEMU 7.2 (a private root built by
//! `scripts/setup.d/35-libvirtd-9.sh`, run chrooted) and the machine's libvirt 11.3 with
//! QEMU 10.0. Over TLS and over the unix socket: the open sequence and versions, a domain's
//! lifecycle with its events, pools and volumes up and down, the guest-agent event
//! subscription and keepalive; and a procedure newer than 9.0, which 9.0 refuses as
//! unsupported while 11.3 serves it.
//!
//! A missing 9.0 root fails these tests with a message naming the setup script, unless
//! `BANLIEUE_ALLOW_MISSING_PEERS=1` (then they are skipped loudly).

use std::time::Duration;

use banlieue_libvirt::events::{
    AgentLifecycleEvents, AgentLifecycleReason, AgentLifecycleState, DomainEventType, DomainEvents,
};
use banlieue_libvirt::proto::remote::{self, procedures as rp};
use banlieue_libvirt::stream::TransferOptions;
use banlieue_libvirt::{Client, ClientOptions, Domain, DomainState, Error, StorageVol, flags};
use banlieue_testenv::libvirtd::{LibvirtRoot, Libvirtd, LibvirtdOptions};

mod peer;

/// The libvirt a test runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    /// Debian 12's own, from the private root.
    Debian12,
    /// The machine's own (bookworm-backports).
    Host,
}

impl Version {
    /// libvirt's version number, as `CONNECT_GET_LIB_VERSION` reports it.
    fn lib_version(self) -> u64 {
        match self {
            Version::Debian12 => 9_000_000,
            Version::Host => 11_003_000,
        }
    }

    /// QEMU's major and minor version (its micro differs between Debian updates).
    fn qemu(self) -> (u64, u64) {
        match self {
            Version::Debian12 => (7, 2),
            Version::Host => (10, 0),
        }
    }

    /// Starts a daemon of this version, or `None` when it is not installed and missing peers
    /// may be skipped.
    async fn start(self, options: LibvirtdOptions) -> Option<Libvirtd> {
        match self {
            Version::Debian12 => {
                let root = LibvirtRoot::debian_12();
                if !root.available().expect("libvirt 9.0 root is built") {
                    return None;
                }
                // The stamp is written by the script from dpkg; the test's constant must
                // agree with what was installed, not merely with itself.
                let installed = root
                    .package_version("libvirt-daemon")
                    .expect("the root records its libvirt");
                assert!(installed.starts_with("9.0.0-"), "{installed}");
                let options = options.with_root(root.path());
                Some(Libvirtd::start(options).await.expect("libvirtd 9.0 starts"))
            }
            Version::Host => peer::daemon(options).await,
        }
    }
}

/// How the client reaches the daemon.
#[derive(Debug, Clone, Copy)]
enum Transport {
    Tls,
    Unix,
}

async fn connect_with(d: &Libvirtd, transport: Transport, opts: ClientOptions) -> Client {
    match transport {
        Transport::Tls => {
            let (id, ca) = peer::identity(d);
            Client::connect_with(&d.tls_uri(), &id, &ca, opts)
                .await
                .expect("connects over TLS")
        }
        Transport::Unix => {
            let uri = format!(
                "qemu+unix:///system?socket={}",
                d.run_dir().join("libvirt-sock").display()
            );
            Client::connect_plain_with(&uri, opts)
                .await
                .expect("connects over the unix socket")
        }
    }
}

async fn connect(d: &Libvirtd, transport: Transport) -> Client {
    connect_with(d, transport, ClientOptions::default()).await
}

/// A guest with no disk and no display, with a guest-agent channel no agent opens: enough for
/// define, start and destroy under TCG, and for the agent's lifecycle event at start.
fn tiny_domain_xml(name: &str) -> String {
    format!(
        "<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>\
         <os><type arch='x86_64' machine='pc'>hvm</type></os>\
         <devices><video><model type='none'/></video>\
         <channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>\
         </devices></domain>"
    )
}

/// Deterministic bytes with a zero MiB in the middle, so a sparse transfer has a hole.
fn payload(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            if (1 << 20..2 << 20).contains(&i) {
                0
            } else {
                (i % 251) as u8 + 1
            }
        })
        .collect()
}

async fn handshake_and_versions(version: Version, transport: Transport) {
    let Some(d) = version.start(LibvirtdOptions::default()).await else {
        return;
    };
    let c = connect(&d, transport).await;
    assert_eq!(
        c.lib_version().await.expect("lib version"),
        version.lib_version()
    );
    let hv = c.version().await.expect("hypervisor version");
    assert_eq!((hv / 1_000_000, hv / 1_000 % 1_000), version.qemu(), "{hv}");
    let uri = c.call::<rp::ConnectGetUri>(&()).await.expect("uri").uri;
    assert_eq!(uri, "qemu:///system");
    let caps = c.capabilities().await.expect("capabilities");
    assert!(
        caps.contains("<capabilities>") && caps.contains("<arch>x86_64</arch>"),
        "{caps}"
    );
    assert!(!c.hostname().await.expect("hostname").is_empty());
    // virsh (the machine's, 11.3) is an independent client of the same daemon.
    let virsh = d
        .virsh(["version", "--daemon"])
        .await
        .expect("virsh version");
    let (major, minor) = (
        version.lib_version() / 1_000_000,
        version.lib_version() / 1_000 % 1_000,
    );
    assert!(
        virsh.contains(&format!("Running against daemon: {major}.{minor}.0")),
        "{virsh}"
    );
    c.close().await.expect("CONNECT_CLOSE");
}

async fn domain_lifecycle_and_events(version: Version, transport: Transport) {
    let Some(d) = version.start(LibvirtdOptions::default()).await else {
        return;
    };
    let c = connect(&d, transport).await;
    let mut events = DomainEvents::subscribe(&c)
        .await
        .expect("lifecycle events registered");
    let mut agent = AgentLifecycleEvents::subscribe(&c)
        .await
        .expect("agent lifecycle events registered");
    let name = "banlieue-compat-lifecycle";
    assert!(
        Domain::lookup_by_name(&c, name)
            .await
            .expect("lookup")
            .is_none()
    );
    let dom = Domain::define_xml(&c, &tiny_domain_xml(name))
        .await
        .expect("defined");
    let listed = c
        .list_all_domains(flags::ConnectListAllDomainsFlags::empty())
        .await
        .expect("list");
    assert!(listed.iter().any(|x| x.uuid() == dom.uuid()), "{listed:?}");
    assert_eq!(
        dom.get_state().await.expect("state").0,
        DomainState::Shutoff
    );
    dom.create().await.expect("started");
    assert_eq!(
        dom.get_state().await.expect("state").0,
        DomainState::Running
    );
    let active = c
        .list_all_domains(flags::ConnectListAllDomainsFlags::ACTIVE)
        .await
        .expect("list active");
    assert!(active.iter().any(|x| x.name() == name), "{active:?}");
    assert!(dom.destroy_if_running().await.expect("destroyed"), "it ran");
    dom.undefine_flags(flags::DomainUndefineFlags::empty())
        .await
        .expect("undefined");
    let err = dom.get_state().await.expect_err("a stale handle");
    assert!(err.is_not_found(), "{err}");

    // defined, started, stopped, undefined arrive in this order (QEMU adds resumed and
    // others in between).
    let mut seen = Vec::new();
    while seen.last() != Some(&DomainEventType::Undefined) {
        let e = tokio::time::timeout(Duration::from_secs(30), events.next())
            .await
            .expect("event in time")
            .expect("stream open")
            .expect("decodes");
        if e.domain == name {
            seen.push(e.event);
        }
    }
    let milestones: Vec<_> = seen
        .iter()
        .copied()
        .filter(|e| {
            [
                DomainEventType::Defined,
                DomainEventType::Started,
                DomainEventType::Stopped,
                DomainEventType::Undefined,
            ]
            .contains(e)
        })
        .collect();
    assert_eq!(
        milestones,
        [
            DomainEventType::Defined,
            DomainEventType::Started,
            DomainEventType::Stopped,
            DomainEventType::Undefined
        ],
        "all events: {seen:?}"
    );
    // At start libvirt reports the agent channel's state, here: nobody connected.
    let e = tokio::time::timeout(Duration::from_secs(30), agent.next())
        .await
        .expect("agent event in time")
        .expect("stream open")
        .expect("decodes");
    assert_eq!(e.domain, name);
    assert_eq!(
        (e.state, e.reason),
        (
            AgentLifecycleState::Disconnected,
            AgentLifecycleReason::DomainStarted
        ),
        "{e:?}"
    );
}

async fn pools_and_volumes(version: Version, transport: Transport) {
    let Some(d) = version.start(LibvirtdOptions::default()).await else {
        return;
    };
    let c = connect(&d, transport).await;
    let pool = peer::dir_pool(&c, &d, "compat").await;
    let dir = d.create_pool_dir("compat").expect("pool dir");
    assert!(pool.is_active().await.expect("active"));
    let size = 3 << 20;
    let vol = StorageVol::create_xml(
        &pool,
        &peer::raw_volume_xml("disk.raw", size as u64),
        flags::StorageVolCreateFlags::empty(),
    )
    .await
    .expect("volume created");
    assert_eq!(vol.get_info().await.expect("info").capacity, size as u64);

    let data = payload(size);
    let sent = vol
        .upload(
            &mut &data[..],
            TransferOptions::new().length(size as u64).sparse(true),
        )
        .await
        .expect("sparse upload");
    assert_eq!(sent.data + sent.holes, size as u64);
    // Holes are found within each packet's chunk, whose edges do not fall on the MiB's.
    assert!(
        sent.holes >= 1 << 19,
        "the zero MiB travels as holes: {sent:?}"
    );
    // The daemon wrote the file the host sees; not this client's idea of it.
    let path = vol.get_path().await.expect("path");
    assert_eq!(path, dir.join("disk.raw").display().to_string());
    assert!(std::fs::read(&path).expect("the volume's file") == data);

    let mut back = Vec::new();
    vol.download(&mut back, TransferOptions::new())
        .await
        .expect("download");
    assert!(back == data, "downloaded bytes differ from uploaded ones");
    let mut sparse = Vec::new();
    let got = vol
        .download(&mut sparse, TransferOptions::new().sparse(true))
        .await
        .expect("sparse download");
    assert!(sparse == data && got.holes > 0, "{got:?}");

    vol.delete().await.expect("deleted");
    assert!(!std::path::Path::new(&path).exists());
    assert!(
        StorageVol::lookup_by_name(&pool, "disk.raw")
            .await
            .expect("lookup")
            .is_none()
    );
    pool.destroy().await.expect("pool stopped");
    pool.undefine().await.expect("pool undefined");
}

async fn keepalive_detects_a_stopped_daemon(version: Version) {
    let Some(mut d) = version.start(LibvirtdOptions::default()).await else {
        return;
    };
    let opts = ClientOptions {
        keepalive_interval: Duration::from_secs(1),
        keepalive_count: 3,
        call_timeout: None,
        ..Default::default()
    };
    let c = connect_with(&d, Transport::Tls, opts).await;
    // Idle for more than three intervals: the daemon answers the pings.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    c.lib_version().await.expect("alive after idling");
    d.suspend().expect("SIGSTOP");
    let started = std::time::Instant::now();
    let pending = c.lib_version().await;
    let waited = started.elapsed();
    d.resume().expect("SIGCONT");
    assert!(
        matches!(pending, Err(Error::ConnectionLost(_))),
        "{pending:?}"
    );
    assert!(waited < Duration::from_secs(10), "{waited:?}");
    assert!(!c.is_alive());
}

/// `NETWORK_SET_METADATA` and `NETWORK_GET_METADATA` (444 and 445) came with libvirt 9.7; 9.0
/// stops at 443.
async fn a_procedure_newer_than_the_daemon(version: Version) {
    let Some(d) = version.start(LibvirtdOptions::default()).await else {
        return;
    };
    let c = connect(&d, Transport::Tls).await;
    // Defined, never started: no bridge is made.
    let net = c
        .call::<rp::NetworkDefineXml>(&remote::RemoteNetworkDefineXmlArgs {
            xml: "<network><name>banlieue-compat-net</name><bridge name='virbr-blc'/></network>"
                .into(),
        })
        .await
        .expect("network defined")
        .net;
    const DESCRIPTION: i32 = 0; // VIR_NETWORK_METADATA_DESCRIPTION
    let set = c
        .call::<rp::NetworkSetMetadata>(&remote::RemoteNetworkSetMetadataArgs {
            network: net.clone(),
            r#type: DESCRIPTION,
            metadata: Some("set by banlieue".into()),
            key: None,
            uri: None,
            flags: 0,
        })
        .await;
    let get = c
        .call::<rp::NetworkGetMetadata>(&remote::RemoteNetworkGetMetadataArgs {
            network: net.clone(),
            r#type: DESCRIPTION,
            uri: None,
            flags: 0,
        })
        .await;
    match version {
        Version::Debian12 => {
            for (err, number, name) in [
                (
                    set.expect_err("9.0 does not know it"),
                    444,
                    "REMOTE_PROC_NETWORK_SET_METADATA",
                ),
                (
                    get.expect_err("9.0 does not know it"),
                    445,
                    "REMOTE_PROC_NETWORK_GET_METADATA",
                ),
            ] {
                assert!(err.is_unsupported(), "{err:?}");
                assert!(!err.is_transient() && !err.is_not_found(), "{err}");
                let remote = err.remote().expect("a libvirt error");
                assert_eq!(remote.unknown_procedure(), Some(number), "{remote:?}");
                assert_eq!(
                    err.to_string(),
                    format!(
                        "libvirt: unknown procedure: {number} (VIR_ERR_RPC; the daemon's \
                         libvirt predates {name})"
                    )
                );
            }
        }
        Version::Host => {
            set.expect("11.3 sets a network's description");
            assert_eq!(get.expect("and reads it back").metadata, "set by banlieue");
        }
    }
    // Either way the connection carries on.
    c.call::<rp::NetworkUndefine>(&remote::RemoteNetworkUndefineArgs { net })
        .await
        .expect("network undefined");
}

/// The names under the root's directories that an instance lays its own over: the daemon
/// must write through to the instance, never into the cached root.
fn root_listing(root: &std::path::Path) -> Vec<String> {
    let mut names = Vec::new();
    for dir in [
        "tmp",
        "run",
        "dev",
        "var/log",
        "etc/libvirt",
        "var/lib/libvirt",
    ] {
        for entry in std::fs::read_dir(root.join(dir)).expect("a root directory") {
            names.push(format!(
                "{dir}/{}",
                entry.expect("entry").file_name().to_string_lossy()
            ));
        }
    }
    names.sort();
    names
}

/// The chrooted daemon and its guest live in the instance: dropping it stops both and leaves
/// no mount and no file in the cached root.
#[tokio::test]
async fn a_daemon_from_the_root_leaves_the_root_as_it_was() {
    let root = LibvirtRoot::debian_12();
    if !root.available().expect("libvirt 9.0 root is built") {
        return;
    }
    let before = root_listing(root.path());
    let Some(d) = Version::Debian12.start(LibvirtdOptions::default()).await else {
        return;
    };
    let c = connect(&d, Transport::Tls).await;
    let dom = Domain::define_xml(&c, &tiny_domain_xml("banlieue-compat-cleanup"))
        .await
        .expect("defined");
    dom.create().await.expect("started");
    let guests = d.guest_pids();
    assert!(!guests.is_empty(), "QEMU's pid file is in the instance");
    let daemon = d.pid();
    drop(c);
    drop(d);
    for pid in guests.iter().chain([&daemon]) {
        // A zombie counts as gone: its parent (init, for QEMU) reaps it in its own time.
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = state.rsplit_once(')').map(|(_, rest)| rest.trim_start());
        assert!(
            state.is_none_or(|s| s.starts_with('Z')),
            "process {pid} outlived its instance: {state:?}"
        );
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let root_path = root.path().display().to_string();
    assert!(
        !mounts.lines().any(|l| l.contains(&root_path)),
        "no mount under the root outside the daemon's namespace:\n{mounts}"
    );
    assert_eq!(root_listing(root.path()), before);
}

/// The same bodies for each version, as separate tests so that one failing names its version.
macro_rules! against {
    ($module:ident, $version:expr) => {
        mod $module {
            use super::*;

            #[tokio::test]
            async fn handshake_and_versions_over_tls() {
                handshake_and_versions($version, Transport::Tls).await;
            }

            #[tokio::test]
            async fn handshake_and_versions_over_unix() {
                handshake_and_versions($version, Transport::Unix).await;
            }

            #[tokio::test]
            async fn domain_lifecycle_and_events_over_tls() {
                domain_lifecycle_and_events($version, Transport::Tls).await;
            }

            #[tokio::test]
            async fn domain_lifecycle_and_events_over_unix() {
                domain_lifecycle_and_events($version, Transport::Unix).await;
            }

            #[tokio::test]
            async fn pools_and_volumes_over_tls() {
                pools_and_volumes($version, Transport::Tls).await;
            }

            #[tokio::test]
            async fn pools_and_volumes_over_unix() {
                pools_and_volumes($version, Transport::Unix).await;
            }

            #[tokio::test]
            async fn keepalive_detects_a_stopped_daemon() {
                super::keepalive_detects_a_stopped_daemon($version).await;
            }

            #[tokio::test]
            async fn a_procedure_newer_than_the_daemon() {
                super::a_procedure_newer_than_the_daemon($version).await;
            }
        }
    };
}

against!(libvirt_9_0, Version::Debian12);
against!(libvirt_11_3, Version::Host);

//! The client against a real libvirtd (TLS on loopback, throwaway PKI): the open sequence,
//! calls, typed errors, volumes up and down, events, concurrency, cancellation, keepalive and
//! TLS refusals. `virsh` is the independent second client.

use std::time::Duration;

use banlieue_libvirt::events::DomainEvents;
use banlieue_libvirt::proto::remote::{self, procedures as rp};
use banlieue_libvirt::stream::{Transfer, TransferOptions};
use banlieue_libvirt::{
    CaBundle, Client, ClientOptions, Error, ErrorCode, Identity, StorageVol, flags,
};
use banlieue_testenv::libvirtd::{Libvirtd, LibvirtdOptions};

async fn daemon(options: LibvirtdOptions) -> Option<Libvirtd> {
    if !Libvirtd::available().expect("libvirtd is installed (run scripts/setup)") {
        return None;
    }
    Some(Libvirtd::start(options).await.expect("libvirtd starts"))
}

fn identity(d: &Libvirtd) -> (Identity, CaBundle) {
    let id =
        Identity::from_files(&d.client_cert_path(), &d.client_key_path()).expect("client identity");
    let ca = CaBundle::from_file(&d.ca_cert_path()).expect("CA");
    (id, ca)
}

async fn connect(d: &Libvirtd) -> Client {
    let (id, ca) = identity(d);
    Client::connect(&d.tls_uri(), &id, &ca)
        .await
        .expect("connects")
}

async fn define_pool(c: &Client, d: &Libvirtd, name: &str) -> remote::RemoteNonnullStoragePool {
    let path = d.create_pool_dir(name).expect("pool dir");
    let xml = format!(
        "<pool type='dir'><name>{name}</name><target><path>{}</path></target></pool>",
        path.display()
    );
    let pool = c
        .call::<rp::StoragePoolDefineXml>(&remote::RemoteStoragePoolDefineXmlArgs { xml, flags: 0 })
        .await
        .expect("pool defined")
        .pool;
    c.call::<rp::StoragePoolBuild>(&remote::RemoteStoragePoolBuildArgs {
        pool: pool.clone(),
        flags: 0,
    })
    .await
    .expect("built");
    c.call::<rp::StoragePoolCreate>(&remote::RemoteStoragePoolCreateArgs {
        pool: pool.clone(),
        flags: 0,
    })
    .await
    .expect("started");
    pool
}

async fn create_volume(
    c: &Client,
    pool: &remote::RemoteNonnullStoragePool,
    name: &str,
    format: &str,
    bytes: u64,
) -> remote::RemoteNonnullStorageVol {
    let xml = format!(
        "<volume><name>{name}</name><capacity unit='bytes'>{bytes}</capacity><allocation>0</allocation><target><format type='{format}'/></target></volume>"
    );
    c.call::<rp::StorageVolCreateXml>(&remote::RemoteStorageVolCreateXmlArgs {
        pool: pool.clone(),
        xml,
        flags: 0,
    })
    .await
    .expect("volume created")
    .vol
}

/// Deterministic bytes with some long zero runs, so sparse transfers have holes to skip.
fn payload(len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    let mut x: u32 = 0x1234_5678;
    for (i, b) in v.iter_mut().enumerate() {
        if (i / (1 << 20)) % 4 == 3 {
            continue; // every fourth MiB stays zero
        }
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        *b = x as u8;
    }
    v
}

#[tokio::test]
async fn open_sequence_and_basic_calls() {
    let Some(d) = daemon(LibvirtdOptions::default()).await else {
        return;
    };
    let c = connect(&d).await;
    let version = c
        .call::<rp::ConnectGetVersion>(&())
        .await
        .expect("version")
        .hv_ver;
    assert!(version >= 10_000_000, "QEMU 10 reports {version}");
    let libvirt = c
        .call::<rp::ConnectGetLibVersion>(&())
        .await
        .expect("libversion")
        .lib_ver;
    assert_eq!(libvirt, 11_003_000, "libvirt 11.3.0");
    let uri = c.call::<rp::ConnectGetUri>(&()).await.expect("uri").uri;
    assert_eq!(
        uri, "qemu:///system",
        "the daemon was asked to open the server-side URI"
    );
    let host = c
        .call::<rp::ConnectGetHostname>(&())
        .await
        .expect("hostname")
        .hostname;
    assert!(!host.is_empty());
    let caps = c
        .call::<rp::ConnectGetCapabilities>(&())
        .await
        .expect("capabilities")
        .capabilities;
    assert!(
        caps.contains("<capabilities>") && caps.contains("<guest>"),
        "{caps}"
    );
    c.close().await.expect("CONNECT_CLOSE");
}

#[tokio::test]
async fn missing_objects_are_typed_not_found() {
    let Some(d) = daemon(LibvirtdOptions::default()).await else {
        return;
    };
    let c = connect(&d).await;
    let err = c
        .call::<rp::DomainLookupByName>(&remote::RemoteDomainLookupByNameArgs {
            name: "no-such-domain".into(),
        })
        .await
        .expect_err("no such domain");
    assert!(err.is_not_found(), "{err}");
    let remote = err.remote().expect("a libvirt error");
    assert_eq!(remote.code, ErrorCode::NoDomain);
    assert!(
        remote
            .message
            .as_deref()
            .unwrap_or("")
            .contains("no-such-domain"),
        "{remote:?}"
    );
    let err = c
        .call::<rp::StoragePoolLookupByName>(&remote::RemoteStoragePoolLookupByNameArgs {
            name: "nope".into(),
        })
        .await
        .expect_err("no such pool");
    assert_eq!(err.remote().map(|r| r.code), Some(ErrorCode::NoStoragePool));
    // The connection is still usable after errors.
    c.call::<rp::ConnectGetVersion>(&())
        .await
        .expect("still works");
}

#[tokio::test]
async fn pools_and_volumes_upload_download_and_agree_with_virsh() {
    let Some(d) = daemon(LibvirtdOptions::default()).await else {
        return;
    };
    let c = connect(&d).await;
    let pool = define_pool(&c, &d, "images").await;
    let names = c
        .call::<rp::ConnectListAllStoragePools>(&remote::RemoteConnectListAllStoragePoolsArgs {
            need_results: 1,
            flags: 0,
        })
        .await
        .expect("pools");
    assert!(names.pools.iter().any(|p| p.name == "images"));
    let size = 64 << 20;
    let data = payload(size);
    let raw = create_volume(&c, &pool, "upload.raw", "raw", size as u64).await;
    let qcow = create_volume(&c, &pool, "disk.qcow2", "qcow2", 1 << 30).await;
    assert_eq!(qcow.name, "disk.qcow2");

    let raw = StorageVol::from_raw(&c, raw);
    let sent = raw
        .upload(&mut &data[..], TransferOptions::new().length(size as u64))
        .await
        .expect("upload");
    assert_eq!(
        sent,
        Transfer {
            data: size as u64,
            holes: 0
        }
    );

    let mut back = Vec::new();
    let got = raw
        .download(&mut back, TransferOptions::new())
        .await
        .expect("download");
    assert_eq!(got.data + got.holes, size as u64);
    assert!(back == data, "downloaded bytes differ from uploaded ones");

    // virsh, an independent client, reads the same bytes.
    let out = d.dir().join("virsh-download.raw");
    d.virsh([
        "vol-download",
        "--pool",
        "images",
        "upload.raw",
        out.to_str().expect("utf-8 path"),
    ])
    .await
    .expect("virsh vol-download");
    assert!(
        std::fs::read(&out).expect("virsh wrote it") == data,
        "virsh sees different bytes"
    );
}

#[tokio::test]
async fn sparse_upload_skips_zeros_on_the_wire() {
    let Some(d) = daemon(LibvirtdOptions::default()).await else {
        return;
    };
    let c = connect(&d).await;
    let pool = define_pool(&c, &d, "sparse").await;
    let size = 16 << 20;
    let data = payload(size);
    let vol = create_volume(&c, &pool, "sparse.raw", "raw", size as u64).await;
    let vol = StorageVol::from_raw(&c, vol);
    let sent = vol
        .upload(
            &mut &data[..],
            TransferOptions::new().length(size as u64).sparse(true),
        )
        .await
        .expect("sparse upload");
    assert_eq!(sent.data + sent.holes, size as u64);
    assert!(
        sent.holes >= (size as u64) / 4 - (1 << 20),
        "zero MiBs travel as holes: {sent:?}"
    );
    let mut back = Vec::new();
    let got = vol
        .download(&mut back, TransferOptions::new().sparse(true))
        .await
        .expect("sparse download");
    assert!(back == data, "same content after a sparse round trip");
    assert!(got.holes > 0, "holes come back as holes: {got:?}");
}

#[tokio::test]
async fn a_domain_lifecycle_with_efi_and_tpm_and_its_events() {
    let Some(d) = daemon(LibvirtdOptions::default()).await else {
        return;
    };
    let c = connect(&d).await;
    let mut events = DomainEvents::subscribe(&c)
        .await
        .expect("events registered");
    let name = "banlieue-client-lifecycle";
    let xml = format!(
        "<domain type='qemu'><name>{name}</name><memory unit='MiB'>128</memory><vcpu>1</vcpu><features><acpi/></features>\
         <os firmware='efi'><type arch='x86_64' machine='q35'>hvm</type>\
         <firmware><feature enabled='no' name='secure-boot'/><feature enabled='no' name='enrolled-keys'/></firmware></os>\
         <devices><video><model type='none'/></video><tpm model='tpm-crb'><backend type='emulator' version='2.0'/></tpm></devices></domain>"
    );
    let dom = c
        .call::<rp::DomainDefineXml>(&remote::RemoteDomainDefineXmlArgs { xml })
        .await
        .expect("defined")
        .dom;
    c.call::<rp::DomainCreate>(&remote::RemoteDomainCreateArgs { dom: dom.clone() })
        .await
        .expect("started");
    let nvram = c
        .call::<rp::DomainGetXmlDesc>(&remote::RemoteDomainGetXmlDescArgs {
            dom: dom.clone(),
            flags: 0,
        })
        .await
        .expect("xml")
        .xml;
    let vars = nvram
        .split("<nvram")
        .nth(1)
        .and_then(|s| s.split('>').nth(1))
        .and_then(|s| s.split('<').next())
        .map(str::to_string);
    c.call::<rp::DomainDestroy>(&remote::RemoteDomainDestroyArgs { dom: dom.clone() })
        .await
        .expect("destroyed");
    let undefine = flags::DomainUndefineFlags::NVRAM
        | flags::DomainUndefineFlags::TPM
        | flags::DomainUndefineFlags::MANAGED_SAVE;
    c.call::<rp::DomainUndefineFlags>(&remote::RemoteDomainUndefineFlagsArgs {
        dom: dom.clone(),
        flags: undefine.bits(),
    })
    .await
    .expect("undefined");
    let err = c
        .call::<rp::DomainLookupByName>(&remote::RemoteDomainLookupByNameArgs { name: name.into() })
        .await
        .expect_err("gone");
    assert!(err.is_not_found(), "{err}");

    // defined(0), started(2), stopped(5), undefined(1) arrive in this order (QEMU adds
    // resumed(4) and shutdown(6) in between).
    let mut seen = Vec::new();
    while seen.last() != Some(&1) {
        let e = tokio::time::timeout(Duration::from_secs(30), events.next())
            .await
            .expect("event in time")
            .expect("stream open")
            .expect("decodes");
        if e.domain == name {
            seen.push(e.event.raw());
        }
    }
    let milestones: Vec<i32> = seen
        .iter()
        .copied()
        .filter(|e| [0, 1, 2, 5].contains(e))
        .collect();
    assert_eq!(milestones, vec![0, 2, 5, 1], "all events: {seen:?}");
    if let Some(vars) = vars {
        assert!(
            !std::path::Path::new(&vars).exists(),
            "the VARS file {vars} is removed with NVRAM"
        );
    }
    let swtpm = d.state_dir().join("swtpm").join(uuid_string(&dom.uuid));
    assert!(
        !swtpm.exists(),
        "the swtpm state {} is removed with TPM",
        swtpm.display()
    );
}

fn uuid_string(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

#[tokio::test]
async fn concurrent_calls_and_cancellation() {
    let Some(mut d) = daemon(LibvirtdOptions::default()).await else {
        return;
    };
    let c = connect(&d).await;
    let calls = (0..64).map(|_| {
        let c = c.clone();
        tokio::spawn(async move { c.call::<rp::ConnectGetVersion>(&()).await })
    });
    for h in calls {
        h.await.expect("joined").expect("call succeeded");
    }
    // A call abandoned mid-flight leaves a tombstone: its late reply is dropped quietly.
    for _ in 0..16 {
        let fut = c.call::<rp::ConnectGetCapabilities>(&());
        let _ = tokio::time::timeout(Duration::from_micros(50), fut).await;
    }
    // A frozen daemon cannot answer, so the deadline is what ends the call (a tiny deadline
    // alone is not enough: the timer fires on a millisecond tick, and a reply can beat it).
    d.suspend().expect("freeze libvirtd");
    let err = c
        .call_timeout::<rp::ConnectGetCapabilities>(&(), Some(Duration::from_millis(200)))
        .await;
    d.resume().expect("thaw libvirtd");
    assert!(
        matches!(
            err,
            Err(Error::Timeout {
                procedure: "REMOTE_PROC_CONNECT_GET_CAPABILITIES",
                ..
            })
        ),
        "{err:?}"
    );
    for _ in 0..8 {
        c.call::<rp::ConnectGetVersion>(&())
            .await
            .expect("the connection is not poisoned");
    }
    assert!(c.is_alive());
}

#[tokio::test]
async fn a_stopped_daemon_is_detected_by_keepalive() {
    let Some(mut d) = daemon(LibvirtdOptions::default()).await else {
        return;
    };
    let (id, ca) = identity(&d);
    let opts = ClientOptions {
        keepalive_interval: Duration::from_secs(1),
        keepalive_count: 3,
        call_timeout: None,
        ..Default::default()
    };
    let c = Client::connect_with(&d.tls_uri(), &id, &ca, opts.clone())
        .await
        .expect("connects");
    // Idle for more than three intervals: pings keep it alive.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    c.call::<rp::ConnectGetVersion>(&())
        .await
        .expect("alive after idling");

    d.suspend().expect("SIGSTOP");
    let started = std::time::Instant::now();
    let pending = c.call::<rp::ConnectGetVersion>(&()).await;
    let waited = started.elapsed();
    d.resume().expect("SIGCONT");
    assert!(
        matches!(pending, Err(Error::ConnectionLost(_))),
        "{pending:?}"
    );
    assert!(
        waited < Duration::from_secs(10),
        "failed within the keepalive window, not a hang: {waited:?}"
    );
    assert!(!c.is_alive());
    let again = Client::connect_with(&d.tls_uri(), &id, &ca, opts)
        .await
        .expect("reconnects after SIGCONT");
    again
        .call::<rp::ConnectGetVersion>(&())
        .await
        .expect("works again");
}

#[tokio::test]
async fn tls_refusals_are_clear() {
    let Some(d) = daemon(LibvirtdOptions::default()).await else {
        return;
    };
    let (id, ca) = identity(&d);
    // A client certificate from a CA the daemon does not know.
    let untrusted = d.write_untrusted_client_pki().expect("untrusted pki");
    let bad_id = Identity::from_files(
        &untrusted.join("clientcert.pem"),
        &untrusted.join("clientkey.pem"),
    )
    .expect("identity");
    let err = Client::connect(&d.tls_uri(), &bad_id, &ca)
        .await
        .expect_err("refused");
    assert!(matches!(err, Error::CertificateRefused { .. }), "{err}");
    // A bundle that does not hold the CA that signed the server's certificate.
    let wrong_ca = CaBundle::from_file(&untrusted.join("clientcert.pem")).expect("a certificate");
    let err = Client::connect(&d.tls_uri(), &id, &wrong_ca)
        .await
        .expect_err("server not trusted");
    assert!(matches!(err, Error::Tls { .. }), "{err}");
    // An address that is not in the server certificate's SAN: 127.0.0.2 forwards to the
    // daemon, so the TCP connection succeeds and only the name check can refuse it.
    let forward = tokio::net::TcpListener::bind("127.0.0.2:0")
        .await
        .expect("bind 127.0.0.2");
    let forward_port = forward.local_addr().expect("addr").port();
    let target = format!("127.0.0.1:{}", d.tls_port());
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = forward.accept().await {
            let target = target.clone();
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    let uri = format!("qemu+tls://127.0.0.2:{forward_port}/system");
    let err = Client::connect(&uri, &id, &ca)
        .await
        .expect_err("name mismatch");
    assert!(
        matches!(&err, Error::ServerNameNotInCertificate { host, kind: "IP address", presented }
            if host == "127.0.0.2" && presented.contains("IP:127.0.0.1")),
        "refused for the name: {err}"
    );
    assert!(!err.is_transient());
    // Other schemes fail before any I/O.
    let err = Client::connect("qemu+ssh://127.0.0.1/system", &id, &ca)
        .await
        .expect_err("ssh");
    assert_eq!(err.to_string(), "scheme \"qemu+ssh\" is not supported");
}

//! The unix socket and plain TCP transports against a real libvirtd (its private root's
//! socket, and a loopback TCP listener with `auth_tcp = "none"`): the same daemon answers over
//! every transport, and each transport refuses the other's connect function.

use banlieue_libvirt::flags::{ConnectListAllDomainsFlags, DomainUndefineFlags};
use banlieue_libvirt::uri::Transport;
use banlieue_libvirt::{CaBundle, Client, ConnectUri, Domain, Error, Identity};
use banlieue_testenv::libvirtd::{Libvirtd, LibvirtdOptions};

async fn daemon(options: LibvirtdOptions) -> Option<Libvirtd> {
    if !Libvirtd::available().expect("libvirtd is installed (run scripts/setup)") {
        return None;
    }
    Some(Libvirtd::start(options).await.expect("libvirtd starts"))
}

fn unix_uri(d: &Libvirtd) -> String {
    format!(
        "qemu+unix:///system?socket={}",
        d.run_dir().join("libvirt-sock").display()
    )
}

fn tiny_domain_xml(name: &str) -> String {
    format!(
        "<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>\
         <os><type arch='x86_64'>hvm</type></os></domain>"
    )
}

async fn domain_names(c: &Client) -> Vec<String> {
    let mut names: Vec<String> = c
        .list_all_domains(ConnectListAllDomainsFlags::empty())
        .await
        .expect("list domains")
        .iter()
        .map(|d| d.name().to_string())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn unix_socket_and_plain_tcp_reach_the_same_daemon_as_tls() {
    let Some(d) = daemon(LibvirtdOptions::default().with_tcp()).await else {
        return;
    };
    let unix_uri = unix_uri(&d);
    let tcp_uri = d.tcp_uri().expect("a TCP listener");
    assert!(matches!(
        ConnectUri::parse(&unix_uri).expect("parses").transport,
        Transport::Unix { .. }
    ));

    let unix = Client::connect_plain(&unix_uri)
        .await
        .expect("connects over the unix socket");
    let tcp = Client::connect_plain(&tcp_uri)
        .await
        .expect("connects over plain TCP");
    let identity =
        Identity::from_files(&d.client_cert_path(), &d.client_key_path()).expect("client identity");
    let ca = CaBundle::from_file(&d.ca_cert_path()).expect("CA");
    let tls = Client::connect(&d.tls_uri(), &identity, &ca)
        .await
        .expect("connects over TLS");

    let version = tls.lib_version().await.expect("version over TLS");
    assert!(version >= 9_000_000, "libvirt {version}");
    assert_eq!(unix.lib_version().await.expect("over unix"), version);
    assert_eq!(tcp.lib_version().await.expect("over tcp"), version);
    assert_eq!(
        unix.version().await.expect("hypervisor version over unix"),
        tcp.version().await.expect("hypervisor version over tcp")
    );

    // A domain defined over the socket is listed over TCP and TLS: one daemon, real calls.
    let name = "banlieue-local-transports";
    let dom = Domain::define_xml(&unix, &tiny_domain_xml(name))
        .await
        .expect("defined over the unix socket");
    let over_tcp = domain_names(&tcp).await;
    assert!(over_tcp.iter().any(|n| n == name), "{over_tcp:?}");
    assert_eq!(domain_names(&tls).await, over_tcp);
    let by_tcp = Domain::lookup_by_name(&tcp, name)
        .await
        .expect("lookup over tcp")
        .expect("found over tcp");
    assert_eq!(by_tcp.uuid(), dom.uuid());
    by_tcp
        .undefine_flags(DomainUndefineFlags::empty())
        .await
        .expect("undefined over tcp");
    assert!(
        Domain::lookup_by_name(&unix, name)
            .await
            .expect("lookup over unix")
            .is_none()
    );

    // Each connect function refuses the other's transports, before any I/O: code holding TLS
    // material never falls back to clear text.
    for uri in [unix_uri.as_str(), tcp_uri.as_str(), "qemu:///system"] {
        match Client::connect(uri, &identity, &ca).await {
            Err(Error::TransportMismatch { .. }) => {}
            other => panic!("{uri}: {other:?}"),
        }
    }
    match Client::connect_plain(&d.tls_uri()).await {
        Err(e @ Error::TransportMismatch { .. }) => {
            assert_eq!(
                e.to_string(),
                "scheme \"qemu+tls\" needs TLS material: open it with Client::connect"
            );
        }
        other => panic!("{other:?}"),
    }
    let missing = format!(
        "qemu+unix:///system?socket={}",
        d.run_dir().join("no-such-sock").display()
    );
    match Client::connect_plain(&missing).await {
        Err(e @ Error::Connect { .. }) => assert!(e.is_transient(), "{e}"),
        other => panic!("{other:?}"),
    }

    unix.close().await.expect("close unix");
    tcp.close().await.expect("close tcp");
    tls.close().await.expect("close tls");
}

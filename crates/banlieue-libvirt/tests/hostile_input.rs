//! Hostile input: bad endpoints and a hostile (authenticated) server. Each row ends in its
//! typed error, and after every one the same process still connects to a good server and
//! calls it: nothing is poisoned.
//!
//! The server is a tokio task on 127.0.0.1 speaking the crate's own packet codec over mutual
//! TLS with a throwaway PKI; it answers the open sequence like libvirtd and misbehaves on the
//! calls each test makes. No libvirtd is needed.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use banlieue_libvirt::flags;
use banlieue_libvirt::packet::{Packet, PacketCodec, PacketError};
use banlieue_libvirt::proto::net::{
    VirNetMessageError, VirNetMessageHeader, VirNetMessageStatus, VirNetMessageType,
    VirNetStreamHole,
};
use banlieue_libvirt::proto::remote::{self, procedures as rp};
use banlieue_libvirt::stream::TransferOptions;
use banlieue_libvirt::xdr::{self, Procedure, Xdr};
use banlieue_libvirt::{CaBundle, Client, ConnectUri, Error, Identity, StorageVol};
use bytes::{Bytes, BytesMut};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::codec::Decoder;

// ---------------------------------------------------------------------------------------------
// A throwaway PKI.

struct Pki {
    ca: Issuer<'static, KeyPair>,
    ca_pem: String,
}

/// A certificate and its key, PEM.
struct Leaf {
    cert: String,
    key: String,
}

impl Pki {
    fn new(name: &str) -> Pki {
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = params.self_signed(&key).expect("self-signed CA");
        Pki {
            ca_pem: cert.pem(),
            ca: Issuer::new(params, key),
        }
    }

    fn leaf(&self, sans: Vec<SanType>, usage: ExtendedKeyUsagePurpose) -> Leaf {
        let key = KeyPair::generate().expect("leaf key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("leaf params");
        params
            .distinguished_name
            .push(DnType::CommonName, "banlieue hostile-input test");
        params.subject_alt_names = sans;
        params.extended_key_usages = vec![usage];
        let cert = params.signed_by(&key, &self.ca).expect("signed leaf");
        Leaf {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }

    fn server(&self, sans: Vec<SanType>) -> Leaf {
        self.leaf(sans, ExtendedKeyUsagePurpose::ServerAuth)
    }

    fn client(&self) -> (Identity, CaBundle) {
        let leaf = self.leaf(Vec::new(), ExtendedKeyUsagePurpose::ClientAuth);
        (
            Identity::from_pem(leaf.cert.as_bytes(), leaf.key.as_bytes()).expect("identity"),
            CaBundle::from_pem(self.ca_pem.as_bytes()).expect("CA bundle"),
        )
    }
}

fn ip_and_dns() -> Vec<SanType> {
    vec![
        SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        SanType::DnsName("localhost".try_into().expect("DNS name")),
    ]
}

/// A server configuration that requires a client certificate of `pki`'s CA.
fn server_config(pki: &Pki, leaf: &Leaf) -> Arc<rustls::ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(pki.ca_pem.as_bytes()).expect("CA PEM"))
        .expect("CA root");
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .expect("client verifier");
    let chain = vec![CertificateDer::from_pem_slice(leaf.cert.as_bytes()).expect("cert PEM")];
    let key = PrivateKeyDer::from_pem_slice(leaf.key.as_bytes()).expect("key PEM");
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .expect("server config");
    Arc::new(config)
}

// ---------------------------------------------------------------------------------------------
// The test server.

/// What the server does once the TLS handshake is done.
#[derive(Clone, Copy, Debug)]
enum Behaviour {
    /// Confirms with 0x01 and serves, misbehaving only on the calls the tests make.
    Serve,
    /// Sends this byte instead of libvirtd's 0x01.
    Confirm(u8),
    /// Closes the connection right after the handshake.
    Close,
}

struct Server {
    port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Server {
    async fn start(config: Arc<rustls::ServerConfig>, behaviour: Behaviour) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    // A client that refuses our certificate ends here; that is its test's
                    // business.
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    match behaviour {
                        Behaviour::Close => drop(tls),
                        Behaviour::Confirm(byte) => {
                            let _ = tls.write_all(&[byte]).await;
                            let _ = tls.flush().await;
                            // Hold the connection until the client gives up.
                            let _ = tls.read(&mut [0u8; 1]).await;
                        }
                        Behaviour::Serve => {
                            if tls.write_all(&[1]).await.is_ok() {
                                serve(tls).await;
                            }
                        }
                    }
                });
            }
        });
        Server { port, task }
    }

    fn uri(&self, host: &str) -> String {
        format!("qemu+tls://{host}:{}/system", self.port)
    }
}

/// Reads one packet; `None` at the end of the connection or on a framing error.
async fn read_packet<R: AsyncRead + Unpin>(r: &mut R, buf: &mut BytesMut) -> Option<Packet> {
    loop {
        match PacketCodec.decode(buf) {
            Ok(Some(p)) => return Some(p),
            Ok(None) => {}
            Err(_) => return None,
        }
        if r.read_buf(buf).await.ok()? == 0 {
            return None;
        }
    }
}

async fn write_packet<W: AsyncWrite + Unpin>(w: &mut W, p: &Packet) {
    let mut out = BytesMut::new();
    p.encode(&mut out).expect("server packet encodes");
    let _ = w.write_all(&out).await;
}

fn reply_header(call: &VirNetMessageHeader, kind: VirNetMessageType) -> VirNetMessageHeader {
    VirNetMessageHeader {
        r#type: kind,
        status: VirNetMessageStatus::OK,
        ..call.clone()
    }
}

fn reply(call: &Packet, body: impl Into<Bytes>) -> Packet {
    Packet {
        header: reply_header(&call.header, VirNetMessageType::REPLY),
        fds: None,
        body: body.into(),
    }
}

fn encoded<T: Xdr>(v: &T) -> Bytes {
    v.to_bytes().expect("server body encodes").freeze()
}

fn is<P: Procedure>(p: &Packet) -> bool {
    p.header.prog == P::PROGRAM && p.header.r#proc == P::NUMBER
}

/// Names of the hostile listing: the second is not UTF-8 on the wire.
const NAME_PLACEHOLDER: &[u8] = b"vm-X";

/// Serves one connection: libvirtd's open sequence, a good `hostname`, and a hostile answer to
/// each other call the tests make.
async fn serve<S: AsyncRead + AsyncWrite + Unpin>(io: S) {
    let (mut rd, mut wr) = tokio::io::split(io);
    let mut buf = BytesMut::new();
    while let Some(call) = read_packet(&mut rd, &mut buf).await {
        if call.header.r#type != VirNetMessageType::CALL {
            // The client's end of a download is confirmed; its abort after refusing one is not
            // answered, as libvirtd does.
            if call.header.status == VirNetMessageStatus::OK {
                let mut done = reply(&call, Bytes::new());
                done.header.r#type = VirNetMessageType::STREAM;
                write_packet(&mut wr, &done).await;
            }
            continue;
        }
        let answer = if is::<rp::AuthList>(&call) {
            encoded(&remote::RemoteAuthListRet {
                types: vec![remote::RemoteAuthType::NONE],
            })
        } else if is::<rp::ConnectSupportsFeature>(&call) {
            encoded(&remote::RemoteConnectSupportsFeatureRet { supported: 0 })
        } else if is::<rp::ConnectOpen>(&call) || is::<rp::ConnectClose>(&call) {
            Bytes::new()
        } else if is::<rp::ConnectGetHostname>(&call) {
            encoded(&remote::RemoteConnectGetHostnameRet {
                hostname: "fake-libvirtd".into(),
            })
        } else if is::<rp::ConnectGetVersion>(&call) {
            // Before the real reply: a reply to a serial nobody asked for, and a CALL.
            let mut stray = reply(
                &call,
                encoded(&remote::RemoteConnectGetVersionRet { hv_ver: 1 }),
            );
            stray.header.serial = call.header.serial.wrapping_add(1000);
            write_packet(&mut wr, &stray).await;
            let mut server_call = call.clone();
            server_call.header.serial = 7;
            write_packet(&mut wr, &server_call).await;
            encoded(&remote::RemoteConnectGetVersionRet { hv_ver: 10_000_002 })
        } else if is::<rp::ConnectListAllDomains>(&call) {
            non_utf8_domain_listing()
        } else if is::<rp::ConnectListAllStoragePools>(&call) {
            // 16384 pools claimed (the declared bound), four bytes each present: enough for
            // the runtime's four-bytes-per-element floor, a fifth of what pools need.
            let claimed = remote::REMOTE_STORAGE_POOL_LIST_MAX;
            let mut body = claimed.to_be_bytes().to_vec();
            body.resize(4 + 4 * claimed as usize, 0);
            Bytes::from(body)
        } else if is::<rp::ConnectListAllNetworks>(&call) {
            // 2^31 networks claimed in a 100-byte body.
            let mut body = (1u32 << 31).to_be_bytes().to_vec();
            body.resize(100, 0);
            Bytes::from(body)
        } else if is::<rp::StorageVolDownload>(&call) {
            let args: remote::RemoteStorageVolDownloadArgs = call.body().expect("download args");
            write_packet(&mut wr, &reply(&call, Bytes::new())).await;
            hostile_download(&mut wr, &call, args.length).await;
            continue;
        } else {
            let err = VirNetMessageError {
                code: 3,
                message: Some("not served by this test server".into()),
                ..Default::default()
            };
            let mut p = reply(&call, encoded(&err));
            p.header.status = VirNetMessageStatus::ERROR;
            write_packet(&mut wr, &p).await;
            continue;
        };
        write_packet(&mut wr, &reply(&call, answer)).await;
    }
}

fn non_utf8_domain_listing() -> Bytes {
    let domain = |name: &[u8], id| remote::RemoteNonnullDomain {
        name: String::from_utf8(name.to_vec()).expect("ASCII"),
        uuid: [id as u8; 16],
        id,
    };
    let ret = remote::RemoteConnectListAllDomainsRet {
        domains: vec![
            domain(b"vm-1", 1),
            domain(NAME_PLACEHOLDER, 2),
            domain(b"vm-3", 3),
        ],
        ret: 3,
    };
    let mut body = ret.to_bytes().expect("encodes").to_vec();
    let at = body
        .windows(NAME_PLACEHOLDER.len())
        .position(|w| w == NAME_PLACEHOLDER)
        .expect("placeholder present");
    body[at + 3] = 0xff;
    Bytes::from(body)
}

/// Answers a download with more than was asked for: `length` 0 gets three holes of
/// `i64::MAX` (their sum overflows 64 bits), a non-zero `length` gets `length + 1` bytes.
async fn hostile_download<W: AsyncWrite + Unpin>(wr: &mut W, call: &Packet, length: u64) {
    let stream_packet = |kind, body| Packet {
        header: VirNetMessageHeader {
            status: VirNetMessageStatus::CONTINUE,
            ..reply_header(&call.header, kind)
        },
        fds: None,
        body,
    };
    if length == 0 {
        let hole = encoded(&VirNetStreamHole {
            length: i64::MAX,
            flags: 0,
        });
        for _ in 0..3 {
            write_packet(
                wr,
                &stream_packet(VirNetMessageType::STREAM_HOLE, hole.clone()),
            )
            .await;
        }
    } else {
        let data = Bytes::from(vec![0x5a; length as usize + 1]);
        write_packet(wr, &stream_packet(VirNetMessageType::STREAM, data)).await;
    }
    // End of data, so a client that took everything does not wait for more.
    write_packet(wr, &stream_packet(VirNetMessageType::STREAM, Bytes::new())).await;
}

// ---------------------------------------------------------------------------------------------
// Shared set-up.

struct Setup {
    pki: Pki,
    good: Server,
}

impl Setup {
    async fn new() -> Setup {
        let pki = Pki::new("banlieue hostile-input CA");
        let leaf = pki.server(ip_and_dns());
        let good = Server::start(server_config(&pki, &leaf), Behaviour::Serve).await;
        Setup { pki, good }
    }

    async fn connect(&self, uri: &str) -> banlieue_libvirt::Result<Client> {
        let (id, ca) = self.pki.client();
        Client::connect(uri, &id, &ca).await
    }

    /// Nothing is poisoned: a fresh connection to the good server works.
    async fn still_connects(&self, after: &str) {
        let client = self
            .connect(&self.good.uri("127.0.0.1"))
            .await
            .unwrap_or_else(|e| panic!("after {after}: the good server is unreachable: {e}"));
        assert_eq!(
            client.hostname().await.expect("hostname"),
            "fake-libvirtd",
            "after {after}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Endpoints and connection set-up: the table.

/// How a bad input is expected to fail.
type Expect = fn(&Error) -> bool;

#[tokio::test]
async fn bad_endpoints_and_bad_servers_fail_with_their_typed_error() {
    let setup = Setup::new().await;
    let pki = &setup.pki;

    // Servers for the rows that need one.
    let no_ip_san = Server::start(
        server_config(
            pki,
            &pki.server(vec![SanType::DnsName(
                "localhost".try_into().expect("DNS name"),
            )]),
        ),
        Behaviour::Serve,
    )
    .await;
    let leaf = pki.server(ip_and_dns());
    let zero_confirmation = Server::start(server_config(pki, &leaf), Behaviour::Confirm(0)).await;
    let closes = Server::start(server_config(pki, &leaf), Behaviour::Close).await;
    let other_pki = Pki::new("some other CA");
    let untrusted = Server::start(
        server_config(&other_pki, &other_pki.server(ip_and_dns())),
        Behaviour::Serve,
    )
    .await;

    let rows: Vec<(&str, String, Expect)> = vec![
        (
            "a password in the endpoint",
            "qemu+tls://u:pw@h/system".into(),
            |e| {
                matches!(e, Error::InvalidUri { reason, uri }
                    if reason.starts_with("user information") && !uri.contains("pw"))
                    && !e.to_string().contains("pw")
            },
        ),
        (
            "a user name in the endpoint",
            format!("qemu+tls://root@127.0.0.1:{}/system", setup.good.port),
            |e| matches!(e, Error::InvalidUri { reason, .. } if reason.starts_with("user information")),
        ),
        (
            // no_verify is never honoured: trust comes only from the CA bundle.
            "no_verify=1 against a server of another CA",
            format!(
                "qemu+tls://127.0.0.1:{}/system?no_verify=1&pkipath=/etc",
                untrusted.port
            ),
            |e| matches!(e, Error::Tls { .. }) && !e.is_transient(),
        ),
        (
            "an IP host against a certificate without an IP SAN",
            no_ip_san.uri("127.0.0.1"),
            |e| {
                matches!(e, Error::ServerNameNotInCertificate { host, kind: "IP address", presented }
                    if host == "127.0.0.1" && presented == "DNS:localhost")
                    && e.to_string()
                        .contains("no subject alternative name for IP address 127.0.0.1")
                    && !e.is_transient()
            },
        ),
        (
            "confirmation byte 0x00",
            zero_confirmation.uri("127.0.0.1"),
            |e| matches!(e, Error::BadConfirmation(0)),
        ),
        (
            "a close right after the handshake",
            closes.uri("127.0.0.1"),
            |e| matches!(e, Error::CertificateRefused { .. }),
        ),
        (
            "an ssh endpoint in capitals",
            "QEMU+SSH://h/system".into(),
            |e| matches!(e, Error::UnsupportedScheme(s) if s == "qemu+ssh"),
        ),
    ];
    for (what, uri, expect) in rows {
        match setup.connect(&uri).await {
            Ok(_) => panic!("{what}: {uri} connected"),
            Err(e) => assert!(expect(&e), "{what}: unexpected error {e:?} ({e})"),
        }
        setup.still_connects(what).await;
    }
}

#[tokio::test]
async fn an_upper_case_scheme_is_normalised() {
    let setup = Setup::new().await;
    let uri = format!("QEMU+TLS://127.0.0.1:{}/system", setup.good.port);
    let parsed = ConnectUri::parse(&uri).expect("parses");
    assert_eq!(parsed.server_uri(), "qemu:///system");
    let client = setup.connect(&uri).await.expect("connects");
    assert_eq!(client.hostname().await.expect("hostname"), "fake-libvirtd");
}

#[test]
fn the_cli_keeps_pkipath() {
    let u = ConnectUri::parse("qemu+tls://h/system?no_verify=1&pkipath=/etc").expect("parses");
    assert_eq!(u.pkipath.as_deref(), Some("/etc"));
}

// ---------------------------------------------------------------------------------------------
// A hostile server after a good handshake.

#[tokio::test]
async fn stray_replies_and_server_calls_are_ignored_and_counted() {
    let setup = Setup::new().await;
    let client = setup
        .connect(&setup.good.uri("127.0.0.1"))
        .await
        .expect("connects");
    assert_eq!(client.ignored_packets(), 0);
    assert_eq!(client.version().await.expect("version"), 10_000_002);
    // Both stray packets arrived before the reply on the same connection, so both are counted.
    assert_eq!(client.ignored_packets(), 2);
    assert!(client.is_alive());
    assert_eq!(client.hostname().await.expect("hostname"), "fake-libvirtd");
    assert_eq!(client.version().await.expect("again"), 10_000_002);
    assert_eq!(client.ignored_packets(), 4);
}

#[tokio::test]
async fn array_counts_beyond_the_bytes_present_are_typed_errors() {
    let setup = Setup::new().await;
    let client = setup
        .connect(&setup.good.uri("127.0.0.1"))
        .await
        .expect("connects");
    let e = client
        .list_all_storage_pools(flags::ConnectListAllStoragePoolsFlags::empty())
        .await
        .expect_err("short");
    // Refused at the count, before any element: a pool takes at least 20 bytes on the wire
    // (an empty name and its UUID), so 16384 of them need 327680.
    assert!(
        matches!(
            e,
            Error::Packet(PacketError::Body(xdr::Error::ShortInput {
                needed: 327_680,
                available: 65_536
            }))
        ),
        "{e:?}"
    );
    let e = client
        .list_all_networks(flags::ConnectListAllNetworksFlags::empty())
        .await
        .expect_err("bound");
    assert!(
        matches!(
            e,
            Error::Packet(PacketError::Body(xdr::Error::DecodeBound { len, .. })) if len == 1 << 31
        ),
        "{e:?}"
    );
    assert!(client.is_alive());
    assert_eq!(client.hostname().await.expect("hostname"), "fake-libvirtd");
}

#[tokio::test]
async fn names_that_are_not_utf8_decode_lossily() {
    let setup = Setup::new().await;
    let client = setup
        .connect(&setup.good.uri("127.0.0.1"))
        .await
        .expect("connects");
    let names: Vec<String> = client
        .list_all_domains(flags::ConnectListAllDomainsFlags::empty())
        .await
        .expect("the listing survives one bad name")
        .iter()
        .map(|d| d.name().to_string())
        .collect();
    assert_eq!(names, ["vm-1", "vm-\u{fffd}", "vm-3"]);
}

fn volume() -> remote::RemoteNonnullStorageVol {
    remote::RemoteNonnullStorageVol {
        pool: "default".into(),
        name: "marker".into(),
        key: "/pool/marker".into(),
    }
}

#[tokio::test]
async fn a_download_refuses_more_than_it_asked_for() {
    let setup = Setup::new().await;
    let client = setup
        .connect(&setup.good.uri("127.0.0.1"))
        .await
        .expect("connects");
    let mut sink = Vec::new();
    let e = StorageVol::from_raw(&client, volume())
        .download(&mut sink, TransferOptions::new().length(4096))
        .await
        .expect_err("4097 bytes for 4096 asked");
    assert!(
        e.to_string().contains("more than the 4096 asked for"),
        "{e}"
    );
    assert!(sink.is_empty(), "nothing past the limit reached the sink");
    assert!(client.is_alive());
    assert_eq!(client.hostname().await.expect("hostname"), "fake-libvirtd");
}

#[tokio::test]
async fn hole_lengths_that_overflow_are_typed_errors() {
    let setup = Setup::new().await;
    let client = setup
        .connect(&setup.good.uri("127.0.0.1"))
        .await
        .expect("connects");
    // A seeking sink: holes of 2^63 bytes are seeks, so the first two cost nothing here.
    let mut sink = std::io::Cursor::new(Vec::new());
    let e = StorageVol::from_raw(&client, volume())
        .download_seeking(&mut sink, TransferOptions::new().sparse(true))
        .await
        .expect_err("overflow");
    assert!(
        matches!(e, Error::Protocol(ref m) if m.contains("overflow")),
        "{e:?}"
    );
    assert!(client.is_alive());
    assert_eq!(client.hostname().await.expect("hostname"), "fake-libvirtd");
}

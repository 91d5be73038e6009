//! Pins the wire bytes of every procedure of every program: a deterministic sample of its
//! arguments as a CALL packet and of its return value as a REPLY packet (or, for events, its
//! message as a MESSAGE packet), as hex with offsets. Review shows any byte that changes.
//! Beside them, the CALL packets some handles send (a domain's managed save, its image and the
//! guest's time; the network filter calls), captured through a real `Client` by a scripted
//! server.

mod support;

use std::path::PathBuf;

use banlieue_libvirt::packet::Packet;
use banlieue_libvirt::proto::net::{VirNetMessageHeader, VirNetMessageStatus, VirNetMessageType};
use banlieue_libvirt::proto::{self, PROGRAMS};
use banlieue_libvirt::xdr::ProcedureInfo;
use banlieue_xdrgen::sample::{self, Limits, SplitMix64};
use bytes::{Bytes, BytesMut};

fn snapshot_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots/wire")
}

fn snapshot_name(program: &str, p: &ProcedureInfo) -> String {
    format!("{program}_{:03}_{}", p.number, p.name.to_ascii_lowercase())
}

/// Encodes a sample body of `type_name` as a packet, checks that the generated code decodes
/// and re-encodes it unchanged and that the packet round-trips, and renders it.
fn packet_section(
    model: &banlieue_xdrgen::model::Model,
    label: &str,
    p: &ProcedureInfo,
    kind: VirNetMessageType,
    type_name: Option<&str>,
) -> String {
    let mut body = Vec::new();
    if let Some(name) = type_name {
        let mut rng = SplitMix64(support::seed_of(&format!("{}:{label}", p.name)));
        assert!(
            sample::encode_named(model, name, &mut rng, Limits::default(), &mut body),
            "{name} is in the model"
        );
        let again = proto::transcode(name, &body)
            .expect("generated type")
            .expect("sample decodes");
        assert_eq!(&again[..], &body[..], "{name}: re-encoding differs");
    }
    let packet = Packet {
        header: VirNetMessageHeader {
            prog: p.program,
            vers: p.version,
            r#proc: p.number,
            r#type: kind,
            serial: if kind == VirNetMessageType::MESSAGE {
                0
            } else {
                1
            },
            status: VirNetMessageStatus::OK,
        },
        fds: None,
        body: Bytes::from(body),
    };
    let mut wire = BytesMut::new();
    packet.encode(&mut wire).expect("encodes");
    assert_eq!(
        Packet::decode(wire.clone().freeze()).expect("decodes"),
        packet,
        "{} {label} round trip",
        p.name
    );
    format!(
        "{label}: {} ({} bytes)\n{}",
        type_name.unwrap_or("void"),
        wire.len(),
        support::hexdump(&wire)
    )
}

#[test]
fn every_procedure_has_pinned_wire_bytes() {
    let model = support::protocol_model();
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(snapshot_dir());
    settings.set_prepend_module_to_snapshot(false);
    settings.set_omit_expression(true);
    settings.bind(|| {
        for (program, table) in PROGRAMS {
            for p in *table {
                let mut text = format!(
                    "{} = {} (program {:#x} version {})\n",
                    p.name, p.number, p.program, p.version
                );
                if let Some(msg) = p.message {
                    text += &packet_section(
                        &model,
                        "message",
                        p,
                        VirNetMessageType::MESSAGE,
                        Some(msg),
                    );
                } else {
                    text += &packet_section(&model, "call", p, VirNetMessageType::CALL, p.args);
                    text += &packet_section(&model, "reply", p, VirNetMessageType::REPLY, p.ret);
                }
                insta::assert_snapshot!(snapshot_name(program, p), text);
            }
        }
    });
}

/// Every procedure in the generated tables has a committed snapshot, and no snapshot is
/// left over from a procedure that no longer exists.
#[test]
fn snapshots_match_the_procedure_tables() {
    let mut expected: Vec<String> = PROGRAMS
        .iter()
        .flat_map(|(program, table)| {
            table
                .iter()
                .map(move |p| format!("{}.snap", snapshot_name(program, p)))
        })
        .collect();
    expected.sort();
    let mut present: Vec<String> = std::fs::read_dir(snapshot_dir())
        .expect("tests/snapshots/wire exists")
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|n| n.ends_with(".snap"))
        .collect();
    present.sort();
    let missing: Vec<&String> = expected.iter().filter(|e| !present.contains(e)).collect();
    let stale: Vec<&String> = present.iter().filter(|p| !expected.contains(p)).collect();
    assert!(
        missing.is_empty(),
        "procedures without a wire snapshot: {missing:?}"
    );
    assert!(stale.is_empty(), "snapshots without a procedure: {stale:?}");
    let remote = PROGRAMS
        .iter()
        .find(|(n, _)| *n == "remote")
        .map_or(0, |(_, t)| t.len());
    assert_eq!(
        remote, 453,
        "libvirt 11.3.0's remote program has 453 procedures"
    );
}

/// The CALL packet a `Domain` handle sends, as [`client_call`] captures it, for a domain named
/// `banlieue-wire`.
async fn handle_call<T, F, Fut>(ret: Bytes, call: F) -> (Packet, T)
where
    F: FnOnce(banlieue_libvirt::Domain) -> Fut,
    Fut: std::future::Future<Output = banlieue_libvirt::Result<T>>,
{
    use banlieue_libvirt::proto::remote;

    client_call(ret, |client| {
        call(banlieue_libvirt::Domain::from_raw(
            &client,
            remote::RemoteNonnullDomain {
                name: "banlieue-wire".into(),
                uuid: [0x5a; 16],
                id: 7,
            },
        ))
    })
    .await
}

/// The CALL packet a handle call sends, captured by a scripted server on an in-memory pipe:
/// it answers libvirt's open sequence (no auth, no keepalive), then answers the one handle
/// call with `ret` as its reply body. Returns the packet and what the handle returned.
async fn client_call<T, F, Fut>(ret: Bytes, call: F) -> (Packet, T)
where
    F: FnOnce(banlieue_libvirt::Client) -> Fut,
    Fut: std::future::Future<Output = banlieue_libvirt::Result<T>>,
{
    use banlieue_libvirt::Client;
    use banlieue_libvirt::proto::remote::{self, procedures as rp};
    use banlieue_libvirt::xdr::{Procedure, Xdr};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn read_packet(io: &mut tokio::io::DuplexStream) -> Option<Packet> {
        let mut len = [0u8; 4];
        io.read_exact(&mut len).await.ok()?;
        let mut frame = vec![0u8; u32::from_be_bytes(len) as usize];
        frame[..4].copy_from_slice(&len);
        io.read_exact(&mut frame[4..])
            .await
            .expect("a whole packet");
        Some(Packet::decode(Bytes::from(frame)).expect("a well-formed packet"))
    }

    let (client_end, mut server) = tokio::io::duplex(64 * 1024);
    let script = tokio::spawn(async move {
        let mut handle_calls = Vec::new();
        while let Some(call) = read_packet(&mut server).await {
            assert_eq!(call.header.r#type, VirNetMessageType::CALL);
            let body = match call.header.r#proc {
                rp::AuthList::NUMBER => remote::RemoteAuthListRet { types: Vec::new() }
                    .to_bytes()
                    .expect("encodes")
                    .freeze(),
                rp::ConnectSupportsFeature::NUMBER => {
                    remote::RemoteConnectSupportsFeatureRet { supported: 0 }
                        .to_bytes()
                        .expect("encodes")
                        .freeze()
                }
                rp::ConnectOpen::NUMBER | rp::ConnectClose::NUMBER => Bytes::new(),
                _ => {
                    handle_calls.push(call.clone());
                    ret.clone()
                }
            };
            let reply = Packet {
                header: VirNetMessageHeader {
                    r#type: VirNetMessageType::REPLY,
                    status: VirNetMessageStatus::OK,
                    ..call.header.clone()
                },
                fds: None,
                body,
            };
            let mut wire = BytesMut::new();
            reply.encode(&mut wire).expect("encodes");
            server.write_all(&wire).await.expect("replied");
            // A handle the call returned holds the client, and with it the connection, open.
            if call.header.r#proc == rp::ConnectClose::NUMBER {
                break;
            }
        }
        handle_calls
    });
    let client = Client::handshake(client_end, "qemu:///system")
        .await
        .expect("handshake");
    let returned = call(client.clone())
        .await
        .expect("the handle call succeeds");
    client.close().await.expect("closed");
    let mut handle_calls = script.await.expect("the script ran");
    assert_eq!(handle_calls.len(), 1, "one call per handle method");
    (handle_calls.remove(0), returned)
}

/// Pins a handle's call in `tests/snapshots`, without the expression that made it, like the
/// per-procedure snapshots.
fn assert_handle_snapshot(name: &str, text: String) {
    let mut settings = insta::Settings::clone_current();
    settings.set_omit_expression(true);
    settings.bind(|| insta::assert_snapshot!(name, text));
}

/// The call packet with its decoded arguments above the bytes, checking that it is `P`'s.
fn handle_section<P: banlieue_libvirt::xdr::Procedure>(label: &str, call: &Packet) -> String
where
    P::Args: std::fmt::Debug,
{
    assert_eq!(
        (call.header.prog, call.header.vers, call.header.r#proc),
        (P::PROGRAM, P::VERSION, P::NUMBER),
        "{label} calls {}",
        P::NAME
    );
    let args: P::Args = call
        .body()
        .expect("the body decodes as the procedure's arguments");
    let mut wire = BytesMut::new();
    call.encode(&mut wire).expect("encodes");
    format!(
        "{label}: {} = {}\n{args:?}\n{}",
        P::NAME,
        P::NUMBER,
        support::hexdump(&wire)
    )
}

#[tokio::test]
async fn managed_save_handles_send_pinned_calls() {
    use banlieue_libvirt::flags::DomainSaveRestoreFlags;
    use banlieue_libvirt::proto::remote::{self, procedures as rp};
    use banlieue_libvirt::xdr::Xdr;

    let (call, ()) = handle_call(Bytes::new(), |dom| async move {
        dom.managed_save(DomainSaveRestoreFlags::BYPASS_CACHE | DomainSaveRestoreFlags::PAUSED)
            .await
    })
    .await;
    assert_handle_snapshot(
        "handle_domain_managed_save",
        handle_section::<rp::DomainManagedSave>(
            "Domain::managed_save(BYPASS_CACHE | PAUSED)",
            &call,
        ),
    );

    for (result, has) in [(1, true), (0, false)] {
        let ret = remote::RemoteDomainHasManagedSaveImageRet { result }
            .to_bytes()
            .expect("encodes")
            .freeze();
        let (call, returned) =
            handle_call(ret, |dom| async move { dom.has_managed_save_image().await }).await;
        assert_eq!(returned, has, "a reply of {result}");
        assert_handle_snapshot(
            "handle_domain_has_managed_save_image",
            handle_section::<rp::DomainHasManagedSaveImage>(
                "Domain::has_managed_save_image()",
                &call,
            ),
        );
    }

    let (call, ()) = handle_call(Bytes::new(), |dom| async move {
        dom.managed_save_remove().await
    })
    .await;
    assert_handle_snapshot(
        "handle_domain_managed_save_remove",
        handle_section::<rp::DomainManagedSaveRemove>("Domain::managed_save_remove()", &call),
    );
}

#[tokio::test]
async fn set_time_handle_sends_a_pinned_call() {
    use banlieue_libvirt::flags::DomainSetTimeFlags;
    use banlieue_libvirt::proto::remote::procedures as rp;

    let (at, ()) = handle_call(Bytes::new(), |dom| async move {
        dom.set_time(1_800_000_000, 123_456_789, DomainSetTimeFlags::empty())
            .await
    })
    .await;
    let (sync, ()) = handle_call(Bytes::new(), |dom| async move {
        dom.set_time(0, 0, DomainSetTimeFlags::SYNC).await
    })
    .await;
    assert_handle_snapshot(
        "handle_domain_set_time",
        format!(
            "{}\n{}",
            handle_section::<rp::DomainSetTime>(
                "Domain::set_time(1_800_000_000, 123_456_789, empty)",
                &at
            ),
            handle_section::<rp::DomainSetTime>("Domain::set_time(0, 0, SYNC)", &sync)
        ),
    );
}

#[tokio::test]
async fn nwfilter_handles_send_pinned_calls() {
    use banlieue_libvirt::NwFilter;
    use banlieue_libvirt::proto::remote::{self, procedures as rp};
    use banlieue_libvirt::xdr::Xdr;

    let wire_filter = |name: &str, byte: u8| remote::RemoteNonnullNwfilter {
        name: name.into(),
        uuid: [byte; 16],
    };
    let xml = "<filter name='banlieue-wire' chain='root'>\
               <rule action='accept' direction='out'><tcp dstportstart='443'/></rule>\
               </filter>";

    let ret = remote::RemoteNwfilterDefineXmlRet {
        nwfilter: wire_filter("banlieue-wire", 0x5a),
    }
    .to_bytes()
    .expect("encodes")
    .freeze();
    let (call, defined) = client_call(ret, |client| async move {
        NwFilter::define_xml(&client, xml).await
    })
    .await;
    assert_eq!(
        (defined.name(), defined.uuid()),
        ("banlieue-wire", [0x5a; 16])
    );
    assert_handle_snapshot(
        "handle_nwfilter_define_xml",
        handle_section::<rp::NwfilterDefineXml>("NwFilter::define_xml(xml)", &call),
    );

    let ret = remote::RemoteNwfilterLookupByNameRet {
        nwfilter: wire_filter("banlieue-wire", 0x5a),
    }
    .to_bytes()
    .expect("encodes")
    .freeze();
    let (call, found) = client_call(ret, |client| async move {
        NwFilter::lookup_by_name(&client, "banlieue-wire").await
    })
    .await;
    assert_eq!(found.map(|f| f.uuid()), Some([0x5a; 16]));
    assert_handle_snapshot(
        "handle_nwfilter_lookup_by_name",
        handle_section::<rp::NwfilterLookupByName>(
            "NwFilter::lookup_by_name(\"banlieue-wire\")",
            &call,
        ),
    );

    let ret = remote::RemoteNwfilterGetXmlDescRet { xml: xml.into() }
        .to_bytes()
        .expect("encodes")
        .freeze();
    let (call, described) = client_call(ret, |client| async move {
        NwFilter::from_raw(&client, wire_filter("banlieue-wire", 0x5a))
            .xml_desc()
            .await
    })
    .await;
    assert_eq!(described, xml);
    assert_handle_snapshot(
        "handle_nwfilter_get_xml_desc",
        handle_section::<rp::NwfilterGetXmlDesc>("NwFilter::xml_desc()", &call),
    );

    let (call, ()) = client_call(Bytes::new(), |client| async move {
        NwFilter::from_raw(&client, wire_filter("banlieue-wire", 0x5a))
            .undefine()
            .await
    })
    .await;
    assert_handle_snapshot(
        "handle_nwfilter_undefine",
        handle_section::<rp::NwfilterUndefine>("NwFilter::undefine()", &call),
    );

    let ret = remote::RemoteConnectListAllNwfiltersRet {
        filters: vec![
            wire_filter("banlieue-wire", 0x5a),
            wire_filter("clean-traffic", 0xa5),
        ],
        ret: 2,
    }
    .to_bytes()
    .expect("encodes")
    .freeze();
    let (call, listed) = client_call(
        ret,
        |client| async move { NwFilter::list_all(&client).await },
    )
    .await;
    let listed: Vec<(&str, [u8; 16])> = listed.iter().map(|f| (f.name(), f.uuid())).collect();
    assert_eq!(
        listed,
        [("banlieue-wire", [0x5a; 16]), ("clean-traffic", [0xa5; 16])]
    );
    assert_handle_snapshot(
        "handle_nwfilter_list_all",
        handle_section::<rp::ConnectListAllNwfilters>("NwFilter::list_all()", &call),
    );
}

//! Pins the wire bytes of every procedure of every program: a deterministic sample of its
//! arguments as a CALL packet and of its return value as a REPLY packet (or, for events, its
//! message as a MESSAGE packet), as hex with offsets. Review shows any byte that changes.

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

//! The decoder refuses every malformed input cleanly: every truncation of a valid packet,
//! trailing bytes, lengths beyond libvirt's limits, and lies about lengths.

mod support;

use banlieue_libvirt::packet::{MAX_PACKET, Packet, PacketCodec, PacketError};
use banlieue_libvirt::proto::net::{VirNetMessageHeader, VirNetMessageStatus, VirNetMessageType};
use banlieue_libvirt::proto::{self, remote};
use banlieue_libvirt::xdr::{self, Xdr};
use banlieue_xdrgen::sample::{self, Limits, SplitMix64};
use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use tokio_util::codec::Decoder;

fn call(serial: u32, body: Bytes) -> Packet {
    Packet {
        header: VirNetMessageHeader {
            prog: remote::PROGRAM,
            vers: remote::VERSION,
            r#proc: 1,
            r#type: VirNetMessageType::CALL,
            serial,
            status: VirNetMessageStatus::OK,
        },
        fds: None,
        body,
    }
}

fn open_args() -> remote::RemoteConnectOpenArgs {
    remote::RemoteConnectOpenArgs {
        name: Some("qemu:///system".into()),
        flags: 0,
    }
}

#[test]
fn every_truncation_of_a_body_fails() {
    let model = support::protocol_model();
    // A few types with nested optionals, arrays and unions.
    for name in [
        "remote_connect_open_args",
        "remote_domain_get_info_ret",
        "remote_node_get_cpu_stats_ret",
        "virNetMessageError",
        "remote_typed_param",
    ] {
        for seed in 0..8 {
            let mut bytes = Vec::new();
            assert!(sample::encode_named(
                &model,
                name,
                &mut SplitMix64(seed),
                Limits::default(),
                &mut bytes
            ));
            for cut in 0..bytes.len() {
                let r = proto::transcode(name, &bytes[..cut]).expect("known type");
                assert!(
                    r.is_err(),
                    "{name} seed {seed}: {cut} of {} bytes decoded",
                    bytes.len()
                );
            }
            let mut longer = bytes.clone();
            longer.extend_from_slice(&[0, 0, 0, 0]);
            assert_eq!(
                proto::transcode(name, &longer).expect("known type"),
                Err(xdr::Error::TrailingData(4)),
                "{name}: trailing data accepted"
            );
        }
    }
}

#[test]
fn every_truncation_of_a_packet_fails() {
    let p = Packet::with_body(call(7, Bytes::new()).header, &open_args()).expect("encodes");
    let mut full = BytesMut::new();
    p.encode(&mut full).expect("encodes");
    for cut in 0..full.len() {
        let frame = Bytes::copy_from_slice(&full[..cut]);
        assert!(
            Packet::decode(frame).is_err(),
            "{cut} bytes decoded as a packet"
        );
        // The streaming decoder waits for more instead of failing or returning a packet.
        let mut buf = BytesMut::from(&full[..cut]);
        assert!(
            matches!(PacketCodec.decode(&mut buf), Ok(None)),
            "codec at {cut} bytes"
        );
    }
    let mut buf = full.clone();
    assert_eq!(
        PacketCodec.decode(&mut buf).expect("decodes"),
        Some(p.clone())
    );
    assert!(buf.is_empty());
    // A packet's own body must be decoded whole.
    let mut longer = full.to_vec();
    longer.extend_from_slice(&[0, 0, 0, 0]);
    let n = longer.len() as u32;
    longer[..4].copy_from_slice(&n.to_be_bytes());
    let packet = Packet::decode(Bytes::from(longer)).expect("frame is consistent");
    assert!(matches!(
        packet.body::<remote::RemoteConnectOpenArgs>(),
        Err(PacketError::Body(xdr::Error::TrailingData(4)))
    ));
}

#[test]
fn a_frame_longer_than_its_length_word_is_rejected() {
    let mut full = BytesMut::new();
    call(1, Bytes::new()).encode(&mut full).expect("encodes");
    let mut bytes = full.to_vec();
    bytes.push(0);
    assert!(matches!(
        Packet::decode(Bytes::from(bytes)),
        Err(PacketError::Truncated {
            claimed: 28,
            available: 29
        })
    ));
}

#[test]
fn lengths_beyond_the_limit_fail_before_allocating() {
    for len in [u32::MAX, (MAX_PACKET + 5) as u32] {
        let mut buf = BytesMut::from(&len.to_be_bytes()[..]);
        let before = buf.capacity();
        assert!(PacketCodec.decode(&mut buf).is_err(), "length {len}");
        assert_eq!(buf.capacity(), before, "nothing reserved for length {len}");
    }
    for len in [0u32, 4, 27] {
        let mut buf = BytesMut::from(&len.to_be_bytes()[..]);
        assert!(PacketCodec.decode(&mut buf).is_err(), "length {len}");
    }
}

#[test]
fn a_count_larger_than_the_input_fails_without_allocating() {
    // remote_connect_list_all_domains_ret: domains<REMOTE_DOMAIN_LIST_MAX>, then ret.
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&16384u32.to_be_bytes()); // within the bound, far beyond the input
    bytes.extend_from_slice(&[0; 12]);
    let err = remote::RemoteConnectListAllDomainsRet::from_bytes(&bytes).expect_err("short");
    assert!(matches!(err, xdr::Error::ShortInput { .. }), "{err}");
    // A string length past its declared bound is refused by the bound.
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&1u32.to_be_bytes());
    bytes.extend_from_slice(&(remote::REMOTE_STRING_MAX + 1).to_be_bytes());
    let err = remote::RemoteConnectOpenArgs::from_bytes(&bytes).expect_err("too long");
    assert!(
        matches!(err, xdr::Error::DecodeBound { max, .. } if max == remote::REMOTE_STRING_MAX),
        "{err}"
    );
}

#[test]
fn encode_checks_declared_bounds() {
    let too_many = remote::RemoteConnectListAllDomainsRet {
        domains: vec![Default::default(); remote::REMOTE_DOMAIN_LIST_MAX as usize + 1],
        ret: 0,
    };
    let err = too_many.to_bytes().expect_err("bound");
    assert!(
        matches!(
            err,
            xdr::Error::EncodeBound {
                what: "remote_connect_list_all_domains_ret.domains",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn unknown_enum_values_survive_and_print_in_hex() {
    let v = VirNetMessageType(0x1234);
    let bytes = v.to_bytes().expect("encodes");
    assert_eq!(VirNetMessageType::from_bytes(&bytes).expect("decodes"), v);
    assert_eq!(format!("{v:?}"), "VirNetMessageType(0x1234)");
    assert_eq!(
        format!("{:?}", VirNetMessageType::STREAM_HOLE),
        "VIR_NET_STREAM_HOLE"
    );
}

#[test]
fn unknown_union_discriminants_are_typed_errors() {
    let bytes = [0, 0, 0, 99, 0, 0, 0, 0];
    let err = remote::RemoteTypedParamValue::from_bytes(&bytes).expect_err("unknown case");
    assert_eq!(
        err,
        xdr::Error::UnknownDiscriminant {
            union: "remote_typed_param_value",
            value: 99
        }
    );
}

fn sampled(model: &banlieue_xdrgen::model::Model, name: &str, seed: u64) -> Vec<u8> {
    let mut bytes = Vec::new();
    sample::encode_named(
        model,
        name,
        &mut SplitMix64(seed),
        Limits {
            max_array: 4,
            max_bytes: 64,
        },
        &mut bytes,
    );
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any valid encoding of any type decodes and re-encodes to the same bytes.
    #[test]
    fn every_type_round_trips(index in any::<prop::sample::Index>(), seed in any::<u64>()) {
        let model = model();
        let names: Vec<&String> = model.types.keys().collect();
        let name = names[index.index(names.len())];
        let bytes = sampled(model, name, seed);
        let out = proto::transcode(name, &bytes).expect("known type");
        prop_assert_eq!(out.map(|b| b.to_vec()), Ok(bytes));
    }

    /// Packets round-trip through the streaming codec, also when split at any point.
    #[test]
    fn packets_round_trip_through_the_codec(serial in any::<u32>(), body in prop::collection::vec(any::<u8>(), 0..512), split in any::<prop::sample::Index>()) {
        let p = call(serial, Bytes::from(body));
        let mut wire = BytesMut::new();
        p.encode(&mut wire).expect("encodes");
        let at = split.index(wire.len());
        let mut buf = BytesMut::from(&wire[..at]);
        prop_assert_eq!(PacketCodec.decode(&mut buf).expect("no error"), None);
        buf.extend_from_slice(&wire[at..]);
        prop_assert_eq!(PacketCodec.decode(&mut buf).expect("no error"), Some(p));
    }

    /// Arbitrary bytes never panic the packet or body decoders.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let mut buf = BytesMut::from(&bytes[..]);
        let _ = PacketCodec.decode(&mut buf);
        let _ = Packet::decode(Bytes::from(bytes.clone()));
        for name in ["virNetMessageError", "remote_domain_get_info_ret", "remote_typed_param", "remote_connect_open_args"] {
            let _ = proto::transcode(name, &bytes);
        }
    }
}

fn model() -> &'static banlieue_xdrgen::model::Model {
    static MODEL: std::sync::OnceLock<banlieue_xdrgen::model::Model> = std::sync::OnceLock::new();
    MODEL.get_or_init(support::protocol_model)
}

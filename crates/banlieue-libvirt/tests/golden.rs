//! Golden packets with the values of libvirt's own `tests/virnetmessagetest.c`, written out as
//! this project's test data: a call header, a reply header, an error message and a stream
//! packet whose data is not padded.

use banlieue_libvirt::packet::Packet;
use banlieue_libvirt::proto::net::{
    VirNetMessageError, VirNetMessageHeader, VirNetMessageStatus, VirNetMessageType,
};
use bytes::{Bytes, BytesMut};

fn header(kind: VirNetMessageType, status: VirNetMessageStatus) -> VirNetMessageHeader {
    VirNetMessageHeader {
        prog: 0x1122_3344,
        vers: 1,
        r#proc: 0x666,
        r#type: kind,
        serial: 0x99,
        status,
    }
}

fn encode(p: &Packet) -> Vec<u8> {
    let mut out = BytesMut::new();
    p.encode(&mut out).expect("encodes");
    out.to_vec()
}

const CALL_HEADER: [u8; 28] = [
    0x00, 0x00, 0x00, 0x1c, // length
    0x11, 0x22, 0x33, 0x44, // program
    0x00, 0x00, 0x00, 0x01, // version
    0x00, 0x00, 0x06, 0x66, // procedure
    0x00, 0x00, 0x00, 0x00, // type CALL
    0x00, 0x00, 0x00, 0x99, // serial
    0x00, 0x00, 0x00, 0x00, // status OK
];

#[test]
fn call_header_encodes_as_libvirt_does() {
    let p = Packet {
        header: header(VirNetMessageType::CALL, VirNetMessageStatus::OK),
        fds: None,
        body: Bytes::new(),
    };
    assert_eq!(encode(&p), CALL_HEADER);
}

#[test]
fn reply_header_decodes() {
    let mut bytes = CALL_HEADER;
    bytes[19] = 0x01; // REPLY
    bytes[27] = 0x01; // ERROR
    let p = Packet::decode(Bytes::copy_from_slice(&bytes)).expect("decodes");
    assert_eq!(
        p.header,
        header(VirNetMessageType::REPLY, VirNetMessageStatus::ERROR)
    );
    assert!(p.body.is_empty());
    assert_eq!(p.fds, None);
}

fn error_packet_bytes() -> Vec<u8> {
    let mut v = vec![
        0x00, 0x00, 0x00, 0x74, // length
        0x11, 0x22, 0x33, 0x44, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x06,
        0x66, // prog vers proc
        0x00, 0x00, 0x00, 0x02, // type MESSAGE
        0x00, 0x00, 0x00, 0x99, // serial
        0x00, 0x00, 0x00, 0x01, // status ERROR
        0x00, 0x00, 0x00, 0x01, // code VIR_ERR_INTERNAL_ERROR
        0x00, 0x00, 0x00, 0x07, // domain VIR_FROM_RPC
        0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x0b, // message present, 11 bytes
    ];
    v.extend_from_slice(b"Hello World\0");
    v.extend_from_slice(&[0, 0, 0, 2]); // level VIR_ERR_ERROR
    v.extend_from_slice(&[0, 0, 0, 0]); // no domain
    v.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 3]);
    v.extend_from_slice(b"One\0");
    v.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 3]);
    v.extend_from_slice(b"Two\0");
    v.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 5]);
    v.extend_from_slice(b"Three\0\0\0");
    v.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 2]); // int1, int2
    v.extend_from_slice(&[0, 0, 0, 0]); // no network
    v
}

fn sample_error() -> VirNetMessageError {
    VirNetMessageError {
        code: 1,
        domain: 7,
        message: Some("Hello World".into()),
        level: 2,
        dom: None,
        str1: Some("One".into()),
        str2: Some("Two".into()),
        str3: Some("Three".into()),
        int1: 1,
        int2: 2,
        net: None,
    }
}

#[test]
fn error_message_encodes_as_libvirt_does() {
    let p = Packet::with_body(
        header(VirNetMessageType::MESSAGE, VirNetMessageStatus::ERROR),
        &sample_error(),
    )
    .expect("encodes");
    let bytes = encode(&p);
    assert_eq!(bytes.len(), 0x74);
    assert_eq!(bytes, error_packet_bytes());
}

#[test]
fn error_message_decodes_every_field() {
    let p = Packet::decode(Bytes::from(error_packet_bytes())).expect("decodes");
    let err = p.error().expect("status is ERROR").expect("body decodes");
    assert_eq!(err, sample_error());
}

#[test]
fn stream_data_is_not_padded() {
    let data = b"The quick brown fox jumps over the lazy dog";
    let p = Packet {
        header: header(VirNetMessageType::STREAM, VirNetMessageStatus::CONTINUE),
        fds: None,
        body: Bytes::from_static(data),
    };
    let bytes = encode(&p);
    assert_eq!(
        bytes.len(),
        0x47,
        "43 data bytes follow the header with no padding"
    );
    assert_eq!(&bytes[..4], &[0, 0, 0, 0x47]);
    assert_eq!(&bytes[16..20], &[0, 0, 0, 3], "type STREAM");
    assert_eq!(&bytes[24..28], &[0, 0, 0, 2], "status CONTINUE");
    assert_eq!(&bytes[28..], data);
    assert_eq!(Packet::decode(Bytes::from(bytes)).expect("decodes"), p);
}

#[test]
fn with_fds_types_carry_a_descriptor_count() {
    let p = Packet {
        header: header(VirNetMessageType::CALL_WITH_FDS, VirNetMessageStatus::OK),
        fds: Some(2),
        body: Bytes::from_static(&[0, 0, 0, 9]),
    };
    let bytes = encode(&p);
    assert_eq!(bytes.len(), 4 + 24 + 4 + 4);
    assert_eq!(&bytes[28..32], &[0, 0, 0, 2]);
    assert_eq!(Packet::decode(Bytes::from(bytes)).expect("decodes"), p);
}

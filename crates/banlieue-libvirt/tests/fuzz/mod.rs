//! One fuzz input through the receive path: packet framing, then the body as the type its
//! header names (arguments, reply, event message or error).
//!
//! Shared by the cargo-fuzz target (`fuzz/fuzz_targets/packet.rs`) and the stable, time-bounded
//! runner (`tests/fuzz_packet.rs`), so both check the same properties:
//! - nothing panics, whatever the bytes;
//! - a body that decodes re-encodes to the same length (longer only where a string was not
//!   UTF-8 and decoded lossily), and that encoding is a fixed point
//!   (decoding and encoding it again gives the same bytes).

#![allow(dead_code)] // the fuzz target and the runner each use part of this module

use banlieue_libvirt::packet::{Packet, PacketCodec};
use banlieue_libvirt::proto::{self, net::VirNetMessageStatus, net::VirNetMessageType};
use bytes::{Bytes, BytesMut};
use tokio_util::codec::Decoder;

/// What one input reached, for the runner's coverage figures.
#[derive(Debug, Default, Clone, Copy)]
pub struct Reached {
    pub packet: bool,
    pub body_typed: bool,
    pub body_decoded: bool,
}

pub fn packet(data: &[u8]) -> Reached {
    let mut reached = Reached::default();
    if let Ok(p) = Packet::decode(Bytes::copy_from_slice(data)) {
        reached.packet = true;
        for name in body_types(&p) {
            reached.body_typed = true;
            reached.body_decoded |= body(name, &p.body);
        }
        let _ = p.error();
    }
    framed(data);
    reached
}

/// The types the body of `p` may hold, from its header.
fn body_types(p: &Packet) -> Vec<&'static str> {
    let h = &p.header;
    if h.status == VirNetMessageStatus::ERROR {
        return vec!["virNetMessageError"];
    }
    let Some(info) = proto::PROGRAMS
        .iter()
        .flat_map(|(_, procs)| procs.iter())
        .find(|i| i.program == h.prog && i.number == h.proc)
    else {
        return Vec::new();
    };
    let ty = h.r#type;
    let name = if ty == VirNetMessageType::CALL || ty == VirNetMessageType::CALL_WITH_FDS {
        info.args
    } else if ty == VirNetMessageType::REPLY || ty == VirNetMessageType::REPLY_WITH_FDS {
        info.ret
    } else if ty == VirNetMessageType::MESSAGE {
        info.message
    } else {
        None
    };
    name.into_iter().collect()
}

/// Decodes `bytes` as `name`; when that succeeds, checks the re-encoding. Returns whether it
/// decoded.
pub fn body(name: &str, bytes: &[u8]) -> bool {
    let Some(Ok(out)) = proto::transcode(name, bytes) else {
        return false;
    };
    // Every XDR item encodes to as many bytes as it decoded from, except strings that were not
    // UTF-8: they decode lossily, each bad sequence becoming U+FFFD's three bytes.
    let lossy = out.windows(3).any(|w| w == "\u{fffd}".as_bytes());
    assert!(
        out.len() == bytes.len() || (lossy && out.len() > bytes.len()),
        "{name}: re-encoding changed the length ({} to {})",
        bytes.len(),
        out.len()
    );
    match proto::transcode(name, &out) {
        Some(Ok(again)) => assert_eq!(again, out, "{name}: re-encoding is not a fixed point"),
        other => panic!("{name}: its own encoding does not decode: {other:?}"),
    }
    true
}

/// The streaming decoder over the same bytes, fed in two pieces as a socket might.
fn framed(data: &[u8]) {
    let split = data.len() / 2;
    let mut buf = BytesMut::from(&data[..split]);
    let mut codec = PacketCodec;
    for rest in [&data[split..], &[][..]] {
        loop {
            match codec.decode(&mut buf) {
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(_) => return,
            }
        }
        buf.extend_from_slice(rest);
    }
}

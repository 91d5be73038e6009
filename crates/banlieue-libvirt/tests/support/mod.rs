//! Shared helpers for the protocol tests.
#![allow(dead_code)]

use std::fmt::Write as _;
use std::path::PathBuf;

/// libvirt's protocol files, in the order the build script reads them.
pub fn protocol_inputs() -> Vec<banlieue_xdrgen::Input> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("protocol");
    banlieue_libvirt::proto::PROTOCOL_FILES
        .iter()
        .map(|f| banlieue_xdrgen::Input::from_path(&dir.join(f)).expect("protocol/fetch has run"))
        .collect()
}

pub fn protocol_model() -> banlieue_xdrgen::model::Model {
    banlieue_xdrgen::model(&protocol_inputs()).expect("libvirt's protocol resolves")
}

/// Hex with offsets, 16 bytes a line, so a changed byte is visible in review.
pub fn hexdump(bytes: &[u8]) -> String {
    let mut s = String::new();
    for (i, chunk) in bytes.chunks(16).enumerate() {
        let _ = write!(s, "{:08x} ", i * 16);
        for (j, b) in chunk.iter().enumerate() {
            if j == 8 {
                s.push(' ');
            }
            let _ = write!(s, " {b:02x}");
        }
        s.push('\n');
    }
    s
}

/// FNV-1a, to derive a stable seed from a name.
pub fn seed_of(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

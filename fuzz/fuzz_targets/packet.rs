//! The receive path: packet framing, then the body as the type the header names.

#![no_main]

#[path = "../../crates/banlieue-libvirt/tests/fuzz/mod.rs"]
mod receive;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    receive::packet(data);
});

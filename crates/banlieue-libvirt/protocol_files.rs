/// libvirt's protocol files, in dependency order (qemu and lxc use remote's types). Shared by
/// the build script and the crate through `include!`, so there is one list.
pub const PROTOCOL_FILES: &[&str] = &[
    "virnetprotocol.x",
    "virkeepaliveprotocol.x",
    "remote_protocol.x",
    "qemu_protocol.x",
    "lxc_protocol.x",
    "admin_protocol.x",
];

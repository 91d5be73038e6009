#![doc = include_str!("../README.md")]
//!
//! # Layout
//!
//! The protocol layer is generated at build time from libvirt's own `.x` files: every type of
//! every program with its XDR encoding, and a table and a marker type per procedure
//! ([`proto`], over the XDR runtime in [`xdr`]).
//!
//! The tokio [`Client`] calls any procedure by its marker type; the handles ([`Domain`],
//! [`StoragePool`], [`StorageVol`], [`Network`], [`NwFilter`]) name the common ones after
//! libvirt's C API, with typed flags ([`flags`]), typed parameters ([`params`]) and open enums
//! ([`DomainState`], [`ErrorCode`], …) for libvirt's integers. [`stream`] moves volume data,
//! [`events`] delivers domain, storage pool and network events, and [`Reconnecting`] re-opens
//! a lost connection and re-registers its event subscriptions.
//!
//! What is public and what is not is described in `docs/client.md` ("The public API"): the
//! packet codec and the connection's sans-io core are internal; `#[doc(hidden)]` items exist
//! for this crate's own tests and fuzzers and are not part of the API.
#![deny(missing_docs)]
// A product function stays under clippy.toml's line limit (tests may be longer).
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

#[macro_use]
mod macros;

mod client;
mod dispatch;
mod error;
pub mod events;
pub mod flags;
mod handles;
#[doc(hidden)]
pub mod packet;
pub mod params;
mod reconnect;
pub mod stream;
mod tls;
pub mod uri;
pub mod xdr;

pub use client::{Client, ClientOptions};
pub use error::{Error, ErrorCode, ErrorLevel, RemoteError, Result};
pub use handles::{
    Domain, DomainState, InterfaceAddresses, InterfaceAddressesSource, IpAddress, IpAddressType,
    Network, NodeInfo, NwFilter, StoragePool, StorageVol, StorageVolInfo, StorageVolType,
    uuid_string, version_string,
};
pub use packet::PacketError;
pub use reconnect::{Backoff, ConnectFuture, LifecycleUpdate, LifecycleWatch, Reconnecting};
pub use tls::{CaBundle, Identity};
pub use uri::ConnectUri;

/// The generated protocol, one module per libvirt program file.
#[rustfmt::skip]
#[allow(clippy::all, clippy::pedantic, non_camel_case_types, unreachable_patterns, missing_docs, unused_parens, dead_code)]
pub mod proto {
    /// `virnetprotocol.x`: the packet header, errors and stream holes.
    pub mod net { include!(concat!(env!("OUT_DIR"), "/protocol/net.rs")); }
    /// `virkeepaliveprotocol.x`: PING/PONG.
    pub mod keepalive { include!(concat!(env!("OUT_DIR"), "/protocol/keepalive.rs")); }
    /// `remote_protocol.x`: the main program.
    pub mod remote { include!(concat!(env!("OUT_DIR"), "/protocol/remote.rs")); }
    /// `qemu_protocol.x`: QEMU-specific calls (monitor, guest agent).
    pub mod qemu { include!(concat!(env!("OUT_DIR"), "/protocol/qemu.rs")); }
    /// `lxc_protocol.x`: LXC-specific calls.
    pub mod lxc { include!(concat!(env!("OUT_DIR"), "/protocol/lxc.rs")); }
    /// `admin_protocol.x`: the daemon administration program.
    pub mod admin { include!(concat!(env!("OUT_DIR"), "/protocol/admin.rs")); }

    include!("../protocol_files.rs");

    /// Every program's procedure table, by program name.
    pub const PROGRAMS: &[(&str, &[crate::xdr::ProcedureInfo])] = &[
        ("remote", remote::PROCEDURES),
        ("qemu", qemu::PROCEDURES),
        ("lxc", lxc::PROCEDURES),
        ("admin", admin::PROCEDURES),
        ("keepalive", keepalive::PROCEDURES),
    ];

    /// Decodes and re-encodes a value of any generated type, by XDR name.
    #[doc(hidden)]
    pub fn transcode(type_name: &str, input: &[u8]) -> Option<Result<crate::xdr::BytesMut, crate::xdr::Error>> {
        net::transcode(type_name, input)
            .or_else(|| keepalive::transcode(type_name, input))
            .or_else(|| remote::transcode(type_name, input))
            .or_else(|| qemu::transcode(type_name, input))
            .or_else(|| lxc::transcode(type_name, input))
            .or_else(|| admin::transcode(type_name, input))
    }
}

/// A fixture covering every construct the generator supports (tests only).
#[cfg(test)]
#[rustfmt::skip]
#[allow(clippy::all, non_camel_case_types, unreachable_patterns, dead_code)]
pub(crate) mod fixture {
    pub mod constructs { include!(concat!(env!("OUT_DIR"), "/fixture/constructs.rs")); }
}

#[cfg(test)]
mod fixture_tests;

//! Readiness: a minimal hand-encoded libvirt RPC exchange on the instance's unix socket.
//!
//! libvirtd listens before its drivers are initialised but accepts clients only after, so a
//! TCP connect says little; a reply to a call does. The qemu driver also probes QEMU's
//! capabilities lazily, on the first call that needs them (~8 s on two cores when the cache
//! under /var/cache/libvirt is cold); asking for the hypervisor version here pays that cost
//! during start rather than in the first call of a test with a short timeout.

use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use super::{Error, Result};

const REMOTE_PROGRAM: u32 = 0x2000_8086;
const REMOTE_PROTOCOL_VERSION: u32 = 1;
const PROC_CONNECT_OPEN: u32 = 1;
const PROC_CONNECT_GET_VERSION: u32 = 4;
const TYPE_CALL: u32 = 0;
const STATUS_OK: u32 = 0;
const HEADER_LEN: usize = 28;
/// Replies to these calls are a few words; anything larger is not one.
const MAX_REPLY_LEN: usize = 64 * 1024;

/// A connection on which `CONNECT_OPEN qemu:///system` succeeded.
#[derive(Debug)]
pub(crate) struct OpenConnection {
    stream: UnixStream,
}

/// Connects and opens `qemu:///system`. `None` while the daemon does not answer within `wait`
/// (socket absent, or clients not accepted yet); an error when it answers with a failure.
pub(crate) async fn try_open(socket: &Path, wait: Duration) -> Option<Result<OpenConnection>> {
    let attempt = async {
        let mut stream = UnixStream::connect(socket).await.ok()?;
        let open = call(PROC_CONNECT_OPEN, 1, &connect_open_args("qemu:///system"));
        stream.write_all(&open).await.ok()?;
        let status = read_reply_status(&mut stream).await.ok()?;
        Some(if status == STATUS_OK {
            Ok(OpenConnection { stream })
        } else {
            Err(Error::OpenRefused(status))
        })
    };
    tokio::time::timeout(wait, attempt).await.ok().flatten()
}

impl OpenConnection {
    /// `CONNECT_GET_VERSION`: makes the qemu driver load or probe QEMU's capabilities.
    pub(crate) async fn get_version(&mut self) -> Result<()> {
        let get_version = call(PROC_CONNECT_GET_VERSION, 2, &[]);
        self.stream
            .write_all(&get_version)
            .await
            .map_err(|source| Error::io("send CONNECT_GET_VERSION", source))?;
        let status = read_reply_status(&mut self.stream).await?;
        if status != STATUS_OK {
            return Err(Error::GetVersionFailed(status));
        }
        Ok(())
    }
}

fn call(procedure: u32, serial: u32, args: &[u8]) -> Vec<u8> {
    let len = u32::try_from(HEADER_LEN + args.len()).expect("small call");
    let header = [
        len,
        REMOTE_PROGRAM,
        REMOTE_PROTOCOL_VERSION,
        procedure,
        TYPE_CALL,
        serial,
        STATUS_OK,
    ];
    let mut packet: Vec<u8> = header.iter().flat_map(|w| w.to_be_bytes()).collect();
    packet.extend_from_slice(args);
    packet
}

/// `remote_connect_open_args { remote_string name; int flags; }`: name present, flags 0.
fn connect_open_args(name: &str) -> Vec<u8> {
    let len = u32::try_from(name.len()).expect("short name");
    let mut args = Vec::new();
    args.extend_from_slice(&1_u32.to_be_bytes());
    args.extend_from_slice(&len.to_be_bytes());
    args.extend_from_slice(name.as_bytes());
    args.resize(args.len() + (4 - name.len() % 4) % 4, 0);
    args.extend_from_slice(&0_u32.to_be_bytes());
    args
}

/// Reads one whole reply packet and returns its status word.
async fn read_reply_status(stream: &mut UnixStream) -> Result<u32> {
    let mut len = [0_u8; 4];
    stream
        .read_exact(&mut len)
        .await
        .map_err(|source| Error::io("read reply length", source))?;
    let len = u32::from_be_bytes(len) as usize;
    if !(HEADER_LEN..=MAX_REPLY_LEN).contains(&len) {
        return Err(Error::ImplausibleReply(len));
    }
    let mut rest = vec![0_u8; len - 4];
    stream
        .read_exact(&mut rest)
        .await
        .map_err(|source| Error::io("read reply", source))?;
    let status = u32::from_be_bytes(rest[20..24].try_into().expect("4 bytes"));
    Ok(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_connect_open() {
        let packet = call(PROC_CONNECT_OPEN, 1, &connect_open_args("qemu:///system"));
        let words: Vec<String> = packet
            .chunks(4)
            .map(|w| w.iter().map(|b| format!("{b:02x}")).collect())
            .collect();
        #[rustfmt::skip]
        let expected = [
            // length 56, program, version 1, CONNECT_OPEN, CALL, serial 1, OK
            "00000038", "20008086", "00000001", "00000001", "00000000", "00000001", "00000000",
            // name: present, 14 bytes "qemu:///system", 2 bytes of padding
            "00000001", "0000000e", "71656d75", "3a2f2f2f", "73797374", "656d0000",
            // flags
            "00000000",
        ];
        assert_eq!(words, expected);
    }
}

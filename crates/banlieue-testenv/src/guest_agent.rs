//! A booted guest, read the way an operator would: through its qemu-guest-agent with `virsh
//! qemu-agent-command`, a client independent of banlieue's own. Files are read with
//! guest-file-open/read/close and written with guest-file-open/write/close; commands run with
//! guest-exec and guest-exec-status.

use std::string::FromUtf8Error;
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};

use crate::libvirtd::{self, Libvirtd};

/// What can go wrong talking to a guest through its agent.
#[derive(thiserror::Error)]
pub enum Error {
    /// virsh failed: the guest, its agent or the daemon did not answer.
    #[error(transparent)]
    Virsh(#[from] libvirtd::Error),
    #[error("parse the agent's reply {reply:?}")]
    Reply {
        reply: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("guest-file-open {path}: no handle")]
    NoHandle { path: String },
    #[error("guest-file-read {path}: no buf-b64 in {reply}")]
    NoData { path: String, reply: Value },
    #[error("guest-file-write {path}: {len} bytes not all written: {reply}")]
    ShortWrite {
        path: String,
        len: usize,
        reply: Value,
    },
    #[error("{path} is not UTF-8")]
    NotUtf8 {
        path: String,
        #[source]
        source: FromUtf8Error,
    },
    #[error("guest-exec {path}: no pid")]
    NoPid { path: String },
    #[error("{path} {args:?} did not exit within 60 s in {domain}")]
    ExecTimeout {
        path: String,
        args: Vec<String>,
        domain: String,
    },
    #[error("{path} {args:?} exited {exit_code} in {domain}: {stderr}")]
    Failed {
        path: String,
        args: Vec<String>,
        domain: String,
        exit_code: i64,
        stderr: String,
    },
    #[error("{path} holds {len} bytes, not an EFI variable (4 attribute bytes and a value)")]
    NotEfiVariable { path: String, len: usize },
    #[error("not base64: {b64:?}")]
    NotBase64 {
        b64: String,
        #[source]
        source: base64::DecodeError,
    },
}

/// The message chain rather than the structure, as the control plane's error: tests report
/// errors with `expect`, which prints `Debug`.
impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&crate::control_plane::error_chain(self))
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// One agent command's JSON reply (`{"return": …}`), or the error virsh printed.
pub async fn command(daemon: &Libvirtd, domain: &str, command: &Value) -> Result<Value> {
    let out = daemon
        .virsh(["qemu-agent-command", domain, &command.to_string()])
        .await?;
    serde_json::from_str(&out).map_err(|source| Error::Reply { reply: out, source })
}

/// A guest file's bytes.
pub async fn read_file(daemon: &Libvirtd, domain: &str, path: &str) -> Result<Vec<u8>> {
    let open = json!({"execute": "guest-file-open", "arguments": {"path": path}});
    let handle = command(daemon, domain, &open).await?["return"]
        .as_i64()
        .ok_or_else(|| Error::NoHandle {
            path: path.to_owned(),
        })?;
    let read = json!({
        "execute": "guest-file-read",
        "arguments": {"handle": handle, "count": 1 << 20}
    });
    let reply = command(daemon, domain, &read).await;
    let close = json!({"execute": "guest-file-close", "arguments": {"handle": handle}});
    command(daemon, domain, &close).await?;
    let reply = reply?;
    let Some(b64) = reply["return"]["buf-b64"].as_str() else {
        return Err(Error::NoData {
            path: path.to_owned(),
            reply,
        });
    };
    decode(b64)
}

/// Writes `bytes` to a guest file (created or truncated, as `fopen` mode "w" does) and closes
/// it. Not atomic: the agent cannot rename, so a reader may see the file empty or part-written
/// until the close.
pub async fn write_file(daemon: &Libvirtd, domain: &str, path: &str, bytes: &[u8]) -> Result<()> {
    let open = json!({"execute": "guest-file-open", "arguments": {"path": path, "mode": "w"}});
    let handle = command(daemon, domain, &open).await?["return"]
        .as_i64()
        .ok_or_else(|| Error::NoHandle {
            path: path.to_owned(),
        })?;
    let write = json!({
        "execute": "guest-file-write",
        "arguments": {
            "handle": handle,
            "buf-b64": base64::engine::general_purpose::STANDARD.encode(bytes)
        }
    });
    let written = command(daemon, domain, &write).await;
    let close = json!({"execute": "guest-file-close", "arguments": {"handle": handle}});
    command(daemon, domain, &close).await?;
    let written = written?;
    match written["return"]["count"].as_u64() {
        Some(count) if count == bytes.len() as u64 => Ok(()),
        _ => Err(Error::ShortWrite {
            path: path.to_owned(),
            len: bytes.len(),
            reply: written,
        }),
    }
}

/// A guest file as UTF-8 text.
pub async fn read_text(daemon: &Libvirtd, domain: &str, path: &str) -> Result<String> {
    String::from_utf8(read_file(daemon, domain, path).await?).map_err(|source| Error::NotUtf8 {
        path: path.to_owned(),
        source,
    })
}

/// The UEFI global variable `SecureBoot` as Linux's efivarfs shows it: four attribute bytes,
/// then the value, 1 when the firmware enforces Secure Boot.
pub const SECURE_BOOT_EFIVAR: &str =
    "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c";

/// Whether the guest's firmware booted it with Secure Boot enforced, from the guest's side.
pub async fn secure_boot(daemon: &Libvirtd, domain: &str) -> Result<bool> {
    let bytes = read_file(daemon, domain, SECURE_BOOT_EFIVAR).await?;
    secure_boot_value(&bytes).ok_or_else(|| Error::NotEfiVariable {
        path: SECURE_BOOT_EFIVAR.to_owned(),
        len: bytes.len(),
    })
}

/// The value of an efivarfs `SecureBoot` file: `None` unless it is attributes and one byte.
fn secure_boot_value(bytes: &[u8]) -> Option<bool> {
    match bytes {
        [_, _, _, _, value] => Some(*value == 1),
        _ => None,
    }
}

/// What a command run in the guest printed, and how it exited.
#[derive(Clone, Debug)]
pub struct Exec {
    pub exit_code: i64,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// Runs `path args…` in the guest and waits (up to 60 s) for it to exit.
pub async fn exec(daemon: &Libvirtd, domain: &str, path: &str, args: &[&str]) -> Result<Exec> {
    let start = json!({
        "execute": "guest-exec",
        "arguments": {"path": path, "arg": args, "capture-output": true}
    });
    let pid = command(daemon, domain, &start).await?["return"]["pid"]
        .as_i64()
        .ok_or_else(|| Error::NoPid {
            path: path.to_owned(),
        })?;
    let started = Instant::now();
    loop {
        let status = json!({"execute": "guest-exec-status", "arguments": {"pid": pid}});
        let reply = command(daemon, domain, &status).await?;
        let r = &reply["return"];
        if r["exited"].as_bool() == Some(true) {
            let field = |name: &str| -> Result<Vec<u8>> {
                r[name].as_str().map(decode).unwrap_or(Ok(Vec::new()))
            };
            return Ok(Exec {
                exit_code: r["exitcode"].as_i64().unwrap_or(-1),
                stdout: field("out-data")?,
                stderr: field("err-data")?,
            });
        }
        if started.elapsed() > Duration::from_secs(60) {
            return Err(Error::ExecTimeout {
                path: path.to_owned(),
                args: owned(args),
                domain: domain.to_owned(),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs a command that must succeed; returns its stdout.
pub async fn run(daemon: &Libvirtd, domain: &str, path: &str, args: &[&str]) -> Result<Vec<u8>> {
    let out = exec(daemon, domain, path, args).await?;
    if out.exit_code != 0 {
        return Err(Error::Failed {
            path: path.to_owned(),
            args: owned(args),
            domain: domain.to_owned(),
            exit_code: out.exit_code,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(out.stdout)
}

fn decode(b64: &str) -> Result<Vec<u8>> {
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|source| Error::NotBase64 {
            b64: b64.to_owned(),
            source,
        })
}

fn owned(args: &[&str]) -> Vec<String> {
    args.iter().map(|&arg| arg.to_owned()).collect()
}

#[cfg(test)]
mod tests {
    use super::secure_boot_value;

    #[test]
    fn secure_boot_is_the_byte_after_the_attributes() {
        // Attributes NV|BS|RT (0x06 little-endian), then the value.
        assert_eq!(secure_boot_value(&[6, 0, 0, 0, 1]), Some(true));
        assert_eq!(secure_boot_value(&[6, 0, 0, 0, 0]), Some(false));
        assert_eq!(secure_boot_value(&[6, 0, 0, 0]), None);
        assert_eq!(secure_boot_value(&[6, 0, 0, 0, 1, 0]), None);
        assert_eq!(secure_boot_value(&[]), None);
    }
}

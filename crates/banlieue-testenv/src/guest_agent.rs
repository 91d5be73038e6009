//! A booted guest, read the way an operator would: through its qemu-guest-agent with `virsh
//! qemu-agent-command`, a client independent of banlieue's own. Files are read with
//! guest-file-open/read/close; commands run with guest-exec and guest-exec-status.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use base64::Engine;
use serde_json::{Value, json};

use crate::libvirtd::Libvirtd;

/// One agent command's JSON reply (`{"return": …}`), or the error virsh printed.
pub async fn command(daemon: &Libvirtd, domain: &str, command: &Value) -> Result<Value> {
    let out = daemon
        .virsh(["qemu-agent-command", domain, &command.to_string()])
        .await?;
    serde_json::from_str(&out).with_context(|| format!("agent reply {out:?}"))
}

/// A guest file's bytes.
pub async fn read_file(daemon: &Libvirtd, domain: &str, path: &str) -> Result<Vec<u8>> {
    let open = json!({"execute": "guest-file-open", "arguments": {"path": path}});
    let handle = command(daemon, domain, &open).await?["return"]
        .as_i64()
        .with_context(|| format!("guest-file-open {path}: no handle"))?;
    let read = json!({
        "execute": "guest-file-read",
        "arguments": {"handle": handle, "count": 1 << 20}
    });
    let reply = command(daemon, domain, &read).await;
    let close = json!({"execute": "guest-file-close", "arguments": {"handle": handle}});
    command(daemon, domain, &close).await?;
    let reply = reply?;
    let b64 = reply["return"]["buf-b64"]
        .as_str()
        .with_context(|| format!("guest-file-read {path}: no buf-b64 in {reply}"))?;
    decode(b64)
}

/// A guest file as UTF-8 text.
pub async fn read_text(daemon: &Libvirtd, domain: &str, path: &str) -> Result<String> {
    String::from_utf8(read_file(daemon, domain, path).await?)
        .with_context(|| format!("{path} is not UTF-8"))
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
        .with_context(|| format!("guest-exec {path}: no pid"))?;
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
            bail!("{path} {args:?} did not exit within 60 s in {domain}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs a command that must succeed; returns its stdout.
pub async fn run(daemon: &Libvirtd, domain: &str, path: &str, args: &[&str]) -> Result<Vec<u8>> {
    let out = exec(daemon, domain, path, args).await?;
    ensure!(
        out.exit_code == 0,
        "{path} {args:?} exited {} in {domain}: {}",
        out.exit_code,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(out.stdout)
}

fn decode(b64: &str) -> Result<Vec<u8>> {
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .with_context(|| format!("not base64: {b64:?}"))
}

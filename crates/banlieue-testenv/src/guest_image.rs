//! The test guest image: Debian with cloud-init, qemu-guest-agent, tpm2-tools and banlieue's
//! guest-phase layer (`guest/`), built by `scripts/guest-image` and cached under
//! `~/.cache/banlieue/images/` keyed by the script's and `guest/`'s contents.
//!
//! A test that boots a real guest calls [`path`]: it returns at once when the image is
//! cached, and builds it (two to three minutes) when it is not. There is no
//! skipping: a machine that cannot build the image fails the test and says why.

use std::path::PathBuf;
use std::process::Stdio;

use anyhow::{Context, Result, bail};

/// The script that builds the image, relative to the workspace root.
pub const SCRIPT: &str = "scripts/guest-image";

/// Where the layer's phase file is inside a guest (guest/README.md).
pub const PHASE_FILE: &str = "/run/banlieue/phase";
/// Where the layer puts the vTPM's RSA EK certificate as PEM (guest/README.md).
pub const EK_RSA_PEM: &str = "/run/banlieue/ek/rsa.pem";
/// Where the layer puts the vTPM's ECC EK certificate as PEM (guest/README.md).
pub const EK_ECC_PEM: &str = "/run/banlieue/ek/ecc.pem";

/// The cached image's path, building it first if needed.
pub async fn path() -> Result<PathBuf> {
    build(&[]).await
}

/// The cached installer CD's path (`scripts/guest-image --installer`), building it first if
/// needed: booted from an EFI domain's CD-ROM beside an empty virtio disk, it writes the image
/// onto the disk and reboots into it, which is what a Deferred image does.
pub async fn installer_path() -> Result<PathBuf> {
    build(&["--installer"]).await
}

async fn build(args: &[&str]) -> Result<PathBuf> {
    let script = crate::repo_path(SCRIPT);
    let output = tokio::process::Command::new(&script)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .await
        .with_context(|| format!("run {}", script.display()))?;
    // One line per build step (none when cached), naming the log that holds the rest.
    let steps = String::from_utf8_lossy(&output.stderr);
    eprint!("{steps}");
    if !output.status.success() {
        bail!(
            "cannot build the test guest image ({SCRIPT} {}); run scripts/setup (part \
             70-guest-image) on this machine. The script said:\n{}",
            output.status,
            steps.trim_end()
        );
    }
    let stdout = String::from_utf8(output.stdout).context("the image path is not UTF-8")?;
    let image = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
    if !image.is_file() {
        bail!("{SCRIPT} printed {image:?}, which is not a file");
    }
    Ok(image)
}

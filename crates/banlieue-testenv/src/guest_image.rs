//! The test guest image: Debian with cloud-init, qemu-guest-agent, tpm2-tools, openssh-server
//! and banlieue's guest-phase layer (`guest/`), built by `scripts/guest-image` and cached under
//! `~/.cache/banlieue/images/` keyed by the script's and `guest/`'s contents.
//!
//! A test that boots a real guest calls [`path`]: it returns at once when the image is
//! cached, and builds it (two to three minutes) when it is not. There is no
//! skipping: a machine that cannot build the image fails the test and says why.

use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::string::FromUtf8Error;

/// The script that builds the image, relative to the workspace root.
pub const SCRIPT: &str = "scripts/guest-image";

/// Where the layer's phase file is inside a guest (guest/README.md).
pub const PHASE_FILE: &str = "/run/banlieue/phase";
/// Where the layer puts the vTPM's RSA EK certificate as PEM (guest/README.md).
pub const EK_RSA_PEM: &str = "/run/banlieue/ek/rsa.pem";
/// Where the layer puts the vTPM's ECC EK certificate as PEM (guest/README.md).
pub const EK_ECC_PEM: &str = "/run/banlieue/ek/ecc.pem";
/// Where the layer publishes sshd's host keys, `TYPE BASE64` a line (guest/README.md).
pub const SSH_HOST_KEYS: &str = "/run/banlieue/ssh/host_keys";
/// Where the host writes an access request for the layer to install (guest/README.md).
pub const ACCESS_WANTED: &str = "/run/banlieue/access/wanted";
/// Where the layer answers the access request: `installed USER SHA256` or `failed: <why>`.
pub const ACCESS_STATE: &str = "/run/banlieue/access/state";

/// Why the test guest image is not there.
#[derive(thiserror::Error)]
pub enum Error {
    #[error("failed to run {}", script.display())]
    Run {
        script: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "cannot build the test guest image ({SCRIPT} {status}); run scripts/setup (part \
         70-guest-image) on this machine. The script said:\n{said}"
    )]
    Build { status: ExitStatus, said: String },
    #[error("the image path is not UTF-8")]
    PathNotUtf8(#[source] FromUtf8Error),
    #[error("{SCRIPT} printed {0:?}, which is not a file")]
    NotAFile(PathBuf),
}

/// The message chain rather than the structure, as the control plane's error: tests report
/// errors with `expect`, which prints `Debug`, and the reader wants what the script said.
impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&crate::control_plane::error_chain(self))
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

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
        .map_err(|source| Error::Run {
            script: script.clone(),
            source,
        })?;
    // One line per build step (none when cached), naming the log that holds the rest.
    let steps = String::from_utf8_lossy(&output.stderr);
    eprint!("{steps}");
    if !output.status.success() {
        return Err(Error::Build {
            status: output.status,
            said: steps.trim_end().to_owned(),
        });
    }
    let stdout = String::from_utf8(output.stdout).map_err(Error::PathNotUtf8)?;
    let image = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
    if !image.is_file() {
        return Err(Error::NotAFile(image));
    }
    Ok(image)
}

//! The guest-phase layer's script (guest/banlieue-guest-phase) against its contract
//! (guest/README.md), run on the host with its paths moved into a temp dir: no guest needed.
//! `tests/guest.rs` checks the same layer in a booted guest.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Command, Output};

use anyhow::{Context, Result, ensure};
use tempfile::TempDir;

fn script() -> PathBuf {
    banlieue_testenv::repo_path("guest/banlieue-guest-phase")
}

/// A guest's /run in a temp dir: the layer's directory, cloud-init's and a bin/ for fakes.
struct Guest {
    dir: TempDir,
    tpm_devices: String,
}

impl Guest {
    fn new() -> Result<Self> {
        let dir = tempfile::tempdir()?;
        fs::create_dir(dir.path().join("bin"))?;
        Ok(Self {
            dir,
            tpm_devices: "/nonexistent/tpm".into(),
        })
    }

    fn layer(&self) -> PathBuf {
        self.dir.path().join("banlieue")
    }

    fn cloud_init_result(&self, json: &str) -> Result<()> {
        let run = self.dir.path().join("cloud-init");
        fs::create_dir_all(&run)?;
        fs::write(run.join("result.json"), json)?;
        Ok(())
    }

    /// A `tpm2_nvread` on PATH that serves `der` at 0x01c00002 and nothing else.
    fn fake_tpm(&mut self, der: &[u8]) -> Result<()> {
        fs::write(self.dir.path().join("ek.der"), der)?;
        let fake = self.dir.path().join("bin/tpm2_nvread");
        fs::write(
            &fake,
            format!(
                "#!/bin/sh\n[ \"$1\" = 0x01c00002 ] && [ \"$2\" = -o ] || exit 1\ncp {}/ek.der \"$3\"\n",
                self.dir.path().display()
            ),
        )?;
        fs::set_permissions(&fake, fs::Permissions::from_mode(0o755))?;
        // A character device the script takes for a TPM.
        self.tpm_devices = "/dev/null".into();
        Ok(())
    }

    fn run(&self, args: &[&str]) -> Result<Output> {
        let path = format!(
            "{}:{}",
            self.dir.path().join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        Command::new("sh")
            .arg(script())
            .args(args)
            .env("BANLIEUE_GUEST_DIR", self.layer())
            .env(
                "BANLIEUE_CLOUD_INIT_RUN",
                self.dir.path().join("cloud-init"),
            )
            .env("BANLIEUE_TPM_DEVICES", &self.tpm_devices)
            .env("PATH", path)
            .output()
            .context("run guest/banlieue-guest-phase")
    }

    fn ok(&self, args: &[&str]) -> Result<String> {
        let out = self.run(args)?;
        ensure!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8(out.stdout)?)
    }

    fn phase(&self) -> Result<String> {
        let file = self.layer().join("phase");
        let mode = fs::metadata(&file)?.permissions().mode() & 0o777;
        ensure!(mode == 0o644, "phase file mode {mode:o}");
        Ok(fs::read_to_string(file)?)
    }
}

#[test]
fn boot_says_configuring_once_and_keeps_an_installers_phase() -> Result<()> {
    let guest = Guest::new()?;
    ensure!(guest.ok(&["boot"])? == "banlieue-guest-phase: configuring\n");
    ensure!(guest.phase()? == "configuring\n");
    let mode = fs::metadata(guest.layer())?.permissions().mode() & 0o777;
    ensure!(mode == 0o755, "layer directory mode {mode:o}");

    let installer = Guest::new()?;
    installer.ok(&["set", "installing"])?;
    ensure!(installer.ok(&["boot"])?.is_empty());
    ensure!(installer.phase()? == "installing\n");
    Ok(())
}

#[test]
fn set_refuses_what_is_not_a_phase_and_keeps_reasons_on_one_line() -> Result<()> {
    let guest = Guest::new()?;
    for bad in ["", "Ready", "failed", "failed: ", "done"] {
        let out = guest.run(&["set", bad])?;
        ensure!(out.status.code() == Some(2), "set {bad:?} was accepted");
    }
    ensure!(!guest.layer().join("phase").exists());
    guest.ok(&["set", "failed: disk\nfull\tagain"])?;
    ensure!(guest.phase()? == "failed: disk full again\n");
    guest.ok(&["set", &format!("failed: {}", "x".repeat(4000))])?;
    ensure!(guest.phase()?.len() == 1025);
    Ok(())
}

#[test]
fn finish_is_ready_after_a_clean_cloud_init_or_without_one() -> Result<()> {
    let without = Guest::new()?;
    ensure!(without.ok(&["finish"])? == "banlieue-guest-phase: ready\n");
    ensure!(without.phase()? == "ready\n");
    ensure!(!without.layer().join("ek").exists());

    let clean = Guest::new()?;
    clean.cloud_init_result(
        "{\n \"v1\": {\n  \"datasource\": \"DataSourceNoCloud\",\n  \"errors\": []\n }\n}\n",
    )?;
    clean.ok(&["finish"])?;
    ensure!(clean.phase()? == "ready\n");
    Ok(())
}

#[test]
fn finish_is_failed_with_cloud_inits_errors() -> Result<()> {
    let guest = Guest::new()?;
    guest.cloud_init_result(
        "{\n \"v1\": {\n  \"datasource\": \"DataSourceNoCloud\",\n  \"errors\": [\n   \"('modules:final', RuntimeError('runcmd failed'))\"\n  ]\n }\n}\n",
    )?;
    guest.ok(&["finish"])?;
    ensure!(
        guest.phase()?
            == "failed: cloud-init: \"('modules:final', RuntimeError('runcmd failed'))\"\n",
        "{:?}",
        guest.phase()?
    );
    Ok(())
}

#[test]
fn finish_publishes_the_ek_certificate_as_pem_before_ready() -> Result<()> {
    let mut guest = Guest::new()?;
    let der: Vec<u8> = (0..=255u8).cycle().take(700).collect();
    guest.fake_tpm(&der)?;
    let out = guest.ok(&["finish"])?;
    ensure!(out.ends_with("banlieue-guest-phase: ready\n"), "{out}");
    ensure!(guest.phase()? == "ready\n");
    let pem = fs::read_to_string(guest.layer().join("ek/rsa.pem"))?;
    let body: Vec<&str> = pem.lines().collect();
    ensure!(
        body.first() == Some(&"-----BEGIN CERTIFICATE-----"),
        "{pem}"
    );
    ensure!(body.last() == Some(&"-----END CERTIFICATE-----"), "{pem}");
    ensure!(body[1..body.len() - 1].iter().all(|l| l.len() <= 64));
    let b64 = guest.dir.path().join("body.b64");
    fs::write(&b64, body[1..body.len() - 1].join("\n"))?;
    let decoded = Command::new("base64").arg("-d").arg(&b64).output()?;
    ensure!(
        decoded.status.success() && decoded.stdout == der,
        "the PEM is not the DER"
    );
    ensure!(
        !guest.layer().join("ek/ecc.pem").exists(),
        "an index the TPM does not hold has no file"
    );
    Ok(())
}

#[test]
fn finish_is_failed_for_a_tpm_without_ek_certificates() -> Result<()> {
    let mut guest = Guest::new()?;
    guest.fake_tpm(&[])?;
    guest.ok(&["finish"])?;
    let phase = guest.phase()?;
    ensure!(
        phase
            == "failed: a TPM (/dev/null) without an EK certificate at 0x01c00002 or 0x01c00016\n",
        "{phase:?}"
    );
    Ok(())
}

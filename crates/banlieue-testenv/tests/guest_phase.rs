//! The guest-phase layer's script (guest/banlieue-guest-phase) against its contract
//! (guest/README.md), run on the host with its paths moved into a temp dir: no guest needed.
//! `tests/guest.rs` checks the same layer in a booted guest.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use base64::Engine;
use sha2::{Digest, Sha256};
use tempfile::TempDir;

fn script() -> PathBuf {
    banlieue_testenv::repo_path("guest/banlieue-guest-phase")
}

/// A guest's /run in a temp dir: the layer's directory, cloud-init's, an /etc/ssh, a passwd
/// file and homes, and a bin/ for fakes.
struct Guest {
    dir: TempDir,
    tpm_devices: String,
}

impl Guest {
    fn new() -> Result<Self> {
        let dir = tempfile::tempdir()?;
        for sub in ["bin", "ssh", "home"] {
            fs::create_dir(dir.path().join(sub))?;
        }
        fs::write(dir.path().join("passwd"), "")?;
        let guest = Self {
            dir,
            tpm_devices: "/nonexistent/tpm".into(),
        };
        guest.fake_accounts()?;
        Ok(guest)
    }

    fn layer(&self) -> PathBuf {
        self.dir.path().join("banlieue")
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.dir.path().join(relative)
    }

    fn cloud_init_result(&self, json: &str) -> Result<()> {
        let run = self.dir.path().join("cloud-init");
        fs::create_dir_all(&run)?;
        fs::write(run.join("result.json"), json)?;
        Ok(())
    }

    fn fake(&self, name: &str, body: &str) -> Result<()> {
        let fake = self.path("bin").join(name);
        fs::write(&fake, format!("#!/bin/sh\n{body}"))?;
        fs::set_permissions(&fake, fs::Permissions::from_mode(0o755))?;
        Ok(())
    }

    /// `getent passwd` and `useradd` over the temp dir's passwd file and homes; each logs its
    /// arguments to `<name>.log`.
    fn fake_accounts(&self) -> Result<()> {
        let dir = self.dir.path().display().to_string();
        self.fake(
            "getent",
            &format!(
                "[ \"$1\" = passwd ] || exit 2\n\
                 case $2 in\n\
                 *[!0-9]*) field=1 ;;\n\
                 *) field=3 ;;\n\
                 esac\n\
                 awk -F: -v f=\"$field\" -v k=\"$2\" '$f == k {{ print; found = 1; exit }} \
                 END {{ exit found ? 0 : 2 }}' {dir}/passwd\n"
            ),
        )?;
        self.fake(
            "useradd",
            &format!(
                "echo \"$*\" >>{dir}/useradd.log\n\
                 for name; do :; done\n\
                 uid=$((2000 + $(wc -l <{dir}/passwd)))\n\
                 mkdir -p {dir}/home/$name\n\
                 echo \"$name:x:$uid:$uid::{dir}/home/$name:/bin/sh\" >>{dir}/passwd\n"
            ),
        )
    }

    /// An account as /etc/passwd would hold it, with its home.
    fn account(&self, name: &str, uid: u32) -> Result<PathBuf> {
        let home = self.path("home").join(name);
        fs::create_dir_all(&home)?;
        let mut passwd = fs::read_to_string(self.path("passwd"))?;
        passwd.push_str(&format!(
            "{name}:x:{uid}:{uid}::{}:/bin/sh\n",
            home.display()
        ));
        fs::write(self.path("passwd"), passwd)?;
        Ok(home)
    }

    /// An sshd "installed", and an `ssh-keygen` on PATH that logs its arguments and writes a
    /// key pair where `-f` says.
    fn install_sshd(&self) -> Result<()> {
        fs::write(self.path("sshd"), "")?;
        self.fake(
            "ssh-keygen",
            &format!(
                "echo \"$*\" >>{}/ssh-keygen.log\n\
                 while [ $# -gt 1 ]; do [ \"$1\" = -f ] && file=$2; shift; done\n\
                 echo private >\"$file\"\n\
                 echo 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGVk root@build' >\"$file.pub\"\n",
                self.dir.path().display()
            ),
        )
    }

    /// A `tpm2_nvread` on PATH that serves `der` at 0x01c00002 and nothing else.
    fn fake_tpm(&mut self, der: &[u8]) -> Result<()> {
        fs::write(self.dir.path().join("ek.der"), der)?;
        self.fake(
            "tpm2_nvread",
            &format!(
                "[ \"$1\" = 0x01c00002 ] && [ \"$2\" = -o ] || exit 1\ncp {}/ek.der \"$3\"\n",
                self.dir.path().display()
            ),
        )?;
        // A character device the script takes for a TPM.
        self.tpm_devices = "/dev/null".into();
        // The key tools write what their -u, -n and -c name, and log their arguments and the
        // TCTI they were given.
        let log = self.dir.path().display().to_string();
        let writer = |name: &str| {
            format!(
                "echo \"$TPM2TOOLS_TCTI $*\" >>{log}/{name}.log\n\
                 while [ $# -gt 1 ]; do\n\
                 case $1 in -u) echo \"{name} public\" >\"$2\" ;; -n) echo name >\"$2\" ;; \
                 -c) echo context >\"$2\" ;; esac\n\
                 shift\n\
                 done\n"
            )
        };
        self.fake("tpm2_createek", &writer("tpm2_createek"))?;
        self.fake("tpm2_createak", &writer("tpm2_createak"))
    }

    /// The tools `activate` runs: the TPM releases `secret` for a challenge file holding
    /// "for this ak", and refuses anything else as a TPM would; the quote's tools write their
    /// files (the quote carries the extra data it was given, so a test can read it back).
    fn fake_activation(&self, secret: &[u8]) -> Result<()> {
        let dir = self.dir.path().display().to_string();
        self.fake(
            "tpm2_quote",
            &format!(
                "echo \"$*\" >>{dir}/tpm2_quote.log\n\
                 while [ $# -gt 1 ]; do\n\
                 case $1 in -q) extra=$2 ;; -m) msg=$2 ;; -s) sig=$2 ;; -o) pcrs=$2 ;; esac\n\
                 shift\n\
                 done\n\
                 printf 'quote over %s' \"$extra\" >\"$msg\"\n\
                 printf 'signature' >\"$sig\"\n\
                 printf 'pcr values' >\"$pcrs\"\n\
                 if [ -f {dir}/next-activate ]; then mv {dir}/next-activate activate; fi\n"
            ),
        )?;
        self.fake_release(secret)
    }

    fn fake_release(&self, secret: &[u8]) -> Result<()> {
        fs::write(self.dir.path().join("secret"), secret)?;
        let dir = self.dir.path().display().to_string();
        for tool in ["tpm2_policysecret", "tpm2_flushcontext"] {
            self.fake(tool, &format!("echo \"$*\" >>{dir}/{tool}.log\n"))?;
        }
        // `--policy-session -S FILE`: the session's saved context.
        self.fake(
            "tpm2_startauthsession",
            &format!("echo \"$*\" >>{dir}/tpm2_startauthsession.log\necho session >\"$3\"\n"),
        )?;
        self.fake(
            "tpm2_activatecredential",
            &format!(
                "echo \"$*\" >>{dir}/tpm2_activatecredential.log\n\
                 while [ $# -gt 1 ]; do\n\
                 case $1 in -i) challenge=$2 ;; -o) out=$2 ;; esac\n\
                 shift\n\
                 done\n\
                 if [ \"$(cat \"$challenge\")\" != \"for this ak\" ]; then\n\
                 echo 'ERROR: Esys_ActivateCredential(0x922) - tpm:parameter(1):integrity check failed' >&2\n\
                 exit 1\n\
                 fi\n\
                 cp {dir}/secret \"$out\"\n"
            ),
        )
    }

    fn command(&self, args: &[&str]) -> Command {
        let path = format!(
            "{}:{}",
            self.dir.path().join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut command = Command::new("sh");
        command
            .arg(script())
            .args(args)
            .env("BANLIEUE_GUEST_DIR", self.layer())
            .env(
                "BANLIEUE_CLOUD_INIT_RUN",
                self.dir.path().join("cloud-init"),
            )
            .env("BANLIEUE_TPM_DEVICES", &self.tpm_devices)
            // Always moved: the machine running the tests may have an sshd of its own.
            .env("BANLIEUE_SSH_DIR", self.path("ssh"))
            .env("BANLIEUE_SSHD", self.path("sshd"))
            .env("PATH", path);
        command
    }

    fn run(&self, args: &[&str]) -> Result<Output> {
        self.command(args)
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
        ensure!(mode(&file)? == 0o644, "phase file mode {:o}", mode(&file)?);
        Ok(fs::read_to_string(file)?)
    }

    /// Writes `access/wanted` as the host's agent would, then runs `access` as the path unit
    /// would; returns what it printed.
    fn request(&self, wanted: &[u8]) -> Result<String> {
        let dir = self.layer().join("access");
        fs::create_dir_all(&dir)?;
        fs::write(dir.join("wanted"), wanted)?;
        self.ok(&["access"])
    }

    fn access_state(&self) -> Result<String> {
        let file = self.layer().join("access/state");
        ensure!(mode(&file)? == 0o644, "state file mode {:o}", mode(&file)?);
        Ok(fs::read_to_string(file)?)
    }

    fn log(&self, name: &str) -> String {
        fs::read_to_string(self.path(&format!("{name}.log"))).unwrap_or_default()
    }
}

fn mode(path: &Path) -> Result<u32> {
    Ok(fs::symlink_metadata(path)
        .with_context(|| format!("stat {}", path.display()))?
        .permissions()
        .mode()
        & 0o777)
}

/// An ed25519 public key line in OpenSSH's form, `seed` making it differ from the others.
fn ed25519_key(seed: u8, comment: &str) -> String {
    let mut blob = Vec::new();
    blob.extend_from_slice(&11u32.to_be_bytes());
    blob.extend_from_slice(b"ssh-ed25519");
    blob.extend_from_slice(&32u32.to_be_bytes());
    blob.extend_from_slice(&[seed; 32]);
    let key = base64::engine::general_purpose::STANDARD.encode(&blob);
    format!("ssh-ed25519 {key} {comment}").trim_end().to_owned()
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn boot_says_configuring_once_and_keeps_an_installers_phase() -> Result<()> {
    let guest = Guest::new()?;
    ensure!(guest.ok(&["boot"])? == "banlieue-guest-phase: configuring\n");
    ensure!(guest.phase()? == "configuring\n");
    ensure!(mode(&guest.layer())? == 0o755);

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
    // An attestation key under the EK, made through the TPM's device, before ready.
    ensure!(
        out.contains("banlieue-guest-phase: attestation key in "),
        "{out}"
    );
    let attest = guest.layer().join("attest");
    ensure!(mode(&attest)? == 0o700);
    for file in ["ek.pub", "ak.pub", "ak.name"] {
        ensure!(mode(&attest.join(file))? == 0o644, "{file}");
    }
    ensure!(fs::read_to_string(attest.join("ak.pub"))? == "tpm2_createak public\n");
    ensure!(
        guest.log("tpm2_createak")
            == "device:/dev/null -C ek.ctx -c ak.ctx -G rsa -g sha256 -s rsassa -u ak.pub -n ak.name\n",
        "{}",
        guest.log("tpm2_createak")
    );
    Ok(())
}

#[test]
fn finish_is_failed_when_no_attestation_key_can_be_made() -> Result<()> {
    let mut guest = Guest::new()?;
    guest.fake_tpm(b"der")?;
    guest.fake(
        "tpm2_createak",
        "echo 'ERROR: Esys_CreateLoaded(0x2C4) - tpm:handle(2)' >&2\nexit 1\n",
    )?;
    guest.ok(&["finish"])?;
    let phase = guest.phase()?;
    ensure!(
        phase.starts_with("failed: no attestation key: ERROR: Esys_CreateLoaded"),
        "{phase:?}"
    );
    Ok(())
}

#[test]
fn activate_answers_with_the_secret_only_for_the_named_challenge() -> Result<()> {
    use base64::Engine;
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let mut guest = Guest::new()?;
    guest.fake_tpm(b"der")?;
    guest.ok(&["finish"])?;
    let secret = [0xde, 0xad, 0x01];
    guest.fake_activation(&secret)?;
    let attest = guest.layer().join("attest");
    let challenge = b"for this ak";
    let binding = "ab".repeat(32);
    let digest = sha256_hex(challenge);
    fs::write(attest.join("challenge"), challenge)?;
    fs::write(attest.join("activate"), format!("{digest} {binding}\n"))?;
    let out = guest.ok(&["activate"])?;
    ensure!(
        out == "banlieue-guest-phase: activated the host's credential and quoted \
                sha256:0,1,2,3,4,5,6,7\n",
        "{out}"
    );
    // The proof of the secret, never the secret; the quote over the guest's own extra data
    // (this guest has no host keys: the header and the binding alone).
    let answer = fs::read_to_string(attest.join("answer"))?;
    let proof = banlieue_attest::seal::proof(&secret);
    let extra = sha256_hex(format!("banlieue handover v1\nbinding {binding}\n").as_bytes());
    ensure!(
        answer
            == format!(
                "activated {digest} {proof}\nquote {}\nsignature {}\npcrs {}\nhostkeys \n",
                b64(format!("quote over {extra}").as_bytes()),
                b64(b"signature"),
                b64(b"pcr values")
            ),
        "{answer}"
    );
    ensure!(
        !answer.contains("dead01"),
        "the answer gives the secret away"
    );
    ensure!(mode(&attest.join("answer"))? == 0o644);
    ensure!(
        guest
            .log("tpm2_activatecredential")
            .starts_with("-c ak.ctx -C ek.ctx -i "),
        "{}",
        guest.log("tpm2_activatecredential")
    );
    ensure!(
        fs::read_dir(&attest)?
            .filter_map(|e| e.ok())
            .all(|e| !e.file_name().to_string_lossy().starts_with('.')),
        "the session, the secret or a private copy was left behind"
    );
    // No session was prepared at boot here (the fakes came after): this activation made its
    // own, then prepared the next one's.
    let sessions = || guest.log("tpm2_startauthsession").lines().count();
    ensure!(sessions() == 2, "{}", guest.log("tpm2_startauthsession"));
    ensure!(attest.join("next.session").is_file(), "no session prepared");

    // A sealed payload: opened with keys from the released secret, for root here (no access
    // installed), 0600; one flipped byte and it is refused, nothing written.
    let payload = b"a deploy token";
    let sealed = banlieue_attest::seal::seal(&secret, payload, [7; 16])?;
    fs::write(attest.join("sealed"), &sealed)?;
    fs::write(
        attest.join("activate"),
        format!("{digest} {binding} {}\n", sha256_hex(&sealed)),
    )?;
    guest.ok(&["activate"])?;
    let answer = fs::read_to_string(attest.join("answer"))?;
    let opened = guest.layer().join("sealed/payload");
    ensure!(
        answer.ends_with(&format!("\nopened {}\n", opened.display())),
        "{answer}"
    );
    ensure!(fs::read(&opened)? == payload);
    ensure!(mode(&opened)? == 0o600);
    // Through the prepared session: the one made since is the next one's.
    ensure!(sessions() == 3, "{}", guest.log("tpm2_startauthsession"));
    fs::remove_file(&opened)?;
    let mut flipped = sealed.clone();
    flipped[17] ^= 1;
    fs::write(attest.join("sealed"), &flipped)?;
    fs::write(
        attest.join("activate"),
        format!("{digest} {binding} {}\n", sha256_hex(&flipped)),
    )?;
    guest.ok(&["activate"])?;
    let answer = fs::read_to_string(attest.join("answer"))?;
    ensure!(
        answer.starts_with(&format!(
            "failed {digest} the sealed payload's MAC does not match"
        )),
        "{answer}"
    );
    ensure!(!opened.exists(), "a refused payload was written");

    // A credential the TPM refuses (made for another key): its reason, no secret.
    fs::write(attest.join("challenge"), b"for another ak")?;
    let other = sha256_hex(b"for another ak");
    fs::write(attest.join("activate"), format!("{other} {binding}\n"))?;
    guest.ok(&["activate"])?;
    let answer = fs::read_to_string(attest.join("answer"))?;
    ensure!(
        answer.starts_with(&format!(
            "failed {other} ERROR: Esys_ActivateCredential(0x922)"
        )),
        "{answer}"
    );

    // activate naming other bytes than the challenge's (still being written, or a lie): after
    // waiting for the rest, a refusal naming what it was asked.
    let wrong = "0".repeat(64);
    fs::write(attest.join("activate"), format!("{wrong} {binding}\n"))?;
    guest.ok(&["activate"])?;
    let answer = fs::read_to_string(attest.join("answer"))?;
    ensure!(
        answer == format!("failed {wrong} attest/activate does not name the challenge's SHA-256\n"),
        "{answer}"
    );
    // A binding that is not a digest.
    fs::write(attest.join("challenge"), challenge)?;
    fs::write(attest.join("activate"), format!("{digest} not-hex\n"))?;
    guest.ok(&["activate"])?;
    let answer = fs::read_to_string(attest.join("answer"))?;
    ensure!(
        answer == format!("failed {digest} the binding is not a hex SHA-256\n"),
        "{answer}"
    );

    // The host's next challenge written while this one is at work (the path unit does not
    // start the step again while it runs): answered in the same run, after this one.
    let next_binding = "cd".repeat(32);
    fs::write(attest.join("activate"), format!("{digest} {binding}\n"))?;
    fs::write(
        guest.dir.path().join("next-activate"),
        format!("{digest} {next_binding}\n"),
    )?;
    let out = guest.ok(&["activate"])?;
    ensure!(
        out.matches("activated the host's credential").count() == 2,
        "{out}"
    );
    let answer = fs::read_to_string(attest.join("answer"))?;
    let next_extra =
        sha256_hex(format!("banlieue handover v1\nbinding {next_binding}\n").as_bytes());
    ensure!(
        answer.contains(&format!(
            "\nquote {}\n",
            b64(format!("quote over {next_extra}").as_bytes())
        )),
        "the next challenge was not answered: {answer}"
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

#[test]
fn boot_makes_the_access_directory_and_a_host_key_only_where_sshd_has_none() -> Result<()> {
    let without_sshd = Guest::new()?;
    ensure!(without_sshd.ok(&["boot"])? == "banlieue-guest-phase: configuring\n");
    ensure!(mode(&without_sshd.layer().join("access"))? == 0o700);
    // sshd reads the keys there as the user: traversable by all, written by root alone.
    ensure!(mode(&without_sshd.layer().join("keys"))? == 0o755);
    ensure!(without_sshd.log("ssh-keygen").is_empty());

    let fresh = Guest::new()?;
    fresh.install_sshd()?;
    let out = fresh.ok(&["boot"])?;
    ensure!(
        out.ends_with("banlieue-guest-phase: generated an ed25519 SSH host key\n"),
        "{out}"
    );
    let key = fresh.path("ssh/ssh_host_ed25519_key");
    ensure!(
        fresh.log("ssh-keygen") == format!("-q -t ed25519 -N  -f {}\n", key.display()),
        "{}",
        fresh.log("ssh-keygen")
    );
    // A second boot finds the key and makes none.
    fresh.ok(&["boot"])?;
    ensure!(fresh.log("ssh-keygen").lines().count() == 1);

    let keyed = Guest::new()?;
    keyed.install_sshd()?;
    fs::write(keyed.path("ssh/ssh_host_rsa_key"), "private")?;
    keyed.ok(&["boot"])?;
    ensure!(
        keyed.log("ssh-keygen").is_empty(),
        "a key was made beside one"
    );
    Ok(())
}

#[test]
fn finish_publishes_the_host_keys_sorted_without_comments_before_ready() -> Result<()> {
    let guest = Guest::new()?;
    guest.install_sshd()?;
    for (name, line) in [
        ("rsa", "ssh-rsa AAAAB3NzaC1yc2EAAAADAQAB root@build\n"),
        (
            "ed25519",
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGVk root@build\n",
        ),
        (
            "ecdsa",
            "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTY= two words\n",
        ),
    ] {
        fs::write(guest.path(&format!("ssh/ssh_host_{name}_key")), "private")?;
        fs::write(guest.path(&format!("ssh/ssh_host_{name}_key.pub")), line)?;
    }
    let out = guest.ok(&["finish"])?;
    ensure!(
        out == "banlieue-guest-phase: SSH host keys in \
                {dir}/ssh/host_keys: ecdsa-sha2-nistp256 ssh-ed25519 ssh-rsa\n\
                banlieue-guest-phase: ready\n"
            .replace("{dir}", &guest.layer().display().to_string()),
        "{out}"
    );
    let file = guest.layer().join("ssh/host_keys");
    ensure!(mode(&file)? == 0o644 && mode(&guest.layer().join("ssh"))? == 0o755);
    let published = fs::read_to_string(&file)?;
    ensure!(
        published
            == "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTY=\n\
                ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGVk\n\
                ssh-rsa AAAAB3NzaC1yc2EAAAADAQAB\n",
        "{published}"
    );
    ensure!(guest.phase()? == "ready\n");
    Ok(())
}

#[test]
fn finish_without_sshd_or_its_keys_publishes_none_and_is_ready() -> Result<()> {
    let without = Guest::new()?;
    fs::write(
        without.path("ssh/ssh_host_ed25519_key.pub"),
        "ssh-ed25519 AAAA x\n",
    )?;
    ensure!(without.ok(&["finish"])? == "banlieue-guest-phase: ready\n");
    ensure!(!without.layer().join("ssh").exists());

    let keyless = Guest::new()?;
    keyless.install_sshd()?;
    let out = keyless.ok(&["finish"])?;
    ensure!(
        out.starts_with("banlieue-guest-phase: no SSH host keys published: no SSH host key in ")
            && out.ends_with("banlieue-guest-phase: ready\n"),
        "{out}"
    );
    ensure!(!keyless.layer().join("ssh/host_keys").exists());
    ensure!(keyless.phase()? == "ready\n");
    Ok(())
}

/// The file sshd reads for `user` (guest/sshd-banlieue.conf), checked to be root's kind of
/// file: regular, 0644, in the 0755 keys directory.
fn installed_keys(guest: &Guest, user: &str) -> Result<String> {
    let file = guest.layer().join("keys").join(user);
    ensure!(mode(&guest.layer().join("keys"))? == 0o755);
    ensure!(
        fs::symlink_metadata(&file)?.file_type().is_file(),
        "{} is not a regular file",
        file.display()
    );
    ensure!(mode(&file)? == 0o644, "keys file mode {:o}", mode(&file)?);
    Ok(fs::read_to_string(file)?)
}

#[test]
fn access_creates_the_named_user_and_installs_exactly_its_keys() -> Result<()> {
    let guest = Guest::new()?;
    guest.ok(&["boot"])?;
    let keys = [ed25519_key(1, "alice@laptop"), ed25519_key(2, "")];
    let wanted = format!(
        "banlieue-access 1\nuser alice\nkey {}\nkey {}\nend\n",
        keys[0], keys[1]
    );
    let out = guest.request(wanted.as_bytes())?;
    ensure!(
        out == "banlieue-guest-phase: access installed for alice\n",
        "{out}"
    );
    ensure!(guest.log("useradd") == "-m -s /bin/sh alice\n");
    ensure!(installed_keys(&guest, "alice")? == format!("{}\n{}\n", keys[0], keys[1]));
    // Nothing is written in the user's home: sshd reads the layer's file for them.
    ensure!(!guest.path("home/alice/.ssh").exists());
    ensure!(
        fs::read_dir(guest.layer().join("access"))?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<Result<Vec<_>, _>>()?
            .iter()
            .all(|name| name == "wanted" || name == "state"),
        "a temp file was left behind"
    );
    let state = guest.access_state()?;
    ensure!(
        state == format!("installed alice {}\n", sha256_hex(wanted.as_bytes())),
        "{state}"
    );
    ensure!(mode(&guest.layer().join("access"))? == 0o700);

    // The same request again: the same answer, the user made once.
    guest.ok(&["access"])?;
    ensure!(guest.access_state()? == state);
    ensure!(installed_keys(&guest, "alice")? == format!("{}\n{}\n", keys[0], keys[1]));
    ensure!(guest.log("useradd").lines().count() == 1);
    Ok(())
}

#[test]
fn access_without_a_user_is_for_uid_1000_else_sandbox() -> Result<()> {
    let key = ed25519_key(3, "c");
    let wanted = format!("banlieue-access 1\nkey {key}\nend\n");

    let cloud = Guest::new()?;
    cloud.account("root", 0)?;
    cloud.account("debian", 1000)?;
    ensure!(
        cloud.request(wanted.as_bytes())? == "banlieue-guest-phase: access installed for debian\n"
    );
    ensure!(cloud.log("useradd").is_empty());
    ensure!(installed_keys(&cloud, "debian")? == format!("{key}\n"));
    ensure!(
        cloud.access_state()? == format!("installed debian {}\n", sha256_hex(wanted.as_bytes()))
    );

    let bare = Guest::new()?;
    bare.account("root", 0)?;
    bare.request(wanted.as_bytes())?;
    ensure!(bare.log("useradd") == "-m -s /bin/sh sandbox\n");
    ensure!(installed_keys(&bare, "sandbox")? == format!("{key}\n"));
    ensure!(bare.access_state()?.starts_with("installed sandbox "));
    Ok(())
}

#[test]
fn access_refuses_a_malformed_request_and_installs_nothing() -> Result<()> {
    let key = ed25519_key(4, "c");
    let encoded = key.split(' ').nth(1).context("no base64")?.to_owned();
    let many: String = (0..17)
        .map(|i| format!("key {}\n", ed25519_key(i, "")))
        .collect();
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "bad header",
            format!("banlieue-access 2\nkey {key}\nend\n"),
            "line 1 is not \"banlieue-access 1\"",
        ),
        (
            "bad user",
            format!("banlieue-access 1\nuser Alice\nkey {key}\nend\n"),
            "line 2: \"Alice\" is not a user name",
        ),
        (
            "long user",
            format!(
                "banlieue-access 1\nuser {}\nkey {key}\nend\n",
                "a".repeat(33)
            ),
            "is not a user name",
        ),
        (
            "user after the keys",
            format!("banlieue-access 1\nkey {key}\nuser alice\nend\n"),
            "line 3: a user line is only line 2",
        ),
        (
            "bad key type",
            format!("banlieue-access 1\nkey ssh-dss {encoded}\nend\n"),
            "line 2: the key has key type \"ssh-dss\", which is not accepted",
        ),
        (
            "options",
            format!("banlieue-access 1\nkey command=\"sh\" {key}\nend\n"),
            "which is not accepted",
        ),
        (
            "type mismatch",
            format!("banlieue-access 1\nkey ssh-rsa {encoded}\nend\n"),
            "line 2: the key does not hold a ssh-rsa key",
        ),
        (
            "ecdsa curve mismatch",
            format!(
                "banlieue-access 1\nkey ecdsa-sha2-nistp384 {}\nend\n",
                blob_key("ecdsa-sha2-nistp256")
            ),
            "line 2: the key does not hold a ecdsa-sha2-nistp384 key",
        ),
        (
            "not base64",
            "banlieue-access 1\nkey ssh-ed25519 AAAA*AAA\nend\n".into(),
            "line 2: the key is not base64 after its type",
        ),
        (
            "no key",
            "banlieue-access 1\nkey ssh-ed25519\nend\n".into(),
            "line 2: the key has no key after its type",
        ),
        (
            "unknown line",
            format!("banlieue-access 1\nkey {key}\n\nend\n"),
            "line 3 is neither",
        ),
        (
            "a line after the end",
            format!("banlieue-access 1\nend\nkey {key}\nend\n"),
            "line 3 follows the end line",
        ),
        (
            "control character",
            format!("banlieue-access 1\nkey {key}\tx\nend\n"),
            "the request holds a control character",
        ),
        (
            "NUL",
            format!("banlieue-access 1\nkey {key}\0\nend\n"),
            "the request holds a control character",
        ),
        (
            "17 keys",
            format!("banlieue-access 1\n{many}end\n"),
            "more than 16 keys",
        ),
        (
            "oversize",
            format!(
                "banlieue-access 1\nkey {key} {}\nend\n",
                "x".repeat(160 * 1024)
            ),
            "the request is larger than 163840 bytes",
        ),
        // Answered only after the layer waited for the rest (5 s): what a host that never
        // finishes its write gets.
        (
            "no end line",
            format!("banlieue-access 1\nkey {key}\n"),
            "the request has no end line",
        ),
    ];
    for (name, wanted, why) in cases {
        let guest = Guest::new()?;
        guest.account("alice", 1000)?;
        let out = guest.request(wanted.as_bytes())?;
        let state = guest.access_state()?;
        ensure!(
            state.starts_with("failed: ") && state.contains(why) && state.lines().count() == 1,
            "{name}: state {state:?}, not {why:?}"
        );
        ensure!(
            out == format!("banlieue-guest-phase: access {state}"),
            "{name}: printed {out:?}"
        );
        ensure!(
            guest.log("useradd").is_empty(),
            "{name}: an account was made"
        );
        ensure!(
            !guest.layer().join("keys/alice").exists(),
            "{name}: keys were installed"
        );
    }
    Ok(())
}

/// An OpenSSH public key line's base64 whose blob names `key_type`, with made-up key bytes.
fn blob_key(key_type: &str) -> String {
    let mut blob = Vec::new();
    blob.extend_from_slice(&u32::try_from(key_type.len()).unwrap_or(0).to_be_bytes());
    blob.extend_from_slice(key_type.as_bytes());
    blob.extend_from_slice(&[7; 40]);
    base64::engine::general_purpose::STANDARD.encode(&blob)
}

#[test]
fn access_accepts_each_key_type_by_its_blob() -> Result<()> {
    for key_type in [
        "ssh-ed25519",
        "ssh-rsa",
        "ecdsa-sha2-nistp256",
        "ecdsa-sha2-nistp384",
        "ecdsa-sha2-nistp521",
        "sk-ssh-ed25519@openssh.com",
        "sk-ecdsa-sha2-nistp256@openssh.com",
    ] {
        let guest = Guest::new()?;
        guest.account("alice", 1000)?;
        let line = format!("{key_type} {} c", blob_key(key_type));
        let out = guest.request(format!("banlieue-access 1\nkey {line}\nend\n").as_bytes())?;
        ensure!(
            out == "banlieue-guest-phase: access installed for alice\n",
            "{key_type}: {out}"
        );
        ensure!(installed_keys(&guest, "alice")? == format!("{line}\n"));
    }
    Ok(())
}

#[test]
fn access_never_writes_through_a_symlink() -> Result<()> {
    let key = ed25519_key(5, "c");
    let wanted = format!("banlieue-access 1\nuser alice\nkey {key}\nend\n");

    // The user's own ~/.ssh pointing elsewhere changes nothing: the home is not written.
    let guest = Guest::new()?;
    guest.ok(&["boot"])?;
    let home = guest.account("alice", 1000)?;
    let elsewhere = guest.path("elsewhere");
    fs::create_dir(&elsewhere)?;
    std::os::unix::fs::symlink(&elsewhere, home.join(".ssh"))?;
    guest.request(wanted.as_bytes())?;
    ensure!(guest.access_state()?.starts_with("installed alice "));
    ensure!(fs::read_dir(&elsewhere)?.count() == 0);

    // A link where the keys file goes is replaced, not followed.
    let guest = Guest::new()?;
    guest.ok(&["boot"])?;
    guest.account("alice", 1000)?;
    let target = guest.path("target");
    fs::write(&target, "untouched\n")?;
    std::os::unix::fs::symlink(&target, guest.layer().join("keys/alice"))?;
    guest.request(wanted.as_bytes())?;
    ensure!(installed_keys(&guest, "alice")? == format!("{key}\n"));
    ensure!(fs::read_to_string(&target)? == "untouched\n");
    Ok(())
}

#[test]
fn access_answers_the_request_once_it_is_whole() -> Result<()> {
    // The agent creates the file (which already starts the unit), writes, then closes it; a
    // reader may see any prefix of it, here one that ends in the middle of a key.
    let guest = Guest::new()?;
    guest.ok(&["boot"])?;
    let key = ed25519_key(6, "c");
    let (head, tail) = key.split_at(30);
    let wanted = guest.layer().join("access/wanted");
    let opened = guest.path("opened");
    let mut writer = Command::new("sh")
        .arg("-c")
        .arg(
            "exec 3>\"$1\"; printf 'banlieue-access 1\\nkey %s' \"$3\" >&3; : >\"$2\"; sleep 1; \
             printf '%s\\nend\\n' \"$4\" >&3",
        )
        .args([
            "sh",
            wanted.to_str().context("path")?,
            opened.to_str().context("path")?,
            head,
            tail,
        ])
        .spawn()?;
    let started = Instant::now();
    while !opened.exists() {
        if started.elapsed() > Duration::from_secs(10) {
            bail!("the writer never opened {}", wanted.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = guest.ok(&["access"])?;
    ensure!(writer.wait()?.success());
    ensure!(
        out == "banlieue-guest-phase: access installed for sandbox\n",
        "{out}"
    );
    let written = fs::read(&wanted)?;
    ensure!(guest.access_state()? == format!("installed sandbox {}\n", sha256_hex(&written)));
    ensure!(installed_keys(&guest, "sandbox")? == format!("{key}\n"));
    Ok(())
}

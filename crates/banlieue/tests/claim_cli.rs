//! `banlieue claim`, run as the binary a consumer runs, with the consumer's own kubeconfig
//! (alice's client certificate, the claimant RBAC and the shipped admission policies), against
//! a real API server, the controller and a libvirt provider on a real libvirtd: a claim with a
//! key binds with `--wait`, is listed and released; what the CLI or the API server refuses is
//! one line, and a fresh claim still binds after it.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use banlieue_api::VirtualMachineClaim;
use banlieue_api::names::SYSTEM_NAMESPACE;
use banlieue_dev::{self as dev, objects};
use banlieue_testenv::control_plane::ControlPlane;
use banlieue_testenv::libvirtd::{Libvirtd, LibvirtdOptions};
use banlieue_testenv::ssh_keys::ed25519_public_key;
use kube::api::Api;
use prometheus_client::registry::Registry;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How long a wait may take on a busy 2-core machine.
const DEADLINE: Duration = Duration::from_secs(180);

/// `banlieue claim ARGS` as `kubeconfig`'s user, in the system namespace.
async fn claim_cli(kubeconfig: &Path, args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_banlieue"));
    command
        .env("KUBECONFIG", kubeconfig)
        .env_remove("BANLIEUE_ISSUER")
        .env_remove("BANLIEUE_EK_TRUST_BUNDLE")
        .args(["claim", "-n", SYSTEM_NAMESPACE])
        .args(args);
    tokio::task::spawn_blocking(move || command.output().expect("run banlieue"))
        .await
        .expect("join")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The one line a refused command prints, and that it failed.
fn refusal(output: &Output) -> String {
    assert!(
        !output.status.success(),
        "expected a refusal, got: {}\n{}",
        text(&output.stdout),
        text(&output.stderr)
    );
    let stderr = text(&output.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line, got: {stderr}");
    lines[0].to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_consumer_claims_lists_and_releases_with_the_cli() {
    if std::env::var_os("BANLIEUE_ALLOW_MISSING_PEERS").is_some()
        && !Libvirtd::available().unwrap_or(false)
    {
        eprintln!("SKIPPED: libvirtd is not installed (BANLIEUE_ALLOW_MISSING_PEERS is set)");
        return;
    }
    let (control_plane, libvirtd) = tokio::try_join!(
        async { ControlPlane::start().await.map_err(BoxError::from) },
        async {
            Libvirtd::start(LibvirtdOptions::default())
                .await
                .map_err(|e| BoxError::from(e.to_string()))
        },
    )
    .expect("start the control plane and libvirtd");
    let bridge = format!("bnc{}", std::process::id());
    let shutdown = CancellationToken::new();
    let mut workers = Vec::new();
    let outcome = run(&control_plane, &libvirtd, &bridge, &shutdown, &mut workers).await;
    shutdown.cancel();
    banlieue::roles::join_all(workers).await;
    let released = dev::release_host(&libvirtd).await;
    if let Err(error) = outcome {
        panic!("{error}\n--- libvirtd ---\n{}", libvirtd.diagnostics());
    }
    released.expect("stop the test network");
}

async fn run(
    control_plane: &ControlPlane,
    libvirtd: &Libvirtd,
    bridge: &str,
    shutdown: &CancellationToken,
    workers: &mut Vec<JoinHandle<()>>,
) -> Result<(), BoxError> {
    let admin = control_plane.client()?;
    let mut registry = Registry::default();
    workers.extend(
        dev::start_stand_in_default(
            control_plane,
            libvirtd,
            bridge,
            DEADLINE,
            &mut registry,
            shutdown,
        )
        .await?,
    );
    dev::apply(&admin, &objects::pool()).await?;

    let alice = control_plane
        .kubeconfig(objects::CLAIMANT)
        .ok_or("the local control plane gives alice a kubeconfig")?;
    let keys = tempfile::tempdir()?;
    let public = keys.path().join("id_ed25519.pub");
    std::fs::write(
        &public,
        format!("{}\n", ed25519_public_key(42, "alice@laptop")),
    )?;
    let public = public.to_str().ok_or("a UTF-8 path")?;
    let timeout = format!("{}s", DEADLINE.as_secs());

    // alice may not read the claim-subject policy, so the CLI cannot tell her issuer: it says
    // so in one line, before anything is created.
    let line = refusal(&claim_cli(alice, &["create", objects::POOL, "--ttl", "15m"]).await);
    assert!(line.contains("pass --issuer"), "{line}");

    // A malformed key is refused by the CLI, naming the entry.
    let bad = keys.path().join("bad.pub");
    std::fs::write(&bad, "ssh-ed25519 AAAA\n")?;
    let bad_args = [
        "create",
        objects::POOL,
        "--ttl",
        "15m",
        "--issuer",
        objects::ISSUER,
        "--ssh-key",
        bad.to_str().ok_or("a UTF-8 path")?,
    ];
    let line = refusal(&claim_cli(alice, &bad_args).await);
    assert!(
        line.contains("sshAuthorizedKeys entry 0 decodes to no SSH public key"),
        "{line}"
    );

    // Naming someone else is the API server's to refuse: its policy's message, one line.
    let other = [
        "create",
        objects::POOL,
        "--ttl",
        "15m",
        "--issuer",
        objects::ISSUER,
        "--subject-id",
        "bob",
    ];
    let line = refusal(&claim_cli(alice, &other).await);
    assert!(
        line.contains("spec.subject.id is bob but you are authenticated as alice"),
        "{line}"
    );

    // Her own claim binds; --wait follows it and -o json prints the result.
    let create = [
        "create",
        objects::POOL,
        "--ttl",
        "15m",
        "--issuer",
        objects::ISSUER,
        "--wait",
        "--timeout",
        &timeout,
        "-o",
        "json",
    ];
    let created = claim_cli(alice, &create).await;
    let stderr = text(&created.stderr);
    assert!(created.status.success(), "create: {stderr}");
    let claim: VirtualMachineClaim = serde_json::from_slice(&created.stdout)?;
    let name = claim.metadata.name.clone().ok_or("a named claim")?;
    assert!(name.starts_with("sandbox-pool-"), "{name}");
    let status = claim.status.clone().unwrap_or_default();
    assert_eq!(status.phase, Some(banlieue_api::ClaimPhase::Bound));
    assert_eq!(claim.spec.subject.id, objects::CLAIMANT);
    assert_eq!(claim.spec.access, None);
    assert!(
        stderr.contains(&format!("claim {name}: Bound, VM ")),
        "progress: {stderr}"
    );

    // A claim with her key records it; the stand-in members here run no guest, so the keys
    // stay on their way, and `claim ssh` says so in one line rather than trusting a host.
    let keyed = [
        "create",
        objects::POOL,
        "--ttl",
        "15m",
        "--issuer",
        objects::ISSUER,
        "--ssh-key",
        public,
        "-o",
        "name",
    ];
    let made = claim_cli(alice, &keyed).await;
    assert!(made.status.success(), "{}", text(&made.stderr));
    let keyed_name = text(&made.stdout)
        .trim()
        .strip_prefix("virtualmachineclaim.banlieue.io/")
        .ok_or("-o name")?
        .to_owned();
    let claims: Api<VirtualMachineClaim> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    let recorded = claims.get(&keyed_name).await?;
    assert_eq!(
        recorded.spec.access.map(|a| a.ssh_authorized_keys),
        Some(vec![ed25519_public_key(42, "alice@laptop")])
    );
    let line = refusal(&claim_cli(alice, &["ssh", &keyed_name, "--no-verify", "--", "true"]).await);
    assert!(
        line.contains(&format!("claim {keyed_name}: not ready yet")),
        "{line}"
    );
    // Without a trust bundle to prove the VM with, or --no-verify, no host key is trusted.
    let line = refusal(&claim_cli(alice, &["ssh", &keyed_name, "--", "true"]).await);
    assert!(
        line.contains(
            "claim ssh proves the VM before it trusts its host keys: pass --trust-bundle"
        ),
        "{line}"
    );
    // Her Bound claim's stand-in member has no TPM: verify says so rather than trusting
    // anything.
    let bundle = tempfile::NamedTempFile::new()?;
    let line = refusal(
        &claim_cli(
            alice,
            &[
                "verify",
                &name,
                "--trust-bundle",
                &bundle.path().display().to_string(),
            ],
        )
        .await,
    );
    assert!(
        line.contains(&format!(
            "claim {name}: not verified: the claim carries no EK certificate: its VM has no TPM \
             to attest"
        )),
        "{line}"
    );
    // Reference values that are not `PCR SHA256-HEX` lines are refused by line, before
    // anything is read or written.
    let references = tempfile::NamedTempFile::new()?;
    std::fs::write(
        references.path(),
        format!("# image 7\n24 {}\n", "00".repeat(32)),
    )?;
    let line = refusal(
        &claim_cli(
            alice,
            &[
                "verify",
                &name,
                "--trust-bundle",
                &bundle.path().display().to_string(),
                "--pcr-references",
                &references.path().display().to_string(),
            ],
        )
        .await,
    );
    assert!(
        line.contains(&format!(
            "{}: line 2: \"24\" is not a PCR 0-23",
            references.path().display()
        )),
        "{line}"
    );
    // Nor is a secret sealed to a VM that cannot prove itself.
    let payload = tempfile::NamedTempFile::new()?;
    std::fs::write(payload.path(), "a token")?;
    let line = refusal(
        &claim_cli(
            alice,
            &[
                "seal",
                &name,
                "--from-file",
                &payload.path().display().to_string(),
                "--trust-bundle",
                &bundle.path().display().to_string(),
            ],
        )
        .await,
    );
    assert!(
        line.contains(&format!(
            "claim {name}: not verified: the claim carries no EK"
        )),
        "{line}"
    );
    let released = claim_cli(
        alice,
        &["release", &keyed_name, "--wait", "--timeout", &timeout],
    )
    .await;
    assert!(released.status.success(), "{}", text(&released.stderr));

    // Listed by name and in the table.
    let listed = claim_cli(alice, &["list", "-o", "name"]).await;
    assert!(listed.status.success(), "{}", text(&listed.stderr));
    assert!(text(&listed.stdout).contains(&format!("virtualmachineclaim.banlieue.io/{name}\n")));
    let table = text(&claim_cli(alice, &["list"]).await.stdout);
    assert!(table.starts_with("NAME"), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.starts_with(&name) && l.contains("Bound")),
        "{table}"
    );

    // Released and gone.
    let released = claim_cli(alice, &["release", &name, "--wait", "--timeout", &timeout]).await;
    assert!(released.status.success(), "{}", text(&released.stderr));
    assert!(claims.get_opt(&name).await?.is_none(), "{name} is gone");
    let line = refusal(&claim_cli(alice, &["release", &name]).await);
    assert!(line.contains("not found"), "{line}");

    // After every refusal, a fresh claim still binds.
    let again = claim_cli(alice, &create).await;
    assert!(again.status.success(), "{}", text(&again.stderr));
    Ok(())
}

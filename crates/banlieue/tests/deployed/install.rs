//! How the deployed test installs the operator and upgrades it: the three ways the README gives
//! (`banlieue bootstrap`, the kustomize base, the Helm chart), first with the manifests of an
//! earlier commit, then with this commit's, as an administrator upgrades.
//!
//! The earlier release is `deploy/` of an earlier commit, taken with `git archive`: the parent
//! of the newest commit that changed what the installer reads (the chart, or the kustomize
//! base) and has it, so the upgrade changes real manifests. Where no such commit exists yet
//! (the chart's first commit has no parent with a chart), the oldest commit that has it, and the
//! test says the manifests are the same. The binary is this commit's in both phases, tagged
//! anew for the upgrade so that the controller's replicas roll as in a release: what is tested
//! is the manifests' upgrade (CRDs, RBAC, Deployments, policies) and a rolling controller under
//! live claims, not a skew between binaries.

use std::path::{Path, PathBuf};
use std::process::Command;

use banlieue_testenv::control_plane::{ControlPlane, bin_dir};
use banlieue_testenv::manifests::{self, serves_mutating_admission_policies};
use banlieue_testenv::repo_path;

use super::Result;

/// The namespace of the Helm release (the chart's objects keep their own namespaces).
const HELM_NAMESPACE: &str = "banlieue-helm";
const HELM_RELEASE: &str = "banlieue";
/// The field manager `banlieue bootstrap` applies with (`banlieue::apply::FIELD_MANAGER`).
const BOOTSTRAP_FIELD_MANAGER: &str = "banlieue-bootstrap";

#[derive(Clone, Copy, Debug)]
pub enum Installer {
    /// `banlieue bootstrap --image IMAGE`.
    Bootstrap,
    /// `kubectl apply --server-side -k` an overlay of deploy/ setting the image.
    Kustomize,
    /// `helm install` / `helm upgrade` of deploy/helm/banlieue with `--set image=IMAGE`.
    Helm,
}

/// `deploy/` of an earlier commit, extracted into a directory of its own.
pub struct Release {
    pub commit: String,
    /// Whether what the installer reads of its `deploy/` differs from this commit's.
    pub differs: bool,
    dir: tempfile::TempDir,
}

impl Release {
    fn deploy(&self) -> PathBuf {
        self.dir.path().join("deploy")
    }
}

impl Installer {
    pub fn from_env() -> Result<Installer> {
        match std::env::var("BANLIEUE_DEPLOYED_INSTALLER").as_deref() {
            Err(_) | Ok("bootstrap") => Ok(Installer::Bootstrap),
            Ok("kustomize") => Ok(Installer::Kustomize),
            Ok("helm") => Ok(Installer::Helm),
            Ok(other) => Err(format!(
                "BANLIEUE_DEPLOYED_INSTALLER={other}: one of bootstrap, kustomize, helm"
            )
            .into()),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Installer::Bootstrap => "banlieue bootstrap",
            Installer::Kustomize => "kubectl apply -k",
            Installer::Helm => "helm",
        }
    }

    /// The file of `deploy/` this installer reads; an earlier release must have it.
    fn entry(self) -> &'static str {
        match self {
            Installer::Helm => "deploy/helm/banlieue/Chart.yaml",
            Installer::Bootstrap | Installer::Kustomize => "deploy/kustomization.yaml",
        }
    }

    /// The part of `deploy/` this installer reads, as git pathspecs.
    fn reads(self) -> &'static [&'static str] {
        match self {
            Installer::Helm => &["deploy/"],
            Installer::Bootstrap | Installer::Kustomize => &["deploy/", ":(exclude)deploy/helm"],
        }
    }

    /// The earlier release this installer upgrades from (see the module's doc).
    pub fn previous_release(self) -> Result<Release> {
        let entry = self.entry();
        let mut log = vec!["log", "--format=%H", "HEAD", "--"];
        log.extend(self.reads());
        let changes = git(&log)?;
        let changes: Vec<&str> = changes.lines().collect();
        let has_entry =
            |commit: &str| git(&["cat-file", "-e", &format!("{commit}:{entry}")]).is_ok();
        let commit = changes
            .iter()
            .map(|c| format!("{c}^"))
            .find(|parent| has_entry(parent))
            .or_else(|| {
                changes
                    .iter()
                    .rev()
                    .find(|c| has_entry(c))
                    .map(|c| c.to_string())
            })
            .ok_or_else(|| format!("no commit has {entry}"))?;
        let commit = git(&["rev-parse", "--short", &commit])?.trim().to_owned();
        let dir = tempfile::tempdir()?;
        let tar = dir.path().join("deploy.tar");
        git(&[
            "archive",
            "--output",
            &tar.display().to_string(),
            &commit,
            "deploy",
        ])?;
        let out = Command::new("tar")
            .arg("-xf")
            .arg(&tar)
            .arg("-C")
            .arg(dir.path())
            .output()?;
        if !out.status.success() {
            return Err(format!(
                "extracting deploy/ of {commit}: {}",
                String::from_utf8_lossy(&out.stderr)
            )
            .into());
        }
        let mut diff = vec!["diff", "--quiet", &commit, "HEAD", "--"];
        diff.extend(self.reads());
        let differs = git(&diff).is_err();
        Ok(Release {
            commit,
            differs,
            dir,
        })
    }

    /// Installs `release`'s manifests the way this installer did then. For `bootstrap`, whose
    /// manifests are compiled into the binary, the earlier release's objects are applied as
    /// bootstrap applies them (server-side, its field manager): the same objects, as
    /// tests/bootstrap.rs checks against the kustomize base at every commit.
    pub async fn install_previous(
        self,
        cp: &ControlPlane,
        image: &str,
        release: &Release,
    ) -> Result {
        let scratch = tempfile::tempdir()?;
        let claim_protection = serves_mutating_admission_policies(&cp.client()?).await?;
        match self {
            Installer::Bootstrap | Installer::Kustomize => {
                let overlay = overlay(scratch.path(), &release.deploy(), image, claim_protection)?;
                let mut args = vec!["apply", "--server-side"];
                if let Installer::Bootstrap = self {
                    args.extend(["--field-manager", BOOTSTRAP_FIELD_MANAGER]);
                }
                args.extend(["-k", &overlay]);
                run(cp, scratch.path(), &bin_dir().join("kubectl"), &args)
            }
            Installer::Helm => {
                let chart = release.deploy().join("helm/banlieue");
                helm(
                    cp,
                    scratch.path(),
                    "install",
                    &chart,
                    image,
                    claim_protection,
                )
            }
        }
    }

    /// Upgrades to this commit's manifests: a second `banlieue bootstrap`, `kubectl apply -k`
    /// of this commit's base, or `helm upgrade` to this commit's chart.
    pub async fn upgrade(self, cp: &ControlPlane, image: &str) -> Result {
        let scratch = tempfile::tempdir()?;
        let claim_protection = serves_mutating_admission_policies(&cp.client()?).await?;
        match self {
            Installer::Bootstrap => run(
                cp,
                scratch.path(),
                Path::new(env!("CARGO_BIN_EXE_banlieue")),
                &["bootstrap", "--image", image],
            ),
            Installer::Kustomize => {
                let overlay = overlay(
                    scratch.path(),
                    &repo_path("deploy"),
                    image,
                    claim_protection,
                )?;
                // The guides' `kubectl apply -f deploy/admission/` (client-side) wrote the
                // policies since the install: an upgrade takes their fields over, as the README
                // says.
                run(
                    cp,
                    scratch.path(),
                    &bin_dir().join("kubectl"),
                    &[
                        "apply",
                        "--server-side",
                        "--force-conflicts",
                        "-k",
                        &overlay,
                    ],
                )
            }
            Installer::Helm => helm(
                cp,
                scratch.path(),
                "upgrade",
                &repo_path("deploy/helm/banlieue"),
                image,
                claim_protection,
            ),
        }
    }
}

/// A kustomize overlay of `deploy` in `scratch` setting `image`, leaving out the claim
/// protection policy where the cluster does not serve its API (as the README says); returns
/// its directory.
fn overlay(scratch: &Path, deploy: &Path, image: &str, claim_protection: bool) -> Result<String> {
    let (name, tag) = image.rsplit_once(':').ok_or("an image with a tag")?;
    let overlay = scratch.join("overlay");
    std::fs::create_dir_all(&overlay)?;
    manifests::write_image_overlay_of(&overlay, deploy, name, tag)?;
    if !claim_protection {
        manifests::leave_out_claim_protection(&overlay)?;
    }
    Ok(overlay.display().to_string())
}

/// `helm install` or `helm upgrade` of `chart` as the release the test uses.
fn helm(
    cp: &ControlPlane,
    scratch: &Path,
    verb: &str,
    chart: &Path,
    image: &str,
    claim_protection: bool,
) -> Result {
    let chart = chart.display().to_string();
    let image = format!("image={image}");
    let claim_protection = format!("claimProtection={claim_protection}");
    let mut args = vec![
        verb,
        HELM_RELEASE,
        &chart,
        "--namespace",
        HELM_NAMESPACE,
        "--set",
        &image,
        "--set",
        &claim_protection,
    ];
    if verb == "install" {
        args.push("--create-namespace");
    }
    run(cp, scratch, &bin_dir().join("helm"), &args)
}

/// Runs `program` as the cluster's admin, helm's own files kept in `scratch`.
fn run(cp: &ControlPlane, scratch: &Path, program: &Path, args: &[&str]) -> Result {
    let kubeconfig = cp.kubeconfig("admin").ok_or("admin kubeconfig")?;
    let home = scratch.join("helm");
    let out = Command::new(program)
        .env("KUBECONFIG", kubeconfig)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .args(args)
        .output()?;
    if !out.status.success() {
        return Err(format!(
            "{} {}: {}{}",
            program.display(),
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(())
}

/// `git` in the repository; stdout.
fn git(args: &[&str]) -> Result<String> {
    let out = Command::new("git")
        .current_dir(repo_path(""))
        .args(args)
        .output()?;
    if !out.status.success() {
        return Err(format!(
            "git {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

//! The operator as users deploy it: banlieue's container image on a real node (containerd and a
//! kubelet), installed with `banlieue bootstrap --image` (or, with BANLIEUE_DEPLOYED_INSTALLER,
//! the kustomize base or the Helm chart) from an earlier commit's manifests and upgraded to
//! this commit's once a claim is bound (module `install`), and the libvirt provider guide and
//! the claims guide followed with kubectl against a real libvirtd. Every step is a guide's command
//! or an API call of the user the guide names; the pods run as their own ServiceAccounts under
//! the shipped RBAC, with no test-only grant.
//!
//! Needs the image archive `scripts/image` writes, named by `BANLIEUE_IMAGE_ARCHIVE` (the
//! docker archive); `scripts/test.d/60-deployed.sh` builds it and runs this test.
//!
//! The guides' kubectl commands are run as written, from the pages themselves (module
//! `guide`); every one of them runs except those `NOT_RUN_HERE` names with the reason.
//! Substitutions, as a reader following the guides here makes them in the files: the Provider's
//! endpoint is the local libvirtd's; the host has the example's pools and network (created
//! below); the ProviderClass gets `BANLIEUE_LIBVIRT_DOMAIN_TYPE=qemu` (no usable KVM here); the
//! pool keeps one replica instead of three (each is an EFI guest under TCG on two cores); the
//! claim's subject id is the certificate user `alice` who creates it. The artifacts PVC is the
//! guide's, bound to a hostPath PersistentVolume the test makes (the cluster's storage); the
//! image examples/10 names is pushed (skopeo) into a loopback registry with TLS and basic auth,
//! which the example is pointed at, and built by banlieue-imagebuilder's pods.

#[path = "deployed/guide.rs"]
mod guide;
#[path = "deployed/install.rs"]
mod install;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use banlieue_api::conditions::types;
use banlieue_api::names;
use banlieue_api::{Provider, VMImage, VirtualMachine, VirtualMachineClaim};
use banlieue_imagebuilder::classify::{ARTIFACT_TYPE, MEDIA_TYPE_QCOW2};
use banlieue_testenv::control_plane::{ControlPlane, ControlPlaneOptions, bin_dir};
use banlieue_testenv::libvirtd::{Libvirtd, LibvirtdOptions};
use banlieue_testenv::node;
use banlieue_testenv::registry::{Layer, OciLayout, Registry, RegistryOptions};
use banlieue_testenv::repo_path;
use base64::Engine as _;
use guide::Guides;
use install::Installer;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{PersistentVolume, Pod, Secret};
use kube::Client;
use kube::api::{Api, ListParams, PostParams};

const NS: &str = "banlieue-system";
/// The pool of examples/19.
const POOL: &str = "sandbox-pool";
const PROVIDER: &str = "libvirt-edge-host-7";
const BACKING_VOLUME: &str = "ubuntu-24.04-server-cloudimg-amd64.qcow2";
const PROVIDER_GUIDE: &str = "docs/guides/libvirt-provider.md";
const CLAIMS_GUIDE: &str = "docs/guides/claims.md";
/// Guide commands that cannot run here, and why.
const NOT_RUN_HERE: &[(&str, &str)] = &[
    (
        "kubectl -n banlieue-system edit configmap banlieue-claim-subject-policy",
        "opens an editor; the policy ConfigMap of deploy/admission/ already names the examples' issuer",
    ),
    (
        "banlieue claim ",
        "the guide's commands run here as the cluster's administrator, and a claim is its \
         subject's own: tests/claim_cli.rs runs these as the claimant, with her own kubeconfig; \
         `claim verify`, `ssh` and `seal` need a guest with a vTPM and sshd, and run against the \
         test guest in tests/guests.rs, and `ssh` in `dev up` (scripts/run), which prints the \
         line and runs it once",
    ),
];
/// The VMImage of examples/10 and the build namespace its import Jobs run in.
const URL_IMAGE: &str = "kairos-ubuntu-2404";
const BUILD_NS: &str = "banlieue-imagebuild";

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// The Lease the controller replicas take (deploy/controller.yaml, ADR-0067).
const CONTROLLER_LEASE: &str = "banlieue-controller";

/// Three rows of docs/security.md's "Between subjects", as bob with the grants they name:
/// planting a member, rewriting the bound member's spec, releasing alice's claim.
fn between_subjects(cp: &ControlPlane, bound: &str) -> Result {
    for (verb, resource) in [
        ("get,create,patch", "virtualmachines.banlieue.io"),
        ("get,delete,patch", "virtualmachineclaims.banlieue.io"),
    ] {
        let name = format!("bob-{}", resource.split('.').next().unwrap_or_default());
        for grant in [
            [
                "role",
                &name,
                &format!("--verb={verb}"),
                &format!("--resource={resource}"),
            ],
            [
                "rolebinding",
                &name,
                &format!("--role={name}"),
                "--user=bob",
            ],
        ] {
            kubectl(
                cp,
                "admin",
                &[&["-n", NS, "create"][..], &grant[..]].concat(),
            )?;
        }
    }
    let refused = |what: &str, result: Result<String>, says: &str| -> Result {
        match result {
            Ok(out) => Err(format!("{what}: the API server accepted it: {out}").into()),
            Err(e) if e.to_string().contains(says) => Ok(()),
            Err(e) => Err(format!("{what}: refused, but not saying {says:?}: {e}").into()),
        }
    };
    let planted = format!(
        "apiVersion: banlieue.io/v1alpha1\nkind: VirtualMachine\nmetadata:\n  name: planted\n  \
         namespace: {NS}\n  labels:\n    banlieue.io/pool: sandbox-pool\nspec:\n  classRef:\n    \
         name: small\n  imageRef:\n    name: {URL_IMAGE}\n  storageClassName: standard\n  \
         networkClassName: prod\n"
    );
    let dry_run = |args: &[&str]| {
        let mut args = args.to_vec();
        args.push("--dry-run=server");
        kubectl(cp, "bob", &args)
    };
    // The RBAC grants take a moment to be seen: the first row waits for a refusal by admission.
    let mut planting: Result<String> = Err("not tried".into());
    for _ in 0..30 {
        planting = kubectl_stdin(
            cp,
            "bob",
            &["create", "--dry-run=server", "-f", "-"],
            &planted,
        );
        if matches!(&planting, Err(e) if !e.to_string().contains("cannot create resource")) {
            break;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    refused(
        "bob plants a member",
        planting,
        "label banlieue.io/pool is written only by banlieue's controller: bob",
    )?;
    refused(
        "bob rewrites the bound member's user-data",
        dry_run(&[
            "-n",
            NS,
            "patch",
            "virtualmachine",
            bound,
            "--type=merge",
            "-p",
            r##"{"spec":{"userData":"#cloud-config\nruncmd: [evil]\n"}}"##,
        ]),
        "is written only by banlieue's controller: it is bound to claim sandbox-for-alice",
    )?;
    refused(
        "bob releases alice's claim",
        dry_run(&["-n", NS, "delete", "vmclaim", "sandbox-for-alice"]),
        "only its subject, a listed broker or an administrator may delete it, and you are bob",
    )?;
    eprintln!("between subjects: bob's three writes refused by the deployed policies");
    Ok(())
}

/// Runs kubectl as `identity` (a kubeconfig of the test control plane); returns stdout.
fn kubectl(cp: &ControlPlane, identity: &str, args: &[&str]) -> Result<String> {
    let kubeconfig = cp.kubeconfig(identity).ok_or("no kubeconfig")?;
    let out = Command::new(bin_dir().join("kubectl"))
        .env("KUBECONFIG", kubeconfig)
        .args(args)
        .output()?;
    if !out.status.success() {
        return Err(format!(
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `kubectl apply -f -` of `text`, as `identity`.
fn kubectl_apply(cp: &ControlPlane, identity: &str, text: &str) -> Result<String> {
    kubectl_stdin(cp, identity, &["apply", "-f", "-"], text)
}

/// kubectl `args` as `identity`, with `text` on its standard input; returns stdout.
fn kubectl_stdin(cp: &ControlPlane, identity: &str, args: &[&str], text: &str) -> Result<String> {
    use std::io::Write as _;
    let kubeconfig = cp.kubeconfig(identity).ok_or("no kubeconfig")?;
    let mut child = Command::new(bin_dir().join("kubectl"))
        .env("KUBECONFIG", kubeconfig)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .ok_or("stdin")?
        .write_all(text.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        return Err(format!(
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

async fn until<T, F, Fut>(what: &str, secs: u64, mut probe: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut last = String::new();
    loop {
        match probe().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last = e.to_string(),
        }
        if Instant::now() > deadline {
            return Err(format!("{what}: not within {secs} s {last}").into());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The pod of the Deployment whose pods carry `selector`, once it runs and is Ready.
async fn running_pod(kube: &Client, selector: &str, secs: u64) -> Result<Pod> {
    let pods: Api<Pod> = Api::namespaced(kube.clone(), NS);
    until(&format!("a Ready pod {selector}"), secs, || async {
        let list = pods.list(&ListParams::default().labels(selector)).await?;
        Ok((list.items.into_iter())
            .find(|p| p.metadata.deletion_timestamp.is_none() && node::pod_is_ready(p)))
    })
    .await
}

fn provider_ready(p: &Provider) -> bool {
    p.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    })
}

/// The local libvirtd with the example Provider's pools (`nvme-pool`, `default`), network
/// (`br-prod`, an isolated bridge with no address) and example 17's backing volume.
async fn host() -> Result<Libvirtd> {
    let libvirtd = Libvirtd::start(LibvirtdOptions::default()).await?;
    for pool in ["nvme-pool", "default"] {
        let dir = libvirtd.create_pool_dir(pool)?;
        libvirtd
            .virsh([
                "pool-define-as",
                pool,
                "dir",
                "--target",
                &dir.display().to_string(),
            ])
            .await?;
        libvirtd.virsh(["pool-start", pool]).await?;
    }
    let bridge = format!("bnl{}", std::process::id());
    let xml = libvirtd.dir().join("br-prod.xml");
    std::fs::write(
        &xml,
        format!(
            "<network><name>br-prod</name><bridge name='{bridge}' stp='off'/>\
             <dns enable='no'/></network>"
        ),
    )?;
    libvirtd
        .virsh(["net-define", &xml.display().to_string()])
        .await?;
    libvirtd.virsh(["net-start", "br-prod"]).await?;
    libvirtd
        .virsh([
            "vol-create-as",
            "default",
            BACKING_VOLUME,
            "1G",
            "--format",
            "qcow2",
        ])
        .await?;
    Ok(libvirtd)
}

/// What the image builder's objects and pods say, for a build that did not finish.
fn build_diagnostics(cp: &ControlPlane) -> String {
    let mut out = String::new();
    for args in [
        &["-n", NS, "get", "vmimage", URL_IMAGE, "-o", "yaml"][..],
        &["-n", BUILD_NS, "get", "jobs,pods", "-o", "wide"],
        &["-n", NS, "get", "pods", "-o", "wide"],
        &[
            "-n",
            NS,
            "logs",
            "deployment/banlieue-imagebuilder",
            "--tail=50",
        ],
        &[
            "-n",
            BUILD_NS,
            "logs",
            "-l",
            "app.kubernetes.io/managed-by=banlieue-imagebuilder",
            "--tail=50",
        ],
        &["-n", BUILD_NS, "describe", "pods"],
    ] {
        let shown = kubectl(cp, "admin", args).unwrap_or_else(|e| e.to_string());
        out.push_str(&format!("$ kubectl {}\n{shown}\n", args.join(" ")));
    }
    out
}

/// The SHA-256 of a file, hex, read in pieces.
fn sha256_file(path: &Path) -> Result<String> {
    use sha2::Digest as _;
    use std::io::Read as _;
    let mut file = std::fs::File::open(path)?;
    let mut hasher = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// Domains defined on the host, by name.
async fn domains(libvirtd: &Libvirtd) -> Result<Vec<String>> {
    let out = libvirtd.virsh(["list", "--all", "--name"]).await?;
    Ok(out
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the image archive: scripts/test.d/60-deployed.sh runs it"]
async fn the_guides_run_as_written_against_the_deployed_operator() -> Result {
    let archive = PathBuf::from(
        std::env::var("BANLIEUE_IMAGE_ARCHIVE").map_err(|_| "set BANLIEUE_IMAGE_ARCHIVE")?,
    );
    let started = Instant::now();
    let installer = Installer::from_env()?;
    // A cluster before its first install has no banlieue CRDs: the installer brings them. (With
    // this commit's CRDs already there under another field manager, an earlier release's that
    // differ would be a server-side apply conflict, and Helm refuses to take over CRDs it did
    // not make.)
    let cp =
        ControlPlane::start_with_node_with(ControlPlaneOptions::default().without_banlieue_crds())
            .await?;
    let node = cp.node().ok_or("a node")?;
    node.import_image(&archive).await?;
    eprintln!("node up, image imported: {:.1?}", started.elapsed());
    let libvirtd = host().await?;
    let admin = cp.client()?;
    let kubeconfig = cp.kubeconfig("admin").ok_or("admin kubeconfig")?;

    // 1. `banlieue bootstrap --image` (or the kustomize base, or the Helm chart, as
    //    BANLIEUE_DEPLOYED_INSTALLER says) of an earlier commit's manifests, upgraded below
    //    once a claim is bound: the controller runs as a pod.
    let t = Instant::now();
    let image = banlieue::bootstrap::DEFAULT_IMAGE;
    let release = installer.previous_release()?;
    eprintln!(
        "installing {}'s manifests ({})",
        release.commit,
        if release.differs {
            "deploy/ differs from this commit's"
        } else {
            "deploy/ as this commit's: no earlier commit has what the installer reads"
        }
    );
    installer.install_previous(&cp, image, &release).await?;
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), NS);
    until("the controller Deployment Available", 120, || async {
        let d = deployments.get("banlieue-controller").await?;
        Ok(d.status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_.as_deref() == Some("Available") && c.status.as_deref() == Some("True"))
            .then_some(()))
    })
    .await?;
    let controller_pod =
        running_pod(&admin, "app.kubernetes.io/name=banlieue-controller", 60).await?;
    let spec = controller_pod.spec.clone().ok_or("pod spec")?;
    assert_eq!(
        spec.service_account_name.as_deref(),
        Some("banlieue-controller")
    );
    assert_eq!(spec.containers[0].image.as_deref(), Some(image));
    eprintln!(
        "{} → controller Available: {:.1?}",
        installer.name(),
        t.elapsed()
    );

    // 2. The guides' commands from here on, run as written (module `guide`), with the
    //    substitutions listed at the top of this file made in the reader's copies.
    let admin_kubeconfig = kubeconfig;
    let alice_kubeconfig = cp.kubeconfig("alice").ok_or("alice's kubeconfig")?;
    let mut guides = Guides::load(&repo_path(""), &[PROVIDER_GUIDE, CLAIMS_GUIDE])?;
    let client_files = guides.home().join(".config/banlieue/libvirt");
    std::fs::create_dir_all(&client_files)?;
    std::fs::copy(
        libvirtd.client_cert_path(),
        client_files.join("clientcert.pem"),
    )?;
    std::fs::copy(
        libvirtd.client_key_path(),
        client_files.join("clientkey.pem"),
    )?;
    std::fs::copy(libvirtd.ca_cert_path(), client_files.join("cacert.pem"))?;
    guides.substitute(
        "examples/02-provider-libvirt-edge.yaml",
        "qemu+tls://kvm-7.edge.example/system",
        &libvirtd.tls_uri(),
    )?;
    guides.substitute(
        "examples/09-providerclass-libvirt.yaml",
        "  machineKind: LibvirtMachine\n",
        "  machineKind: LibvirtMachine\n  pod:\n    env:\n      \
         - {name: BANLIEUE_LIBVIRT_DOMAIN_TYPE, value: qemu}\n",
    )?;
    guides.substitute(
        "examples/19-virtualmachinepool.yaml",
        "replicas: 3",
        "replicas: 1",
    )?;
    // The pool's members boot the image examples/10 built (a real guest), and a member is
    // handed out once its guest reports GuestReady.
    guides.substitute(
        "examples/19-virtualmachinepool.yaml",
        "imageRef:\n        name: ubuntu-2404",
        "imageRef:\n        name: kairos-ubuntu-2404",
    )?;
    // A guest whose boot hangs under TCG (it happens on a loaded two-core machine: the agent
    // never connects) is replaced after four minutes, as `dev up`'s pool does, rather than
    // holding the only member until the test's wait runs out.
    guides.substitute(
        "examples/19-virtualmachinepool.yaml",
        "readiness: InfrastructureReady",
        "readiness: GuestReady\n  startupDeadlineSeconds: 240",
    )?;
    guides.substitute(
        "examples/20-virtualmachineclaim.yaml",
        "0c3b7f2e-1d4a-4b6c-9e8f-5a2d1c0b9e7f",
        "alice",
    )?;

    let t = Instant::now();
    // The policies came with the install. The guides' step re-applies them for a cluster
    // installed otherwise; after the chart or the kustomize base it would give the policies a
    // second owner (Helm then refuses to upgrade a policy it did not make), so only bootstrap's
    // run takes it, as the claims guide says.
    if let Installer::Bootstrap = installer {
        guides.run(admin_kubeconfig, "kubectl apply -f deploy/admission/")?;
    }
    guides.run(
        admin_kubeconfig,
        "kubectl -n banlieue-system create secret generic libvirt-edge-creds",
    )?;
    guides.run(
        admin_kubeconfig,
        "kubectl -n banlieue-system create configmap libvirt-edge-ca",
    )?;
    guides.run(
        admin_kubeconfig,
        "kubectl apply -f examples/09-providerclass-libvirt.yaml",
    )?;
    guides.run(
        admin_kubeconfig,
        "kubectl apply -f examples/02-provider-libvirt-edge.yaml",
    )?;
    let providers: Api<Provider> = Api::namespaced(admin.clone(), NS);
    let provider = until("the Provider Ready", 180, || async {
        let p = providers.get(PROVIDER).await?;
        Ok(provider_ready(&p).then_some(p))
    })
    .await?;
    let domains_published = provider.status.clone().unwrap_or_default().failure_domains;
    assert_eq!(domains_published.len(), 1, "{domains_published:?}");
    let provider_pod = running_pod(&admin, &format!("banlieue.io/provider={PROVIDER}"), 60).await?;
    assert_eq!(
        provider_pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.as_deref()),
        Some(format!("banlieue-provider-{PROVIDER}").as_str())
    );
    eprintln!("Provider applied → Ready: {:.1?}", t.elapsed());
    let shown = guides.run(
        admin_kubeconfig,
        "kubectl -n banlieue-system get provider libvirt-edge-host-7",
    )?;
    assert!(shown.contains("True"), "{shown}");

    // 3. An image imported by the import Jobs from the artifacts PVC.
    let t = Instant::now();
    let registry = Registry::start(RegistryOptions::secure()).await?;
    let _artifacts = import_image(&cp, &mut guides, &libvirtd, &registry).await?;
    eprintln!(
        "registry push, build and import (examples/10 → both zones Ready): {:.1?}",
        t.elapsed()
    );

    // 4. Example 17: a VMImage (BackingFile), a VMClass and a VirtualMachine → a running domain.
    let t = Instant::now();
    guides.run(
        admin_kubeconfig,
        "kubectl apply -f examples/17-virtualmachine-libvirt.yaml",
    )?;
    let vms: Api<VirtualMachine> = Api::namespaced(admin.clone(), NS);
    let running = until("web-01's domain running", 180, || async {
        let state = libvirtd.virsh(["domstate", "banlieue-system-web-01"]).await;
        if state.as_ref().is_ok_and(|s| s.trim() == "running") {
            return Ok(Some(()));
        }
        // Not yet: what the VirtualMachine says, which the timeout reports.
        let vm = vms.get_opt("web-01").await?;
        Err(format!(
            "; domain {state:?}; the VirtualMachine: {}",
            describe_members(vm.as_slice())
        )
        .into())
    })
    .await;
    if running.is_err() {
        for args in [
            &["-n", NS, "get", "vmimage", "ubuntu-2404", "-o", "yaml"][..],
            &[
                "-n",
                NS,
                "logs",
                &format!("deployment/banlieue-provider-{PROVIDER}"),
                "--tail=60",
            ],
        ] {
            let shown = kubectl(&cp, "admin", args).unwrap_or_else(|e| e.to_string());
            eprintln!("$ kubectl {}\n{shown}", args.join(" "));
        }
    }
    running?;
    let listed = guides.run(
        admin_kubeconfig,
        "kubectl get virtualmachine,libvirtmachine -n banlieue-system",
    )?;
    assert!(
        listed.contains("virtualmachine.banlieue.io/web-01")
            && listed.contains("libvirtmachine.banlieue.io/web-01"),
        "{listed}"
    );
    guides
        .watch(
            admin_kubeconfig,
            "kubectl get libvirtmachine web-01 -n banlieue-system -w",
            "web-01",
            60,
        )
        .await?;
    eprintln!("example 17 → domain running: {:.1?}", t.elapsed());

    // Examples 19 and 20: a pool and alice's claim, Bound, in the guide's columns.
    let t = Instant::now();
    guides.run(
        admin_kubeconfig,
        "kubectl apply -f examples/19-virtualmachinepool.yaml",
    )?;
    // What an administrator grants a consumer: creating and reading claims (the claims guide,
    // "Who may create a claim": ordinary RBAC).
    kubectl(
        &cp,
        "admin",
        &[
            "-n",
            NS,
            "create",
            "role",
            "claimant",
            "--verb=create,get,list,watch,delete",
            "--resource=virtualmachineclaims.banlieue.io",
        ],
    )?;
    kubectl(
        &cp,
        "admin",
        &[
            "-n",
            NS,
            "create",
            "rolebinding",
            "claimant",
            "--role=claimant",
            "--user=alice",
        ],
    )?;
    // The admission policy and the grant take a moment to be seen by every check.
    until("alice's claim accepted", 30, || {
        let applied = guides.run(
            alice_kubeconfig,
            "kubectl apply -f examples/20-virtualmachineclaim.yaml",
        );
        async move { Ok(applied.ok().map(|_| ())) }
    })
    .await?;
    let watched = guides
        .watch(
            alice_kubeconfig,
            "kubectl get vmclaim -n banlieue-system -w",
            "Bound",
            // A real guest's boot under TCG on two cores.
            480,
        )
        .await?;
    let claims: Api<VirtualMachineClaim> = Api::namespaced(admin.clone(), NS);
    let claim = claims.get("sandbox-for-alice").await?;
    let bound = claim
        .status
        .as_ref()
        .and_then(|s| s.virtual_machine_ref.as_ref())
        .map(|r| r.name.clone())
        .ok_or("Bound without a VM")?;
    assert_eq!(kubectl_phase(&claim), "Bound");
    eprintln!(
        "claim → Bound through the deployed operator: {:.1?}",
        t.elapsed()
    );
    let header: Vec<&str> = watched
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        header[..5],
        ["NAME", "POOL", "VM", "PHASE", "EXPIRES"],
        "{watched}"
    );
    assert!(
        watched
            .lines()
            .any(|l| l.contains(&bound) && l.contains("Bound")),
        "{watched}"
    );
    let member_domain = format!("{NS}-{bound}");
    assert!(domains(&libvirtd).await?.contains(&member_domain));
    // Handed out because its guest, booted from the built image, said so.
    let vm = vms.get(&bound).await?;
    let guest_ready = vm
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == types::GUEST_READY))
        .map(|c| c.status.clone());
    assert_eq!(guest_ready.as_deref(), Some("True"), "{:?}", vm.status);

    // 4a. The isolation policies every installer put in force, played against the deployed
    //     operator as bob, a user of the namespace who may write VirtualMachines and claims
    //     (server-side dry runs: a write that got through would change nothing). alice's
    //     claim stays Bound through them and through the upgrade below.
    between_subjects(&cp, &bound)?;

    // 4b. The upgrade to this commit's manifests, with the claim Bound and a warm member in
    //     the pool: both are kept, the same objects, their domains untouched.
    upgrade_keeps_claims_and_members(&cp, installer, image, &release, &libvirtd, &bound).await?;

    // 5. Kill the acting controller replica and the provider's pod: the standby replica takes
    //    the Lease over, the Deployments replace the pods, and everything converges.
    let leases: Api<Lease> = Api::namespaced(admin.clone(), NS);
    let holder = |lease: Lease| lease.spec.and_then(|s| s.holder_identity);
    let leader = holder(leases.get(CONTROLLER_LEASE).await?).ok_or("nobody holds the Lease")?;
    let replicas: Vec<String> = Api::<Pod>::namespaced(admin.clone(), NS)
        .list(&ListParams::default().labels("app.kubernetes.io/name=banlieue-controller"))
        .await?
        .items
        .iter()
        .map(pod_name)
        .collect();
    assert_eq!(replicas.len(), 2, "controller replicas: {replicas:?}");
    assert!(
        replicas.contains(&leader),
        "{leader} holds the Lease: not a replica"
    );
    let t = Instant::now();
    kubectl(&cp, "admin", &["-n", NS, "delete", "pod", &leader])?;
    kubectl(
        &cp,
        "admin",
        &["-n", NS, "delete", "pod", &pod_name(&provider_pod)],
    )?;
    let successor = until("another replica to take the Lease", 60, || async {
        Ok(holder(leases.get(CONTROLLER_LEASE).await?).filter(|h| !h.is_empty() && *h != leader))
    })
    .await?;
    eprintln!(
        "acting controller pod {leader} deleted → {successor} holds the Lease: {:.1?}",
        t.elapsed()
    );
    let new_controller =
        running_pod(&admin, "app.kubernetes.io/name=banlieue-controller", 120).await?;
    assert_ne!(pod_name(&new_controller), leader);
    running_pod(&admin, &format!("banlieue.io/provider={PROVIDER}"), 120).await?;

    // `kubectl delete vmclaim` returns once the member's domain is gone from the host.
    let t = Instant::now();
    guides.run(alice_kubeconfig, "kubectl delete vmclaim sandbox-for-alice")?;
    assert!(
        !domains(&libvirtd).await?.contains(&member_domain),
        "kubectl delete returned while {member_domain} was still defined"
    );
    eprintln!("claim delete → domain gone: {:.1?}", t.elapsed());
    // The pool refills with a new member, and no domain is left without its VirtualMachine.
    until("the pool refilled", 300, || async {
        let members = vms.list(&ListParams::default()).await?.items;
        let fresh = members.iter().any(|vm| {
            vm.metadata.name.as_deref() != Some(bound.as_str())
                && vm.metadata.name.as_deref() != Some("web-01")
        });
        Ok(fresh.then_some(()))
    })
    .await?;
    until("every domain has its VirtualMachine", 120, || async {
        let names: Vec<String> = vms
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter_map(|vm| vm.metadata.name.map(|n| format!("{NS}-{n}")))
            .collect();
        let orphans: Vec<String> = domains(&libvirtd)
            .await?
            .into_iter()
            .filter(|d| !names.contains(d))
            .collect();
        Ok(orphans.is_empty().then_some(()))
    })
    .await?;
    let mut not_here = NOT_RUN_HERE.to_vec();
    if !matches!(installer, Installer::Bootstrap) {
        not_here.push((
            "kubectl apply -f deploy/admission/",
            "the chart and the kustomize base install the policies themselves",
        ));
    }
    let left = guides.not_run(&not_here);
    assert!(left.is_empty(), "guide commands never run: {left:#?}");
    eprintln!("whole run: {:.1?}", started.elapsed());
    print_memory(&admin).await;
    Ok(())
}

/// One import's own account of its transfer, from its "import complete" log line.
#[derive(Debug, Clone, Copy)]
struct Transfer {
    /// When it ended, in seconds since the Unix epoch (the line's timestamp).
    ended: f64,
    seconds: f64,
    data_bytes: u64,
    hole_bytes: u64,
}

impl Transfer {
    /// `2026-…T14:27:39.375067Z  INFO …: import complete … data_bytes=N hole_bytes=N … seconds=S`.
    fn parse(line: &str) -> Option<Transfer> {
        let field = |name: &str| {
            line.split_whitespace()
                .find_map(|word| word.strip_prefix(name)?.strip_prefix('='))
        };
        let stamp = line.split_whitespace().next()?;
        let ended =
            std::time::SystemTime::from(stamp.parse::<k8s_openapi::jiff::Timestamp>().ok()?)
                .duration_since(std::time::UNIX_EPOCH)
                .ok()?
                .as_secs_f64();
        Some(Transfer {
            ended,
            seconds: field("seconds")?.parse().ok()?,
            data_bytes: field("data_bytes")?.parse().ok()?,
            hole_bytes: field("hole_bytes")?.parse().ok()?,
        })
    }

    fn bytes(&self) -> u64 {
        self.data_bytes + self.hole_bytes
    }
}

/// The same artifact imported once more by the same binary run alone on the host, into a pool
/// of its own, and the Job pods' transfers set against it: the pods' two transfers at once
/// count as two (their bytes over the window from the first start to the last end), the
/// standalone one as one. Uses the administrator's kubeconfig: only the throughput is
/// compared here; the pods' identity is checked above.
async fn import_against_standalone(
    cp: &ControlPlane,
    libvirtd: &Libvirtd,
    pod_transfers: &[Transfer],
    source: &Path,
    volume: &str,
    revision: &str,
) -> Result {
    const BENCH_POOL: &str = "import-standalone";
    let pool_dir = libvirtd.create_pool_dir(BENCH_POOL)?;
    let target = pool_dir.display().to_string();
    libvirtd
        .virsh(["pool-define-as", BENCH_POOL, "dir", "--target", &target])
        .await?;
    libvirtd.virsh(["pool-start", BENCH_POOL]).await?;
    let kubeconfig = cp.kubeconfig("admin").ok_or("admin kubeconfig")?;
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_banlieue"))
        .env("KUBECONFIG", kubeconfig)
        .args(["provider", "libvirt", "import", "--vmimage", URL_IMAGE])
        .args(["--provider", PROVIDER, "--provider-namespace", NS])
        .args([
            "--pool",
            BENCH_POOL,
            "--volume",
            volume,
            "--revision",
            revision,
        ])
        .arg("--source")
        .arg(source)
        .arg("--artifacts-root")
        .arg(source.parent().ok_or("the artifact's directory")?)
        .output()?;
    let wall = started.elapsed().as_secs_f64();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        return Err(format!("the standalone import failed: {said}").into());
    }
    let alone = said
        .lines()
        .filter(|l| l.contains("import complete"))
        .find_map(Transfer::parse)
        .ok_or_else(|| format!("no \"import complete\" from the standalone import: {said}"))?;
    let mib = |bytes: u64| bytes as f64 / f64::from(1 << 20);
    let first_start = pod_transfers
        .iter()
        .map(|t| t.ended - t.seconds)
        .fold(f64::INFINITY, f64::min);
    let last_end = pod_transfers
        .iter()
        .map(|t| t.ended)
        .fold(f64::NEG_INFINITY, f64::max);
    let window = last_end - first_start;
    let pods_bytes: u64 = pod_transfers.iter().map(Transfer::bytes).sum();
    let pods_rate = mib(pods_bytes) / window;
    let alone_rate = mib(alone.bytes()) / alone.seconds;
    eprintln!(
        "import throughput: {} Job pods {:.0} MiB in {window:.2} s = {pods_rate:.0} MiB/s; \
         standalone (same binary, same artifact) {:.0} MiB in {:.2} s ({wall:.2} s from process \
         start) = {alone_rate:.0} MiB/s; Job pods / standalone = {:.2}×",
        pod_transfers.len(),
        mib(pods_bytes),
        mib(alone.bytes()),
        alone.seconds,
        pods_rate / alone_rate
    );
    libvirtd
        .virsh(["vol-delete", "--pool", BENCH_POOL, volume])
        .await?;
    Ok(())
}

/// Each member's name, phase and non-True conditions with their reasons and messages.
fn describe_members(members: &[VirtualMachine]) -> String {
    if members.is_empty() {
        return "none".into();
    }
    let describe = |vm: &VirtualMachine| {
        let status = vm.status.as_ref();
        let conditions: Vec<String> = status
            .map(|s| s.conditions.as_slice())
            .unwrap_or_default()
            .iter()
            .filter(|c| c.status != "True")
            .map(|c| format!("{}={} {}: {}", c.type_, c.status, c.reason, c.message))
            .collect();
        format!(
            "{} (guest phase {:?}) [{}]",
            vm.metadata.name.as_deref().unwrap_or_default(),
            status.and_then(|s| s.guest_phase.as_deref()),
            conditions.join("; ")
        )
    };
    members.iter().map(describe).collect::<Vec<_>>().join(", ")
}

/// Waits for a warm member in example 19's pool, upgrades the install to this commit's
/// manifests, waits for the controller Deployment to roll out, and checks that the bound claim
/// and every VirtualMachine are the same objects as before, with their domains still defined.
async fn upgrade_keeps_claims_and_members(
    cp: &ControlPlane,
    installer: Installer,
    image: &str,
    release: &install::Release,
    libvirtd: &Libvirtd,
    bound: &str,
) -> Result {
    let admin = cp.client()?;
    let vms: Api<VirtualMachine> = Api::namespaced(admin.clone(), NS);
    let t = Instant::now();
    // The pool hands out members once their guest says GuestReady (the test's pool).
    let warm = until(
        "a warm member in the pool before the upgrade",
        480,
        || async {
            let members = vms
                .list(&ListParams::default().labels(&format!("{}={POOL}", names::LABEL_POOL)))
                .await?
                .items;
            let guest_ready = |vm: &VirtualMachine| {
                vm.status.as_ref().is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|c| c.type_ == types::GUEST_READY && c.status == "True")
                })
            };
            if let Some(warm) = members.iter().find(|vm| guest_ready(vm)) {
                return Ok(Some(warm.clone()));
            }
            // Not yet: what each member says, which the timeout reports.
            Err(format!("; the pool's members: {}", describe_members(&members)).into())
        },
    )
    .await?;
    eprintln!(
        "claim Bound → {} warm in the pool: {:.1?}",
        warm.metadata.name.as_deref().unwrap_or_default(),
        t.elapsed()
    );
    let uids = |list: Vec<VirtualMachine>| -> Vec<(String, String)> {
        let mut uids: Vec<(String, String)> = list
            .into_iter()
            .filter(|vm| vm.metadata.deletion_timestamp.is_none())
            .map(|vm| {
                (
                    vm.metadata.name.unwrap_or_default(),
                    vm.metadata.uid.unwrap_or_default(),
                )
            })
            .collect();
        uids.sort();
        uids
    };
    let before = uids(vms.list(&ListParams::default()).await?.items);
    let domains_before = domains(libvirtd).await?;
    let claims: Api<VirtualMachineClaim> = Api::namespaced(admin.clone(), NS);
    let claim_before = claims.get("sandbox-for-alice").await?;

    // A release comes with its image: the same binary under the next tag, so the upgrade
    // rolls the controller's replicas (and the image builder) as a real one does.
    let (name, _) = image.rsplit_once(':').ok_or("an image with a tag")?;
    let next = format!("{name}:upgraded");
    cp.node().ok_or("a node")?.tag_image(image, &next).await?;
    let t = Instant::now();
    installer.upgrade(cp, &next).await?;
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), NS);
    until("the controller Deployment rolled out", 180, || async {
        let d = deployments.get("banlieue-controller").await?;
        let wanted = d.spec.replicas.unwrap_or(1);
        let generation = d.metadata.generation.unwrap_or_default();
        let pod_spec = d.spec.template.spec.as_ref();
        let runs_next =
            pod_spec.is_some_and(|s| s.containers[0].image.as_deref() == Some(next.as_str()));
        Ok(d.status
            .filter(|s| {
                runs_next
                    && s.observed_generation.unwrap_or_default() >= generation
                    && s.updated_replicas.unwrap_or_default() == wanted
                    && s.available_replicas.unwrap_or_default() == wanted
                    && s.replicas.unwrap_or_default() == wanted
            })
            .map(|_| ()))
    })
    .await?;
    // Only upgraded replicas are left, and one of them holds the Lease.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    let leases: Api<Lease> = Api::namespaced(admin.clone(), NS);
    let leader = until("an upgraded replica holding the Lease", 120, || async {
        let replicas = pods
            .list(&ListParams::default().labels("app.kubernetes.io/name=banlieue-controller"))
            .await?
            .items;
        let upgraded: Vec<String> = replicas
            .iter()
            .filter(|p| {
                p.metadata.deletion_timestamp.is_none()
                    && p.spec
                        .as_ref()
                        .is_some_and(|s| s.containers[0].image.as_deref() == Some(next.as_str()))
            })
            .map(pod_name)
            .collect();
        let holder = leases
            .get(CONTROLLER_LEASE)
            .await?
            .spec
            .and_then(|s| s.holder_identity);
        Ok(holder.filter(|h| upgraded.len() == replicas.len() && upgraded.contains(h)))
    })
    .await?;

    let claim = claims.get("sandbox-for-alice").await?;
    assert_eq!(kubectl_phase(&claim), "Bound", "{:?}", claim.status);
    assert_eq!(claim.metadata.uid, claim_before.metadata.uid);
    assert_eq!(
        claim
            .status
            .as_ref()
            .and_then(|s| s.virtual_machine_ref.as_ref())
            .map(|r| r.name.as_str()),
        Some(bound)
    );
    let after = uids(vms.list(&ListParams::default()).await?.items);
    let lost: Vec<&(String, String)> = before.iter().filter(|vm| !after.contains(vm)).collect();
    assert!(
        lost.is_empty(),
        "VirtualMachines replaced or gone across the upgrade: {lost:?} (after: {after:?})"
    );
    let domains_after = domains(libvirtd).await?;
    let undefined: Vec<&String> = domains_before
        .iter()
        .filter(|d| !domains_after.contains(d))
        .collect();
    assert!(undefined.is_empty(), "domains gone: {undefined:?}");
    eprintln!(
        "{} upgrade from {} → rolled out ({leader} leads), {} VirtualMachines and the Bound \
         claim kept: {:.1?}",
        installer.name(),
        release.commit,
        before.len(),
        t.elapsed()
    );
    Ok(())
}

fn kubectl_phase(c: &VirtualMachineClaim) -> String {
    c.status
        .as_ref()
        .and_then(|s| s.phase)
        .map(|p| format!("{p:?}"))
        .unwrap_or_default()
}

fn pod_name(p: &Pod) -> String {
    p.metadata.name.clone().unwrap_or_default()
}

/// Resident memory of each banlieue pod's process, from /proc (the node is this machine).
async fn print_memory(kube: &Client) {
    let pods: Api<Pod> = Api::namespaced(kube.clone(), NS);
    let Ok(list) = pods.list(&ListParams::default()).await else {
        return;
    };
    let names: Vec<String> = list.items.iter().map(pod_name).collect();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let path = entry.path();
        let Ok(cmdline) = std::fs::read(path.join("cmdline")) else {
            continue;
        };
        if !cmdline.starts_with(b"/banlieue\0") {
            continue;
        }
        let args = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let rss = std::fs::read_to_string(path.join("status"))
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .unwrap_or_default()
            .to_owned();
        eprintln!(
            "pod process {} ({args}): {rss} [pods: {names:?}]",
            path.display()
        );
    }
}

/// Step 4 of the libvirt guide: the artifacts PVC, examples/10's VMImage naming an image in a
/// private registry, banlieue-imagebuilder's build Job's pod building it onto the PVC, and the
/// import Jobs' pods writing it into both pools. Returns the
/// directory backing the PersistentVolume, which must outlive the Jobs' pods.
async fn import_image(
    cp: &ControlPlane,
    guides: &mut Guides,
    libvirtd: &Libvirtd,
    registry: &Registry,
) -> Result<tempfile::TempDir> {
    let admin = cp.client()?;
    let kubeconfig = cp.kubeconfig("admin").ok_or("admin kubeconfig")?;
    // The cluster's storage: a hostPath volume of no class, which the guide's claim (no class,
    // and this cluster has no default one) binds to.
    let backing = tempfile::tempdir()?;
    let dir = backing.path().join("artifacts");
    std::fs::create_dir(&dir)?;
    // The test guest (scripts/guest-image: Debian with cloud-init, qemu-guest-agent and the
    // guest-phase layer), pushed as a qcow2 disk artifact (skopeo) into a registry with TLS
    // and basic auth on loopback, as a site's private registry; the build Job's pod
    // (hostNetwork, like every pod here) pulls it. The oracle for the artifact is qemu-img's raw.
    let guest = banlieue_testenv::guest_image::path()
        .await
        .map_err(|e| banlieue_testenv::control_plane::error_chain(&e))?;
    let oracle = backing.path().join("guest.raw");
    let status = Command::new("qemu-img")
        .args(["convert", "-q", "-O", "raw"])
        .arg(&guest)
        .arg(&oracle)
        .status()?;
    assert!(status.success(), "qemu-img convert");
    let expected_sha256 = sha256_file(&oracle)?;
    let layout = OciLayout::builder()
        .config(ARTIFACT_TYPE, b"{}".to_vec())
        .layer(Layer::from_file(MEDIA_TYPE_QCOW2, &guest))
        .write(&backing.path().join("layout"))?;
    registry
        .push_layout(&layout, "kairos/ubuntu", "24.04")
        .await?;
    // The build pod runs as UID 65532: a hostPath volume takes no fsGroup, so the directory is
    // made writable as a site's provisioner would.
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777))?;
    let volumes: Api<PersistentVolume> = Api::all(admin.clone());
    volumes
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({
                "metadata": {"name": "banlieue-artifacts-hostpath"},
                "spec": {
                    "capacity": {"storage": "200Gi"},
                    "accessModes": ["ReadWriteMany"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "hostPath": {"path": dir, "type": "Directory"},
                }
            }))?,
        )
        .await?;
    kubectl_apply(
        cp,
        "admin",
        &guide::yaml_block(&repo_path(""), PROVIDER_GUIDE, "name: banlieue-artifacts")?,
    )?;

    // The administrator stores the registry's credentials and CA in the build namespace and
    // names them in examples/10 (the reader's substitutions: the registry, and the two fields).
    let credentials = registry.credentials().ok_or("registry credentials")?;
    let auth = base64::engine::general_purpose::STANDARD
        .encode(format!("{}:{}", credentials.username, credentials.password));
    kubectl_apply(
        cp,
        "admin",
        &serde_json::json!({
            "apiVersion": "v1", "kind": "List", "items": [
                {"apiVersion": "v1", "kind": "Secret",
                 "metadata": {"name": "registry-pull", "namespace": BUILD_NS},
                 "type": "kubernetes.io/dockerconfigjson",
                 "stringData": {".dockerconfigjson": serde_json::json!(
                     {"auths": {registry.host(): {"auth": auth}}}).to_string()}},
                {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": "registry-ca", "namespace": BUILD_NS},
                 "data": {"ca.crt": registry.ca_pem().ok_or("registry CA")?}},
            ]
        })
        .to_string(),
    )?;
    guides.substitute(
        "examples/10-vmimage-url.yaml",
        "url: oci://registry.example.com/kairos/ubuntu:24.04",
        &format!(
            "url: oci://{}",
            registry.reference("kairos/ubuntu", "24.04")
        ),
    )?;
    guides.substitute(
        "examples/10-vmimage-url.yaml",
        "# pullSecretName: registry-pull\n      # caConfigMapName: registry-ca",
        "pullSecretName: registry-pull\n      caConfigMapName: registry-ca",
    )?;
    guides.run(kubeconfig, "kubectl apply -f examples/10-vmimage-url.yaml")?;

    // banlieue-imagebuilder's pod resolves the tag and starts the build Job, whose pod pulls,
    // converts and publishes the artifact.
    let images: Api<VMImage> = Api::namespaced(admin.clone(), NS);
    let t = Instant::now();
    // The image builder's pod runs beside the controller's (bootstrap's Deployment).
    running_pod(&admin, "app.kubernetes.io/name=banlieue-imagebuilder", 120).await?;
    let built = until("the build artifact Ready", 300, || async {
        let artifact = images
            .get(URL_IMAGE)
            .await?
            .status
            .and_then(|s| s.build_artifact);
        if let Some(a) = &artifact {
            assert_ne!(format!("{:?}", a.phase), "Failed", "{a:?}");
        }
        Ok(artifact.filter(|a| format!("{:?}", a.phase) == "Ready"))
    })
    .await;
    let artifact_ready = Instant::now();
    let artifact = match built {
        Ok(artifact) => artifact,
        Err(e) => {
            eprintln!("{}", build_diagnostics(cp));
            return Err(e);
        }
    };
    eprintln!(
        "examples/10 applied → build artifact Ready ({} MiB raw): {:.1?}",
        artifact.size_bytes.unwrap_or_default() >> 20,
        t.elapsed()
    );
    let path = artifact.path.clone().ok_or("artifact path")?;
    assert_eq!(artifact.sha256.as_deref(), Some(expected_sha256.as_str()));
    assert_eq!(sha256_file(&dir.join(&path))?, expected_sha256);
    // The build published the disk's PCR 4 and 5 (the test image boots through shim), the
    // values the subject's own computation from the image gives (`banlieue imagebuild pcrs`
    // on the registry's qcow2; the guest test checks them against a boot's quote).
    let scratch = tempfile::tempdir()?;
    let own = banlieue::image_pcrs::measure(&guest, &[], scratch.path())?;
    let published: String = artifact
        .pcr_references
        .iter()
        .map(|r| format!("{} {}\n", r.pcr, r.sha256))
        .collect();
    assert_eq!(published, own.references, "{:?}", artifact.message);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), BUILD_NS);
    let built = pods
        .list(&ListParams::default().labels(&format!(
            "banlieue.io/vmimage={URL_IMAGE},app.kubernetes.io/managed-by=banlieue-imagebuilder"
        )))
        .await?
        .items;
    assert!(!built.is_empty(), "no build pod");
    for pod in &built {
        let spec = pod.spec.as_ref().ok_or("pod spec")?;
        assert_eq!(spec.service_account_name.as_deref(), Some("banlieue-build"));
        // The registry password reached the pod through the API only.
        assert!(!serde_json::to_string(spec)?.contains(&credentials.password));
    }
    let zones = until("both zones of the image Ready", 240, || async {
        let image = images.get(URL_IMAGE).await?;
        let zones = image
            .status
            .map(|s| s.per_provider)
            .unwrap_or_default()
            .into_iter()
            .flat_map(|p| p.zones)
            .collect::<Vec<_>>();
        let ready = zones.len() == 2 && zones.iter().all(|z| format!("{:?}", z.phase) == "Ready");
        Ok(ready.then_some(zones))
    })
    .await?;
    eprintln!(
        "build artifact Ready → both zones Ready: {:.1?}",
        artifact_ready.elapsed()
    );

    let shown = guides.run(
        kubeconfig,
        "kubectl -n banlieue-system get vmimage kairos-ubuntu-2404",
    )?;
    assert_eq!(shown.matches("Ready").count(), 2, "{shown}");
    let shown = guides.run(kubeconfig, "kubectl -n banlieue-imagebuild get jobs")?;
    assert_eq!(
        shown.matches("import-kairos-ubuntu-2404-").count(),
        2,
        "{shown}"
    );
    guides
        .watch(
            kubeconfig,
            "kubectl -n banlieue-imagebuild logs",
            "import complete",
            60,
        )
        .await?;

    // The Jobs' pods ran as the import ServiceAccount, and the host's key reached them through
    // neither their arguments, their environment nor a volume: they read it from the API.
    let key = std::fs::read_to_string(libvirtd.client_key_path())?;
    let key_line = key
        .lines()
        .find(|l| l.len() > 40)
        .ok_or("a line of the key")?;
    let jobs: Api<Job> = Api::namespaced(admin.clone(), BUILD_NS);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), BUILD_NS);
    let selector = format!("banlieue.io/vmimage={URL_IMAGE},app.kubernetes.io/managed-by=banlieue");
    assert_eq!(
        jobs.list(&ListParams::default().labels(&selector))
            .await?
            .items
            .len(),
        2
    );
    let ran = pods
        .list(&ListParams::default().labels(&selector))
        .await?
        .items;
    assert!(!ran.is_empty());
    // Where the import's time went: each pod's own account of its transfer (bytes sent as data
    // and as holes, seconds), beside the end-to-end figure above.
    let mut transfers = Vec::new();
    for pod in &ran {
        let log = pods
            .logs(&pod_name(pod), &Default::default())
            .await
            .unwrap_or_default();
        if let Some(line) = log.lines().find(|l| l.contains("import complete")) {
            eprintln!("import pod {}: {}", pod_name(pod), line.trim());
            transfers.extend(Transfer::parse(line));
        }
    }
    let volume = zones
        .first()
        .and_then(|z| z.volume.clone())
        .ok_or("a zone's volume")?;
    let revision = images
        .get(URL_IMAGE)
        .await?
        .status
        .and_then(|s| s.revision)
        .ok_or("the image's revision")?;
    import_against_standalone(
        cp,
        libvirtd,
        &transfers,
        &dir.join(&path),
        &volume,
        &revision,
    )
    .await?;
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), NS);
    let creds = secrets.get("libvirt-edge-creds").await?;
    let encoded_key = creds
        .data
        .as_ref()
        .and_then(|d| d.get("tls.key"))
        .map(|k| serde_json::to_string(k).unwrap_or_default())
        .ok_or("the Secret's key")?;
    for pod in &ran {
        let spec = pod.spec.as_ref().ok_or("pod spec")?;
        // The Provider's own import account: no other Provider's import pods read its
        // namespace.
        assert_eq!(
            spec.service_account_name.as_deref(),
            Some(banlieue_operator::workloads::import_account_name(NS, PROVIDER).as_str())
        );
        let text = serde_json::to_string(spec)?;
        assert!(
            !text.contains(key_line),
            "the key is in pod {}",
            pod_name(pod)
        );
        assert!(!text.contains(encoded_key.trim_matches('"')));
        // The environment is the ProviderClass's and the cluster's, none of it from a Secret.
        for container in &spec.containers {
            for var in container.env.iter().flatten() {
                let from = var.value_from.as_ref();
                assert!(from.is_none_or(|f| f.secret_key_ref.is_none()), "{var:?}");
            }
            for source in container.env_from.iter().flatten() {
                assert!(source.secret_ref.is_none(), "{source:?}");
            }
        }
        for volume in spec.volumes.iter().flatten() {
            assert!(
                volume.secret.is_none(),
                "pod {} mounts a Secret",
                pod_name(pod)
            );
        }
        assert_eq!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded")
        );
    }

    // What the pools hold is the artifact, byte for byte.
    for zone in &zones {
        let volume = zone.volume.as_deref().ok_or("a zone's volume")?;
        let copy = backing.path().join(format!("{}.download", zone.pool));
        libvirtd
            .virsh([
                "vol-download",
                "--pool",
                &zone.pool,
                volume,
                &copy.display().to_string(),
            ])
            .await?;
        assert_eq!(
            sha256_file(&copy)?,
            expected_sha256,
            "{volume} in {} differs from the artifact",
            zone.pool
        );
        std::fs::remove_file(&copy)?;
    }
    Ok(backing)
}

//! The operator as users deploy it: banlieue's container image on a real node (containerd and a
//! kubelet), installed with `banlieue bootstrap --image`, and the libvirt provider guide and the
//! claims guide followed with kubectl against a real libvirtd. Every step is a guide's command
//! or an API call of the user the guide names; the pods run as their own ServiceAccounts under
//! the shipped RBAC, with no test-only grant.
//!
//! Needs the image archive `scripts/image` writes, named by `BANLIEUE_IMAGE_ARCHIVE` (the
//! docker archive); `scripts/test.d/60-deployed.sh` builds it and runs this test.
//!
//! Substitutions, as a reader following the guides here makes them: the Provider's endpoint is
//! the local libvirtd's; the host has the example's pools and network (created below); the
//! ProviderClass gets `BANLIEUE_LIBVIRT_DOMAIN_TYPE=qemu` (no usable KVM here); the pool keeps
//! one replica instead of three (each is an EFI guest under TCG on two cores); the claim's
//! subject id is the certificate user `alice` who creates it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use banlieue_api::{Provider, VirtualMachine, VirtualMachineClaim};
use banlieue_testenv::control_plane::{ControlPlane, bin_dir};
use banlieue_testenv::libvirtd::{Libvirtd, LibvirtdOptions};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ListParams};

const NS: &str = "banlieue-system";
const PROVIDER: &str = "libvirt-edge-host-7";
const BACKING_VOLUME: &str = "ubuntu-24.04-server-cloudimg-amd64.qcow2";

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn repo(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(relative)
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
    use std::io::Write as _;
    let kubeconfig = cp.kubeconfig(identity).ok_or("no kubeconfig")?;
    let mut child = Command::new(bin_dir().join("kubectl"))
        .env("KUBECONFIG", kubeconfig)
        .args(["apply", "-f", "-"])
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
        return Err(format!("kubectl apply: {}", String::from_utf8_lossy(&out.stderr)).into());
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
        Ok(list.items.into_iter().find(|p| {
            p.metadata.deletion_timestamp.is_none()
                && p.status.as_ref().is_some_and(|s| {
                    s.conditions
                        .iter()
                        .flatten()
                        .any(|c| c.type_ == "Ready" && c.status == "True")
                })
        }))
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
    let cp = ControlPlane::start_with_node().await?;
    let node = cp.node().ok_or("a node")?;
    node.import_image(&archive).await?;
    eprintln!("node up, image imported: {:.1?}", started.elapsed());
    let libvirtd = host().await?;
    let admin = cp.client()?;
    let kubeconfig = cp.kubeconfig("admin").ok_or("admin kubeconfig")?;

    // 1. `banlieue bootstrap --image`: the controller runs as a pod.
    let t = Instant::now();
    let image = banlieue::bootstrap::DEFAULT_IMAGE;
    let out = Command::new(env!("CARGO_BIN_EXE_banlieue"))
        .env("KUBECONFIG", kubeconfig)
        .args(["bootstrap", "--image", image])
        .output()?;
    assert!(
        out.status.success(),
        "bootstrap: {}",
        String::from_utf8_lossy(&out.stderr)
    );
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
    eprintln!("bootstrap → controller Available: {:.1?}", t.elapsed());

    // 2. The guide's admission step and step 2's commands, then the Provider of example 02.
    let t = Instant::now();
    kubectl(
        &cp,
        "admin",
        &[
            "apply",
            "-f",
            &repo("deploy/admission").display().to_string(),
        ],
    )?;
    kubectl(
        &cp,
        "admin",
        &[
            "-n",
            NS,
            "create",
            "secret",
            "generic",
            "libvirt-edge-creds",
            &format!(
                "--from-file=tls.crt={}",
                libvirtd.client_cert_path().display()
            ),
            &format!(
                "--from-file=tls.key={}",
                libvirtd.client_key_path().display()
            ),
        ],
    )?;
    kubectl(
        &cp,
        "admin",
        &[
            "-n",
            NS,
            "create",
            "configmap",
            "libvirt-edge-ca",
            &format!("--from-file=ca.crt={}", libvirtd.ca_cert_path().display()),
        ],
    )?;
    kubectl(
        &cp,
        "admin",
        &[
            "apply",
            "-f",
            &repo("examples/09-providerclass-libvirt.yaml")
                .display()
                .to_string(),
        ],
    )?;
    kubectl(
        &cp,
        "admin",
        &[
            "patch",
            "providerclass",
            "libvirt",
            "--type=merge",
            "-p",
            r#"{"spec":{"pod":{"env":[{"name":"BANLIEUE_LIBVIRT_DOMAIN_TYPE","value":"qemu"}]}}}"#,
        ],
    )?;
    let example = std::fs::read_to_string(repo("examples/02-provider-libvirt-edge.yaml"))?;
    let endpoint = "qemu+tls://kvm-7.edge.example/system";
    assert!(
        example.contains(endpoint),
        "example 02 changed its endpoint"
    );
    kubectl_apply(
        &cp,
        "admin",
        &example.replace(endpoint, &libvirtd.tls_uri()),
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
    let shown = kubectl(&cp, "admin", &["-n", NS, "get", "provider", PROVIDER])?;
    assert!(shown.contains("True"), "{shown}");

    // 4. Example 17: a VMImage (BackingFile), a VMClass and a VirtualMachine → a running domain.
    let t = Instant::now();
    kubectl(
        &cp,
        "admin",
        &[
            "apply",
            "-f",
            &repo("examples/17-virtualmachine-libvirt.yaml")
                .display()
                .to_string(),
        ],
    )?;
    let vms: Api<VirtualMachine> = Api::namespaced(admin.clone(), NS);
    until("web-01's domain running", 180, || async {
        let state = libvirtd.virsh(["domstate", "banlieue-system-web-01"]).await;
        Ok(state.ok().filter(|s| s.trim() == "running").map(|_| ()))
    })
    .await?;
    eprintln!("example 17 → domain running: {:.1?}", t.elapsed());

    // Examples 19 and 20: a pool and alice's claim, Bound, in the guide's columns.
    let t = Instant::now();
    let pool = std::fs::read_to_string(repo("examples/19-virtualmachinepool.yaml"))?;
    assert!(pool.contains("replicas: 3"));
    kubectl_apply(&cp, "admin", &pool.replace("replicas: 3", "replicas: 1"))?;
    // What an administrator grants a consumer: creating and reading claims.
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
    let claim = std::fs::read_to_string(repo("examples/20-virtualmachineclaim.yaml"))?;
    let subject = "0c3b7f2e-1d4a-4b6c-9e8f-5a2d1c0b9e7f";
    assert!(claim.contains(subject));
    until("alice's claim accepted", 30, || async {
        Ok(
            kubectl_apply(&cp, "alice", &claim.replace(subject, "alice"))
                .ok()
                .map(|_| ()),
        )
    })
    .await?;
    let claims: Api<VirtualMachineClaim> = Api::namespaced(admin.clone(), NS);
    let bound = until("the claim Bound", 300, || async {
        let c = claims.get("sandbox-for-alice").await?;
        let vm = c
            .status
            .as_ref()
            .and_then(|s| s.virtual_machine_ref.as_ref())
            .map(|r| r.name.clone());
        Ok(vm.filter(|_| kubectl_phase(&c) == "Bound"))
    })
    .await?;
    eprintln!(
        "claim → Bound through the deployed operator: {:.1?}",
        t.elapsed()
    );
    let table = kubectl(&cp, "alice", &["get", "vmclaim", "-n", NS])?;
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        header[..5],
        ["NAME", "POOL", "VM", "PHASE", "EXPIRES"],
        "{table}"
    );
    assert!(table.contains(&bound) && table.contains("Bound"), "{table}");
    let member_domain = format!("{NS}-{bound}");
    assert!(domains(&libvirtd).await?.contains(&member_domain));

    // 5. Kill the controller's pod and the provider's pod: their Deployments replace them and
    //    everything converges.
    kubectl(
        &cp,
        "admin",
        &["-n", NS, "delete", "pod", &pod_name(&controller_pod)],
    )?;
    kubectl(
        &cp,
        "admin",
        &["-n", NS, "delete", "pod", &pod_name(&provider_pod)],
    )?;
    let new_controller =
        running_pod(&admin, "app.kubernetes.io/name=banlieue-controller", 120).await?;
    assert_ne!(pod_name(&new_controller), pod_name(&controller_pod));
    running_pod(&admin, &format!("banlieue.io/provider={PROVIDER}"), 120).await?;

    // `kubectl delete vmclaim` returns once the member's domain is gone from the host.
    let t = Instant::now();
    kubectl(
        &cp,
        "alice",
        &["delete", "vmclaim", "sandbox-for-alice", "-n", NS],
    )?;
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
    eprintln!("whole run: {:.1?}", started.elapsed());
    print_memory(&admin).await;
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

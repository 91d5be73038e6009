//! A real Kubernetes node beside a local control plane: containerd, kube-scheduler and a
//! kubelet named `localhost`, so that pods (the project's own images among them) run in tests.
//! [`Node::start_another`] adds more nodes on other loopback addresses, each with its own
//! containerd and kubelet, for what only shows with more than one node (where pods land).
//!
//! Everything lives under one temp directory (containerd's root, state, runc root and `opt`
//! directory, the kubelet's root and pod logs). What the components write elsewhere regardless
//! of flags (the kubelet's device-plugin socket and `/var/log/containers` links, the shims'
//! sockets under `/run/containerd/s`, three kernel settings) is undone at teardown, which a
//! janitor process runs (`node/teardown.sh`), so it also happens when the test process dies.
//! The host state is the machine's, shared by every test node on it (`node/host-state.sh`).
//!
//! Networking is the test cluster's to provide, as a CNI does on a real cluster: there is no
//! pod network here, only loopback. A MutatingAdmissionPolicy makes every Pod `hostNetwork`,
//! points its in-cluster client at the API server on `127.0.0.1:<port>` and makes its HTTP
//! probes ask `127.0.0.1`; product manifests stay exactly as users deploy them.

use std::ffi::OsString;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Node as NodeObject, Pod, PodSpec};
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};

use crate::control_plane::process::{Processes, which};
use crate::control_plane::{
    ControlPlane, Error, Result, apply_yaml_with, bin_dir, wait_for, write_kubeconfig,
};

/// The node's name, and the host name the API server reaches its kubelet by.
pub const NODE_NAME: &str = "localhost";
/// The sandbox image containerd is pinned to; built by `scripts/control-plane build-node`.
pub const PAUSE_IMAGE: &str = "banlieue.local/pause:1";
/// The admission policy (and its binding) that adapts pods to the loopback-only node.
pub const NETWORK_POLICY_NAME: &str = "banlieue-test-node-network";

const STARTUP_DEADLINE: Duration = Duration::from_secs(60);
const TEARDOWN_SCRIPT: &str = include_str!("node/teardown.sh");
/// Saves and restores the host state all test nodes on the machine share (bash functions).
const HOST_STATE: &str = include_str!("node/host-state.sh");
// Templates with `@NAME@` placeholders that `render` fills in.
const CONTAINERD_CONFIG: &str = include_str!("node/containerd.toml");
const KUBELET_CONFIG: &str = include_str!("node/kubelet.yaml");
const NETWORK_POLICY: &str = include_str!("node/network-policy.yaml");
/// One network with only the loopback plugin: containerd then reports the network ready.
/// hostNetwork pods never call it; a pod without hostNetwork fails its sandbox, on purpose.
const LOOPBACK_CONFLIST: &str = include_str!("node/loopback.conflist");
const RUNC: &str = "/usr/sbin/runc";
const CNI_BIN_DIR: &str = "/usr/lib/cni";

/// A running node. Dropping it (or the [`ControlPlane`] holding it) stops its processes by
/// PID, kills its containers and undoes what it changed on the host.
#[derive(Debug)]
pub struct Node {
    name: String,
    processes: Processes,
    containerd_socket: PathBuf,
    ctr: PathBuf,
    cgroup: String,
    up_after: Duration,
    kubelet_ready_after: Duration,
}

struct Binaries {
    containerd: PathBuf,
    ctr: PathBuf,
    kubelet: PathBuf,
    scheduler: PathBuf,
    pause_archive: PathBuf,
}

impl Binaries {
    fn find() -> Result<Self> {
        let bin = bin_dir();
        let binaries = Self {
            containerd: bin.join("containerd"),
            ctr: bin.join("ctr"),
            kubelet: bin.join("kubelet"),
            scheduler: bin.join("kube-scheduler"),
            pause_archive: bin.join("pause.tar"),
        };
        let missing: Vec<String> = [
            &binaries.containerd,
            &binaries.ctr,
            &bin.join("containerd-shim-runc-v2"),
            &binaries.kubelet,
            &binaries.scheduler,
            &binaries.pause_archive,
            Path::new(RUNC),
            &Path::new(CNI_BIN_DIR).join("loopback"),
        ]
        .into_iter()
        .filter(|path| !path.is_file())
        .map(|path| path.display().to_string())
        .collect();
        if missing.is_empty() {
            Ok(binaries)
        } else {
            Err(Error::NodeFilesMissing { missing })
        }
    }
}

/// Who a node is: its name, which is also the host name the API server dials its kubelet by,
/// and the loopback address the kubelet listens on.
struct Identity {
    name: String,
    address: Ipv4Addr,
    /// The first node runs the cluster's one kube-scheduler.
    runs_scheduler: bool,
}

impl Node {
    /// Starts containerd, kube-scheduler and the kubelet against `control_plane` (which must be
    /// local) and waits until the node is Ready.
    pub async fn start(control_plane: &ControlPlane) -> Result<Node> {
        let identity = Identity {
            name: NODE_NAME.to_owned(),
            address: Ipv4Addr::LOCALHOST,
            runs_scheduler: true,
        };
        Self::start_as(control_plane, identity).await
    }

    /// Starts another node on `control_plane`, which already has its first one (and with it
    /// the scheduler): its own containerd and kubelet, listening on the loopback address
    /// `address` (for example 127.0.0.2), which is also its name, so that the API server
    /// reaches it by that host name without a resolver. Pods then have two nodes to be
    /// scheduled on, as on a cluster of two machines.
    pub async fn start_another(control_plane: &ControlPlane, address: Ipv4Addr) -> Result<Node> {
        if !address.is_loopback() || address == Ipv4Addr::LOCALHOST {
            return Err(Error::NodeAddressNotLoopback { address });
        }
        let identity = Identity {
            name: address.to_string(),
            address,
            runs_scheduler: false,
        };
        Self::start_as(control_plane, identity).await
    }

    async fn start_as(control_plane: &ControlPlane, identity: Identity) -> Result<Node> {
        let Identity {
            name,
            address,
            runs_scheduler,
        } = identity;
        let address_text = address.to_string();
        let local = control_plane
            .local()
            .ok_or(Error::NodeNeedsLocalControlPlane)?;
        let binaries = Binaries::find()?;
        let started = Instant::now();
        // Unique per node on this machine: the kubelet's cgroupRoot, torn down by name.
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let cgroup = format!(
            "banlieue-node-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let mut processes = Processes::with_janitor(
            "banlieue-node-",
            &format!("{HOST_STATE}\n{TEARDOWN_SCRIPT}"),
            std::slice::from_ref(&cgroup),
        )?;
        let dir = processes.dir().to_owned();
        let register = format!("{HOST_STATE}\nregister_host_state \"$1\"");
        command(
            "bash",
            &["-c", &register, "register", &dir.display().to_string()],
        )
        .await?;
        create_cgroup(&cgroup)?;

        let pki = &local.pki;
        let node_client = pki.client(&format!("system:node:{name}"), Some("system:nodes"))?;
        let kubelet_serving = pki.serving(
            &format!("kubelet-serving-{name}"),
            &[address_text.as_str(), name.as_str()],
        )?;
        let ca = &pki.ca.cert;
        let kubelet_kubeconfig =
            write_kubeconfig(&dir, "kubelet", &local.server, ca, &node_client)?;

        // containerd, and the pause image every pod sandbox runs.
        let dir_text = dir.display().to_string();
        let containerd_dir = dir.join("containerd");
        let containerd_socket = containerd_dir.join("containerd.sock");
        let cni_conf_dir = dir.join("cni");
        create_dir(&cni_conf_dir)?;
        create_dir(&containerd_dir)?;
        write_file(
            &cni_conf_dir.join("10-loopback.conflist"),
            LOOPBACK_CONFLIST,
        )?;
        let containerd_config = containerd_dir.join("config.toml");
        write_file(
            &containerd_config,
            &render(
                CONTAINERD_CONFIG,
                &[("DIR", &dir_text), ("PAUSE_IMAGE", PAUSE_IMAGE)],
            ),
        )?;
        // The shim is found on PATH; the stable bin directory holds it beside containerd.
        let mut path = OsString::from(bin_dir());
        path.push(":");
        path.push(std::env::var_os("PATH").unwrap_or_default());
        processes.spawn_with_env(
            "containerd",
            &binaries.containerd,
            &[path_arg("config", &containerd_config)],
            &[("PATH", path)],
        )?;
        let ctr = Ctr {
            binary: &binaries.ctr,
            socket: &containerd_socket,
        };
        let waited = wait_for("containerd to answer", STARTUP_DEADLINE, || async {
            Ok(ctr.run(&["version"]).await.ok().map(|_| ()))
        })
        .await;
        processes.check_running()?;
        waited.map_err(|error| with_logs(error, &processes))?;
        ctr.import(&binaries.pause_archive).await?;

        let client = control_plane.client()?;
        install_network_policy(&client, &dir, local.apiserver_port).await?;

        if runs_scheduler {
            let scheduler_client = pki.client("system:kube-scheduler", None)?;
            let scheduler_kubeconfig =
                write_kubeconfig(&dir, "kube-scheduler", &local.server, ca, &scheduler_client)?;
            processes.spawn(
                "kube-scheduler",
                &binaries.scheduler,
                &scheduler_args(&scheduler_kubeconfig),
            )?;
        }

        let kubelet_dir = dir.join("kubelet");
        create_dir(&kubelet_dir)?;
        let kubelet_config = kubelet_dir.join("config.yaml");
        let port = crate::ports::free_loopback_port()
            .map_err(|source| Error::io("find a free port", source))?
            .to_string();
        let text = |path: &Path| path.display().to_string();
        write_file(
            &kubelet_config,
            &render(
                KUBELET_CONFIG,
                &[
                    ("DIR", &dir_text),
                    ("ADDRESS", &address_text),
                    ("PORT", &port),
                    ("CGROUP", &cgroup),
                    ("CA", &text(ca)),
                    ("SERVING_CERT", &text(&kubelet_serving.cert)),
                    ("SERVING_KEY", &text(&kubelet_serving.key)),
                ],
            ),
        )?;
        let kubelet_started = Instant::now();
        processes.spawn(
            "kubelet",
            &binaries.kubelet,
            &[
                path_arg("config", &kubelet_config),
                path_arg("kubeconfig", &kubelet_kubeconfig),
                path_arg("root-dir", &kubelet_dir.join("root")),
                path_arg("cert-dir", &kubelet_dir.join("pki")),
                format!("--hostname-override={name}"),
            ],
        )?;
        let nodes: Api<NodeObject> = Api::all(client);
        let waiting_for = format!("node {name} to be Ready");
        let waited = wait_for(&waiting_for, STARTUP_DEADLINE, || {
            let (nodes, name) = (nodes.clone(), name.clone());
            async move {
                let node = nodes.get_opt(&name).await?;
                Ok(node.filter(is_ready).map(|_| ()))
            }
        })
        .await;
        processes.check_running()?;
        waited.map_err(|error| with_logs(error, &processes))?;
        let node = Node {
            name,
            processes,
            containerd_socket,
            ctr: binaries.ctr,
            cgroup,
            up_after: started.elapsed(),
            kubelet_ready_after: kubelet_started.elapsed(),
        };
        eprintln!(
            "node {}: up after {:.1} s (kubelet start to Ready {:.2} s), state in {}",
            node.name,
            node.up_after.as_secs_f64(),
            node.kubelet_ready_after.as_secs_f64(),
            dir.display()
        );
        Ok(node)
    }

    /// The node's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Imports an image archive (docker-archive or OCI tar) into containerd's `k8s.io`
    /// namespace, where the kubelet finds it. Pods use it with `imagePullPolicy: Never` (or a
    /// tag other than `latest`, which defaults to `IfNotPresent`).
    pub async fn import_image(&self, archive: &Path) -> Result<()> {
        self.ctr().import(archive).await
    }

    /// Tags the node's image `source` as `target` too, as a new release's image would arrive:
    /// pods naming `target` then start without a pull.
    pub async fn tag_image(&self, source: &str, target: &str) -> Result<()> {
        self.ctr()
            .run(&["images", "tag", "--force", source, target])
            .await
            .map(|_| ())
    }

    /// `ctr` against this node's containerd.
    fn ctr(&self) -> Ctr<'_> {
        Ctr {
            binary: &self.ctr,
            socket: &self.containerd_socket,
        }
    }

    /// From start to Ready, containerd and the pause image import included.
    pub fn up_after(&self) -> Duration {
        self.up_after
    }

    /// From the kubelet's spawn to the node's Ready condition.
    pub fn kubelet_ready_after(&self) -> Duration {
        self.kubelet_ready_after
    }

    /// Names and PIDs of containerd, kube-scheduler and the kubelet (and the janitor).
    pub fn pids(&self) -> Vec<(&'static str, u32)> {
        self.processes.pids()
    }

    /// The name of the kubelet's cgroup root, a directory in every cgroup hierarchy.
    pub fn cgroup(&self) -> &str {
        &self.cgroup
    }

    /// The node's state directory.
    pub fn state_dir(&self) -> &Path {
        self.processes.dir()
    }
}

/// Whether a Node object reports condition Ready=True.
pub fn is_ready(node: &NodeObject) -> bool {
    let conditions = node.status.as_ref().and_then(|s| s.conditions.as_ref());
    ready_true(
        conditions
            .into_iter()
            .flatten()
            .map(|c| (&c.type_, &c.status)),
    )
}

/// Whether a Pod reports condition Ready=True: every container started and passing its
/// readiness probe, as the kubelet judged it.
pub fn pod_is_ready(pod: &Pod) -> bool {
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    ready_true(
        conditions
            .into_iter()
            .flatten()
            .map(|c| (&c.type_, &c.status)),
    )
}

/// Whether one of the (type, status) pairs of an object's conditions is Ready=True.
fn ready_true<'a>(mut conditions: impl Iterator<Item = (&'a String, &'a String)>) -> bool {
    conditions.any(|(type_, status)| type_ == "Ready" && status == "True")
}

/// The project's one image writer, which `scripts/image` and the pause image use too.
const IMAGE_WRITER: &str = "scripts/lib/oci-image";

/// Builds a docker-archive at `out` holding `files` (host paths, kept at the same paths in the
/// image) and the shared libraries `ldd` says they need, with `entrypoint` as the entrypoint:
/// an image of the host's own binaries, without a registry or a daemon, written by
/// `scripts/lib/oci-image` (the same bytes for the same host files).
pub async fn build_image(
    reference: &str,
    files: &[&Path],
    entrypoint: &[&str],
    out: &Path,
) -> Result<()> {
    if which("python3").is_none() {
        return Err(Error::NodeFilesMissing {
            missing: vec!["python3".to_owned()],
        });
    }
    let spec = image_spec(reference, files, entrypoint, out);
    let mut spec_file = tempfile::Builder::new()
        .prefix("banlieue-image-")
        .suffix(".json")
        .tempfile()
        .map_err(|source| Error::io("create an image spec file", source))?;
    std::io::Write::write_all(&mut spec_file, spec.to_string().as_bytes())
        .map_err(|source| Error::io("write the image spec", source))?;
    let writer = crate::repo_path(IMAGE_WRITER);
    command(
        "python3",
        &[
            &writer.display().to_string(),
            &spec_file.path().display().to_string(),
        ],
    )
    .await?;
    Ok(())
}

/// The spec `scripts/lib/oci-image` reads for [`build_image`]: every file at its host path,
/// with its libraries; a static binary (which ldd cannot list) has none.
fn image_spec(
    reference: &str,
    files: &[&Path],
    entrypoint: &[&str],
    out: &Path,
) -> serde_json::Value {
    let paths: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    serde_json::json!({
        "name": reference,
        "source_date_epoch": 0,
        "files": paths
            .iter()
            .map(|path| serde_json::json!({"path": path, "source": path}))
            .collect::<Vec<_>>(),
        "libraries_of": paths,
        "allow_static": true,
        "config": {"Entrypoint": entrypoint},
        "created_by": "banlieue-testenv node::build_image",
        "write": {"docker": out.display().to_string()},
    })
}

struct Ctr<'a> {
    binary: &'a Path,
    socket: &'a Path,
}

impl Ctr<'_> {
    async fn run(&self, args: &[&str]) -> Result<String> {
        let mut all = vec![
            "--address".to_owned(),
            self.socket.display().to_string(),
            "--namespace".to_owned(),
            "k8s.io".to_owned(),
        ];
        all.extend(args.iter().map(|&a| a.to_owned()));
        run_command(self.binary, &all).await
    }

    async fn import(&self, archive: &Path) -> Result<()> {
        self.run(&["images", "import", &archive.display().to_string()])
            .await
            .map(|_| ())
    }
}

async fn command(program: &str, args: &[&str]) -> Result<String> {
    let args: Vec<String> = args.iter().map(|&a| a.to_owned()).collect();
    run_command(Path::new(program), &args).await
}

async fn run_command(program: &Path, args: &[String]) -> Result<String> {
    let what = format!(
        "{} {}",
        program.file_name().unwrap_or_default().to_string_lossy(),
        args.join(" ")
    );
    let output = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|source| Error::io(format!("run {what}"), source))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(Error::Command {
            what,
            status: output.status,
            output: format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ),
        })
    }
}

/// The kubelet's cgroupRoot must exist in every hierarchy (cgroup v1 here). A new cpuset
/// cgroup starts with no CPUs and no memory nodes, so those are copied from the parent.
fn create_cgroup(name: &str) -> Result<()> {
    let root = Path::new("/sys/fs/cgroup");
    let entries =
        std::fs::read_dir(root).map_err(|source| Error::io("list /sys/fs/cgroup", source))?;
    for entry in entries.flatten() {
        let hierarchy = entry.path();
        if !hierarchy.join("cgroup.procs").is_file() || entry.file_name() == "unified" {
            continue;
        }
        let cgroup = hierarchy.join(name);
        create_dir(&cgroup)?;
        if entry.file_name() == "cpuset" {
            for file in ["cpuset.cpus", "cpuset.mems"] {
                let value = std::fs::read_to_string(hierarchy.join(file))
                    .map_err(|source| Error::io(format!("read {file}"), source))?;
                std::fs::write(cgroup.join(file), value.trim())
                    .map_err(|source| Error::io(format!("write {file}"), source))?;
            }
        }
    }
    Ok(())
}

/// Installs the policy that adapts every Pod to this node (see the module comment) and waits
/// until the API server applies it: a dry-run Pod must come back mutated.
async fn install_network_policy(client: &Client, dir: &Path, apiserver_port: u16) -> Result<()> {
    let path = dir.join("network-policy.yaml");
    let port = apiserver_port.to_string();
    let mut policy = render(NETWORK_POLICY, &[("API_PORT", &port)]);
    let served = crate::manifests::serves_mutating_admission_policies(client).await?;
    if !served {
        // Before v1.36 the control plane serves the beta API for this policy alone.
        policy = policy.replace(
            "apiVersion: admissionregistration.k8s.io/v1\n",
            "apiVersion: admissionregistration.k8s.io/v1beta1\n",
        );
    }
    write_file(&path, &policy)?;
    apply_yaml_with(client, &path, None).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let probe = Pod {
        metadata: ObjectMeta {
            name: Some("banlieue-node-policy-probe".into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "probe".into(),
                image: Some(PAUSE_IMAGE.into()),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        ..Pod::default()
    };
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    wait_for(
        "the node's admission policy to apply",
        STARTUP_DEADLINE,
        || {
            let (pods, probe, dry_run) = (pods.clone(), probe.clone(), dry_run.clone());
            async move {
                let created = pods.create(&dry_run, &probe).await?;
                Ok(created
                    .spec
                    .filter(|spec| spec.host_network == Some(true))
                    .map(|_| ()))
            }
        },
    )
    .await
}

/// Replaces each `@NAME@` of a template.
fn render(template: &str, values: &[(&str, &str)]) -> String {
    values
        .iter()
        .fold(template.to_owned(), |text, (name, value)| {
            text.replace(&format!("@{name}@"), value)
        })
}

fn scheduler_args(kubeconfig: &Path) -> Vec<String> {
    vec![
        path_arg("kubeconfig", kubeconfig),
        path_arg("authentication-kubeconfig", kubeconfig),
        path_arg("authorization-kubeconfig", kubeconfig),
        "--secure-port=0".into(),
        "--leader-elect=false".into(),
    ]
}

fn path_arg(flag: &str, path: &Path) -> String {
    format!("--{flag}={}", path.display())
}

fn create_dir(path: &Path) -> Result<()> {
    std::fs::create_dir_all(path)
        .map_err(|source| Error::io(format!("create {}", path.display()), source))
}

fn write_file(path: &Path, contents: &str) -> Result<()> {
    std::fs::write(path, contents)
        .map_err(|source| Error::io(format!("write {}", path.display()), source))
}

fn with_logs(error: Error, processes: &Processes) -> Error {
    match error {
        Error::Timeout {
            what,
            after,
            detail,
        } => Error::Timeout {
            what,
            after,
            detail: format!("{detail}\n{}", processes.log_tails()),
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The entries of the tar `data`, with their contents.
    fn tar_entries(data: &[u8]) -> Vec<(String, Vec<u8>)> {
        let mut archive = tar::Archive::new(data);
        archive
            .entries()
            .expect("tar entries")
            .map(|entry| {
                let mut entry = entry.expect("tar entry");
                let path = entry.path().expect("entry path").display().to_string();
                let mut contents = Vec::new();
                std::io::Read::read_to_end(&mut entry, &mut contents).expect("entry contents");
                (path, contents)
            })
            .collect()
    }

    /// The writer runs for real: the host file at its own path, its loader and libc beside it,
    /// the entrypoint in the config, and the same bytes from a second build.
    #[tokio::test]
    async fn build_image_holds_the_files_and_their_libraries() {
        let dir = tempfile::tempdir().expect("temp dir");
        let [first, second] = ["a.tar", "b.tar"].map(|name| dir.path().join(name));
        for out in [&first, &second] {
            build_image(
                "banlieue.local/sh:1",
                &[Path::new("/bin/sh")],
                &["/bin/sh", "-c"],
                out,
            )
            .await
            .expect("build the image");
        }
        let archive = std::fs::read(&first).expect("read the archive");
        assert_eq!(
            archive,
            std::fs::read(&second).expect("read the second archive")
        );

        let entries = tar_entries(&archive);
        let find = |name: &str| {
            entries
                .iter()
                .find(|(path, _)| path == name)
                .map(|(_, contents)| contents.clone())
                .unwrap_or_else(|| panic!("no {name} in the archive"))
        };
        let manifest: serde_json::Value =
            serde_json::from_slice(&find("manifest.json")).expect("manifest.json");
        assert_eq!(
            manifest[0]["RepoTags"],
            serde_json::json!(["banlieue.local/sh:1"])
        );
        let config: serde_json::Value =
            serde_json::from_slice(&find(manifest[0]["Config"].as_str().expect("config")))
                .expect("config");
        assert_eq!(
            config["config"]["Entrypoint"],
            serde_json::json!(["/bin/sh", "-c"])
        );
        let layer = find(manifest[0]["Layers"][0].as_str().expect("layer"));
        let files: Vec<String> = tar_entries(&layer)
            .into_iter()
            .map(|(path, _)| path)
            .collect();
        assert!(files.contains(&"bin/sh".to_owned()), "{files:?}");
        for library in ["/libc.so.6", "/ld-linux"] {
            assert!(
                files.iter().any(|path| path.contains(library)),
                "no {library} in {files:?}"
            );
        }
    }

    /// Every placeholder of the templates is one the code fills in.
    #[test]
    fn rendered_templates_have_no_placeholder_left() {
        let rendered = [
            render(
                CONTAINERD_CONFIG,
                &[("DIR", "/tmp/n"), ("PAUSE_IMAGE", PAUSE_IMAGE)],
            ),
            render(
                KUBELET_CONFIG,
                &[
                    ("DIR", "/tmp/n"),
                    ("ADDRESS", "127.0.0.2"),
                    ("PORT", "1"),
                    ("CGROUP", "c"),
                    ("CA", "/ca"),
                    ("SERVING_CERT", "/c"),
                    ("SERVING_KEY", "/k"),
                ],
            ),
            render(NETWORK_POLICY, &[("API_PORT", "6443")]),
        ];
        for text in rendered {
            let left: Vec<&str> = text
                .split('@')
                .skip(1)
                .step_by(2)
                .filter(|name| name.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
                .collect();
            assert!(left.is_empty(), "unrendered {left:?} in:\n{text}");
        }
    }
}

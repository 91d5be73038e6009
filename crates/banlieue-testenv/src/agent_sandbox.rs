//! agent-sandbox (Kubernetes SIG Apps' Sandbox, SandboxTemplate, SandboxWarmPool and
//! SandboxClaim), the project banlieue is measured side by side with, as a real peer: its CRDs
//! and the RBAC it ships installed on a local control plane, and its controller, built from the
//! Go module proxy by `scripts/control-plane build-agent-sandbox`, run as a child process under
//! its own ServiceAccount, as its Deployment would run it (extensions on, one replica).
//!
//! ```no_run
//! # async fn demo() -> Result<(), banlieue_testenv::agent_sandbox::Error> {
//! use banlieue_testenv::agent_sandbox::{AgentSandbox, Kind};
//! use banlieue_testenv::control_plane::ControlPlane;
//! let cp = ControlPlane::start_with_node().await?; // pods need a node to become Ready
//! let agent_sandbox = AgentSandbox::start(&cp).await?;
//! let claims = kube::Api::<kube::api::DynamicObject>::namespaced_with(
//!     cp.client()?, "default", &Kind::SandboxClaim.api_resource());
//! # Ok(()) }
//! ```
//!
//! The controller's pods are the node's like any other: the node's admission policy makes them
//! hostNetwork, so a template's pod must not need a pod network.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use kube::api::{ApiResource, DynamicObject};
use serde_json::{Value, json};

use crate::control_plane::{self, ControlPlane, apply_yaml_with};

/// The release `scripts/control-plane build-agent-sandbox` builds (`AGENT_SANDBOX_VERSION`).
pub const VERSION: &str = "v1.0.1";
/// Overrides the directory holding the build (`bin/agent-sandbox-controller` and `k8s/`).
pub const DIR_ENV: &str = "BANLIEUE_AGENT_SANDBOX_DIR";
/// The namespace and ServiceAccount its manifests run the controller as.
pub const NAMESPACE: &str = "agent-sandbox-system";
pub const SERVICE_ACCOUNT: &str = "agent-sandbox-controller";
/// The API version of every kind it serves.
pub const API_VERSION: &str = "v1beta1";

const CONTROLLER: &str = "agent-sandbox-controller";
/// How long the controller may take to sync its caches and start every controller's workers.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(50);
/// What controller-runtime logs once a controller's caches have synced, one line per controller.
const STARTING_WORKERS: &str = "\"Starting workers\"";
/// The Deployment and Service of the controller's own manifests: the child process replaces them.
const NOT_APPLIED: [&str; 2] = ["Deployment", "Service"];

/// What can go wrong with agent-sandbox.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(
        "agent-sandbox {VERSION} is not built in {}: run scripts/setup agent-sandbox (or scripts/control-plane build-agent-sandbox)",
        .0.display()
    )]
    Missing(PathBuf),
    #[error(
        "agent-sandbox runs only beside a local control plane, not with {}",
        control_plane::EXTERNAL_KUBECONFIG_ENV
    )]
    NeedsLocalControlPlane,
    #[error("talk to the control plane")]
    ControlPlane(#[from] control_plane::Error),
    #[error("failed to {what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("parse YAML in {}", path.display())]
    Yaml {
        path: PathBuf,
        #[source]
        // Boxed: the parser's error carries its source snippet and is large.
        source: Box<serde_saphyr::Error>,
    },
    #[error("{CONTROLLER} exited ({status}); end of its log:\n{log_tail}")]
    Exited {
        status: ExitStatus,
        log_tail: String,
    },
    #[error(
        "{CONTROLLER} did not start the workers of {missing:?} within {after:?}; end of its log:\n{log_tail}"
    )]
    NotReady {
        after: Duration,
        missing: Vec<&'static str>,
        log_tail: String,
    },
}

impl Error {
    fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            what: what.into(),
            source,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The kinds agent-sandbox serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `agents.x-k8s.io`: one pod (and optionally a Service and volumes).
    Sandbox,
    /// `extensions.agents.x-k8s.io`: the pod template sandboxes are made from.
    SandboxTemplate,
    /// `extensions.agents.x-k8s.io`: N sandboxes of a template kept ready, unclaimed.
    SandboxWarmPool,
    /// `extensions.agents.x-k8s.io`: a request for a sandbox, served from a warm pool if it can.
    SandboxClaim,
}

impl Kind {
    /// Every kind, in the order the controller starts them.
    pub const ALL: [Kind; 4] = [
        Kind::Sandbox,
        Kind::SandboxClaim,
        Kind::SandboxTemplate,
        Kind::SandboxWarmPool,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Sandbox => "Sandbox",
            Kind::SandboxTemplate => "SandboxTemplate",
            Kind::SandboxWarmPool => "SandboxWarmPool",
            Kind::SandboxClaim => "SandboxClaim",
        }
    }

    pub fn group(self) -> &'static str {
        match self {
            Kind::Sandbox => "agents.x-k8s.io",
            _ => "extensions.agents.x-k8s.io",
        }
    }

    /// The CRD's plural name.
    pub fn plural(self) -> &'static str {
        match self {
            Kind::Sandbox => "sandboxes",
            Kind::SandboxTemplate => "sandboxtemplates",
            Kind::SandboxWarmPool => "sandboxwarmpools",
            Kind::SandboxClaim => "sandboxclaims",
        }
    }

    /// The resource, for `Api::<DynamicObject>::namespaced_with`.
    pub fn api_resource(self) -> ApiResource {
        ApiResource {
            group: self.group().to_owned(),
            version: API_VERSION.to_owned(),
            api_version: format!("{}/{API_VERSION}", self.group()),
            kind: self.name().to_owned(),
            plural: self.plural().to_owned(),
        }
    }
}

/// The label agent-sandbox puts on a Sandbox, and its value for one that came from a warm pool.
pub const LAUNCH_TYPE: &str = "agents.x-k8s.io/launch-type";

/// An object of `kind` named `name` with `spec`.
pub fn object(kind: Kind, name: &str, spec: Value) -> DynamicObject {
    let mut object = DynamicObject::new(name, &kind.api_resource());
    object.data = json!({ "spec": spec });
    object
}

/// A SandboxTemplate `name` whose pod runs the test node's pause image, which the node has
/// already imported (nothing is pulled). No NetworkPolicy: the test node has no pod network to
/// enforce one on, and its pods are made hostNetwork.
pub fn pause_template(name: &str) -> DynamicObject {
    object(
        Kind::SandboxTemplate,
        name,
        json!({
            "networkPolicyManagement": "Unmanaged",
            "podTemplate": {
                "metadata": {},
                "spec": {
                    "containers": [{
                        "name": "pause",
                        "image": crate::node::PAUSE_IMAGE,
                        "imagePullPolicy": "Never",
                    }],
                },
            },
        }),
    )
}

/// A SandboxWarmPool `name` of `replicas` sandboxes of `template`.
pub fn warm_pool(name: &str, template: &str, replicas: u32) -> DynamicObject {
    object(
        Kind::SandboxWarmPool,
        name,
        json!({ "replicas": replicas, "sandboxTemplateRef": { "name": template } }),
    )
}

/// A SandboxClaim `name` on the warm pool `pool`.
pub fn claim(name: &str, pool: &str) -> DynamicObject {
    object(
        Kind::SandboxClaim,
        name,
        json!({ "warmPoolRef": { "name": pool } }),
    )
}

/// Whether an object of agent-sandbox's has its `Ready` condition true (a claim once its
/// Sandbox is, a Sandbox once its pod is).
pub fn is_ready(object: &DynamicObject) -> bool {
    object.data["status"]["conditions"]
        .as_array()
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

/// How many sandboxes of a SandboxWarmPool are ready (its `status.readyReplicas`).
pub fn ready_replicas(pool: &DynamicObject) -> u64 {
    pool.data["status"]["readyReplicas"].as_u64().unwrap_or(0)
}

/// The directory of the build: `BANLIEUE_AGENT_SANDBOX_DIR`, else
/// `~/.cache/banlieue/agent-sandbox/VERSION`, where `scripts/control-plane build-agent-sandbox`
/// puts it.
pub fn dir() -> PathBuf {
    match std::env::var_os(DIR_ENV) {
        Some(dir) => PathBuf::from(dir),
        None => control_plane::banlieue_cache()
            .join("agent-sandbox")
            .join(VERSION),
    }
}

/// agent-sandbox's controller running against a local control plane. Dropping it kills the
/// controller by PID; its log stays in the control plane's state directory until that goes.
/// The objects it installed stay too (the control plane is thrown away whole).
#[derive(Debug)]
pub struct AgentSandbox {
    child: Child,
    dir: PathBuf,
    log: PathBuf,
    ready_after: Duration,
}

impl AgentSandbox {
    /// Installs the CRDs and the RBAC agent-sandbox ships (its namespace, ServiceAccount,
    /// ClusterRoles and bindings) on `control_plane`, which must be local, and starts its
    /// controller with extensions on as that ServiceAccount; returns once every controller's
    /// caches have synced. Installing is idempotent, so several controllers may be started one
    /// after another on one control plane (never two at once: without leader election both
    /// would act).
    pub async fn start(control_plane: &ControlPlane) -> Result<AgentSandbox> {
        let state_dir = control_plane
            .state_dir()
            .ok_or(Error::NeedsLocalControlPlane)?;
        let build = dir();
        let binary = build.join("bin").join(CONTROLLER);
        let manifests = build.join("k8s");
        if !binary.is_file() || !manifests.join("crds").is_dir() {
            return Err(Error::Missing(build));
        }
        install(control_plane, &manifests, state_dir).await?;

        // Inside the control plane's state directory, so its janitor removes it with the rest.
        let dir = tempfile::Builder::new()
            .prefix("agent-sandbox-")
            .tempdir_in(state_dir)
            .map_err(|source| Error::io("create the controller's directory", source))?
            .keep();
        let kubeconfig = dir.join("kubeconfig");
        control_plane
            .write_service_account_kubeconfig(NAMESPACE, SERVICE_ACCOUNT, &kubeconfig)
            .await?;
        let log = dir.join(format!("{CONTROLLER}.log"));
        let started = Instant::now();
        let mut child = spawn(&binary, &controller_args(&kubeconfig), &dir, &log)?;
        match wait_ready(&mut child, &log).await {
            Ok(()) => {}
            Err(error) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(error);
            }
        }
        let ready_after = started.elapsed();
        eprintln!(
            "agent-sandbox {VERSION}: controller (pid {}) ready after {:.2} s, log {}",
            child.id(),
            ready_after.as_secs_f64(),
            log.display()
        );
        Ok(AgentSandbox {
            child,
            dir,
            log,
            ready_after,
        })
    }

    /// The controller's PID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The controller's log (JSON lines, controller-runtime's zap logger).
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The directory holding its kubeconfig and log, inside the control plane's.
    pub fn state_dir(&self) -> &Path {
        &self.dir
    }

    /// From spawn to every controller's workers started.
    pub fn ready_after(&self) -> Duration {
        self.ready_after
    }

    /// Fails if the controller has exited, quoting the end of its log.
    pub fn check_running(&mut self) -> Result<()> {
        match self.child.try_wait() {
            Ok(Some(status)) => Err(Error::Exited {
                status,
                log_tail: tail(&self.log),
            }),
            Ok(None) => Ok(()),
            Err(source) => Err(Error::io("check the controller", source)),
        }
    }
}

impl Drop for AgentSandbox {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The controller's flags: those of its shipped Deployment with extensions, but without leader
/// election (one replica, no lease to wait for) and with its metrics and health endpoints off
/// (nothing scrapes them; no port to find); its own defaults otherwise (no client-side rate
/// limit, 50 SandboxClaim workers).
fn controller_args(kubeconfig: &Path) -> Vec<String> {
    vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        "--extensions".into(),
        "--leader-elect=false".into(),
        "--metrics-bind-address=0".into(),
        "--health-probe-bind-address=0".into(),
    ]
}

/// Applies the CRDs, then the RBAC, from the build's copy of the module's `k8s/`.
async fn install(control_plane: &ControlPlane, manifests: &Path, scratch: &Path) -> Result<()> {
    let client = control_plane.client()?;
    let mut crds: Vec<PathBuf> = std::fs::read_dir(manifests.join("crds"))
        .map_err(|source| Error::io(format!("list {}/crds", manifests.display()), source))?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    crds.sort();
    for crd in &crds {
        apply_yaml_with(&client, crd, None).await?;
    }
    // The namespace, ServiceAccount and binding of controller.yaml (not its Deployment or
    // Service), the ClusterRoles, and the extensions' binding.
    let controller = without_kinds(&manifests.join("controller.yaml"), &NOT_APPLIED)?;
    let accounts = scratch.join("agent-sandbox-accounts.yaml");
    std::fs::write(&accounts, controller)
        .map_err(|source| Error::io(format!("write {}", accounts.display()), source))?;
    for file in [
        accounts,
        manifests.join("rbac.generated.yaml"),
        manifests.join("extensions-rbac.generated.yaml"),
        manifests.join("extensions.yaml"),
    ] {
        apply_yaml_with(&client, &file, None).await?;
    }
    Ok(())
}

/// The documents of the YAML file at `path` whose kind is none of `kinds`, as a multi-document
/// YAML text (each document as JSON, which is YAML).
fn without_kinds(path: &Path, kinds: &[&str]) -> Result<String> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| Error::io(format!("read {}", path.display()), source))?;
    let documents: Vec<Value> =
        serde_saphyr::from_multiple(&text).map_err(|source| Error::Yaml {
            path: path.to_owned(),
            source: Box::new(source),
        })?;
    Ok(documents
        .iter()
        .filter(|document| !document.is_null())
        .filter(|document| {
            let kind = document.get("kind").and_then(Value::as_str).unwrap_or("");
            !kinds.contains(&kind)
        })
        .map(|document| format!("---\n{document}\n"))
        .collect())
}

/// Starts the controller under `setpriv --pdeathsig KILL`, forked by the process-lifetime
/// thread, so it dies with the test process however that ends; its output to `log`.
fn spawn(binary: &Path, args: &[String], dir: &Path, log: &Path) -> Result<Child> {
    let setpriv = crate::control_plane::process::which("setpriv")
        .ok_or(control_plane::Error::SetprivMissing)?;
    let out = std::fs::File::create(log)
        .map_err(|source| Error::io(format!("create {}", log.display()), source))?;
    let err = out
        .try_clone()
        .map_err(|source| Error::io(format!("create {}", log.display()), source))?;
    let mut command = Command::new(setpriv);
    command
        .args(["--pdeathsig", "KILL", "--"])
        .arg(binary)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    crate::spawner::spawn_for_process_lifetime(command)
        .map_err(|source| Error::io(format!("start {CONTROLLER}"), source))
}

/// Waits until the log says every kind's controller has started its workers.
async fn wait_ready(child: &mut Child, log: &Path) -> Result<()> {
    let started = Instant::now();
    loop {
        if let Some(status) = child
            .try_wait()
            .map_err(|source| Error::io("check the controller", source))?
        {
            return Err(Error::Exited {
                status,
                log_tail: tail(log),
            });
        }
        let missing = not_started(&std::fs::read_to_string(log).unwrap_or_default());
        if missing.is_empty() {
            return Ok(());
        }
        if started.elapsed() >= READY_TIMEOUT {
            return Err(Error::NotReady {
                after: READY_TIMEOUT,
                missing,
                log_tail: tail(log),
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The kinds whose controller has not logged "Starting workers" in `log`.
fn not_started(log: &str) -> Vec<&'static str> {
    Kind::ALL
        .iter()
        .map(|kind| kind.name())
        .filter(|name| {
            let field = format!("\"controllerKind\":\"{name}\"");
            !log.lines()
                .any(|line| line.contains(STARTING_WORKERS) && line.contains(&field))
        })
        .collect()
}

/// The last few KiB of a log file, lossily decoded.
fn tail(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap_or_default();
    let start = bytes.len().saturating_sub(4096);
    String::from_utf8_lossy(&bytes[start..]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_is_every_kind_starting_its_workers() {
        let line = |kind: &str| {
            format!(
                "{{\"level\":\"info\",\"msg\":\"Starting workers\",\"controllerKind\":\"{kind}\",\"worker count\":1}}"
            )
        };
        let some = [line("Sandbox"), line("SandboxClaim")].join("\n");
        assert_eq!(not_started(&some), ["SandboxTemplate", "SandboxWarmPool"]);
        let all = Kind::ALL.map(|kind| line(kind.name())).join("\n");
        assert!(not_started(&all).is_empty());
    }

    #[test]
    fn the_controllers_deployment_and_service_are_left_out() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("controller.yaml");
        std::fs::write(
            &path,
            "---\nkind: Namespace\napiVersion: v1\nmetadata:\n  name: a\n---\n\
             kind: Service\napiVersion: v1\nmetadata:\n  name: b\n---\n\
             kind: Deployment\napiVersion: apps/v1\nmetadata:\n  name: c\n",
        )
        .expect("write");
        let kept: Vec<Value> =
            serde_saphyr::from_multiple(&without_kinds(&path, &NOT_APPLIED).expect("filtered"))
                .expect("YAML");
        let kinds: Vec<&str> = kept
            .iter()
            .filter_map(|document| document.get("kind")?.as_str())
            .collect();
        assert_eq!(kinds, ["Namespace"]);
    }
}

//! A real kube-apiserver, kube-controller-manager and etcd on loopback.
//!
//! `scripts/control-plane build` (run by `scripts/setup`) builds the binaries at pinned releases
//! into a cache; this module starts them with a throwaway PKI and a temp state directory and
//! hands out clients for several identities. With `BANLIEUE_TEST_KUBECONFIG` set, the same API
//! talks to that cluster instead, so tests run unchanged against kind, k3d or a real cluster.

mod apply;
pub(crate) mod pki;
pub(crate) mod process;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, ObjectMeta, PostParams};
use kube::config::{AuthInfo, KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tokio::sync::OnceCell;

pub use apply::{apply_crds, apply_yaml_with, wait_established};

use crate::node::Node;
use pki::{CertFiles, Pki};
use process::Processes;

/// Names an existing cluster's kubeconfig; when set, no local control plane is started.
pub const EXTERNAL_KUBECONFIG_ENV: &str = "BANLIEUE_TEST_KUBECONFIG";
/// Overrides the directory holding `etcd`, `kube-apiserver` and `kube-controller-manager`.
pub const BIN_DIR_ENV: &str = "BANLIEUE_CONTROL_PLANE_BIN";
/// The cluster administrator (group `system:masters`).
pub const ADMIN: &str = "admin";
/// Ordinary users with no rights beyond what the bootstrap RBAC policy gives every
/// authenticated user, plus the broker identity a tenant-facing broker would use.
pub const USERS: [&str; 3] = ["alice", "bob", "broker"];

/// The label of every namespace `fresh_namespace` creates.
pub const TEST_NAMESPACE_LABEL: &str = "banlieue.io/test";

/// How long the service account tokens tests are given stay valid: a day. Nothing renews them:
/// `dev up` runs its roles with them for as long as it stays up, and a child process reads its
/// kubeconfig once (agent-sandbox's controller, an hour into the side-by-side benchmark, was
/// refused as `Unauthorized` with the hour it used to have).
pub const SERVICE_ACCOUNT_TOKEN_SECONDS: i64 = 86_400;
const STARTUP_DEADLINE: Duration = Duration::from_secs(90);

/// The API server's admission configuration: Pod Security's exemption of the test node's
/// runtime class.
const POD_SECURITY: &str = include_str!("node/pod-security.yaml");
const CRD_DEADLINE: Duration = Duration::from_secs(30);

/// Errors of the control-plane harness.
#[derive(thiserror::Error)]
pub enum Error {
    #[error("control-plane binaries not found in {}: run scripts/setup", dir.display())]
    BinariesMissing { dir: PathBuf },
    #[error("setpriv (util-linux) not found on PATH: run scripts/setup")]
    SetprivMissing,
    #[error("failed to {what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("generate certificates")]
    Pki(#[from] rcgen::Error),
    #[error("call the API server")]
    Kube(#[from] kube::Error),
    #[error("load a kubeconfig")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    #[error("{name} exited ({status}); end of its log:\n{log_tail}")]
    Exited {
        name: &'static str,
        status: ExitStatus,
        log_tail: String,
    },
    #[error("timed out after {after:?} waiting for {what}{detail}")]
    Timeout {
        what: String,
        after: Duration,
        detail: String,
    },
    #[error("parse YAML in {}", path.display())]
    Yaml {
        path: PathBuf,
        #[source]
        // Boxed: the parser's error carries its source snippet and is large.
        source: Box<serde_saphyr::Error>,
    },
    #[error("apply document {index} of {}: {reason}", path.display())]
    InvalidDocument {
        path: PathBuf,
        index: usize,
        reason: String,
    },
    #[error("no identity {0:?}: known are {ADMIN} and {USERS:?}")]
    UnknownIdentity(String),
    #[error("the API server returned a {0} without a name")]
    Unnamed(&'static str),
    #[error("the TokenRequest for {namespace}/{name} returned no token")]
    NoToken { namespace: String, name: String },
    #[error("node binaries or files missing ({}): run scripts/setup node", missing.join(", "))]
    NodeFilesMissing { missing: Vec<String> },
    #[error("a node runs only beside a local control plane, not with {EXTERNAL_KUBECONFIG_ENV}")]
    NodeNeedsLocalControlPlane,
    #[error("another node needs a loopback address other than 127.0.0.1, not {address}")]
    NodeAddressNotLoopback { address: std::net::Ipv4Addr },
    #[error(
        "only a local control plane's processes can be restarted, not {EXTERNAL_KUBECONFIG_ENV}'s"
    )]
    NotLocal,
    #[error("{what} failed ({status}):\n{output}")]
    Command {
        what: String,
        status: ExitStatus,
        output: String,
    },
}

/// The message chain rather than the structure: tests report errors with `expect`, which
/// prints `Debug`, and the reader wants "run scripts/setup" and the logs, not struct syntax.
impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&error_chain(self))
    }
}

impl Error {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            what: what.into(),
            source,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How [`ControlPlane::start_with`] starts the API server.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ControlPlaneOptions {
    /// A structured `AuthenticationConfiguration` (YAML), passed as `--authentication-config`
    /// (JWT issuers beside the client certificates and service account tokens).
    pub authentication_config: Option<String>,
    /// Start as a cluster without banlieue: none of `deploy/crds/` installed. An installer
    /// that owns the CRDs (Helm refuses to adopt objects it did not make) starts here, rather
    /// than deleting them, which the API server can take minutes to finish right after they
    /// were made (its CRD finalizer backs off while the new watch cache initializes).
    pub without_banlieue_crds: bool,
}

impl ControlPlaneOptions {
    /// Accept JWTs as `config` (an `apiserver.config.k8s.io/v1` AuthenticationConfiguration)
    /// says.
    pub fn authentication_config(mut self, config: impl Into<String>) -> Self {
        self.authentication_config = Some(config.into());
        self
    }

    /// See [`without_banlieue_crds`](Self::without_banlieue_crds).
    pub fn without_banlieue_crds(mut self) -> Self {
        self.without_banlieue_crds = true;
        self
    }
}

/// A process of the local control plane a test can crash and restart
/// ([`ControlPlane::crash_and_restart`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Component {
    Etcd,
    KubeApiserver,
}

impl Component {
    fn process_name(self) -> &'static str {
        match self {
            Component::Etcd => "etcd",
            Component::KubeApiserver => "kube-apiserver",
        }
    }
}

/// A Kubernetes control plane for tests: local processes, or an existing cluster.
#[derive(Debug)]
pub struct ControlPlane {
    // Declared first so it drops first: the node stops while the API server still answers.
    node: Option<Node>,
    admin: Config,
    identities: Identities,
    local: Option<Local>,
}

#[derive(Debug)]
enum Identities {
    /// Each identity is a client certificate, with its own kubeconfig file.
    Certificates(BTreeMap<String, PathBuf>),
    /// An existing cluster: the administrator impersonates the other identities.
    Impersonation,
}

#[derive(Debug)]
pub(crate) struct Local {
    // Declared first so it drops first: the processes stop before anything else goes.
    // Behind a lock so a test holding a shared `&ControlPlane` can crash and restart one.
    processes: std::sync::Mutex<Processes>,
    dir: PathBuf,
    ports: Vec<u16>,
    apiserver_ready_after: Duration,
    pub(crate) pki: Pki,
    pub(crate) server: String,
    pub(crate) apiserver_port: u16,
}

impl ControlPlane {
    /// The control plane shared by every test of this test binary, started on first use.
    ///
    /// Statics are never dropped; its processes die with the test binary (see
    /// `process` for how), and its state directory goes with them.
    pub async fn shared() -> Result<&'static ControlPlane> {
        static SHARED: OnceCell<ControlPlane> = OnceCell::const_new();
        SHARED
            .get_or_try_init(|| async {
                match std::env::var_os(EXTERNAL_KUBECONFIG_ENV) {
                    Some(path) => Self::external(Path::new(&path)).await,
                    None => Self::start().await,
                }
            })
            .await
    }

    /// A local control plane with a [`Node`], shared by every test of this test binary that
    /// needs pods to run. Always local: `BANLIEUE_TEST_KUBECONFIG` does not apply, since the
    /// node's pods reach the API server on loopback.
    pub async fn shared_with_node() -> Result<&'static ControlPlane> {
        static SHARED: OnceCell<ControlPlane> = OnceCell::const_new();
        SHARED.get_or_try_init(Self::start_with_node).await
    }

    /// Starts an owned local control plane and a node registered with it (see [`Node`]).
    pub async fn start_with_node() -> Result<ControlPlane> {
        Self::start_with_node_with(ControlPlaneOptions::default()).await
    }

    /// [`start_with_node`](Self::start_with_node) with options.
    pub async fn start_with_node_with(options: ControlPlaneOptions) -> Result<ControlPlane> {
        let mut control_plane = Self::start_with(options).await?;
        let node = Node::start(&control_plane).await?;
        control_plane.node = Some(node);
        Ok(control_plane)
    }

    /// The node started with [`start_with_node`](Self::start_with_node), if any.
    pub fn node(&self) -> Option<&Node> {
        self.node.as_ref()
    }

    pub(crate) fn local(&self) -> Option<&Local> {
        self.local.as_ref()
    }

    /// Starts an owned local control plane; dropping it stops every process by PID and
    /// removes its state directory.
    pub async fn start() -> Result<ControlPlane> {
        Self::start_with(ControlPlaneOptions::default()).await
    }

    /// [`start`](Self::start) with options.
    pub async fn start_with(options: ControlPlaneOptions) -> Result<ControlPlane> {
        // The free ports are released before the processes bind them, so a parallel test
        // binary can take one in between; the process then exits, and a fresh attempt with
        // fresh ports is the cure.
        const ATTEMPTS: u32 = 3;
        let mut attempt = 1;
        loop {
            match Self::start_once(&options).await {
                Err(Error::Exited { .. }) if attempt < ATTEMPTS => attempt += 1,
                result => return result,
            }
        }
    }

    async fn start_once(options: &ControlPlaneOptions) -> Result<ControlPlane> {
        install_crypto_provider();
        let bin = bin_dir();
        let binary = |name: &str| bin.join(name);
        for name in ["etcd", "kube-apiserver", "kube-controller-manager"] {
            if !binary(name).is_file() {
                return Err(Error::BinariesMissing { dir: bin.clone() });
            }
        }
        let started = Instant::now();
        let mut processes = Processes::new()?;
        let dir = processes.dir().to_owned();
        let pki = Pki::generate(&dir.join("pki"))?;
        let [etcd_client, etcd_peer, apiserver] = crate::ports::free_loopback_ports()
            .map_err(|source| Error::io("find free ports", source))?;
        // The API server's identity towards kubelets (logs, exec, port-forward).
        let kubelet_client = pki.client("kube-apiserver-kubelet-client", Some("system:masters"))?;

        processes.spawn(
            "etcd",
            &binary("etcd"),
            &etcd_args(&dir, etcd_client, etcd_peer),
        )?;
        let mut args = apiserver_args(&dir, &pki, &kubelet_client, etcd_client, apiserver);
        // Pod Security as the built-in defaults, with the test node's exemption (see the file).
        let admission = dir.join("pod-security.yaml");
        std::fs::write(&admission, POD_SECURITY).map_err(|source| Error::Io {
            what: format!("write {}", admission.display()),
            source,
        })?;
        args.push(path_arg("admission-control-config-file", &admission));
        if release_minor(&bin).is_some_and(|minor| minor < 36) {
            // The test node's networking (node/network-policy.yaml) is a MutatingAdmissionPolicy,
            // whose API before v1.36 is the beta one, off by default: served here for that
            // shim alone. banlieue's own policy needs v1, which such a release does not serve,
            // as on users' clusters.
            args.push("--runtime-config=admissionregistration.k8s.io/v1beta1=true".into());
            args.push("--feature-gates=MutatingAdmissionPolicy=true".into());
        }
        if let Some(config) = &options.authentication_config {
            let path = dir.join("authentication-config.yaml");
            std::fs::write(&path, config).map_err(|source| Error::Io {
                what: format!("write {}", path.display()),
                source,
            })?;
            args.push(path_arg("authentication-config", &path));
        }
        processes.spawn("kube-apiserver", &binary("kube-apiserver"), &args)?;

        let server = format!("https://127.0.0.1:{apiserver}");
        let mut kubeconfigs = BTreeMap::new();
        let admin_files = pki.client(ADMIN, Some("system:masters"))?;
        kubeconfigs.insert(
            ADMIN.to_owned(),
            write_kubeconfig(&dir, ADMIN, &server, &pki.ca.cert, &admin_files)?,
        );
        for user in USERS {
            let files = pki.client(user, None)?;
            kubeconfigs.insert(
                user.to_owned(),
                write_kubeconfig(&dir, user, &server, &pki.ca.cert, &files)?,
            );
        }
        // Its own identity, so that the bootstrap RBAC role for it is what it runs with.
        let kcm_files = pki.client("system:kube-controller-manager", None)?;
        let kcm_kubeconfig = write_kubeconfig(
            &dir,
            "kube-controller-manager",
            &server,
            &pki.ca.cert,
            &kcm_files,
        )?;

        let admin = config_from_file(&kubeconfigs[ADMIN]).await?;
        let admin_client = Client::try_from(admin.clone())?;
        wait_until_ready(&admin_client, &mut processes).await?;
        let apiserver_ready_after = started.elapsed();

        processes.spawn(
            "kube-controller-manager",
            &binary("kube-controller-manager"),
            &controller_manager_args(&pki, &kcm_kubeconfig),
        )?;
        // The `default` service account appears only when kube-controller-manager's
        // serviceaccount controller runs: proof that the controllers are up.
        let sa_api: Api<ServiceAccount> = Api::namespaced(admin_client.clone(), "default");
        let waited = wait_for(
            "kube-controller-manager to create default/default",
            STARTUP_DEADLINE,
            || {
                let sa_api = sa_api.clone();
                async move { Ok(sa_api.get_opt("default").await?.map(|_| ())) }
            },
        )
        .await;
        if let Err(error) = waited {
            processes.check_running()?;
            return Err(with_logs(error, &processes));
        }
        processes.check_running()?;

        let control_plane = ControlPlane {
            node: None,
            admin,
            identities: Identities::Certificates(kubeconfigs),
            local: Some(Local {
                processes: std::sync::Mutex::new(processes),
                dir: dir.clone(),
                ports: vec![etcd_client, etcd_peer, apiserver],
                apiserver_ready_after,
                pki,
                server,
                apiserver_port: apiserver,
            }),
        };
        if !options.without_banlieue_crds {
            control_plane.install_crds().await?;
        }
        eprintln!(
            "control plane: /readyz after {:.1} s, controllers up after {:.1} s, state in {}",
            apiserver_ready_after.as_secs_f64(),
            started.elapsed().as_secs_f64(),
            dir.display()
        );
        Ok(control_plane)
    }

    /// Uses the cluster of an existing kubeconfig (its current context) as the administrator.
    pub async fn external(kubeconfig: &Path) -> Result<ControlPlane> {
        install_crypto_provider();
        let control_plane = ControlPlane {
            node: None,
            admin: config_from_file(kubeconfig).await?,
            identities: Identities::Impersonation,
            local: None,
        };
        control_plane.install_crds().await?;
        Ok(control_plane)
    }

    /// A client with cluster-admin rights.
    pub fn client(&self) -> Result<Client> {
        Ok(Client::try_from(self.admin.clone())?)
    }

    /// A client authenticated as `identity` (`admin` or one of [`USERS`]).
    pub async fn client_as(&self, identity: &str) -> Result<Client> {
        if identity == ADMIN {
            return self.client();
        }
        if !USERS.contains(&identity) {
            return Err(Error::UnknownIdentity(identity.to_owned()));
        }
        let config = match &self.identities {
            Identities::Certificates(kubeconfigs) => {
                let path = kubeconfigs
                    .get(identity)
                    .ok_or_else(|| Error::UnknownIdentity(identity.to_owned()))?;
                config_from_file(path).await?
            }
            Identities::Impersonation => {
                let mut config = self.admin.clone();
                config.auth_info.impersonate = Some(identity.to_owned());
                config.auth_info.impersonate_groups = Some(vec!["system:authenticated".into()]);
                config
            }
        };
        Ok(Client::try_from(config)?)
    }

    /// The client of `user` (one of [`USERS`]) once it may write the banlieue objects
    /// `resource` (a plural: `vmimages`, `libvirtmachines`) in `namespace`, and nothing else
    /// this grant adds: a tenant of the namespace, the identity isolation tests attack as.
    /// Admin makes the grant, as an administrator would.
    pub async fn tenant_writing(
        &self,
        namespace: &str,
        user: &str,
        resource: &str,
    ) -> Result<Client> {
        use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
        let admin = self.client()?;
        let name = format!("tenant-{user}-{resource}");
        let role: Role = serde_json::from_value(serde_json::json!({
            "metadata": { "name": name },
            "rules": [{ "apiGroups": ["banlieue.io"], "resources": [resource],
                        "verbs": ["create", "get", "list", "watch", "update", "patch", "delete"] }]
        }))
        .expect("a Role");
        // The same grant asked for twice (tests sharing a namespace) is the same grant.
        fn exists<T>(r: kube::Result<T>) -> kube::Result<()> {
            match r {
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
                r => r.map(|_| ()),
            }
        }
        exists(
            Api::<Role>::namespaced(admin.clone(), namespace)
                .create(&PostParams::default(), &role)
                .await,
        )?;
        let binding: RoleBinding = serde_json::from_value(serde_json::json!({
            "metadata": { "name": name },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name },
            "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user }]
        }))
        .expect("a RoleBinding");
        exists(
            Api::<RoleBinding>::namespaced(admin, namespace)
                .create(&PostParams::default(), &binding)
                .await,
        )?;
        let tenant = self.client_as(user).await?;
        let objects = Api::<kube::api::DynamicObject>::namespaced_with(
            tenant.clone(),
            namespace,
            &kube::api::ApiResource {
                group: "banlieue.io".into(),
                version: "v1alpha1".into(),
                api_version: "banlieue.io/v1alpha1".into(),
                kind: String::new(),
                plural: resource.into(),
            },
        );
        // The authorizer learns of the binding through its informer.
        crate::poll::until("the tenant's grant", Duration::from_secs(30), || async {
            Ok(objects.list(&Default::default()).await.ok().map(|_| ()))
        })
        .await
        .map_err(|e| Error::Timeout {
            what: e.what.clone(),
            after: e.after,
            detail: String::new(),
        })?;
        Ok(tenant)
    }

    /// A client authenticated as a service account, with a bound token from the TokenRequest
    /// API (valid for [`SERVICE_ACCOUNT_TOKEN_SECONDS`] seconds).
    pub async fn client_as_service_account(&self, namespace: &str, name: &str) -> Result<Client> {
        let token = self.service_account_token(namespace, name).await?;
        self.client_with_token(&token)
    }

    /// A client presenting `token` as its bearer token (a service account token, or an OIDC
    /// ID token the API server is configured to accept), trusting the API server as the admin
    /// client does.
    pub fn client_with_token(&self, token: &str) -> Result<Client> {
        let mut config = self.admin.clone();
        config.auth_info = AuthInfo {
            token: Some(token.to_owned().into()),
            ..AuthInfo::default()
        };
        Ok(Client::try_from(config)?)
    }

    /// Writes to `path` a kubeconfig of the local control plane holding a token of the service
    /// account `namespace/name` (valid for [`SERVICE_ACCOUNT_TOKEN_SECONDS`] seconds), for a
    /// role run as a child process.
    pub async fn write_service_account_kubeconfig(
        &self,
        namespace: &str,
        name: &str,
        path: &Path,
    ) -> Result<()> {
        let admin_path = self
            .kubeconfig(ADMIN)
            .ok_or_else(|| Error::UnknownIdentity(ADMIN.to_owned()))?;
        let mut kubeconfig = Kubeconfig::read_from(admin_path)?;
        let token = self.service_account_token(namespace, name).await?;
        for named in &mut kubeconfig.auth_infos {
            named.auth_info = Some(AuthInfo {
                token: Some(token.clone().into()),
                ..AuthInfo::default()
            });
        }
        // JSON is YAML, and the kubeconfig reader takes either.
        let text = serde_json::to_vec(&kubeconfig).unwrap_or_default();
        std::fs::write(path, text).map_err(|source| Error::Io {
            what: format!("write {}", path.display()),
            source,
        })
    }

    /// A bound token of the service account `namespace/name` from the TokenRequest API.
    async fn service_account_token(&self, namespace: &str, name: &str) -> Result<String> {
        let accounts: Api<ServiceAccount> = Api::namespaced(self.client()?, namespace);
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                // None: the apiserver's own audience, which it accepts back.
                audiences: None,
                expiration_seconds: Some(SERVICE_ACCOUNT_TOKEN_SECONDS),
                ..Default::default()
            }),
            ..Default::default()
        };
        let response = accounts
            .create_token_request(name, &PostParams::default(), &request)
            .await?;
        response
            .status
            .and_then(|status| status.token)
            .filter(|token| !token.is_empty())
            .ok_or_else(|| Error::NoToken {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            })
    }

    /// Creates a namespace with a unique name, so that tests stay apart and run in parallel.
    pub async fn fresh_namespace(&self) -> Result<String> {
        let namespaces: Api<Namespace> = Api::all(self.client()?);
        let namespace = Namespace {
            metadata: ObjectMeta {
                generate_name: Some("banlieue-test-".into()),
                // On a long-lived cluster: `kubectl delete namespace -l banlieue.io/test`.
                labels: Some([(TEST_NAMESPACE_LABEL.to_owned(), "true".to_owned())].into()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        let created = namespaces
            .create(&PostParams::default(), &namespace)
            .await?;
        created.metadata.name.ok_or(Error::Unnamed("namespace"))
    }

    /// A [`fresh_namespace`](Self::fresh_namespace) that can take Pods: its `default`
    /// ServiceAccount exists (the API server refuses a Pod until the controller manager made it).
    pub async fn fresh_namespace_for_pods(&self) -> Result<String> {
        let namespace = self.fresh_namespace().await?;
        let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
            Api::namespaced(self.client()?, &namespace);
        wait_for(
            "the namespace's default ServiceAccount",
            Duration::from_secs(60),
            || {
                let accounts = accounts.clone();
                async move { Ok(accounts.get_opt("default").await?.map(|_| ())) }
            },
        )
        .await?;
        Ok(namespace)
    }

    /// Server-side applies every document of a multi-document YAML file as the administrator;
    /// namespaced objects without a namespace go to `default`. CRDs among them are waited on
    /// until Established, so later documents and calls can use them.
    pub async fn apply_yaml(
        &self,
        path: impl AsRef<Path>,
    ) -> Result<Vec<kube::api::DynamicObject>> {
        apply_yaml_with(&self.client()?, path.as_ref(), None).await
    }

    /// Like [`apply_yaml`](Self::apply_yaml), with `namespace` for namespaced objects that
    /// name none.
    pub async fn apply_yaml_in(
        &self,
        path: impl AsRef<Path>,
        namespace: &str,
    ) -> Result<Vec<kube::api::DynamicObject>> {
        apply_yaml_with(&self.client()?, path.as_ref(), Some(namespace)).await
    }

    /// The kubeconfig file of `identity`, for a local control plane.
    pub fn kubeconfig(&self, identity: &str) -> Option<&Path> {
        match &self.identities {
            Identities::Certificates(kubeconfigs) => {
                kubeconfigs.get(identity).map(PathBuf::as_path)
            }
            Identities::Impersonation => None,
        }
    }

    /// Crashes one process of the local control plane (SIGKILL), leaves it down for
    /// `down_for`, starts it again with the same flags and state, and returns once the API
    /// server's `/readyz` answers `ok` again: how long that took after the restart. etcd keeps
    /// its data directory and the API server its port, so clients and watches only see an
    /// outage, as when a real control-plane node restarts.
    pub async fn crash_and_restart(
        &self,
        component: Component,
        down_for: Duration,
    ) -> Result<Duration> {
        let local = self.local.as_ref().ok_or(Error::NotLocal)?;
        let name = component.process_name();
        let lock = || local.processes.lock().unwrap_or_else(|e| e.into_inner());
        lock().kill(name)?;
        tokio::time::sleep(down_for).await;
        lock().restart(name)?;
        let restarted = Instant::now();
        let client = Client::try_from(self.admin.clone())?;
        loop {
            let request = http::Request::get("/readyz")
                .body(Vec::new())
                .map_err(|e| Error::io("build a request", std::io::Error::other(e)))?;
            match client.request_text(request).await {
                Ok(body) if body.trim() == "ok" => return Ok(restarted.elapsed()),
                _ if restarted.elapsed() < STARTUP_DEADLINE => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                _ => {
                    return Err(Error::Timeout {
                        what: format!("kube-apiserver /readyz after restarting {name}"),
                        after: STARTUP_DEADLINE,
                        detail: lock().log_tails(),
                    });
                }
            }
        }
    }

    /// Whether this is a local control plane (as opposed to `BANLIEUE_TEST_KUBECONFIG`).
    pub fn is_local(&self) -> bool {
        self.local.is_some()
    }

    /// Names and PIDs of the local processes, the janitor included.
    pub fn pids(&self) -> Vec<(&'static str, u32)> {
        self.local
            .as_ref()
            .map(|local| {
                local
                    .processes
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .pids()
            })
            .unwrap_or_default()
    }

    /// The loopback ports the local processes listen on.
    pub fn ports(&self) -> Vec<u16> {
        self.local
            .as_ref()
            .map(|local| local.ports.clone())
            .unwrap_or_default()
    }

    /// The port the local API server listens on (on 127.0.0.1).
    pub fn apiserver_port(&self) -> Option<u16> {
        self.local.as_ref().map(|local| local.apiserver_port)
    }

    /// The local state directory (etcd data, PKI, kubeconfigs, logs).
    pub fn state_dir(&self) -> Option<&Path> {
        self.local.as_ref().map(|local| local.dir.as_path())
    }

    /// How long the local apiserver took from spawn to a successful `/readyz`.
    pub fn apiserver_ready_after(&self) -> Option<Duration> {
        self.local.as_ref().map(|local| local.apiserver_ready_after)
    }

    /// Installs every CRD under the repository's `deploy/crds/`, when that directory exists.
    async fn install_crds(&self) -> Result<()> {
        let dir = crate::repo_path("deploy/crds");
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Ok(());
        };
        let mut files: Vec<PathBuf> = entries
            .filter_map(|entry| entry.ok().map(|entry| entry.path()))
            .filter(|path| {
                path.extension()
                    .is_some_and(|ext| ext == "yaml" || ext == "yml")
            })
            .collect();
        files.sort();
        for file in files {
            self.apply_yaml(&file).await?;
        }
        Ok(())
    }
}

/// Polls `probe` until it yields a value, failing after `deadline`. Errors from the probe end
/// the wait only at the deadline, since a server coming up answers with errors for a while.
pub async fn wait_for<T, F, Fut>(what: &str, deadline: Duration, mut probe: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    const INTERVAL: Duration = Duration::from_millis(100);
    crate::poll::until_every(what, deadline, INTERVAL, || {
        let attempt = probe();
        async move { attempt.await.map_err(|error| error_chain(&error).into()) }
    })
    .await
    .map_err(|timeout| Error::Timeout {
        what: timeout.what,
        after: timeout.after,
        detail: timeout
            .last_error
            .map(|error| format!("; last error: {error}"))
            .unwrap_or_default(),
    })
}

/// An error with its sources, on one line.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The directory the binaries are read from: `BANLIEUE_CONTROL_PLANE_BIN`, else the stable
/// directory `scripts/control-plane build` maintains in the cache.
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os(BIN_DIR_ENV) {
        return PathBuf::from(dir);
    }
    banlieue_cache().join("control-plane/bin")
}

/// The project's build cache, as `scripts/lib/env.sh` sets it: `BANLIEUE_CACHE`, else
/// `~/.cache/banlieue`. The scripts write the built peers and the image there.
pub fn banlieue_cache() -> PathBuf {
    std::env::var_os("BANLIEUE_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| Path::new(&home).join(".cache/banlieue")))
        .unwrap_or_else(|| PathBuf::from(".cache/banlieue"))
}

/// kube and rcgen both use ring; another crate in the same test binary may enable aws-lc-rs
/// too, and rustls then refuses to guess. Installing ring explicitly settles it.
fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

pub(crate) async fn config_from_file(path: &Path) -> Result<Config> {
    let kubeconfig = Kubeconfig::read_from(path)?;
    Ok(Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?)
}

async fn wait_until_ready(client: &Client, processes: &mut Processes) -> Result<()> {
    let started = Instant::now();
    loop {
        processes.check_running()?;
        let request = http::Request::get("/readyz")
            .body(Vec::new())
            .map_err(|e| Error::io("build a request", std::io::Error::other(e)))?;
        match client.request_text(request).await {
            Ok(body) if body.trim() == "ok" => return Ok(()),
            _ if started.elapsed() < STARTUP_DEADLINE => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            _ => {
                return Err(with_logs(
                    Error::Timeout {
                        what: "kube-apiserver /readyz".into(),
                        after: STARTUP_DEADLINE,
                        detail: String::new(),
                    },
                    processes,
                ));
            }
        }
    }
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

fn path_arg(flag: &str, path: &Path) -> String {
    format!("--{flag}={}", path.display())
}

fn etcd_args(dir: &Path, client: u16, peer: u16) -> Vec<String> {
    let client_url = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    vec![
        "--name=banlieue".into(),
        path_arg("data-dir", &dir.join("etcd")),
        format!("--listen-client-urls={client_url}"),
        format!("--advertise-client-urls={client_url}"),
        format!("--listen-peer-urls={peer_url}"),
        format!("--initial-advertise-peer-urls={peer_url}"),
        format!("--initial-cluster=banlieue={peer_url}"),
        // The data is thrown away after the run; fsync would only make every write slow.
        "--unsafe-no-fsync=true".into(),
        "--log-level=warn".into(),
    ]
}

/// The minor version of the release in `bin` (the first line of its `VERSIONS`, which
/// `scripts/control-plane` writes), when it says.
fn release_minor(bin: &Path) -> Option<u32> {
    let versions = std::fs::read_to_string(bin.join("VERSIONS")).ok()?;
    let release = versions.lines().next()?.trim().strip_prefix("v1.")?;
    release.split('.').next()?.parse().ok()
}

fn apiserver_args(
    dir: &Path,
    pki: &Pki,
    kubelet_client: &CertFiles,
    etcd_client: u16,
    port: u16,
) -> Vec<String> {
    vec![
        format!("--etcd-servers=http://127.0.0.1:{etcd_client}"),
        "--bind-address=127.0.0.1".into(),
        "--advertise-address=127.0.0.1".into(),
        format!("--secure-port={port}"),
        // Unused (the certificates are given), but the default is a system path.
        path_arg("cert-dir", &dir.join("apiserver-certs")),
        path_arg("tls-cert-file", &pki.serving.cert),
        path_arg("tls-private-key-file", &pki.serving.key),
        path_arg("client-ca-file", &pki.ca.cert),
        "--service-account-issuer=https://kubernetes.default.svc".into(),
        path_arg("service-account-key-file", &pki.service_account_public_key),
        path_arg("service-account-signing-key-file", &pki.service_account_key),
        "--service-cluster-ip-range=10.0.0.0/24".into(),
        "--authorization-mode=Node,RBAC".into(),
        "--allow-privileged=true".into(),
        // A loopback address cannot back the `kubernetes` Service's endpoints; no pod needs it.
        "--endpoint-reconciler-type=none".into(),
        // How it authenticates to a node's kubelet, whose webhook authorizer then asks it back.
        path_arg("kubelet-client-certificate", &kubelet_client.cert),
        path_arg("kubelet-client-key", &kubelet_client.key),
    ]
}

fn controller_manager_args(pki: &Pki, kubeconfig: &Path) -> Vec<String> {
    vec![
        path_arg("kubeconfig", kubeconfig),
        path_arg("authentication-kubeconfig", kubeconfig),
        path_arg("authorization-kubeconfig", kubeconfig),
        // Its health endpoint is not needed, and no port means none left behind.
        "--secure-port=0".into(),
        "--leader-elect=false".into(),
        "--controllers=*".into(),
        "--use-service-account-credentials=true".into(),
        path_arg("service-account-private-key-file", &pki.service_account_key),
        path_arg("root-ca-file", &pki.ca.cert),
        path_arg("cluster-signing-cert-file", &pki.ca.cert),
        path_arg("cluster-signing-key-file", &pki.ca.key),
    ]
}

/// Writes `<dir>/kubeconfigs/<name>.kubeconfig`, referring to the PEM files by path.
pub(crate) fn write_kubeconfig(
    dir: &Path,
    name: &str,
    server: &str,
    ca: &Path,
    files: &CertFiles,
) -> Result<PathBuf> {
    let kubeconfigs = dir.join("kubeconfigs");
    std::fs::create_dir_all(&kubeconfigs)
        .map_err(|source| Error::io("create the kubeconfig dir", source))?;
    let path = kubeconfigs.join(format!("{name}.kubeconfig"));
    // JSON strings are YAML strings: quoting without a YAML writer.
    let quote = |p: &Path| serde_json::Value::from(p.display().to_string()).to_string();
    let text = format!(
        "apiVersion: v1
kind: Config
clusters:
- name: banlieue
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: {name}
  user:
    client-certificate: {cert}
    client-key: {key}
contexts:
- name: {name}
  context:
    cluster: banlieue
    user: {name}
    namespace: default
current-context: {name}
",
        ca = quote(ca),
        cert = quote(&files.cert),
        key = quote(&files.key),
    );
    std::fs::write(&path, text).map_err(|source| Error::io("write a kubeconfig", source))?;
    Ok(path)
}

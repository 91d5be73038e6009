//! `local-cluster [--node] [--oidc] [DIR]`: the peers the tests start, for a person or a script
//! (`scripts/control-plane start` builds and runs it). A local control plane ([`ControlPlane`]);
//! with `--node` a node that runs pods ([`Node`]); with `--oidc` two Dex issuers the API server
//! trusts ([`Issuer`]): A has alice and bob, B has alice and broker, users `oidc-a:<sub>` and
//! `oidc-b:<sub>`, passwords `<name>-password`. It runs in the foreground until SIGINT, SIGTERM
//! or SIGHUP, then stops every peer by PID, as a dropped test instance does.
//!
//! DIR (a temporary directory when none is given, removed at the end) holds `pid` from the
//! start (what `scripts/control-plane stop DIR` signals) and, once every peer is up:
//! `kubeconfigs/<identity>.kubeconfig` for admin, alice, bob and broker; with `--oidc`,
//! `oidc-ca.crt`, the issuers' CAs; and last `env`, the shell `export` lines for the cluster
//! (what `scripts/control-plane env DIR` prints). It removes them when it stops. The peers' own
//! state and logs stay in their state directories, printed at the start.

use std::ffi::OsString;
use std::io::Write as _;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use banlieue_testenv::control_plane::{self, ADMIN, ControlPlane, ControlPlaneOptions, USERS};
use banlieue_testenv::node::Node;
use banlieue_testenv::oidc::{self, Issuer, IssuerOptions};
use tokio::signal::unix::{SignalKind, signal};

const USAGE: &str = "usage: local-cluster [--node] [--oidc] [DIR]";
/// The binary's name, as `scripts/control-plane stop` and a second start recognise it.
const NAME: &str = "local-cluster";
/// The issuers of `--oidc`: name, username prefix, users (as `scripts/control-plane start
/// --oidc` always had them; docs/guides/testing-claim-authorization.md relies on them).
const ISSUERS: [(&str, &str, [&str; 2]); 2] = [
    ("A", "oidc-a:", ["alice", "bob"]),
    ("B", "oidc-b:", ["alice", "broker"]),
];
/// Dex's own default: a cluster a person works with for hours wants tokens that last.
const ID_TOKEN_EXPIRY: Duration = Duration::from_secs(24 * 3600);

#[derive(Debug, thiserror::Error)]
enum Error {
    #[error("{0}\n{USAGE}")]
    Usage(String),
    #[error(
        "{path} already runs a local cluster (pid {pid}): scripts/control-plane stop {path}",
        path = dir.display()
    )]
    AlreadyRunning { dir: PathBuf, pid: u32 },
    #[error("failed to {what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("start the control plane or the node")]
    ControlPlane(#[from] control_plane::Error),
    #[error("start an OIDC issuer")]
    Oidc(#[from] oidc::Error),
}

type Result<T, E = Error> = std::result::Result<T, E>;

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

/// The command line.
#[derive(Debug, Default, PartialEq)]
struct Args {
    node: bool,
    oidc: bool,
    dir: Option<PathBuf>,
}

/// `None` for `--help`.
fn parse_args(args: impl IntoIterator<Item = OsString>) -> Result<Option<Args>> {
    let mut parsed = Args::default();
    for arg in args {
        match arg.to_str() {
            Some("--node") => parsed.node = true,
            Some("--oidc") => parsed.oidc = true,
            Some("-h" | "--help") => return Ok(None),
            Some(option) if option.starts_with('-') => {
                return Err(Error::Usage(format!("unknown option {option}")));
            }
            _ if parsed.dir.is_some() => {
                return Err(Error::Usage("more than one DIR".into()));
            }
            _ => parsed.dir = Some(PathBuf::from(arg)),
        }
    }
    Ok(Some(parsed))
}

fn main() -> ExitCode {
    let args = match parse_args(std::env::args_os().skip(1)) {
        Ok(Some(args)) => args,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(error) => {
            eprintln!("{NAME}: {error}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("{NAME}: failed to start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("{NAME}: {}", control_plane::error_chain(&error));
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<()> {
    // Before anything starts: a signal from here on is a request to stop, never a kill that
    // leaves the janitors to clean up.
    let mut signals = Signals::new()?;
    let dir = ClusterDir::create(args.dir.as_deref())?;
    let peers = tokio::select! {
        peers = Peers::start(args.node, args.oidc) => peers?,
        // Dropping the unfinished start stops what it had started, by PID.
        name = signals.recv() => {
            println!("{NAME}: {name} before the cluster was up, stopping what had started");
            return Ok(());
        }
    };
    peers.print();
    dir.write(&peers)?;
    println!(
        "{NAME}: running in {dir}; Ctrl-C or `scripts/control-plane stop {dir}` stops it",
        dir = dir.path.display()
    );
    let name = signals.recv().await;
    println!("{NAME}: {name}, stopping");
    // First, so that nobody takes a stopping cluster for a running one.
    dir.remove(ClusterDir::ENV);
    drop(peers);
    drop(dir);
    println!("{NAME}: stopped");
    Ok(())
}

/// SIGINT, SIGTERM and SIGHUP, from the moment it is created.
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> Result<Self> {
        let listen = |kind| signal(kind).map_err(io("listen for signals"));
        Ok(Self {
            interrupt: listen(SignalKind::interrupt())?,
            terminate: listen(SignalKind::terminate())?,
            hangup: listen(SignalKind::hangup())?,
        })
    }

    /// The name of the next signal.
    async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.interrupt.recv() => "SIGINT",
            _ = self.terminate.recv() => "SIGTERM",
            _ = self.hangup.recv() => "SIGHUP",
        }
    }
}

/// What runs. Fields drop in order: the node while the API server still answers, the issuers
/// after the API server that asks them.
struct Peers {
    node: Option<Node>,
    control_plane: ControlPlane,
    issuers: Vec<(&'static str, Issuer)>,
}

impl Peers {
    async fn start(node: bool, oidc: bool) -> Result<Peers> {
        let mut issuers = Vec::new();
        let mut options = ControlPlaneOptions::default();
        if oidc {
            for (name, _, users) in ISSUERS {
                let options = users.iter().fold(
                    IssuerOptions::new().id_token_expiry(ID_TOKEN_EXPIRY),
                    |options, user| {
                        options.user(format!("{user}@corp.test"), format!("{user}-password"))
                    },
                );
                issuers.push((name, Issuer::start(options).await?));
            }
            let trusted: Vec<(&Issuer, &str)> = issuers
                .iter()
                .zip(ISSUERS)
                .map(|((_, issuer), (_, prefix, _))| (issuer, prefix))
                .collect();
            options = options.authentication_config(oidc::authentication_config(&trusted));
        }
        let control_plane = ControlPlane::start_with(options).await?;
        let node = if node {
            Some(Node::start(&control_plane).await?)
        } else {
            None
        };
        Ok(Peers {
            node,
            control_plane,
            issuers,
        })
    }

    /// One line per process started, with its PID and log.
    fn print(&self) {
        let mut lines = Vec::new();
        for (name, issuer) in &self.issuers {
            let issuer_lines = processes(issuer.pids(), issuer.state_dir());
            let url = issuer.url();
            lines.extend(
                issuer_lines
                    .into_iter()
                    .map(|l| format!("issuer {name} {url}: {l}")),
            );
        }
        if let Some(port) = self.control_plane.apiserver_port() {
            lines.push(format!("API server https://127.0.0.1:{port}"));
        }
        if let Some(dir) = self.control_plane.state_dir() {
            lines.extend(processes(self.control_plane.pids(), dir));
        }
        if let Some(node) = &self.node {
            lines.extend(processes(node.pids(), node.state_dir()));
        }
        let mut out = std::io::stdout().lock();
        for line in lines {
            let _ = writeln!(out, "{NAME}: {line}");
        }
    }
}

/// `NAME pid PID, log FILE` for each process of a peer whose state directory is `dir` (its logs
/// are `logs/<name>.log` there); the janitor, which has none, names what it cleans up.
fn processes(pids: Vec<(&'static str, u32)>, dir: &Path) -> Vec<String> {
    pids.into_iter()
        .map(|(name, pid)| {
            let log = dir.join("logs").join(format!("{name}.log"));
            if log.is_file() {
                format!("{name} pid {pid}, log {}", log.display())
            } else {
                format!("{name} pid {pid}, cleans up {}", dir.display())
            }
        })
        .collect()
}

/// DIR: the files that tell others about the cluster.
struct ClusterDir {
    path: PathBuf,
    /// A directory of our own, removed whole at the end.
    temporary: Option<tempfile::TempDir>,
}

impl ClusterDir {
    const PID: &str = "pid";
    const ENV: &str = "env";
    const KUBECONFIGS: &str = "kubeconfigs";
    const OIDC_CA: &str = "oidc-ca.crt";

    /// DIR (created if need be), or a temporary directory; writes `pid`, unless a live
    /// local-cluster's PID is already there.
    fn create(dir: Option<&Path>) -> Result<ClusterDir> {
        let (path, temporary) = match dir {
            Some(dir) => {
                std::fs::create_dir_all(dir).map_err(io(format!("create {}", dir.display())))?;
                let path = dir
                    .canonicalize()
                    .map_err(io(format!("resolve {}", dir.display())))?;
                (path, None)
            }
            None => {
                let temporary = tempfile::Builder::new()
                    .prefix("banlieue-local-cluster-")
                    .tempdir()
                    .map_err(io("create a temporary directory"))?;
                (temporary.path().to_owned(), Some(temporary))
            }
        };
        let pid_file = path.join(Self::PID);
        if let Ok(text) = std::fs::read_to_string(&pid_file)
            && let Ok(pid) = text.trim().parse::<u32>()
            && pid != std::process::id()
            && is_local_cluster(pid)
        {
            return Err(Error::AlreadyRunning { dir: path, pid });
        }
        let dir = ClusterDir { path, temporary };
        // A killed run's `env` must not pass for this one's before it is up.
        dir.remove(Self::ENV);
        write(&pid_file, &format!("{}\n", std::process::id()))?;
        Ok(dir)
    }

    /// The kubeconfigs, the issuers' CAs and, last, `env`.
    fn write(&self, peers: &Peers) -> Result<()> {
        let kubeconfigs = self.path.join(Self::KUBECONFIGS);
        std::fs::create_dir_all(&kubeconfigs)
            .map_err(io(format!("create {}", kubeconfigs.display())))?;
        for identity in std::iter::once(ADMIN).chain(USERS) {
            // Always there for a local control plane; it names the PKI files in its state.
            if let Some(source) = peers.control_plane.kubeconfig(identity) {
                let target = self.kubeconfig(identity);
                std::fs::copy(source, &target).map_err(io(format!(
                    "copy {} to {}",
                    source.display(),
                    target.display()
                )))?;
            }
        }
        let oidc_ca = (!peers.issuers.is_empty()).then(|| self.path.join(Self::OIDC_CA));
        if let Some(path) = &oidc_ca {
            let bundle: String = peers.issuers.iter().map(|(_, i)| i.ca_pem()).collect();
            write(path, &bundle)?;
        }
        let issuers: Vec<(&str, String)> = peers
            .issuers
            .iter()
            .map(|(name, issuer)| (*name, issuer.url()))
            .collect();
        let text = env_lines(
            &self.kubeconfig(ADMIN),
            &control_plane::bin_dir(),
            &issuers,
            oidc_ca.as_deref(),
        );
        // Whole or not at all: its presence says the cluster is up.
        let partial = self.path.join(".env.partial");
        write(&partial, &text)?;
        let env = self.path.join(Self::ENV);
        std::fs::rename(&partial, &env).map_err(io(format!("write {}", env.display())))
    }

    fn kubeconfig(&self, identity: &str) -> PathBuf {
        self.path
            .join(Self::KUBECONFIGS)
            .join(format!("{identity}.kubeconfig"))
    }

    fn remove(&self, name: &str) {
        let _ = std::fs::remove_file(self.path.join(name));
    }
}

impl Drop for ClusterDir {
    /// What this run wrote into DIR goes; a temporary DIR goes whole (the `TempDir`).
    fn drop(&mut self) {
        if self.temporary.is_some() {
            return;
        }
        self.remove(Self::ENV);
        for identity in std::iter::once(ADMIN).chain(USERS) {
            let _ = std::fs::remove_file(self.kubeconfig(identity));
        }
        // Only if empty: anything else there is not ours.
        let _ = std::fs::remove_dir(self.path.join(Self::KUBECONFIGS));
        self.remove(Self::OIDC_CA);
        self.remove(Self::PID);
    }
}

/// What `scripts/control-plane env DIR` prints: the admin's kubeconfig for kubectl and for the
/// tests (`BANLIEUE_TEST_KUBECONFIG`), kubectl of the control plane's release first on `PATH`,
/// and with issuers their URLs (`ISSUER_A`, …) and the CAs that verify them (`OIDC_CA`).
fn env_lines(
    admin: &Path,
    bin_dir: &Path,
    issuers: &[(&str, String)],
    oidc_ca: Option<&Path>,
) -> String {
    let admin = shell_word(&admin.display().to_string());
    let mut text = format!(
        "export KUBECONFIG={admin}\nexport BANLIEUE_TEST_KUBECONFIG={admin}\n\
         export PATH={}:\"$PATH\"\n",
        shell_word(&bin_dir.display().to_string())
    );
    if !issuers.is_empty() {
        let urls: Vec<String> = issuers
            .iter()
            .map(|(name, url)| format!("ISSUER_{name}={}", shell_word(url)))
            .collect();
        text.push_str(&format!("export {}\n", urls.join(" ")));
    }
    if let Some(ca) = oidc_ca {
        text.push_str(&format!(
            "export OIDC_CA={}\n",
            shell_word(&ca.display().to_string())
        ));
    }
    text
}

/// `word` as one shell word: as is when nothing in it is special, else single-quoted.
fn shell_word(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._-+:,@%=".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// Whether `pid` is a running local-cluster (by its command's name, as the script checks).
fn is_local_cluster(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
        let argv0 = cmdline.split(|&b| b == 0).next().unwrap_or_default();
        Path::new(std::ffi::OsStr::from_bytes(argv0)).file_name() == Some(NAME.as_ref())
    })
}

fn write(path: &Path, contents: &str) -> Result<()> {
    std::fs::write(path, contents).map_err(io(format!("write {}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Option<Args>> {
        parse_args(args.iter().map(OsString::from))
    }

    #[test]
    fn options_come_in_any_order_with_at_most_one_dir() {
        assert_eq!(parse(&[]).unwrap(), Some(Args::default()));
        assert_eq!(
            parse(&["--oidc", "/tmp/x", "--node"]).unwrap(),
            Some(Args {
                node: true,
                oidc: true,
                dir: Some("/tmp/x".into()),
            })
        );
        assert_eq!(parse(&["--help"]).unwrap(), None);
        assert!(matches!(parse(&["--nodes"]), Err(Error::Usage(_))));
        assert!(matches!(parse(&["a", "b"]), Err(Error::Usage(_))));
    }

    #[test]
    fn env_lines_are_what_the_docs_eval() {
        let text = env_lines(
            Path::new("/tmp/cp/kubeconfigs/admin.kubeconfig"),
            Path::new("/root/.cache/banlieue/control-plane/bin"),
            &[
                ("A", "https://127.0.0.1:1/dex".into()),
                ("B", "https://127.0.0.1:2/dex".into()),
            ],
            Some(Path::new("/tmp/cp/oidc-ca.crt")),
        );
        assert_eq!(
            text,
            "export KUBECONFIG=/tmp/cp/kubeconfigs/admin.kubeconfig\n\
             export BANLIEUE_TEST_KUBECONFIG=/tmp/cp/kubeconfigs/admin.kubeconfig\n\
             export PATH=/root/.cache/banlieue/control-plane/bin:\"$PATH\"\n\
             export ISSUER_A=https://127.0.0.1:1/dex ISSUER_B=https://127.0.0.1:2/dex\n\
             export OIDC_CA=/tmp/cp/oidc-ca.crt\n"
        );
    }

    #[test]
    fn shell_words_quote_what_the_shell_would_split() {
        assert_eq!(shell_word("/tmp/a b"), "'/tmp/a b'");
        assert_eq!(shell_word("it's"), r"'it'\''s'");
        assert_eq!(shell_word(""), "''");
        assert_eq!(shell_word("/tmp/plain-1.2"), "/tmp/plain-1.2");
    }

    #[test]
    fn this_process_is_not_a_local_cluster() {
        assert!(!is_local_cluster(std::process::id()));
    }
}

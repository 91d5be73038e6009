//! A real libvirtd serving TLS on loopback with a throwaway PKI.
//!
//! Each [`Libvirtd`] is the system's own `/usr/sbin/libvirtd` (qemu driver, `qemu:///system`
//! from the daemon's point of view) running in a private mount namespace where its
//! configuration, state, run and log directories are the instance's temp dir. Two instances run
//! side by side; dropping one stops its guests and the daemon by PID and removes the temp dir.
//!
//! [`LibvirtdOptions::root`] starts another libvirt instead, installed in a private system
//! tree ([`LibvirtRoot`], e.g. Debian 12's libvirt 9.0), chrooted there with the same
//! configuration, listeners and clean-up.
//!
//! ```no_run
//! # async fn demo() -> Result<(), banlieue_testenv::libvirtd::Error> {
//! use banlieue_testenv::libvirtd::{Libvirtd, LibvirtdOptions};
//! if !Libvirtd::available()? {
//!     return Ok(()); // BANLIEUE_ALLOW_MISSING_PEERS=1 and no daemon: skipped loudly
//! }
//! let daemon = Libvirtd::start(LibvirtdOptions::default()).await?;
//! let version = daemon.virsh(["version"]).await?;
//! # Ok(()) }
//! ```

mod layout;
mod pki;
mod probe;
pub(crate) mod process;

use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::net::Ipv4Addr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::string::FromUtf8Error;
use std::time::{Duration, Instant};

use rustix::process::Signal;
use tempfile::TempDir;
use tokio::time::error::Elapsed;

use crate::janitor::Janitor;
use crate::pki::Authority;
use layout::Layout;
use process::{
    POLL, in_other_mount_namespace, is_running, pids_from_pid_files, proc_stat, signal, wait_until,
};

/// Where Debian's package puts the daemon.
pub const LIBVIRTD_BINARY: &str = "/usr/sbin/libvirtd";

/// Set to `1` to let tests skip (loudly) when a real peer is not installed.
pub const ALLOW_MISSING_PEERS_ENV: &str = "BANLIEUE_ALLOW_MISSING_PEERS";

/// The namespace wrapper: bind mounts, then `exec` of the daemon.
const NAMESPACE_SCRIPT: &str = include_str!("libvirtd/namespace.sh");
/// Cleans up after a test process that died without dropping its instance.
const JANITOR_SCRIPT: &str = include_str!("libvirtd/janitor.sh");

/// How long the daemon has to exit after SIGTERM before SIGKILL (it takes ~1.6 s).
const DAEMON_STOP_TIMEOUT: Duration = Duration::from_secs(15);
/// How long guests have to exit after SIGTERM before SIGKILL.
const GUEST_STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the janitor has to exit once told the instance is gone.
const JANITOR_EXIT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the kernel may take to stop or continue the daemon after SIGSTOP or SIGCONT.
const SIGNAL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a virsh invocation may take; domain start under TCG is ~1.5 s.
const VIRSH_TIMEOUT: Duration = Duration::from_secs(180);
/// Attempts at picking free ports, in case another process takes one between pick and bind.
const PORT_ATTEMPTS: usize = 3;

/// What can go wrong starting, using or stopping a libvirtd instance, or running virsh.
#[derive(thiserror::Error)]
pub enum Error {
    #[error(
        "libvirtd is not installed at {LIBVIRTD_BINARY}: run scripts/setup (or scripts/setup libvirtd)"
    )]
    DaemonMissing,
    #[error(
        "no complete libvirt root at {}: build it with scripts/setup {setup_part} (scripts/setup.d/{setup_part}.sh)",
        path.display()
    )]
    RootIncomplete {
        path: PathBuf,
        setup_part: &'static str,
    },
    #[error(
        "no libvirtd in {}: build the root with its setup script (scripts/setup.d/35-libvirtd-9.sh for Debian 12's)",
        .0.display()
    )]
    NoDaemonInRoot(PathBuf),
    #[error("{} names no version of {package}", stamp.display())]
    NoPackageVersion { stamp: PathBuf, package: String },
    #[error("failed to {what}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("generate certificates")]
    Pki(#[from] rcgen::Error),
    #[error("lay out the instance's directories")]
    Layout(#[source] Box<Error>),
    #[error("start libvirtd\n{diagnostics}")]
    Start {
        diagnostics: String,
        #[source]
        source: Box<Error>,
    },
    #[error("libvirtd is not running")]
    NotRunning,
    #[error("libvirtd {pid} is running: stop it first")]
    AlreadyRunning { pid: u32 },
    #[error("libvirtd exited ({0}) before accepting clients")]
    Exited(ExitStatus),
    #[error("libvirtd did not listen on 127.0.0.1:{port} within {after:?}")]
    NotListening { port: u16, after: Duration },
    #[error("libvirtd did not accept clients within {0:?}")]
    NotAccepting(Duration),
    #[error("libvirtd did not probe QEMU within {after:?}")]
    ProbeTimeout {
        after: Duration,
        #[source]
        source: Elapsed,
    },
    #[error("libvirtd refused CONNECT_OPEN qemu:///system (status {0})")]
    OpenRefused(u32),
    #[error("libvirtd failed CONNECT_GET_VERSION (status {0})")]
    GetVersionFailed(u32),
    #[error("implausible reply length {0}")]
    ImplausibleReply(usize),
    #[error("libvirtd {pid} did not stop within {SIGNAL_TIMEOUT:?}")]
    NotStopped { pid: u32 },
    #[error("libvirtd {pid} did not continue within {SIGNAL_TIMEOUT:?}")]
    NotContinued { pid: u32 },
    #[error("pool dir name {0:?} is not a single path component")]
    InvalidPoolName(String),
    #[error("virsh {shown}: no answer within {VIRSH_TIMEOUT:?}")]
    VirshTimeout {
        shown: String,
        #[source]
        source: Elapsed,
    },
    #[error("virsh {shown}: {status}: {stderr}")]
    Virsh {
        shown: String,
        status: ExitStatus,
        stderr: String,
    },
    #[error("virsh {shown}: stdout is not UTF-8")]
    VirshOutput {
        shown: String,
        #[source]
        source: FromUtf8Error,
    },
}

/// The message chain rather than the structure, as the control plane's error: tests report
/// errors with `expect`, which prints `Debug`, and the reader wants the daemon's log tail.
impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&crate::control_plane::error_chain(self))
    }
}

impl Error {
    /// An I/O error while trying `what` (a verb phrase).
    pub fn io(what: impl Into<String>, source: io::Error) -> Self {
        Self::Io {
            what: what.into(),
            source,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How to configure the daemon.
#[derive(Debug, Clone)]
pub struct LibvirtdOptions {
    /// Also serve plain TCP (`listen_tcp`, `auth_tcp = "none"`) on a free loopback port, for
    /// wire capture with tshark.
    pub tcp: bool,
    /// `max_client_requests`: concurrent calls per client (libvirt's default is 5).
    pub max_client_requests: Option<u32>,
    /// `keepalive_interval` in seconds; `-1` disables the server's keepalive.
    pub keepalive_interval: Option<i32>,
    /// `keepalive_count`: unanswered keepalives before the server drops a client.
    pub keepalive_count: Option<u32>,
    /// Extra `libvirtd.conf` lines, appended verbatim.
    pub extra_config: Vec<String>,
    /// Extra `qemu.conf` lines, appended verbatim.
    pub extra_qemu_config: Vec<String>,
    /// How long a (re)start may take until the daemon accepts clients. The first start on a
    /// machine probes QEMU's capabilities (~8 s on two cores); later starts use the cache.
    pub ready_timeout: Duration,
    /// A private system tree to run the daemon from (chrooted), instead of the machine's own
    /// libvirt; see [`LibvirtRoot`]. `None`: the machine's `/usr/sbin/libvirtd`.
    pub root: Option<PathBuf>,
}

impl Default for LibvirtdOptions {
    fn default() -> Self {
        Self {
            tcp: false,
            max_client_requests: None,
            keepalive_interval: None,
            keepalive_count: None,
            extra_config: Vec::new(),
            extra_qemu_config: Vec::new(),
            ready_timeout: Duration::from_secs(120),
            root: None,
        }
    }
}

impl LibvirtdOptions {
    /// Also serve plain TCP on a free loopback port.
    pub fn with_tcp(mut self) -> Self {
        self.tcp = true;
        self
    }

    pub fn with_max_client_requests(mut self, n: u32) -> Self {
        self.max_client_requests = Some(n);
        self
    }

    pub fn with_keepalive(mut self, interval_secs: i32, count: u32) -> Self {
        self.keepalive_interval = Some(interval_secs);
        self.keepalive_count = Some(count);
        self
    }

    pub fn with_config_line(mut self, line: impl Into<String>) -> Self {
        self.extra_config.push(line.into());
        self
    }

    /// Runs the daemon installed in `root` (chrooted) instead of the machine's own.
    pub fn with_root(mut self, root: impl Into<PathBuf>) -> Self {
        self.root = Some(root.into());
        self
    }

    /// The system tree the daemon comes from: the private root, else `/`.
    fn system_root(&self) -> &Path {
        self.root.as_deref().unwrap_or(Path::new("/"))
    }

    /// Where the daemon's binary is, seen from the host.
    fn binary_on_host(&self) -> PathBuf {
        self.system_root()
            .join(LIBVIRTD_BINARY.trim_start_matches('/'))
    }
}

/// A libvirt installed by a setup script in a private system tree under the build cache, to
/// test against another libvirt version than the machine's. The script writes
/// [`LibvirtRoot::STAMP`] last; a root without it is incomplete.
#[derive(Debug, Clone)]
pub struct LibvirtRoot {
    path: PathBuf,
    /// The `scripts/setup` part that builds it, by its file name.
    setup_part: &'static str,
}

impl LibvirtRoot {
    /// The file in the root, written last by its setup script, that records what it holds:
    /// the script's key line, then `package=version` lines.
    pub const STAMP: &'static str = ".banlieue-root";

    /// Debian 12's own libvirt 9.0 and QEMU 7.2 (bookworm, not backports), built by
    /// `scripts/setup.d/35-libvirtd-9.sh` into `<cache>/roots/libvirt-9.0`.
    pub fn debian_12() -> Self {
        Self {
            path: crate::control_plane::banlieue_cache().join("roots/libvirt-9.0"),
            setup_part: "35-libvirtd-9",
        }
    }

    /// The root's path on the host.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Options that start the daemon from this root.
    pub fn options(&self) -> LibvirtdOptions {
        LibvirtdOptions::default().with_root(&self.path)
    }

    /// Whether tests can run against this root's daemon: `Ok(true)` when the root is
    /// complete; `Ok(false)` (after a loud message on stderr) when it is not and
    /// `BANLIEUE_ALLOW_MISSING_PEERS=1`; otherwise an error naming the setup script.
    pub fn available(&self) -> Result<bool> {
        if self.is_complete() {
            return Ok(true);
        }
        if std::env::var(ALLOW_MISSING_PEERS_ENV).as_deref() == Ok("1") {
            eprintln!(
                "\n!!!!! SKIPPED: {} (and {ALLOW_MISSING_PEERS_ENV}=1) !!!!!\n",
                self.missing()
            );
            return Ok(false);
        }
        Err(self.missing())
    }

    /// The version of `package` the setup script installed, as its stamp records it (a
    /// Debian version string, e.g. `9.0.0-4+deb12u2`).
    pub fn package_version(&self, package: &str) -> Result<String> {
        let stamp = self.path.join(Self::STAMP);
        let text = fs::read_to_string(&stamp).map_err(|source| {
            Error::io(
                format!("read {}: {}", stamp.display(), self.missing()),
                source,
            )
        })?;
        text.lines()
            .find_map(|line| line.strip_prefix(package)?.strip_prefix('='))
            .map(str::to_owned)
            .ok_or_else(|| Error::NoPackageVersion {
                stamp,
                package: package.to_owned(),
            })
    }

    fn is_complete(&self) -> bool {
        self.path.join(Self::STAMP).is_file() && self.options().binary_on_host().exists()
    }

    fn missing(&self) -> Error {
        Error::RootIncomplete {
            path: self.path.clone(),
            setup_part: self.setup_part,
        }
    }
}

/// A running libvirtd test instance. Dropping it stops the guests it spawned and the daemon
/// (SIGTERM, then SIGKILL after a deadline) and removes its temp dir.
#[derive(Debug)]
pub struct Libvirtd {
    layout: Layout,
    options: LibvirtdOptions,
    authority: Authority,
    tls_port: u16,
    tcp_port: Option<u16>,
    daemon: Option<Child>,
    /// How the daemon ended when it exited on its own, kept until it is started again.
    exited: Option<ExitStatus>,
    /// Start time of the first daemon process, in clock ticks after boot: a PID read from a
    /// pid file is only signalled if its process started no earlier (guards against reuse).
    first_start_ticks: u64,
    /// Every PID the daemon had (restarts give new ones), never to be taken for a guest's.
    daemon_pids: Vec<u32>,
    suspended: bool,
    /// Taken and removed in `drop`, after the processes are stopped.
    dir: Option<TempDir>,
    /// The janitor; see `janitor.sh`.
    janitor: Option<Janitor>,
}

impl Libvirtd {
    /// Whether tests can run against a real libvirtd: `Ok(true)` when the daemon is installed;
    /// `Ok(false)` (after a loud message on stderr) when it is not and
    /// `BANLIEUE_ALLOW_MISSING_PEERS=1`; otherwise the error [`Libvirtd::start`] would give.
    pub fn available() -> Result<bool> {
        if Path::new(LIBVIRTD_BINARY).exists() {
            return Ok(true);
        }
        if std::env::var(ALLOW_MISSING_PEERS_ENV).as_deref() == Ok("1") {
            eprintln!(
                "\n!!!!! SKIPPED: {} (and {ALLOW_MISSING_PEERS_ENV}=1) !!!!!\n",
                Error::DaemonMissing
            );
            return Ok(false);
        }
        Err(Error::DaemonMissing)
    }

    /// Starts a daemon and waits until it accepts clients.
    pub async fn start(mut options: LibvirtdOptions) -> Result<Self> {
        // The namespace script mounts at ROOT + absolute paths and chroots there.
        if let Some(root) = &options.root {
            let absolute = fs::canonicalize(root).map_err(|source| {
                Error::io(
                    format!("resolve the libvirt root {}", root.display()),
                    source,
                )
            })?;
            options.root = Some(absolute);
        }
        match &options.root {
            None if !Path::new(LIBVIRTD_BINARY).exists() => return Err(Error::DaemonMissing),
            Some(root) if !options.binary_on_host().exists() => {
                return Err(Error::NoDaemonInRoot(root.clone()));
            }
            _ => {}
        }
        let dir = tempfile::Builder::new()
            .prefix("banlieue-libvirtd-")
            .tempdir()
            .map_err(|source| Error::io("create the instance's temp dir", source))?;
        let layout = Layout {
            root: dir.path().to_owned(),
            system: options.system_root().to_owned(),
        };
        let janitor = Janitor::spawn(JANITOR_SCRIPT, "banlieue-libvirtd-janitor", [&layout.root])
            .map_err(|source| Error::io("spawn the instance's janitor", source))?;
        layout
            .create()
            .map_err(|error| Error::Layout(Box::new(error)))?;
        let authority = Authority::new("banlieue test CA")?;
        pki::write_instance_files(&authority, &layout.pki_dir())?;

        let mut instance = Self {
            layout,
            options,
            authority,
            tls_port: 0,
            tcp_port: None,
            daemon: None,
            exited: None,
            first_start_ticks: 0,
            daemon_pids: Vec::new(),
            suspended: false,
            dir: Some(dir),
            janitor: Some(janitor),
        };
        let mut attempt = 1;
        loop {
            let [tls_port, tcp_port] = crate::ports::free_loopback_ports()
                .map_err(|source| Error::io("pick free ports", source))?;
            let tcp_port = instance.options.tcp.then_some(tcp_port);
            instance.tls_port = tls_port;
            instance.tcp_port = tcp_port;
            instance
                .layout
                .write_config(&instance.options, tls_port, tcp_port)?;
            match instance.launch().await {
                Ok(()) => return Ok(instance),
                Err(e) if attempt < PORT_ATTEMPTS && instance.lost_port_race() => {
                    eprintln!(
                        "libvirtd: a port was taken before the daemon bound it, retrying: {}",
                        crate::control_plane::error_chain(&e)
                    );
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// `qemu+tls://127.0.0.1:PORT/system`, without a `pkipath`: clients pass the files below.
    pub fn tls_uri(&self) -> String {
        format!("qemu+tls://127.0.0.1:{}/system", self.tls_port)
    }

    /// `qemu+tcp://127.0.0.1:PORT/system` when plain TCP was asked for.
    pub fn tcp_uri(&self) -> Option<String> {
        self.tcp_port
            .map(|port| format!("qemu+tcp://127.0.0.1:{port}/system"))
    }

    /// The TLS URI with `?pkipath=`, as virsh and the C library take it.
    pub fn virsh_uri(&self) -> String {
        format!("{}?pkipath={}", self.tls_uri(), self.pki_dir().display())
    }

    pub fn tls_port(&self) -> u16 {
        self.tls_port
    }

    pub fn tcp_port(&self) -> Option<u16> {
        self.tcp_port
    }

    /// Directory with `cacert.pem servercert.pem serverkey.pem clientcert.pem clientkey.pem`.
    pub fn pki_dir(&self) -> PathBuf {
        self.layout.pki_dir()
    }

    pub fn ca_cert_path(&self) -> PathBuf {
        self.pki_dir().join(pki::CA_CERT)
    }

    pub fn client_cert_path(&self) -> PathBuf {
        self.pki_dir().join(pki::CLIENT_CERT)
    }

    /// PKCS#8 PEM.
    pub fn client_key_path(&self) -> PathBuf {
        self.pki_dir().join(pki::CLIENT_KEY)
    }

    /// The instance's temp dir: everything the instance owns lives under it.
    pub fn dir(&self) -> &Path {
        &self.layout.root
    }

    /// What the daemon sees as `/var/lib/libvirt` (NVRAM files, swtpm state, domain dirs).
    pub fn state_dir(&self) -> PathBuf {
        self.layout.lib_dir()
    }

    /// What the daemon sees as `/etc/libvirt` (persistent domain, pool and network XML).
    pub fn config_dir(&self) -> PathBuf {
        self.layout.etc_dir()
    }

    /// What the daemon sees as `/run/libvirt` (pid files, live status XML, sockets).
    pub fn run_dir(&self) -> PathBuf {
        self.layout.libvirt_run_dir()
    }

    /// The daemon's log file.
    pub fn log_file(&self) -> PathBuf {
        self.layout.daemon_log()
    }

    /// A guest's QEMU log (command line, stderr, console when `stdio_handler = "file"`).
    pub fn domain_log(&self, domain: &str) -> PathBuf {
        self.layout
            .log_dir()
            .join("libvirt/qemu")
            .join(format!("{domain}.log"))
    }

    /// The private system tree the daemon runs from, if not the machine's own.
    pub fn root(&self) -> Option<&Path> {
        self.options.root.as_deref()
    }

    /// The daemon's PID (the same process through setpriv, unshare, the wrapper's `exec` and,
    /// with a private root, `chroot`'s).
    pub fn pid(&self) -> u32 {
        self.daemon.as_ref().map_or(0, Child::id)
    }

    /// Creates `<dir>/pools/<name>` for a `dir` storage pool and returns its path.
    pub fn create_pool_dir(&self, name: &str) -> Result<PathBuf> {
        if name.is_empty() || name.contains('/') || name == "." || name == ".." {
            return Err(Error::InvalidPoolName(name.to_owned()));
        }
        let path = self.layout.pools_dir().join(name);
        fs::create_dir_all(&path)
            .map_err(|source| Error::io(format!("create {}", path.display()), source))?;
        // QEMU runs as libvirt-qemu and must reach volumes here.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755))
            .map_err(|source| Error::io(format!("set the mode of {}", path.display()), source))?;
        Ok(path)
    }

    /// Writes a pkipath dir whose `cacert.pem` is this instance's CA (so the server is
    /// trusted) but whose client cert and key come from an unrelated CA: the daemon must refuse
    /// it. Returns the dir.
    pub fn write_untrusted_client_pki(&self) -> Result<PathBuf> {
        let dir = self.dir().join("pki-untrusted");
        let other = Authority::new("banlieue unrelated CA")?;
        pki::write_client_files(&other, &dir, self.authority.cert_pem())?;
        Ok(dir)
    }

    /// Runs the independent `virsh` client against this daemon over TLS and returns its
    /// stdout; fails with its stderr when it exits non-zero. For tests only.
    pub async fn virsh<I, S>(&self, args: I) -> Result<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        run_virsh(&self.virsh_uri(), args).await
    }

    /// PIDs of the guest processes (QEMU, swtpm, other helpers) that the daemon's pid files
    /// name and that are running.
    pub fn guest_pids(&self) -> Vec<u32> {
        pids_from_pid_files(&self.layout.libvirt_run_dir())
            .into_iter()
            .map(|(_, pid)| pid)
            .filter(|pid| !self.daemon_pids.contains(pid))
            .filter(|&pid| is_running(pid, self.first_start_ticks))
            .filter(|&pid| in_other_mount_namespace(pid))
            .collect()
    }

    /// SIGSTOP: the daemon keeps its sockets but answers nothing (connection-loss tests).
    /// Returns once the kernel reports the process stopped.
    pub fn suspend(&mut self) -> Result<()> {
        let pid = self.pid();
        signal(pid, Signal::STOP).map_err(|source| Error::io("SIGSTOP libvirtd", source))?;
        self.suspended = true;
        if !wait_until(SIGNAL_TIMEOUT, || {
            proc_stat(pid).is_some_and(|s| s.state == 'T')
        }) {
            return Err(Error::NotStopped { pid });
        }
        Ok(())
    }

    /// SIGCONT after [`Libvirtd::suspend`]; returns once the process runs again.
    pub fn resume(&mut self) -> Result<()> {
        let pid = self.pid();
        signal(pid, Signal::CONT).map_err(|source| Error::io("SIGCONT libvirtd", source))?;
        self.suspended = false;
        if !wait_until(SIGNAL_TIMEOUT, || {
            proc_stat(pid).is_some_and(|s| s.state != 'T')
        }) {
            return Err(Error::NotContinued { pid });
        }
        Ok(())
    }

    /// Stops the daemon and starts it again on the same ports with the same PKI and state.
    /// Running guests survive, as with a real daemon restart, and are reconnected.
    pub async fn restart(&mut self) -> Result<()> {
        self.stop_daemon();
        self.launch().await
    }

    /// Stops the daemon (SIGTERM, then SIGKILL after a deadline) and leaves it stopped, as a
    /// host whose libvirtd went away: its guests keep running, clients get connection refused
    /// on its port, and its state, PKI and port stay the instance's for [`Libvirtd::start_again`].
    /// Does nothing when the daemon is already stopped.
    pub fn stop(&mut self) {
        self.stop_daemon();
    }

    /// Whether the daemon process runs (it may be stopped by [`Libvirtd::stop`]).
    pub fn is_running(&self) -> bool {
        self.daemon.is_some()
    }

    /// How the daemon ended when it exited on its own (a crash, a signal), until
    /// [`Libvirtd::start_again`] starts it; `None` while it runs, and when [`Libvirtd::stop`]
    /// is what stopped it.
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        // Notices an exit not seen yet; one seen before is kept in `exited`.
        let _ = self.ensure_daemon_running();
        self.exited
    }

    /// Starts the daemon again after [`Libvirtd::stop`], on the same ports with the same PKI
    /// and state, and waits until it accepts clients; it reconnects to the guests still
    /// running. Fails when the daemon is running.
    pub async fn start_again(&mut self) -> Result<()> {
        if self.daemon.is_some() {
            return Err(Error::AlreadyRunning { pid: self.pid() });
        }
        self.launch().await
    }

    /// The last lines of the daemon's stderr and log file, for error messages.
    pub fn diagnostics(&self) -> String {
        format!(
            "--- {} (tail) ---\n{}\n--- {} (tail) ---\n{}",
            self.layout.daemon_stderr().display(),
            tail(&self.layout.daemon_stderr(), 40),
            self.layout.daemon_log().display(),
            tail(&self.layout.daemon_log(), 40),
        )
    }

    async fn launch(&mut self) -> Result<()> {
        let output = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.layout.daemon_stderr())
            .map_err(|source| Error::io("open the daemon's stderr file", source))?;
        let child = crate::spawner::spawn_for_process_lifetime(self.daemon_command(output)?)
            .map_err(|source| Error::io("spawn setpriv/unshare/libvirtd", source))?;
        if self.first_start_ticks == 0 {
            self.first_start_ticks = proc_stat(child.id()).map_or(0, |s| s.start_ticks);
        }
        self.daemon_pids.push(child.id());
        self.daemon = Some(child);
        self.exited = None;
        let started = Instant::now();
        match self.wait_ready().await {
            Ok(()) => {
                tracing_ready(started.elapsed(), self.tls_port);
                Ok(())
            }
            Err(e) => {
                self.stop_daemon();
                Err(Error::Start {
                    diagnostics: self.diagnostics(),
                    source: Box::new(e),
                })
            }
        }
    }

    fn daemon_command(&self, output: File) -> Result<Command> {
        let stdout = output
            .try_clone()
            .map_err(|source| Error::io("duplicate the daemon's stderr file", source))?;
        let mut command = Command::new("setpriv");
        // pdeathsig first, so the daemon dies with the test process even if that happens
        // while the wrapper is still mounting.
        command
            .args(["--pdeathsig", "KILL", "--"])
            .args(["unshare", "--mount", "--propagation", "private", "--"])
            .args(["sh", "-c", NAMESPACE_SCRIPT, "banlieue-libvirtd-namespace"])
            .arg(self.dir())
            .arg(self.options.system_root())
            .arg(LIBVIRTD_BINARY)
            .args(["--listen", "-f", "/etc/libvirt/libvirtd.conf"])
            .args(["-p", "/run/libvirt/libvirtd.pid"])
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("LIBVIRT_DRIVER_DIR", self.layout.drivers_dir())
            .env(
                "HOME",
                std::env::var_os("HOME").unwrap_or_else(|| "/root".into()),
            )
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(output);
        Ok(command)
    }

    /// Waits until the TLS port listens, the daemon accepts clients (it enables every
    /// listener at once) and QEMU's capabilities are loaded; see the `probe` module.
    async fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + self.options.ready_timeout;
        loop {
            self.ensure_daemon_running()?;
            if tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, self.tls_port))
                .await
                .is_ok()
            {
                break;
            }
            if Instant::now() >= deadline {
                return Err(Error::NotListening {
                    port: self.tls_port,
                    after: self.options.ready_timeout,
                });
            }
            tokio::time::sleep(POLL).await;
        }
        let socket = self.layout.unix_socket();
        let mut connection = loop {
            self.ensure_daemon_running()?;
            if let Some(open) = probe::try_open(&socket, Duration::from_secs(1)).await {
                break open?;
            }
            if Instant::now() >= deadline {
                return Err(Error::NotAccepting(self.options.ready_timeout));
            }
            tokio::time::sleep(POLL).await;
        };
        let remaining = deadline.saturating_duration_since(Instant::now());
        tokio::time::timeout(remaining, connection.get_version())
            .await
            .map_err(|source| Error::ProbeTimeout {
                after: self.options.ready_timeout,
                source,
            })?
    }

    fn ensure_daemon_running(&mut self) -> Result<()> {
        let Some(child) = self.daemon.as_mut() else {
            return Err(Error::NotRunning);
        };
        let exited = child
            .try_wait()
            .map_err(|source| Error::io("check whether libvirtd exited", source))?;
        if let Some(status) = exited {
            self.daemon = None;
            self.exited = Some(status);
            return Err(Error::Exited(status));
        }
        Ok(())
    }

    fn lost_port_race(&self) -> bool {
        let log = |p: &Path| fs::read_to_string(p).unwrap_or_default();
        let text = log(&self.layout.daemon_stderr()) + &log(&self.layout.daemon_log());
        text.contains("Address already in use")
    }

    /// SIGTERM by PID, wait, SIGKILL after a deadline, reap.
    fn stop_daemon(&mut self) {
        let Some(mut child) = self.daemon.take() else {
            return;
        };
        if self.suspended {
            // A stopped process would not act on SIGTERM.
            let _ = signal(child.id(), Signal::CONT);
            self.suspended = false;
        }
        let _ = signal(child.id(), Signal::TERM);
        let exited = wait_until(DAEMON_STOP_TIMEOUT, || {
            !matches!(child.try_wait(), Ok(None))
        });
        if !exited {
            eprintln!(
                "libvirtd {} ignored SIGTERM for {DAEMON_STOP_TIMEOUT:?}; sending SIGKILL\n\
                 threads: {}\n{}",
                child.id(),
                process::describe_threads(child.id()),
                self.diagnostics()
            );
            let _ = child.kill();
        }
        let _ = child.wait();
    }

    /// Guests are the daemon's grandchildren (QEMU daemonizes) and outlive it, so they are
    /// stopped by the PIDs in the daemon's pid files: SIGTERM, then SIGKILL after a deadline.
    /// While the daemon runs it sees them exit and cleans up after them as for any crash.
    fn stop_guests(&self) {
        let guests = self.guest_pids();
        if guests.is_empty() {
            return;
        }
        for &pid in &guests {
            let _ = signal(pid, Signal::TERM);
        }
        let ticks = self.first_start_ticks;
        let gone = || guests.iter().all(|&pid| !is_running(pid, ticks));
        if !wait_until(GUEST_STOP_TIMEOUT, gone) {
            for &pid in &guests {
                if is_running(pid, ticks) {
                    let _ = signal(pid, Signal::KILL);
                }
            }
            wait_until(GUEST_STOP_TIMEOUT, gone);
        }
    }
}

impl Drop for Libvirtd {
    fn drop(&mut self) {
        if self.suspended {
            let _ = signal(self.pid(), Signal::CONT);
            self.suspended = false;
        }
        self.stop_guests();
        self.stop_daemon();
        // A guest started while the first sweep ran, or one the dying daemon left behind.
        self.stop_guests();
        if let Some(dir) = self.dir.take()
            && let Err(e) = dir.close()
        {
            eprintln!("libvirtd: remove {}: {e}", self.layout.root.display());
        }
        if let Some(janitor) = self.janitor.take() {
            // End of file tells the janitor the instance is gone; it finds no directory.
            janitor.finish(JANITOR_EXIT_TIMEOUT);
        }
    }
}

/// Runs `virsh -c URI ARGS…` and returns stdout; for tests that bring their own pkipath.
pub async fn run_virsh<I, S>(uri: &str, args: I) -> Result<String>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let args: Vec<_> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
    let shown = args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ");
    let mut command = tokio::process::Command::new("virsh");
    command
        .arg("-c")
        .arg(uri)
        .args(&args)
        .env_remove("LIBVIRT_DEFAULT_URI")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let output = match tokio::time::timeout(VIRSH_TIMEOUT, command.output()).await {
        Err(source) => return Err(Error::VirshTimeout { shown, source }),
        Ok(output) => output.map_err(|source| {
            Error::io(
                format!("run virsh {shown} (libvirt-clients installed?)"),
                source,
            )
        })?,
    };
    if !output.status.success() {
        return Err(Error::Virsh {
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
            status: output.status,
            shown,
        });
    }
    String::from_utf8(output.stdout).map_err(|source| Error::VirshOutput { shown, source })
}

fn tail(path: &Path, lines: usize) -> String {
    match fs::read_to_string(path) {
        Ok(text) => {
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("({e})"),
    }
}

fn tracing_ready(elapsed: Duration, port: u16) {
    // Start times matter when a suite starts many instances; stderr is shown on failure only.
    eprintln!("libvirtd on 127.0.0.1:{port} ready after {elapsed:.2?}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_keep_their_chain_through_the_wrappers() {
        let error = Error::Start {
            diagnostics: "--- log (tail) ---".to_owned(),
            source: Box::new(Error::Layout(Box::new(Error::io(
                "stat /etc/libvirt",
                io::Error::other("gone"),
            )))),
        };
        assert_eq!(
            format!("{error:?}"),
            "start libvirtd\n--- log (tail) ---: lay out the instance's directories: \
             failed to stat /etc/libvirt: gone"
        );
        let mut depth = 0;
        let mut source = std::error::Error::source(&error);
        while let Some(cause) = source {
            depth += 1;
            source = cause.source();
        }
        assert_eq!(depth, 3);
    }
}

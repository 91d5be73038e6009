//! A real vCenter on loopback: vcsim, govmomi's simulator (built from the Go module proxy by
//! `scripts/control-plane build-vcsim`), serving vim25 SOAP at `https://127.0.0.1:PORT/sdk`
//! with a serving certificate from a throwaway CA, one user and password, and an inventory
//! of the shape asked for.
//!
//! ```no_run
//! # async fn demo() -> Result<(), banlieue_testenv::vcsim::Error> {
//! use banlieue_testenv::vcsim::{Vcsim, VcsimOptions};
//! if !Vcsim::available()? {
//!     return Ok(()); // no vcsim and CI unset: skipped loudly
//! }
//! let vcsim = Vcsim::start(VcsimOptions::new()).await?;
//! println!("{} as {}, CA:\n{}", vcsim.url(), vcsim.username(), vcsim.ca_pem());
//! # Ok(()) }
//! ```
//!
//! The inventory is named by vcsim's scheme: datacenters `DC0`, `DC1`, …; in each, clusters
//! `DC0_C0`, `DC0_C1`, … with hosts `DC0_C0_H0`, …, a root resource pool `Resources` and
//! VMs `DC0_C0_RP0_VM0`, …; datastores `LocalDS_0`, …, shared by every host; a VM folder
//! `/DC0/vm` holding the VMs. The model's VMs start powered on, each with one NIC.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::control_plane::process::Processes;
use crate::registry::pki;

/// How long vcsim may take to build its inventory and listen.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(20);
/// What vcsim prints, followed by its URL, once it serves.
const LISTENING: &str = "vcsim listening on ";
/// The process's name in errors and its log file's name.
const PROCESS_NAME: &str = "vcsim";

/// What can go wrong with a vcsim.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("vcsim is not built at {}: run scripts/setup vcsim (or scripts/control-plane build-vcsim)", .0.display())]
    VcsimMissing(PathBuf),
    #[error("run vcsim")]
    Process(#[from] crate::control_plane::Error),
    #[error("generate vcsim's certificates")]
    Pki(#[from] crate::registry::Error),
    #[error("vcsim did not announce its URL within {after:?}; its log:\n{log}")]
    NotReady { after: Duration, log: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The inventory and login of a [`Vcsim`]. The default: 2 datacenters × 2 clusters, 1 host per
/// cluster, no standalone host, 1 VM per cluster, 1 datastore; user `banlieue`, password
/// `banlieue-password`.
#[derive(Debug, Clone)]
pub struct VcsimOptions {
    /// Datacenters (`-dc`).
    pub datacenters: u32,
    /// Clusters per datacenter (`-cluster`).
    pub clusters: u32,
    /// Hosts per cluster (`-host`).
    pub hosts_per_cluster: u32,
    /// Standalone hosts per datacenter (`-standalone-host`).
    pub standalone_hosts: u32,
    /// VMs per resource pool (`-vm`): each cluster's root pool, each standalone host.
    pub vms_per_pool: u32,
    /// Local datastores, shared by every host (`-ds`).
    pub datastores: u32,
    /// The only user `Login` accepts (`-username`).
    pub username: String,
    /// That user's password (`-password`).
    pub password: String,
}

impl Default for VcsimOptions {
    fn default() -> Self {
        VcsimOptions {
            datacenters: 2,
            clusters: 2,
            hosts_per_cluster: 1,
            standalone_hosts: 0,
            vms_per_pool: 1,
            datastores: 1,
            username: "banlieue".to_owned(),
            password: "banlieue-password".to_owned(),
        }
    }
}

impl VcsimOptions {
    /// The default shape (see [`VcsimOptions`]).
    pub fn new() -> Self {
        VcsimOptions::default()
    }

    /// vcsim's command-line arguments for this shape, the listen address and the TLS files.
    pub fn args(&self, cert: &Path, key: &Path) -> Vec<String> {
        let mut args: Vec<String> = [
            ("-l", "127.0.0.1:0".to_owned()),
            ("-dc", self.datacenters.to_string()),
            ("-cluster", self.clusters.to_string()),
            ("-host", self.hosts_per_cluster.to_string()),
            ("-standalone-host", self.standalone_hosts.to_string()),
            ("-vm", self.vms_per_pool.to_string()),
            ("-ds", self.datastores.to_string()),
            ("-username", self.username.clone()),
            ("-password", self.password.clone()),
        ]
        .into_iter()
        .flat_map(|(flag, value)| [flag.to_owned(), value])
        .collect();
        args.extend([
            "-tlscert".to_owned(),
            cert.to_string_lossy().into_owned(),
            "-tlskey".to_owned(),
            key.to_string_lossy().into_owned(),
        ]);
        args
    }
}

/// A running vcsim; dropping it kills the process by PID and removes its directory (the
/// certificates, its log and the datastores' files).
#[derive(Debug)]
pub struct Vcsim {
    // Declared first so it drops first: the process stops before its files go.
    processes: Processes,
    url: String,
    args: Vec<String>,
    options: VcsimOptions,
    pki: pki::Pki,
}

impl Vcsim {
    /// Where `scripts/control-plane build-vcsim` puts vcsim.
    pub fn binary() -> PathBuf {
        crate::control_plane::bin_dir().join("vcsim")
    }

    /// Whether tests can talk to a vcsim: `Ok(true)` when it is built; `Ok(false)` (after a
    /// loud message) when it is not and `CI` is not `true`; under `CI=true` the error
    /// [`Vcsim::start`] would give, so CI never passes without having run the tests.
    pub fn available() -> Result<bool> {
        let binary = Self::binary();
        if binary.is_file() {
            return Ok(true);
        }
        let missing = Error::VcsimMissing(binary);
        if std::env::var("CI").as_deref() == Ok("true") {
            return Err(missing);
        }
        eprintln!("\n!!!!! SKIPPED: {missing} (and CI is not true) !!!!!\n");
        Ok(false)
    }

    /// Starts vcsim on a free loopback port and waits until it serves.
    pub async fn start(options: VcsimOptions) -> Result<Vcsim> {
        let binary = Self::binary();
        if !binary.is_file() {
            return Err(Error::VcsimMissing(binary));
        }
        // The control plane's janitor: it kills what names the directory on its command line
        // (vcsim's, through the TLS files) and removes the directory.
        let mut processes = Processes::new()?;
        let dir = processes.dir().to_owned();
        let pki = pki::generate(&dir.join("certs"), &dir.join("tls"))?;
        let args = options.args(&pki.server_cert, &pki.server_key);
        // vcsim keeps its datastores' files under TMPDIR; a killed vcsim cannot remove them,
        // the janitor removes this directory.
        processes.spawn_with_env(
            PROCESS_NAME,
            &binary,
            &args,
            &[("TMPDIR", dir.clone().into_os_string())],
        )?;
        let started = Instant::now();
        let log = dir.join("logs").join(format!("{PROCESS_NAME}.log"));
        let url = loop {
            processes.check_running()?;
            if let Some(url) = announced_url(&log) {
                break url;
            }
            if started.elapsed() >= READY_TIMEOUT {
                return Err(Error::NotReady {
                    after: READY_TIMEOUT,
                    log: processes.log_tails(),
                });
            }
            tokio::time::sleep(POLL).await;
        };
        eprintln!("vcsim at {url} ready after {:.2?}", started.elapsed());
        Ok(Vcsim {
            processes,
            url,
            args,
            options,
            pki,
        })
    }

    /// The SDK endpoint, `https://127.0.0.1:PORT/sdk`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The user `Login` accepts.
    pub fn username(&self) -> &str {
        &self.options.username
    }

    /// That user's password.
    pub fn password(&self) -> &str {
        &self.options.password
    }

    /// The CA that signed vcsim's serving certificate (PEM), for the client to trust.
    pub fn ca_pem(&self) -> &str {
        &self.pki.ca_pem
    }

    /// The shape it was started with.
    pub fn options(&self) -> &VcsimOptions {
        &self.options
    }

    /// The command line vcsim runs with (after the binary).
    pub fn args(&self) -> &[String] {
        &self.args
    }

    /// The PIDs of vcsim and of the janitor that cleans up after a crashed test.
    pub fn pids(&self) -> Vec<(&'static str, u32)> {
        self.processes.pids()
    }
}

/// The URL vcsim printed, once it has.
fn announced_url(log: &Path) -> Option<String> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix(LISTENING))
        .map(|url| url.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_name_the_shape_and_tls_files() {
        let args = VcsimOptions::new().args(Path::new("/c.pem"), Path::new("/k.pem"));
        assert_eq!(
            args.join(" "),
            "-l 127.0.0.1:0 -dc 2 -cluster 2 -host 1 -standalone-host 0 -vm 1 -ds 1 \
             -username banlieue -password banlieue-password -tlscert /c.pem -tlskey /k.pem"
        );
    }

    #[test]
    fn the_url_is_read_from_the_announcement() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("vcsim.log");
        std::fs::write(&log, "noise\n").expect("write");
        assert_eq!(announced_url(&log), None);
        std::fs::write(
            &log,
            "noise\nvcsim listening on https://127.0.0.1:1234/sdk\n",
        )
        .expect("write");
        assert_eq!(
            announced_url(&log).as_deref(),
            Some("https://127.0.0.1:1234/sdk")
        );
    }
}

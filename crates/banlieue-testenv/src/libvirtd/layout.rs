//! The per-instance directory tree that the namespace wrapper lays over the system paths, and
//! the configuration files in it.

use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt, chown, symlink};
use std::path::{Path, PathBuf};

use super::{Error, LibvirtdOptions, Result};

/// Paths inside one instance's temp dir. Each `*_dir` below is bind-mounted (inside the daemon's
/// private mount namespace) over the system path named in its doc.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub(crate) root: PathBuf,
    /// The system tree the daemon comes from: `/`, or a private root with another libvirt.
    /// Its `/etc/libvirt`, `/var/lib/libvirt` and `/var/log/libvirt` seed the instance's.
    pub(crate) system: PathBuf,
}

impl Layout {
    /// Seen by the daemon as `/etc/libvirt`.
    pub(crate) fn etc_dir(&self) -> PathBuf {
        self.root.join("etc")
    }
    /// Seen by the daemon as `/var/lib/libvirt`.
    pub(crate) fn lib_dir(&self) -> PathBuf {
        self.root.join("lib")
    }
    /// Seen by the daemon as `/run`. The whole of `/run` rather than `/run/libvirt`, because
    /// `/run/libvirt` does not exist on a machine where the packaged daemon never ran, and
    /// creating it would leave a trace on the host.
    pub(crate) fn run_dir(&self) -> PathBuf {
        self.root.join("run")
    }
    /// Seen by the daemon as `/var/log`, for the same reason (`/var/log/swtpm` may be absent).
    pub(crate) fn log_dir(&self) -> PathBuf {
        self.root.join("log")
    }
    pub(crate) fn pki_dir(&self) -> PathBuf {
        self.root.join("pki")
    }
    /// The daemon's `LIBVIRT_DRIVER_DIR`: links to the driver modules it loads.
    pub(crate) fn drivers_dir(&self) -> PathBuf {
        self.root.join("drivers")
    }
    pub(crate) fn pools_dir(&self) -> PathBuf {
        self.root.join("pools")
    }
    /// The daemon's own log, as written through `log_outputs`.
    pub(crate) fn daemon_log(&self) -> PathBuf {
        self.log_dir().join("libvirt/libvirtd.log")
    }
    /// stdout and stderr of the wrapper and the daemon: mount failures land here.
    pub(crate) fn daemon_stderr(&self) -> PathBuf {
        self.root.join("libvirtd.stderr")
    }
    /// `/run/libvirt` as the daemon sees it: pid files of the daemon, guests and swtpm.
    pub(crate) fn libvirt_run_dir(&self) -> PathBuf {
        self.run_dir().join("libvirt")
    }
    /// The read-write unix socket, used only to tell when the daemon accepts clients.
    pub(crate) fn unix_socket(&self) -> PathBuf {
        self.libvirt_run_dir().join("libvirt-sock")
    }

    /// A path of the system tree the daemon comes from.
    fn system_path(&self, absolute: &str) -> PathBuf {
        self.system.join(absolute.trim_start_matches('/'))
    }

    /// Creates the tree: a copy of the system's `/etc/libvirt`, the directory skeletons of its
    /// `/var/lib/libvirt` and `/var/log/libvirt` with their owners and modes (QEMU and swtpm
    /// run as unprivileged users and need them), and an empty `/run`.
    pub(crate) fn create(&self) -> Result<()> {
        // Guests run as libvirt-qemu and must traverse to volumes in pools under the root.
        set_mode(&self.root, 0o711)?;
        copy_tree(
            &self.system_path("/etc/libvirt"),
            &self.etc_dir(),
            Contents::All,
        )?;
        // A copied network definition could start dnsmasq and a bridge on the host network;
        // tests use no libvirt network unless they define one.
        for autostart in ["qemu/networks/autostart", "storage/autostart"] {
            let dir = self.etc_dir().join(autostart);
            if dir.is_dir() {
                let list = |source| io_error("list", &dir, source);
                for entry in fs::read_dir(&dir).map_err(list)? {
                    let path = entry.map_err(list)?.path();
                    fs::remove_file(&path).map_err(|source| io_error("remove", &path, source))?;
                }
            }
        }
        copy_tree(
            &self.system_path("/var/lib/libvirt"),
            &self.lib_dir(),
            Contents::DirsOnly,
        )?;
        // Where the network driver keeps the MAC addresses of a network with an address of
        // the host's; the system has it only when its network driver ever ran.
        create_dirs(&self.lib_dir().join("dnsmasq"))?;

        create_dirs(&self.log_dir())?;
        set_mode(&self.log_dir(), 0o755)?;
        copy_tree(
            &self.system_path("/var/log/libvirt"),
            &self.log_dir().join("libvirt"),
            Contents::DirsOnly,
        )?;
        create_dirs(&self.log_dir().join("libvirt/qemu"))?;
        create_dirs(&self.log_dir().join("swtpm"))?;

        let run = self.run_dir();
        create_dirs(&run.join("libvirt"))?;
        set_mode(&run, 0o755)?;
        set_mode(&run.join("libvirt"), 0o755)?;
        create_dirs(&run.join("lock"))?;
        set_mode(&run.join("lock"), 0o1777)?;
        link(Path::new("/dev/shm"), &run.join("shm"))?;

        create_dirs(&self.drivers_dir())?;
        for driver in DRIVERS {
            let module = format!("libvirt_driver_{driver}.so");
            link(
                &Path::new(DRIVER_DIR).join(&module),
                &self.drivers_dir().join(module),
            )?;
        }

        create_dirs(&self.pools_dir())?;
        set_mode(&self.pools_dir(), 0o755)?;
        Ok(())
    }

    /// Writes `libvirtd.conf` (replacing the copied one) and appends to the copied `qemu.conf`.
    pub(crate) fn write_config(
        &self,
        options: &LibvirtdOptions,
        tls_port: u16,
        tcp_port: Option<u16>,
    ) -> Result<()> {
        let conf = render_libvirtd_conf(&self.pki_dir(), options, tls_port, tcp_port);
        let path = self.etc_dir().join("libvirtd.conf");
        fs::write(&path, conf).map_err(|source| io_error("write", &path, source))?;

        let qemu_conf = self.etc_dir().join("qemu.conf");
        let mut text = fs::read_to_string(&qemu_conf).unwrap_or_default();
        if !text.contains(QEMU_CONF_MARKER) {
            text.push_str(&render_qemu_conf(options));
            fs::write(&qemu_conf, text).map_err(|source| io_error("write", &qemu_conf, source))?;
        }
        Ok(())
    }
}

/// Where Debian installs libvirt's connection driver modules.
const DRIVER_DIR: &str = "/usr/lib/x86_64-linux-gnu/libvirt/connection-driver";

/// The drivers a test daemon loads; libvirtd skips modules it does not find. Left out:
/// `nodedev`, whose udev thread at times deadlocks the daemon's shutdown here (SIGTERM then
/// waits forever; seen in about one run in three), and which no test needs.
const DRIVERS: [&str; 5] = ["qemu", "storage", "secret", "network", "nwfilter"];

const QEMU_CONF_MARKER: &str = "# --- banlieue test instance ---";

fn quote(value: &str) -> String {
    format!("\"{}\"", value.replace('\\', "\\\\").replace('"', "\\\""))
}

pub(crate) fn render_libvirtd_conf(
    pki_dir: &Path,
    options: &LibvirtdOptions,
    tls_port: u16,
    tcp_port: Option<u16>,
) -> String {
    let pki = |name: &str| quote(&pki_dir.join(name).display().to_string());
    let mut lines = vec![
        "listen_tls = 1".to_owned(),
        format!("listen_tcp = {}", u8::from(tcp_port.is_some())),
        "listen_addr = \"127.0.0.1\"".to_owned(),
        format!("tls_port = \"{tls_port}\""),
        "auth_tls = \"none\"".to_owned(),
        format!("ca_file = {}", pki(super::pki::CA_CERT)),
        format!("cert_file = {}", pki(super::pki::SERVER_CERT)),
        format!("key_file = {}", pki(super::pki::SERVER_KEY)),
        // The unix socket is only reachable inside the instance's tree; no polkit here.
        "auth_unix_ro = \"none\"".to_owned(),
        "auth_unix_rw = \"none\"".to_owned(),
        "log_outputs = \"2:file:/var/log/libvirt/libvirtd.log\"".to_owned(),
    ];
    if let Some(port) = tcp_port {
        lines.push(format!("tcp_port = \"{port}\""));
        lines.push("auth_tcp = \"none\"".to_owned());
    }
    if let Some(n) = options.max_client_requests {
        lines.push(format!("max_client_requests = {n}"));
    }
    if let Some(n) = options.keepalive_interval {
        lines.push(format!("keepalive_interval = {n}"));
    }
    if let Some(n) = options.keepalive_count {
        lines.push(format!("keepalive_count = {n}"));
    }
    lines.extend(options.extra_config.iter().cloned());
    let mut text = lines.join("\n");
    text.push('\n');
    text
}

fn render_qemu_conf(options: &LibvirtdOptions) -> String {
    let mut text = format!("\n{QEMU_CONF_MARKER}\n");
    // No virtlogd runs in the instance; QEMU's console output goes straight to a file.
    text.push_str("stdio_handler = \"file\"\n");
    // cgroup v1 machine groups live under /sys/fs/cgroup, outside the namespace: without
    // them nothing is left on the host and two instances cannot collide on `qemu-1-NAME`.
    text.push_str("cgroup_controllers = [ ]\n");
    for line in &options.extra_qemu_config {
        text.push_str(line);
        text.push('\n');
    }
    text
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Contents {
    All,
    DirsOnly,
}

/// Copies `src` to `dst` keeping modes and owners; symlinks are copied as links. With
/// `DirsOnly`, files are skipped: `/var/lib/libvirt` may hold a host's real images.
fn copy_tree(src: &Path, dst: &Path, what: Contents) -> Result<()> {
    let meta = fs::symlink_metadata(src).map_err(|source| io_error("stat", src, source))?;
    if meta.file_type().is_symlink() {
        if what == Contents::All {
            let target = fs::read_link(src).map_err(|source| io_error("read link", src, source))?;
            link(&target, dst)?;
        }
        return Ok(());
    }
    if meta.is_dir() {
        match fs::create_dir(dst) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_error("mkdir", dst, e)),
        }
        let list = |source| io_error("list", src, source);
        for entry in fs::read_dir(src).map_err(list)? {
            let entry = entry.map_err(list)?;
            copy_tree(&entry.path(), &dst.join(entry.file_name()), what)?;
        }
    } else if meta.is_file() {
        if what == Contents::DirsOnly {
            return Ok(());
        }
        fs::copy(src, dst).map_err(|source| io_error("copy", src, source))?;
    } else {
        return Ok(());
    }
    chown(dst, Some(meta.uid()), Some(meta.gid()))
        .map_err(|source| io_error("chown", dst, source))?;
    fs::set_permissions(dst, fs::Permissions::from_mode(meta.mode() & 0o7777))
        .map_err(|source| io_error("chmod", dst, source))?;
    Ok(())
}

/// An I/O error while doing `verb` to `path`.
fn io_error(verb: &str, path: &Path, source: io::Error) -> Error {
    Error::io(format!("{verb} {}", path.display()), source)
}

fn create_dirs(path: &Path) -> Result<()> {
    fs::create_dir_all(path).map_err(|source| io_error("create", path, source))
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .map_err(|source| io_error("chmod", path, source))
}

fn link(target: &Path, at: &Path) -> Result<()> {
    symlink(target, at).map_err(|source| io_error("link", at, source))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libvirtd_conf_has_tls_and_optional_tcp() {
        let options = LibvirtdOptions {
            max_client_requests: Some(64),
            keepalive_interval: Some(-1),
            extra_config: vec!["max_workers = 4".into()],
            ..LibvirtdOptions::default()
        };
        let conf = render_libvirtd_conf(Path::new("/t/pki"), &options, 16514, Some(16509));
        assert!(conf.contains("tls_port = \"16514\"\n"));
        assert!(conf.contains("listen_tcp = 1\n"));
        assert!(conf.contains("tcp_port = \"16509\"\nauth_tcp = \"none\"\n"));
        assert!(conf.contains("ca_file = \"/t/pki/cacert.pem\"\n"));
        assert!(conf.contains("max_client_requests = 64\n"));
        assert!(conf.contains("keepalive_interval = -1\n"));
        assert!(conf.ends_with("max_workers = 4\n"));

        let conf = render_libvirtd_conf(Path::new("/t/pki"), &LibvirtdOptions::default(), 1, None);
        assert!(conf.contains("listen_tcp = 0\n"));
        assert!(!conf.contains("tcp_port"));
    }

    #[test]
    fn quote_escapes() {
        assert_eq!(quote(r#"a"b\c"#), r#""a\"b\\c""#);
    }
}

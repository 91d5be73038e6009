//! The libvirtd test peer, checked with the independent `virsh` client.

use std::net::{Ipv4Addr, TcpListener};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use banlieue_testenv::libvirtd::{Libvirtd, LibvirtdOptions, run_virsh};

async fn start(options: LibvirtdOptions) -> Result<Option<Libvirtd>> {
    if !Libvirtd::available()? {
        return Ok(None);
    }
    Ok(Some(Libvirtd::start(options).await?))
}

/// A zombie reparented to an init that does not reap still has a /proc entry: it counts as gone.
fn pid_gone(pid: u32) -> bool {
    !banlieue_testenv::is_running(pid)
}

fn port_bindable(port: u16) -> bool {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
}

#[tokio::test]
async fn serves_tls_to_virsh() -> Result<()> {
    let Some(daemon) = start(LibvirtdOptions::default()).await? else {
        return Ok(());
    };
    let version = daemon.virsh(["version"]).await?;
    ensure!(
        version.contains("Using API: QEMU 11.3.0")
            && version.contains("Running hypervisor: QEMU 10.0"),
        "unexpected virsh version output:\n{version}"
    );
    let uri = daemon.virsh(["uri"]).await?;
    ensure!(uri.trim() == daemon.virsh_uri(), "virsh uri says {uri:?}");
    let hostname = daemon.virsh(["hostname"]).await?;
    ensure!(!hostname.trim().is_empty());
    ensure!(daemon.tls_uri() == format!("qemu+tls://127.0.0.1:{}/system", daemon.tls_port()));
    for file in ["cacert.pem", "clientcert.pem", "clientkey.pem"] {
        ensure!(daemon.pki_dir().join(file).is_file(), "{file} missing");
    }
    ensure!(daemon.client_cert_path().starts_with(daemon.dir()));
    ensure!(daemon.tcp_port().is_none() && daemon.tcp_uri().is_none());
    Ok(())
}

#[tokio::test]
async fn refuses_a_client_cert_from_another_ca() -> Result<()> {
    let Some(daemon) = start(LibvirtdOptions::default()).await? else {
        return Ok(());
    };
    let foreign = daemon.write_untrusted_client_pki()?;
    let uri = format!("{}?pkipath={}", daemon.tls_uri(), foreign.display());
    let refused = run_virsh(&uri, ["uri"]).await;
    ensure!(refused.is_err(), "a foreign client cert was accepted");
    // The daemon is still fine for a trusted client.
    daemon.virsh(["uri"]).await?;
    Ok(())
}

#[tokio::test]
async fn dir_pool_under_the_instance_dir() -> Result<()> {
    let Some(daemon) = start(LibvirtdOptions::default()).await? else {
        return Ok(());
    };
    let path = daemon.create_pool_dir("images")?;
    let pool_xml = format!(
        "<pool type='dir'><name>images</name><target><path>{}</path></target></pool>",
        path.display()
    );
    let xml_file = daemon.dir().join("pool.xml");
    std::fs::write(&xml_file, pool_xml)?;
    daemon
        .virsh([Path::new("pool-define").as_os_str(), xml_file.as_os_str()])
        .await?;
    daemon.virsh(["pool-build", "images"]).await?;
    daemon.virsh(["pool-start", "images"]).await?;
    daemon
        .virsh([
            "vol-create-as",
            "images",
            "disk.qcow2",
            "16M",
            "--format",
            "qcow2",
        ])
        .await?;
    ensure!(
        path.join("disk.qcow2").is_file(),
        "volume not in the pool dir"
    );
    let info = daemon.virsh(["pool-info", "images"]).await?;
    ensure!(info.contains("running"), "pool-info:\n{info}");
    // The pool's persistent XML went to the instance's copy of /etc/libvirt.
    ensure!(daemon.config_dir().join("storage/images.xml").is_file());
    ensure!(!Path::new("/etc/libvirt/storage/images.xml").exists());
    Ok(())
}

#[tokio::test]
async fn two_instances_side_by_side_and_nothing_left_after_drop() -> Result<()> {
    let Some(first) = start(LibvirtdOptions::default().with_tcp()).await? else {
        return Ok(());
    };
    let second = Libvirtd::start(LibvirtdOptions::default().with_max_client_requests(64)).await?;
    ensure!(first.tls_port() != second.tls_port());
    ensure!(first.pid() != second.pid());
    // Each daemon has its own state: a pool defined on one is unknown to the other.
    let path = first.create_pool_dir("only-first")?;
    first
        .virsh([
            "pool-define-as",
            "only-first",
            "dir",
            "--target",
            path.to_str().context("utf-8 path")?,
        ])
        .await?;
    ensure!(
        first
            .virsh(["pool-list", "--all", "--name"])
            .await?
            .contains("only-first")
    );
    ensure!(
        !second
            .virsh(["pool-list", "--all", "--name"])
            .await?
            .contains("only-first")
    );
    let tcp_uri = first.tcp_uri().context("tcp requested")?;
    ensure!(run_virsh(&tcp_uri, ["uri"]).await?.trim() == tcp_uri);

    let leftovers: Vec<(u32, Vec<u16>, std::path::PathBuf)> = [first, second]
        .into_iter()
        .map(|daemon| {
            let ports = [Some(daemon.tls_port()), daemon.tcp_port()]
                .into_iter()
                .flatten()
                .collect();
            (daemon.pid(), ports, daemon.dir().to_owned())
            // Dropped here.
        })
        .collect();
    for (pid, ports, dir) in leftovers {
        ensure!(pid_gone(pid), "libvirtd {pid} still running");
        for port in ports {
            ensure!(port_bindable(port), "port {port} still taken");
        }
        ensure!(!dir.exists(), "{} left behind", dir.display());
    }
    Ok(())
}

#[tokio::test]
async fn suspend_resume_and_restart() -> Result<()> {
    let Some(mut daemon) = start(LibvirtdOptions::default().with_keepalive(1, 2)).await? else {
        return Ok(());
    };
    let (port, pid) = (daemon.tls_port(), daemon.pid());
    daemon.suspend()?;
    let stopped = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    ensure!(
        stopped
            .rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('T'))
    );
    daemon.resume()?;
    daemon.virsh(["uri"]).await?;
    daemon.restart().await?;
    ensure!(daemon.tls_port() == port && daemon.pid() != pid);
    ensure!(pid_gone(pid), "old daemon {pid} still running");
    daemon.virsh(["uri"]).await?;
    Ok(())
}

#[tokio::test]
async fn stop_then_start_again_on_the_same_port_and_state() -> Result<()> {
    let Some(mut daemon) = start(LibvirtdOptions::default()).await? else {
        return Ok(());
    };
    let (port, pid) = (daemon.tls_port(), daemon.pid());
    let xml = daemon.dir().join("net.xml");
    std::fs::write(
        &xml,
        "<network><name>kept</name><bridge name='bnkept' stp='off'/></network>",
    )?;
    daemon
        .virsh(["net-define", xml.to_str().context("utf-8 path")?])
        .await?;
    daemon.stop();
    ensure!(!daemon.is_running());
    ensure!(pid_gone(pid), "stopped daemon {pid} still running");
    ensure!(
        daemon.virsh(["uri"]).await.is_err(),
        "a stopped daemon answered"
    );
    daemon.stop();
    daemon.start_again().await?;
    ensure!(daemon.is_running() && daemon.tls_port() == port && daemon.pid() != pid);
    ensure!(
        daemon.start_again().await.is_err(),
        "started a running daemon twice"
    );
    let networks = daemon.virsh(["net-list", "--all", "--name"]).await?;
    ensure!(
        networks.lines().any(|l| l.trim() == "kept"),
        "the state did not survive: {networks}"
    );
    Ok(())
}

#[tokio::test]
async fn a_daemon_that_dies_says_how_and_a_stopped_one_does_not() -> Result<()> {
    use std::os::unix::process::ExitStatusExt;
    let Some(mut daemon) = start(LibvirtdOptions::default()).await? else {
        return Ok(());
    };
    ensure!(
        daemon.exit_status().is_none(),
        "a running daemon has no exit status"
    );
    // Our own daemon, by its PID: what a crash looks like from the harness.
    let pid = daemon.pid();
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()?;
    ensure!(killed.success(), "kill -KILL {pid}: {killed}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = daemon.exit_status() {
            break status;
        }
        ensure!(
            Instant::now() < deadline,
            "no exit status 10 s after SIGKILL"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    ensure!(
        status.signal() == Some(9),
        "exit status {status}, not SIGKILL"
    );
    ensure!(
        daemon.exit_status() == Some(status),
        "the exit is no longer reported"
    );
    ensure!(!daemon.is_running(), "a killed daemon counts as running");
    ensure!(
        daemon.virsh(["uri"]).await.is_err(),
        "a killed daemon answered"
    );

    // Started again after the exit, it has nothing to report; nor after a deliberate stop.
    daemon.start_again().await?;
    daemon.virsh(["uri"]).await?;
    ensure!(
        daemon.exit_status().is_none(),
        "a daemon started again still reports its old exit"
    );
    daemon.stop();
    ensure!(
        daemon.exit_status().is_none(),
        "a stopped daemon reports an exit"
    );
    Ok(())
}

const EFI_TPM_DOMAIN: &str = "<domain type='qemu'>
  <name>NAME</name>
  <memory unit='MiB'>192</memory>
  <vcpu>1</vcpu>
  <os firmware='efi'>
    <type arch='x86_64' machine='q35'>hvm</type>
    <firmware>
      <feature enabled='no' name='secure-boot'/>
      <feature enabled='no' name='enrolled-keys'/>
    </firmware>
  </os>
  <features><acpi/></features>
  <devices>
    <video><model type='none'/></video>
    <tpm model='tpm-crb'><backend type='emulator' version='2.0'/></tpm>
  </devices>
</domain>";

#[tokio::test]
async fn efi_tpm_guest_runs_and_does_not_outlive_the_instance() -> Result<()> {
    let Some(daemon) = start(LibvirtdOptions::default()).await? else {
        return Ok(());
    };
    let name = "testenv-efi-tpm";
    let xml_file = daemon.dir().join("domain.xml");
    std::fs::write(&xml_file, EFI_TPM_DOMAIN.replace("NAME", name))?;
    let xml_arg = xml_file.to_str().context("utf-8 path")?;

    daemon.virsh(["define", xml_arg]).await?;
    let started = Instant::now();
    daemon.virsh(["start", name]).await.map_err(|e| {
        let log = std::fs::read_to_string(daemon.domain_log(name)).unwrap_or_default();
        anyhow::Error::new(e).context(format!("guest log:\n{log}"))
    })?;
    eprintln!("domain start: {:.2?}", started.elapsed());
    ensure!(daemon.virsh(["domstate", name]).await?.trim() == "running");
    let guests = daemon.guest_pids();
    ensure!(
        guests.len() >= 2,
        "expected QEMU and swtpm pids, got {guests:?}"
    );
    let nvram = daemon
        .state_dir()
        .join(format!("qemu/nvram/{name}_VARS.fd"));
    ensure!(nvram.is_file(), "{} missing", nvram.display());

    let stopped = Instant::now();
    daemon.virsh(["destroy", name]).await?;
    eprintln!("domain destroy: {:.2?}", stopped.elapsed());
    for &pid in &guests {
        ensure!(
            wait_gone(pid),
            "guest process {} outlived destroy",
            describe(pid)
        );
    }
    daemon.virsh(["undefine", name, "--nvram", "--tpm"]).await?;
    ensure!(!nvram.exists(), "undefine --nvram left {}", nvram.display());
    ensure!(
        daemon
            .virsh(["list", "--all", "--name"])
            .await?
            .trim()
            .is_empty()
    );

    // A running guest does not outlive the instance.
    daemon.virsh(["define", xml_arg]).await?;
    daemon.virsh(["start", name]).await?;
    let guests = daemon.guest_pids();
    ensure!(!guests.is_empty());
    let dir = daemon.dir().to_owned();
    drop(daemon);
    for pid in guests {
        ensure!(pid_gone(pid), "guest process {pid} outlived the instance");
    }
    ensure!(!dir.exists());
    Ok(())
}

fn wait_gone(pid: u32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if pid_gone(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

fn describe(pid: u32) -> String {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    format!(
        "{pid} ({}; {})",
        String::from_utf8_lossy(&cmdline).replace('\0', " "),
        stat.trim()
    )
}

/// Set for the child process of `nothing_left_when_the_test_process_is_killed`.
const HELPER_ENV: &str = "BANLIEUE_TESTENV_LIBVIRTD_HELPER";

/// Not a test on its own (it returns at once without `HELPER_ENV`): the child process that
/// `nothing_left_when_the_test_process_is_killed` kills, with a daemon and a running guest.
#[tokio::test]
async fn helper_instance_until_killed() -> Result<()> {
    if std::env::var_os(HELPER_ENV).is_none() {
        return Ok(());
    }
    let daemon = Libvirtd::start(LibvirtdOptions::default()).await?;
    let name = "testenv-killed";
    let xml_file = daemon.dir().join("domain.xml");
    std::fs::write(&xml_file, EFI_TPM_DOMAIN.replace("NAME", name))?;
    daemon
        .virsh(["define", xml_file.to_str().context("utf-8 path")?])
        .await?;
    daemon.virsh(["start", name]).await?;
    let guests: Vec<String> = daemon.guest_pids().iter().map(u32::to_string).collect();
    println!(
        "HELPER {} {} {}",
        daemon.pid(),
        daemon.dir().display(),
        guests.join(",")
    );
    std::future::pending::<()>().await;
    Ok(())
}

#[tokio::test]
async fn nothing_left_when_the_test_process_is_killed() -> Result<()> {
    use tokio::io::AsyncBufReadExt;
    if !Libvirtd::available()? {
        return Ok(());
    }
    let mut child = tokio::process::Command::new(std::env::current_exe()?)
        .args(["--exact", "helper_instance_until_killed", "--nocapture"])
        .env(HELPER_ENV, "1")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let stdout = child.stdout.take().context("helper stdout")?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let report = tokio::time::timeout(Duration::from_secs(180), async {
        while let Some(line) = lines.next_line().await? {
            if let Some(report) = line.strip_prefix("HELPER ") {
                return Ok(report.to_owned());
            }
        }
        anyhow::bail!("helper exited without reporting")
    })
    .await
    .context("helper did not report within 180 s")??;
    let mut fields = report.split(' ');
    let daemon_pid: u32 = fields.next().context("pid")?.parse()?;
    let dir = std::path::PathBuf::from(fields.next().context("dir")?);
    let guests: Vec<u32> = fields
        .next()
        .context("guests")?
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    ensure!(!guests.is_empty() && dir.is_dir());

    child.start_kill()?; // SIGKILL: no destructor runs in the helper.
    child.wait().await?;

    let deadline = Instant::now() + Duration::from_secs(30);
    let all_gone =
        || pid_gone(daemon_pid) && guests.iter().all(|&pid| pid_gone(pid)) && !dir.exists();
    while !all_gone() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ensure!(
        pid_gone(daemon_pid),
        "libvirtd {daemon_pid} outlived its test process"
    );
    for pid in guests {
        ensure!(
            pid_gone(pid),
            "guest {} outlived the test process",
            describe(pid)
        );
    }
    ensure!(!dir.exists(), "{} left behind", dir.display());
    Ok(())
}

//! The test guest image boots on the real libvirtd under TCG, as the provider would run it
//! (q35, EFI without secure boot, a qcow2 overlay of the image, a NoCloud seed from
//! banlieue-iso on a virtio-scsi CD-ROM, a vTPM), runs the seed's user-data and reaches the
//! guest-phase layer's `ready`, with its EK certificates and SSH host keys published. Checked
//! twice: from the serial console log, and through qemu-guest-agent with virsh as an independent
//! client. Then an access request written through the agent installs a key for a new user, who
//! logs in with it over ssh against the published host keys alone.
//! And the same image as a Deferred install medium: the installer CD writes it onto an empty
//! disk, reboots, and the installed system reaches `ready` from that disk.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use banlieue_iso::NoCloudSeed;
use banlieue_testenv::guest_agent;
use banlieue_testenv::guest_image::{
    self, ACCESS_STATE, ACCESS_WANTED, EK_ECC_PEM, EK_RSA_PEM, PHASE_FILE, SSH_HOST_KEYS,
};
use banlieue_testenv::libvirtd::{Libvirtd, LibvirtdOptions};
use sha2::{Digest, Sha256};

/// From `virsh start` to the phase layer's verdict; ~45 s alone on two cores under TCG.
const BOOT_DEADLINE: Duration = Duration::from_secs(180);
const POLL: Duration = Duration::from_millis(500);
/// From the agent's close of the access request to the layer's answer: a path unit, a
/// useradd and a few forks, a second or two under TCG.
const ACCESS_DEADLINE: Duration = Duration::from_secs(30);
/// How long without an answer before the activate line is written again.
const NUDGE: Duration = Duration::from_millis(2500);
/// For sshd's first answer under TCG (its key exchange is slow there, not its start: it ran
/// before ready).
const SSH_DEADLINE: Duration = Duration::from_secs(90);
/// The login the test's access request names; the image has no such user until it asks.
const ACCESS_USER: &str = "claimant";
/// The layer's attestation files (guest/README.md).
const ATTEST_EK: &str = "/run/banlieue/attest/ek.pub";
const ATTEST_AK: &str = "/run/banlieue/attest/ak.pub";
const ATTEST_CHALLENGE: &str = "/run/banlieue/attest/challenge";
const ATTEST_ACTIVATE: &str = "/run/banlieue/attest/activate";
const ATTEST_ANSWER: &str = "/run/banlieue/attest/answer";
const ATTEST_SEALED: &str = "/run/banlieue/attest/sealed";
/// Where the layer opens a sealed payload.
const SEALED_PAYLOAD: &str = "/run/banlieue/sealed/payload";
/// Where Linux shows the event log the firmware handed it.
const FIRMWARE_EVENT_LOG: &str = "/sys/kernel/security/tpm0/binary_bios_measurements";

/// The domain both tests boot, as the provider would define it; `boot_order` and the CD-ROMs
/// (install medium first, then the seed) are what a Deferred machine adds.
fn domain_xml(
    name: &str,
    disk: &Path,
    cdroms: &[&Path],
    console: &Path,
    tpm: bool,
) -> Result<String> {
    let boot_order = if cdroms.len() > 1 {
        "<boot dev='hd'/><boot dev='cdrom'/>"
    } else {
        ""
    };
    let mut cdrom_xml = String::new();
    for (cdrom, dev) in cdroms.iter().zip(["sda", "sdb"]) {
        cdrom_xml.push_str(&format!(
            "<disk type='file' device='cdrom'><driver name='qemu' type='raw'/>\
             <source file='{}'/><target dev='{dev}' bus='scsi'/><readonly/></disk>\n",
            path_str(cdrom)?
        ));
    }
    let tpm = if tpm {
        "<tpm model='tpm-crb'><backend type='emulator' version='2.0'/></tpm>"
    } else {
        ""
    };
    Ok(format!(
        "<domain type='qemu'>
  <name>{name}</name>
  <memory unit='MiB'>1024</memory>
  <vcpu>1</vcpu>
  <os firmware='efi'>
    <type arch='x86_64' machine='q35'>hvm</type>
    <firmware>
      <feature enabled='no' name='secure-boot'/>
      <feature enabled='no' name='enrolled-keys'/>
    </firmware>
    {boot_order}
  </os>
  <features><acpi/></features>
  <devices>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2'/>
      <source file='{disk}'/>
      <target dev='vda' bus='virtio'/>
    </disk>
    <controller type='scsi' model='virtio-scsi'/>
    {cdrom_xml}
    <interface type='user'><model type='virtio'/></interface>
    <channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>
    <serial type='file'><source path='{console}'/><target port='0'/></serial>
    {tpm}
    <video><model type='none'/></video>
  </devices>
</domain>",
        disk = path_str(disk)?,
        console = path_str(console)?,
    ))
}

#[tokio::test]
async fn installer_writes_the_image_to_an_empty_disk_and_boots_it() -> Result<()> {
    let installer = guest_image::installer_path().await?;
    let daemon = Libvirtd::start(LibvirtdOptions::default()).await?;
    let name = "guest-image-install";
    let pool = daemon.create_pool_dir("install")?;
    let medium = pool.join("installer.iso");
    std::fs::copy(&installer, &medium).with_context(|| format!("copy {}", installer.display()))?;
    let disk = pool.join(format!("{name}-os.qcow2"));
    qemu_img_create(&[&disk, Path::new("4G")])?;
    let seed = pool.join(format!("{name}-cidata.iso"));
    std::fs::write(&seed, NoCloudSeed::new(name, name).to_bytes()?)?;
    let console = pool.join("console.log");
    let xml = domain_xml(name, &disk, &[&medium, &seed], &console, false)?;
    let xml_file = daemon.dir().join("install.xml");
    std::fs::write(&xml_file, xml)?;
    daemon.virsh(["define", path_str(&xml_file)?]).await?;

    let started = Instant::now();
    daemon.virsh(["start", name]).await?;
    // Two boots: the installer's, then the installed system's.
    let verdict = wait_for_phase_within(&console, started, BOOT_DEADLINE * 2).await;
    let log = std::fs::read_to_string(&console).unwrap_or_default();
    let verdict = verdict.with_context(|| format!("serial console:\n{}", tail(&log, 60)))?;
    eprintln!(
        "install and boot to phase {verdict:?}: {:.1?}",
        started.elapsed()
    );
    ensure!(
        verdict == "ready",
        "phase {verdict:?}; serial console:\n{}",
        tail(&log, 60)
    );
    // The installer ran before the installed system said ready. (Its last line, "done,
    // rebooting", is printed just before a sysrq reset and may not always reach the log; the
    // root check below shows the install completed.)
    let installing = log
        .find("banlieue-install: writing")
        .context("the installer never ran")?;
    let ready = log
        .rfind("banlieue-guest-phase: ready")
        .context("no ready on the console")?;
    ensure!(installing < ready, "ready came before the install");

    // The running system is the installed one: its root is the disk's second partition.
    let root = guest_agent::run(
        &daemon,
        name,
        "/usr/bin/findmnt",
        &["-n", "-o", "SOURCE", "/"],
    )
    .await?;
    let root = String::from_utf8_lossy(&root);
    ensure!(
        root.trim() == "/dev/vda2",
        "the root file system is {root:?}, not /dev/vda2"
    );

    daemon.virsh(["destroy", name]).await?;
    daemon.virsh(["undefine", name, "--nvram"]).await?;
    for file in [&disk, &seed, &medium, &console] {
        std::fs::remove_file(file).with_context(|| format!("remove {}", file.display()))?;
    }
    Ok(())
}

#[tokio::test]
async fn guest_image_runs_user_data_and_reaches_ready() -> Result<()> {
    // No skip: a machine that runs these tests has libvirtd and builds the image.
    let image = guest_image::path().await?;
    let daemon = Libvirtd::start(LibvirtdOptions::default()).await?;
    let name = "guest-image-boot";
    let pool = daemon.create_pool_dir("guest")?;

    // QEMU runs as libvirt-qemu, which cannot reach a backing file under root's home.
    let base = pool.join("base.qcow2");
    std::fs::copy(&image, &base).with_context(|| format!("copy {}", image.display()))?;
    let overlay = pool.join(format!("{name}-os.qcow2"));
    qemu_img_create(&[
        Path::new("-F"),
        Path::new("qcow2"),
        Path::new("-b"),
        &base,
        &overlay,
    ])?;

    let token = format!(
        "{:x}",
        std::process::id() as u64 * 2_654_435_761 % (1 << 32)
    );
    let user_data = format!(
        "#cloud-config\nruncmd:\n  - [ sh, -c, 'echo user-data ran: {token} | tee /run/banlieue-test-marker' ]\n"
    );
    let seed = pool.join(format!("{name}-cidata.iso"));
    let iso = NoCloudSeed::new(format!("{name}-{token}"), name)
        .with_user_data(user_data)
        .to_bytes()?;
    std::fs::write(&seed, &iso)?;

    let console = pool.join("console.log");
    let xml = domain_xml(name, &overlay, &[&seed], &console, true)?;
    let xml_file = daemon.dir().join("guest.xml");
    std::fs::write(&xml_file, xml)?;
    daemon.virsh(["define", path_str(&xml_file)?]).await?;

    let started = Instant::now();
    daemon.virsh(["start", name]).await?;
    let verdict = wait_for_phase(&console, started).await;
    let log = std::fs::read_to_string(&console).unwrap_or_default();
    let verdict = verdict.with_context(|| format!("serial console:\n{}", tail(&log, 60)))?;
    eprintln!("boot to phase {verdict:?}: {:.1?}", started.elapsed());
    ensure!(
        verdict == "ready",
        "the guest's phase is {verdict:?}; serial console:\n{}",
        tail(&log, 60)
    );
    ensure!(
        log.contains(&format!("user-data ran: {token}")),
        "the seed's user-data did not run; serial console:\n{}",
        tail(&log, 60)
    );

    // The same facts through the guest agent, a client independent of the console.
    let phase = guest_agent::read_text(&daemon, name, PHASE_FILE).await?;
    ensure!(phase == "ready\n", "{PHASE_FILE} holds {phase:?}");
    let marker = guest_agent::read_text(&daemon, name, "/run/banlieue-test-marker").await?;
    ensure!(
        marker.trim() == format!("user-data ran: {token}"),
        "marker {marker:?}"
    );
    // Booted by EFI with the secure-boot features off: the firmware enforces nothing.
    ensure!(
        !guest_agent::secure_boot(&daemon, name).await?,
        "the guest reports Secure Boot on"
    );
    for pem in [EK_RSA_PEM, EK_ECC_PEM] {
        let text = guest_agent::read_text(&daemon, name, pem).await?;
        ensure!(
            text.starts_with("-----BEGIN CERTIFICATE-----\n")
                && text.ends_with("-----END CERTIFICATE-----\n"),
            "{pem} is not a PEM certificate: {text:?}"
        );
        let issuer = openssl_issuer(&text)?;
        ensure!(
            issuer.contains("swtpm-localca"),
            "{pem} was issued by {issuer}, not swtpm's local CA"
        );
    }

    // sshd's host keys, published before ready: the one ed25519 key the layer made at boot (the
    // image carries none and cloud-init made none), as sshd holds it.
    let host_keys_said = log
        .find("banlieue-guest-phase: SSH host keys in")
        .context("no SSH host keys on the console")?;
    let ready_said = log
        .find("banlieue-guest-phase: ready")
        .context("no ready on the console")?;
    ensure!(
        host_keys_said < ready_said,
        "the host keys were published after ready"
    );
    let host_keys = guest_agent::read_text(&daemon, name, SSH_HOST_KEYS).await?;
    let sshd_key =
        guest_agent::read_text(&daemon, name, "/etc/ssh/ssh_host_ed25519_key.pub").await?;
    let sshd_key: Vec<&str> = sshd_key.split_whitespace().take(2).collect();
    ensure!(
        host_keys == format!("{}\n", sshd_key.join(" ")) && sshd_key[0] == "ssh-ed25519",
        "{SSH_HOST_KEYS} holds {host_keys:?}; sshd's ed25519 key is {sshd_key:?}"
    );

    access_installs_a_key_that_logs_in(&daemon, name, &host_keys).await?;
    a_credential_opens_only_in_this_guests_tpm(&daemon, name, &image).await?;
    let (world, filter) = egress_holds_inside_the_guest(&daemon, name).await?;

    daemon.virsh(["destroy", name]).await?;
    daemon.virsh(["undefine", name, "--nvram", "--tpm"]).await?;
    // The filter outlives the domain that used it; the world goes after both.
    daemon.virsh(["nwfilter-undefine", &filter]).await?;
    world.stop(&daemon).await?;
    for file in [&overlay, &seed, &base, &console] {
        std::fs::remove_file(file).with_context(|| format!("remove {}", file.display()))?;
    }
    Ok(())
}

/// The guest's attestation key, proven to sit in the TPM its EK certificate certifies: the
/// EK public area the layer published is the certificate's key; a credential made in Rust
/// (banlieue-attest) for the AK's Name, relayed as the provider would, is activated by the
/// guest's TPM and answered with the secret and a quote by the AK carrying the relayed extra
/// data, over the PCR values it shows; one made for another Name is refused by it.
async fn a_credential_opens_only_in_this_guests_tpm(
    daemon: &Libvirtd,
    name: &str,
    image: &Path,
) -> Result<()> {
    use banlieue_attest::rand_core::{OsRng, RngCore};
    use banlieue_attest::{Public, PublicKey, extra_data, make_credential, verify_quote};

    let ek = Public::from_tpm2b(&guest_agent::read_file(daemon, name, ATTEST_EK).await?)?;
    let ak = Public::from_tpm2b(&guest_agent::read_file(daemon, name, ATTEST_AK).await?)?;
    ek.check_endorsement_key()?;
    ak.check_attestation_key()?;
    let PublicKey::Rsa { modulus, .. } = &ek.key else {
        bail!("the EK the layer published is not RSA");
    };
    let certified = openssl_x509(
        &guest_agent::read_text(daemon, name, EK_RSA_PEM).await?,
        "-modulus",
    )?;
    let published: String = modulus.iter().map(|b| format!("{b:02X}")).collect();
    ensure!(
        certified == format!("Modulus={published}"),
        "the published EK is not the key of {EK_RSA_PEM}"
    );

    let mut secret = [0u8; 32];
    OsRng.fill_bytes(&mut secret);
    let mut binding = [0u8; 32];
    OsRng.fill_bytes(&mut binding);
    let credential = make_credential(&ek, &ak.name(), &secret, &mut OsRng)?;
    let started = Instant::now();
    let answer = challenge(daemon, name, &credential.tpm2_tools_file(), &binding).await?;
    let relayed = started.elapsed();
    let field = |key: &str| -> Result<Vec<u8>> {
        use base64::Engine;
        let value = answer
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{key} ")))
            .with_context(|| format!("no {key} line in {answer:?}"))?;
        Ok(base64::engine::general_purpose::STANDARD.decode(value)?)
    };
    let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    ensure!(
        answer.split_whitespace().nth(2) == Some(banlieue_attest::seal::proof(&secret).as_str()),
        "the guest answered {answer:?}, not the proof of the secret"
    );
    ensure!(!answer.contains(&hex), "the answer gives the secret away");
    let pcrs: Vec<Vec<u8>> = field("pcrs")?.chunks(32).map(<[u8]>::to_vec).collect();
    ensure!(pcrs.len() == 8, "{} PCR values, not PCRs 0-7", pcrs.len());
    // The guest hashed its own host keys into the quote: those it published.
    let published = guest_agent::read_text(daemon, name, SSH_HOST_KEYS).await?;
    ensure!(
        field("hostkeys")? == published.as_bytes(),
        "hostkeys is not {SSH_HOST_KEYS}"
    );
    let keys: Vec<String> = published.lines().map(str::to_owned).collect();
    let extra = extra_data(&binding, &keys).context("one-line host keys")?;
    let quote = verify_quote(
        &ak,
        &field("quote")?,
        &field("signature")?,
        &extra,
        Some(&pcrs),
    )?;
    ensure!(quote.pcr_selection.len() == 1, "{:?}", quote.pcr_selection);
    // What a boot of the test image measures, for docs/performance.md's comparison of boots.
    for (index, value) in pcrs.iter().enumerate() {
        let value: String = value.iter().map(|b| format!("{b:02x}")).collect();
        eprintln!("PCR {index} (sha256) after boot: {value}");
    }
    eprintln!("credential activated and quoted in the guest {relayed:.1?} after the relay");

    // The firmware's own log of this boot (OVMF's, as the kernel keeps it), in the answer as
    // the kernel shows it, replays, event by event, to exactly the values the AK just signed.
    let log = field("eventlog")?;
    ensure!(
        log == guest_agent::read_file(daemon, name, FIRMWARE_EVENT_LOG).await?,
        "the answer's event log is not {FIRMWARE_EVENT_LOG}"
    );
    let parsed = banlieue_attest::event_log::EventLog::parse(&log)?;
    let quoted: Vec<(u32, &[u8])> = (0..8u32).zip(pcrs.iter().map(Vec::as_slice)).collect();
    parsed.check(&quoted)?;
    let per_pcr: Vec<String> = (0..8)
        .map(|pcr| format!("{pcr}: {}", parsed.events_in(pcr)))
        .collect();
    eprintln!(
        "firmware event log: {} bytes, {} events, replays to the quote (events per PCR {})",
        log.len(),
        parsed.events.len(),
        per_pcr.join(", ")
    );
    the_image_predicts_its_boot(image, &parsed, &pcrs)?;

    // A payload sealed to a new credential's secret: the layer opens it for the login the
    // access step installed keys for, alone; one flipped byte and it refuses it.
    let payload = format!("deploy token for {name}: {}", hex);
    OsRng.fill_bytes(&mut secret);
    let mut iv = [0u8; 16];
    OsRng.fill_bytes(&mut iv);
    let sealed = banlieue_attest::seal::seal(&secret, payload.as_bytes(), iv)?;
    let relay = |sealed: Vec<u8>, secret: [u8; 32]| {
        let credential = make_credential(&ek, &ak.name(), &secret, &mut OsRng);
        async move {
            let file = credential?.tpm2_tools_file();
            challenge_sealed(daemon, name, &file, &binding, Some(&sealed)).await
        }
    };
    let answer = relay(sealed.clone(), secret).await?;
    ensure!(
        answer
            .lines()
            .any(|l| l == format!("opened {SEALED_PAYLOAD}")),
        "the sealed payload was not opened: {answer:?}"
    );
    ensure!(
        guest_agent::read_text(daemon, name, SEALED_PAYLOAD).await? == payload,
        "{SEALED_PAYLOAD} is not the payload"
    );
    let mode = guest_agent::run(
        daemon,
        name,
        "/usr/bin/stat",
        &["-c", "%a %U", SEALED_PAYLOAD],
    )
    .await?;
    let mode = String::from_utf8_lossy(&mode);
    ensure!(
        mode.trim() == format!("600 {ACCESS_USER}"),
        "{SEALED_PAYLOAD} is {mode:?}, not the login's alone"
    );
    let mut flipped = sealed.clone();
    flipped[20] ^= 1;
    OsRng.fill_bytes(&mut secret);
    let answer = relay(flipped, secret).await?;
    ensure!(
        answer.starts_with("failed ") && answer.contains("MAC does not match"),
        "a flipped byte: {answer:?}"
    );

    // Made for another key (the EK's own Name): the TPM will not release it to the AK.
    let elsewhere = make_credential(&ek, &ek.name(), &secret, &mut OsRng)?;
    let answer = challenge(daemon, name, &elsewhere.tpm2_tools_file(), &binding).await?;
    ensure!(
        answer.starts_with("failed ") && !answer.contains(&hex) && !answer.contains("quote"),
        "a credential for another Name: {answer:?}"
    );
    Ok(())
}

/// Relays `file` as the provider would (attest/challenge, then attest/activate naming its
/// SHA-256 and the subject's binding) and waits for the layer's answer about these very
/// bytes.
/// A class's egress (ADR-0078), proven from inside this guest: a second interface on an
/// isolated network joins it with the filter a libvirt member of such a class gets (the
/// provider's own policy and document for it), and the guest tries every destination of the
/// world (banlieue-testenv's `egress_world`: servers in a network namespace of the test's,
/// routed through a peer on the guests' network). With the filter, only the allowed server's
/// port and the named resolver answer; the other port, address and protocol, the metadata
/// address, the host and the peer on the guests' network (where another guest would be) do
/// not. The same filter redefined to accept everything lets every row through, so each row
/// could fail. Returns the world and the filter, which the caller removes after the domain.
async fn egress_holds_inside_the_guest(
    daemon: &Libvirtd,
    name: &str,
) -> Result<(banlieue_testenv::egress_world::EgressWorld, String)> {
    use banlieue_api::egress::{ClassEgress, EgressProtocol, EgressRule};
    use banlieue_provider_libvirt::egress_filter::{filter_uuid, filter_xml};
    use banlieue_provider_libvirt::machine::egress::{network_facts, policy};
    use banlieue_testenv::egress_world::{
        BULK_PORT, EgressWorld, METADATA, OTHER_RESOLVER, OTHER_SERVER, RESOLVER, SERVER,
    };
    const MAC: &str = "52:54:00:be:e5:01";
    let world = EgressWorld::start(daemon, "eg").await?;
    let filter = format!("banlieue-egress-{name}");
    let class = ClassEgress {
        allow: [8443, BULK_PORT]
            .map(|port| EgressRule {
                cidr: format!("{SERVER}/32"),
                protocol: EgressProtocol::Tcp,
                port: Some(port),
                end_port: None,
            })
            .into(),
        dns_resolver: Some(RESOLVER.to_string()),
        allow_always_denied: Vec::new(),
    };
    let facts = network_facts(&daemon.virsh(["net-dumpxml", &world.network]).await?)?;
    let define = |xml: String| {
        let path = daemon.dir().join("egress-filter.xml");
        async move {
            std::fs::write(&path, xml)?;
            daemon.virsh(["nwfilter-define", path_str(&path)?]).await?;
            anyhow::Ok(())
        }
    };
    define(filter_xml(&filter, &policy(&class, &facts)?)?).await?;
    let interface = daemon.dir().join("egress-interface.xml");
    std::fs::write(&interface, world.interface_xml(MAC, Some(&filter)))?;
    daemon
        .virsh(["attach-device", name, path_str(&interface)?, "--live"])
        .await?;
    guest_agent::run(
        daemon,
        name,
        "/bin/sh",
        &["-c", &world.guest_setup_script(MAC)],
    )
    .await?;

    let rows = [
        ("allowed", "tcp", SERVER, 8443, true),
        ("other-port", "tcp", SERVER, 8444, false),
        ("other-address", "tcp", OTHER_SERVER, 8443, false),
        ("other-protocol", "udp", SERVER, 8443, false),
        ("resolver", "udp", RESOLVER, 53, true),
        ("other-resolver", "udp", OTHER_RESOLVER, 53, false),
        ("metadata", "tcp", METADATA, 80, false),
        ("host", "tcp", world.host, 8443, false),
        ("guest-network", "tcp", world.peer, 8443, false),
    ];
    let probes: Vec<(&str, &str, std::net::Ipv4Addr, u16)> =
        rows.iter().map(|r| (r.0, r.1, r.2, r.3)).collect();
    let script = EgressWorld::probe_script(&probes);
    let probe = || async {
        let out = guest_agent::run(daemon, name, "/bin/bash", &["-c", &script]).await?;
        anyhow::Ok(String::from_utf8_lossy(&out).into_owned())
    };
    let started = Instant::now();
    let filtered = probe().await?;
    for (row, _, _, _, reached) in rows {
        let expected = format!("{row} {}", if reached { "reached" } else { "blocked" });
        ensure!(
            filtered.lines().any(|l| l == expected),
            "with the filter, expected {expected:?}; the guest saw:\n{filtered}"
        );
    }
    eprintln!(
        "egress with the filter, every row as declared ({:.1?})",
        started.elapsed()
    );
    let bulk = || async {
        let script = EgressWorld::bulk_script(SERVER);
        let out = guest_agent::run(daemon, name, "/bin/bash", &["-c", &script]).await?;
        let line = String::from_utf8_lossy(&out).into_owned();
        EgressWorld::bulk_result(&line).with_context(|| format!("the bulk read said {line:?}"))
    };
    let (filtered_bytes, filtered_seconds) = bulk().await?;

    // The same filter (its name and UUID) accepting everything: every row answers.
    define(format!(
        "<filter name='{filter}' chain='root'><uuid>{}</uuid>\
         <rule action='accept' direction='inout'><all/></rule></filter>",
        filter_uuid(&filter)
    ))
    .await?;
    let open = probe().await?;
    let (open_bytes, open_seconds) = bulk().await?;
    ensure!(
        filtered_bytes == open_bytes && open_bytes > 0,
        "the bulk reads got {filtered_bytes} and {open_bytes} bytes"
    );
    // A figure for docs/performance.md, not a check: the guest's CPU under TCG bounds both.
    let mib = open_bytes as f64 / f64::from(1 << 20);
    eprintln!(
        "egress throughput from the allowed server, {mib:.0} MiB: {:.1} MiB/s through the filter, \
         {:.1} MiB/s through one that accepts everything (ratio {:.2})",
        mib / filtered_seconds,
        mib / open_seconds,
        open_seconds / filtered_seconds
    );
    for (row, ..) in rows {
        ensure!(
            open.lines().any(|l| l == format!("{row} reached")),
            "without the filter's rules, {row} was not reached: the row proves nothing;\n{open}"
        );
    }
    Ok((world, filter))
}

/// PCR 4 and PCR 5 computed from the image's bytes before any boot (banlieue-attest's
/// `boot::predict`, what the image builder publishes) are what the firmware measured: each
/// measurement equals the log's event of that PCR, in order, and the values equal the quoted
/// ones. The raw disk is qemu-img's, not banlieue's qcow2 reader's.
fn the_image_predicts_its_boot(
    image: &Path,
    log: &banlieue_attest::event_log::EventLog,
    quoted: &[Vec<u8>],
) -> Result<()> {
    use banlieue_attest::boot;
    let scratch = tempfile::tempdir()?;
    let raw = scratch.path().join("disk.raw");
    let status = std::process::Command::new("qemu-img")
        .args(["convert", "-q", "-O", "raw"])
        .arg(image)
        .arg(&raw)
        .status()?;
    ensure!(status.success(), "qemu-img convert {}", image.display());
    let prediction = boot::predict(&std::fs::File::open(&raw)?, &boot::SHIM_CHAIN)?;
    for pcr in [4u32, 5] {
        let predicted: Vec<[u8; 32]> = prediction
            .measurements
            .iter()
            .filter(|m| m.pcr == pcr)
            .map(|m| m.digest)
            .collect();
        let logged: Vec<[u8; 32]> = log
            .events
            .iter()
            .filter(|e| e.pcr == pcr)
            .filter_map(|e| e.sha256)
            .collect();
        ensure!(
            predicted == logged,
            "PCR {pcr}: the image predicts {predicted:02x?}, the firmware logged {logged:02x?}"
        );
    }
    for (pcr, value) in prediction.values() {
        ensure!(
            quoted.get(pcr as usize) == Some(&value),
            "PCR {pcr}: predicted {value:02x?}, quoted {:02x?}",
            quoted.get(pcr as usize)
        );
    }
    eprintln!("PCR 4 and PCR 5 computed from the image equal the boot's");
    Ok(())
}

async fn challenge(daemon: &Libvirtd, name: &str, file: &[u8], binding: &[u8]) -> Result<String> {
    challenge_sealed(daemon, name, file, binding, None).await
}

/// As [`challenge`], with a sealed payload written to attest/sealed and named third.
async fn challenge_sealed(
    daemon: &Libvirtd,
    name: &str,
    file: &[u8],
    binding: &[u8],
    sealed: Option<&[u8]>,
) -> Result<String> {
    let hex = |bytes: &[u8]| -> String { bytes.iter().map(|b| format!("{b:02x}")).collect() };
    let digest = hex(&Sha256::digest(file));
    guest_agent::write_file(daemon, name, ATTEST_CHALLENGE, file).await?;
    let mut line = format!("{digest} {}", hex(binding));
    if let Some(sealed) = sealed {
        guest_agent::write_file(daemon, name, ATTEST_SEALED, sealed).await?;
        line = format!("{line} {}", hex(&Sha256::digest(sealed)));
    }
    guest_agent::write_file(
        daemon,
        name,
        ATTEST_ACTIVATE,
        format!("{line}\n").as_bytes(),
    )
    .await?;
    let started = Instant::now();
    let mut nudged = false;
    loop {
        // As the provider does: a line that landed as the layer's last run ended is written
        // once more (the path unit does not start the layer again while it runs).
        if !nudged && started.elapsed() > NUDGE {
            nudged = true;
            let line = format!("{line}\n");
            guest_agent::write_file(daemon, name, ATTEST_ACTIVATE, line.as_bytes()).await?;
        }
        let answer = guest_agent::read_text(daemon, name, ATTEST_ANSWER)
            .await
            .unwrap_or_default();
        if answer.starts_with(&format!("activated {digest} "))
            || answer.starts_with(&format!("failed {digest} "))
        {
            return Ok(answer.trim_end().to_owned());
        }
        if started.elapsed() > ACCESS_DEADLINE {
            let script = "journalctl -o short-precise --no-pager -u banlieue-guest-attest.service \
                          | tail -20; ls -la /run/banlieue/attest";
            let journal = guest_agent::run(daemon, name, "/bin/sh", &["-c", script]).await;
            bail!(
                "{ATTEST_ANSWER} holds {answer:?} {ACCESS_DEADLINE:?} after the challenge; the \
                 layer's journal:\n{}",
                journal.map_or_else(
                    |e| e.to_string(),
                    |o| String::from_utf8_lossy(&o).into_owned()
                )
            );
        }
        // Often, as the provider reads it: the time it took is printed.
        tokio::time::sleep(POLL / 10).await;
    }
}

/// Writes an access request for a new user through the agent, as the provider does, waits for
/// the layer's answer, and logs in as that user with the request's key over ssh, trusting no
/// host key but those the guest published.
async fn access_installs_a_key_that_logs_in(
    daemon: &Libvirtd,
    name: &str,
    host_keys: &str,
) -> Result<()> {
    let keys = tempfile::tempdir()?;
    let identity = keys.path().join("id_ed25519");
    let keygen = tokio::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "claimant@test", "-f"])
        .arg(&identity)
        .output()
        .await
        .context("run ssh-keygen (openssh-client: scripts/setup part 70-guest-image)")?;
    ensure!(
        keygen.status.success(),
        "ssh-keygen: {}",
        String::from_utf8_lossy(&keygen.stderr)
    );
    let public = std::fs::read_to_string(identity.with_extension("pub"))?;
    let wanted = format!(
        "banlieue-access 1\nuser {ACCESS_USER}\nkey {}\nend\n",
        public.trim_end()
    );
    let digest: String = Sha256::digest(wanted.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let expected = format!("installed {ACCESS_USER} {digest}\n");

    let written = Instant::now();
    guest_agent::write_file(daemon, name, ACCESS_WANTED, wanted.as_bytes()).await?;
    loop {
        // No file yet is "not yet", as is an answer to another request.
        let state = guest_agent::read_text(daemon, name, ACCESS_STATE)
            .await
            .unwrap_or_default();
        if state == expected {
            break;
        }
        ensure!(
            !state.starts_with("failed: "),
            "{ACCESS_STATE} holds {state:?}"
        );
        if written.elapsed() > ACCESS_DEADLINE {
            bail!(
                "{ACCESS_STATE} holds {state:?}, not {expected:?}, {ACCESS_DEADLINE:?} after the write"
            );
        }
        tokio::time::sleep(POLL).await;
    }
    eprintln!("access installed {:.1?} after the write", written.elapsed());
    // The layer's own time, by the guest's clock: from the request's last write to the
    // answer's (the poll above is far coarser).
    let times = guest_agent::run(
        daemon,
        name,
        "/usr/bin/stat",
        &["-c", "%.9Y", ACCESS_WANTED, ACCESS_STATE],
    )
    .await?;
    let times: Vec<f64> = String::from_utf8_lossy(&times)
        .split_whitespace()
        .filter_map(|t| t.parse().ok())
        .collect();
    if let [wanted, state] = times[..] {
        eprintln!(
            "the guest's layer answered {:.0} ms after the request was written",
            (state - wanted) * 1000.0
        );
    }
    // Of which the step itself, from systemd's record of its last run.
    let shown = guest_agent::run(
        daemon,
        name,
        "/usr/bin/systemctl",
        &[
            "show",
            "banlieue-guest-access.service",
            "-p",
            "ExecMainStartTimestampMonotonic",
            "-p",
            "ExecMainExitTimestampMonotonic",
        ],
    )
    .await?;
    let shown = String::from_utf8_lossy(&shown);
    let microseconds = |key: &str| {
        shown
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('=')?.parse::<u64>().ok())
    };
    if let (Some(start), Some(exit)) = (
        microseconds("ExecMainStartTimestampMonotonic"),
        microseconds("ExecMainExitTimestampMonotonic"),
    ) {
        eprintln!(
            "of which the access step ran {} ms",
            exit.saturating_sub(start) / 1000
        );
    }
    // The new account has no password (locked, as useradd leaves it), which sshd with PAM
    // accepts for a key login.
    let status = guest_agent::run(daemon, name, "/usr/bin/passwd", &["-S", ACCESS_USER]).await?;
    let status = String::from_utf8_lossy(&status);
    ensure!(
        status.split_whitespace().nth(1) == Some("L"),
        "passwd -S {ACCESS_USER}: {status}"
    );

    // The domain's user-mode network reaches the guest from the host only through a forward,
    // which QEMU adds at run time on the netdev libvirt names hostnet0.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    daemon
        .virsh([
            "qemu-monitor-command",
            name,
            "--hmp",
            &format!("hostfwd_add hostnet0 tcp:127.0.0.1:{port}-:22"),
        ])
        .await?;
    let known_hosts = keys.path().join("known_hosts");
    let pinned: String = host_keys
        .lines()
        .map(|line| format!("[127.0.0.1]:{port} {line}\n"))
        .collect();
    std::fs::write(&known_hosts, pinned)?;
    let started = Instant::now();
    loop {
        let login = tokio::process::Command::new("ssh")
            .args(["-F", "/dev/null", "-i"])
            .arg(&identity)
            .args(["-p", &port.to_string()])
            .arg("-o")
            .arg(format!("UserKnownHostsFile={}", known_hosts.display()))
            .args([
                "-o",
                "GlobalKnownHostsFile=/dev/null",
                "-o",
                "StrictHostKeyChecking=yes",
                "-o",
                "BatchMode=yes",
                "-o",
                "IdentitiesOnly=yes",
                "-o",
                "ConnectTimeout=30",
                &format!("{ACCESS_USER}@127.0.0.1"),
                "id",
                "-un",
            ])
            .stdin(std::process::Stdio::null())
            .output()
            .await
            .context("run ssh")?;
        if login.status.success() {
            let who = String::from_utf8_lossy(&login.stdout);
            ensure!(who.trim() == ACCESS_USER, "logged in as {who:?}");
            eprintln!("ssh login as {ACCESS_USER}: {:.1?}", started.elapsed());
            return Ok(());
        }
        if started.elapsed() > SSH_DEADLINE {
            bail!(
                "ssh {ACCESS_USER}@127.0.0.1:{port}: {}",
                String::from_utf8_lossy(&login.stderr)
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Waits for the phase layer's last word on the console: `ready` or `failed: <why>`.
async fn wait_for_phase(console: &Path, started: Instant) -> Result<String> {
    wait_for_phase_within(console, started, BOOT_DEADLINE).await
}

async fn wait_for_phase_within(
    console: &Path,
    started: Instant,
    deadline: Duration,
) -> Result<String> {
    loop {
        let log = std::fs::read_to_string(console).unwrap_or_default();
        for line in log.lines() {
            let Some((_, phase)) = line.split_once("banlieue-guest-phase: ") else {
                continue;
            };
            let phase = phase.trim_end_matches('\r').trim();
            if phase == "ready" || phase.starts_with("failed: ") {
                return Ok(phase.to_owned());
            }
        }
        if let Some(line) = log
            .lines()
            .find(|l| l.starts_with("banlieue-install: failed"))
        {
            bail!("the installer said {line:?}");
        }
        if started.elapsed() > deadline {
            bail!("the guest reached no final phase within {deadline:?}");
        }
        tokio::time::sleep(POLL).await;
    }
}

fn openssl_issuer(pem: &str) -> Result<String> {
    openssl_x509(pem, "-issuer")
}

/// `openssl x509 -noout FIELD` of `pem`: what openssl, an independent reader, prints.
fn openssl_x509(pem: &str, field: &str) -> Result<String> {
    use std::io::Write;
    let mut child = std::process::Command::new("openssl")
        .args(["x509", "-noout", field])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("run openssl x509")?;
    child
        .stdin
        .take()
        .context("openssl stdin")?
        .write_all(pem.as_bytes())?;
    let out = child.wait_with_output()?;
    ensure!(out.status.success(), "openssl x509 could not read {pem:?}");
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// `qemu-img create -q -f qcow2 ARGS…`.
fn qemu_img_create(args: &[&Path]) -> Result<()> {
    let created = std::process::Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2"])
        .args(args)
        .output()
        .context("run qemu-img create")?;
    ensure!(
        created.status.success(),
        "qemu-img create: {}",
        String::from_utf8_lossy(&created.stderr)
    );
    Ok(())
}

fn path_str(path: &Path) -> Result<&str> {
    path.to_str()
        .with_context(|| format!("{} is not UTF-8", path.display()))
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// banlieue-attest's FAT reader against file systems dosfstools made and mtools filled (the
/// image's ESP is made the same way): long and short names in any case, nested directories,
/// files over many clusters, FAT16 and FAT32; a deleted or missing file, or a directory named
/// as a file, is not found.
#[test]
fn the_esp_reader_reads_what_mtools_wrote() -> Result<()> {
    use banlieue_attest::boot::BootError;
    use banlieue_attest::boot::fat::Fat;
    let dir = tempfile::tempdir()?;
    let mut big = vec![0u8; 300_000];
    let mut state = 0x2545_f491_u32;
    for byte in &mut big {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        *byte = state as u8;
    }
    let files: [(&str, &[u8]); 4] = [
        ("EFI/BOOT/BOOTX64.EFI", &big[..200_000]),
        ("EFI/BOOT/grubx64.efi", &big),
        (
            "EFI/debian/a long name, with spaces.cfg",
            b"set timeout=0\n",
        ),
        ("vmlinuz", &big[1000..5000]),
    ];
    for (fat_bits, kib) in [("16", 32 * 1024), ("32", 48 * 1024)] {
        let image = dir.path().join(format!("fat{fat_bits}.img"));
        let mkfs = std::process::Command::new("mkfs.vfat")
            .args(["-C", "-F", fat_bits, "-S", "512", "-s", "1"])
            .arg(&image)
            .arg(kib.to_string())
            .output()?;
        ensure!(mkfs.status.success(), "mkfs.vfat: {mkfs:?}");
        let tree = dir.path().join(format!("tree{fat_bits}"));
        for (path, bytes) in files {
            let at = tree.join(path);
            std::fs::create_dir_all(at.parent().context("parent")?)?;
            std::fs::write(&at, bytes)?;
        }
        std::fs::write(tree.join("deleted.efi"), b"gone")?;
        let mtools = |args: &[&Path]| -> Result<()> {
            let out = std::process::Command::new(args[0])
                .env("MTOOLS_SKIP_CHECK", "1")
                .args(&args[1..])
                .output()?;
            ensure!(out.status.success(), "{args:?}: {out:?}");
            Ok(())
        };
        mtools(&[
            Path::new("mcopy"),
            Path::new("-s"),
            Path::new("-i"),
            &image,
            &tree.join("EFI"),
            &tree.join("vmlinuz"),
            &tree.join("deleted.efi"),
            Path::new("::/"),
        ])?;
        mtools(&[
            Path::new("mdel"),
            Path::new("-i"),
            &image,
            Path::new("::/deleted.efi"),
        ])?;
        let disk = std::fs::File::open(&image)?;
        let length = disk.metadata()?.len();
        let fs = Fat::open(&disk, 0, length)?;
        for (path, bytes) in files {
            ensure!(fs.read_file(path)? == bytes, "FAT{fat_bits}: {path}");
        }
        ensure!(
            fs.read_file(r"\efi\boot\BOOTX64.efi")? == big[..200_000],
            "FAT{fat_bits}: names match without regard to case"
        );
        for missing in ["deleted.efi", "EFI/BOOT/none.efi", "EFI/BOOT", "vmlinuz/x"] {
            ensure!(
                matches!(fs.read_file(missing), Err(BootError::NotFound(_))),
                "FAT{fat_bits}: {missing} found"
            );
        }
        // Corrupted anywhere in its first MiB (boot sector, FATs, directories): an error or
        // some bytes, never a panic or a read without end.
        let mut corrupt = std::fs::read(&image)?;
        for _ in 0..300 {
            let mut changed = Vec::new();
            for _ in 0..4 {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                let at = state as usize % (1 << 20);
                changed.push((at, corrupt[at]));
                corrupt[at] = (state >> 8) as u8;
            }
            if let Ok(fs) = Fat::open(&corrupt, 0, length) {
                for (path, _) in files {
                    let _ = fs.read_file(path);
                }
            }
            for (at, byte) in changed.into_iter().rev() {
                corrupt[at] = byte;
            }
        }
    }
    Ok(())
}

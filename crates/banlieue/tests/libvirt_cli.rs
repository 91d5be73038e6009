//! `banlieue libvirt …` as a user runs it, against a real libvirtd; virsh is the independent
//! second opinion.

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use banlieue_testenv::libvirtd::{Libvirtd, LibvirtdOptions};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_banlieue");

async fn daemon() -> Option<Libvirtd> {
    if !Libvirtd::available().expect("libvirtd is installed (run scripts/setup)") {
        return None;
    }
    Some(
        Libvirtd::start(LibvirtdOptions::default())
            .await
            .expect("libvirtd starts"),
    )
}

/// Runs `banlieue libvirt ARGS` with an empty HOME, so nothing of the machine's own
/// configuration is read.
async fn banlieue(d: &Libvirtd, args: &[&str]) -> Output {
    let home = d.dir().join("home");
    std::fs::create_dir_all(&home).expect("home");
    Command::new(BIN)
        .arg("libvirt")
        .args(args)
        .env("HOME", &home)
        .env_remove("XDG_CONFIG_HOME")
        .env_remove("LIBVIRT_DEFAULT_URI")
        .output()
        .await
        .expect("banlieue runs")
}

fn stdout_ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).expect("utf-8")
}

/// Fails with one `error: …` line on stderr and a non-zero exit.
fn one_line_error(out: &Output) -> String {
    assert!(!out.status.success(), "expected a failure");
    let err = String::from_utf8(out.stderr.clone()).expect("utf-8");
    assert_eq!(err.lines().count(), 1, "one line: {err:?}");
    assert!(err.starts_with("error: "), "{err:?}");
    err.trim_end().to_string()
}

fn sorted_lines(s: &str) -> Vec<String> {
    let mut v: Vec<String> = s
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    v.sort();
    v
}

async fn virsh_pool(d: &Libvirtd, name: &str) {
    let dir = d.create_pool_dir(name).expect("pool dir");
    let dir = dir.to_str().expect("utf-8");
    d.virsh(["pool-define-as", name, "dir", "--target", dir])
        .await
        .expect("pool-define-as");
    d.virsh(["pool-start", name]).await.expect("pool-start");
}

fn first_column(table: &str) -> Vec<String> {
    let mut v: Vec<String> = table
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn listings_agree_with_virsh() {
    let Some(d) = daemon().await else { return };
    let uri = d.virsh_uri();
    virsh_pool(&d, "cli-a").await;
    virsh_pool(&d, "cli-b").await;
    d.virsh([
        "pool-define-as",
        "cli-idle",
        "dir",
        "--target",
        "/nonexistent",
    ])
    .await
    .expect("an inactive pool");

    let ours = stdout_ok(&banlieue(&d, &["pools", "-c", &uri]).await);
    assert!(ours.starts_with("NAME"), "{ours}");
    let theirs = d
        .virsh(["pool-list", "--all", "--name"])
        .await
        .expect("virsh");
    assert_eq!(first_column(&ours), sorted_lines(&theirs), "{ours}");
    assert!(
        ours.lines()
            .any(|l| l.starts_with("cli-idle") && l.contains("inactive")),
        "{ours}"
    );
    let active = d
        .virsh(["pool-list", "--name"])
        .await
        .expect("virsh active");
    let json: serde_json::Value = serde_json::from_str(&stdout_ok(
        &banlieue(&d, &["pools", "-c", &uri, "-o", "json"]).await,
    ))
    .expect("json");
    let mut json_active: Vec<String> = json
        .as_array()
        .expect("array")
        .iter()
        .filter(|p| p["active"] == true)
        .map(|p| p["name"].as_str().expect("name").to_string())
        .collect();
    json_active.sort();
    assert_eq!(json_active, sorted_lines(&active));

    let xml = d.dir().join("cli-dom.xml");
    std::fs::write(
        &xml,
        "<domain type='qemu'><name>banlieue-cli-dom</name><memory unit='MiB'>64</memory>\
         <vcpu>1</vcpu><os><type arch='x86_64' machine='pc'>hvm</type></os></domain>",
    )
    .expect("xml");
    d.virsh(["define", xml.to_str().expect("utf-8")])
        .await
        .expect("define");
    let ours = stdout_ok(&banlieue(&d, &["domains", "-c", &uri]).await);
    let names: Vec<String> = {
        let mut v: Vec<String> = ours
            .lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().nth(1))
            .map(str::to_string)
            .collect();
        v.sort();
        v
    };
    let theirs = d
        .virsh(["list", "--all", "--name"])
        .await
        .expect("virsh list");
    assert_eq!(names, sorted_lines(&theirs), "{ours}");
    assert!(
        ours.lines().any(|l| l.contains("banlieue-cli-dom")
            && l.contains("shut off")
            && l.starts_with('-')),
        "{ours}"
    );

    let version: serde_json::Value = serde_json::from_str(&stdout_ok(
        &banlieue(&d, &["version", "-c", &uri, "-o", "json"]).await,
    ))
    .expect("json");
    assert_eq!(version["libvirt"], "11.3.0");
    assert_eq!(version["hypervisor"]["type"], "QEMU");
    let caps = stdout_ok(&banlieue(&d, &["capabilities", "-c", &uri]).await);
    assert!(caps.contains("<capabilities>"), "{caps}");
}

#[tokio::test]
async fn volumes_go_up_and_down_and_virsh_sees_the_same_bytes() {
    let Some(d) = daemon().await else { return };
    let uri = d.virsh_uri();
    virsh_pool(&d, "cli-vols").await;
    let size = 3 << 20;
    d.virsh(["vol-create-as", "cli-vols", "data.raw", &size.to_string()])
        .await
        .expect("vol-create-as");
    let mut data: Vec<u8> = (0..size).map(|i| (i % 253) as u8).collect();
    data[1 << 20..2 << 20].fill(0);
    let src = d.dir().join("src.raw");
    std::fs::write(&src, &data).expect("write");

    let out = stdout_ok(
        &banlieue(
            &d,
            &[
                "vol-upload",
                "cli-vols",
                "data.raw",
                src.to_str().expect("utf-8"),
                "--sparse",
                "-c",
                &uri,
            ],
        )
        .await,
    );
    assert!(out.starts_with(&format!("uploaded {size} bytes")), "{out}");
    let virsh_copy = d.dir().join("virsh.raw");
    d.virsh([
        "vol-download",
        "--pool",
        "cli-vols",
        "data.raw",
        virsh_copy.to_str().expect("utf-8"),
    ])
    .await
    .expect("virsh vol-download");
    assert!(std::fs::read(&virsh_copy).expect("read") == data);

    let ours = d.dir().join("ours.raw");
    let out = stdout_ok(
        &banlieue(
            &d,
            &[
                "vol-download",
                "cli-vols",
                "data.raw",
                ours.to_str().expect("utf-8"),
                "--sparse",
                "-o",
                "json",
                "-c",
                &uri,
            ],
        )
        .await,
    );
    let report: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert!(report["downloaded"]["holes"].as_u64() > Some(0), "{out}");
    assert!(std::fs::read(&ours).expect("read") == data);

    let ranged = d.dir().join("range.raw");
    stdout_ok(
        &banlieue(
            &d,
            &[
                "vol-download",
                "cli-vols",
                "data.raw",
                ranged.to_str().expect("utf-8"),
                "--offset",
                "10",
                "--length",
                "100",
                "-c",
                &uri,
            ],
        )
        .await,
    );
    assert!(std::fs::read(&ranged).expect("read") == data[10..110]);

    let vols = stdout_ok(&banlieue(&d, &["vols", "cli-vols", "-c", &uri]).await);
    assert!(
        vols.lines()
            .any(|l| l.starts_with("data.raw") && l.contains(&size.to_string())),
        "{vols}"
    );
}

#[tokio::test]
async fn credentials_come_from_pkipath_flags_or_the_default_dir() {
    let Some(d) = daemon().await else { return };
    let pki = d.pki_dir();
    let file = |p: &Path| p.to_str().expect("utf-8").to_string();
    // Flags instead of a pkipath.
    let out = banlieue(
        &d,
        &[
            "version",
            "-c",
            &d.tls_uri(),
            "--cert",
            &file(&d.client_cert_path()),
            "--key",
            &file(&d.client_key_path()),
            "--ca",
            &file(&d.ca_cert_path()),
        ],
    )
    .await;
    assert!(stdout_ok(&out).contains("11.3.0"));
    // Nothing given: ~/.config/banlieue/libvirt/, which is empty here.
    let err = one_line_error(&banlieue(&d, &["version", "-c", &d.tls_uri()]).await);
    assert!(
        err.contains(".config/banlieue/libvirt/clientcert.pem"),
        "names the file it looked for: {err}"
    );
    // The default dir, filled.
    let dir = d.dir().join("home/.config/banlieue/libvirt");
    std::fs::create_dir_all(&dir).expect("dir");
    for f in ["cacert.pem", "clientcert.pem", "clientkey.pem"] {
        std::fs::copy(pki.join(f), dir.join(f)).expect("copy");
    }
    stdout_ok(&banlieue(&d, &["version", "-c", &d.tls_uri()]).await);

    let err = one_line_error(&banlieue(&d, &["vols", "nope", "-c", &d.virsh_uri()]).await);
    assert_eq!(err, "error: storage pool \"nope\" not found");
    let err = one_line_error(&banlieue(&d, &["pools", "-c", "qemu+ssh://127.0.0.1/system"]).await);
    assert_eq!(err, "error: scheme \"qemu+ssh\" is not supported");
    let err = one_line_error(&banlieue(&d, &["pools"]).await);
    assert!(err.contains("-c/--connect"), "{err}");
    // The local socket needs no credentials: the TLS files are not even looked for (HOME's
    // default dir is removed first).
    std::fs::remove_dir_all(&dir).expect("remove the default dir");
    let socket = format!(
        "qemu+unix:///system?socket={}",
        d.run_dir().join("libvirt-sock").display()
    );
    assert!(stdout_ok(&banlieue(&d, &["version", "-c", &socket]).await).contains("11.3.0"));
    // A port nothing listens on: the cause is on the same line.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let uri = format!(
        "qemu+tls://127.0.0.1:{closed}/system?pkipath={}",
        pki.display()
    );
    let err = one_line_error(&banlieue(&d, &["pools", "-c", &uri]).await);
    assert!(
        err.contains("connect to 127.0.0.1") && err.contains("refused"),
        "{err}"
    );
}

#[tokio::test]
async fn events_are_printed_as_they_happen() {
    let Some(d) = daemon().await else { return };
    let mut child = Command::new(BIN)
        .args([
            "libvirt",
            "events",
            "--count",
            "2",
            "--timeout",
            "60",
            "-o",
            "json",
            "-c",
            &d.virsh_uri(),
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn");
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let ready = tokio::time::timeout(Duration::from_secs(30), stderr.next_line())
        .await
        .expect("subscribed in time")
        .expect("read");
    assert_eq!(ready.as_deref(), Some("watching domain lifecycle events"));

    let xml = d.dir().join("ev.xml");
    std::fs::write(
        &xml,
        "<domain type='qemu'><name>banlieue-cli-events</name><memory unit='MiB'>64</memory>\
         <vcpu>1</vcpu><os><type arch='x86_64' machine='pc'>hvm</type></os></domain>",
    )
    .expect("xml");
    d.virsh(["define", xml.to_str().expect("utf-8")])
        .await
        .expect("define");
    d.virsh(["undefine", "banlieue-cli-events"])
        .await
        .expect("undefine");
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("exits after two events")
        .expect("output");
    let text = stdout_ok(&out);
    let events: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    let seen: Vec<(&str, &str)> = events
        .iter()
        .map(|e| {
            (
                e["domain"].as_str().expect("domain"),
                e["event"].as_str().expect("event"),
            )
        })
        .collect();
    assert_eq!(
        seen,
        vec![
            ("banlieue-cli-events", "defined"),
            ("banlieue-cli-events", "undefined")
        ]
    );
}

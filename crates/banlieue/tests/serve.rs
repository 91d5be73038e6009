//! `banlieue controller` as a process against a real API server: JSON logs on request, the
//! /metrics, /healthz and /readyz endpoint, and a clean exit on SIGTERM.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use banlieue_api::{Provider, ProviderClass};
use banlieue_dev::objects;
use banlieue_testenv::control_plane::ControlPlane;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};

const BIN: &str = env!("CARGO_BIN_EXE_banlieue");

fn get(address: &str, path: &str) -> String {
    let mut stream = TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    reply
}

/// `banlieue --log-format json ARGS --metrics-address 127.0.0.1:0` as the control plane's
/// admin, logging into `log_dir`; and the address it serves on, once it has said so.
fn serve(
    control_plane: &ControlPlane,
    args: &[&str],
    log_dir: &std::path::Path,
) -> (std::process::Child, String) {
    let kubeconfig = control_plane
        .kubeconfig("admin")
        .expect("a local control plane");
    let log_path = log_dir.join("serve.log");
    let child = Command::new(BIN)
        .args(["--log-format", "json"])
        .args(args)
        .args(["--metrics-address", "127.0.0.1:0"])
        .env("KUBECONFIG", kubeconfig)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let address = served_address(&log_path, args[0]);
    (child, address)
}

/// The endpoint's address, from the JSON log at `log_path` (every line must be a JSON object).
fn served_address(log_path: &std::path::Path, who: &str) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let log = std::fs::read_to_string(log_path).unwrap_or_default();
        let mut found = None;
        for line in log.lines() {
            let record: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
            assert!(record.get("level").is_some(), "{line}");
            if let Some(address) = record.pointer("/fields/address").and_then(|a| a.as_str()) {
                found = Some(address.to_owned());
            }
        }
        if let Some(address) = found {
            return address;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{who} never said where it serves:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn stop(child: &mut std::process::Child, who: &str) {
    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{who} exited {status} on SIGTERM");
}

#[tokio::test(flavor = "multi_thread")]
async fn controller_serves_metrics_and_health_and_stops_on_sigterm() {
    let control_plane = ControlPlane::shared().await.expect("control plane");
    // As installed (deploy/namespace.yaml): the controller takes its leader Lease in its own
    // namespace before it starts any role or serves anything.
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> =
        Api::all(control_plane.client().expect("admin client"));
    let namespace: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "banlieue-system"}}))
            .expect("a namespace");
    match namespaces.create(&PostParams::default(), &namespace).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("create banlieue-system: {e}"),
    }
    let log_dir = tempfile::tempdir().unwrap();
    let (mut child, address) = serve(control_plane, &["controller"], log_dir.path());
    assert!(get(&address, "/healthz").starts_with("HTTP/1.1 200"));
    assert!(get(&address, "/readyz").starts_with("HTTP/1.1 200"));
    let metrics = get(&address, "/metrics");
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    // Labelled families (bind latency by pool, members by phase) appear with their first
    // series; an unlabelled counter is there from the start.
    let family = "banlieue_controller_bind_conflicts";
    assert!(
        metrics.contains(family),
        "{family} missing from:\n{metrics}"
    );
    assert!(get(&address, "/nope").starts_with("HTTP/1.1 404"));

    stop(&mut child, "the controller");
}

/// The provider workload serves its own families, before it has reached its host.
#[tokio::test(flavor = "multi_thread")]
async fn provider_serves_its_metrics() {
    let control_plane = ControlPlane::shared().await.expect("control plane");
    let client = control_plane.client().unwrap();
    let namespace = control_plane.fresh_namespace().await.unwrap();
    let apply = PatchParams::apply("banlieue-serve-test").force();
    let class = objects::provider_class("banlieue:test");
    Api::<ProviderClass>::all(client.clone())
        .patch(&class.name_any(), &apply, &Patch::Apply(&class))
        .await
        .unwrap();
    // Nothing listens there: the provider never reaches a host in this test.
    let mut provider = objects::provider("qemu+tls://127.0.0.1:9/system");
    provider.metadata.namespace = Some(namespace.clone());
    Api::<Provider>::namespaced(client, &namespace)
        .create(&PostParams::default(), &provider)
        .await
        .unwrap();

    let log_dir = tempfile::tempdir().unwrap();
    let args = [
        "provider",
        "libvirt",
        "run",
        "--provider",
        objects::PROVIDER,
        "--namespace",
        &namespace,
    ];
    let (mut child, address) = serve(control_plane, &args, log_dir.path());
    let metrics = get(&address, "/metrics");
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    for sample in [
        "banlieue_provider_libvirt_host_connected 0",
        "banlieue_provider_libvirt_domains_defined_total 0",
        "banlieue_provider_libvirt_machine_ready_seconds_count 0",
    ] {
        assert!(
            metrics.lines().any(|line| line == sample),
            "{sample} missing from:\n{metrics}"
        );
    }
    assert!(
        !metrics.contains("banlieue_controller_"),
        "the provider workload runs no controller:\n{metrics}"
    );
    stop(&mut child, "the provider");
}

#[test]
fn errors_are_one_line_with_a_non_zero_exit() {
    let output = Command::new(BIN)
        .args(["bootstrap"])
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("HOME", "/nonexistent")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");

    let usage = Command::new(BIN)
        .args(["provider", "libvirt", "import", "--vmimage", "x"])
        .output()
        .unwrap();
    assert_eq!(
        usage.status.code(),
        Some(2),
        "a usage error is clap's exit code 2"
    );
    assert!(String::from_utf8_lossy(&usage.stderr).contains("--provider"));
}

#[test]
fn help_names_every_subcommand() {
    let output = Command::new(BIN).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&output.stdout);
    for command in ["controller", "provider", "crds", "bootstrap", "libvirt"] {
        assert!(help.contains(command), "--help lacks {command}:\n{help}");
    }
    // `dev up` is the development binary's (banlieue-dev), never the product's.
    assert!(!help.contains("\n  dev "), "--help names dev:\n{help}");
    for path in [
        vec!["provider", "libvirt", "run", "--help"],
        vec!["provider", "libvirt", "import", "--help"],
        vec!["libvirt", "version", "--help"],
    ] {
        let output = Command::new(BIN).args(&path).output().unwrap();
        assert!(output.status.success(), "{path:?}");
    }
}

#[test]
fn crds_prints_what_deploy_holds() {
    let output = Command::new(BIN).arg("crds").output().unwrap();
    assert!(output.status.success());
    let printed = String::from_utf8(output.stdout).unwrap();
    let out = tempfile::tempdir().unwrap();
    let status = Command::new(BIN)
        .args(["crds", "--out"])
        .arg(out.path())
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let deploy = banlieue_testenv::repo_path("deploy/crds");
    for crd in banlieue_api::crds() {
        let name = format!("{}.yaml", crd.metadata.name.unwrap());
        let written = std::fs::read_to_string(out.path().join(&name)).unwrap();
        let shipped = std::fs::read_to_string(deploy.join(&name)).unwrap();
        assert_eq!(written, shipped, "{name} differs from deploy/crds");
        assert!(
            printed.contains(written.trim()),
            "{name} missing from `banlieue crds`"
        );
    }
}

//! A dropped node leaves nothing behind on the host: no process (containers and their
//! daemonized shims included), mount, cgroup, socket or directory, and the kernel settings the
//! kubelet changes are back. Its own test binary, so no other node shares the host meanwhile.

use std::path::Path;
use std::time::Duration;

use banlieue_testenv::control_plane::{ControlPlane, wait_for};
use banlieue_testenv::node::PAUSE_IMAGE;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::json;

const SYSCTLS: [&str; 3] = [
    "vm/overcommit_memory",
    "kernel/panic",
    "kernel/panic_on_oops",
];

fn sysctls() -> Vec<String> {
    SYSCTLS
        .iter()
        .map(|name| std::fs::read_to_string(Path::new("/proc/sys").join(name)).expect("sysctl"))
        .collect()
}

/// PIDs of the processes whose command line names `dir`.
fn processes_naming(dir: &Path) -> Vec<u32> {
    let needle = dir.display().to_string();
    std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains(&needle))
        })
        .collect()
}

fn mounts_under(dir: &Path) -> Vec<String> {
    let prefix = format!("{}/", dir.display());
    std::fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter(|mount| mount.starts_with(&prefix))
        .map(str::to_owned)
        .collect()
}

/// Where nodes register the host state they share (see `node/host-state.sh`).
const HOST_STATE: &str = "/run/banlieue-test-nodes";

/// The nodes registered in [`HOST_STATE`]: each one's directory, whether it still exists and
/// the processes that name it (what keeps a finished test's node registered).
fn registered_nodes() -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(HOST_STATE) else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            let name = path.file_name()?.to_str()?;
            if !name.starts_with("node-") {
                return None;
            }
            let dir = std::fs::read_to_string(&path).ok()?;
            let dir = Path::new(dir.trim());
            Some(format!(
                "{} (exists: {}, processes: {:?})",
                dir.display(),
                dir.exists(),
                processes_naming(dir)
            ))
        })
        .collect()
}

#[tokio::test]
async fn a_dropped_node_leaves_nothing_behind() {
    // The node of a test binary that just ended may still be tearing down: its janitor outlives
    // the binary, which waits up to two minutes for it, and a node that ran guests or many pods
    // takes that long. The machine's own settings are what is left once it is done.
    if let Err(error) = wait_for(
        "other test nodes to be gone",
        Duration::from_secs(300),
        || async { Ok((!Path::new(HOST_STATE).exists()).then_some(())) },
    )
    .await
    {
        panic!("{error}; still registered: {:?}", registered_nodes());
    }
    let before = sysctls();
    let host_paths = [
        "/run/containerd",
        "/var/lib/kubelet",
        "/var/log/containers",
        HOST_STATE,
    ];
    let existed: Vec<bool> = host_paths.iter().map(|p| Path::new(p).exists()).collect();
    let cp = ControlPlane::start_with_node()
        .await
        .expect("control plane with a node");
    let node = cp.node().expect("a node");
    let dir = node.state_dir().to_owned();
    let cgroup = node.cgroup().to_owned();
    // On these machines the kubelet changes all three (0 1 0 becomes 1 10 1).
    eprintln!("kernel settings: {before:?} while running: {:?}", sysctls());

    // A running pod: a shim, its sandbox and container, their mounts and cgroups.
    let pods: Api<Pod> = Api::namespaced(cp.client().expect("client"), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "sleeper"},
        "spec": {"containers": [{"name": "pause", "image": PAUSE_IMAGE, "imagePullPolicy": "Never"}]}
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create the pod");
    wait_for("the pod to run", Duration::from_secs(60), || {
        let pods = pods.clone();
        async move {
            let pod = pods.get("sleeper").await?;
            let phase = pod.status.and_then(|status| status.phase);
            Ok((phase.as_deref() == Some("Running")).then_some(()))
        }
    })
    .await
    .expect("pod running");
    let shims: Vec<u32> = processes_naming(&dir)
        .into_iter()
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/exe"))
                .is_ok_and(|exe| exe.ends_with("containerd-shim-runc-v2"))
        })
        .collect();
    assert!(!shims.is_empty(), "a shim runs the pod");
    assert!(
        !mounts_under(&dir).is_empty(),
        "the pod's rootfs is mounted"
    );

    let dropped = std::time::Instant::now();
    drop(cp);
    eprintln!(
        "teardown (node with one pod, then control plane): {:.2} s",
        dropped.elapsed().as_secs_f64()
    );

    assert_eq!(processes_naming(&dir), Vec::<u32>::new(), "processes left");
    assert_eq!(mounts_under(&dir), Vec::<String>::new(), "mounts left");
    assert!(!dir.exists(), "{} left", dir.display());
    let cgroups: Vec<_> = std::fs::read_dir("/sys/fs/cgroup")
        .expect("/sys/fs/cgroup")
        .filter_map(|entry| Some(entry.ok()?.path().join(&cgroup)))
        .filter(|path| path.exists())
        .collect();
    assert!(cgroups.is_empty(), "cgroups left: {cgroups:?}");
    assert_eq!(sysctls(), before, "kernel settings not restored");
    let exist: Vec<bool> = host_paths.iter().map(|p| Path::new(p).exists()).collect();
    assert_eq!(exist, existed, "{host_paths:?} before and after");
}

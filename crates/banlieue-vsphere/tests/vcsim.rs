//! The client against a real vim25 server: vcsim (govmomi's simulator) on loopback, with its
//! own CA and one user, 2 datacenters × 2 clusters × 1 host, 1 VM per cluster.

use std::time::Duration;

use banlieue_testenv::vcsim::{Vcsim, VcsimOptions};
use banlieue_vsphere::{
    ChangeOp, Client, CloneSpec, Credentials, Error, ManagedObjectRef, PowerState,
    PropertyFilterSpec, PropertyValue, ReconfigSpec, extra_config_path,
};

/// The bound on any one task in these tests: vcsim finishes them in milliseconds.
const TASK_DEADLINE: Duration = Duration::from_secs(30);

async fn start() -> Option<Vcsim> {
    if !Vcsim::available().expect("vcsim") {
        return None;
    }
    Some(
        Vcsim::start(VcsimOptions::new())
            .await
            .expect("start vcsim"),
    )
}

async fn connect(vcsim: &Vcsim) -> Client {
    Client::connect(
        vcsim.url(),
        vcsim.ca_pem(),
        Credentials::new(vcsim.username(), vcsim.password()),
    )
    .await
    .expect("connect and log in")
}

#[tokio::test]
async fn login_reads_the_service_content_and_opens_a_session() {
    let Some(vcsim) = start().await else { return };
    let client = connect(&vcsim).await;
    let about = &client.service_content().about;
    assert_eq!(about.api_type, "VirtualCenter");
    assert!(about.instance_uuid.is_some());
    // vcsim's VPX model reports 6.5: the client speaks the older of that and its own.
    assert_eq!(client.api_version(), about.api_version);
    let session = client.current_session().await.expect("current session");
    assert_eq!(
        session.map(|s| s.user_name).as_deref(),
        Some(vcsim.username())
    );
    let printed = format!("{client:?}");
    assert!(
        !printed.contains(vcsim.password()) && !printed.contains("vmware_soap_session"),
        "Debug shows no secret: {printed}"
    );
    client.logout().await.expect("logout");
}

#[tokio::test]
async fn a_wrong_password_is_an_invalid_login_fault() {
    let Some(vcsim) = start().await else { return };
    let error = Client::connect(
        vcsim.url(),
        vcsim.ca_pem(),
        Credentials::new(vcsim.username(), "not-the-password"),
    )
    .await
    .expect_err("a wrong password must not log in");
    let fault = error
        .fault()
        .unwrap_or_else(|| panic!("not a fault: {error}"));
    assert_eq!(fault.kind, "InvalidLogin", "{error}");
    assert!(
        matches!(
            error,
            Error::Fault {
                method: "Login",
                ..
            }
        ),
        "{error}"
    );
}

#[tokio::test]
async fn a_certificate_from_another_ca_is_refused() {
    let Some(vcsim) = start().await else { return };
    let Some(other) = start().await else { return };
    let error = Client::connect(
        vcsim.url(),
        other.ca_pem(),
        Credentials::new(vcsim.username(), vcsim.password()),
    )
    .await
    .expect_err("vcsim's certificate is not signed by the other CA");
    assert!(matches!(error, Error::Http { .. }), "{error}");
}

#[tokio::test]
async fn an_expired_session_logs_in_again_once() {
    let Some(vcsim) = start().await else { return };
    let client = connect(&vcsim).await;
    let before = client
        .current_session()
        .await
        .expect("session")
        .expect("logged in");
    // Logging out from a clone ends the session every clone shares, as an expiry would.
    client.clone().logout().await.expect("logout");
    let datacenters = client
        .datacenters()
        .await
        .expect("a call after the session ended");
    assert_eq!(datacenters.len(), 2);
    let after = client
        .current_session()
        .await
        .expect("session")
        .expect("logged in again");
    assert_ne!(before.key, after.key, "a new session");
}

#[tokio::test]
async fn dropping_vcsim_stops_it() {
    let Some(vcsim) = start().await else { return };
    let pids = vcsim.pids();
    assert!(!pids.is_empty());
    drop(vcsim);
    for (name, pid) in pids {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists()
                || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .is_ok_and(|stat| stat.contains(") Z ")),
            "{name} (PID {pid}) still runs"
        );
    }
}

#[tokio::test]
async fn the_inventory_matches_the_shape_vcsim_was_started_with() {
    let Some(vcsim) = start().await else { return };
    let client = connect(&vcsim).await;
    let mut found = Vec::new();
    for dc in client.datacenters().await.expect("datacenters") {
        assert_eq!(dc.vm_folder.kind, "Folder");
        for cluster in client.clusters(&dc.moref).await.expect("clusters") {
            assert_eq!(cluster.resource_pool.kind, "ResourcePool");
            // Its one host's memory and threads, what the scheduler limits a cluster to.
            assert!(
                cluster.total_memory_bytes.is_some_and(|b| b >= 1 << 30),
                "{cluster:?}"
            );
            assert!(cluster.cpu_threads.is_some_and(|n| n > 0), "{cluster:?}");
            found.push(format!("{}/{}", dc.name, cluster.name));
        }
    }
    assert_eq!(
        found,
        ["DC0/DC0_C0", "DC0/DC0_C1", "DC1/DC1_C0", "DC1/DC1_C1"]
    );

    let by_path = client
        .find_by_inventory_path("DC1/vm/DC1_C1_RP0_VM0")
        .await
        .expect("find by path")
        .expect("the model VM exists");
    let by_name = client.vm_by_name("DC1_C1_RP0_VM0").await.expect("by name");
    assert_eq!(by_name.as_ref(), Some(&by_path));
    let cluster = client
        .find_by_inventory_path("DC0/host/DC0_C1")
        .await
        .expect("find by path");
    assert_eq!(
        cluster.map(|c| c.kind).as_deref(),
        Some("ClusterComputeResource")
    );
    // The names the provider's tests rely on: a cluster's host, the datastore, the root pool.
    for (path, kind) in [
        ("DC0/host/DC0_C1/DC0_C1_H0", "HostSystem"),
        ("DC1/datastore/LocalDS_0", "Datastore"),
        ("DC0/host/DC0_C1/Resources", "ResourcePool"),
    ] {
        let found = client
            .find_by_inventory_path(path)
            .await
            .expect("find by path");
        assert_eq!(found.map(|r| r.kind).as_deref(), Some(kind), "{path}");
    }
    assert_eq!(
        client
            .find_by_inventory_path("DC9/vm/nothing")
            .await
            .expect("find"),
        None
    );
    assert_eq!(client.vm_by_name("nothing").await.expect("by name"), None);
}

async fn wait(client: &Client, task: ManagedObjectRef) -> Result<Option<ManagedObjectRef>, Error> {
    tokio::time::timeout(TASK_DEADLINE, client.wait_task(&task))
        .await
        .unwrap_or_else(|_| panic!("{task} did not end within {TASK_DEADLINE:?}"))
}

/// Clones the model VM `DC0_C0_RP0_VM0` as `name` into cluster DC0_C1's root pool.
async fn clone_worker(
    client: &Client,
    name: &str,
    extra_config: &[(&str, &str)],
) -> ManagedObjectRef {
    let dc = client
        .datacenters()
        .await
        .expect("datacenters")
        .into_iter()
        .find(|dc| dc.name == "DC0")
        .expect("DC0");
    let cluster = client
        .clusters(&dc.moref)
        .await
        .expect("clusters")
        .into_iter()
        .find(|c| c.name == "DC0_C1")
        .expect("DC0_C1");
    let template = client
        .find_by_inventory_path("DC0/vm/DC0_C0_RP0_VM0")
        .await
        .expect("find")
        .expect("the template VM");
    let spec = CloneSpec {
        name: name.to_owned(),
        folder: dc.vm_folder.clone(),
        pool: cluster.resource_pool.clone(),
        host: None,
        datastore: None,
        power_on: false,
        extra_config: extra_config
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    };
    let task = client
        .clone_vm(&template, &spec)
        .await
        .expect("start the clone");
    let vm = wait(client, task)
        .await
        .expect("clone")
        .expect("the clone's VM");
    assert_eq!(vm.kind, "VirtualMachine");
    vm
}

#[tokio::test]
async fn a_clone_carries_its_guestinfo_powers_on_and_off_and_is_destroyed() {
    let Some(vcsim) = start().await else { return };
    let client = connect(&vcsim).await;
    // "#cloud-config\nhostname: worker-1\n", base64.
    let userdata = "I2Nsb3VkLWNvbmZpZwpob3N0bmFtZTogd29ya2VyLTEK";
    let vm = clone_worker(
        &client,
        "worker-1",
        &[
            ("guestinfo.userdata", userdata),
            ("guestinfo.userdata.encoding", "base64"),
        ],
    )
    .await;
    let info = client.vm_info(&vm).await.expect("vm info");
    assert_eq!(info.name, "worker-1");
    assert_eq!(info.power_state, PowerState::PoweredOff);
    assert_eq!(
        info.extra_config
            .get("guestinfo.userdata")
            .map(String::as_str),
        Some(userdata)
    );
    assert_eq!(
        info.extra_config
            .get("guestinfo.userdata.encoding")
            .map(String::as_str),
        Some("base64")
    );
    assert_eq!(
        client
            .find_by_inventory_path("DC0/vm/worker-1")
            .await
            .expect("find"),
        Some(vm.clone())
    );

    wait(&client, client.power_on_vm(&vm).await.expect("power on"))
        .await
        .expect("powered on");
    assert_eq!(
        client.vm_info(&vm).await.expect("info").power_state,
        PowerState::PoweredOn
    );
    // vcsim's way for a test to play VMware Tools: `SET.guest.ipAddress` sets the first NIC's
    // address in guest.net.
    let reconfigure = ReconfigSpec {
        num_cpus: Some(2),
        memory_mb: Some(2048),
        extra_config: vec![("SET.guest.ipAddress".into(), "192.0.2.10".into())],
        ..ReconfigSpec::default()
    };
    wait(
        &client,
        client
            .reconfigure_vm(&vm, &reconfigure)
            .await
            .expect("reconfigure"),
    )
    .await
    .expect("reconfigured");
    let info = client.vm_info(&vm).await.expect("info");
    let addresses: Vec<_> = info
        .guest_nics
        .iter()
        .flat_map(|n| n.ip_addresses.clone())
        .collect();
    assert_eq!(addresses, ["192.0.2.10"]);
    let hardware = client
        .retrieve_one(&vm, &["config.hardware.numCPU", "config.hardware.memoryMB"])
        .await
        .expect("hardware");
    assert_eq!(
        hardware.get("config.hardware.numCPU"),
        Some(&PropertyValue::Int(2))
    );
    assert_eq!(
        hardware.get("config.hardware.memoryMB"),
        Some(&PropertyValue::Int(2048))
    );

    wait(&client, client.power_off_vm(&vm).await.expect("power off"))
        .await
        .expect("powered off");
    assert_eq!(
        client.vm_info(&vm).await.expect("info").power_state,
        PowerState::PoweredOff
    );
    // Powering off a VM that is off fails in the task, with the fault typed.
    let task = client
        .power_off_vm(&vm)
        .await
        .expect("start the second power-off");
    let error = wait(&client, task.clone()).await.expect_err("already off");
    let Error::Task {
        task: failed,
        fault,
    } = &error
    else {
        panic!("not a task error: {error}");
    };
    assert_eq!((failed, fault.kind.as_str()), (&task, "InvalidPowerState"));

    wait(&client, client.destroy(&vm).await.expect("destroy"))
        .await
        .expect("destroyed");
    assert_eq!(
        client
            .find_by_inventory_path("DC0/vm/worker-1")
            .await
            .expect("find"),
        None
    );
    assert_eq!(client.vm_by_name("worker-1").await.expect("by name"), None);
    // The VM is gone: the server refuses the call itself, with the fault typed.
    let error = client.destroy(&vm).await.expect_err("destroy a missing VM");
    assert_eq!(
        error.fault().map(|f| f.kind.as_str()),
        Some("ManagedObjectNotFound"),
        "{error}"
    );
}

#[tokio::test]
async fn wait_for_updates_sees_guestinfo_set_by_another_session() {
    let Some(vcsim) = start().await else { return };
    let watcher = connect(&vcsim).await;
    let guest = connect(&vcsim).await;
    let vm = clone_worker(
        &watcher,
        "worker-2",
        &[("guestinfo.banlieue.phase", "booting")],
    )
    .await;

    let phase = extra_config_path("guestinfo.banlieue.phase");
    let collector = watcher
        .create_property_collector()
        .await
        .expect("collector");
    let filter = watcher
        .create_filter(
            &collector,
            &PropertyFilterSpec::object(&vm, &[phase.as_str()]),
            false,
        )
        .await
        .expect("filter");
    let initial = watcher
        .wait_for_updates(&collector, None, Duration::ZERO)
        .await
        .expect("initial state")
        .expect("an initial update");
    let values: Vec<_> = initial
        .object_updates()
        .flat_map(|o| o.changes.iter())
        .map(|c| (c.path.clone(), c.value.clone()))
        .collect();
    assert_eq!(
        values,
        [(
            phase.clone(),
            Some(PropertyValue::OptionValue {
                key: "guestinfo.banlieue.phase".into(),
                value: Box::new(PropertyValue::String("booting".into())),
            })
        )]
    );

    // The other session plays the guest: another key first, which the filter must not report,
    // then the phase.
    let set = |key: &str, value: &str| ReconfigSpec {
        extra_config: vec![(key.to_owned(), value.to_owned())],
        ..ReconfigSpec::default()
    };
    let guest_side = async {
        for (key, value) in [
            ("guestinfo.other", "x"),
            ("guestinfo.banlieue.phase", "ready"),
        ] {
            let task = guest
                .reconfigure_vm(&vm, &set(key, value))
                .await
                .expect("reconfigure");
            wait(&guest, task).await.expect("reconfigured");
        }
    };
    let watch = async {
        let mut version = initial.version.clone();
        let mut seen = Vec::new();
        // Each wait returns what changed so far; the phase may come in a later one.
        while !seen.iter().any(|(_, v): &(String, Option<PropertyValue>)| {
            v.as_ref().and_then(|v| match v {
                PropertyValue::OptionValue { value, .. } => value.text(),
                _ => None,
            }) == Some("ready")
        }) {
            let update = watcher
                .wait_for_updates(&collector, Some(&version), Duration::from_secs(20))
                .await
                .expect("wait")
                .expect("an update before the wait's deadline");
            version = update.version.clone();
            for object in update.object_updates() {
                assert_eq!(object.obj, vm);
                for change in &object.changes {
                    assert_eq!(change.op, ChangeOp::Assign);
                    seen.push((change.path.clone(), change.value.clone()));
                }
            }
        }
        seen
    };
    let ((), seen) = tokio::join!(guest_side, watch);
    assert!(
        seen.iter().all(|(path, _)| *path == phase),
        "only the phase: {seen:?}"
    );

    watcher
        .destroy_filter(&filter)
        .await
        .expect("destroy filter");
    watcher
        .destroy_property_collector(&collector)
        .await
        .expect("destroy collector");
}

/// The session keys the server lists (`SessionManager.sessionList`), as `observer` sees them.
async fn session_keys(observer: &Client) -> Vec<String> {
    let sm = observer.service_content().session_manager.clone();
    let content = observer
        .retrieve_one(&sm, &["sessionList"])
        .await
        .expect("sessionList");
    match content.get("sessionList") {
        Some(PropertyValue::Other(list)) => list
            .children()
            .iter()
            .filter_map(|s| s.child_text("key").map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    }
}

#[tokio::test]
async fn the_keep_alive_logs_in_again_when_the_session_is_gone() {
    let Some(vcsim) = start().await else { return };
    let client = connect(&vcsim).await;
    let observer = connect(&vcsim).await;
    let first = client
        .current_session()
        .await
        .expect("session")
        .expect("logged in")
        .key;
    assert!(session_keys(&observer).await.contains(&first));

    let _keep_alive = client.keep_alive(Duration::from_millis(100));
    client.clone().logout().await.expect("logout");
    // Only the keep-alive uses `client` from here on: a new session of its making shows up.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let observer_key = observer
        .current_session()
        .await
        .expect("session")
        .expect("in")
        .key;
    loop {
        let keys = session_keys(&observer).await;
        if keys.iter().any(|k| *k != first && *k != observer_key) {
            assert!(
                !keys.contains(&first),
                "the logged-out session is gone: {keys:?}"
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no new session within 10 s: {keys:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

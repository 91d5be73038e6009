//! The client against a real vim25 server: vcsim (govmomi's simulator) on loopback, with its
//! own CA and one user, 2 datacenters × 2 clusters × 1 host, 1 VM per cluster.

use banlieue_testenv::vcsim::{Vcsim, VcsimOptions};
use banlieue_vsphere::{Client, Credentials, Error};

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
    assert_eq!(
        client
            .find_by_inventory_path("DC9/vm/nothing")
            .await
            .expect("find"),
        None
    );
    assert_eq!(client.vm_by_name("nothing").await.expect("by name"), None);
}

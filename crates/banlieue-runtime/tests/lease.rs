//! The elector against a real API server: acquisition, standing by, release and hand-over,
//! and loss of leadership, with short timings so each test takes seconds.

use std::time::{Duration, Instant};

use banlieue_runtime::leader::{LeaderElector, Leadership, LeaseConfig};
use banlieue_testenv::control_plane::ControlPlane;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

type TestResult<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const LEASE: &str = "test-lease";

/// 4 s lease, 3 s renew deadline, 1/4 s retries: client-go's proportions, shorter.
fn config(namespace: &str, identity: &str) -> LeaseConfig {
    LeaseConfig {
        lease_duration: Duration::from_secs(4),
        renew_deadline: Duration::from_secs(3),
        retry_period: Duration::from_millis(250),
        ..LeaseConfig::new(namespace, LEASE, identity)
    }
}

async fn setup() -> TestResult<(Client, String)> {
    let cp = ControlPlane::shared().await?;
    Ok((cp.client()?, cp.fresh_namespace().await?))
}

async fn spec(
    client: &Client,
    namespace: &str,
) -> TestResult<k8s_openapi::api::coordination::v1::LeaseSpec> {
    let lease = Api::<Lease>::namespaced(client.clone(), namespace)
        .get(LEASE)
        .await?;
    Ok(lease.spec.unwrap_or_default())
}

#[tokio::test]
async fn one_holds_the_other_stands_by_while_it_renews() -> TestResult {
    let (client, ns) = setup().await?;
    let a = LeaderElector::new(client.clone(), config(&ns, "a"))?
        .acquire()
        .await;
    let created = spec(&client, &ns).await?;
    assert_eq!(created.holder_identity.as_deref(), Some("a"));
    assert_eq!(created.lease_transitions, Some(0));
    assert_eq!(created.lease_duration_seconds, Some(4));

    let b = tokio::spawn(LeaderElector::new(client.clone(), config(&ns, "b"))?.acquire());
    // Three lease durations: a keeps renewing, so b never gets it.
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert!(!b.is_finished(), "b acquired a lease a kept renewing");
    assert!(!a.is_lost());
    let renewed = spec(&client, &ns).await?;
    assert_eq!(renewed.holder_identity.as_deref(), Some("a"));
    assert_eq!(renewed.acquire_time, created.acquire_time);
    assert!(renewed.renew_time > created.renew_time);

    hand_over(&client, &ns, a, b).await
}

/// `a` releases; `b`, standing by, takes the lease (within half a minute, far less than any
/// lease here) as the first transition, then releases it in turn.
async fn hand_over(
    client: &Client,
    ns: &str,
    a: Leadership,
    b: tokio::task::JoinHandle<Leadership>,
) -> TestResult {
    let released = Instant::now();
    a.release().await?;
    let b = tokio::time::timeout(Duration::from_secs(30), b).await??;
    println!("hand-over after a release: {:?}", released.elapsed());
    let taken = spec(client, ns).await?;
    assert_eq!(taken.holder_identity.as_deref(), Some("b"));
    assert_eq!(taken.lease_transitions, Some(1));
    b.release().await?;
    Ok(())
}

/// The hand-over on a release does not wait for the lease to expire. The lease here is long
/// (a minute) so that "before it would have expired" needs no tight clock: b can only get it
/// within the half-minute timeout because a released it, however slow the API server is.
#[tokio::test]
async fn a_release_hands_over_at_once_not_at_expiry() -> TestResult {
    let (client, ns) = setup().await?;
    let long = |identity| LeaseConfig {
        lease_duration: Duration::from_secs(60),
        ..config(&ns, identity)
    };
    let a = LeaderElector::new(client.clone(), long("a"))?
        .acquire()
        .await;
    let b = tokio::spawn(LeaderElector::new(client.clone(), long("b"))?.acquire());
    // b has read the lease held by a at least once before the release.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!b.is_finished(), "b acquired a lease a holds");

    hand_over(&client, &ns, a, b).await
}

#[tokio::test]
async fn an_abandoned_lease_is_taken_over_after_its_duration() -> TestResult {
    let (client, ns) = setup().await?;
    let a = LeaderElector::new(client.clone(), config(&ns, "a"))?
        .acquire()
        .await;
    // a dies without releasing: its renewing task is gone with it.
    drop(a);
    let abandoned = Instant::now();
    let b = tokio::time::timeout(
        Duration::from_secs(60),
        LeaderElector::new(client.clone(), config(&ns, "b"))?.acquire(),
    )
    .await?;
    let takeover = abandoned.elapsed();
    println!("takeover of an abandoned lease: {takeover:?}");
    // Not before the lease duration (the last renewal was at most a retry period before the
    // drop). How soon after depends on the API server's load, so only the lower bound, which
    // no load can break, is asserted; the figure is printed.
    assert!(takeover >= Duration::from_millis(3_700), "{takeover:?}");
    assert_eq!(spec(&client, &ns).await?.lease_transitions, Some(1));
    b.release().await?;
    Ok(())
}

#[tokio::test]
async fn a_holder_that_sees_another_holder_loses_at_once() -> TestResult {
    let (client, ns) = setup().await?;
    let a = LeaderElector::new(client.clone(), config(&ns, "a"))?
        .acquire()
        .await;
    Api::<Lease>::namespaced(client.clone(), &ns)
        .patch(
            LEASE,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"holderIdentity": "intruder"}})),
        )
        .await?;
    let seized = Instant::now();
    tokio::time::timeout(Duration::from_secs(2), a.lost()).await?;
    println!(
        "lost leadership {:?} after another took it",
        seized.elapsed()
    );
    // A lost lease is not released: it is the intruder's.
    a.release().await?;
    assert_eq!(
        spec(&client, &ns).await?.holder_identity.as_deref(),
        Some("intruder")
    );
    Ok(())
}

#[tokio::test]
async fn a_holder_that_cannot_renew_loses_at_its_renew_deadline() -> TestResult {
    let (admin, ns) = setup().await?;
    let cp = ControlPlane::shared().await?;
    Api::<ServiceAccount>::namespaced(admin.clone(), &ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "elector"}}))?,
        )
        .await?;
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": "elector"},
        "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                   "verbs": ["get", "create", "update"]}]
    }))?;
    Api::<Role>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &role)
        .await?;
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "elector"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "elector"},
        "subjects": [{"kind": "ServiceAccount", "name": "elector", "namespace": ns}]
    }))?;
    let bindings = Api::<RoleBinding>::namespaced(admin.clone(), &ns);
    bindings.create(&PostParams::default(), &binding).await?;
    let elector = cp.client_as_service_account(&ns, "elector").await?;

    // The authorizer learns of the binding through its informer: retry until it has.
    let a = tokio::time::timeout(
        Duration::from_secs(30),
        LeaderElector::new(elector, config(&ns, "a"))?.acquire(),
    )
    .await?;
    bindings.delete("elector", &DeleteParams::default()).await?;
    // The last renewal that can have succeeded started before the binding was gone.
    let revoked = Instant::now();
    tokio::time::timeout(Duration::from_secs(10), a.lost()).await?;
    let lost_after = revoked.elapsed();
    println!("lost leadership {lost_after:?} after its renewals were refused");
    // The renew deadline (3 s) after the last successful renewal, which started at most a
    // retry period before the revocation (or just after it, while the authorizer had not yet
    // seen the deletion): always before the lease (4 s) could expire for an observer that saw
    // that renewal.
    assert!(lost_after >= Duration::from_millis(2_500), "{lost_after:?}");
    assert!(lost_after < Duration::from_secs(4), "{lost_after:?}");
    Ok(())
}

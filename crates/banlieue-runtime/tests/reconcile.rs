//! The shared finalizer protocol and the guarded status patch against a real API server: each
//! write succeeds on the object as read and fails, without clobbering anything, when another
//! writer changed the object in between.

use banlieue_runtime::reconcile::{add_finalizer, patch_status, remove_finalizer};
use banlieue_testenv::control_plane::ControlPlane;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

type TestResult<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const OURS: &str = "banlieue.io/test-protection";
const THEIRS: &str = "example.com/other";

async fn setup() -> TestResult<(Client, String)> {
    let cp = ControlPlane::shared().await?;
    Ok((cp.client()?, cp.fresh_namespace().await?))
}

async fn config_map(
    api: &Api<ConfigMap>,
    name: &str,
    finalizers: &[&str],
) -> TestResult<ConfigMap> {
    let object = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            finalizers: Some(finalizers.iter().map(|f| (*f).to_owned()).collect()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    Ok(api.create(&PostParams::default(), &object).await?)
}

/// Another writer's merge patch of the finalizer list (what a careless controller does).
async fn set_finalizers(api: &Api<ConfigMap>, name: &str, finalizers: &[&str]) -> TestResult {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": finalizers}})),
    )
    .await?;
    Ok(())
}

/// Lets the object go: test objects hold finalizers nobody else removes.
async fn release(api: &Api<ConfigMap>, name: &str) -> TestResult {
    set_finalizers(api, name, &[]).await?;
    api.delete(name, &Default::default()).await?;
    Ok(())
}

#[tokio::test]
async fn a_finalizer_is_added_to_the_list_as_read_and_never_over_a_newer_one() -> TestResult {
    let (client, ns) = setup().await?;
    let api = Api::<ConfigMap>::namespaced(client, &ns);

    // No list at all, then a list of one.
    let empty = config_map(&api, "empty", &[]).await?;
    let added = add_finalizer(&api, &empty, OURS).await?;
    assert_eq!(added.finalizers(), [OURS]);
    let again = add_finalizer(&api, &added, OURS).await?;
    assert_eq!(
        again.resource_version(),
        added.resource_version(),
        "held already: nothing written"
    );
    let theirs = config_map(&api, "theirs", &[THEIRS]).await?;
    let added = add_finalizer(&api, &theirs, OURS).await?;
    assert_eq!(added.finalizers(), [THEIRS, OURS]);

    // Someone added theirs after our read of an empty list: ours must not replace it.
    let stale = config_map(&api, "raced", &[]).await?;
    set_finalizers(&api, "raced", &[THEIRS]).await?;
    let error = add_finalizer(&api, &stale, OURS)
        .await
        .expect_err("the list changed since it was read");
    assert!(error.is_stale(), "{error:?}");
    assert_eq!(api.get("raced").await?.finalizers(), [THEIRS]);
    // Read again, add again: both held.
    let fresh = api.get("raced").await?;
    assert_eq!(
        add_finalizer(&api, &fresh, OURS).await?.finalizers(),
        [THEIRS, OURS]
    );

    // Someone removed theirs from a list of two after our read.
    let stale = config_map(&api, "shrunk", &[THEIRS, "example.com/third"]).await?;
    set_finalizers(&api, "shrunk", &["example.com/third"]).await?;
    let error = add_finalizer(&api, &stale, OURS).await.expect_err("stale");
    assert!(error.is_stale(), "{error:?}");
    assert_eq!(api.get("shrunk").await?.finalizers(), ["example.com/third"]);

    for name in ["empty", "theirs", "raced", "shrunk"] {
        release(&api, name).await?;
    }
    Ok(())
}

#[tokio::test]
async fn a_finalizer_is_removed_only_where_it_was_seen() -> TestResult {
    let (client, ns) = setup().await?;
    let api = Api::<ConfigMap>::namespaced(client, &ns);

    let held = config_map(&api, "held", &[THEIRS, OURS]).await?;
    remove_finalizer(&api, &held, OURS).await?;
    assert_eq!(api.get("held").await?.finalizers(), [THEIRS]);
    // Not held (any more): nothing to do, not an error.
    remove_finalizer(&api, &held, "example.com/never").await?;

    // Theirs was removed after our read: ours moved from index 1 to 0, and removing index 1
    // of the old view must not happen.
    let stale = config_map(&api, "moved", &[THEIRS, OURS]).await?;
    set_finalizers(&api, "moved", &[OURS]).await?;
    let error = remove_finalizer(&api, &stale, OURS)
        .await
        .expect_err("ours moved since it was read");
    assert!(error.is_stale(), "{error:?}");
    assert_eq!(api.get("moved").await?.finalizers(), [OURS]);
    let fresh = api.get("moved").await?;
    remove_finalizer(&api, &fresh, OURS).await?;
    assert!(api.get("moved").await?.finalizers().is_empty());

    // A finalizer appended by someone else after our read survives our removal.
    let stale = config_map(&api, "appended", &[OURS]).await?;
    set_finalizers(&api, "appended", &[OURS, THEIRS]).await?;
    remove_finalizer(&api, &stale, OURS).await?;
    assert_eq!(api.get("appended").await?.finalizers(), [THEIRS]);

    // Removing the last finalizer of a deleted object lets it go; a second removal from the
    // same stale view finds it gone, which is not an error.
    let last = config_map(&api, "last", &[OURS]).await?;
    api.delete("last", &Default::default()).await?;
    remove_finalizer(&api, &last, OURS).await?;
    assert!(
        api.get_opt("last").await?.is_none(),
        "deleted once released"
    );
    remove_finalizer(&api, &last, OURS).await?;

    for name in ["held", "moved", "appended"] {
        release(&api, name).await?;
    }
    Ok(())
}

#[tokio::test]
async fn a_guarded_status_patch_never_overwrites_a_newer_object() -> TestResult {
    let (client, ns) = setup().await?;
    // A ConfigMap has no status subresource; a Service does, and it is namespaced and cheap.
    let api = Api::<k8s_openapi::api::core::v1::Service>::namespaced(client, &ns);
    let service: k8s_openapi::api::core::v1::Service = serde_json::from_value(json!({
        "metadata": {"name": "svc"},
        "spec": {"ports": [{"port": 80}]}
    }))?;
    let read = api.create(&PostParams::default(), &service).await?;
    let version = read.resource_version().ok_or("no resourceVersion")?;
    let status = json!({"conditions": [{"type": "Checked", "status": "True", "reason": "First",
        "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]});
    let written = patch_status(&api, "svc", &status, Some(&version)).await?;
    let written_version = written.resource_version().ok_or("no resourceVersion")?;
    assert_ne!(written_version, version);

    // A second write from the same (now stale) read is refused and changes nothing.
    let newer = json!({"conditions": [{"type": "Checked", "status": "False", "reason": "Second",
        "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]});
    let error = patch_status(&api, "svc", &newer, Some(&version))
        .await
        .expect_err("stale resourceVersion");
    assert!(error.is_stale(), "{error:?}");
    let stored = api.get("svc").await?;
    assert_eq!(stored.resource_version(), Some(written_version));
    let reason = |s: &k8s_openapi::api::core::v1::Service| {
        s.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.first())
            .map(|c| c.reason.clone())
    };
    assert_eq!(reason(&stored).as_deref(), Some("First"));
    // Unguarded, the same write goes through.
    let stored = patch_status(&api, "svc", &newer, None).await?;
    assert_eq!(reason(&stored).as_deref(), Some("Second"));
    Ok(())
}

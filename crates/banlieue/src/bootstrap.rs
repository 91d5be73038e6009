//! `banlieue bootstrap`: the namespace, CRDs, RBAC and controller Deployment, by server-side
//! apply. `deploy/admission/` is deliberately not applied: it is a separate, mandatory step.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, DynamicObject};

use crate::apply::{self, Applied, ApplyError};

include!(concat!(env!("OUT_DIR"), "/manifests.rs"));

/// How long a CRD may take to become Established before bootstrap gives up.
const CRD_ESTABLISHED_DEADLINE: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error(transparent)]
    Apply(#[from] ApplyError),
    #[error("CRD {0} did not become Established within {1:?}")]
    NotEstablished(String, Duration),
    #[error("reading CRD {0}: {1}")]
    Crd(String, #[source] kube::Error),
    #[error("encoding CRD {0}: {1}")]
    Encode(String, #[source] serde_json::Error),
}

/// Parses the embedded manifests of `table` into objects.
pub fn objects_of(table: &[(&str, &str)]) -> Result<Vec<DynamicObject>, ApplyError> {
    let mut objects = Vec::new();
    for (name, text) in table {
        objects.extend(apply::parse_documents(name, text)?);
    }
    Ok(objects)
}

/// The objects bootstrap applies, in dependency order: namespaces, CRDs (from the types, the
/// same ones `deploy/crds/` holds), access control, then workloads.
pub fn bootstrap_objects() -> Result<Vec<DynamicObject>, BootstrapError> {
    let mut objects = objects_of(BOOTSTRAP)?;
    for crd in banlieue_api::crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let value =
            serde_json::to_value(&crd).map_err(|e| BootstrapError::Encode(name.clone(), e))?;
        objects.push(serde_json::from_value(value).map_err(|e| BootstrapError::Encode(name, e))?);
    }
    objects.sort_by_key(|o| apply_rank(o.types.as_ref().map(|t| t.kind.as_str()).unwrap_or("")));
    Ok(objects)
}

/// Lower applies first; the sort is stable, so file order holds within a rank.
fn apply_rank(kind: &str) -> u8 {
    match kind {
        "Namespace" => 0,
        "CustomResourceDefinition" => 1,
        "ServiceAccount" | "ClusterRole" | "Role" => 2,
        "ClusterRoleBinding" | "RoleBinding" => 3,
        "ConfigMap" | "Secret" => 4,
        "Deployment" => 9,
        _ => 5,
    }
}

/// Applies every object of `objects`, waiting for each CRD to be Established before anything
/// that could depend on it; reports each object's change through `report`.
pub async fn apply_all(
    client: &Client,
    objects: &[DynamicObject],
    mut report: impl FnMut(&Applied),
) -> Result<Vec<Applied>, BootstrapError> {
    let mut applied = Vec::with_capacity(objects.len());
    for object in objects {
        let result = apply::apply(client, object).await?;
        report(&result);
        if object
            .types
            .as_ref()
            .is_some_and(|t| t.kind == "CustomResourceDefinition")
        {
            wait_established(client, object.metadata.name.as_deref().unwrap_or_default()).await?;
        }
        applied.push(result);
    }
    Ok(applied)
}

async fn wait_established(client: &Client, name: &str) -> Result<(), BootstrapError> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let deadline = tokio::time::Instant::now() + CRD_ESTABLISHED_DEADLINE;
    loop {
        let crd = crds
            .get(name)
            .await
            .map_err(|e| BootstrapError::Crd(name.into(), e))?;
        let established = crd
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        if established {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(BootstrapError::NotEstablished(
                name.into(),
                CRD_ESTABLISHED_DEADLINE,
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Printed after every bootstrap: the claim-subject policy is not optional.
pub const ADMISSION_REMINDER: &str = "\
deploy/admission/ was not applied. Applying it is a separate, mandatory step:
  kubectl apply -f deploy/admission/
then edit the issuers list in ConfigMap banlieue-claim-subject-policy. Until then claims are
not checked against their creator, and once applied with no ConfigMap every claim is denied.";

/// `banlieue bootstrap`.
pub async fn run(client: Client) -> Result<(), BootstrapError> {
    let objects = bootstrap_objects()?;
    let applied = apply_all(&client, &objects, |a| println!("{a}")).await?;
    let changed = applied
        .iter()
        .filter(|a| a.change != apply::Change::Unchanged)
        .count();
    println!("{changed} of {} objects changed", applied.len());
    eprintln!("{ADMISSION_REMINDER}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admission_is_not_part_of_bootstrap() {
        let objects = bootstrap_objects().unwrap();
        assert!(objects.iter().all(|o| {
            let kind = o.types.as_ref().map(|t| t.kind.as_str()).unwrap_or("");
            !kind.starts_with("ValidatingAdmissionPolicy")
        }));
        assert!(
            BOOTSTRAP
                .iter()
                .all(|(name, _)| !name.contains("admission"))
        );
    }

    #[test]
    fn crds_precede_what_uses_them() {
        let objects = bootstrap_objects().unwrap();
        let kinds: Vec<&str> = objects
            .iter()
            .map(|o| o.types.as_ref().map(|t| t.kind.as_str()).unwrap_or(""))
            .collect();
        let first_crd = kinds
            .iter()
            .position(|k| *k == "CustomResourceDefinition")
            .unwrap();
        assert_eq!(
            kinds
                .iter()
                .filter(|k| **k == "CustomResourceDefinition")
                .count(),
            banlieue_api::crds().len()
        );
        assert!(
            kinds[..first_crd].iter().all(|k| *k == "Namespace"),
            "{kinds:?}"
        );
        if let Some(deployment) = kinds.iter().position(|k| *k == "Deployment") {
            assert!(
                kinds[deployment..].iter().all(|k| *k == "Deployment"),
                "{kinds:?}"
            );
        }
    }
}

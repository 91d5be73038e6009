//! Server-side apply of manifests of any kind, reporting what each apply changed.

use kube::Client;
use kube::api::{Api, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::discovery::{self, Scope};

/// The field manager of everything `banlieue bootstrap` and `banlieue-dev` apply.
pub const FIELD_MANAGER: &str = "banlieue-bootstrap";

/// Largest manifest stream accepted, so a mistaken path cannot exhaust memory.
const MAX_MANIFEST_BYTES: usize = 16 << 20;

/// What one apply did to one object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    Created,
    Configured,
    Unchanged,
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Change::Created => "created",
            Change::Configured => "configured",
            Change::Unchanged => "unchanged",
        })
    }
}

/// One applied object: `kind/name` (namespaced as `kind/namespace/name`) and its change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    pub object: String,
    pub change: Change,
}

impl std::fmt::Display for Applied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.object, self.change)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("{source_name}: manifest is larger than {MAX_MANIFEST_BYTES} bytes")]
    TooLarge { source_name: String },
    #[error("{source_name}: not valid YAML: {message}")]
    Yaml {
        source_name: String,
        message: String,
    },
    #[error("{source_name}, document {index}: {reason}")]
    Invalid {
        source_name: String,
        index: usize,
        reason: String,
    },
    #[error("{object}: {source}")]
    Api {
        object: String,
        #[source]
        source: kube::Error,
    },
}

/// Parses a multi-document YAML stream into objects; empty documents are skipped.
pub fn parse_documents(source_name: &str, text: &str) -> Result<Vec<DynamicObject>, ApplyError> {
    if text.len() > MAX_MANIFEST_BYTES {
        return Err(ApplyError::TooLarge {
            source_name: source_name.to_owned(),
        });
    }
    let documents: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(text).map_err(|e| ApplyError::Yaml {
            source_name: source_name.to_owned(),
            message: e.to_string(),
        })?;
    let mut objects = Vec::new();
    for (index, document) in documents.into_iter().enumerate() {
        if document.is_null() {
            continue;
        }
        let invalid = |reason: String| ApplyError::Invalid {
            source_name: source_name.to_owned(),
            index,
            reason,
        };
        let object: DynamicObject =
            serde_json::from_value(document).map_err(|e| invalid(e.to_string()))?;
        if object.types.is_none() {
            return Err(invalid("no apiVersion or kind".into()));
        }
        if object.metadata.name.is_none() {
            return Err(invalid("no metadata.name".into()));
        }
        objects.push(object);
    }
    Ok(objects)
}

/// The API of `object`'s kind and namespace, and the object's label for messages.
async fn api_of(
    client: &Client,
    object: &DynamicObject,
) -> Result<(Api<DynamicObject>, String), ApplyError> {
    let types = object.types.as_ref();
    let kind = types.map(|t| t.kind.as_str()).unwrap_or("?");
    let name = object.metadata.name.clone().unwrap_or_default();
    let label = match &object.metadata.namespace {
        Some(ns) => format!("{kind}/{ns}/{name}"),
        None => format!("{kind}/{name}"),
    };
    let gvk = types
        .and_then(|t| GroupVersionKind::try_from(t).ok())
        .ok_or_else(|| ApplyError::Invalid {
            source_name: label.clone(),
            index: 0,
            reason: "apiVersion/kind unparseable".into(),
        })?;
    let (resource, capabilities) =
        discovery::pinned_kind(client, &gvk)
            .await
            .map_err(|source| ApplyError::Api {
                object: label.clone(),
                source,
            })?;
    let api = match capabilities.scope {
        Scope::Namespaced => {
            let ns = object.metadata.namespace.as_deref().unwrap_or("default");
            Api::namespaced_with(client.clone(), ns, &resource)
        }
        Scope::Cluster => Api::all_with(client.clone(), &resource),
    };
    Ok((api, label))
}

/// Server-side applies `object`, comparing resourceVersions to tell created, configured and
/// unchanged apart (an apply that changes nothing keeps the resourceVersion).
pub async fn apply(client: &Client, object: &DynamicObject) -> Result<Applied, ApplyError> {
    let (api, label) = api_of(client, object).await?;
    let name = object.metadata.name.clone().unwrap_or_default();
    let api_error = |source| ApplyError::Api {
        object: label.clone(),
        source,
    };
    let before = api
        .get_opt(&name)
        .await
        .map_err(api_error)?
        .and_then(|o| o.metadata.resource_version);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let after = api
        .patch(&name, &params, &Patch::Apply(object))
        .await
        .map_err(api_error)?
        .metadata
        .resource_version;
    let change = match before {
        None => Change::Created,
        Some(before) if Some(&before) == after.as_ref() => Change::Unchanged,
        Some(_) => Change::Configured,
    };
    Ok(Applied {
        object: label,
        change,
    })
}

/// Creates `object` unless an object of its name exists, which is then left as it is: for
/// what the site edits after the install (a policy's ConfigMap), which a second install must
/// not set back.
pub async fn create_if_absent(
    client: &Client,
    object: &DynamicObject,
) -> Result<Applied, ApplyError> {
    let (api, label) = api_of(client, object).await?;
    let change = match api.create(&PostParams::default(), object).await {
        Ok(_) => Change::Created,
        Err(kube::Error::Api(status)) if status.code == 409 => Change::Unchanged,
        Err(source) => {
            return Err(ApplyError::Api {
                object: label,
                source,
            });
        }
    };
    Ok(Applied {
        object: label,
        change,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_are_parsed_and_checked() {
        let objects = parse_documents(
            "t",
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: a\n---\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: b\n  namespace: a\n",
        )
        .unwrap();
        assert_eq!(objects.len(), 2);
        let err =
            parse_documents("t", "apiVersion: v1\nkind: Namespace\nmetadata: {}\n").unwrap_err();
        assert_eq!(err.to_string(), "t, document 0: no metadata.name");
        let err = parse_documents("t", "metadata:\n  name: x\n").unwrap_err();
        assert!(err.to_string().starts_with("t, document 0:"), "{err}");
        assert!(matches!(
            parse_documents("t", "a: [").unwrap_err(),
            ApplyError::Yaml { .. }
        ));
    }
}

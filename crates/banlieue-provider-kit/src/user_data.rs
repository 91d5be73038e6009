//! Which Secret a machine's `userDataSecretRef` may name, and reading it.
//!
//! A provider reads Secrets its machines' writers may not: only a Secret that opted in to be
//! user-data, and never one a Provider depends on (its own Provider's credentials or CA
//! source, or any Secret holding credentials), ends up in a guest. Otherwise anyone able to
//! write a VirtualMachine could have a host's client key or a vCenter password written into a
//! guest they control. Every backend applies this one policy.

use banlieue_api::{Provider, SecretKeySelector};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;

/// The label a Secret carries, with the value `"true"`, to be readable as user-data.
pub const USER_DATA_LABEL: &str = "banlieue.io/user-data";
/// The Secret type that makes a Secret readable as user-data, whatever its labels.
pub const USER_DATA_SECRET_TYPE: &str = "banlieue.io/user-data";

/// The keys that mark a Secret as a Provider's credentials, and how a refusal names them. A
/// workload may read only its own Provider (ADR-0063), so another Provider's credentials are
/// known by these keys.
pub const CREDENTIAL_KEYS: [(&str, &str); 2] = [
    ("tls.key", "a private key (tls.key)"),
    ("password", "a password (password)"),
];

/// What decides whether a Secret may be read for `userDataSecretRef`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserDataSecret<'a> {
    pub name: &'a str,
    pub type_: Option<&'a str>,
    /// The value of [`USER_DATA_LABEL`], if set.
    pub label: Option<&'a str>,
    /// The workload's own Provider, when it references this Secret (credentials or CA
    /// source).
    pub referenced_by: Option<&'a str>,
    /// The first of [`CREDENTIAL_KEYS`] the Secret holds.
    pub credential_key: Option<&'a str>,
}

/// Why reading user-data failed.
#[derive(Debug, thiserror::Error)]
pub enum UserDataError {
    /// The Secret may not be user-data: reported with
    /// [`USER_DATA_SECRET_REFUSED`](crate::reasons::USER_DATA_SECRET_REFUSED).
    #[error("{0}")]
    Refused(String),
    /// The Secret or its key does not exist.
    #[error("{0}")]
    Missing(String),
    /// The Kubernetes API failed.
    #[error("{what}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
}

/// The policy, on what is known of the Secret.
pub fn check(secret: &UserDataSecret<'_>) -> Result<(), UserDataError> {
    let refused = |why: String| {
        UserDataError::Refused(format!("userDataSecretRef: Secret {} {why}", secret.name))
    };
    if let Some(provider) = secret.referenced_by {
        return Err(refused(format!(
            "is referenced by Provider {provider} (its credentials or CA) and is never \
             used as user-data"
        )));
    }
    if let Some(key) = secret.credential_key {
        return Err(refused(format!(
            "holds {key}, as a Provider's credentials do, and is never used as user-data"
        )));
    }
    if secret.type_ == Some(USER_DATA_SECRET_TYPE) || secret.label == Some("true") {
        return Ok(());
    }
    Err(refused(format!(
        "has not opted in to be user-data: give it the label {USER_DATA_LABEL}=\"true\" or \
         the type {USER_DATA_SECRET_TYPE}"
    )))
}

/// Whether `provider` names the Secret `name` as its credentials or CA source.
pub fn referenced_by_provider(provider: &Provider, name: &str) -> bool {
    let conn = &provider.spec.connection;
    conn.credentials_ref.name == name
        || conn
            .ca_bundle
            .secret_ref
            .as_ref()
            .is_some_and(|s| s.name == name)
}

/// A machine's user-data: `inline`, or the bytes of the Secret key `secret_ref` names, read
/// from `namespace` under [`check`]. `provider` is the workload's own Provider, read first so
/// that its Secrets are refused before they are even read.
pub async fn read(
    kube: &kube::Client,
    namespace: &str,
    provider: &str,
    inline: Option<&str>,
    secret_ref: Option<&SecretKeySelector>,
) -> Result<Option<Vec<u8>>, UserDataError> {
    if let Some(inline) = inline {
        return Ok(Some(inline.as_bytes().to_vec()));
    }
    let Some(sel) = secret_ref else {
        return Ok(None);
    };
    let providers: Api<Provider> = Api::namespaced(kube.clone(), namespace);
    let own = providers
        .get(provider)
        .await
        .map_err(|source| UserDataError::Kube {
            what: format!("read Provider {provider}"),
            source,
        })?;
    if referenced_by_provider(&own, &sel.name) {
        check(&UserDataSecret {
            name: &sel.name,
            referenced_by: Some(provider),
            ..Default::default()
        })?;
    }
    let secrets: Api<Secret> = Api::namespaced(kube.clone(), namespace);
    let Some(secret) = secrets
        .get_opt(&sel.name)
        .await
        .map_err(|source| UserDataError::Kube {
            what: format!("read Secret {}", sel.name),
            source,
        })?
    else {
        return Err(UserDataError::Missing(format!(
            "Secret {:?} does not exist (userDataSecretRef)",
            sel.name
        )));
    };
    let mut data = secret.data.unwrap_or_default();
    check(&UserDataSecret {
        name: &sel.name,
        type_: secret.type_.as_deref(),
        label: secret
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(USER_DATA_LABEL))
            .map(String::as_str),
        referenced_by: None,
        credential_key: CREDENTIAL_KEYS
            .iter()
            .find(|(key, _)| data.contains_key(*key))
            .map(|(_, shown)| *shown),
    })?;
    data.remove(&sel.key).map(|b| Some(b.0)).ok_or_else(|| {
        UserDataError::Missing(format!(
            "Secret {:?} has no key {:?} (userDataSecretRef)",
            sel.name, sel.key
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_opted_in_secrets_no_provider_references_are_user_data() {
        let base = UserDataSecret {
            name: "cloud-init",
            ..Default::default()
        };
        let e = check(&base).unwrap_err();
        assert!(matches!(e, UserDataError::Refused(_)));
        assert!(
            e.to_string().contains("banlieue.io/user-data=\"true\""),
            "{e}"
        );
        assert!(
            check(&UserDataSecret {
                label: Some("false"),
                ..base.clone()
            })
            .is_err()
        );
        let labelled = UserDataSecret {
            label: Some("true"),
            ..base.clone()
        };
        assert!(check(&labelled).is_ok());
        let typed = UserDataSecret {
            type_: Some("banlieue.io/user-data"),
            ..base.clone()
        };
        assert!(check(&typed).is_ok());
        // Opting in never makes a Provider's Secret readable.
        let e = check(&UserDataSecret {
            referenced_by: Some("edge-7"),
            ..typed
        })
        .unwrap_err();
        assert!(matches!(e, UserDataError::Refused(_)));
        assert!(e.to_string().contains("Provider edge-7"), "{e}");
        // Nor any Provider's credentials, known by their keys.
        for (_, shown) in CREDENTIAL_KEYS {
            let e = check(&UserDataSecret {
                credential_key: Some(shown),
                ..labelled.clone()
            })
            .unwrap_err();
            assert!(matches!(e, UserDataError::Refused(_)));
            assert!(e.to_string().contains(&format!("holds {shown}")), "{e}");
        }
        assert!(
            check(&UserDataSecret {
                credential_key: Some(CREDENTIAL_KEYS[0].1),
                ..labelled
            })
            .unwrap_err()
            .to_string()
            .contains("holds a private key (tls.key)")
        );
    }
}

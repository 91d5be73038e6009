//! Reading what a Provider's connection names: a key of its credentials Secret and its CA
//! bundle (inline, a ConfigMap key or a Secret key), from the Provider's namespace. Every
//! backend fails with the same messages, and every value is bounded before it is held.

use banlieue_api::{Source, ValueOrSource};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;

/// The most bytes read from one Secret or ConfigMap key: a CA bundle, a certificate or a
/// password is far smaller, and the whole value is held in memory.
pub const MAX_KEY_BYTES: usize = 1 << 20;

/// A Secret, ConfigMap or key the Provider names is missing, unreadable or too large. Each
/// backend reports it as `CredentialsUnavailable`.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Unavailable(pub String);

/// The object `kind` `namespace/name`, or why it cannot be had.
pub async fn get<K>(api: &Api<K>, kind: &str, namespace: &str, name: &str) -> Result<K, Unavailable>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.get_opt(name).await {
        Ok(Some(o)) => Ok(o),
        Ok(None) => Err(Unavailable(format!(
            "{kind} {namespace}/{name} does not exist"
        ))),
        Err(e) => Err(Unavailable(format!(
            "read {kind} {namespace}/{name}: {}",
            banlieue_api::conditions::error_message(&e)
        ))),
    }
}

/// The Secret `namespace/name`.
pub async fn secret(
    kube: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Secret, Unavailable> {
    get(
        &Api::namespaced(kube.clone(), namespace),
        "Secret",
        namespace,
        name,
    )
    .await
}

/// The non-empty value of `key` in `secret` (named `name` in messages), from `data` or
/// `stringData`, at most [`MAX_KEY_BYTES`].
pub fn secret_key(secret: &Secret, name: &str, key: &str) -> Result<Vec<u8>, Unavailable> {
    let value = secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| b.0.clone())
        .or_else(|| {
            secret
                .string_data
                .as_ref()
                .and_then(|d| d.get(key))
                .map(|s| s.as_bytes().to_vec())
        })
        .filter(|v| !v.is_empty())
        .ok_or_else(|| Unavailable(format!("Secret {name:?} has no key {key:?}")))?;
    bounded(value, || format!("Secret {name:?} key {key:?}"))
}

/// A Secret key as text, for values that are UTF-8 by contract (a user name, a password).
pub fn secret_text(secret: &Secret, name: &str, key: &str) -> Result<String, Unavailable> {
    String::from_utf8(secret_key(secret, name, key)?)
        .map_err(|_| Unavailable(format!("Secret {name:?} key {key:?} is not UTF-8 text")))
}

/// The PEM bytes of a Provider's `caBundle`, from wherever it says, at most
/// [`MAX_KEY_BYTES`].
pub async fn ca_bundle(
    kube: &kube::Client,
    namespace: &str,
    bundle: &ValueOrSource,
) -> Result<Vec<u8>, Unavailable> {
    let pem = match bundle.source() {
        Some(Source::Inline(pem)) => pem.as_bytes().to_vec(),
        Some(Source::ConfigMap(sel)) => {
            let maps: Api<ConfigMap> = Api::namespaced(kube.clone(), namespace);
            let map = get(&maps, "ConfigMap", namespace, &sel.name).await?;
            map.data
                .as_ref()
                .and_then(|d| d.get(&sel.key))
                .map(|v| v.as_bytes().to_vec())
                .or_else(|| {
                    map.binary_data
                        .as_ref()
                        .and_then(|d| d.get(&sel.key))
                        .map(|b| b.0.clone())
                })
                .ok_or_else(|| {
                    Unavailable(format!("ConfigMap {:?} has no key {:?}", sel.name, sel.key))
                })?
        }
        Some(Source::Secret(sel)) => secret_key(
            &secret(kube, namespace, &sel.name).await?,
            &sel.name,
            &sel.key,
        )?,
        None => {
            return Err(Unavailable(
                "caBundle must set exactly one of inline, configMapRef or secretRef".into(),
            ));
        }
    };
    bounded(pem, || "caBundle".to_owned())
}

fn bounded(value: Vec<u8>, what: impl FnOnce() -> String) -> Result<Vec<u8>, Unavailable> {
    if value.len() > MAX_KEY_BYTES {
        return Err(Unavailable(format!(
            "{} is larger than {MAX_KEY_BYTES} bytes",
            what()
        )));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn secret_with(data: &[(&str, Vec<u8>)], string_data: &[(&str, &str)]) -> Secret {
        Secret {
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.clone())))
                    .collect(),
            ),
            string_data: Some(
                string_data
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn secret_keys_are_read_bounded_and_never_empty() {
        let s = secret_with(
            &[("tls.crt", b"cert".to_vec()), ("empty", Vec::new())],
            &[("password", "hunter2")],
        );
        assert_eq!(secret_key(&s, "creds", "tls.crt").unwrap(), b"cert");
        assert_eq!(secret_text(&s, "creds", "password").unwrap(), "hunter2");
        assert_eq!(
            secret_key(&s, "creds", "empty").unwrap_err().to_string(),
            "Secret \"creds\" has no key \"empty\""
        );
        assert!(secret_key(&s, "creds", "tls.key").is_err());
        let big = secret_with(&[("ca.crt", vec![b'a'; MAX_KEY_BYTES + 1])], &[]);
        assert_eq!(
            secret_key(&big, "ca", "ca.crt").unwrap_err().to_string(),
            format!("Secret \"ca\" key \"ca.crt\" is larger than {MAX_KEY_BYTES} bytes")
        );
        let binary = secret_with(&[("username", vec![0xff, 0xfe])], &[]);
        assert!(
            secret_text(&binary, "creds", "username")
                .unwrap_err()
                .to_string()
                .contains("is not UTF-8 text")
        );
    }
}

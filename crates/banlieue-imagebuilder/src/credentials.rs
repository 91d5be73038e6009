//! How a Url source reaches its registry: basic credentials from an imagePullSecrets-style
//! Secret (`kubernetes.io/dockerconfigjson`), a CA bundle from a ConfigMap, plain HTTP only on
//! loopback. Both objects live in the VMImage's namespace and are read through the API, so no
//! credential ever appears on a command line or in a Job's spec.

use std::collections::BTreeMap;

use banlieue_api::ImageSource;
use base64::Engine as _;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{Api, Client};
use serde::Deserialize;

use crate::pull::Access;
use crate::reason::{BuildError, Reason};

/// The key of a docker config Secret.
pub const DOCKER_CONFIG_KEY: &str = ".dockerconfigjson";
/// The key of the CA ConfigMap.
pub const CA_KEY: &str = "ca.crt";
/// A docker config or CA bundle larger than this is refused (both are a few KiB).
const MAX_BYTES: usize = 256 << 10;

#[derive(Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: BTreeMap<String, DockerAuth>,
}

#[derive(Deserialize)]
struct DockerAuth {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
}

/// The registry part of a docker config key: `https://host:port/v1/` and `host:port` alike.
fn key_host(key: &str) -> &str {
    let key = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    key.split('/').next().unwrap_or(key)
}

/// The basic credentials a docker config JSON holds for `registry` (`host[:port]`), if any.
pub fn basic_auth_for(
    docker_config: &[u8],
    registry: &str,
) -> Result<Option<(String, String)>, BuildError> {
    let unusable = |why: String| BuildError::new(Reason::CredentialsUnavailable, why);
    if docker_config.len() > MAX_BYTES {
        return Err(unusable(format!(
            "{DOCKER_CONFIG_KEY} is {} bytes (at most {MAX_BYTES})",
            docker_config.len()
        )));
    }
    let config: DockerConfig = serde_json::from_slice(docker_config)
        .map_err(|e| unusable(format!("{DOCKER_CONFIG_KEY} is not a docker config: {e}")))?;
    let Some(entry) = config
        .auths
        .iter()
        .find(|(key, _)| key_host(key) == registry)
        .map(|(_, auth)| auth)
    else {
        return Ok(None);
    };
    if let (Some(user), Some(password)) = (&entry.username, &entry.password) {
        return Ok(Some((user.clone(), password.clone())));
    }
    let Some(encoded) = &entry.auth else {
        return Err(unusable(format!(
            "the entry for {registry} has neither auth nor username and password"
        )));
    };
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .map_err(|e| unusable(format!("the auth of {registry} is not base64: {e}")))?;
    let text = String::from_utf8(decoded)
        .map_err(|_| unusable(format!("the auth of {registry} is not UTF-8")))?;
    let (user, password) = text
        .split_once(':')
        .ok_or_else(|| unusable(format!("the auth of {registry} is not user:password")))?;
    Ok(Some((user.to_owned(), password.to_owned())))
}

/// Reads the Secret and ConfigMap `source` names, in `namespace` (the build namespace, where
/// registry access is kept out of the providers' reach), into an [`Access`] for `registry`.
pub async fn load_access(
    kube: &Client,
    namespace: &str,
    source: &ImageSource,
    registry: &str,
) -> Result<Access, BuildError> {
    let mut access = Access {
        plain_http: source.plain_http,
        token_realm_hosts: source.token_realm_hosts.clone(),
        ..Access::default()
    };
    if let Some(name) = &source.pull_secret_name {
        let secret = Api::<Secret>::namespaced(kube.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(|e| api_error("Secret", namespace, name, e))?
            .ok_or_else(|| missing("Secret", namespace, name))?;
        let data = secret
            .data
            .as_ref()
            .and_then(|d| d.get(DOCKER_CONFIG_KEY))
            .ok_or_else(|| {
                BuildError::new(
                    Reason::CredentialsUnavailable,
                    format!("Secret {namespace}/{name} has no key {DOCKER_CONFIG_KEY}"),
                )
            })?;
        access.credentials = basic_auth_for(&data.0, registry)?;
        if access.credentials.is_none() {
            return Err(BuildError::new(
                Reason::CredentialsUnavailable,
                format!("Secret {namespace}/{name} holds no credentials for {registry}"),
            ));
        }
    }
    if let Some(name) = &source.ca_config_map_name {
        let map = Api::<ConfigMap>::namespaced(kube.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(|e| api_error("ConfigMap", namespace, name, e))?
            .ok_or_else(|| missing("ConfigMap", namespace, name))?;
        let pem = map
            .data
            .as_ref()
            .and_then(|d| d.get(CA_KEY))
            .filter(|pem| pem.len() <= MAX_BYTES && pem.contains("-----BEGIN CERTIFICATE-----"))
            .ok_or_else(|| {
                BuildError::new(
                    Reason::CredentialsUnavailable,
                    format!("ConfigMap {namespace}/{name} has no PEM certificate under {CA_KEY}"),
                )
            })?;
        access.ca_pem = Some(pem.as_bytes().to_vec());
    }
    Ok(access)
}

fn missing(kind: &str, namespace: &str, name: &str) -> BuildError {
    BuildError::new(
        Reason::CredentialsUnavailable,
        format!("{kind} {namespace}/{name} does not exist"),
    )
}

fn api_error(kind: &str, namespace: &str, name: &str, e: kube::Error) -> BuildError {
    BuildError::new(
        Reason::CredentialsUnavailable,
        format!("reading {kind} {namespace}/{name}: {e}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_by_registry_in_either_form() {
        let encoded = base64::engine::general_purpose::STANDARD.encode("alice:s3cr:et");
        let config = format!(
            r#"{{"auths":{{"https://127.0.0.1:5000/v1/":{{"auth":"{encoded}"}},
                "other:1":{{"username":"bob","password":"pw"}}}}}}"#
        );
        assert_eq!(
            basic_auth_for(config.as_bytes(), "127.0.0.1:5000").expect("parses"),
            Some(("alice".into(), "s3cr:et".into()))
        );
        assert_eq!(
            basic_auth_for(config.as_bytes(), "other:1").expect("parses"),
            Some(("bob".into(), "pw".into()))
        );
        assert_eq!(
            basic_auth_for(config.as_bytes(), "none:2").expect("parses"),
            None
        );
    }

    #[test]
    fn malformed_configs_say_why() {
        for bad in [
            &b"not json"[..],
            br#"{"auths":{"h:1":{"auth":"%%%"}}}"#,
            br#"{"auths":{"h:1":{"auth":"bm9jb2xvbg=="}}}"#,
            br#"{"auths":{"h:1":{}}}"#,
        ] {
            let e = basic_auth_for(bad, "h:1").expect_err("refused");
            assert_eq!(e.reason, Reason::CredentialsUnavailable, "{e}");
        }
        let huge = vec![b' '; MAX_BYTES + 1];
        assert!(basic_auth_for(&huge, "h:1").is_err());
    }
}

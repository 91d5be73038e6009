//! A vSphere Provider's credentials and connection, shared by the readiness probe and the
//! machine session: one place reads the Secret and the CA, so both fail with the same
//! messages.

use std::time::Duration;

use banlieue_api::Provider;
use banlieue_provider_kit::credentials;
use banlieue_provider_kit::error::Core;
use banlieue_vsphere::{Client, Credentials};

use crate::error::{Error, Result};

/// Key of the user name in the credentials Secret.
pub const USERNAME: &str = "username";
/// Key of the password in the credentials Secret.
pub const PASSWORD: &str = "password";

/// How long connecting (TCP, TLS, service content, login) may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// What a Provider's connection needs, read from its Secret and CA source. The password is
/// never printed.
pub struct VSphereCredentials {
    pub username: String,
    pub password: String,
    pub ca_pem: String,
}

impl std::fmt::Debug for VSphereCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VSphereCredentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish_non_exhaustive()
    }
}

/// Accepts only `https://host[:port]/path` with no user information, query or fragment:
/// the credentials come from the Secret alone and the trust from the CA alone. Errors never
/// echo a password written into the URL.
pub fn check_endpoint(endpoint: &str) -> Result<url::Url> {
    let scheme = endpoint.split_once("://").map_or(endpoint, |(s, _)| s);
    if !scheme.eq_ignore_ascii_case("https") {
        return Err(Error::Core(Core::UnsupportedScheme(
            scheme
                .chars()
                .take(32)
                .collect::<String>()
                .to_ascii_lowercase(),
        )));
    }
    let invalid = |why: &str| {
        Error::Core(Core::Invalid {
            reason: banlieue_api::conditions::reasons::CONNECT_FAILED,
            message: format!("endpoint: {why}"),
        })
    };
    let url = url::Url::parse(endpoint).map_err(|e| invalid(&format!("not a URL: {e}")))?;
    if url.host_str().is_none_or(str::is_empty) {
        return Err(invalid("no host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(invalid(
            "user information in the URL is refused: the credentials come from credentialsRef",
        ));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(invalid("a Provider endpoint takes no query or fragment"));
    }
    Ok(url)
}

/// Reads the user name, password and CA the Provider names, from its namespace.
pub async fn load(kube: &kube::Client, provider: &Provider) -> Result<VSphereCredentials> {
    let ns = provider.metadata.namespace.as_deref().unwrap_or("default");
    let creds_name = &provider.spec.connection.credentials_ref.name;
    let secret = credentials::secret(kube, ns, creds_name).await?;
    let username = credentials::secret_text(&secret, creds_name, USERNAME)?;
    let password = credentials::secret_text(&secret, creds_name, PASSWORD)?;
    let ca = credentials::ca_bundle(kube, ns, &provider.spec.connection.ca_bundle).await?;
    let ca_pem = String::from_utf8(ca).map_err(|_| {
        Error::Core(Core::CredentialsUnavailable(
            "caBundle is not PEM text".into(),
        ))
    })?;
    Ok(VSphereCredentials {
        username,
        password,
        ca_pem,
    })
}

/// Checks the endpoint, then connects and logs in, within [`CONNECT_TIMEOUT`].
pub async fn connect(endpoint: &str, credentials: &VSphereCredentials) -> Result<Client> {
    check_endpoint(endpoint)?;
    let login = Client::connect(
        endpoint,
        &credentials.ca_pem,
        Credentials::new(&credentials.username, &credentials.password),
    );
    match tokio::time::timeout(CONNECT_TIMEOUT, login).await {
        Ok(result) => result.map_err(|source| Error::ConnectFailed {
            endpoint: endpoint.to_owned(),
            source,
        }),
        Err(_) => Err(Error::ConnectTimeout {
            endpoint: endpoint.to_owned(),
            after: CONNECT_TIMEOUT,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_https_is_accepted() {
        let e = check_endpoint("http://vcenter.example/sdk").unwrap_err();
        assert_eq!(e.to_string(), "scheme \"http\" is not supported");
        assert_eq!(e.reason(), "UnsupportedScheme");
        let e = check_endpoint("qemu+tls://kvm-7/system").unwrap_err();
        assert_eq!(e.reason(), "UnsupportedScheme");
        assert!(check_endpoint("https://vcenter.example/sdk").is_ok());
        assert!(check_endpoint("HTTPS://127.0.0.1:8989/sdk").is_ok());
    }

    #[test]
    fn user_information_and_queries_are_refused_without_echoing_a_password() {
        let e = check_endpoint("https://root:hunter2@vcenter.example/sdk").unwrap_err();
        assert_eq!(e.reason(), "ConnectFailed");
        assert!(!e.to_string().contains("hunter2"), "{e}");
        let e = check_endpoint("https://vcenter.example/sdk?insecure=1").unwrap_err();
        assert!(e.to_string().contains("no query"), "{e}");
        assert!(check_endpoint("https://").is_err());
    }

    #[test]
    fn credentials_do_not_print_the_password() {
        let c = VSphereCredentials {
            username: "u".into(),
            password: "hunter2".into(),
            ca_pem: String::new(),
        };
        assert!(!format!("{c:?}").contains("hunter2"));
    }
}

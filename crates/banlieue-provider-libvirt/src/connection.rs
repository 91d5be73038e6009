//! A Provider's TLS material and connection, shared by the operator (which probes the host)
//! and the provider workload (which realises machines): one place reads the Secret and CA, so
//! both fail with the same messages.

use std::time::Duration;

use banlieue_api::Provider;
use banlieue_libvirt::{CaBundle, Client, ClientOptions, ConnectUri, Identity};
use banlieue_provider_kit::credentials;
use banlieue_provider_kit::error::Core;

use crate::error::{Error, Result};

/// Key of the client certificate in the credentials Secret.
pub const TLS_CRT: &str = "tls.crt";
/// Key of the client key in the credentials Secret.
pub const TLS_KEY: &str = "tls.key";

/// The TLS material of a Provider, read from its Secret and CA source.
#[derive(Debug)]
pub struct Credentials {
    pub identity: Identity,
    pub ca: CaBundle,
}

/// Rejects every scheme but `qemu+tls` before anything is read: the provider has no ssh client
/// and never talks in clear (ADR-0011). The scheme is matched without case, as RFC 3986 and
/// libvirt do (`QEMU+TLS://…` is accepted).
///
/// A Provider endpoint also carries no user information (the client certificate is the
/// credential; [`ConnectUri::parse`] refuses it) and no query parameters: libvirt's URI
/// parameters (`no_verify`, `pkipath`, `tls_priority`, …) change TLS trust or name files on the
/// host running the provider, and a Provider's trust comes only from its Secret and CA. The
/// CLI (`banlieue libvirt … ?pkipath=`) does not go through here, so it keeps `pkipath`.
/// Errors name the endpoint with any password replaced by `***`.
pub fn check_endpoint(endpoint: &str) -> Result<()> {
    let scheme = endpoint.split_once("://").map_or(endpoint, |(s, _)| s);
    if !scheme.eq_ignore_ascii_case("qemu+tls") {
        return Err(Error::Core(Core::UnsupportedScheme(
            scheme.to_ascii_lowercase(),
        )));
    }
    let failed = |source| Error::ConnectFailed {
        endpoint: banlieue_libvirt::uri::redacted(endpoint),
        source,
    };
    ConnectUri::parse(endpoint).map_err(failed)?;
    if endpoint.contains(['?', '#']) {
        return Err(failed(banlieue_libvirt::Error::InvalidUri {
            uri: banlieue_libvirt::uri::redacted(endpoint),
            reason: "a Provider endpoint takes no query parameters (no_verify, pkipath, …): its TLS trust comes only from its Secret and CA",
        }));
    }
    Ok(())
}

/// Reads the client certificate, key and CA the Provider names, from its namespace.
pub async fn load(kube: &kube::Client, provider: &Provider) -> Result<Credentials> {
    let ns = provider.metadata.namespace.as_deref().unwrap_or("default");
    let creds_name = &provider.spec.connection.credentials_ref.name;
    let secret = credentials::secret(kube, ns, creds_name).await?;
    let cert = credentials::secret_key(&secret, creds_name, TLS_CRT)?;
    let key = credentials::secret_key(&secret, creds_name, TLS_KEY)?;
    let identity = Identity::from_pem(&cert, &key).map_err(|e| {
        Error::Core(Core::CredentialsUnavailable(format!(
            "Secret {creds_name:?} keys {TLS_CRT}/{TLS_KEY}: {}",
            banlieue_api::conditions::error_message(&e)
        )))
    })?;
    let ca_pem = credentials::ca_bundle(kube, ns, &provider.spec.connection.ca_bundle).await?;
    let ca = CaBundle::from_pem(&ca_pem).map_err(|e| {
        Error::Core(Core::CredentialsUnavailable(format!(
            "caBundle: {}",
            banlieue_api::conditions::error_message(&e)
        )))
    })?;
    Ok(Credentials { identity, ca })
}

/// Connection tunables; the provider wants a dead host noticed within seconds.
pub fn client_options(call_timeout: Duration) -> ClientOptions {
    ClientOptions {
        call_timeout: Some(call_timeout),
        keepalive_interval: Duration::from_secs(2),
        keepalive_count: 3,
        ..ClientOptions::default()
    }
}

/// Checks the scheme, then connects with the Provider's credentials.
pub async fn connect(
    endpoint: &str,
    credentials: &Credentials,
    options: ClientOptions,
) -> Result<Client> {
    check_endpoint(endpoint)?;
    let failed = |source| Error::ConnectFailed {
        endpoint: endpoint.to_owned(),
        source,
    };
    // The client's TCP connect has no deadline of its own; a host whose firewall drops
    // packets would otherwise hold the reconcile forever.
    match tokio::time::timeout(
        CONNECT_TIMEOUT,
        Client::connect_with(endpoint, &credentials.identity, &credentials.ca, options),
    )
    .await
    {
        Ok(result) => result.map_err(failed),
        Err(_) => Err(failed(banlieue_libvirt::Error::Timeout {
            procedure: "connect",
            after: CONNECT_TIMEOUT,
        })),
    }
}

/// How long a connection (TCP, TLS, libvirt's open sequence) may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_qemu_tls_is_accepted() {
        let e = check_endpoint("qemu+ssh://root@kvm-7/system").unwrap_err();
        assert_eq!(e.to_string(), "scheme \"qemu+ssh\" is not supported");
        let e = check_endpoint("qemu+tcp://kvm-7/system").unwrap_err();
        assert_eq!(e.to_string(), "scheme \"qemu+tcp\" is not supported");
        // The library also speaks the local socket; a Provider never does (ADR-0011).
        let e = check_endpoint("qemu:///system").unwrap_err();
        assert_eq!(e.to_string(), "scheme \"qemu\" is not supported");
        let e = check_endpoint("qemu+unix:///system?socket=/run/libvirt/libvirt-sock").unwrap_err();
        assert_eq!(e.to_string(), "scheme \"qemu+unix\" is not supported");
        let e = check_endpoint("test+tls://kvm-7/default").unwrap_err();
        assert_eq!(e.to_string(), "scheme \"test+tls\" is not supported");
        assert!(check_endpoint("qemu+tls://kvm-7.example/system").is_ok());
        assert!(check_endpoint("QEMU+TLS://kvm-7.example/system").is_ok());
        let e = check_endpoint("QEMU+SSH://kvm-7/system").unwrap_err();
        assert_eq!(e.to_string(), "scheme \"qemu+ssh\" is not supported");
    }

    #[test]
    fn parameters_that_change_trust_or_name_files_are_refused() {
        for endpoint in [
            "qemu+tls://h/system?no_verify=1&pkipath=/etc",
            "qemu+tls://h/system?pkipath=/etc/pki",
            "qemu+tls://h/system?no_verify=1",
            "qemu+tls://h:16514/system?",
        ] {
            let e = check_endpoint(endpoint).unwrap_err();
            assert_eq!(
                e.reason(),
                banlieue_api::conditions::reasons::CONNECT_FAILED
            );
            let chain = banlieue_api::conditions::error_message(&e);
            assert!(chain.contains("takes no query parameters"), "{chain}");
        }
    }

    #[test]
    fn passwords_are_refused_and_never_echoed() {
        let e = check_endpoint("qemu+tls://u:pw@h/system").unwrap_err();
        assert_eq!(
            e.reason(),
            banlieue_api::conditions::reasons::CONNECT_FAILED
        );
        let chain = banlieue_api::conditions::error_message(&e);
        assert!(chain.contains("user information"), "{chain}");
        assert!(!chain.contains("pw"), "{chain}");
    }
}

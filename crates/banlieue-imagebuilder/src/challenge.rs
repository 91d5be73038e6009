//! The registry's side of authentication, without I/O: reading a `WWW-Authenticate`
//! challenge, deciding whether its token realm may be sent the VMImage's credentials, reading
//! a token response, and turning a registry's error answer into a build reason.
//!
//! A registry answers 401 with a challenge that names a *realm*: the URL of the token service
//! the client should ask, with its basic credentials, for a bearer token. That URL is chosen by
//! whoever controls the registry's answers, so following it blindly hands the pull Secret's
//! password to any host the answer names, over plain HTTP if it says so. The realm is
//! therefore accepted only over HTTPS on the registry's own host, or on a host the VMImage
//! lists in `tokenRealmHosts` (Docker Hub's `auth.docker.io`, for one).

use serde::Deserialize;

use crate::reason::{BuildError, Reason};

/// A token response larger than this is refused (real ones are a few KiB).
pub const MAX_TOKEN_BYTES: usize = 64 << 10;
/// How much of an error answer is read; the rest is dropped unread.
pub const MAX_ERROR_BYTES: usize = 64 << 10;
/// How much of a registry's own error message is quoted in a build message.
const MAX_QUOTED_CHARS: usize = 200;

/// What a registry's 401 asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Challenge {
    /// Send the basic credentials to the registry itself.
    Basic,
    /// Ask `realm` for a bearer token for `service`.
    Bearer {
        realm: String,
        service: Option<String>,
    },
}

/// Reads the challenges of every `WWW-Authenticate` value: a Bearer challenge is preferred
/// over Basic; `None` when neither is there.
pub fn parse<'a>(values: impl IntoIterator<Item = &'a str>) -> Option<Challenge> {
    let mut basic = false;
    for value in values {
        let (scheme, rest) = value
            .trim_start()
            .split_once(' ')
            .unwrap_or((value.trim(), ""));
        if scheme.eq_ignore_ascii_case("basic") {
            basic = true;
        } else if scheme.eq_ignore_ascii_case("bearer") {
            let params = params(rest);
            let find = |key: &str| {
                params
                    .iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case(key))
                    .map(|(_, v)| v.clone())
            };
            if let Some(realm) = find("realm") {
                return Some(Challenge::Bearer {
                    realm,
                    service: find("service"),
                });
            }
        }
    }
    basic.then_some(Challenge::Basic)
}

/// `key=value, key="quoted \" value"` pairs, as RFC 9110's auth-params.
fn params(input: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut chars = input.chars().peekable();
    loop {
        while chars.next_if(|c| *c == ',' || c.is_whitespace()).is_some() {}
        let key: String =
            std::iter::from_fn(|| chars.next_if(|c| *c != '=' && *c != ',')).collect();
        if key.trim().is_empty() || chars.next_if_eq(&'=').is_none() {
            return out;
        }
        let value = if chars.next_if_eq(&'"').is_some() {
            let mut value = String::new();
            while let Some(c) = chars.next() {
                match c {
                    '"' => break,
                    '\\' => value.extend(chars.next()),
                    c => value.push(c),
                }
            }
            value
        } else {
            std::iter::from_fn(|| chars.next_if(|c| *c != ',')).collect::<String>()
        };
        out.push((key.trim().to_owned(), value.trim().to_owned()));
    }
}

/// Whether credentials may be sent to `realm`: HTTPS on `registry`'s host or on one of
/// `allowed_hosts`; plain HTTP only where the registry itself is spoken to in plain HTTP (a
/// loopback registry) and the realm is on that same host.
pub fn check_realm(
    realm: &str,
    registry: &str,
    plain_http: bool,
    allowed_hosts: &[String],
) -> Result<reqwest::Url, BuildError> {
    let refused = |why: String| {
        BuildError::new(
            Reason::TokenRealmRefused,
            format!("the registry {registry} names the token realm {realm:?}: {why}"),
        )
    };
    let url = reqwest::Url::parse(realm).map_err(|e| refused(format!("not a URL ({e})")))?;
    let host = url
        .host_str()
        .ok_or_else(|| refused("it has no host".to_owned()))?
        .trim_start_matches('[')
        .trim_end_matches(']');
    let registry_host = crate::pull::host_of(registry);
    let same_host = host.eq_ignore_ascii_case(registry_host);
    let listed = allowed_hosts.iter().any(|h| h.eq_ignore_ascii_case(host));
    if !url.username().is_empty() || url.password().is_some() {
        return Err(refused("it carries credentials of its own".to_owned()));
    }
    match url.scheme() {
        "https" if same_host || listed => Ok(url),
        "https" => Err(refused(format!(
            "{host} is not the registry's host; list it in the source's tokenRealmHosts to \
             trust it"
        ))),
        "http" if plain_http && same_host => Ok(url),
        "http" => Err(refused(
            "credentials are sent to a token realm only over https".to_owned(),
        )),
        other => Err(refused(format!("the scheme {other} is not https"))),
    }
}

#[derive(Deserialize)]
struct TokenResponse {
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    access_token: Option<String>,
}

/// The bearer token of a token service's answer (`token`, or OAuth2's `access_token`).
pub fn token(body: &[u8]) -> Result<String, BuildError> {
    let unusable = |why: &str| {
        BuildError::new(
            Reason::Unauthorized,
            format!("the token service's answer {why}"),
        )
    };
    let response: TokenResponse =
        serde_json::from_slice(body).map_err(|_| unusable("is not a token response"))?;
    let token = response
        .token
        .filter(|t| !t.is_empty())
        .or(response.access_token)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| unusable("holds no token"))?;
    // It goes into an Authorization header as is.
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(unusable("holds a token that is not printable ASCII"));
    }
    Ok(token)
}

#[derive(Deserialize)]
struct Envelope {
    #[serde(default)]
    errors: Vec<RegistryError>,
}

#[derive(Deserialize)]
struct RegistryError {
    #[serde(default)]
    code: String,
    #[serde(default)]
    message: String,
}

/// The build reason and message for a registry's non-success answer about `what`: by the
/// distribution spec's error codes when the body has them, else by the HTTP status.
pub fn error(what: &str, status: u16, body: &[u8]) -> BuildError {
    let envelope: Option<Envelope> = serde_json::from_slice(body).ok();
    let first = envelope.as_ref().and_then(|e| e.errors.first());
    let by_code = first.and_then(|e| match e.code.as_str() {
        "UNAUTHORIZED" | "DENIED" => Some(Reason::Unauthorized),
        "MANIFEST_UNKNOWN" | "NAME_UNKNOWN" | "BLOB_UNKNOWN" => Some(Reason::ManifestNotFound),
        _ => None,
    });
    let reason = by_code.unwrap_or(match status {
        401 | 403 => Reason::Unauthorized,
        404 => Reason::ManifestNotFound,
        _ => Reason::RegistryUnreachable,
    });
    let said = first
        .map(|e| format!(": {} {}", e.code, e.message))
        .unwrap_or_default();
    BuildError::new(reason, format!("{what}: HTTP {status}{}", quoted(&said)))
}

/// At most [`MAX_QUOTED_CHARS`] of what a registry said, control characters replaced.
fn quoted(text: &str) -> String {
    let mut out: String = text
        .chars()
        .take(MAX_QUOTED_CHARS)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if text.chars().count() > MAX_QUOTED_CHARS {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_is_preferred_and_quoted_values_unescaped() {
        let c = parse([
            "Basic realm=\"x\"",
            r#"Bearer realm="https://auth.example/token",service="reg \"one\"",scope="repository:a:pull""#,
        ]);
        assert_eq!(
            c,
            Some(Challenge::Bearer {
                realm: "https://auth.example/token".to_owned(),
                service: Some("reg \"one\"".to_owned()),
            })
        );
        assert_eq!(parse(["BASIC realm=registry"]), Some(Challenge::Basic));
        assert_eq!(
            parse(["bearer Realm=https://r/t , Service=s"]),
            Some(Challenge::Bearer {
                realm: "https://r/t".to_owned(),
                service: Some("s".to_owned()),
            })
        );
        // A Bearer challenge without a realm cannot be followed.
        assert_eq!(parse(["Bearer service=s"]), None);
        assert_eq!(parse(["Negotiate", ""]), None);
        // An unterminated quote ends the value rather than the parse.
        assert_eq!(
            parse(["Bearer realm=\"https://r/t"]),
            Some(Challenge::Bearer {
                realm: "https://r/t".to_owned(),
                service: None,
            })
        );
    }

    #[test]
    fn realms_get_credentials_only_over_https_on_the_registry_or_a_listed_host() {
        let none: &[String] = &[];
        assert!(
            check_realm(
                "https://reg.example:8443/token",
                "reg.example:5000",
                false,
                none
            )
            .is_ok()
        );
        assert!(check_realm("https://REG.example/token", "reg.example", false, none).is_ok());
        let listed = ["auth.docker.io".to_owned()];
        assert!(
            check_realm(
                "https://auth.docker.io/token",
                "registry-1.docker.io",
                false,
                &listed
            )
            .is_ok()
        );
        for (realm, registry, plain, why) in [
            (
                "https://evil.example/t",
                "reg.example",
                false,
                "not the registry's host",
            ),
            (
                "http://reg.example/t",
                "reg.example",
                false,
                "only over https",
            ),
            (
                "http://127.0.0.1:9/t",
                "127.0.0.1:5000",
                false,
                "only over https",
            ),
            (
                "http://10.0.0.1/t",
                "127.0.0.1:5000",
                true,
                "only over https",
            ),
            ("ftp://reg.example/t", "reg.example", false, "not https"),
            (
                "https://user:pw@reg.example/t",
                "reg.example",
                false,
                "credentials of its own",
            ),
            ("/token", "reg.example", false, "not a URL"),
        ] {
            let e = check_realm(realm, registry, plain, none).expect_err(realm);
            assert_eq!(e.reason, Reason::TokenRealmRefused);
            assert!(e.message.contains(why), "{realm}: {}", e.message);
            assert!(e.message.contains(realm), "{}", e.message);
        }
        // Plain HTTP to a loopback registry may take its token there too.
        assert!(check_realm("http://127.0.0.1:5001/t", "127.0.0.1:5000", true, none).is_ok());
        assert!(check_realm("http://[::1]:5001/t", "[::1]:5000", true, none).is_ok());
    }

    #[test]
    fn tokens_are_read_from_either_field_and_must_be_header_safe() {
        assert_eq!(token(br#"{"token":"abc"}"#).expect("token"), "abc");
        assert_eq!(
            token(br#"{"token":"","access_token":"xyz"}"#).expect("token"),
            "xyz"
        );
        for bad in [&b"{}"[..], b"not json", br#"{"token":"a\nb"}"#] {
            assert_eq!(
                token(bad).expect_err("refused").reason,
                Reason::Unauthorized
            );
        }
    }

    #[test]
    fn errors_map_codes_then_status_and_quote_little() {
        let denied = error(
            "m",
            403,
            br#"{"errors":[{"code":"DENIED","message":"no"}]}"#,
        );
        assert_eq!(denied.reason, Reason::Unauthorized);
        assert!(denied.message.contains("DENIED no"), "{}", denied.message);
        let unknown = error("m", 400, br#"{"errors":[{"code":"MANIFEST_UNKNOWN"}]}"#);
        assert_eq!(unknown.reason, Reason::ManifestNotFound);
        assert_eq!(error("m", 404, b"").reason, Reason::ManifestNotFound);
        assert_eq!(error("m", 401, b"<html>").reason, Reason::Unauthorized);
        assert_eq!(error("m", 502, b"").reason, Reason::RegistryUnreachable);
        let long = format!(
            r#"{{"errors":[{{"code":"X","message":"{}\u0007"}}]}}"#,
            "a".repeat(5000)
        );
        let e = error("m", 500, long.as_bytes());
        assert!(e.message.chars().count() < 300, "{}", e.message.len());
        assert!(!e.message.contains('\u{7}'));
    }
}

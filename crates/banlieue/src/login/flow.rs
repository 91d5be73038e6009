//! The pure parts of an OIDC login (RFC 6749 authorization code, RFC 7636 PKCE): the
//! authorize URL, the callback request, the token response, the cached tokens' freshness and
//! the ExecCredential kubectl reads. No I/O, so each rule is tested on its own.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use super::LoginError;

/// An ID token counts as fresh while it has at least this long to live: kubectl may hold it
/// for a request or two before the API server sees it.
pub const FRESHNESS_MARGIN: Duration = Duration::from_secs(60);
/// The most of a callback request's head read from the browser.
pub const CALLBACK_HEAD_LIMIT: usize = 8 * 1024;

/// What the issuer's discovery document says (the fields used).
#[derive(Debug, Clone, Deserialize)]
pub struct Discovery {
    pub issuer: String,
    pub authorization_endpoint: String,
    pub token_endpoint: String,
}

impl Discovery {
    /// The document, refused unless it names the issuer asked for (OpenID Connect Discovery
    /// §4.3: a document for another issuer must not be used).
    pub fn parse(issuer: &str, body: &[u8]) -> Result<Discovery, LoginError> {
        let discovery: Discovery = serde_json::from_slice(body)
            .map_err(|e| LoginError::Issuer(format!("its discovery document: {e}")))?;
        if discovery.issuer.trim_end_matches('/') != issuer.trim_end_matches('/') {
            return Err(LoginError::Issuer(format!(
                "its discovery document is for {}, not {issuer}",
                discovery.issuer
            )));
        }
        Ok(discovery)
    }
}

/// One login attempt's secrets: the PKCE verifier and the state.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub verifier: String,
    pub state: String,
    pub redirect_uri: String,
}

impl Attempt {
    /// From 32 random bytes for the verifier and 16 for the state, and the local port the
    /// callback listens on. `localhost`, not 127.0.0.1: issuers (Dex among them) accept any
    /// port of `http://localhost` for a public client, as RFC 8252 §7.3 asks.
    pub fn new(verifier_bytes: [u8; 32], state_bytes: [u8; 16], port: u16) -> Attempt {
        Attempt {
            verifier: URL_SAFE_NO_PAD.encode(verifier_bytes),
            state: URL_SAFE_NO_PAD.encode(state_bytes),
            redirect_uri: format!("http://localhost:{port}/callback"),
        }
    }

    /// `BASE64URL(SHA256(verifier))`, the S256 challenge.
    pub fn challenge(&self) -> String {
        URL_SAFE_NO_PAD.encode(Sha256::digest(self.verifier.as_bytes()))
    }

    /// The URL the user opens.
    pub fn authorize_url(
        &self,
        discovery: &Discovery,
        client_id: &str,
        scopes: &str,
    ) -> Result<String, LoginError> {
        let mut url = url::Url::parse(&discovery.authorization_endpoint).map_err(|e| {
            LoginError::Issuer(format!(
                "its authorization endpoint {:?}: {e}",
                discovery.authorization_endpoint
            ))
        })?;
        url.query_pairs_mut()
            .append_pair("response_type", "code")
            .append_pair("client_id", client_id)
            .append_pair("redirect_uri", &self.redirect_uri)
            .append_pair("scope", scopes)
            .append_pair("state", &self.state)
            .append_pair("code_challenge", &self.challenge())
            .append_pair("code_challenge_method", "S256");
        Ok(url.into())
    }

    /// The authorization code from the browser's callback request head (`GET
    /// /callback?code=…&state=… HTTP/1.1`): refused when the state is not this attempt's, and
    /// the issuer's error when it sent one.
    pub fn code_from_callback(&self, head: &str) -> Result<String, LoginError> {
        let target = head
            .lines()
            .next()
            .and_then(|line| {
                let mut parts = line.split(' ');
                match (parts.next(), parts.next()) {
                    (Some("GET"), Some(target)) => Some(target),
                    _ => None,
                }
            })
            .ok_or_else(|| LoginError::Callback("not a GET request".into()))?;
        let url = url::Url::parse(&format!("http://localhost{target}"))
            .map_err(|e| LoginError::Callback(format!("its target: {e}")))?;
        if url.path() != "/callback" {
            return Err(LoginError::Callback(format!(
                "unexpected path {}",
                url.path()
            )));
        }
        let query = |name: &str| {
            url.query_pairs()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.into_owned())
        };
        // The state first: any local process can reach the callback port, and a request
        // without this login's state, an `error=` included, is no answer of the issuer's.
        if query("state").as_deref() != Some(self.state.as_str()) {
            return Err(LoginError::Callback(
                "its state is not this login's (a stale or forged callback)".into(),
            ));
        }
        if let Some(error) = query("error") {
            let description = query("error_description").unwrap_or_default();
            return Err(LoginError::Refused(format!("{error}: {description}")));
        }
        query("code").ok_or_else(|| LoginError::Callback("no code".into()))
    }

    /// The form of the code exchange.
    pub fn token_form(&self, code: &str, client_id: &str) -> String {
        form(&[
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", &self.redirect_uri),
            ("client_id", client_id),
            ("code_verifier", &self.verifier),
        ])
    }
}

/// The form of a refresh.
pub fn refresh_form(refresh_token: &str, client_id: &str) -> String {
    form(&[
        ("grant_type", "refresh_token"),
        ("refresh_token", refresh_token),
        ("client_id", client_id),
    ])
}

fn form(pairs: &[(&str, &str)]) -> String {
    url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish()
}

/// What is kept between runs: enough to answer kubectl without a browser.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tokens {
    pub id_token: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh_token: Option<String>,
}

impl Tokens {
    /// A token endpoint's answer; an error answer becomes [`LoginError::Refused`] with the
    /// issuer's words.
    pub fn from_response(status: u16, body: &[u8]) -> Result<Tokens, LoginError> {
        #[derive(Deserialize)]
        struct Answer {
            id_token: Option<String>,
            refresh_token: Option<String>,
            error: Option<String>,
            error_description: Option<String>,
        }
        let answer: Answer = serde_json::from_slice(body).map_err(|e| {
            LoginError::Issuer(format!("its token endpoint answered HTTP {status}: {e}"))
        })?;
        if let Some(error) = answer.error {
            return Err(LoginError::Refused(format!(
                "{error}: {}",
                answer.error_description.unwrap_or_default()
            )));
        }
        match answer.id_token {
            Some(id_token) if (200..300).contains(&status) => Ok(Tokens {
                id_token,
                refresh_token: answer.refresh_token,
            }),
            _ => Err(LoginError::Issuer(format!(
                "its token endpoint answered HTTP {status} without an ID token"
            ))),
        }
    }

    /// The ID token's `exp`, read but not verified: whoever relies on the token verifies it.
    pub fn expiry(&self) -> Result<SystemTime, LoginError> {
        let payload = self
            .id_token
            .split('.')
            .nth(1)
            .ok_or_else(|| LoginError::Issuer("its ID token is not a JWT".into()))?;
        let bytes = URL_SAFE_NO_PAD
            .decode(payload.trim_end_matches('='))
            .map_err(|e| LoginError::Issuer(format!("its ID token's payload: {e}")))?;
        #[derive(Deserialize)]
        struct Claims {
            exp: u64,
        }
        let claims: Claims = serde_json::from_slice(&bytes)
            .map_err(|e| LoginError::Issuer(format!("its ID token's claims: {e}")))?;
        Ok(UNIX_EPOCH + Duration::from_secs(claims.exp))
    }

    /// Whether the ID token has [`FRESHNESS_MARGIN`] left at `now`.
    pub fn fresh_at(&self, now: SystemTime) -> bool {
        self.expiry().is_ok_and(|exp| {
            exp.duration_since(now)
                .is_ok_and(|left| left >= FRESHNESS_MARGIN)
        })
    }
}

/// The `client.authentication.k8s.io/v1` ExecCredential kubectl reads from an exec plugin.
pub fn exec_credential(tokens: &Tokens) -> Result<String, LoginError> {
    let expiry = tokens.expiry()?;
    let timestamp = rfc3339(expiry);
    Ok(serde_json::json!({
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "status": { "token": tokens.id_token, "expirationTimestamp": timestamp },
    })
    .to_string())
}

/// `YYYY-MM-DDTHH:MM:SSZ` (UTC), from days since the epoch (Howard Hinnant's civil_from_days).
fn rfc3339(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt(exp: u64) -> String {
        format!(
            "e30.{}.sig",
            URL_SAFE_NO_PAD.encode(format!(r#"{{"sub":"x","exp":{exp}}}"#))
        )
    }

    fn attempt() -> Attempt {
        Attempt::new([7; 32], [9; 16], 43123)
    }

    #[test]
    fn the_challenge_is_rfc_7636s() {
        // RFC 7636 appendix B.
        let a = Attempt {
            verifier: "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk".into(),
            state: String::new(),
            redirect_uri: String::new(),
        };
        assert_eq!(a.challenge(), "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM");
        assert_eq!(attempt().verifier.len(), 43);
    }

    #[test]
    fn the_authorize_url_carries_pkce_and_state() {
        let discovery = Discovery {
            issuer: "https://idp.test/dex".into(),
            authorization_endpoint: "https://idp.test/dex/auth".into(),
            token_endpoint: "https://idp.test/dex/token".into(),
        };
        let a = attempt();
        let url = a
            .authorize_url(&discovery, "banlieue", "openid email")
            .expect("url");
        let parsed = url::Url::parse(&url).expect("parses");
        let q: std::collections::HashMap<_, _> = parsed.query_pairs().into_owned().collect();
        assert_eq!(q["redirect_uri"], "http://localhost:43123/callback");
        assert_eq!(q["code_challenge"], a.challenge());
        assert_eq!(q["code_challenge_method"], "S256");
        assert_eq!(q["state"], a.state);
        assert_eq!(q["scope"], "openid email");
    }

    #[test]
    fn callbacks_are_checked() {
        let a = attempt();
        let ok = format!(
            "GET /callback?code=abc&state={} HTTP/1.1\r\nHost: x\r\n",
            a.state
        );
        assert_eq!(a.code_from_callback(&ok).expect("code"), "abc");
        let forged = "GET /callback?code=abc&state=other HTTP/1.1\r\n";
        assert!(matches!(
            a.code_from_callback(forged),
            Err(LoginError::Callback(_))
        ));
        let refused = format!(
            "GET /callback?error=access_denied&error_description=no+way&state={} HTTP/1.1",
            a.state
        );
        let e = a.code_from_callback(&refused).expect_err("refused");
        assert_eq!(
            e.to_string(),
            "the issuer refused the login: access_denied: no way"
        );
        // An error without this login's state is ignored like any stray request, so a local
        // process cannot end the login by calling the port first.
        let stray = "GET /callback?error=access_denied&state=other HTTP/1.1";
        assert!(matches!(
            a.code_from_callback(stray),
            Err(LoginError::Callback(_))
        ));
        assert!(a.code_from_callback("POST /callback HTTP/1.1").is_err());
        assert!(a.code_from_callback("GET /favicon.ico HTTP/1.1").is_err());
        assert!(a.code_from_callback("").is_err());
    }

    #[test]
    fn discovery_must_name_the_issuer() {
        let body =
            br#"{"issuer":"https://evil.test","authorization_endpoint":"a","token_endpoint":"t"}"#;
        assert!(Discovery::parse("https://idp.test", body).is_err());
        let body =
            br#"{"issuer":"https://idp.test/","authorization_endpoint":"a","token_endpoint":"t"}"#;
        assert!(Discovery::parse("https://idp.test", body).is_ok());
        assert!(Discovery::parse("https://idp.test", b"not json").is_err());
    }

    #[test]
    fn token_answers_and_freshness() {
        let now = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let body = format!(r#"{{"id_token":"{}","refresh_token":"r"}}"#, jwt(1_000_300));
        let tokens = Tokens::from_response(200, body.as_bytes()).expect("tokens");
        assert_eq!(tokens.refresh_token.as_deref(), Some("r"));
        assert!(tokens.fresh_at(now));
        assert!(
            !tokens.fresh_at(now + Duration::from_secs(250)),
            "inside the margin"
        );
        assert!(!tokens.fresh_at(now + Duration::from_secs(400)), "expired");
        let e = Tokens::from_response(
            400,
            br#"{"error":"invalid_grant","error_description":"expired"}"#,
        )
        .expect_err("refused");
        assert_eq!(
            e.to_string(),
            "the issuer refused the login: invalid_grant: expired"
        );
        assert!(Tokens::from_response(500, b"<html>").is_err());
        let garbage = Tokens {
            id_token: "not-a-jwt".into(),
            refresh_token: None,
        };
        assert!(!garbage.fresh_at(now));
    }

    #[test]
    fn the_exec_credential_is_kubectls() {
        let tokens = Tokens {
            id_token: jwt(1_764_633_600),
            refresh_token: None,
        };
        let json: serde_json::Value =
            serde_json::from_str(&exec_credential(&tokens).expect("credential")).expect("json");
        assert_eq!(json["apiVersion"], "client.authentication.k8s.io/v1");
        assert_eq!(json["kind"], "ExecCredential");
        assert_eq!(json["status"]["token"], tokens.id_token.as_str());
        assert_eq!(
            json["status"]["expirationTimestamp"],
            "2025-12-02T00:00:00Z"
        );
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400 + 86_399)),
            "2000-02-29T23:59:59Z"
        );
    }
}

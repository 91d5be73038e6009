//! `banlieue login` against a real OIDC issuer (Dex) and a real API server that trusts it:
//! the browser login with PKCE (the browser's part scripted against Dex's own login form),
//! the cache, the refresh, and kubectl running it as its exec credential plugin.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use banlieue_testenv::control_plane::{ControlPlane, ControlPlaneOptions, bin_dir, wait_for};
use banlieue_testenv::oidc::{CLIENT_ID, Issuer, IssuerOptions, authentication_config};
use base64::Engine as _;
use http::StatusCode;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::Command;

const EMAIL: &str = "alice@corp.test";
const PASSWORD: &str = "alice-password";

fn login_args(issuer: &Issuer, cache: &Path) -> Vec<String> {
    vec![
        "login".into(),
        "--issuer".into(),
        issuer.url(),
        "--client-id".into(),
        CLIENT_ID.into(),
        "--ca-file".into(),
        issuer.ca_cert_path().display().to_string(),
        "--cache-dir".into(),
        cache.display().to_string(),
        "--timeout".into(),
        "60".into(),
    ]
}

/// Runs `banlieue login` without a browser; returns its stdout, failing if it prints a URL.
async fn login_quietly(issuer: &Issuer, cache: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_banlieue"))
        .args(login_args(issuer, cache))
        .stdin(Stdio::null())
        .output()
        .await
        .expect("banlieue login runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        !stderr.contains("Open this URL"),
        "no browser needed: {stderr}"
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

fn token_of(credential: &str) -> String {
    let json: Value = serde_json::from_str(credential).expect("an ExecCredential");
    assert_eq!(json["apiVersion"], "client.authentication.k8s.io/v1");
    assert_eq!(json["kind"], "ExecCredential");
    assert!(json["status"]["expirationTimestamp"].is_string());
    json["status"]["token"]
        .as_str()
        .expect("a token")
        .to_owned()
}

fn claims(token: &str) -> Value {
    let payload = token.split('.').nth(1).expect("a JWT");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .expect("base64url");
    serde_json::from_slice(&bytes).expect("claims")
}

async fn whoami(control_plane: &ControlPlane, token: &str) -> String {
    let client = control_plane.client_with_token(token).expect("client");
    let review: SelfSubjectReview = Api::all(client)
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .expect("the API server authenticates the token");
    review
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username)
        .expect("a username")
}

#[tokio::test]
async fn kubectl_logs_in_through_banlieue_login() {
    if !Issuer::available().expect("dex is built (scripts/setup)") {
        return;
    }
    let issuer = Issuer::start(IssuerOptions::new().user(EMAIL, PASSWORD))
        .await
        .expect("dex");
    let control_plane = ControlPlane::start_with(
        ControlPlaneOptions::default()
            .authentication_config(authentication_config(&[(&issuer, "oidc-a:")])),
    )
    .await
    .expect("control plane trusting the issuer");
    let cache = tempfile::tempdir().expect("cache dir");

    // 1. The first run: a browser login.
    let mut child = Command::new(env!("CARGO_BIN_EXE_banlieue"))
        .args(login_args(&issuer, cache.path()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("banlieue login starts");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let url = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.expect("stderr") {
            if let Some(url) = line.trim().strip_prefix("https://") {
                return format!("https://{url}");
            }
        }
        panic!("banlieue login ended without printing the URL to open");
    })
    .await
    .expect("the URL within 30 s");
    let query: std::collections::HashMap<String, String> = url::Url::parse(&url)
        .expect("a URL")
        .query_pairs()
        .into_owned()
        .collect();
    assert_eq!(query["code_challenge_method"], "S256");
    assert_eq!(query["client_id"], CLIENT_ID);
    assert!(query["redirect_uri"].starts_with("http://localhost:"));

    let (status, page) = issuer
        .browser_login(&url, EMAIL, PASSWORD)
        .await
        .expect("the browser's part");
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("Logged in"), "{page}");
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("banlieue login ends after the callback")
        .expect("its output");
    assert!(out.status.success());
    let token = token_of(&String::from_utf8(out.stdout).expect("utf-8"));
    let claims = claims(&token);
    assert_eq!(claims["iss"], issuer.url().as_str());
    assert_eq!(claims["aud"], CLIENT_ID);
    let sub = claims["sub"].as_str().expect("sub").to_owned();
    let username = wait_for(
        "the API server to accept the issuer's tokens",
        Duration::from_secs(60),
        || {
            let client = control_plane.client_with_token(&token).expect("client");
            async move {
                let review = Api::<SelfSubjectReview>::all(client)
                    .create(&PostParams::default(), &SelfSubjectReview::default())
                    .await;
                Ok(review
                    .ok()
                    .and_then(|r| r.status)
                    .and_then(|s| s.user_info)
                    .and_then(|u| u.username))
            }
        },
    )
    .await
    .expect("authenticated");
    assert_eq!(username, format!("oidc-a:{sub}"));
    let cache_file = std::fs::read_dir(cache.path())
        .expect("cache dir")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "json"))
        .expect("a cache file");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&cache_file).expect("stat").permissions(),
    );
    assert_eq!(
        mode & 0o777,
        0o600,
        "tokens are readable by their owner only"
    );

    // 2. The second run answers from the cache.
    assert_eq!(token_of(&login_quietly(&issuer, cache.path()).await), token);

    // 3. A stale ID token: the cached refresh token gets a new one, still without a browser.
    let mut cached: Value =
        serde_json::from_slice(&std::fs::read(&cache_file).expect("read cache")).expect("json");
    assert!(
        cached["refresh_token"].is_string(),
        "offline_access gave a refresh token"
    );
    let stale = format!(
        "e30.{}.x",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(r#"{"exp":1}"#)
    );
    cached["id_token"] = json!(stale);
    std::fs::write(&cache_file, cached.to_string()).expect("write cache");
    let refreshed = token_of(&login_quietly(&issuer, cache.path()).await);
    assert_ne!(refreshed, token);
    assert_eq!(
        whoami(&control_plane, &refreshed).await,
        format!("oidc-a:{sub}")
    );

    // 4. kubectl with banlieue login as its exec credential plugin.
    let admin = control_plane.kubeconfig("admin").expect("admin kubeconfig");
    let mut kubeconfig: Value =
        serde_json::to_value(kube::config::Kubeconfig::read_from(admin).expect("read"))
            .expect("json");
    let users = json!([{
        "name": "oidc",
        "user": { "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": env!("CARGO_BIN_EXE_banlieue"),
            "args": login_args(&issuer, cache.path()),
            "interactiveMode": "IfAvailable",
        }},
    }]);
    kubeconfig["users"] = users;
    for context in kubeconfig["contexts"].as_array_mut().expect("contexts") {
        context["context"]["user"] = json!("oidc");
    }
    let path = cache.path().join("kubeconfig");
    std::fs::write(&path, kubeconfig.to_string()).expect("write kubeconfig");
    let out = Command::new(bin_dir().join("kubectl"))
        .arg("--kubeconfig")
        .arg(&path)
        .args([
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ])
        .stdin(Stdio::null())
        .output()
        .await
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("oidc-a:{sub}")
    );
}

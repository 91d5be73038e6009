//! The claim subject policy for OIDC identities from real issuers: three Dex instances the
//! API server trusts through a structured AuthenticationConfiguration (issuer A's users are
//! `oidc-a:<sub>`, B's `oidc-b:<sub>`, E's `oidc-e:<sub>` with ID tokens of a few seconds),
//! and a fourth it does not know. Users log in with Dex's password grant and call the API
//! server with their ID tokens, as `kubectl` does.
//!
//! alice has the same user id, hence the same `sub`, at A and at B: the case where comparing
//! ids alone would let her claim to be B's alice.
//!
//! The policy binding is cluster-wide, so the steps run in order in one test, against a
//! control plane of this binary's own (the shared one has no OIDC issuers).

mod common;

use std::time::{Duration, Instant};

use banlieue_testenv::control_plane::{ControlPlane, ControlPlaneOptions, wait_for};
use banlieue_testenv::oidc::{Issuer, IssuerOptions, Tokens, authentication_config};
use common::{apply_file, claim, claims, create, forbidden, refusal, try_claim};
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, Error};
use serde_json::json;

const SYSTEM: &str = "banlieue-system";
const POLICY_CONFIGMAP: &str = "banlieue-claim-subject-policy";
/// Policies, their parameters and the JWT authenticators start asynchronously.
const TAKES_EFFECT: Duration = Duration::from_secs(60);
/// Issuer E's ID tokens live this long.
const SHORT_LIVED: Duration = Duration::from_secs(3);

/// Who the API server says `client` is.
async fn whoami(client: &Client) -> Result<String, Error> {
    let review: SelfSubjectReview = Api::all(client.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await?;
    Ok(review
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username)
        .unwrap_or_default())
}

async fn put_policy(admin: &Client, issuers: &str, brokers: &str) {
    let configmap: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": { "name": POLICY_CONFIGMAP, "namespace": SYSTEM },
        "data": { "issuers": issuers, "brokers": brokers },
    }))
    .expect("ConfigMap");
    Api::<ConfigMap>::namespaced(admin.clone(), SYSTEM)
        .patch(
            POLICY_CONFIGMAP,
            &PatchParams::apply("oidc-test").force(),
            &Patch::Apply(&configmap),
        )
        .await
        .expect("apply the policy ConfigMap");
}

/// Every authenticated user may create and change claims: RBAC lets them make a claim at all,
/// the policy decides whom it may name.
async fn let_everyone_claim(admin: &Client) {
    let role: ClusterRole = ClusterRole {
        metadata: ObjectMeta {
            name: Some("oidc-test-claimers".into()),
            ..ObjectMeta::default()
        },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec!["banlieue.io".into()]),
            resources: Some(vec!["virtualmachineclaims".into()]),
            verbs: ["create", "get", "patch", "update"]
                .map(String::from)
                .to_vec(),
            ..PolicyRule::default()
        }]),
        ..ClusterRole::default()
    };
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some("oidc-test-claimers".into()),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: "oidc-test-claimers".into(),
        },
        subjects: Some(vec![Subject {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Group".into(),
            name: "system:authenticated".into(),
            ..Subject::default()
        }]),
    };
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &role)
        .await
        .expect("ClusterRole");
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .expect("ClusterRoleBinding");
}

async fn login(issuer: &Issuer, email: &str) -> Tokens {
    issuer
        .password_login(email, &format!("{email}-password"))
        .await
        .unwrap_or_else(|e| panic!("{email} logs in at {}: {e:?}", issuer.url()))
}

#[tokio::test]
async fn oidc_identities_name_only_themselves_at_their_own_issuer() {
    if !Issuer::available().expect("dex is built (scripts/setup)") {
        return;
    }
    let users = |options: IssuerOptions, emails: &[&str]| {
        emails
            .iter()
            .fold(options, |o, e| o.user(*e, format!("{e}-password")))
    };
    // alice is the first user of A and of B: the same user id, the same sub at both.
    let a = Issuer::start(users(
        IssuerOptions::new(),
        &["alice@corp.test", "bob@corp.test"],
    ))
    .await
    .expect("issuer A");
    let b = Issuer::start(users(
        IssuerOptions::new(),
        &["alice@corp.test", "broker@corp.test"],
    ))
    .await
    .expect("issuer B");
    let e =
        Issuer::start(users(IssuerOptions::new(), &["eve@corp.test"]).id_token_expiry(SHORT_LIVED))
            .await
            .expect("issuer E");
    let unknown = Issuer::start(users(IssuerOptions::new(), &["alice@corp.test"]))
        .await
        .expect("an issuer the API server does not know");

    let config = authentication_config(&[(&a, "oidc-a:"), (&b, "oidc-b:"), (&e, "oidc-e:")]);
    let control_plane =
        ControlPlane::start_with(ControlPlaneOptions::default().authentication_config(config))
            .await
            .expect("control plane with the three issuers");
    let admin = control_plane.client().expect("admin");
    common::install_crds(&admin).await;
    apply_file(&admin, "deploy/namespace.yaml", None).await;
    apply_file(
        &admin,
        "deploy/admission/virtualmachineclaim-subject-authorization.yaml",
        None,
    )
    .await;
    let_everyone_claim(&admin).await;
    let namespace = control_plane.fresh_namespace().await.expect("namespace");

    // Logged in at A: the API server maps the token to oidc-a:<sub>.
    let alice_tokens = login(&a, "alice@corp.test").await;
    let alice_sub = alice_tokens.subject().expect("sub");
    let alice = control_plane
        .client_with_token(&alice_tokens.id_token)
        .expect("alice's client");
    let alice_name = wait_for(
        "the API server to accept issuer A's tokens",
        TAKES_EFFECT,
        || {
            let alice = alice.clone();
            async move { Ok(whoami(&alice).await.ok()) }
        },
    )
    .await
    .expect("alice is authenticated");
    assert_eq!(alice_name, format!("oidc-a:{alice_sub}"));
    let alice_at_b = login(&b, "alice@corp.test").await;
    assert_eq!(
        alice_at_b.subject().expect("sub"),
        alice_sub,
        "the same sub at both issuers, as the test intends"
    );
    let bob_sub = login(&a, "bob@corp.test").await.subject().expect("sub");
    let broker_tokens = login(&b, "broker@corp.test").await;
    let broker_sub = broker_tokens.subject().expect("sub");
    let broker = control_plane
        .client_with_token(&broker_tokens.id_token)
        .expect("broker's client");

    put_policy(
        &admin,
        &format!("{}=oidc-a:\n{}=oidc-b:", a.url(), b.url()),
        "",
    )
    .await;
    let alice_claims = claims(&alice, &namespace);
    let broker_claims = claims(&broker, &namespace);
    // Until the policy is in force every claim goes through: wait for a refusal first, then
    // for the ConfigMap's issuers to be read.
    wait_for("the policy to take effect", TAKES_EFFECT, || {
        let api = alice_claims.clone();
        let (issuer, id) = (a.url(), bob_sub.clone());
        async move { Ok(try_claim(&api, &issuer, &id).await.err()) }
    })
    .await
    .expect("alice may not name bob");
    wait_for("the policy ConfigMap to take effect", TAKES_EFFECT, || {
        let api = alice_claims.clone();
        let (issuer, id) = (a.url(), alice_sub.clone());
        async move { Ok(try_claim(&api, &issuer, &id).await.ok()) }
    })
    .await
    .expect("alice may name herself at A");

    // alice names herself at her issuer: allowed, and stored.
    let created = create(&alice_claims, claim("alice-sandbox", &a.url(), &alice_sub))
        .await
        .expect("alice's own claim");
    assert_eq!(created.data["spec"]["subject"]["id"], alice_sub.as_str());

    // The same sub at the other issuer: the issuer is not the one that logged her in.
    let message = forbidden(try_claim(&alice_claims, &b.url(), &alice_sub).await);
    assert!(
        message.contains(&format!(
            "spec.subject.issuer is {} but you (oidc-a:{alice_sub}) were authenticated by {}",
            b.url(),
            a.url()
        )),
        "{message}"
    );
    // Another user of her own issuer.
    let message = forbidden(try_claim(&alice_claims, &a.url(), &bob_sub).await);
    assert!(
        message.contains(&format!(
            "spec.subject.id is {bob_sub} but you are authenticated as oidc-a:{alice_sub} (id {alice_sub} at {})",
            a.url()
        )),
        "{message}"
    );
    // An issuer the site does not list, even one the API server does not know either.
    let message = forbidden(try_claim(&alice_claims, &unknown.url(), &alice_sub).await);
    assert!(
        message.contains("is not an issuer this site accepts"),
        "{message}"
    );

    // A broker of issuer B attributing a sandbox to alice of issuer A: only once listed.
    let message = forbidden(try_claim(&broker_claims, &a.url(), &alice_sub).await);
    assert!(message.contains("were authenticated by"), "{message}");
    put_policy(
        &admin,
        &format!("{}=oidc-a:\n{}=oidc-b:", a.url(), b.url()),
        &format!("oidc-b:{broker_sub}"),
    )
    .await;
    wait_for("the broker to be listed", TAKES_EFFECT, || {
        let api = broker_claims.clone();
        let (issuer, id) = (a.url(), alice_sub.clone());
        async move { Ok(try_claim(&api, &issuer, &id).await.ok()) }
    })
    .await
    .expect("the listed broker may name alice of A");
    try_claim(&broker_claims, &b.url(), &bob_sub)
        .await
        .expect("and anyone at a listed issuer");
    // Listing B's broker does not make B's other users brokers.
    let alice_b = control_plane
        .client_with_token(&alice_at_b.id_token)
        .expect("alice at B");
    let message = forbidden(try_claim(&claims(&alice_b, &namespace), &a.url(), &alice_sub).await);
    assert!(
        message.contains(&format!(
            "you (oidc-b:{alice_sub}) were authenticated by {}",
            b.url()
        )),
        "{message}"
    );

    // UPDATE: the spec cannot be changed afterwards, even by its creator.
    let changed = alice_claims
        .patch(
            "alice-sandbox",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "subject": { "id": bob_sub } } })),
        )
        .await;
    let (code, message) = refusal(changed);
    assert!(code == 422 || code == 403, "{code}: {message}");
    assert!(message.contains("spec is immutable"), "{message}");

    // A token of an issuer the API server does not trust authenticates nobody.
    let stranger = control_plane
        .client_with_token(&login(&unknown, "alice@corp.test").await.id_token)
        .expect("client");
    let (code, message) = refusal(whoami(&stranger).await);
    assert_eq!(code, 401, "{message}");
    let (code, _) = refusal(
        create(
            &claims(&stranger, &namespace),
            claim("x", &a.url(), &alice_sub),
        )
        .await,
    );
    assert_eq!(code, 401);

    // An expired token is refused: E's tokens live a few seconds.
    let eve_tokens = login(&e, "eve@corp.test").await;
    let issued = Instant::now();
    let eve = control_plane
        .client_with_token(&eve_tokens.id_token)
        .expect("eve's client");
    let exp = eve_tokens.claims().expect("claims")["exp"]
        .as_i64()
        .expect("exp");
    let iat = eve_tokens.claims().expect("claims")["iat"]
        .as_i64()
        .expect("iat");
    assert_eq!(
        Duration::from_secs(u64::try_from(exp - iat).expect("exp after iat")),
        SHORT_LIVED
    );
    let first = whoami(&eve).await;
    if issued.elapsed() < SHORT_LIVED {
        assert_eq!(
            first.expect("a fresh token of E is accepted"),
            format!("oidc-e:{}", eve_tokens.subject().expect("sub"))
        );
    }
    // The API server caches a token's authentication for a few seconds, past its expiry.
    tokio::time::sleep(SHORT_LIVED.saturating_sub(issued.elapsed())).await;
    let refused = wait_for("the expired token to be refused", TAKES_EFFECT, || {
        let eve = eve.clone();
        async move {
            Ok(match whoami(&eve).await {
                Err(Error::Api(status)) => Some(status.code),
                _ => None,
            })
        }
    })
    .await
    .expect("an expired token is refused");
    assert_eq!(refused, 401, "an expired token is unauthenticated");
}

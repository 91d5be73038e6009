//! The API server, not Rust, enforces the schema: required fields, ranges, the one-of rules,
//! the claim's immutable spec, unknown fields; and the Table API prints the claim columns the
//! guide shows.

mod common;

use banlieue_testenv::ssh_keys::ed25519_public_key;
use common::{claim, claims, control_plane, create, refusal};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

fn provider(name: &str, ca_bundle: Value) -> Value {
    json!({
        "apiVersion": "banlieue.io/v1alpha1",
        "kind": "Provider",
        "metadata": { "name": name },
        "spec": {
            "providerClassRef": { "name": "libvirt" },
            "connection": {
                "endpoint": "qemu+tls://kvm-1.example/system",
                "credentialsRef": { "name": "creds" },
                "caBundle": ca_bundle
            }
        }
    })
}

fn providers(client: &kube::Client, namespace: &str) -> Api<DynamicObject> {
    let resource = kube::api::ApiResource::erase::<banlieue_api::Provider>(&());
    Api::namespaced_with(client.clone(), namespace, &resource)
}

#[tokio::test]
async fn a_claim_needs_a_positive_ttl() {
    let cp = control_plane().await;
    let ns = cp.fresh_namespace().await.expect("namespace");
    let api = claims(&cp.client().expect("client"), &ns);

    let mut without = claim("no-ttl", "https://issuer.example.com", "alice");
    without["spec"]
        .as_object_mut()
        .expect("spec")
        .remove("ttlSeconds");
    let (code, message) = refusal(create(&api, without).await);
    assert_eq!(code, 422, "{message}");
    assert!(
        message.contains("spec.ttlSeconds: Required value"),
        "{message}"
    );

    for ttl in [0, -5] {
        let mut zero = claim("zero-ttl", "https://issuer.example.com", "alice");
        zero["spec"]["ttlSeconds"] = json!(ttl);
        let (code, message) = refusal(create(&api, zero).await);
        assert_eq!(code, 422, "{message}");
        assert!(
            message.contains("spec.ttlSeconds")
                && message.contains("should be greater than or equal to 1"),
            "{message}"
        );
    }

    create(&api, claim("ok", "https://issuer.example.com", "alice"))
        .await
        .expect("a claim with a TTL is accepted");
}

#[tokio::test]
async fn a_claim_needs_a_subject_issuer_and_id() {
    let cp = control_plane().await;
    let ns = cp.fresh_namespace().await.expect("namespace");
    let api = claims(&cp.client().expect("client"), &ns);
    let (code, message) =
        refusal(create(&api, claim("empty-id", "https://issuer.example.com", "")).await);
    assert_eq!(code, 422);
    assert!(message.contains("spec.subject.id"), "{message}");
    let (code, message) = refusal(create(&api, claim("empty-issuer", "", "alice")).await);
    assert_eq!(code, 422);
    assert!(message.contains("spec.subject.issuer"), "{message}");
}

#[tokio::test]
async fn ca_bundle_takes_exactly_one_source() {
    let cp = control_plane().await;
    let ns = cp.fresh_namespace().await.expect("namespace");
    let api = providers(&cp.client().expect("client"), &ns);
    let one_of = "exactly one of inline, configMapRef or secretRef must be set";

    let two = json!({ "inline": "-----BEGIN CERTIFICATE-----", "configMapRef": { "name": "ca" } });
    let (code, message) = refusal(create(&api, provider("two", two)).await);
    assert_eq!(code, 422, "{message}");
    assert!(
        message.contains("spec.connection.caBundle") && message.contains(one_of),
        "{message}"
    );

    let (_, message) = refusal(create(&api, provider("none", json!({}))).await);
    assert!(message.contains(one_of), "{message}");

    // The attestation anchor has the same shape and the same rule.
    let mut attested = provider("ek", json!({ "configMapRef": { "name": "ca" } }));
    attested["spec"]["attestation"] = json!({ "ekTrustBundle": {
        "configMapRef": { "name": "a" }, "secretRef": { "name": "b" } } });
    let (_, message) = refusal(create(&api, attested).await);
    assert!(
        message.contains("spec.attestation.ekTrustBundle") && message.contains(one_of),
        "{message}"
    );

    // One source is accepted, and the key defaults to ca.crt on the server.
    let created = create(
        &api,
        provider("one", json!({ "configMapRef": { "name": "ca" } })),
    )
    .await
    .expect("one source is accepted");
    assert_eq!(
        created.data["spec"]["connection"]["caBundle"]["configMapRef"]["key"],
        "ca.crt"
    );
}

#[tokio::test]
async fn a_claims_spec_cannot_be_changed() {
    let cp = control_plane().await;
    let ns = cp.fresh_namespace().await.expect("namespace");
    let api = claims(&cp.client().expect("client"), &ns);
    create(&api, claim("fixed", "https://issuer.example.com", "alice"))
        .await
        .expect("create");

    for change in [
        json!({ "spec": { "subject": { "id": "mallory" } } }),
        json!({ "spec": { "ttlSeconds": 86400 } }),
        json!({ "spec": { "poolRef": { "name": "other-pool" } } }),
    ] {
        let (code, message) = refusal(
            api.patch("fixed", &PatchParams::default(), &Patch::Merge(&change))
                .await,
        );
        assert_eq!(code, 422, "{message}");
        assert!(message.contains("spec is immutable"), "{message}");
    }
    // Metadata and status stay writable: finalizers and binding need them.
    api.patch(
        "fixed",
        &PatchParams::default(),
        &Patch::Merge(json!({ "metadata": { "labels": { "a": "b" } } })),
    )
    .await
    .expect("labels can change");
    let claim = api.get("fixed").await.expect("get");
    assert_eq!(claim.data["spec"]["subject"]["id"], "alice");
}

#[tokio::test]
async fn unknown_fields_are_refused_when_strict_and_pruned_otherwise() {
    let cp = control_plane().await;
    let ns = cp.fresh_namespace().await.expect("namespace");
    let api = claims(&cp.client().expect("client"), &ns);
    let mut typo = claim("typo", "https://issuer.example.com", "alice");
    typo["spec"]["ttl"] = json!(60);

    // Server-side apply (`kubectl apply --server-side`) refuses it: the typed patch cannot
    // hold a field the schema does not declare.
    let apply = PatchParams::apply(common::FIELD_MANAGER);
    let (_, message) = refusal(api.patch("typo", &apply, &Patch::Apply(&typo)).await);
    assert!(
        message.contains(".spec.ttl: field not declared in schema"),
        "{message}"
    );

    // A create with fieldValidation=Strict (what kubectl sends) is refused with the path.
    let client = cp.client().expect("client");
    let request = http::Request::post(format!(
        "/apis/banlieue.io/v1alpha1/namespaces/{ns}/virtualmachineclaims?fieldValidation=Strict"
    ))
    .header("Content-Type", "application/json")
    .body(serde_json::to_vec(&typo).expect("JSON"))
    .expect("request");
    let (code, message) = refusal(client.request::<Value>(request).await);
    assert_eq!(code, 400, "{message}");
    assert!(message.contains(r#"unknown field "spec.ttl""#), "{message}");

    // Without it the schema is structural, so the server prunes the field rather than store it.
    let object: DynamicObject = serde_json::from_value(typo).expect("object");
    let created = api
        .create(&PostParams::default(), &object)
        .await
        .expect("create without strict validation");
    assert!(
        created.data["spec"].get("ttl").is_none(),
        "{:?}",
        created.data
    );
    assert_eq!(created.data["spec"]["ttlSeconds"], 900);
}

#[tokio::test]
async fn user_data_is_inline_or_by_reference_and_bounded() {
    let cp = control_plane().await;
    let ns = cp.fresh_namespace().await.expect("namespace");
    let resource = kube::api::ApiResource::erase::<banlieue_api::VirtualMachine>(&());
    let api: Api<DynamicObject> =
        Api::namespaced_with(cp.client().expect("client"), &ns, &resource);
    let vm = |name: &str, extra: Value| {
        let mut spec = json!({
            "classRef": { "name": "small" },
            "imageRef": { "name": "ubuntu-2404" },
            "storageClassName": "standard",
            "networkClassName": "prod"
        });
        spec.as_object_mut()
            .expect("spec")
            .extend(extra.as_object().expect("fields").clone());
        json!({ "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
                "metadata": { "name": name }, "spec": spec })
    };
    let (code, message) = refusal(
        create(
            &api,
            vm(
                "both",
                json!({ "userData": "#cloud-config\n",
            "userDataSecretRef": { "name": "s", "key": "user-data" } }),
            ),
        )
        .await,
    );
    assert_eq!(code, 422);
    assert!(
        message.contains("set at most one of userData and userDataSecretRef"),
        "{message}"
    );

    let too_big = "#".repeat(banlieue_api::machine::MAX_INLINE_USER_DATA + 1);
    let (code, message) = refusal(create(&api, vm("big", json!({ "userData": too_big }))).await);
    assert_eq!(code, 422);
    assert!(message.contains("spec.userData: Too long"), "{message}");

    let just_fits = "#".repeat(banlieue_api::machine::MAX_INLINE_USER_DATA);
    create(&api, vm("fits", json!({ "userData": just_fits })))
        .await
        .expect("64 KiB of user-data is accepted");
}

#[tokio::test]
async fn secure_boot_needs_efi_firmware() {
    let cp = control_plane().await;
    let ns = cp.fresh_namespace().await.expect("namespace");
    let resource = kube::api::ApiResource::erase::<banlieue_api::VMClass>(&());
    let api: Api<DynamicObject> =
        Api::namespaced_with(cp.client().expect("client"), &ns, &resource);
    let class = |name: &str, extra: Value| {
        let mut spec = json!({ "cpu": 1, "memory": "1Gi" });
        spec.as_object_mut()
            .expect("spec")
            .extend(extra.as_object().expect("fields").clone());
        json!({ "apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass",
                "metadata": { "name": name }, "spec": spec })
    };
    // The firmware's default (bios) counts as not efi, as an explicit bios does.
    for (name, extra) in [
        ("defaulted", json!({ "secureBoot": true })),
        ("bios", json!({ "secureBoot": true, "firmware": "bios" })),
    ] {
        let (code, message) = refusal(create(&api, class(name, extra)).await);
        assert_eq!(code, 422, "{name}");
        assert!(
            message.contains("secureBoot needs firmware: efi"),
            "{name}: {message}"
        );
    }
    let created = create(
        &api,
        class("secure", json!({ "secureBoot": true, "firmware": "efi" })),
    )
    .await
    .expect("secureBoot with efi is accepted");
    assert_eq!(created.data["spec"]["secureBoot"], json!(true));
    let plain = create(&api, class("plain", json!({})))
        .await
        .expect("a class without secureBoot is accepted");
    assert_eq!(
        plain.data["spec"]["secureBoot"],
        json!(false),
        "defaulted off"
    );
}

#[tokio::test]
async fn a_pool_scales_through_its_scale_subresource() {
    let cp = control_plane().await;
    let ns = cp.fresh_namespace().await.expect("namespace");
    let client = cp.client().expect("client");
    let applied =
        common::apply_file(&client, "examples/19-virtualmachinepool.yaml", Some(&ns)).await;
    assert_eq!(applied.len(), 1);
    let resource = kube::api::ApiResource::erase::<banlieue_api::VirtualMachinePool>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(client, &ns, &resource);
    // What `kubectl scale` and an HPA do.
    let scale = api
        .patch_scale(
            "sandbox-pool",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "replicas": 5 } })),
        )
        .await
        .expect("patch the scale subresource");
    assert_eq!(scale.spec.and_then(|s| s.replicas), Some(5));
    let pool = api.get("sandbox-pool").await.expect("get");
    assert_eq!(pool.data["spec"]["replicas"], 5);
}

#[tokio::test]
async fn the_table_api_prints_expires_as_a_deadline_and_age_as_an_age() {
    let cp = control_plane().await;
    let ns = cp.fresh_namespace().await.expect("namespace");
    let client = cp.client().expect("client");
    let api = claims(&client, &ns);
    create(
        &api,
        claim("sandbox-for-alice", "https://issuer.example.com", "alice"),
    )
    .await
    .expect("create");
    // A deadline in the future: as a date column it would print <invalid>.
    let deadline = "2099-09-20T14:17:11Z";
    api.patch_status(
        "sandbox-for-alice",
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": {
            "phase": "Bound",
            "virtualMachineRef": { "name": "sandbox-pool-9dmtx" },
            "boundAt": "2099-09-20T14:02:11Z",
            "expiresAt": deadline
        } })),
    )
    .await
    .expect("patch status");

    let request = http::Request::get(format!(
        "/apis/banlieue.io/v1alpha1/namespaces/{ns}/virtualmachineclaims/sandbox-for-alice"
    ))
    .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
    .body(Vec::new())
    .expect("request");
    let table: Value = client.request(request).await.expect("GET as Table");
    assert_eq!(table["kind"], "Table");
    let columns: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .expect("columns")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(columns, ["Name", "Pool", "VM", "Phase", "Expires", "Age"]);
    let cells = table["rows"][0]["cells"].as_array().expect("cells");
    assert_eq!(cells[0], "sandbox-for-alice");
    assert_eq!(cells[1], "sandbox-pool");
    assert_eq!(cells[2], "sandbox-pool-9dmtx");
    assert_eq!(cells[3], "Bound");
    assert_eq!(
        cells[4], deadline,
        "EXPIRES is the absolute RFC 3339 deadline"
    );
    let age = cells[5].as_str().expect("AGE is text");
    // Just created: an age in seconds such as "0s" or "5s", never a timestamp.
    assert!(
        age.ends_with('s') && age[..age.len() - 1].chars().all(|c| c.is_ascii_digit()),
        "AGE is an age, got {age:?}"
    );
}

fn pool(name: &str, template_metadata: Value) -> Value {
    json!({
        "apiVersion": "banlieue.io/v1alpha1",
        "kind": "VirtualMachinePool",
        "metadata": { "name": name },
        "spec": {
            "replicas": 1,
            "updateStrategy": { "type": "Replace" },
            "template": {
                "metadata": template_metadata,
                "spec": {
                    "classRef": { "name": "small" },
                    "imageRef": { "name": "ubuntu-2404" },
                    "storageClassName": "standard",
                    "networkClassName": "prod"
                }
            }
        }
    })
}

/// A template carrying `banlieue.io/claim` would make every member look bound: none could be
/// claimed, and the pool would create replacements without end.
#[tokio::test]
async fn a_pool_template_cannot_forge_banlieues_own_labels_or_annotations() {
    let cp = control_plane().await;
    let ns = cp.fresh_namespace().await.expect("namespace");
    let resource = kube::api::ApiResource::erase::<banlieue_api::VirtualMachinePool>(&());
    let api: Api<DynamicObject> =
        Api::namespaced_with(cp.client().expect("client"), &ns, &resource);

    let refused = [
        (
            json!({ "labels": { "banlieue.io/claim": "someone", "team": "a" } }),
            "spec.template.metadata.labels",
            "label banlieue.io/claim is reserved",
        ),
        (
            json!({ "labels": { "banlieue.io/pool": "other-pool" } }),
            "spec.template.metadata.labels",
            "label banlieue.io/pool is reserved",
        ),
        (
            json!({ "annotations": { "banlieue.io/subject-id": "mallory" } }),
            "spec.template.metadata.annotations",
            "annotation banlieue.io/subject-id is reserved",
        ),
    ];
    for (index, (metadata, path, words)) in refused.into_iter().enumerate() {
        let (code, message) =
            refusal(create(&api, pool(&format!("forged-{index}"), metadata)).await);
        assert_eq!(code, 422, "{message}");
        assert!(
            message.contains(path) && message.contains(words),
            "{message}"
        );
    }

    // Keys that merely mention the domain elsewhere are the user's own.
    create(
        &api,
        pool(
            "ordinary",
            json!({
                "labels": { "team": "a", "example.com/banlieue.io": "x" },
                "annotations": { "notbanlieue.io/a": "b" }
            }),
        ),
    )
    .await
    .expect("a template with ordinary keys is accepted");
}

#[tokio::test]
async fn a_ttl_near_i64_max_is_refused_rather_than_overflowing() {
    let cp = control_plane().await;
    let ns = cp.fresh_namespace().await.expect("namespace");
    let api = claims(&cp.client().expect("client"), &ns);
    for ttl in [i64::MAX, banlieue_api::pool::MAX_TTL_SECONDS + 1] {
        let mut huge = claim("huge-ttl", "https://issuer.example.com", "alice");
        huge["spec"]["ttlSeconds"] = json!(ttl);
        let (code, message) = refusal(create(&api, huge).await);
        assert_eq!(code, 422, "{message}");
        assert!(
            message.contains("spec.ttlSeconds")
                && message.contains("should be less than or equal to 315360000"),
            "{message}"
        );
    }
    let mut longest = claim("ten-years", "https://issuer.example.com", "alice");
    longest["spec"]["ttlSeconds"] = json!(banlieue_api::pool::MAX_TTL_SECONDS);
    create(&api, longest)
        .await
        .expect("the largest TTL is accepted");
}

/// A libvirt error can be megabytes long. Quoted whole, it makes the status write fail, so the
/// condition would keep saying whatever it said before; bounded, it is written.
#[tokio::test]
async fn a_four_mebibyte_error_still_reaches_the_condition_bounded() {
    use banlieue_api::conditions;
    let cp = control_plane().await;
    let ns = cp.fresh_namespace().await.expect("namespace");
    let api = claims(&cp.client().expect("client"), &ns);
    create(&api, claim("noisy", "https://issuer.example.com", "alice"))
        .await
        .expect("create");
    let error = format!("libvirt: {}", "é".repeat(2 << 20));
    let status_with = |message: String| {
        let mut condition = conditions::new("Bound", "False", "NoMemberAvailable", "", None);
        condition.message = message;
        condition.last_transition_time =
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default());
        json!({ "status": { "phase": "Pending", "conditions": [condition] } })
    };

    // What a condition built by hand, unbounded, meets.
    let unbounded = api
        .patch_status(
            "noisy",
            &PatchParams::default(),
            &Patch::Merge(status_with(error.clone())),
        )
        .await;
    assert!(unbounded.is_err(), "a 4 MiB condition message was stored");

    let bounded = conditions::new("Bound", "False", "NoMemberAvailable", error.clone(), None);
    let written = api
        .patch_status(
            "noisy",
            &PatchParams::default(),
            &Patch::Merge(status_with(bounded.message.clone())),
        )
        .await
        .expect("the bounded condition is written");
    let stored = written.data["status"]["conditions"][0]["message"]
        .as_str()
        .expect("message");
    assert!(stored.len() <= conditions::MAX_MESSAGE_BYTES);
    assert!(stored.ends_with(conditions::TRUNCATION_MARKER), "{stored}");
    assert!(error.starts_with(stored.trim_end_matches(conditions::TRUNCATION_MARKER)));
}

/// The API server refuses an Event whose note is over 1 KiB; a bounded note is published.
#[tokio::test]
async fn an_event_quoting_a_huge_error_is_still_published_bounded() {
    use banlieue_api::conditions;
    use k8s_openapi::api::events::v1::Event;
    let cp = control_plane().await;
    let ns = cp.fresh_namespace().await.expect("namespace");
    let events: Api<Event> = Api::namespaced(cp.client().expect("client"), &ns);
    let error = format!("libvirt: {}", "€".repeat(1 << 20));
    let event = |name: &str, note: String| -> Event {
        serde_json::from_value(json!({
            "metadata": { "name": name },
            "eventTime": "2026-01-01T00:00:00.000000Z",
            "reportingController": "banlieue.io/test",
            "reportingInstance": "test-1",
            "action": "Reconcile",
            "reason": "LibvirtError",
            "type": "Warning",
            "regarding": { "kind": "ConfigMap", "namespace": ns, "name": "c", "apiVersion": "v1" },
            "note": note
        }))
        .expect("event")
    };
    let (code, message) = refusal(
        events
            .create(
                &PostParams::default(),
                &event("whole", error.chars().take(2000).collect()),
            )
            .await,
    );
    assert_eq!(code, 422, "{message}");
    assert!(message.contains("at most 1024"), "{message}");

    let note = conditions::bounded_message(error.clone(), conditions::MAX_EVENT_NOTE_BYTES);
    let published = events
        .create(&PostParams::default(), &event("bounded", note))
        .await
        .expect("a bounded note is accepted");
    let stored = published.note.expect("note");
    assert!(stored.len() <= conditions::MAX_EVENT_NOTE_BYTES);
    assert!(stored.ends_with(conditions::TRUNCATION_MARKER), "{stored}");
}

#[tokio::test]
async fn a_claims_access_is_public_keys_for_one_posix_login() {
    let cp = control_plane().await;
    let ns = cp.fresh_namespace().await.expect("namespace");
    let api = claims(&cp.client().expect("client"), &ns);
    let with_access = |name: &str, access: Value| {
        let mut object = claim(name, "https://issuer.example.com", "alice");
        object["spec"]["access"] = access;
        object
    };

    // A malformed entry is refused with its index, whatever else the list holds.
    for (bad, what) in [
        ("ssh-dss AAAAB3NzaC1kc3M=", "a refused key type"),
        ("ssh-ed25519 not*base64", "not base64"),
        ("command=\"id\" ssh-ed25519 AAAA", "options before the key"),
        (
            "ssh-ed25519 AAAA one\nssh-rsa AAAA two",
            "two keys in one entry",
        ),
    ] {
        let access = json!({ "sshAuthorizedKeys": [ed25519_public_key(1, "laptop"), bad] });
        let (code, message) = refusal(create(&api, with_access("bad-key", access)).await);
        assert_eq!(code, 422, "{what}: {message}");
        assert!(
            message.contains("spec.access.sshAuthorizedKeys[1]: Invalid value")
                && !message.contains("sshAuthorizedKeys[0]"),
            "{what}: {message}"
        );
    }

    // Bounded: seventeen keys, or one longer than a key can be, are refused.
    let many: Vec<String> = (0..17).map(|i| ed25519_public_key(i, "k")).collect();
    let (code, message) = refusal(
        create(
            &api,
            with_access("many", json!({ "sshAuthorizedKeys": many })),
        )
        .await,
    );
    assert_eq!(code, 422, "{message}");
    assert!(message.contains("must have at most 16 items"), "{message}");
    let long = format!("{}{}", ed25519_public_key(1, ""), "x".repeat(8192));
    let (code, message) = refusal(
        create(
            &api,
            with_access("long", json!({ "sshAuthorizedKeys": [long] })),
        )
        .await,
    );
    assert_eq!(code, 422, "{message}");
    assert!(message.contains("Too long"), "{message}");

    // The login is a POSIX user name.
    for user in ["Alice", "1alice", "al ice", "a".repeat(33).as_str(), ""] {
        let access = json!({ "sshAuthorizedKeys": [ed25519_public_key(1, "k")], "user": user });
        let (code, message) = refusal(create(&api, with_access("bad-user", access)).await);
        assert_eq!(code, 422, "{user:?}: {message}");
        assert!(message.contains("spec.access.user"), "{user:?}: {message}");
    }

    // Good keys and a login are kept as written; the spec, access included, cannot change.
    let keys = [
        ed25519_public_key(1, "alice@laptop"),
        ed25519_public_key(2, ""),
    ];
    let access = json!({ "sshAuthorizedKeys": keys, "user": "alice_2" });
    let created = create(&api, with_access("ok", access))
        .await
        .expect("well-formed access is accepted");
    assert_eq!(
        created.data["spec"]["access"]["sshAuthorizedKeys"][0],
        keys[0]
    );
    let error = api
        .patch(
            "ok",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "access": { "sshAuthorizedKeys": [ed25519_public_key(9, "mallory")] } } })),
        )
        .await
        .expect_err("access is immutable");
    let (code, message) = refusal(Err::<DynamicObject, _>(error));
    assert_eq!(code, 422, "{message}");
    assert!(message.contains("spec is immutable"), "{message}");

    // A claim without access is accepted as before.
    create(&api, claim("plain", "https://issuer.example.com", "alice"))
        .await
        .expect("a claim without access");
}

/// A pool's members hold no consumer's key before their bind: a template carrying `access`
/// would plant its keys in every later subject's sandbox. The template keeps the spec type's
/// own rule beside it.
#[tokio::test]
async fn a_pool_template_carries_no_access() {
    let cp = control_plane().await;
    let ns = cp.fresh_namespace().await.expect("namespace");
    let resource = kube::api::ApiResource::erase::<banlieue_api::VirtualMachinePool>(&());
    let pools: Api<DynamicObject> =
        Api::namespaced_with(cp.client().expect("client"), &ns, &resource);
    let mut keyed = pool("keyed", json!({}));
    keyed["spec"]["template"]["spec"]["access"] =
        json!({ "sshAuthorizedKeys": [ed25519_public_key(3, "planted")] });
    let (code, message) = refusal(create(&pools, keyed).await);
    assert_eq!(code, 422, "{message}");
    assert!(
        message.contains("a pool's template carries no access"),
        "{message}"
    );
    let mut both = pool("both", json!({}));
    both["spec"]["template"]["spec"]["userData"] = json!("#cloud-config\n");
    both["spec"]["template"]["spec"]["userDataSecretRef"] = json!({ "name": "s", "key": "k" });
    let (code, message) = refusal(create(&pools, both).await);
    assert_eq!(code, 422, "{message}");
    assert!(
        message.contains("set at most one of userData and userDataSecretRef"),
        "{message}"
    );
    create(&pools, pool("plain", json!({})))
        .await
        .expect("a template without access");
}

/// A class's egress (ADR-0078) is refused at the API server when one rule shows it wrong: a
/// CIDR that is not IPv4 or has host bits set, ports without TCP or UDP, a range that ends
/// before it starts or has no start, a resolver that is not an IPv4 address, an unknown
/// protocol or opt-out, too many rules; each message names what is wrong.
#[tokio::test]
async fn a_class_egress_is_ipv4_rules_the_host_can_filter() {
    let cp = control_plane().await;
    let ns = cp.fresh_namespace().await.expect("namespace");
    let resource = kube::api::ApiResource::erase::<banlieue_api::VMClass>(&());
    let api: Api<DynamicObject> =
        Api::namespaced_with(cp.client().expect("client"), &ns, &resource);
    let class = |name: &str, egress: Value| {
        json!({ "apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass",
                "metadata": { "name": name },
                "spec": { "cpu": 1, "memory": "1Gi", "egress": egress } })
    };
    let rule = |rule: Value| json!({ "allow": [rule] });
    let created = create(
        &api,
        class(
            &format!("{ns}-egress"),
            json!({
                "allow": [
                    { "cidr": "10.0.0.0/8", "protocol": "TCP", "port": 443, "endPort": 444 },
                    { "cidr": "192.0.2.7/32", "protocol": "ICMP" },
                    { "cidr": "0.0.0.0/0" }
                ],
                "dnsResolver": "10.0.0.53",
                "allowAlwaysDenied": ["LinkLocal"]
            }),
        ),
    )
    .await
    .expect("a valid egress is accepted");
    assert_eq!(
        created.data["spec"]["egress"]["allow"][2]["protocol"],
        "Any"
    );
    let too_many: Vec<Value> = (0..65)
        .map(|i| json!({ "cidr": format!("10.{i}.0.0/16") }))
        .collect();
    for (name, egress, expected) in [
        (
            "host-bits",
            rule(json!({ "cidr": "10.0.0.1/8" })),
            "cidr 10.0.0.1/8 is not an IPv4 CIDR with its host bits zero",
        ),
        (
            "ipv6",
            rule(json!({ "cidr": "fd00::/8" })),
            "cidr fd00::/8 is not an IPv4 CIDR",
        ),
        (
            "garbage",
            rule(json!({ "cidr": "not.a.cidr/8" })),
            "is not an IPv4 CIDR",
        ),
        (
            "icmp-port",
            rule(json!({ "cidr": "10.0.0.0/8", "protocol": "ICMP", "port": 1 })),
            "port needs protocol TCP or UDP",
        ),
        (
            "any-port",
            rule(json!({ "cidr": "10.0.0.0/8", "port": 80 })),
            "port needs protocol TCP or UDP",
        ),
        (
            "reversed",
            rule(json!({ "cidr": "10.0.0.0/8", "protocol": "TCP", "port": 90, "endPort": 80 })),
            "endPort needs port, and may not be below it",
        ),
        (
            "end-only",
            rule(json!({ "cidr": "10.0.0.0/8", "protocol": "TCP", "endPort": 80 })),
            "endPort needs port, and may not be below it",
        ),
        (
            "port-range",
            rule(json!({ "cidr": "10.0.0.0/8", "protocol": "UDP", "port": 70000 })),
            "should be less than or equal to 65535",
        ),
        (
            "protocol",
            rule(json!({ "cidr": "10.0.0.0/8", "protocol": "SCTP" })),
            "Unsupported value: \"SCTP\"",
        ),
        (
            "resolver",
            json!({ "dnsResolver": "ns1.example" }),
            "dnsResolver must be an IPv4 address",
        ),
        (
            "resolver-v6",
            json!({ "dnsResolver": "fd00::53" }),
            "dnsResolver must be an IPv4 address",
        ),
        (
            "opt-out",
            json!({ "allowAlwaysDenied": ["Everything"] }),
            "Unsupported value: \"Everything\"",
        ),
        (
            "too-many",
            json!({ "allow": too_many }),
            "must have at most 64 items",
        ),
    ] {
        let (code, message) = refusal(create(&api, class(&format!("{ns}-{name}"), egress)).await);
        assert_eq!(code, 422, "{name}: {message}");
        assert!(message.contains(expected), "{name}: {message}");
    }
}

//! Writing `status.buildArtifact`. The reconciler replaces it whole; a build Job replaces it
//! only while it still names the digest the Job builds, so a Job left over from a tag that
//! has since moved can never overwrite the newer build's status.

use banlieue_api::conditions::{MAX_MESSAGE_BYTES, bounded_message};
use banlieue_api::{BuildArtifact, VMImage};
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

/// The field manager of the builder's and the reconciler's status writes.
pub const FIELD_MANAGER: &str = "banlieue-imagebuilder";

/// A merge patch that makes `status.buildArtifact` exactly `artifact`: fields it does not
/// set are removed (a merge patch would otherwise keep the previous build's sha256 and size).
pub fn replace_patch(artifact: &BuildArtifact) -> Value {
    let mut value = serde_json::to_value(bounded(artifact)).unwrap_or_else(|_| json!({}));
    if let Value::Object(map) = &mut value {
        for field in [
            "claimName",
            "path",
            "sizeBytes",
            "sha256",
            "manifestDigest",
            "reason",
            "message",
            "bytesDone",
            "bytesTotal",
        ] {
            map.entry(field).or_insert(Value::Null);
        }
    }
    json!({ "status": { "buildArtifact": value } })
}

/// A JSON patch that replaces `status.buildArtifact` only if it still names `digest`; the API
/// server refuses the whole patch (422) otherwise.
pub fn guarded_patch(digest: &str, artifact: &BuildArtifact) -> Value {
    json!([
        { "op": "test", "path": "/status/buildArtifact/manifestDigest", "value": digest },
        { "op": "replace", "path": "/status/buildArtifact", "value": bounded(artifact) },
    ])
}

/// `artifact` with its message cut to what the CRD accepts: a message quotes registry answers
/// and references, and a write the API server refuses would leave the previous status standing.
fn bounded(artifact: &BuildArtifact) -> BuildArtifact {
    BuildArtifact {
        message: artifact
            .message
            .as_ref()
            .map(|m| bounded_message(m.as_str(), MAX_MESSAGE_BYTES)),
        ..artifact.clone()
    }
}

/// Replaces the status (the reconciler's write).
pub async fn replace(
    api: &Api<VMImage>,
    name: &str,
    artifact: &BuildArtifact,
) -> Result<(), kube::Error> {
    api.patch_status(
        name,
        &PatchParams::apply(FIELD_MANAGER),
        &Patch::Merge(replace_patch(artifact)),
    )
    .await
    .map(|_| ())
}

/// The outcome of a guarded write.
#[derive(Debug, PartialEq, Eq)]
pub enum Guarded {
    Written,
    /// The status names another digest now: this build is no longer the one that counts.
    Superseded,
}

/// Replaces the status if it still names `digest` (the build Job's write).
pub async fn replace_if_current(
    api: &Api<VMImage>,
    name: &str,
    digest: &str,
    artifact: &BuildArtifact,
) -> Result<Guarded, kube::Error> {
    let patch: json_patch::Patch =
        serde_json::from_value(guarded_patch(digest, artifact)).map_err(kube::Error::SerdeError)?;
    match api
        .patch_status(name, &PatchParams::default(), &Patch::<()>::Json(patch))
        .await
    {
        Ok(_) => Ok(Guarded::Written),
        Err(kube::Error::Api(status)) if status.code == 422 => Ok(Guarded::Superseded),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::ArtifactPhase;

    #[test]
    fn a_replacement_clears_what_it_does_not_set() {
        let patch = replace_patch(&BuildArtifact {
            kind: "cloudImage".into(),
            phase: ArtifactPhase::Pending,
            manifest_digest: Some("sha256:1".into()),
            ..BuildArtifact::default()
        });
        let a = &patch["status"]["buildArtifact"];
        assert_eq!(a["phase"], "Pending");
        assert_eq!(a["manifestDigest"], "sha256:1");
        assert!(a["sha256"].is_null() && a.get("sha256").is_some());
        assert!(a.get("sizeBytes").is_some());
    }

    #[test]
    fn the_guard_tests_the_digest_first() {
        let p = guarded_patch("sha256:1", &BuildArtifact::default());
        assert_eq!(p[0]["op"], "test");
        assert_eq!(p[0]["value"], "sha256:1");
        assert_eq!(p[1]["path"], "/status/buildArtifact");
        let parsed: Result<json_patch::Patch, _> = serde_json::from_value(p);
        assert!(parsed.is_ok());
    }

    #[test]
    fn both_writes_cut_a_long_message_to_what_the_crd_accepts() {
        let long = BuildArtifact {
            message: Some("é".repeat(MAX_MESSAGE_BYTES)),
            ..BuildArtifact::default()
        };
        let replaced = replace_patch(&long);
        let guarded = guarded_patch("sha256:1", &long);
        for message in [
            &replaced["status"]["buildArtifact"]["message"],
            &guarded[1]["value"]["message"],
        ] {
            let message = message.as_str().expect("a message");
            assert!(message.len() <= MAX_MESSAGE_BYTES, "{}", message.len());
            assert!(message.ends_with(banlieue_api::conditions::TRUNCATION_MARKER));
        }
    }
}

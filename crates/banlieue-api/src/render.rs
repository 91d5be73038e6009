//! The CRD manifests as YAML: what `banlieue crds` prints and what `deploy/crds/` holds.
//!
//! Pure functions over [`crate::crds`], so the committed files, the CLI and the drift test all
//! see the same bytes.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

/// The header of every rendered document: the files are generated and say how to regenerate.
pub const HEADER: &str = "# Generated from crates/banlieue-api by `banlieue crds`; do not edit.\n\
# Regenerate: cargo run -p banlieue -- crds --out deploy/crds\n";

/// Errors of rendering.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("serialize CRD {name} as YAML")]
    Yaml {
        name: String,
        #[source]
        source: serde_saphyr::SerializeError,
    },
}

/// One CRD as a YAML document, with the generated-file header.
pub fn crd_yaml(crd: &CustomResourceDefinition) -> Result<String, Error> {
    let body = serde_saphyr::to_string(crd).map_err(|source| Error::Yaml {
        name: crd.metadata.name.clone().unwrap_or_default(),
        source,
    })?;
    Ok(format!("{HEADER}{body}"))
}

/// Every CRD, one file each: `(file name, contents)` in [`crate::crds`] order. The file name is
/// the CRD's name (`<plural>.<group>.yaml`).
pub fn crd_files() -> Result<Vec<(String, String)>, Error> {
    crd_files_of(&crate::crds())
}

/// `crds`, one file each, as [`crd_files`] writes them.
pub fn crd_files_of(crds: &[CustomResourceDefinition]) -> Result<Vec<(String, String)>, Error> {
    crds.iter()
        .map(|crd| {
            let name = crd.metadata.name.clone().unwrap_or_default();
            Ok((format!("{name}.yaml"), crd_yaml(crd)?))
        })
        .collect()
}

/// Every CRD as one multi-document YAML stream, in [`crate::crds`] order.
pub fn crds_yaml() -> String {
    crds_yaml_of(&crate::crds())
}

/// `crds` as one multi-document YAML stream, in their order.
pub fn crds_yaml_of(crds: &[CustomResourceDefinition]) -> String {
    // Serializing plain data structures to YAML cannot fail: every map key is a string.
    match crd_files_of(crds) {
        Ok(files) => files
            .into_iter()
            .map(|(_, text)| format!("---\n{text}"))
            .collect(),
        Err(error) => unreachable!("CRDs always serialize: {error}"),
    }
}

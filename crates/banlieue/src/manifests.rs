//! The parts of `deploy/` that follow from the backends of this build (ADR-0071): each CRD's
//! file, each backend's shipped class ClusterRole, and every list in a hand-written manifest
//! that names one item per CRD, per machine kind or per class role. `banlieue manifests`
//! writes them, and a test fails when `deploy/` and the backends disagree, so a new backend
//! changes nothing under `deploy/` by hand.
//!
//! A generated list sits between two comment lines that say what it lists, for example:
//!
//! ```yaml
//!         resources:
//!           # banlieue manifests, each machine kind: {plural} {plural}/status
//!           - libvirtmachines
//!           - libvirtmachines/status
//!           # banlieue manifests: end
//! ```
//!
//! Each template after the colon becomes one `- item` line per element, at the marker's
//! indentation; what was between the markers is replaced. The rest of the file is kept as
//! written. Rendering is sans-io; only [`manifest_paths`] reads the directory.

use std::fmt::Write as _;

use crate::backends;
use banlieue_provider_kit::descriptor::Descriptor;

/// What starts a generated list.
const BEGIN: &str = "# banlieue manifests, each ";
/// What ends one.
const END: &str = "# banlieue manifests: end";

/// The lists a manifest can name, with the one placeholder each fills.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lists {
    /// `each crd`, `{name}`: every CRD's name (`vmimages.banlieue.io`), sorted.
    pub crds: Vec<String>,
    /// `each machine kind`, `{plural}`: every backend's machine resource, in backend order.
    pub machine_kinds: Vec<String>,
    /// `each class role`, `{backend}`: every backend that ships a class ClusterRole (named
    /// `banlieue-provider-class-<backend>`, in `rbac/provider-class-<backend>-clusterrole.yaml`).
    pub class_roles: Vec<String>,
}

impl Lists {
    /// The lists of `backends` (the neutral CRDs included).
    pub fn of(backends: &[Descriptor]) -> Self {
        let mut crds: Vec<String> = banlieue_api::neutral_crds()
            .into_iter()
            .chain(backends.iter().flat_map(|backend| (backend.crds)()))
            .filter_map(|crd| crd.metadata.name)
            .collect();
        crds.sort();
        Self {
            crds,
            machine_kinds: backends
                .iter()
                .map(|backend| backend.machine.resource.plural.clone())
                .collect(),
            class_roles: backends
                .iter()
                .filter(|backend| backend.class_role_manifest.is_some())
                .map(|backend| backend.name().to_owned())
                .collect(),
        }
    }

    /// The elements of `each <what>`, and the placeholder their template uses.
    fn each(&self, what: &str) -> Option<(&[String], &'static str)> {
        match what {
            "crd" => Some((&self.crds, "{name}")),
            "machine kind" => Some((&self.machine_kinds, "{plural}")),
            "class role" => Some((&self.class_roles, "{backend}")),
            _ => None,
        }
    }
}

/// Where `backend`'s class ClusterRole is shipped, under `deploy/rbac/`.
pub fn class_role_file(backend: &Descriptor) -> String {
    format!("provider-class-{}-clusterrole.yaml", backend.name())
}

/// Why a manifest's generated lists cannot be rendered.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BlockError {
    #[error("line {line}: `{marker}` has no `{END}` after it")]
    Unterminated { line: usize, marker: String },
    #[error("line {line}: `each {what}` is not a list (crd, machine kind, class role)")]
    UnknownList { line: usize, what: String },
    #[error("line {line}: the template `{template}` does not use {placeholder}")]
    NoPlaceholder {
        line: usize,
        template: String,
        placeholder: &'static str,
    },
}

/// `text` with every generated list rendered from `lists`; the same text when it has none.
pub fn render_lists(text: &str, lists: &Lists) -> Result<String, BlockError> {
    let mut out = String::with_capacity(text.len());
    let mut lines = text.split_inclusive('\n').enumerate();
    while let Some((index, line)) = lines.next() {
        out.push_str(line);
        let trimmed = line.trim_start();
        let Some(spec) = trimmed.strip_prefix(BEGIN) else {
            continue;
        };
        let number = index + 1;
        let indent = &line[..line.len() - trimmed.len()];
        let (what, templates) = spec
            .trim_end()
            .split_once(':')
            .unwrap_or((spec.trim_end(), ""));
        let (elements, placeholder) = lists.each(what).ok_or_else(|| BlockError::UnknownList {
            line: number,
            what: what.to_owned(),
        })?;
        let templates: Vec<&str> = templates.split_whitespace().collect();
        if let Some(template) = templates.iter().find(|t| !t.contains(placeholder)) {
            return Err(BlockError::NoPlaceholder {
                line: number,
                template: (*template).to_owned(),
                placeholder,
            });
        }
        // Skip what the markers held before, up to and including the end marker.
        let end = lines
            .by_ref()
            .find(|(_, l)| l.trim() == END)
            .ok_or_else(|| BlockError::Unterminated {
                line: number,
                marker: trimmed.trim_end().to_owned(),
            })?
            .1;
        for element in elements {
            for template in &templates {
                let item = template.replace(placeholder, element);
                // Writing into a String cannot fail.
                let _ = writeln!(out, "{indent}- {item}");
            }
        }
        out.push_str(end);
    }
    Ok(out)
}

/// A file under `deploy/` and what it must hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    /// Its path relative to `deploy/`.
    pub path: String,
    pub text: String,
}

/// Every generated file of `deploy/` (the CRDs, the class roles) as this build's backends
/// make them, and every hand-written manifest whose lists they change: `read` gives a
/// manifest's current text by its path relative to `deploy/`, `hand_written` lists those
/// paths.
pub fn wanted(
    hand_written: &[String],
    read: impl Fn(&str) -> Option<String>,
) -> Result<Vec<Wanted>, ManifestError> {
    let backends = backends::all();
    let lists = Lists::of(&backends);
    let mut wanted = Vec::new();
    for (file, text) in banlieue_api::render::crd_files_of(&backends::crds())
        .map_err(|e| ManifestError::Render(e.to_string()))?
    {
        wanted.push(Wanted {
            path: format!("crds/{file}"),
            text,
        });
    }
    for backend in &backends {
        if let Some(text) = backend.class_role_manifest {
            check_class_role(backend, text)?;
            wanted.push(Wanted {
                path: format!("rbac/{}", class_role_file(backend)),
                text: format!(
                    "# Written by `banlieue manifests` from the {} backend's crate \
                     (class-clusterrole.yaml): edit it there.\n{text}",
                    backend.name()
                ),
            });
        }
    }
    for path in hand_written {
        if wanted.iter().any(|w| &w.path == path) {
            continue;
        }
        // Only a manifest with a generated list is rendered: nothing else in it changes.
        let Some(text) = read(path).filter(|text| text.contains(BEGIN)) else {
            continue;
        };
        let rendered = render_lists(&text, &lists).map_err(|error| ManifestError::List {
            path: path.clone(),
            error,
        })?;
        wanted.push(Wanted {
            path: path.clone(),
            text: rendered,
        });
    }
    Ok(wanted)
}

/// The class role of `backend` is one ClusterRole named as the lists name it.
fn check_class_role(backend: &Descriptor, text: &str) -> Result<(), ManifestError> {
    let wanted = format!("banlieue-provider-class-{}", backend.name());
    let objects = crate::apply::parse_documents(&class_role_file(backend), text)
        .map_err(|e| ManifestError::ClassRole(e.to_string()))?;
    match objects.as_slice() {
        [role]
            if role.types.as_ref().is_some_and(|t| t.kind == "ClusterRole")
                && role.metadata.name.as_deref() == Some(wanted.as_str()) =>
        {
            Ok(())
        }
        _ => Err(ManifestError::ClassRole(format!(
            "the {} backend's class role must be one ClusterRole named {wanted}",
            backend.name()
        ))),
    }
}

/// Why `deploy/` cannot be rendered.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("rendering the CRDs: {0}")]
    Render(String),
    #[error("{0}")]
    ClassRole(String),
    #[error("deploy/{path}: {error}")]
    List { path: String, error: BlockError },
}

/// The YAML files under `deploy` (relative paths), the chart's links left out: the manifests
/// whose lists `banlieue manifests` renders.
pub fn manifest_paths(deploy: &std::path::Path) -> Vec<String> {
    let mut paths = Vec::new();
    let mut dirs = vec![std::path::PathBuf::new()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(deploy.join(&dir)) else {
            continue;
        };
        for entry in entries.flatten() {
            let relative = dir.join(entry.file_name());
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() && entry.file_name() != "helm" {
                dirs.push(relative);
            } else if kind.is_file() && relative.extension().is_some_and(|x| x == "yaml") {
                paths.push(relative.to_string_lossy().into_owned());
            }
        }
    }
    paths.sort();
    paths
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lists() -> Lists {
        Lists {
            crds: vec!["a.banlieue.io".into(), "b.banlieue.io".into()],
            machine_kinds: vec!["onemachines".into(), "twomachines".into()],
            class_roles: vec!["one".into()],
        }
    }

    #[test]
    fn a_list_is_replaced_at_its_indentation() {
        let text = "\
resources:
    # banlieue manifests, each machine kind: {plural} {plural}/status
    - stale
    # banlieue manifests: end
kept: true
";
        let rendered = render_lists(text, &lists()).unwrap();
        assert_eq!(
            rendered,
            "\
resources:
    # banlieue manifests, each machine kind: {plural} {plural}/status
    - onemachines
    - onemachines/status
    - twomachines
    - twomachines/status
    # banlieue manifests: end
kept: true
"
        );
        // Rendering is a fixed point: a rendered file renders to itself.
        assert_eq!(render_lists(&rendered, &lists()).unwrap(), rendered);
    }

    #[test]
    fn crds_and_class_roles_fill_their_placeholders() {
        // Indented, as in a kustomization's `resources:`.
        let text = concat!(
            "  # banlieue manifests, each crd: crds/{name}.yaml\n",
            "  # banlieue manifests: end\n",
            "  # banlieue manifests, each class role: rbac/provider-class-{backend}-clusterrole.yaml\n",
            "  # banlieue manifests: end",
        );
        let rendered = render_lists(text, &lists()).unwrap();
        assert!(rendered.contains("  - crds/a.banlieue.io.yaml\n  - crds/b.banlieue.io.yaml\n"));
        assert!(rendered.ends_with(
            "  - rbac/provider-class-one-clusterrole.yaml\n  # banlieue manifests: end"
        ));
    }

    #[test]
    fn malformed_markers_are_refused_with_their_line() {
        let unterminated = "a: 1\n# banlieue manifests, each crd: {name}\n- x\n";
        assert!(matches!(
            render_lists(unterminated, &lists()),
            Err(BlockError::Unterminated { line: 2, .. })
        ));
        let unknown = "# banlieue manifests, each node: {name}\n# banlieue manifests: end\n";
        assert_eq!(
            render_lists(unknown, &lists()),
            Err(BlockError::UnknownList {
                line: 1,
                what: "node".into()
            })
        );
        let wrong = "# banlieue manifests, each crd: {plural}\n# banlieue manifests: end\n";
        assert!(matches!(
            render_lists(wrong, &lists()),
            Err(BlockError::NoPlaceholder { line: 1, .. })
        ));
    }

    /// `deploy/` is what this build's backends make of it: the CRDs, the class roles and every
    /// generated list. Fails after a backend is added, removed or changed until
    /// `banlieue manifests` is run.
    #[cfg(all(feature = "libvirt", feature = "vsphere"))]
    #[test]
    fn deploy_is_what_the_backends_make() {
        let deploy = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy");
        let hand_written = manifest_paths(&deploy);
        let wanted = wanted(&hand_written, |path| {
            std::fs::read_to_string(deploy.join(path)).ok()
        })
        .unwrap();
        let mut stale = Vec::new();
        for file in &wanted {
            if std::fs::read_to_string(deploy.join(&file.path))
                .ok()
                .as_ref()
                != Some(&file.text)
            {
                stale.push(file.path.clone());
            }
        }
        assert!(
            stale.is_empty(),
            "deploy/ differs from the backends in {stale:?}: run `banlieue manifests`"
        );
        // The lists are in use: the kustomize base lists every CRD and class role from them,
        // and the machine-provider policy every machine kind.
        let paths: Vec<&str> = wanted.iter().map(|w| w.path.as_str()).collect();
        for path in [
            "kustomization.yaml",
            "admission/machine-provider-writes.yaml",
            "rbac/controller-clusterrole.yaml",
            "rbac/provider-class-vsphere-clusterrole.yaml",
        ] {
            assert!(paths.contains(&path), "{path} is not generated: {paths:?}");
        }
    }
}

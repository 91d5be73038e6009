//! banlieue-xdrgen: parses the ONC RPC language (RFC 4506 §6 / RFC 5531 §12) as libvirt's
//! `.x` protocol files use it, and emits typed Rust with encoders, decoders and per-program
//! procedure tables.
//!
//! [`generate`] is pure: input texts in, one formatted Rust module per input out. [`compile`]
//! is the thin build-script wrapper that reads files, writes `OUT_DIR` and prints
//! `cargo:rerun-if-changed` for every input.

pub mod ast;
mod emit;
mod error;
mod header_constants;
pub mod ident;
pub mod model;
mod parse;
pub mod sample;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use emit::Options;
pub use error::{Error, Location, Result};
pub use header_constants::HEADER_CONSTANTS;
pub use parse::parse;

/// One input file.
#[derive(Debug, Clone)]
pub struct Input {
    /// The Rust module the file's items go to.
    pub module: String,
    /// How errors and doc comments name the file.
    pub file: String,
    pub source: String,
}

impl Input {
    /// An input named after its path, with the module name derived from the file stem.
    pub fn from_path(path: &Path) -> std::io::Result<Input> {
        let source = std::fs::read_to_string(path)?;
        let file = path.file_name().map_or_else(
            || path.display().to_string(),
            |f| f.to_string_lossy().into_owned(),
        );
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        Ok(Input {
            module: ident::module_name(&stem),
            file,
            source,
        })
    }
}

/// Parses and resolves every input together (later files may use earlier files' types).
pub fn model(inputs: &[Input]) -> Result<model::Model> {
    let specs = inputs
        .iter()
        .map(|i| parse(&i.file, &i.source))
        .collect::<Result<Vec<_>>>()?;
    let files: Vec<model::ParsedFile<'_>> = inputs
        .iter()
        .zip(&specs)
        .map(|(i, spec)| model::ParsedFile {
            module: &i.module,
            file: &i.file,
            spec,
        })
        .collect();
    model::resolve(&files)
}

/// Generates one formatted Rust module per input, keyed by module name.
pub fn generate(inputs: &[Input], opts: &Options) -> Result<BTreeMap<String, String>> {
    let model = model(inputs)?;
    model
        .modules
        .iter()
        .map(|m| Ok((m.name.clone(), emit::module(&model, m, opts)?)))
        .collect()
}

/// Build-script entry point: generates from `paths` into `out_dir/<module>.rs` and tells cargo
/// to rerun when any input changes. Returns the written files.
pub fn compile(
    paths: &[PathBuf],
    out_dir: &Path,
    opts: &Options,
) -> std::result::Result<Vec<PathBuf>, Box<dyn std::error::Error>> {
    let mut inputs = Vec::new();
    for path in paths {
        println!("cargo:rerun-if-changed={}", path.display());
        inputs.push(Input::from_path(path).map_err(|e| format!("read {}: {e}", path.display()))?);
    }
    let mut written = Vec::new();
    for (module, text) in generate(&inputs, opts)? {
        let path = out_dir.join(format!("{module}.rs"));
        // Leave an unchanged file untouched so dependants do not rebuild.
        if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
            std::fs::write(&path, text)?;
        }
        written.push(path);
    }
    Ok(written)
}

//! Generates the protocol modules from libvirt's `.x` files in the crate's `protocol/`.
//!
//! In the repository `protocol/fetch` puts them there; a packaged crate carries them. Either
//! way every file is checked against `protocol/SHA256SUMS` before the generator reads it, so
//! the generated code always comes from the libvirt release the crate was written against.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

include!("protocol_files.rs");

fn main() {
    let manifest = PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    );
    let protocol = manifest.join("protocol");
    println!("cargo:rerun-if-changed=protocol_files.rs");
    println!("cargo:rerun-if-changed=protocol/SHA256SUMS");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));

    let sums = read_sums(&protocol.join("SHA256SUMS"));
    let mut paths = Vec::new();
    for f in PROTOCOL_FILES {
        let p = protocol.join(f);
        verify(&p, sums.get(*f).map(String::as_str));
        paths.push(p);
    }
    // compile() prints rerun-if-changed for every file it reads.
    generate(&paths, &out.join("protocol"));
    // A fixture that uses every construct the generator supports, compiled for the tests.
    let fixture = manifest.join("tests/fixtures/constructs.x");
    generate(&[fixture], &out.join("fixture"));
}

/// `SHA256SUMS` as `sha256sum` writes it: file name → lower-case hex digest.
fn read_sums(path: &Path) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| fail(path, &e.to_string()));
    text.lines()
        .filter_map(|l| l.split_once("  "))
        .map(|(sum, name)| (name.trim().to_owned(), sum.trim().to_owned()))
        .collect()
}

fn verify(path: &Path, expected: Option<&str>) {
    let Some(expected) = expected else {
        fail(path, "has no line in protocol/SHA256SUMS");
    };
    let bytes = std::fs::read(path).unwrap_or_else(|e| {
        fail(path, &format!("cannot be read ({e}); in the repository run `protocol/fetch` (or `scripts/setup`) first"))
    });
    let actual: String = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    if actual != expected {
        fail(
            path,
            &format!(
                "has sha256 {actual}, protocol/SHA256SUMS wants {expected}: not the libvirt release this crate is built from"
            ),
        );
    }
}

fn fail(path: &Path, why: &str) -> ! {
    eprintln!("error: {} {why}", path.display());
    std::process::exit(1);
}

fn generate(paths: &[PathBuf], dir: &Path) {
    std::fs::create_dir_all(dir).expect("create generated-code directory");
    let opts = banlieue_xdrgen::Options {
        runtime: "crate::xdr".into(),
    };
    if let Err(e) = banlieue_xdrgen::compile(paths, dir, &opts) {
        eprintln!("error: generating Rust from libvirt's protocol files: {e}");
        std::process::exit(1);
    }
}

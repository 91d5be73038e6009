//! Generates the protocol modules from libvirt's `.x` files in the workspace's `protocol/`.

use std::path::{Path, PathBuf};

include!("protocol_files.rs");

fn main() {
    let manifest = PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    );
    let protocol = std::env::var_os("BANLIEUE_PROTOCOL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest.join("../../protocol"));
    println!("cargo:rerun-if-env-changed=BANLIEUE_PROTOCOL_DIR");
    println!("cargo:rerun-if-changed=protocol_files.rs");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));

    let paths: Vec<PathBuf> = PROTOCOL_FILES.iter().map(|f| protocol.join(f)).collect();
    for p in &paths {
        println!("cargo:rerun-if-changed={}", p.display());
        if !p.exists() {
            eprintln!(
                "error: {} is missing: run `protocol/fetch` (or `scripts/setup`) first",
                p.display()
            );
            std::process::exit(1);
        }
    }
    generate(&paths, &out.join("protocol"));
    // A fixture that uses every construct the generator supports, compiled for the tests.
    generate(
        &[manifest.join("tests/fixtures/constructs.x")],
        &out.join("fixture"),
    );
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

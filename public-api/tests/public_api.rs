//! The crate's public API, pinned: a change to it (an item added, removed or changed in
//! signature) is a snapshot diff in review, and a deliberate one is accepted with
//! `cargo insta review`. The generated protocol (`proto::`) is left out: it changes only with
//! the verified libvirt protocol files (`protocol/SHA256SUMS`), and lists ~19,000 items.
//!
//! rustdoc's JSON output is still unstable; it is asked of the stable toolchain with
//! `RUSTC_BOOTSTRAP=1`, as `cargo public-api` asks it of a nightly one, so no second toolchain
//! is needed. The JSON is built into a target directory of its own, so this nested cargo never
//! waits on the outer one's lock. This test is a workspace of its own (`Cargo.toml` says why):
//! `cargo test --manifest-path public-api/Cargo.toml`.

use std::path::PathBuf;
use std::process::Command;

#[test]
fn the_public_api_is_the_reviewed_one() {
    let target = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("public-api");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "doc",
            "--quiet",
            "--no-deps",
            "--lib",
            "-p",
            "banlieue-libvirt",
        ])
        .arg("--manifest-path")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../crates/banlieue-libvirt/Cargo.toml"
        ))
        .env("CARGO_TARGET_DIR", &target)
        .env("RUSTC_BOOTSTRAP", "1")
        .env("RUSTDOCFLAGS", "-Z unstable-options --output-format json")
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "rustdoc JSON: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json = target.join("doc/banlieue_libvirt.json");
    let api = public_api::Builder::from_rustdoc_json(&json)
        .omit_blanket_impls(true)
        .omit_auto_trait_impls(true)
        .omit_auto_derived_impls(true)
        .build()
        .expect("the rustdoc JSON reads");
    let listing: Vec<String> = api
        .items()
        .map(ToString::to_string)
        .filter(|item| !item.contains("banlieue_libvirt::proto::"))
        .collect();
    assert!(
        listing
            .iter()
            .any(|i| i.contains("fn banlieue_libvirt::Client::connect(")),
        "the listing is the crate's"
    );
    insta::assert_snapshot!(listing.join("\n"));
}

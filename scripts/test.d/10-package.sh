#!/usr/bin/env bash
# banlieue-libvirt as a package: `cargo package` of it and of its build dependency
# banlieue-xdrgen, unpacked outside the repository, served with their vendored dependencies
# from a local directory source (scripts/lib/local-registry.sh), and depended on by a tiny
# consumer crate built and run with --offline. The consumer sees neither this workspace nor
# protocol/, so it builds only if the packages carry libvirt's protocol files (and their
# checksums) and need nothing else of the repository.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
# shellcheck source=../lib/env.sh
source scripts/lib/env.sh
# shellcheck source=../lib/local-registry.sh
source scripts/lib/local-registry.sh
unset LIBVIRT_SOURCE

mkdir -p "$BANLIEUE_CACHE/logs"
log=$BANLIEUE_CACHE/logs/test-package.log
: >"$log"
# The consumer builds with a CARGO_HOME and a target directory of its own, which persist so
# its third-party dependencies compile once. cargo takes a registry crate's name and version
# to be immutable, so the packaged crates are removed from both on every run.
base=$CARGO_TARGET_DIR/package-test
work=$(mktemp -d "${TMPDIR:-/tmp}/banlieue-package-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$base/cargo-home"
rm -rf "$base"/cargo-home/registry/src/*/banlieue-* "$base"/cargo-home/registry/cache/*/banlieue-*

step() {
    local what=$1 start=$SECONDS
    shift
    echo "package: $what (log: $log)"
    echo "==> $what: $*" >>"$log"
    if ! "$@" >>"$log" 2>&1; then
        echo "FAIL: package: $what after $((SECONDS - start)) s; end of $log:" >&2
        tail -n 30 "$log" | sed 's/^/    /' >&2
        exit 1
    fi
}

version=$(cargo metadata --no-deps --offline --format-version 1 |
    python3 -c 'import json, sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "banlieue-libvirt"))')
crates=("$CARGO_TARGET_DIR/package/banlieue-xdrgen-$version.crate" "$CARGO_TARGET_DIR/package/banlieue-libvirt-$version.crate")

# The working tree as it is (--allow-dirty), so the test checks uncommitted changes too; the
# consumer's build below is the verification.
step "cargo package banlieue-xdrgen banlieue-libvirt" \
    cargo package --offline --locked --allow-dirty --no-verify -p banlieue-xdrgen -p banlieue-libvirt

has_files() {
    local crate=$1 listing f
    shift
    listing=$(tar -tzf "$crate")
    for f in "$@"; do
        grep -qx "$(basename "$crate" .crate)/$f" <<<"$listing" || {
            echo "$crate lacks $f"
            return 1
        }
    done
}
step "libvirt's files and the licences are in the package" has_files "${crates[1]}" \
    protocol/SHA256SUMS protocol/COPYING.LESSER protocol/remote_protocol.x protocol/virnetprotocol.x \
    LICENSE NOTICE README.md
step "banlieue-xdrgen carries its licence" has_files "${crates[0]}" LICENSE README.md

consumer=$work/consumer
mkdir -p "$consumer/src"
cat >"$consumer/Cargo.toml" <<TOML
[package]
name = "libvirt-consumer"
version = "0.0.0"
edition = "2024"
publish = false

[dependencies]
banlieue-libvirt = "=$version"
TOML
cat >"$consumer/src/main.rs" <<'RUST'
// Uses the generated protocol (procedure tables, typed arguments) and the URI parser.
use banlieue_libvirt::proto::remote;

fn main() {
    let uri = banlieue_libvirt::ConnectUri::parse("qemu+tls://kvm-7.example/system")
        .expect("a qemu+tls URI parses");
    let args = remote::RemoteDomainLookupByNameArgs { name: "web-01".into() };
    println!(
        "{} remote procedures; {}; {}",
        remote::PROCEDURES.len(),
        uri.host,
        args.name
    );
}
RUST
step "local registry: the packages and their dependencies from the cargo cache" \
    local_registry "$base/registry" "$consumer" "${crates[@]}"
# cargo reads .cargo/config.toml from the directory it runs in.
in_consumer() { (cd "$consumer" && CARGO_HOME=$base/cargo-home CARGO_TARGET_DIR=$base/target "$@"); }
step "clean the packaged crates out of the consumer's build directory" \
    in_consumer cargo clean --offline -p banlieue-libvirt -p banlieue-xdrgen
step "build the consumer --offline" in_consumer cargo build --offline
out=$("$base/target/debug/libvirt-consumer")
echo "$out" >>"$log"
if [[ ! $out =~ ^[0-9]+\ remote\ procedures\;\ kvm-7.example\;\ web-01$ ]]; then
    echo "FAIL: package: the consumer printed: $out" >&2
    exit 1
fi
echo "ok: package: a crate depending on banlieue-libvirt $version builds offline from the packages alone ($out)"

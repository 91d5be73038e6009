# shellcheck shell=bash
# Shared environment for the project's scripts: heavy build caches live outside the clone so
# repeated runs on one machine are fast, and a fresh machine still builds everything.
export BANLIEUE_CACHE="${BANLIEUE_CACHE:-$HOME/.cache/banlieue}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/banlieue/target}"
export GOCACHE="${GOCACHE:-$HOME/.cache/banlieue/go-build}"
export GOMODCACHE="${GOMODCACHE:-$HOME/.cache/banlieue/go-mod}"
export PATH="$HOME/.cargo/bin:/usr/local/go/bin:$PATH"
mkdir -p "$BANLIEUE_CACHE"
# Incremental compilation state only helps an edit-compile loop; in CI it grows the shared
# target directory by gigabytes per run and is never read again.
if [[ ${CI:-} == true ]]; then
    export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
fi

# Cargo shares this workspace's own artifacts between clones at different paths (its hashes are
# relative to the workspace root), but a test binary keeps the absolute CARGO_MANIFEST_DIR it
# was built with and reads its fixtures and snapshots from there. When the target directory was
# last used by a clone elsewhere, this workspace's crates are rebuilt (the registry's are not).
banlieue_workspace=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
banlieue_marker="$CARGO_TARGET_DIR/.banlieue-workspace"
banlieue_last=$(cat "$banlieue_marker" 2>/dev/null || true)
# An empty marker (a truncating write by an older copy of this file, seen midway) is no marker:
# cleaning the workspace on a misread would delete every test binary of a running suite.
if [[ -n $banlieue_last && $banlieue_last != "$banlieue_workspace" ]]; then
    echo "the build cache was last used by a clone at $banlieue_last; rebuilding this workspace's crates" >&2
    # The workspace, and the crates beside it with workspaces of their own (public-api's test
    # reads the API it reviews from beside its manifest too).
    for banlieue_manifest in "$banlieue_workspace"/{,public-api/,fuzz/}Cargo.toml; do
        [[ -f $banlieue_manifest ]] || continue
        banlieue_packages=()
        while read -r package; do banlieue_packages+=(-p "$package"); done < <(
            cargo metadata --no-deps --format-version 1 --offline --manifest-path "$banlieue_manifest" |
                python3 -c 'import json, sys; print("\n".join(p["name"] for p in json.load(sys.stdin)["packages"]))'
        )
        cargo clean --quiet --manifest-path "$banlieue_manifest" "${banlieue_packages[@]}"
    done
fi
mkdir -p "$CARGO_TARGET_DIR"
# Written whole, by a rename: scripts sourcing this at the same moment (jobs of one test run)
# read the old path or the new one, never the empty file a truncating write shows for a while.
printf '%s\n' "$banlieue_workspace" >"$banlieue_marker.$$"
mv -f "$banlieue_marker.$$" "$banlieue_marker"
unset banlieue_marker banlieue_packages banlieue_last banlieue_manifest

# build_banlieue: $CARGO_TARGET_DIR/debug/banlieue and banlieue-dev, built as the test build
# builds them. `cargo test --workspace` unifies the features that the packages' dev-dependencies turn on (tokio's
# test-util, serde_json's unbounded_depth, …) into the dependencies they share with the
# product, so a plain `cargo build -p banlieue` would compile ~120 of them a second time with
# other features. `--test dev` builds banlieue-dev (and its one test of `dev up`), `--test
# libvirt_cli` the banlieue binary (and a small test of it). The image's binary is built apart
# (scripts/image), with the product's features alone.
build_banlieue() {
    cargo test --quiet --locked --workspace --no-run --test dev --test libvirt_cli
}

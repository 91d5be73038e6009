# shellcheck shell=bash
# A local registry for packaged crates, to build a consumer offline as a user of the published
# crates would: cargo's `local-registry` layout (an index plus `.crate` files), holding the
# given packages and every third-party crate the consumer resolves to, copied from the cargo
# cache.
#
#   local_registry DIR CONSUMER_DIR CRATE...
#
# CONSUMER_DIR is a cargo project depending on the packaged crates by version. It is resolved
# offline with the packages patched in from their unpacked sources. Every third-party package
# of that resolution gets its index line from cargo's index cache and its `.crate` file from
# the download cache when there (crates for other platforms are only downloaded if built, so
# they are indexed for the resolver but absent); the packaged crates get an index line made
# from their manifest (`cargo metadata --no-deps`). CONSUMER_DIR then gets a .cargo/config.toml that replaces crates.io by DIR, so
# `cargo build --offline` there sees nothing but DIR: no workspace, no path, no network.
local_registry() {
    local dir=$1 consumer=$2
    shift 2
    local unpacked crate base patch=""
    unpacked=$(mktemp -d "${TMPDIR:-/tmp}/banlieue-unpacked.XXXXXX")
    for crate in "$@"; do
        tar -xzf "$crate" -C "$unpacked"
        base=$(basename "$crate" .crate)
        patch+="${base%-*} = { path = \"$unpacked/$base\" }"$'\n'
    done
    rm -rf "$consumer/.cargo" "$consumer/Cargo.lock" "$dir"
    mkdir -p "$consumer/.cargo" "$dir/index"
    printf '[patch.crates-io]\n%s' "$patch" >"$consumer/.cargo/config.toml"
    # The cargo home this user's builds fill: the index and download caches.
    local cargo_home=${CARGO_HOME:-$HOME/.cargo}
    if ! (cd "$consumer" && cargo generate-lockfile --offline) ||
        ! python3 "$(dirname "${BASH_SOURCE[0]}")/local-registry.py" \
            "$consumer/Cargo.lock" "$unpacked" "$dir" "$cargo_home/registry" "$@"; then
        rm -rf "$unpacked"
        return 1
    fi
    rm -rf "$unpacked" "$consumer/Cargo.lock"
    cat >"$consumer/.cargo/config.toml" <<TOML
[source.crates-io]
replace-with = "local-packages"

[source.local-packages]
local-registry = "$dir"
TOML
}

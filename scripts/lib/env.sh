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

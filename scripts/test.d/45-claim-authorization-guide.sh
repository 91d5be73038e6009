#!/usr/bin/env bash
# Part 2 of docs/guides/testing-claim-authorization.md, run as written: every ```sh block of the
# part, in order, as one `bash -euo pipefail` script from the repository root. The guide's
# commands are the test: a refusal the guide expects is wrapped in its own `refused` helper, so
# an admitted claim fails the run, and so does every other failing command. Needs the control
# plane and Dex that scripts/setup builds; a missing Dex fails unless
# BANLIEUE_ALLOW_MISSING_PEERS=1 (a loud skip).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"
guide=docs/guides/testing-claim-authorization.md
dir=/tmp/banlieue-oidc

bin_dir=$(scripts/control-plane bin-dir)
if [[ ! -x $bin_dir/dex ]]; then
    if [[ ${BANLIEUE_ALLOW_MISSING_PEERS:-} == 1 ]]; then
        echo "!!!!! SKIPPED: no dex in $bin_dir (and BANLIEUE_ALLOW_MISSING_PEERS=1) !!!!!" >&2
        exit 0
    fi
    echo "FAIL: no dex in $bin_dir: run scripts/setup" >&2
    exit 1
fi

script=$(awk '
    /^## 2\. / { part = 1; next }
    /^## / { part = 0 }
    part && /^```sh$/ { code = 1; next }
    code && /^```$/ { code = 0; next }
    code' "$guide")
[[ $(grep -c . <<<"$script") -gt 20 ]] || { echo "FAIL: part 2 of $guide has no sh blocks" >&2; exit 1; }

# A leftover of an interrupted run is stopped by its PIDs, then the guide starts afresh.
scripts/control-plane stop "$dir" >/dev/null 2>&1 || true
rm -rf "$dir" /tmp/banlieue-oidc.log
trap 'scripts/control-plane stop "$dir" >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
started=$SECONDS
bash -euo pipefail -c "$script"
echo "ok: claim-authorization guide part 2 ran as written ($((SECONDS - started)) s)"

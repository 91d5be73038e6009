#!/usr/bin/env bash
# Independent ISO readers the banlieue-iso tests check the writer against: isoinfo and
# genisoimage (genisoimage), xorriso, blkid (util-linux), cloud-init's own NoCloud reader, and
# pycdlib in a venv the tests own (Debian does not package pycdlib).
set -euo pipefail
# shellcheck source=../lib/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/env.sh"

want=(genisoimage xorriso util-linux cloud-init python3-venv python3-yaml)
missing=()
for p in "${want[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    apt-get update -qq
    # cloud-init's recommends pull in services this machine must not start; the reader needs
    # only the Python package.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

venv="$BANLIEUE_CACHE/venv-iso"
if ! "$venv/bin/python3" -c 'import pycdlib' 2>/dev/null; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check pycdlib
fi
"$venv/bin/python3" -c 'import pycdlib' >/dev/null

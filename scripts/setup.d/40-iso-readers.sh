#!/usr/bin/env bash
# Independent ISO readers the banlieue-iso tests check the writer against: isoinfo and
# genisoimage (genisoimage), xorriso, blkid (util-linux), cloud-init's own NoCloud reader, and
# pycdlib in a venv the tests own (Debian does not package pycdlib).
set -euo pipefail
# shellcheck source=../lib/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/env.sh"

# shellcheck source=../lib/apt-install.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/apt-install.sh"
# No recommends: cloud-init's pull in services this machine must not start; the reader needs
# only the Python package.
apt_install_missing genisoimage xorriso util-linux cloud-init python3-venv python3-yaml

venv="$BANLIEUE_CACHE/venv-iso"
if ! "$venv/bin/python3" -c 'import pycdlib' 2>/dev/null; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check pycdlib
fi
"$venv/bin/python3" -c 'import pycdlib' >/dev/null

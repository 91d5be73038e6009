#!/usr/bin/env bash
# Debian packages the build and the XDR oracle need.
set -euo pipefail
want=(build-essential pkg-config curl xz-utils rpcsvc-proto libtirpc-dev)
missing=()
for p in "${want[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

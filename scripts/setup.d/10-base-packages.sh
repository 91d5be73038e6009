#!/usr/bin/env bash
# Debian packages the build and the XDR oracle need.
set -euo pipefail
# shellcheck source=../lib/apt-install.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/apt-install.sh"
apt_install_missing build-essential pkg-config curl xz-utils rpcsvc-proto libtirpc-dev ca-certificates

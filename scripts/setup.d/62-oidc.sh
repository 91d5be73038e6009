#!/usr/bin/env bash
# Dex, the OIDC issuer the claim-authorization tests and guide log users in at, built from the
# Go module proxy into ~/.cache/banlieue/control-plane (about 3 minutes the first time), and
# htpasswd (apache2-utils) for the bcrypt hashes of `scripts/control-plane start --oidc`.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../lib/apt-install.sh
source "$here/../lib/apt-install.sh"
apt_install_missing apache2-utils
exec "$here/../control-plane" build-oidc

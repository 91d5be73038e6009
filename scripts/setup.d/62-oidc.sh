#!/usr/bin/env bash
# Dex, the OIDC issuer the claim-authorization tests and guide log users in at, built from the
# Go module proxy into ~/.cache/banlieue/control-plane (about 3 minutes the first time).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exec "$here/../control-plane" build-oidc

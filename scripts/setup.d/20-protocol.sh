#!/usr/bin/env bash
# libvirt's XDR protocol files, verified against protocol/SHA256SUMS.
set -euo pipefail
exec "$(dirname "${BASH_SOURCE[0]}")/../../protocol/fetch"

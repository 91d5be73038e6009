#!/usr/bin/env bash
# Helm, which the chart's tests run (lint, template, install, upgrade, uninstall), built from
# the Go module proxy into ~/.cache/banlieue/control-plane (a few minutes the first time).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exec "$here/../control-plane" build-helm

#!/usr/bin/env bash
# vcsim, govmomi's vCenter simulator that banlieue-vsphere's tests talk to, built from the Go
# module proxy into ~/.cache/banlieue/control-plane (about a minute the first time).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exec "$here/../control-plane" build-vcsim

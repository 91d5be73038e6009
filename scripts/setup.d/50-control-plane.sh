#!/usr/bin/env bash
# etcd, kube-apiserver and kube-controller-manager at pinned releases, built from the Go module
# proxy into ~/.cache/banlieue/control-plane (minutes the first time, instant once cached).
set -euo pipefail
exec "$(dirname "${BASH_SOURCE[0]}")/../control-plane" build

#!/usr/bin/env bash
# etcd, kube-apiserver, kube-controller-manager, and the node's kube-scheduler, kubelet and
# kubectl from the same release, built from the Go module proxy into
# ~/.cache/banlieue/control-plane (minutes the first time, instant once cached).
set -euo pipefail
exec "$(dirname "${BASH_SOURCE[0]}")/../control-plane" build

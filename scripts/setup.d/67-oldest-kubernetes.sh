#!/usr/bin/env bash
# The oldest supported Kubernetes release (ADR-0072): kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet and kubectl built from the Go module proxy into
# ~/.cache/banlieue/control-plane/bin-oldest, beside the newest, for the tests that run
# bootstrap, admission, the claim lifecycle and the deployed operator against it (a few minutes
# the first time, cached per version).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exec "$here/../control-plane" build-oldest

#!/usr/bin/env bash
# agent-sandbox v1.0.1 (Kubernetes SIG Apps), the peer banlieue is measured side by side with:
# its controller and stress harness, built from the Go module proxy, and its CRDs and RBAC, in
# ~/.cache/banlieue/agent-sandbox/ (a few minutes the first time).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exec "$here/../control-plane" build-agent-sandbox

#!/usr/bin/env bash
# What a node of the test cluster needs (crates/banlieue-testenv's Node, `scripts/control-plane
# start --node`): runc and the loopback CNI plugin from Debian; kubelet, kube-scheduler, kubectl
# and containerd 2.x built from the Go module proxy into ~/.cache/banlieue/control-plane; the
# static pause image (written by scripts/lib/oci-image, as the tests' own images are).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../lib/apt-install.sh
source "$here/../lib/apt-install.sh"
# gcc and libc6-dev: the pause binary is built with `gcc -static`.
apt_install_missing runc containernetworking-plugins gcc libc6-dev
exec "$here/../control-plane" build-node

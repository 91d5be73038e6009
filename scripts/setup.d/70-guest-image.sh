#!/usr/bin/env bash
# The test guest image the boot tests run (crates/banlieue-testenv/tests/guest.rs) and its
# Deferred installer CD: the host tools scripts/guest-image and the boot tests need, from Debian,
# then both, cached under ~/.cache/banlieue/images/ (a few minutes the first time, instant once
# cached).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../lib/apt-install.sh
source "$here/../lib/apt-install.sh"
# openssh-client: the boot test logs in to the guest with ssh, pinning the host keys it published.
apt_install_missing debootstrap dosfstools mtools fdisk qemu-utils zstd xorriso openssh-client
# The script's step lines go to stderr, which scripts/setup sends to this part's log.
"$here/../guest-image"

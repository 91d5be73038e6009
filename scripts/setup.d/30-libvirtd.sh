#!/usr/bin/env bash
# The real libvirtd the tests run against: libvirt 11.3.0 and QEMU 10.0.2 from bookworm-backports
# (Debian 12's own libvirt 9.0 / QEMU 7.2 conflict with the newer qemu-utils some machines carry),
# plus swtpm and OVMF for EFI + vTPM guests (and tpm2-tools, to drive a host swtpm as a TPM),
# virsh as an independent client, the Wireshark dissector for wire cross-checks and the C
# client's Python binding for benchmarks.
#
# Only src:libvirt, src:qemu and src:seabios are taken from backports; everything else stays
# on the machine's own suites. The backports entry lives in a private apt state directory
# (scripts/lib/apt-private.sh), so nothing under /etc/apt changes. No service is started: the
# tests start their own daemons.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../lib/env.sh
source "$here/../lib/env.sh"
# shellcheck source=../lib/apt-private.sh
source "$here/../lib/apt-private.sh"
# shellcheck source=../lib/apt-install.sh
source "$here/../lib/apt-install.sh"

libvirt_version=11.3.0
qemu_version=10.0.2
packages=(
    libvirt-daemon libvirt-daemon-driver-qemu libvirt-daemon-system libvirt-clients
    qemu-system-x86 qemu-utils swtpm swtpm-tools tpm2-tools gnutls-bin ovmf
    libvirt-wireshark tshark
    python3-libvirt
)

installed_version() {
    dpkg-query -W -f='${Status} ${Version}' "$1" 2>/dev/null |
        awk '$1=="install" && $3=="installed" {print $4}'
}

# Upstream version of a Debian version string: drop the epoch and the Debian revision.
upstream_of() {
    local v=${1#*:}
    printf '%s\n' "${v%%-*}"
}

pinned_versions_ok() {
    [[ $(upstream_of "$(installed_version libvirt-daemon)") == "$libvirt_version" ]] &&
        [[ $(upstream_of "$(installed_version qemu-system-x86)") == "$qemu_version"* ]]
}

all_installed() {
    local p
    for p in "${packages[@]}"; do
        [[ -n $(installed_version "$p") ]] || return 1
    done
    pinned_versions_ok
}

if all_installed; then
    echo "libvirt $(installed_version libvirt-daemon), qemu $(installed_version qemu-system-x86): already installed"
    exit 0
fi

apt_private_init backports deb bookworm-backports main
# Backports is NotAutomatic; this pin lifts only the three source packages above the stable
# suite so their binaries (and nothing else) come from backports.
cat >"$APT_PRIVATE_ROOT/preferences.d/libvirt-qemu.pref" <<'EOF'
Package: src:libvirt src:qemu src:seabios
Pin: release n=bookworm-backports
Pin-Priority: 990
EOF

# Package maintainer scripts would start libvirtd, virtlogd and friends; the tests start their
# own isolated daemons, so forbid service starts for the duration of this install and put back
# whatever policy the machine had before.
policy=/usr/sbin/policy-rc.d
policy_backup=""
if [[ -e $policy ]]; then
    policy_backup=$(mktemp "$policy.banlieue.XXXXXX")
    cp -p "$policy" "$policy_backup"
fi
restore_policy() {
    if [[ -n $policy_backup ]]; then
        mv -f "$policy_backup" "$policy"
    else
        rm -f "$policy"
    fi
}
trap restore_policy EXIT
printf '#!/bin/sh\n# Installing banlieue test peers: no service starts.\nexit 101\n' >"$policy"
chmod 0755 "$policy"

# Non-root capture is not needed (tests run as root); answering here keeps the install silent.
echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections

export DEBIAN_FRONTEND=noninteractive
apt_locked apt-get "${APT_PRIVATE_OPTS[@]}" update -qq </dev/null
apt_locked apt-get "${APT_PRIVATE_OPTS[@]}" install -y -qq --no-install-recommends \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
    "${packages[@]}" </dev/null

if ! pinned_versions_ok; then
    echo "error: expected libvirt $libvirt_version and qemu $qemu_version, got libvirt $(installed_version libvirt-daemon) and qemu $(installed_version qemu-system-x86)" >&2
    exit 1
fi
echo "libvirt $(installed_version libvirt-daemon), qemu $(installed_version qemu-system-x86): installed"

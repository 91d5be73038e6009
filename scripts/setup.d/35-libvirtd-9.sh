#!/usr/bin/env bash
# An older libvirtd for the client's compatibility tests: Debian 12's own libvirt 9.0 and
# QEMU 7.2, in a private root (a minbase debootstrap of bookworm) under
# ~/.cache/banlieue/roots/libvirt-9.0, so it cannot clash with the machine's libvirt 11.3 from
# backports (scripts/setup.d/30-libvirtd.sh). banlieue-testenv starts it chrooted
# (`LibvirtdOptions::with_root`); nothing in the root ever runs as a service.
#
# The mirror is the one this machine's own apt sources name (scripts/lib/apt-private.sh), read
# at run time. Only what the daemon needs is installed, without recommends: the daemon, its
# qemu driver and qemu-system-x86. No libvirt-daemon-system (polkit, firewalld or iptables,
# the packaged services): its one thing the daemon needs, the libvirt-qemu user QEMU runs as,
# is created here. The test PKI is made by banlieue-testenv, so no gnutls-bin either.
#
# Done once: the root is built under a temporary name and renamed when complete, and a stamp
# records what was installed; a later run with the stamp in place only prints it.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../lib/env.sh
source "$here/../lib/env.sh"
# shellcheck source=../lib/apt-install.sh
source "$here/../lib/apt-install.sh"
# shellcheck source=../lib/apt-private.sh
source "$here/../lib/apt-private.sh"

suite=bookworm
libvirt_version=9.0.0
packages=(libvirt-daemon libvirt-daemon-driver-qemu qemu-system-x86)
root="$BANLIEUE_CACHE/roots/libvirt-9.0"
# banlieue-testenv reads this stamp: the root is complete only when it is there.
stamp="$root/.banlieue-root"
# What the stamp must say for the root to be reused; a change to the package list rebuilds it.
# (Bump the layout number when the preparation below changes.)
wanted="suite=$suite packages=${packages[*]} layout=3"

if [[ -f $stamp && -x $root/usr/sbin/libvirtd ]] && grep -qxF "$wanted" "$stamp"; then
    echo "libvirt root $root: $(sed -n 's/^libvirt-daemon=//p' "$stamp"), already built"
    exit 0
fi

apt_install_missing debootstrap
mirror=$(debian_mirror_uri)

building="$root.building"
# Everything that mounts (debootstrap's /proc and /sys, apt's /proc in the chroot) runs in a
# private mount namespace, so no mount outlives it and removing a half-built root can never
# descend into the host's /proc, /sys or /dev; --one-file-system guards that once more.
in_namespace() {
    unshare --mount --propagation private -- "$@"
}
remove_building() {
    [[ -e $building ]] && rm -rf --one-file-system "$building"
    return 0
}
trap remove_building EXIT
remove_building
mkdir -p "$(dirname "$root")"

start=$SECONDS
echo "debootstrap: $suite (minbase) into $building"
in_namespace debootstrap --variant=minbase "$suite" "$building" "$mirror"
echo "debootstrap: done in $((SECONDS - start)) s"

# Package scripts must not start anything; the tests start their own daemons.
printf '#!/bin/sh\n# banlieue test root: no service starts.\nexit 101\n' >"$building/usr/sbin/policy-rc.d"
chmod 0755 "$building/usr/sbin/policy-rc.d"

start=$SECONDS
echo "apt: installing ${packages[*]} in the root"
in_namespace chroot "$building" sh -ec '
    mount -t proc proc /proc
    export DEBIAN_FRONTEND=noninteractive LC_ALL=C
    apt-get update -q
    apt-get install -y -q --no-install-recommends "$@"
    apt-get clean
    # What libvirt-daemon-system would create: the user QEMU runs as (Debian builds libvirt
    # with --with-qemu-user=libvirt-qemu --with-qemu-group=libvirt-qemu).
    getent group kvm >/dev/null || groupadd --system kvm
    getent group libvirt-qemu >/dev/null || groupadd --system libvirt-qemu
    getent passwd libvirt-qemu >/dev/null ||
        useradd --system --gid kvm --groups libvirt-qemu --home-dir /var/lib/libvirt \
            --no-create-home --shell /usr/sbin/nologin libvirt-qemu
    # And the directories it would ship, which banlieue-testenv copies as the skeleton of an
    # instance and mounts the instance over; the daemon makes what it needs below them.
    mkdir -p /etc/libvirt /var/lib/libvirt /var/log/libvirt /var/cache/libvirt
    chmod 0700 /var/log/libvirt
    # Where the machine'"'"'s own /etc/hosts is mounted: the daemon resolves its host name,
    # and without the machine'"'"'s entry for it waits on DNS for seconds per call.
    touch /etc/hosts /etc/resolv.conf
    umount /proc
' banlieue-root "${packages[@]}"
echo "apt: done in $((SECONDS - start)) s"

version=$(chroot "$building" dpkg-query -W -f='${Version}' libvirt-daemon)
qemu=$(chroot "$building" dpkg-query -W -f='${Version}' qemu-system-x86)
upstream=${version#*:}
upstream=${upstream%%-*}
if [[ $upstream != "$libvirt_version" ]]; then
    echo "error: expected libvirt $libvirt_version in $suite, got $version" >&2
    exit 1
fi
[[ -x $building/usr/sbin/libvirtd ]] || {
    echo "error: $building/usr/sbin/libvirtd is missing" >&2
    exit 1
}

rm -rf --one-file-system "$root"
mv "$building" "$root"
printf '%s\nlibvirt-daemon=%s\nqemu-system-x86=%s\n' "$wanted" "$version" "$qemu" >"$stamp"
echo "libvirt root $root: libvirt-daemon=$version qemu-system-x86=$qemu, built ($(du -sh --one-file-system "$root" | cut -f1))"

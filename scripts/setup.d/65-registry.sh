#!/usr/bin/env bash
# The OCI registry tests pull disk images from (crates/banlieue-testenv's Registry): Debian's
# docker-registry (distribution 2.8), run by the tests on loopback with their own config, and
# skopeo, the independent client that pushes fixtures to it and inspects what it serves.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../lib/apt-install.sh
source "$here/../lib/apt-install.sh"

packages=(docker-registry skopeo)
missing=0
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing=1
done

# docker-registry's postinst starts the system-wide service through invoke-rc.d (its init
# script on a machine without systemd, deb-systemd-invoke with it): a daemon serving
# /etc/docker/registry/config.yml on :5000, every interface, that no test uses and nothing here
# would stop. Both honour policy-rc.d, so one that denies every start (exit 101) is in place
# for the install only; any policy the machine already had is put back afterwards. This is
# better than stopping the daemon afterwards: it never listens, not even for a moment.
policy=/usr/sbin/policy-rc.d
saved=
restore_policy() {
    if [[ -n $saved ]]; then
        mv -f "$saved" "$policy"
    else
        rm -f "$policy"
    fi
}
if ((missing)); then
    if [[ -e $policy ]]; then
        saved=$(mktemp "$policy.banlieue.XXXXXX")
        cp -a "$policy" "$saved"
    fi
    trap restore_policy EXIT
    printf '#!/bin/sh\n# scripts/setup.d/65-registry.sh: no service starts during its install.\nexit 101\n' >"$policy"
    chmod 755 "$policy"
fi

apt_install_missing "${packages[@]}"

if ((missing)); then
    restore_policy
    trap - EXIT
fi

# Nor should it start at the next boot: the tests run their own instances.
if [[ -d /run/systemd/system ]]; then
    systemctl disable --now docker-registry.service || true
elif [[ -x /etc/init.d/docker-registry ]]; then
    update-rc.d docker-registry disable || true
fi

# A daemon left from an install made before this script existed (it writes this pid file).
pidfile=/var/run/docker-registry.pid
if [[ -f $pidfile ]]; then
    pid=$(<"$pidfile")
    if [[ $pid =~ ^[0-9]+$ ]] && [[ $(readlink "/proc/$pid/exe" 2>/dev/null) == /usr/bin/docker-registry ]]; then
        echo "stopping the system docker-registry (pid $pid)"
        kill "$pid"
    fi
fi

docker-registry --version
skopeo --version

#!/usr/bin/env bash
# libvirt's modular daemons, virtqemud and virtproxyd, for the test of
# scripts/bootstrap-libvirt-tls.sh on a host that runs them (scripts/test.d/30-bootstrap-libvirt-tls.sh).
#
# Debian ships only the monolithic libvirtd, so the two programs are built here from libvirt
# 11.3.0's source (the orig tarball protocol/fetch caches). Only the programs: they are
# libvirtd's own remote_daemon*.c compiled with their daemon's defines (virtqemud: load the
# qemu driver alone; virtproxyd: no driver, forward every connection to the per-driver
# daemon's socket, listen on TCP by listen_tls alone), a dozen C files linked against the
# libvirt 11.3.0 libraries scripts/setup.d/30-libvirtd.sh installed, whose
# libvirt_driver_qemu.so virtqemud then loads. The build is configured with every optional
# feature off, so these daemons have no SASL and no polkit (unix sockets: auth none); TLS with
# client certificates is complete.
#
# Nothing is installed on the system, so that this machine does not look like a host running
# the modular daemons: the programs go to ${BANLIEUE_CACHE:-~/.cache/banlieue}/libvirt-modular/sbin/.
# Idempotent: a build for the installed libvirt is kept.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../lib/env.sh
source "$here/../lib/env.sh"
# shellcheck source=../lib/apt-install.sh
source "$here/../lib/apt-install.sh"

libvirt_version=11.3.0
out="$BANLIEUE_CACHE/libvirt-modular"
# Bumped when the way the programs are built changes.
recipe=1

installed=$(dpkg-query -W -f='${Status} ${Version}' libvirt-daemon 2>/dev/null |
    awk '$1=="install" && $3=="installed" {print $4}')
upstream=${installed#*:}
upstream=${upstream%%-*}
if [[ $upstream != "$libvirt_version" ]]; then
    echo "error: libvirt-daemon ${installed:-is not installed}, want $libvirt_version: run scripts/setup libvirtd first" >&2
    exit 1
fi
libdir=/usr/lib/$(gcc -print-multiarch)
for lib in libvirt libvirt-qemu libvirt-lxc; do
    [[ -e $libdir/$lib.so.0 ]] || { echo "error: $libdir/$lib.so.0 is missing" >&2; exit 1; }
done

stamp="libvirt-daemon=$installed recipe=$recipe"
if [[ -x $out/sbin/virtqemud && -x $out/sbin/virtproxyd && -e $out/stamp && $(<"$out/stamp") == "$stamp" ]]; then
    echo "virtqemud, virtproxyd ($stamp): already built in $out/sbin"
    exit 0
fi

apt_install_missing build-essential pkg-config meson ninja-build perl xsltproc \
    libglib2.0-dev libxml2-dev libgnutls28-dev libtirpc-dev

tarball=$("$here/../../protocol/fetch" --tarball)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar -xJf "$tarball" -C "$work"
src="$work/libvirt-$libvirt_version"
build="$work/build"

# The paths compiled into the daemons (/etc/libvirt/NAME.conf, /run/libvirt/NAME-sock) are
# Debian's; every optional dependency off. The remote driver and libvirtd make meson define
# the virtproxyd target, whose compile commands both daemons are built from.
meson setup "$build" "$src" --prefix=/usr --libdir="lib/$(gcc -print-multiarch)" -Dsystem=true \
    -Dauto_features=disabled -Ddriver_remote=enabled -Ddriver_libvirtd=enabled \
    -Ddocs=disabled -Dtests=disabled -Dinit_script=none

cd "$build"
mapfile -t proxy_objects < <(ninja -t targets all | awk -F: '/^src\/virtproxyd\.p\/.*\.o:/ {print $1}')
((${#proxy_objects[@]})) || { echo "error: meson defined no virtproxyd objects" >&2; exit 1; }
ninja "${proxy_objects[@]}" src/admin/libvirt_admin_driver.a

# virtqemud is the same four daemon sources with virtqemud's defines (src/qemu/meson.build)
# in place of virtproxyd's (src/remote/meson.build); the generated protocol code is shared.
# The link line is meson's for virtproxyd, with the system's libvirt libraries in place of
# the ones this tree would build.
python3 - "$libdir" <<'EOF'
import json, re, shlex, subprocess, sys

libdir = sys.argv[1]
proxy_defines = ['-DSOCK_PREFIX="libvirt"', '-DDAEMON_NAME="virtproxyd"', "-DWITH_IP", "-DVIRTPROXYD"]
qemu_defines = ['-DDAEMON_NAME="virtqemud"', '-DMODULE_NAME="qemu"']

for entry in json.load(open("compile_commands.json")):
    if not entry["output"].startswith("src/virtproxyd.p/remote_remote_daemon"):
        continue
    args = shlex.split(entry["command"])
    if not all(d in args for d in proxy_defines):
        sys.exit("virtproxyd's compile command lacks its defines: " + entry["command"])
    args = [a for a in args if a not in proxy_defines]
    args = [a.replace("src/virtproxyd.p/", "src/virtqemud.p/") for a in args]
    args[args.index("-DIN_LIBVIRT") + 1:args.index("-DIN_LIBVIRT") + 1] = qemu_defines
    subprocess.run(["mkdir", "-p", "src/virtqemud.p"], check=True)
    subprocess.run(args, check=True)

link = shlex.split(subprocess.run(["ninja", "-t", "commands", "src/virtproxyd"], check=True,
                                  capture_output=True, text=True).stdout.splitlines()[-1])
own_lib = re.compile(r"^src/(libvirt(?:-qemu|-lxc)?)\.so\.[0-9.]+$")
for name in ("virtproxyd", "virtqemud"):
    args = []
    for a in link:
        if a.startswith("-Wl,-rpath"):
            continue
        m = own_lib.match(a)
        if m:
            a = "%s/%s.so.0" % (libdir, m.group(1))
        elif a == "src/virtproxyd":
            a = "src/banlieue-" + name
        elif name == "virtqemud" and a.startswith("src/virtproxyd.p/remote_remote_daemon"):
            a = a.replace("src/virtproxyd.p/", "src/virtqemud.p/")
        args.append(a)
    subprocess.run(args, check=True)
EOF

for name in virtproxyd virtqemud; do
    version=$("src/banlieue-$name" --version)
    [[ $version == "src/banlieue-$name (libvirt) $libvirt_version" ]] ||
        { echo "error: src/banlieue-$name --version says: $version" >&2; exit 1; }
done
mkdir -p "$out/sbin"
install -m 0755 src/banlieue-virtqemud "$out/sbin/virtqemud"
install -m 0755 src/banlieue-virtproxyd "$out/sbin/virtproxyd"
printf '%s\n' "$stamp" >"$out/stamp"
echo "virtqemud, virtproxyd ($stamp): built in $out/sbin"

# Run by `unshare --mount --propagation private` for one libvirtd test instance: lays the
# instance's directories over the system paths libvirtd, QEMU and swtpm hard-code, then becomes
# the daemon. The mounts exist only in this private namespace and vanish with its last process.
#
#   sh namespace.sh INSTANCE_DIR ROOT DAEMON [ARGS...]
#
# ROOT is `/` for the machine's own libvirt. Any other ROOT is a private system tree holding
# another libvirt (a debootstrap root): the same directories are laid over its paths, the
# kernel's file systems and devices are lent to it, and the daemon runs chrooted there.
set -eu
instance=$1
root=$2
shift 2
if [ "$root" = / ]; then
    mount --bind "$instance/etc" /etc/libvirt
    mount --bind "$instance/lib" /var/lib/libvirt
    mount --bind "$instance/run" /run
    mount --bind "$instance/log" /var/log
    exec "$@"
fi
# The root a mount of its own, so that inside the chroot `/` is a mount point: libvirt makes
# `/` a slave mount before it builds a guest's private /dev, and fails (EINVAL) otherwise.
mount --bind "$root" "$root"
mount --bind "$instance/etc" "$root/etc/libvirt"
mount --bind "$instance/lib" "$root/var/lib/libvirt"
mount --bind "$instance/run" "$root/run"
mount --bind "$instance/log" "$root/var/log"
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
# A /dev of its own holding the machine's basic nodes but not /dev/kvm. KVM does not work on
# the machines these tests run on (guests are TCG), and libvirt 9.0 takes a /dev/kvm that its
# QEMU probe could not use for a stale capabilities cache: it probed QEMU again (~4 s) on every
# call that needs capabilities. Everything made here lives in this tmpfs.
mount -t tmpfs -o mode=0755,nosuid banlieue-dev "$root/dev"
for node in null zero full random urandom tty ptmx; do
    if [ -e "/dev/$node" ]; then
        : >"$root/dev/$node"
        mount --bind "/dev/$node" "$root/dev/$node"
    fi
done
mkdir "$root/dev/pts" "$root/dev/shm"
mount --bind /dev/pts "$root/dev/pts"
mount -t tmpfs -o mode=1777,nosuid,nodev banlieue-shm "$root/dev/shm"
ln -s /proc/self/fd "$root/dev/fd"
mount -t tmpfs -o mode=1777 banlieue-tmp "$root/tmp"
# The machine's name resolution: libvirt looks up the host's name, which only the machine's
# /etc/hosts may know (DNS would make each lookup wait for seconds).
for file in /etc/hosts /etc/resolv.conf; do
    if [ -f "$file" ] && [ -f "$root$file" ]; then
        mount --bind "$file" "$root$file"
    fi
done
# The instance directory at its own path, so that the absolute paths in the configuration
# (PKI files) and in the tests' XML (pool directories) mean the same inside. Under /tmp (the
# usual TMPDIR) the mount point lives in the tmpfs above and leaves nothing in the root.
mkdir -p "$root$instance"
mount --bind "$instance" "$root$instance"
exec chroot "$root" "$@"

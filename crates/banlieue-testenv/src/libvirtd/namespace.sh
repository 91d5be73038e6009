# Run by `unshare --mount --propagation private` for one libvirtd test instance: lays the
# instance's directories over the system paths libvirtd, QEMU and swtpm hard-code, then becomes
# the daemon. The mounts exist only in this private namespace and vanish with its last process.
#
#   sh namespace.sh INSTANCE_DIR DAEMON [ARGS...]
set -eu
instance=$1
shift
mount --bind "$instance/etc" /etc/libvirt
mount --bind "$instance/lib" /var/lib/libvirt
mount --bind "$instance/run" /run
mount --bind "$instance/log" /var/log
exec "$@"

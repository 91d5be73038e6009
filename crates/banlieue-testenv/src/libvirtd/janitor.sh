# Watches one libvirtd test instance from outside the test process. Its stdin is a pipe whose
# other end only the test process holds: end of file means that process is gone, however it
# ended (normal drop, panic, Ctrl-C, kill -9). The daemon itself dies with the test process
# (parent-death signal), but the guests it started are daemonized and would live on; so kill
# them by the PIDs in the instance's pid files, then remove the instance's directory. After a
# normal drop the directory is already gone and this exits at once.
#
#   sh janitor.sh INSTANCE_DIR
trap '' INT TERM HUP
dir=$1
cat >/dev/null
[ -d "$dir" ] || exit 0
ours=$(readlink /proc/self/ns/mnt)
find "$dir/run/libvirt" -name '*.pid' ! -name libvirtd.pid ! -name driver.pid 2>/dev/null |
while read -r file; do
    pid=$(cat "$file" 2>/dev/null) || continue
    case $pid in '' | *[!0-9]*) continue ;; esac
    # Only processes in another mount namespace: a guest of the instance, never an unrelated
    # host process that was given a recycled PID.
    theirs=$(readlink "/proc/$pid/ns/mnt" 2>/dev/null) || continue
    [ "$theirs" != "$ours" ] && kill -KILL "$pid" 2>/dev/null
done
rm -rf "$dir"

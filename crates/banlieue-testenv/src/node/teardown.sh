# shellcheck shell=bash
# Tears one test node down, from outside the test process. Its stdin is a pipe only the test
# process holds; lines `pid N` name the node's own processes (containerd, kube-scheduler,
# kubelet). End of file means the node is gone, however the test process ended (drop, panic,
# Ctrl-C, kill -9), and the node is then taken apart:
#   1. its processes, by PID, each checked to still name the node's directory;
#   2. every container process, by the node's own cgroup tree (kubelet's cgroupRoot);
#   3. the containerd shims (daemonized, so no parent-death signal reaches them), found by the
#      node directory on their command line, and their sockets under /run/containerd/s;
#   4. every mount under the node directory (rootfs overlays, sandbox /dev/shm, token tmpfs,
#      the kubelet's rshared bind mount), deepest first;
#   5. the cgroups, the /var/log/containers links into the node directory, the host state the
#      kubelet and containerd change (host-state.sh), and the directory.
#
#   bash -c "$(cat host-state.sh teardown.sh)" teardown NODE_DIR CGROUP_NAME
trap '' INT TERM HUP
dir=$1
cgroup=$2
pids=()
while read -r word arg; do
    [[ $word == pid ]] && pids+=("$arg")
done
ours() { grep -qF -- "$dir" "/proc/$1/cmdline" 2>/dev/null; }
wait_gone() {
    local pid
    for pid in "$@"; do
        for _ in $(seq 100); do
            ours "$pid" || break
            sleep 0.05
        done
    done
}

for pid in "${pids[@]}"; do ours "$pid" && kill -KILL "$pid" 2>/dev/null; done
wait_gone "${pids[@]}"

# Containers: whatever runs in the node's cgroups. Repeated, since a dying shim may still reap
# and a forking process may add one.
for _ in $(seq 50); do
    procs=$(find /sys/fs/cgroup/*/"$cgroup" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u)
    [[ -z $procs ]] && break
    # shellcheck disable=SC2086
    kill -KILL $procs 2>/dev/null
    sleep 0.05
done

shims=()
for proc in /proc/[0-9]*; do
    pid=${proc#/proc/}
    [[ $(readlink "$proc/exe" 2>/dev/null) == */containerd-shim-runc-v2 ]] && ours "$pid" && shims+=("$pid")
done
if ((${#shims[@]})); then
    # The shims' listening sockets: their inodes, then the paths /proc/net/unix gives them.
    inodes=" "
    for pid in "${shims[@]}"; do
        for fd in /proc/"$pid"/fd/*; do
            link=$(readlink "$fd" 2>/dev/null) || continue
            [[ $link == socket:\[*\] ]] && inodes+="${link//[^0-9]/} "
        done
    done
    sockets=$(awk -v inodes="$inodes" 'index(inodes, " " $7 " ") && $8 ~ /^\/run\/containerd\/s\// { print $8 }' /proc/net/unix)
    for pid in "${shims[@]}"; do kill -KILL "$pid" 2>/dev/null; done
    wait_gone "${shims[@]}"
    for socket in $sockets; do rm -f "$socket"; done
fi

# Mount points are in field 5 of mountinfo; reverse order puts children before parents.
for _ in 1 2 3; do
    mounts=$(awk -v d="$dir/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r)
    [[ -z $mounts ]] && break
    for mount in $mounts; do umount -l "$mount" 2>/dev/null; done
done

for hierarchy in /sys/fs/cgroup/*/; do
    [[ -d $hierarchy$cgroup ]] && find "$hierarchy$cgroup" -depth -type d -exec rmdir {} \; 2>/dev/null
done

find /var/log/containers -maxdepth 1 -lname "$dir/*" -delete 2>/dev/null
# From host-state.sh, which is prepended: the last node restores the host's own state.
release_host_state "$dir"
rm -rf -- "$dir"

# shellcheck shell=bash
# What the kubelet and containerd change on the host outside a node's directory, whatever their
# flags say: three kernel settings (the kubelet's setupKernelTunables), the kubelet's
# device-plugin socket and /var/log/containers, containerd's /run/containerd. That state is the
# machine's, shared by every test node on it (a test binary's node may still be tearing down
# when the next one starts): saved when the first node registers, restored when the last one
# is released. Registrations live in /run/banlieue-test-nodes, under a lock.
#
# Functions for node.rs (register, then prepended to teardown.sh).
host_state=/run/banlieue-test-nodes
host_sysctls=(vm/overcommit_memory kernel/panic kernel/panic_on_oops)
# Innermost first, the order they are removed in.
host_paths=(
    /var/lib/kubelet/device-plugins/kubelet.sock /var/lib/kubelet/device-plugins /var/lib/kubelet
    /var/log/containers /run/containerd/s /run/containerd
)

# live_nodes: the registered nodes whose directory still exists; drops the others (a node whose
# janitor never ran).
live_nodes() {
    local entry live=0
    for entry in "$host_state"/node-*; do
        [[ -e $entry ]] || continue
        if [[ -d $(<"$entry") ]]; then live=$((live + 1)); else rm -f "$entry"; fi
    done
    echo "$live"
}

# register_host_state NODE_DIR
register_host_state() {
    mkdir -p "$host_state"
    (
        flock 9
        if (($(live_nodes) == 0)); then
            local name path
            for name in "${host_sysctls[@]}"; do echo "$name $(<"/proc/sys/$name")"; done >"$host_state/sysctls"
            for path in "${host_paths[@]}"; do [[ -e $path ]] || echo "$path"; done >"$host_state/created-paths"
        fi
        echo "$1" >"$host_state/node-${1//\//_}"
    ) 9>>"$host_state/lock"
}

# release_host_state NODE_DIR: once that node's processes are gone.
release_host_state() {
    [[ -d $host_state ]] || return 0
    (
        flock 9
        rm -f "$host_state/node-${1//\//_}"
        (($(live_nodes) == 0)) || exit 0
        local name value path
        if [[ -f $host_state/sysctls ]]; then
            while read -r name value; do
                [[ -n $value ]] && echo "$value" >"/proc/sys/$name"
            done <"$host_state/sysctls"
        fi
        if [[ -f $host_state/created-paths ]]; then
            while read -r path; do
                # Directories only if empty: something else may have put files there since.
                if [[ -S $path ]]; then rm -f "$path"; else rmdir "$path" 2>/dev/null; fi
            done <"$host_state/created-paths"
        fi
        rm -rf "$host_state"
    ) 9>>"$host_state/lock"
}

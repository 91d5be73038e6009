#!/usr/bin/env bash
# scripts/control-plane start, env and stop, as docs/testing.md shows them: `start DIR` (the
# local-cluster binary of banlieue-testenv) brings a control plane up, `env DIR` points kubectl
# at it as admin, DIR's kubeconfigs authenticate the other identities, and `stop DIR` leaves
# none of the processes `start` printed, none of their state directories and nothing in DIR.
# Without --node (the node's tests cover it, and only one node runs at a time) or --oidc
# (45-claim-authorization-guide runs it).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"
fail() { echo "FAIL: $*" >&2; exit 1; }

dir=$(mktemp -d /tmp/banlieue-local-cluster-test-XXXXXX)
log=$dir.log
start_pid=""
cleanup() {
    scripts/control-plane stop "$dir" >/dev/null 2>&1 || true
    [[ -z $start_pid ]] || wait "$start_pid" 2>/dev/null || true
    rm -rf -- "$dir" "$log"
}
trap cleanup EXIT
begun=$SECONDS

scripts/control-plane start "$dir" >"$log" 2>&1 &
start_pid=$!
# The first start builds the binary; after scripts/test's build it only checks.
until scripts/control-plane env "$dir" >/dev/null 2>&1; do
    if ! kill -0 "$start_pid" 2>/dev/null; then
        cat "$log" >&2
        fail "scripts/control-plane start exited before the cluster was up"
    fi
    ((SECONDS - begun < 600)) || { cat "$log" >&2; fail "no cluster after 600 s"; }
    sleep 0.2
done
up_after=$((SECONDS - begun))

eval "$(scripts/control-plane env "$dir")"
[[ $(command -v kubectl) == "$(scripts/control-plane bin-dir)/kubectl" ]] ||
    fail "env puts $(command -v kubectl) first, not the control plane's kubectl"
[[ $(kubectl get --raw /readyz) == ok ]] || fail "/readyz is not ok"
[[ $BANLIEUE_TEST_KUBECONFIG == "$KUBECONFIG" ]] || fail "BANLIEUE_TEST_KUBECONFIG is not the admin's"
for user in alice bob broker; do
    whoami=$(KUBECONFIG=$dir/kubeconfigs/$user.kubeconfig kubectl auth whoami -o jsonpath='{.status.userInfo.username}')
    [[ $whoami == "$user" ]] || fail "$dir/kubeconfigs/$user.kubeconfig authenticates as '$whoami'"
done

# Every process start printed ("<name> pid N, log FILE" or "…, cleans up DIR"), the binary
# itself, and the state directories they name.
mapfile -t pids < <(cat "$dir/pid"; sed -n 's/^local-cluster: .* pid \([0-9]*\), .*/\1/p' "$log")
mapfile -t state_dirs < <(sed -n 's/^local-cluster: .* cleans up \(.*\)$/\1/p' "$log")
((${#pids[@]} >= 5)) || { cat "$log" >&2; fail "expected etcd, kube-apiserver, kube-controller-manager, a janitor and local-cluster itself"; }
((${#state_dirs[@]} >= 1)) || fail "no state directory printed"

scripts/control-plane stop "$dir"
status=0
wait "$start_pid" || status=$?
start_pid=""
((status == 0)) || { cat "$log" >&2; fail "local-cluster exited with $status after stop"; }
for pid in "${pids[@]}"; do
    state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || continue
    # A zombie waiting for its new parent (init) to reap it has stopped too.
    [[ $state == Z ]] || fail "pid $pid still runs after stop: $(tr '\0' ' ' <"/proc/$pid/cmdline")"
done
for state in "${state_dirs[@]}"; do
    [[ ! -e $state ]] || fail "$state is left after stop"
done
[[ -z $(ls -A "$dir") ]] || fail "stop left $(ls -A "$dir" | tr '\n' ' ')in $dir"
scripts/control-plane env "$dir" >/dev/null 2>&1 && fail "env still prints a stopped cluster"
echo "ok: local cluster up after $up_after s, stopped with its ${#pids[@]} processes ($((SECONDS - begun)) s)"

#!/usr/bin/env bash
# The operator as users deploy it: banlieue's image on the test cluster's real node, installed
# from an earlier commit's manifests with `banlieue bootstrap --image`, `kubectl apply -k` and
# `helm install` in turn and upgraded to this commit's, and the guides followed with kubectl
# against a real libvirtd (crates/banlieue/tests/deployed.rs). BANLIEUE_DEPLOYED_INSTALLERS
# picks installers; BANLIEUE_DEPLOYED_DEV_UP=0 leaves out `dev up --deployed`. The
# image's binary is one already built, and only packaged here.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"
# shellcheck source=../lib/env.sh
source scripts/lib/env.sh

work=$(mktemp -d "${TMPDIR:-/tmp}/banlieue-deployed.XXXXXX")
trap 'rm -rf "$work"' EXIT
# The binary scripts/test built for the image, or the release one 50-image.sh built; run
# alone with neither, scripts/image builds it.
binary=()
if [[ -n ${BANLIEUE_PRODUCT_BINARY:-} ]]; then
    binary=(--binary "$BANLIEUE_PRODUCT_BINARY")
elif [[ -x $CARGO_TARGET_DIR/image/banlieue ]]; then
    binary=(--binary "$CARGO_TARGET_DIR/image/banlieue")
fi
scripts/image --out "$work" "${binary[@]}" >"$work/image.out"
archive=$(find "$work" -name '*.docker.tar' | head -1)
[[ -f $archive ]] || { echo "FAIL: scripts/image wrote no docker archive" >&2; cat "$work/image.out" >&2; exit 1; }
echo "deployed: image $(awk '$1 == "digest" {print $2}' "$work/image.out")"
# Once per way the README installs the operator: `banlieue bootstrap`, the kustomize base and
# the Helm chart, each on a fresh cluster and node, the guides followed and a claim bound.
# scripts/test names the test binary its one build made; run alone, this part builds it.
for installer in ${BANLIEUE_DEPLOYED_INSTALLERS:-bootstrap kustomize helm}; do
    echo "deployed: installed with $installer"
    if [[ -n ${BANLIEUE_DEPLOYED_TEST:-} ]]; then
        (cd crates/banlieue && BANLIEUE_IMAGE_ARCHIVE=$archive INSTA_UPDATE=no \
            BANLIEUE_DEPLOYED_INSTALLER=$installer "$BANLIEUE_DEPLOYED_TEST" --ignored --nocapture)
    else
        BANLIEUE_IMAGE_ARCHIVE=$archive INSTA_UPDATE=no BANLIEUE_DEPLOYED_INSTALLER=$installer \
            cargo test --workspace --locked --test deployed -- --ignored --nocapture
    fi
done

# The main job as users would watch it in production: `dev up --deployed` with the same image
# (not on the oldest release's cluster, whose run is the install and upgrade alone).
if [[ ${BANLIEUE_DEPLOYED_DEV_UP:-1} == 0 ]]; then
    exit 0
fi
echo "deployed: banlieue-dev up --deployed"
"$CARGO_TARGET_DIR/debug/banlieue-dev" up --deployed --non-interactive \
    --image-archive "$archive" >"$work/dev-up.out"
grep -q ' Bound ' "$work/dev-up.out" || {
    echo "FAIL: dev up --deployed printed no Bound claim" >&2
    cat "$work/dev-up.out" >&2
    exit 1
}
cat "$work/dev-up.out"

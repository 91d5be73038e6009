#!/usr/bin/env bash
# The operator as users deploy it: banlieue's image on the test cluster's real node, installed
# from an earlier commit's manifests with `banlieue bootstrap --image`, `kubectl apply -k` and
# `helm install` in turn and upgraded to this commit's, and the guides followed with kubectl
# against a real libvirtd (crates/banlieue/tests/deployed.rs), then `dev up --deployed`.
#
#   60-deployed.sh                 # the image, every installer, then dev up --deployed
#   60-deployed.sh image DIR       # only the image's docker archive, written into DIR
#   60-deployed.sh install NAME    # one installer (bootstrap, kustomize or helm)
#   60-deployed.sh dev-up          # only `dev up --deployed`
#
# BANLIEUE_DEPLOYED_IMAGE_DIR names a directory `image DIR` wrote; without it, each run
# writes its own image. scripts/test runs the parts as jobs of their own, the
# image once for all of them (scripts/lib/test-plan.py). BANLIEUE_DEPLOYED_INSTALLERS picks
# the installers of a whole run; BANLIEUE_DEPLOYED_DEV_UP=0 leaves out `dev up --deployed`.
# The image's binary is one already built, and only packaged here.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"
# shellcheck source=../lib/env.sh
source scripts/lib/env.sh

work=$(mktemp -d "${TMPDIR:-/tmp}/banlieue-deployed.XXXXXX")
trap 'rm -rf "$work"' EXIT

# write_image DIR: the image's archives in DIR, from the binary scripts/test built for the
# image, or the release one 50-image.sh built; run alone with neither, scripts/image builds it.
write_image() {
    local dir=$1 binary=()
    if [[ -n ${BANLIEUE_PRODUCT_BINARY:-} ]]; then
        binary=(--binary "$BANLIEUE_PRODUCT_BINARY")
    elif [[ -x $CARGO_TARGET_DIR/image/banlieue ]]; then
        binary=(--binary "$CARGO_TARGET_DIR/image/banlieue")
    fi
    scripts/image --out "$dir" "${binary[@]}" >"$work/image.out"
    local archive
    archive=$(find "$dir" -name '*.docker.tar' | head -1)
    [[ -f $archive ]] || { echo "FAIL: scripts/image wrote no docker archive" >&2; cat "$work/image.out" >&2; exit 1; }
    echo "deployed: image $(awk '$1 == "digest" {print $2}' "$work/image.out") in $archive"
}

archive() {
    local dir=${BANLIEUE_DEPLOYED_IMAGE_DIR:-} archive
    if [[ -z $dir ]]; then
        dir=$work/image
        write_image "$dir" >&2
    fi
    archive=$(find "$dir" -name '*.docker.tar' 2>/dev/null | head -1)
    [[ -f $archive ]] || { echo "FAIL: no image archive in $dir" >&2; exit 1; }
    echo "$archive"
}

# install NAME: the guides on a fresh cluster and node with the operator installed by NAME, a
# claim bound. scripts/test names the test binary its one build made; run alone, this part
# builds it.
install() {
    local installer=$1 archive=$2
    echo "deployed: installed with $installer"
    if [[ -n ${BANLIEUE_DEPLOYED_TEST:-} ]]; then
        (cd crates/banlieue && BANLIEUE_IMAGE_ARCHIVE=$archive INSTA_UPDATE=no \
            BANLIEUE_DEPLOYED_INSTALLER=$installer "$BANLIEUE_DEPLOYED_TEST" --ignored --nocapture)
    else
        BANLIEUE_IMAGE_ARCHIVE=$archive INSTA_UPDATE=no BANLIEUE_DEPLOYED_INSTALLER=$installer \
            cargo test --workspace --locked --test deployed -- --ignored --nocapture
    fi
}

# dev_up: the main job as users would watch it in production, with the same image.
dev_up() {
    local archive=$1
    echo "deployed: banlieue-dev up --deployed"
    "$CARGO_TARGET_DIR/debug/banlieue-dev" up --deployed --non-interactive \
        --image-archive "$archive" >"$work/dev-up.out"
    grep -q ' Bound ' "$work/dev-up.out" || {
        echo "FAIL: dev up --deployed printed no Bound claim" >&2
        cat "$work/dev-up.out" >&2
        exit 1
    }
    cat "$work/dev-up.out"
}

case ${1:-all} in
    image)
        write_image "${2:?image needs a directory}"
        ;;
    install)
        installer=${2:?install needs an installer: bootstrap, kustomize or helm}
        image=$(archive)
        install "$installer" "$image"
        ;;
    dev-up)
        image=$(archive)
        dev_up "$image"
        ;;
    all)
        image=$(archive)
        for installer in ${BANLIEUE_DEPLOYED_INSTALLERS:-bootstrap kustomize helm}; do
            install "$installer" "$image"
        done
        # Not on the oldest release's cluster, whose run is the install and upgrade alone.
        [[ ${BANLIEUE_DEPLOYED_DEV_UP:-1} == 0 ]] || dev_up "$image"
        ;;
    *)
        echo "usage: 60-deployed.sh [image DIR | install NAME | dev-up]" >&2
        exit 2
        ;;
esac

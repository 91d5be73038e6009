#!/usr/bin/env bash
# scripts/image: the container image is reproducible and well formed.
#
# Built twice with the same SOURCE_DATE_EPOCH into two directories (the second packages the
# first's binary, so no second compile): the archives are byte for byte the same. Then read
# back by readers that share no code with the writer: skopeo (the containers/image library)
# checks the OCI and docker archives and their digests, GNU tar unpacks the layer, and the
# binary is run on nothing but the unpacked layer's loader and libraries, as the image's user.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"
# shellcheck source=../lib/env.sh
source scripts/lib/env.sh
# shellcheck source=../lib/apt-install.sh
source scripts/lib/apt-install.sh

fail() {
    echo "FAIL: $*" >&2
    exit 1
}

pass() {
    echo "ok: $*"
}

work=$(mktemp -d "${TMPDIR:-/tmp}/banlieue-image-test.XXXXXX")
trap 'rm -rf "$work"' EXIT

mkdir -p "$BANLIEUE_CACHE/logs"
apt_log=$BANLIEUE_CACHE/logs/apt-skopeo.log
if ! apt_install_missing skopeo >"$apt_log" 2>&1 || ! command -v skopeo >/dev/null; then
    if [[ ${BANLIEUE_ALLOW_MISSING_PEERS:-} == 1 ]]; then
        echo
        echo "!!!!! SKIPPED: skopeo could not be installed (see $apt_log); the image is not checked (BANLIEUE_ALLOW_MISSING_PEERS=1) !!!!!"
        echo
        exit 0
    fi
    fail "skopeo could not be installed, see $apt_log (or set BANLIEUE_ALLOW_MISSING_PEERS=1 to skip)"
fi

# field FILE KEY: the value printed on the `KEY  value` line of scripts/image's output.
field() {
    awk -v key="$2" '$1 == key {print $2}' "$1"
}

export SOURCE_DATE_EPOCH
SOURCE_DATE_EPOCH=$(git log -1 --format=%ct)
version=$(cargo metadata --no-deps --format-version 1 --offline --locked |
    python3 -c 'import json, sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "banlieue"))')
name=localhost/banlieue:$version

# --- same source, same bytes ----------------------------------------------------------------
# scripts/test hands over the product's binary its build made (the image's features, the test
# profile); run alone, this part builds it as users do, with the release `image` profile.
if [[ -n ${BANLIEUE_PRODUCT_BINARY:-} ]]; then
    binary=$BANLIEUE_PRODUCT_BINARY
    scripts/image --out "$work/a" --binary "$binary" >"$work/a.out"
else
    scripts/image --out "$work/a" >"$work/a.out"
    binary=$CARGO_TARGET_DIR/image/banlieue
fi
scripts/image --out "$work/b" --binary "$binary" >"$work/b.out"
digest=$(field "$work/a.out" digest)
[[ $digest == sha256:* ]] || fail "scripts/image printed no digest: $(cat "$work/a.out")"
[[ $(field "$work/b.out" digest) == "$digest" ]] || fail "a second build has another digest: $(field "$work/b.out" digest), first $digest"
oci=$work/a/banlieue-$version.oci.tar
docker=$work/a/banlieue-$version.docker.tar
[[ $(field "$work/a.out" oci) == "$oci" && $(field "$work/a.out" docker) == "$docker" ]] ||
    fail "the archives are not where scripts/image says: $(cat "$work/a.out")"
cmp "$oci" "$work/b/banlieue-$version.oci.tar" || fail "the OCI archives differ"
cmp "$docker" "$work/b/banlieue-$version.docker.tar" || fail "the docker archives differ"
pass "built twice with SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH: the same archives, digest $digest"

SOURCE_DATE_EPOCH=$((SOURCE_DATE_EPOCH + 1)) scripts/image --out "$work/c" --binary "$binary" >"$work/c.out"
[[ $(field "$work/c.out" digest) != "$digest" ]] || fail "the digest does not depend on SOURCE_DATE_EPOCH"
pass "another SOURCE_DATE_EPOCH gives another digest"

# --- the OCI archive, as skopeo reads it ----------------------------------------------------
skopeo inspect "oci-archive:$oci" >"$work/inspect.json"
skopeo inspect --config "oci-archive:$oci" >"$work/config.json"
# Copying verifies every blob against its digest.
skopeo copy --quiet "oci-archive:$oci" "dir:$work/dir"
revision=$(git rev-parse HEAD)
[[ -z $(git status --porcelain --untracked-files=no) ]] || revision+="-dirty"
python3 - "$work" "$digest" "$version" "$revision" "$SOURCE_DATE_EPOCH" "$name" "$(dpkg --print-architecture)" <<'PY'
import json, sys, time
work, digest, version, revision, epoch, name, arch = sys.argv[1:]
inspect = json.load(open(f"{work}/inspect.json"))
config = json.load(open(f"{work}/config.json"))
problems = []
def expect(what, got, want):
    if got != want:
        problems.append(f"{what}: {got!r}, want {want!r}")
created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(epoch)))
expect("digest", inspect["Digest"], digest)
expect("user", config["config"].get("User"), "65532:65532")
expect("entrypoint", config["config"].get("Entrypoint"), ["/banlieue"])
expect("cmd", config["config"].get("Cmd"), None)
expect("os/architecture", (config["os"], config["architecture"]), ("linux", arch))
expect("created", config["created"], created)
labels = config["config"].get("Labels", {})
for key in ("title", "description", "source", "licenses"):
    if not labels.get(f"org.opencontainers.image.{key}"):
        problems.append(f"label org.opencontainers.image.{key} is missing")
expect("version label", labels.get("org.opencontainers.image.version"), version)
expect("revision label", labels.get("org.opencontainers.image.revision"), revision)
expect("created label", labels.get("org.opencontainers.image.created"), created)
# The layer skopeo copied out is the one the config's diff_id names, once unpacked.
manifest = json.load(open(f"{work}/dir/manifest.json"))
expect("layers", len(manifest["layers"]), 1)
expect("layer media type", manifest["layers"][0]["mediaType"], "application/vnd.oci.image.layer.v1.tar+gzip")
open(f"{work}/layer-blob", "w").write(manifest["layers"][0]["digest"].removeprefix("sha256:"))
open(f"{work}/diff-id", "w").write(config["rootfs"]["diff_ids"][0])
if problems:
    sys.exit("FAIL: " + "\n".join(problems))
PY
pass "OCI archive: digest, user 65532:65532, entrypoint /banlieue, labels (version $version, revision $revision)"

# --- the docker archive: the same config and layer, under the image's name -----------------
skopeo inspect --config "docker-archive:$docker" >"$work/docker-config.json"
cmp -s <(python3 -m json.tool --sort-keys "$work/config.json") <(python3 -m json.tool --sort-keys "$work/docker-config.json") ||
    fail "the docker archive's config differs from the OCI archive's"
tags=$(tar -xOf "$docker" manifest.json | python3 -c 'import json, sys; print(*json.load(sys.stdin)[0]["RepoTags"])')
[[ $tags == "$name" ]] || fail "docker archive tagged '$tags', want $name"
pass "docker archive: the same config, tagged $name"

# --- the layer's contents: the binary, its loader and libraries, the account, the CA bundle;
# no shell --------------------------------------------------------------------------------------
rootfs=$work/rootfs
mkdir "$rootfs"
layer=$work/dir/$(cat "$work/layer-blob")
[[ "sha256:$(gzip -dc "$layer" | sha256sum | cut -d' ' -f1)" == "$(cat "$work/diff-id")" ]] ||
    fail "the unpacked layer does not match the config's diff_id"
tar -xzf "$layer" -C "$rootfs" --numeric-owner
owners=$(tar -tvzf "$layer" --numeric-owner | awk '{print $2}' | sort -u)
[[ $owners == "0/0" ]] || fail "layer entries owned by $owners, want 0/0 only"
for shell in bin/sh usr/bin/sh bin/bash bin/busybox; do
    [[ ! -e $rootfs/$shell ]] || fail "the image has $shell"
done
expected=$(
    echo banlieue
    echo etc/group
    echo etc/passwd
    echo etc/ssl/certs/ca-certificates.crt
    ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// {print substr($3, 2)} $1 ~ /^\// {print substr($1, 2)}'
)
files=$(cd "$rootfs" && find . -type f -printf '%P\n' | sort)
[[ $files == "$(sort <<<"$expected")" ]] || fail "the layer holds other files than expected:
$(diff <(sort <<<"$expected") <(echo "$files") || true)"
grep -qx 'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' "$rootfs/etc/passwd" || fail "no nonroot 65532 in etc/passwd"
grep -qx 'nonroot:x:65532:' "$rootfs/etc/group" || fail "no nonroot 65532 in etc/group"
cmp -s "$rootfs/etc/ssl/certs/ca-certificates.crt" /etc/ssl/certs/ca-certificates.crt || fail "the image's CA bundle is not the build machine's"
pass "layer: $(wc -l <<<"$files") files (the binary, ld.so and $(($(wc -l <<<"$files") - 5)) libraries, passwd, group, the CA bundle), all 0/0, no shell"

# --- the binary runs on the image's own loader and libraries --------------------------------
loader=$(find "$rootfs/lib64" "$rootfs/lib" -name 'ld-linux*.so.*' -type f | head -1)
libdirs=$(find "$rootfs" -name '*.so*' -type f -printf '%h\n' | sort -u | paste -sd:)
out=$("$loader" --inhibit-cache --library-path "$libdirs" "$rootfs/banlieue" --version) ||
    fail "the binary does not run with the image's loader and libraries"
[[ $out == "banlieue $version" ]] || fail "--version printed '$out'"
pass "the image's ld.so runs /banlieue --version with only the image's libraries: $out"
if ((EUID == 0)); then
    # As a runtime starts it: the image's root, its user, PT_INTERP and the loader's own search
    # path; nothing of the host.
    out=$(env -i "$(command -v chroot)" --userspec=65532:65532 "$rootfs" /banlieue bootstrap --help) ||
        fail "/banlieue does not run as 65532 in the image's root"
    grep -qF "[default: $name]" <<<"$out" || fail "bootstrap --image does not default to $name: $out"
    pass "chroot as 65532:65532: /banlieue runs, and bootstrap --image defaults to $name"
else
    echo "note: not root, so the run in a chroot of the image's root is left out"
fi

# --- the product without the test harness ----------------------------------------------------
# `banlieue-dev` and banlieue-testenv (control plane, libvirtd and registry runners, a PKI, a
# bcrypt htpasswd) are development tools: the product crate depends on neither, whatever its
# features, and its binary has no dev subcommand.
tree=$(cargo tree --locked --offline -e normal -p banlieue --all-features --prefix none -f '{p} {f}')
for crate in banlieue-dev banlieue-testenv anyhow bcrypt rcgen; do
    ! grep -q "^$crate v" <<<"$tree" || fail "the image's dependency tree holds $crate:
$(cargo tree --locked --offline -e normal -p banlieue --all-features -i "$crate" | head -20)"
done
if "$binary" dev --help >"$work/dev.out" 2>&1; then
    fail "the image's binary has a dev subcommand"
fi
grep -q "unrecognized subcommand 'dev'" "$work/dev.out" || fail "banlieue dev in the image: $(cat "$work/dev.out")"
pass "no test harness: no banlieue-dev, banlieue-testenv, anyhow, bcrypt or rcgen in the product's dependency tree, and no dev subcommand"

# --- size ----------------------------------------------------------------------------------
compressed=$(stat -c %s "$layer")
uncompressed=$(gzip -dc "$layer" | wc -c)
((compressed < 40 * 1024 * 1024)) || fail "the compressed layer is $compressed bytes, over 40 MiB"
pass "size: $((compressed / 1024)) KiB compressed, $((uncompressed / 1024)) KiB uncompressed"

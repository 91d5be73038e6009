"""Fills a cargo local registry (index + .crate files) for one resolved Cargo.lock.

    local-registry.py LOCK UNPACKED OUT CARGO_REGISTRY CRATE...

Third-party packages: their index line from cargo's index cache under CARGO_REGISTRY (the
cache file is a format byte, a little-endian u32 index version, a header string, then
NUL-terminated version and JSON pairs), their .crate from its download cache if there.
Packaged crates (CRATE..., unpacked under UNPACKED): an index line from their manifest.
Used by local-registry.sh.
"""

import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tomllib

CRATES_IO = "registry+https://github.com/rust-lang/crates.io-index"


def index_path(name):
    n = name.lower()
    if len(n) <= 2:
        return os.path.join(str(len(n)), n)
    if len(n) == 3:
        return os.path.join("3", n[0], n)
    return os.path.join(n[:2], n[2:4], n)


def cached_index_line(registry, name, version):
    for cache in glob.glob(os.path.join(registry, "index", "*", ".cache", index_path(name))):
        with open(cache, "rb") as f:
            data = f.read()
        fields = data[5:].split(b"\0")
        # fields[0] is the header; then version, JSON, version, JSON, ...
        for i in range(1, len(fields) - 1, 2):
            if fields[i].decode() == version:
                return json.loads(fields[i + 1])
    return None


def manifest_index_line(manifest, crate):
    meta = json.loads(
        subprocess.run(
            ["cargo", "metadata", "--offline", "--no-deps", "--format-version", "1",
             "--manifest-path", manifest],
            check=True, capture_output=True, text=True,
        ).stdout
    )
    pkg = meta["packages"][0]
    deps = []
    for d in pkg["dependencies"]:
        if d["kind"] == "dev":
            continue
        dep = {
            "name": d["rename"] or d["name"], "req": d["req"], "features": d["features"],
            "optional": d["optional"], "default_features": d["uses_default_features"],
            "target": d["target"], "kind": d["kind"] or "normal",
        }
        if d["rename"]:
            dep["package"] = d["name"]
        deps.append(dep)
    with open(crate, "rb") as f:
        cksum = hashlib.sha256(f.read()).hexdigest()
    return {
        "name": pkg["name"], "vers": pkg["version"], "deps": deps, "cksum": cksum,
        "features": {}, "features2": pkg["features"], "yanked": False,
        "links": pkg.get("links"), "rust_version": pkg.get("rust_version"), "v": 2,
    }


def main():
    lock, unpacked, out, registry, crates = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
    with open(lock, "rb") as f:
        packages = tomllib.load(f)["package"]
    lines = []
    copied = 0
    for pkg in packages:
        if pkg.get("source") != CRATES_IO:
            continue
        stem = f'{pkg["name"]}-{pkg["version"]}'
        line = cached_index_line(registry, pkg["name"], pkg["version"])
        if line is None:
            sys.exit(f"{stem} is not in cargo's index cache under {registry}")
        lines.append(line)
        found = glob.glob(os.path.join(registry, "cache", "*", stem + ".crate"))
        if found:
            shutil.copyfile(found[0], os.path.join(out, stem + ".crate"))
            copied += 1
    for crate in crates:
        stem = os.path.basename(crate)[: -len(".crate")]
        lines.append(manifest_index_line(os.path.join(unpacked, stem, "Cargo.toml"), crate))
        shutil.copyfile(crate, os.path.join(out, stem + ".crate"))
        copied += 1
    for line in lines:
        path = os.path.join(out, "index", index_path(line["name"]))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a") as f:
            f.write(json.dumps(line) + "\n")
    print(f"local registry {out}: {len(lines)} packages indexed, {copied} .crate files")


main()

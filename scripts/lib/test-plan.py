#!/usr/bin/env python3
"""The test suite's jobs, for scripts/lib/test-runner.py.

Reads the JSON messages of `cargo test --workspace --no-run --message-format=json…` on stdin
(so the plan runs exactly the binaries that one build made) and prints the plan: every test
binary as `cargo test` would run it, the reruns of some of them with other settings, clippy,
the doc tests and the scripts/test.d parts, each with what the runner needs to place it
beside the others.

    test-plan.py REPO [--quick] < cargo-messages.json > plan.json

--quick leaves out what needs a booted guest or a node, the reruns and the scripts/test.d
parts: the contributor's loop (fmt, clippy, unit tests, the tests against the API server and
libvirtd).
"""

import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

# Test binaries that boot guests under TCG (--quick leaves them out).
BOOTS_GUESTS = {
    "banlieue::guests",
    # The Secure Boot test boots the test guest beside the binary's libvirtd restart tests.
    "banlieue-provider-libvirt::machine",
    "banlieue-dev::dev",
    "banlieue-testenv::guest",
}
# Weights: the runner's slots a job takes. scripts/test gives the runner 4 slots on two cores
# (BANLIEUE_TEST_JOBS). A job that keeps both cores busy takes 3, so beside it runs one job that
# mostly waits; a job that boots one guest at a time takes 2 (so it never runs beside a job of
# weight 3: a deployed job beside banlieue::guests took 331 s, against 145 s beside jobs that
# wait); a job that mostly waits on a peer (a control plane, libvirtd, a pod) takes 1, the
# default. Measured on a fresh machine (one vmstat sample every 10 s beside the run of d1f0ea7,
# docs/testing.md "Side by side"): the cores stood idle 20% of banlieue::guests' run and 1-6% of
# the Go builds', but 61% of banlieue-dev::dev's, 66% of the machine tests', 25% of
# banlieue-testenv::guest's and 38-51% of the deployed test's, which then took as many slots as
# banlieue::guests.
WEIGHTS = {
    # Four guests booted under TCG, two at a time.
    "banlieue::guests": 3,
    # Go builds.
    "setup oldest-kubernetes": 3,
    "setup helm": 3,
    "setup agent-sandbox": 3,
    # Compiles (one at a time: the group "cargo"). clippy took 99 s beside one job that mostly
    # waits, 325 s beside two.
    "clippy": 3,
    "doc tests": 3,
    "test.d/10-package": 3,
    "public-api (banlieue-libvirt's public API)": 3,
}
# One guest at a time: weight 2, and one of them at a time (the group "guest").
BOOTS_ONE_GUEST = {
    "banlieue-provider-libvirt::machine",
    "banlieue-dev::dev",
    "banlieue-testenv::guest",
}
# Test binaries that run a kubelet node. A node writes paths outside its state directory
# (/var/lib/kubelet/device-plugins, /var/log/containers, sysctls it restores at teardown), so
# two never run at once.
RUNS_A_NODE = {
    "banlieue-testenv::node",
    "banlieue-testenv::node_teardown",
    "banlieue-testenv::agent_sandbox",
    "banlieue-dev::side_by_side",
    "banlieue::deployed",
    "banlieue::two_nodes",
}
# Set-up parts only some jobs need, and the last Go builds of the set-up's compile lane (minutes
# each on a fresh machine): they run as jobs of the plan, before the jobs that need them, so
# every other test starts without waiting for them. scripts/test leaves them out of the set-up
# it runs beside the build. A part no planned job needs is not run.
def late_setup():
    oldest = f"(Kubernetes {oldest_version()})"
    return {
        "helm": lambda name: name in ("banlieue::helm", "test.d/60-deployed: helm"),
        "oldest-kubernetes": lambda name: name.endswith(oldest),
        "agent-sandbox": lambda name: name in ("banlieue-testenv::agent_sandbox",
                                               "banlieue-dev::side_by_side"),
    }


# Durations on a fresh 2-core machine (docs/testing.md, "What a run costs": the run of d1f0ea7),
# for the order of a first run, which is CI's; later runs order by the timings the last run
# wrote. Jobs of a few seconds are left at 0.
FIRST_ESTIMATES = {
    "banlieue::guests": 411,
    "setup oldest-kubernetes": 388,
    "setup helm": 164,
    "test.d/60-deployed: bootstrap (Kubernetes v1.34.4)": 157,
    "test.d/60-deployed: kustomize": 154,
    "test.d/60-deployed: helm": 150,
    "test.d/60-deployed: bootstrap": 144,
    "test.d/60-deployed: dev up --deployed": 80,
    "test.d/60-deployed: image": 10,
    "clippy": 99,
    "banlieue-provider-libvirt::machine": 98,
    "banlieue::multi_host": 89,
    "banlieue::provider_crash": 81,
    "banlieue-dev::side_by_side": 79,
    "banlieue-controller::integration (Kubernetes v1.34.4)": 76,
    "setup agent-sandbox": 74,
    "banlieue-controller::integration": 73,
    "banlieue-controller::integration (VSphereMachine)": 72,
    "banlieue-controller::integration (MemoryMachine)": 72,
    "banlieue-testenv::guest": 66,
    "banlieue-dev::dev": 61,
    "banlieue-controller::chaos": 60,
    "banlieue::hostile_input": 54,
    "banlieue::bootstrap (Kubernetes v1.34.4)": 43,
    "test.d/30-bootstrap-libvirt-tls": 41,
    "banlieue::mixed_backends": 41,
    "public-api (banlieue-libvirt's public API)": 40,
    "banlieue::helm": 38,
    "banlieue::bootstrap": 34,
    "banlieue-imagebuilder::qcow2_oracle": 33,
    "banlieue::serve": 31,
    "test.d/10-package": 29,
    "test.d/50-image": 28,
    "banlieue-runtime::lease": 26,
    "banlieue::imagebuild": 25,
    "banlieue-api::oidc": 23,
    "banlieue-libvirt::compat_libvirtd": 23,
    "banlieue-testenv::node": 21,
    "banlieue-provider-vsphere::vcsim": 21,
    "banlieue-provider-libvirt::operator": 21,
    "banlieue-provider-libvirt::import": 21,
    "banlieue-libvirt::fuzz_packet (20 s)": 21,
    "banlieue::two_nodes": 20,
}


# The budget guard (docs/testing.md, "The budget"): a job that runs longer than its ceiling
# fails the run, so a slow new test is seen the day it lands rather than when CI's 90 minutes
# run out. The fresh-machine budget is 45 minutes, of which the jobs have about 25 on both
# cores; no single job may take a fifth of them. The jobs named below are allowed more, each
# for its reason, at about 1.5 times what it took on a fresh machine (docs/testing.md's table);
# a job that needs more is split (as 60-deployed is, per installer) or made faster.
DEFAULT_CEILING = 300
CEILINGS = {
    # Four guests booted under TCG, two at a time, and a saved guest left asleep for 30 s
    # before its claim (411 s fresh).
    "banlieue::guests": 600,
    # A Go build of five Kubernetes binaries from an empty build cache (388 s fresh alone, 500 s
    # beside a deployed job).
    "setup oldest-kubernetes": 600,
    # A node, a guest booted under TCG and pods that build and import an image: 145 s beside
    # jobs that wait, 218-260 s beside a Go build (when they had weight 1).
    "test.d/60-deployed": 400,
}


def ceiling(name):
    for prefix, seconds in CEILINGS.items():
        if name == prefix or name.startswith(prefix + " ") or name.startswith(prefix + ":"):
            return seconds
    return DEFAULT_CEILING


def package_version(package_id):
    # "path+file:///…/crates/banlieue#0.1.0", or "banlieue 0.1.0 (path+file:///…)" before cargo 1.77.
    if "#" in package_id:
        tail = package_id.rsplit("#", 1)[1]
        return tail.rsplit("@", 1)[-1]
    return package_id.split(" ")[1]


def job_name(package, target):
    kinds = target["kind"]
    if "test" in kinds:
        return f"{package}::{target['name']}"
    if "lib" in kinds or "proc-macro" in kinds or "rlib" in kinds:
        return f"{package} (lib)"
    return f"{package} ({kinds[0]} {target['name']})"


def test_binaries(messages):
    cargo = os.environ.get("CARGO") or shutil.which("cargo") or "cargo"
    seen = set()
    for line in messages:
        line = line.strip()
        if not line.startswith("{"):
            continue
        message = json.loads(line)
        if message.get("reason") != "compiler-artifact" or not message.get("executable"):
            continue
        if not message["profile"]["test"]:
            continue
        manifest_dir = str(Path(message["manifest_path"]).parent)
        package = package_from(message)
        name = job_name(package, message["target"])
        if name in seen:
            continue
        seen.add(name)
        yield name, {
            "argv": [message["executable"]],
            "cwd": manifest_dir,
            "env": {
                # What `cargo test` sets for a test binary it runs.
                "CARGO": cargo,
                "CARGO_MANIFEST_DIR": manifest_dir,
                "CARGO_PKG_NAME": package,
                "CARGO_PKG_VERSION": package_version(message["package_id"]),
                # insta never writes snapshots here: a missing or changed one fails the run.
                "INSTA_UPDATE": "no",
            },
        }


def package_from(message):
    # Cargo's package_id names the package: "path+file:///…/dir#name@version" when the name
    # differs from the directory, "…/dir#version" when it does not.
    package_id = message["package_id"]
    if "#" in package_id:
        url, tail = package_id.rsplit("#", 1)
        if "@" in tail:
            return tail.rsplit("@", 1)[0]
        return url.rstrip("/").rsplit("/", 1)[-1]
    return package_id.split(" ")[0]


def main():
    repo = Path(sys.argv[1]).resolve()
    quick = "--quick" in sys.argv[2:]
    jobs = []

    def add(name, argv, **spec):
        spec.setdefault("estimate", FIRST_ESTIMATES.get(name, 0))
        if name in WEIGHTS:
            spec["weight"] = WEIGHTS[name]
        spec.setdefault("ceiling", ceiling(name))
        jobs.append({"name": name, "argv": argv, **spec})

    # cargo takes the build directory's lock: jobs that call cargo wait in one queue rather than
    # hold the cores' slots while they block.
    # Then the binary with one backend at a time (crates/banlieue/src/backends.rs): an image for
    # one backend must build without the other's client. After the workspace's run these lint
    # only the banlieue crate again: every dependency's metadata is the first run's.
    add("clippy",
        ["bash", "-c",
         'cargo clippy --workspace --all-targets --locked -- -D warnings'
         ' && for backend in libvirt vsphere; do'
         ' cargo clippy -p banlieue --locked --no-default-features --features "$backend"'
         ' -- -D warnings || exit 1; done'],
        cwd=str(repo), group="cargo")
    add("doc tests", ["cargo", "test", "--workspace", "--locked", "--doc"],
        cwd=str(repo), group="cargo", env={"INSTA_UPDATE": "no"})

    # The runner's own arithmetic: the critical path and the ceilings below.
    add("scripts/lib (unit tests)",
        ["python3", "-m", "unittest", "discover", "-s", "scripts/lib", "-p", "*_test.py"],
        cwd=str(repo))

    # banlieue-libvirt's public API, a workspace of its own (public-api/Cargo.toml says why).
    public_api = ["--manifest-path", str(repo / "public-api" / "Cargo.toml"), "--locked"]
    add("public-api (banlieue-libvirt's public API)",
        ["bash", "-c", 'cargo clippy "$@" --all-targets -- -D warnings && cargo test "$@"',
         "public-api", *public_api],
        cwd=str(repo), group="cargo", env={"INSTA_UPDATE": "no"})

    binaries = dict(test_binaries(sys.stdin))
    for name, spec in sorted(binaries.items()):
        if quick and (name in BOOTS_GUESTS or name in RUNS_A_NODE):
            continue
        if name in BOOTS_ONE_GUEST:
            spec.update(weight=2, group="guest")
        if name in RUNS_A_NODE:
            spec["group"] = "node"
        add(name, **spec)

    if not quick:
        # The controller knows no backend: its integration tests run again, the same binary, with
        # the fake provider and fixtures of the other machine kind.
        rerun("banlieue-controller::integration", "banlieue-controller::integration (VSphereMachine)",
              {"BANLIEUE_TEST_MACHINE_KIND": "VSphereMachine"}, binaries, add)
        # And with the test-only MemoryMachine backend, a provider written with the kit alone
        # (ADR-0071): adding a backend is a CRD, a builder and a `machine::Backend`.
        rerun("banlieue-controller::integration", "banlieue-controller::integration (MemoryMachine)",
              {"BANLIEUE_TEST_MACHINE_KIND": "MemoryMachine"}, binaries, add)
        # The oldest supported Kubernetes release (ADR-0072): bootstrap, the admission policies
        # and the claim lifecycle against its control plane (built by scripts/setup
        # oldest-kubernetes), where MutatingAdmissionPolicy v1 is not served.
        oldest = {"BANLIEUE_CONTROL_PLANE_BIN": str(oldest_bin_dir())}
        for name in ["banlieue::bootstrap", "banlieue-api::admission",
                     "banlieue-controller::integration"]:
            rerun(name, f"{name} (Kubernetes {oldest_version()})", oldest, binaries, add)
        # Bounded fuzzing of the libvirt receive path (fuzz/README.md): the same binary, longer.
        rerun("banlieue-libvirt::fuzz_packet", "banlieue-libvirt::fuzz_packet (20 s)",
              {"BANLIEUE_FUZZ_SECS": os.environ.get("BANLIEUE_FUZZ_SECS", "20")}, binaries, add,
              extra_args=["--nocapture"])
        parts = {
            # Packages banlieue-libvirt and builds a consumer in a target directory of its own.
            "10-package": dict(group="cargo"),
            "30-bootstrap-libvirt-tls": dict(),
            "40-docs": dict(group="cargo"),
            # `scripts/control-plane start` builds the local-cluster binary (a check after the
            # test build) before it runs it.
            "42-local-cluster": dict(group="cargo"),
            "45-claim-authorization-guide": dict(group="cargo"),
            # Packages the product binary scripts/test built (cargo only for `cargo tree`).
            "50-image": dict(group="cargo"),
        }
        for script in sorted((repo / "scripts" / "test.d").glob("*.sh")):
            part = script.stem
            if part == "60-deployed":
                deployed(script, binaries, add)
            else:
                add(f"test.d/{part}", ["bash", str(script)], cwd=str(repo), **parts.get(part, {}))

    if not os.environ.get("SKIP_SETUP"):
        for part, needs in late_setup().items():
            needers = [job for job in jobs if needs(job["name"])]
            if not needers:
                continue
            # Go builds keep both cores busy (WEIGHTS); one at a time, as the set-up's compile
            # lane runs them.
            add(f"setup {part}", [str(repo / "scripts" / "setup"), part], cwd=str(repo),
                group="setup")
            for job in needers:
                job.setdefault("after", []).append(f"setup {part}")

    json.dump({"jobs": jobs}, sys.stdout, indent=1)
    print()


def deployed(script, binaries, add):
    """The operator deployed on a node (scripts/test.d/60-deployed.sh), a job per installer
    and one for `dev up --deployed`, all from one image archive that a job of its own writes:
    each is a cluster of its own, so the installers that need no late set-up start at once, and
    every one of them is a job the budget measures."""
    work = Path(os.environ.get("BANLIEUE_TEST_RUN_DIR") or tempfile.mkdtemp()) / "deployed-image"
    image = "test.d/60-deployed: image"
    add(image, ["bash", str(script), "image", str(work)], cwd=str(script.parents[2]))
    env = {"BANLIEUE_DEPLOYED_IMAGE_DIR": str(work)}
    if "banlieue::deployed" in binaries:
        env["BANLIEUE_DEPLOYED_TEST"] = binaries["banlieue::deployed"]["argv"][0]
    # Each boots a guest under TCG on a node of its own, and mostly waits on it and on pods:
    # weight 2 (WEIGHTS), so never beside a job of weight 3; one node at a time.
    node = dict(weight=2, group="node", cwd=str(script.parents[2]))
    for installer in ["bootstrap", "kustomize", "helm"]:
        add(f"test.d/60-deployed: {installer}", ["bash", str(script), "install", installer],
            env=env, after=[image], **node)
    add("test.d/60-deployed: dev up --deployed", ["bash", str(script), "dev-up"], env=env,
        after=[image], **node)
    # The operator deployed on a node of the oldest release too, installed and upgraded by
    # bootstrap (which leaves out the claim-protection policy there).
    add(f"test.d/60-deployed: bootstrap (Kubernetes {oldest_version()})",
        ["bash", str(script), "install", "bootstrap"],
        env={**env, "BANLIEUE_CONTROL_PLANE_BIN": str(oldest_bin_dir())}, after=[image], **node)


def oldest_bin_dir():
    cache = os.environ.get("BANLIEUE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "banlieue")
    return Path(cache) / "control-plane" / "bin-oldest"


def oldest_version():
    """The oldest release's pin in scripts/control-plane, for the jobs' names."""
    script = (Path(__file__).resolve().parents[1] / "control-plane").read_text()
    found = re.search(r"KUBERNETES_OLDEST_VERSION:-(v[0-9.]+)", script)
    return found.group(1) if found else "oldest"


def rerun(name, as_name, env, binaries, add, extra_args=()):
    if name not in binaries:
        sys.exit(f"test plan: no test binary {name} in cargo's build")
    spec = json.loads(json.dumps(binaries[name]))
    spec["env"].update(env)
    spec["argv"] += list(extra_args)
    add(as_name, **spec)


if __name__ == "__main__":
    main()

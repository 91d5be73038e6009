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
from pathlib import Path

# Test binaries that boot guests under TCG: each keeps both cores busy while it does.
BOOTS_GUESTS = {
    "banlieue::guests",
    # The Secure Boot test boots the test guest beside the binary's libvirtd restart tests.
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
    "banlieue-controller::side_by_side",
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
        "helm": lambda name: name in ("banlieue::helm", "test.d/60-deployed"),
        "oldest-kubernetes": lambda name: name.endswith(oldest),
        "agent-sandbox": lambda name: name in ("banlieue-testenv::agent_sandbox",
                                               "banlieue-controller::side_by_side"),
    }


# Durations on a fresh 2-core machine (docs/testing.md), for the order of a first run; later
# runs order by the timings the last run wrote.
FIRST_ESTIMATES = {
    "banlieue::guests": 549,
    "banlieue-dev::dev": 88,
    "banlieue-testenv::guest": 120,
    "test.d/50-image": 45,
    "test.d/60-deployed": 275,
    "test.d/60-deployed (Kubernetes v1.34.4)": 200,
    "clippy": 147,
    "setup helm": 225,
    "setup oldest-kubernetes": 600,
    "setup agent-sandbox": 180,
}


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
        jobs.append({"name": name, "argv": argv, **spec})

    # cargo takes the build directory's lock: jobs that call cargo wait in one queue rather than
    # hold the cores' slots while they block.
    add("clippy",
        ["cargo", "clippy", "--workspace", "--all-targets", "--locked", "--", "-D", "warnings"],
        cwd=str(repo), weight=2, group="cargo")
    add("doc tests", ["cargo", "test", "--workspace", "--locked", "--doc"],
        cwd=str(repo), weight=2, group="cargo", env={"INSTA_UPDATE": "no"})

    binaries = dict(test_binaries(sys.stdin))
    for name, spec in sorted(binaries.items()):
        if quick and (name in BOOTS_GUESTS or name in RUNS_A_NODE):
            continue
        if name in BOOTS_GUESTS:
            spec["weight"] = 2
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
            "10-package": dict(weight=2, group="cargo"),
            "30-bootstrap-libvirt-tls": dict(),
            "40-docs": dict(group="cargo"),
            # `scripts/control-plane start` builds the local-cluster binary (a check after the
            # test build) before it runs it.
            "42-local-cluster": dict(group="cargo"),
            "45-claim-authorization-guide": dict(group="cargo"),
            # Packages the product binary scripts/test built (cargo only for `cargo tree`).
            "50-image": dict(group="cargo"),
            # The image on the node, and `dev up --deployed` booting a guest.
            "60-deployed": dict(weight=2, group="node"),
        }
        for script in sorted((repo / "scripts" / "test.d").glob("*.sh")):
            part = script.stem
            spec = parts.get(part, {})
            env = {}
            if part == "60-deployed" and "banlieue::deployed" in binaries:
                env["BANLIEUE_DEPLOYED_TEST"] = binaries["banlieue::deployed"]["argv"][0]
            add(f"test.d/{part}", ["bash", str(script)], cwd=str(repo), env=env, **spec)
            if part == "60-deployed":
                # The operator deployed on a node of the oldest release too, installed and
                # upgraded by bootstrap (which leaves out the claim-protection policy there).
                add(f"test.d/{part} (Kubernetes {oldest_version()})", ["bash", str(script)],
                    cwd=str(repo), env={**env, **oldest, "BANLIEUE_DEPLOYED_INSTALLERS": "bootstrap",
                                        "BANLIEUE_DEPLOYED_DEV_UP": "0"}, **spec)

    if not os.environ.get("SKIP_SETUP"):
        for part, needs in late_setup().items():
            needers = [job for job in jobs if needs(job["name"])]
            if not needers:
                continue
            # Go builds keep both cores busy; one at a time, as the set-up's compile lane runs
            # them.
            add(f"setup {part}", [str(repo / "scripts" / "setup"), part], cwd=str(repo),
                weight=2, group="setup")
            for job in needers:
                job.setdefault("after", []).append(f"setup {part}")

    json.dump({"jobs": jobs}, sys.stdout, indent=1)
    print()


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

#!/usr/bin/env python3
"""Runs the test suite's jobs side by side, as the machine's cores allow, and times each one.

A job is a test binary that `cargo test --no-run` already built (run as `cargo test` runs it:
from its package's directory, with its package's CARGO_* variables), a rerun of one of those
binaries with other settings, or a command (clippy, the doc tests, a scripts/test.d part).
Nothing here compiles: every binary is built once, before, by one cargo invocation.

Why a runner of our own rather than `cargo test`: cargo runs test binaries one after another,
and most of them spend their time waiting on a real peer (a control plane starting, a guest
booting under TCG), not on the cores. Why not cargo-nextest: it would be one more tool to
compile on every fresh machine, and the heavy jobs here are not only test binaries.

Scheduling: every job has a weight (the slots it takes; scripts/lib/test-plan.py, WEIGHTS, says
what a slot is) and at most `--jobs` weight runs at once; a job in an exclusive group never
runs beside another of its group (two kubelet nodes share paths outside their state
directories); a job waits for the jobs it comes `after`. Jobs
start longest first, by the durations of the last run on this machine when there is one.

Reads the plan (JSON: {"jobs": [...]}) from --plan; writes one log per job and a timings table
(TSV) to --out, and prints a line per finished job and a summary sorted by duration. Exits 1
if any job failed, after every job has run (no fail-fast: one run shows every failure).
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from test_budget import Span, critical_path, over_ceiling

RESULT = re.compile(
    r"^test result: (?:ok|FAILED)\. (\d+) passed; (\d+) failed; (\d+) ignored", re.M
)
TAIL_LINES = 60


class Job:
    def __init__(self, spec):
        self.name = spec["name"]
        self.argv = spec["argv"]
        self.cwd = spec.get("cwd")
        self.env = spec.get("env", {})
        self.weight = spec.get("weight", 1)
        self.group = spec.get("group")
        self.after = set(spec.get("after", []))
        self.estimate = float(spec.get("estimate", 0))
        # The longest this job may take (scripts/lib/test-plan.py, CEILINGS); 0: no ceiling.
        self.ceiling = float(spec.get("ceiling", 0))
        self.priority = 0.0
        self.process = None
        self.started = None
        self.seconds = None
        self.status = "pending"
        self.counts = (0, 0, 0)
        self.log = None


def load_estimates(path):
    """Durations from an earlier timings table, by job name."""
    estimates = {}
    try:
        with open(path) as table:
            next(table, None)
            for line in table:
                fields = line.rstrip("\n").split("\t")
                if len(fields) >= 3:
                    try:
                        estimates[fields[0]] = float(fields[2])
                    except ValueError:
                        pass
    except OSError:
        pass
    return estimates


def read_counts(log):
    passed = failed = ignored = 0
    try:
        text = Path(log).read_text(errors="replace")
    except OSError:
        return (0, 0, 0)
    for match in RESULT.finditer(text):
        passed += int(match[1])
        failed += int(match[2])
        ignored += int(match[3])
    return (passed, failed, ignored)


def tail(log, lines=TAIL_LINES):
    try:
        text = Path(log).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join("    " + line for line in text[-lines:])


def human(seconds):
    if seconds < 60:
        return f"{seconds:.1f} s"
    return f"{int(seconds // 60)} min {seconds % 60:04.1f} s"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--plan", required=True)
    parser.add_argument("--out", required=True, help="directory for the logs and timings.tsv")
    parser.add_argument("--jobs", type=int, default=4, help="weight that may run at once")
    parser.add_argument("--estimates", help="an earlier timings.tsv, for longest-first order")
    parser.add_argument("--only", help="run only the jobs whose name contains this")
    args = parser.parse_args()

    with open(args.plan) as plan:
        jobs = [Job(spec) for spec in json.load(plan)["jobs"]]
    if args.only:
        jobs = [job for job in jobs if args.only in job.name]
        names = {job.name for job in jobs}
        for job in jobs:
            job.after &= names
    names = {job.name for job in jobs}
    for job in jobs:
        unknown = job.after - names
        if unknown:
            sys.exit(f"test runner: {job.name} comes after unknown jobs {sorted(unknown)}")
    estimates = load_estimates(args.estimates) if args.estimates else {}
    for job in jobs:
        job.estimate = estimates.get(job.name, job.estimate)
    # A job's priority is the longest chain of estimates it starts: a long build that a long
    # test waits for goes first.
    followers = {job.name: [other for other in jobs if job.name in other.after] for job in jobs}

    def chain(job, seen=()):
        if job.name in seen:
            sys.exit(f"test runner: {job.name} comes after itself")
        return job.estimate + max(
            (chain(other, seen + (job.name,)) for other in followers[job.name]), default=0.0
        )

    for job in jobs:
        job.priority = chain(job)
    out = Path(args.out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    capacity = max(args.jobs, max((job.weight for job in jobs), default=1))

    lock = threading.Condition()
    running = []
    begun = time.monotonic()

    def runnable(job):
        if job.status != "pending":
            return False
        before = [other for other in jobs if other.name in job.after]
        if any(other.status in ("pending", "running") for other in before):
            return False
        failed = [other.name for other in before if other.status != "ok"]
        if failed:
            # A job that comes after a failed one has nothing to stand on: it does not run.
            job.status = "SKIPPED"
            job.seconds = 0.0
            print(f"test: not run {job.name}: it comes after {', '.join(failed)}", flush=True)
            return False
        if job.group and any(other.group == job.group for other in running):
            return False
        return sum(other.weight for other in running) + job.weight <= capacity

    def watch(job):
        code = job.process.wait()
        with lock:
            job.seconds = time.monotonic() - job.started
            job.counts = read_counts(job.log)
            job.status = "ok" if code == 0 else "FAILED"
            running.remove(job)
            passed, failed, ignored = job.counts
            counted = f", {passed} passed" if passed or failed else ""
            counted += f", {failed} failed" if failed else ""
            counted += f", {ignored} ignored" if ignored else ""
            print(f"test: {job.status:<6} {job.name} ({human(job.seconds)}{counted})", flush=True)
            if code != 0:
                print(f"test: {job.name} exited {code}; end of {job.log}:", flush=True)
                print(tail(job.log), flush=True)
            lock.notify_all()

    def start(job):
        job.log = out / "logs" / (re.sub(r"[^A-Za-z0-9_.-]+", "_", job.name) + ".log")
        env = dict(os.environ)
        env.update(job.env)
        with open(job.log, "w") as log:
            log.write(f"$ {' '.join(job.argv)}\n")
            log.flush()
            job.process = subprocess.Popen(
                job.argv,
                cwd=job.cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        job.started = time.monotonic()
        job.status = "running"
        running.append(job)
        print(f"test: start  {job.name} (log: {job.log})", flush=True)
        threading.Thread(target=watch, args=(job,), daemon=True).start()

    def stop_everything(signum, _frame):
        # The runner started every job in a session of its own: stop those, by their PIDs.
        for job in list(running):
            try:
                os.killpg(job.process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        sys.exit(128 + signum)

    signal.signal(signal.SIGINT, stop_everything)
    signal.signal(signal.SIGTERM, stop_everything)

    # Longest chain first; among unknown durations, heavier jobs first.
    order = sorted(jobs, key=lambda job: (-job.priority, -job.weight, job.name))
    with lock:
        while True:
            for job in order:
                if runnable(job):
                    start(job)
            if all(job.status not in ("pending", "running") for job in jobs):
                break
            # A timeout too: skipping one job can make another skippable with nothing running.
            lock.wait(timeout=2)
    wall = time.monotonic() - begun

    table = out / "timings.tsv"
    with open(table, "w") as timings:
        # `start` is seconds after the runner began: which jobs shared the cores with which.
        timings.write("job\tstatus\tseconds\tweight\tpassed\tfailed\tignored\tstart\n")
        for job in sorted(jobs, key=lambda job: -(job.seconds or 0)):
            passed, failed, ignored = job.counts
            start = f"{job.started - begun:.1f}" if job.started is not None else ""
            timings.write(
                f"{job.name}\t{job.status}\t{job.seconds or 0:.1f}\t{job.weight}"
                f"\t{passed}\t{failed}\t{ignored}\t{start}\n"
            )
    busy = sum(job.seconds or 0 for job in jobs)
    passed = sum(job.counts[0] for job in jobs)
    failed = [job for job in jobs if job.status != "ok"]
    print(f"test: {len(jobs)} jobs in {human(wall)} ({human(busy)} one after another), "
          f"{passed} tests passed; timings: {table}", flush=True)
    spans = [span_of(job, begun) for job in jobs if job.started is not None]
    write_critical_path(critical_path(spans), out / "critical-path.tsv")
    over = over_ceiling(spans, {job.name: job.ceiling for job in jobs})
    for span, ceiling in over:
        print(f"test: OVER: {span.name} took {human(span.seconds)}, over its ceiling of "
              f"{human(ceiling)} (scripts/lib/test-plan.py, CEILINGS): make it faster or split it",
              flush=True)
    for job in failed:
        print(f"test: {job.status}: {job.name} (log: {job.log})", flush=True)
    # Printed again by scripts/test after its timing table, as the last lines of the run: a CI
    # system that keeps only the end of the output still shows why a job failed.
    with open(out / "failures.txt", "w") as failures:
        for job in failed:
            if job.log is not None:
                failures.write(f"test: {job.status}: {job.name}, end of {job.log}:\n")
                failures.write(tail(job.log) + "\n")
        for span, ceiling in over:
            failures.write(f"test: OVER: {span.name} took {span.seconds:.0f} s, over its ceiling "
                           f"of {ceiling:.0f} s (scripts/lib/test-plan.py, CEILINGS)\n")
    return 1 if failed or over else 0


def span_of(job, begun):
    start = job.started - begun
    return Span(job.name, start, start + (job.seconds or 0), job.after)


def write_critical_path(chain, path):
    """The chain as a table (job, start, seconds), which scripts/test prints after its own
    steps."""
    with open(path, "w") as table:
        table.write("job\tstart\tseconds\n")
        for span in chain:
            table.write(f"{span.name}\t{span.start:.1f}\t{span.seconds:.1f}\n")


if __name__ == "__main__":
    sys.exit(main())

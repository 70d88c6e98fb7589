"""bench/role_profile.py: where does each broker role spend its time while another bench runs?

Runs a bench script (`--run "hop.py --inflight 64"`, from bench/) as a child, waits `--delay`
seconds for the appliance it starts, then samples the supervisor and every role it forked with
py-spy (`record --subprocesses --nonblocking --format raw`, `--rate` samples a second, for
`--secs`) while the bench goes on. Each role is named by its process name (runtime.py sets it:
`codec.0`, `send.0`). For each role the line gives its share of all samples and the frames that
hold most of them, each frame being the innermost one in mqbox/ of a sample (so time in numpy,
the standard library or a system call counts against the mqbox line that called it).

py-spy leaves out samples of a process it finds sleeping (its default), but one that is
runnable and waiting for a CPU counts: a role woken from epoll shows at its Sleeper.wait line
until it runs, and a role whose doorbell write woke another and lost the CPU to it shows at
Doorbell.ring_nowait. On a loaded box those two lines are mostly time spent queueing for a core;
on a quiet one they are the wake-ups' own cost. The bench's
own JSON line comes back whole under `run`, so the figures and the profile belong to one run.
Sampling costs the roles a little (a `process_vm_readv` per sample); compare profiles with each
other, and take the bench's figures from runs without it.

Reported: `roles` (role -> samples, share, top frames with their share of that role),
`samples`, `run`. `msgs` is the number of samples; `checksum` covers py-spy's raw output.
Needs py-spy (the dev extra) and the right to trace the roles (root, or ptrace_scope 0).

Usage: python bench/role_profile.py --run "SCRIPT ARGS" [--secs S] [--delay S] [--rate HZ]
                               [--top N] [--smoke]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from _common import REPO_ROOT, checksum, emit, log  # bench/ is sys.path[0]

BENCH = "role_profile"
SUPERVISOR_MARK = "mqbox.server.supervisor"
APPLIANCE_WAIT_SECS = 120.0
RUN_TIMEOUT_SECS = 1800.0
_PROCESS_FRAME = re.compile(r"^process (\d+):")


def _py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(found).exists():
        raise SystemExit(
            "bench/role_profile.py: py-spy not found (pip install py-spy; the dev extra)"
        )
    return found


def _find_supervisor(
    child: subprocess.Popen[bytes], scratch: str, wait_secs: float
) -> psutil.Process:
    """The bench's supervisor, once it has forked its roles: its home is under `scratch`, the
    bench's TMPDIR (a started appliance leaves the bench's process tree)."""
    deadline = time.monotonic() + wait_secs
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise SystemExit(
                f"bench/role_profile.py: the bench ended (exit {child.returncode}) first"
            )
        for process in psutil.process_iter():
            try:
                command = " ".join(process.cmdline())
                if SUPERVISOR_MARK in command and scratch in command and process.children():
                    return process
            except psutil.Error:
                continue
        time.sleep(0.2)
    raise SystemExit("bench/role_profile.py: no appliance appeared under the bench")


def _role_names(supervisor: psutil.Process) -> dict[int, str]:
    names = {supervisor.pid: "supervisor"}
    for process in supervisor.children(recursive=True):
        try:
            names[process.pid] = process.name()
        except psutil.Error:
            continue
    return names


def summarise(raw_text: str, names: dict[int, str], top: int) -> dict[str, Any]:
    """Samples per role and each role's heaviest innermost mqbox frames, from py-spy's raw
    (collapsed) output: one line per stack, `frame;frame;... count`, the process frames first."""
    per_role: collections.Counter[str] = collections.Counter()
    frames_by_role: dict[str, collections.Counter[str]] = collections.defaultdict(
        collections.Counter
    )
    for line in raw_text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        pids = [int(m.group(1)) for f in frames if (m := _PROCESS_FRAME.match(f))]
        role = names.get(pids[-1], str(pids[-1])) if pids else "?"
        own = [f for f in frames if "mqbox/" in f and not _PROCESS_FRAME.match(f)]
        per_role[role] += count
        frames_by_role[role][own[-1] if own else "(outside mqbox)"] += count
    total = sum(per_role.values())
    roles = {}
    for role, count in per_role.most_common():
        roles[role] = {
            "samples": count,
            "share": round(count / total, 4),
            "top": [
                [frame, round(frame_count / count, 4)]
                for frame, frame_count in frames_by_role[role].most_common(top)
            ],
        }
    return {"samples": total, "roles": roles}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", help='the bench to profile, from bench/: "hop.py --inflight 64"')
    parser.add_argument("--secs", type=float, default=10.0, help="how long to sample")
    parser.add_argument(
        "--delay", type=float, default=3.0, help="seconds after the appliance is up"
    )
    parser.add_argument("--rate", type=int, default=200, help="samples a second per process")
    parser.add_argument("--top", type=int, default=8, help="frames kept per role")
    parser.add_argument("--smoke", action="store_true", help="tiny parameters")
    args = parser.parse_args()
    if args.smoke:
        args.run = args.run or "hop.py --inflight 8 --count 8000 --repeat 1"
        args.secs, args.delay = 1.0, 0.5
    if not args.run:
        parser.error("--run is required")
    command = shlex.split(args.run)
    script = REPO_ROOT / "bench" / command[0]
    with tempfile.TemporaryDirectory(prefix="mqbox-profile-") as scratch:
        child = subprocess.Popen(
            [sys.executable, str(script), *command[1:]],
            stdout=subprocess.PIPE,
            cwd=REPO_ROOT,
            env=dict(os.environ, TMPDIR=scratch),
        )
        try:
            supervisor = _find_supervisor(child, scratch, APPLIANCE_WAIT_SECS)
            time.sleep(args.delay)
            names = _role_names(supervisor)
            log(f"profile: {len(names)} processes under supervisor {supervisor.pid}")
            raw_path = Path(scratch) / "profile.raw"
            started = time.monotonic()
            subprocess.run(
                [
                    _py_spy(),
                    "record",
                    "--pid",
                    str(supervisor.pid),
                    "--subprocesses",
                    "--nonblocking",
                    "--format",
                    "raw",
                    "--rate",
                    str(args.rate),
                    "--duration",
                    str(max(1, round(args.secs))),
                    "--output",
                    str(raw_path),
                ],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            secs = time.monotonic() - started
            raw = raw_path.read_bytes()
            profile = summarise(raw.decode(), names, args.top)
            stdout, _ = child.communicate(timeout=RUN_TIMEOUT_SECS)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
    lines = stdout.decode().strip().splitlines()
    run = json.loads(lines[-1]) if lines else None
    emit(
        BENCH,
        {"run": args.run, "secs": args.secs, "delay": args.delay, "rate": args.rate},
        profile["samples"],
        secs,
        0,
        checksum=checksum(raw),
        roles=profile["roles"],
        samples=profile["samples"],
        run=run,
    )


if __name__ == "__main__":
    main()

"""Shared by every bench script: the one JSON line, host facts, percentiles, checksums, and the
parent-death signal of every server a bench starts.

Each script answers one question and prints exactly one JSON line on stdout (docs/style.md
section 7); everything else goes to stderr. The keys match the peer-broker benchmarks so figures fit
one table.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numba
import numpy as np

from mqbox.server import runtime

REPO_ROOT = Path(__file__).resolve().parents[1]


def host() -> dict[str, Any]:
    """cpus, cpu model, kernel, python and numba versions of this machine."""
    model = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "numba": numba.__version__,
    }


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages (`uptime`): a figure taken on a busy box shows it."""
    return [round(value, 2) for value in os.getloadavg()]


def git_sha() -> str:
    try:
        result = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=False,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return result.stdout.strip() or "unknown"


def percentiles_us(samples_ns: Sequence[int] | np.ndarray) -> dict[str, float | None]:
    """p50/p99/p999 in microseconds of latency samples given in nanoseconds."""
    if len(samples_ns) == 0:
        return {"p50_us": None, "p99_us": None, "p999_us": None}
    values = np.asarray(samples_ns, dtype=np.float64) / 1000.0
    p50, p99, p999 = np.percentile(values, [50, 99, 99.9])
    return {
        "p50_us": round(float(p50), 2),
        "p99_us": round(float(p99), 2),
        "p999_us": round(float(p999), 2),
    }


def checksum(*parts: bytes | memoryview | np.ndarray) -> str:
    """A short hash over the data actually processed, so a speed-up that changes it shows."""
    digest = hashlib.blake2b(digest_size=8)
    for part in parts:
        digest.update(part.tobytes() if isinstance(part, np.ndarray) else bytes(part))
    return digest.hexdigest()


def emit(
    bench: str,
    params: dict[str, Any],
    msgs: int,
    secs: float,
    size_bytes: int,
    **extra: Any,
) -> dict[str, Any]:
    """Print the one JSON line: rates from msgs, secs and size_bytes, then `extra` keys, then the
    load average at the end of the run (unless `extra` has one), the host and the commit."""
    line: dict[str, Any] = {
        "bench": bench,
        "params": params,
        "msgs": msgs,
        "secs": round(secs, 6),
        "msgs_per_s": round(msgs / secs, 1) if secs > 0 else None,
        "MB_per_s": round(msgs * size_bytes / secs / 1e6, 1) if secs > 0 else None,
        "p50_us": None,
        "p99_us": None,
        "p999_us": None,
        "jit_warmup_secs": None,
        "checksum": None,
    }
    line.update(extra)
    line.setdefault("load_avg", load_average())
    line["host"] = host()
    line["git_sha"] = git_sha()
    print(json.dumps(line), flush=True)
    return line


def log(message: str) -> None:
    """Chatter for humans: stderr only."""
    print(message, file=sys.stderr, flush=True)


def die_with_this_process(signal_number: int) -> Callable[[], None]:
    """A preexec_fn that has Linux send `signal_number` to the child once this process (the
    thread starting it) is gone, so a bench killed outside pytest leaves no server behind: an
    appliance's supervisor gets SIGTERM (its orderly stop: roles, name server, shared memory;
    the temporary home stays), a peer broker SIGKILL. redis-server also needs it under pytest:
    it overwrites its environment with its process title, so the tests' session reaper
    (tests/support/reaper.py), which finds processes by a mark there, cannot see it."""
    parent_pid = os.getpid()

    def in_child() -> None:
        runtime.set_parent_death_signal(signal_number)
        if os.getppid() != parent_pid:  # gone before prctl took effect: no signal would come
            os._exit(1)

    return in_child

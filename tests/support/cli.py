"""The `mqbox` console script as the tests run it: cwd = the checkout, PYTHONPATH = this tree
(so the supervisors and name servers it spawns import this worktree's code, and the appliance
run in-process reaches tests/support), output captured, a bounded wait."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Final

REPO_ROOT: Final = Path(__file__).resolve().parents[2]


def mqbox_command() -> list[str]:
    script = Path(sys.executable).with_name("mqbox")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from mqbox.admin.cli import main; main()"]


def environment() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH", "")
    return {
        **os.environ,
        "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{path}" if path else str(REPO_ROOT),
    }


def run_mqbox(*arguments: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """`mqbox ARGUMENTS`, its output captured as text; TimeoutExpired after `timeout_s`."""
    return subprocess.run(
        [*mqbox_command(), *arguments],
        cwd=REPO_ROOT,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def foreground_mqbox(*arguments: str) -> subprocess.Popen[str]:
    """`mqbox ARGUMENTS` running on, in a process group of its own as a terminal would give it
    (os.killpg(pid, SIGINT) is a Ctrl-C), its stdout and stderr as text pipes."""
    return subprocess.Popen(
        [*mqbox_command(), *arguments],
        cwd=REPO_ROOT,
        env=environment(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )

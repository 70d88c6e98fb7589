"""Goal: a bench killed outside pytest leaves no appliance behind.

Method: a child Python process opens bench/_load.py's `appliance` (the starter most bench scripts
use; hop.py and ha.py pass the same `die_with_this_process` to `launch.supervised`), prints its
supervisor's PID and the roles' PIDs, and sleeps. The test SIGKILLs that child by PID, as a
terminal's kill would, and then every process of the appliance must be gone within the
supervisor's orderly stop time, sent by the parent-death signal, not by this session's reaper
(which would only act at the session's end). Without the signal the supervisor, in a session of
its own, outlives the bench: this test then fails on its deadline. The bench's temporary home is
left by the kill (a documented cost of killing a bench); the test removes it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Final

import psutil

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
START_TIMEOUT_S: Final = 180.0  # a cold kernel cache compiles for about a minute
GONE_TIMEOUT_S: Final = 30.0

CHILD: Final = """
import json, sys, time
sys.path.insert(0, "bench")
from _load import appliance
with appliance("cleanup", None) as app:
    print(json.dumps({"pids": app.pids, "home": str(app.home)}), flush=True)
    time.sleep(600)
"""


def test_a_killed_bench_takes_its_appliance_with_it() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    family: list[psutil.Process] = []
    home: Path | None = None
    try:
        assert child.stdout is not None
        started = time.monotonic()
        line = child.stdout.readline()
        assert line, f"the bench child exited ({child.poll()}) before its appliance was up"
        assert time.monotonic() - started < START_TIMEOUT_S
        ready = json.loads(line)
        pids = [int(pid) for pid in ready["pids"]]
        home = Path(ready["home"])
        assert len(pids) > 5, pids  # the supervisor and its roles
        supervisor = psutil.Process(pids[0])
        family = [supervisor, *supervisor.children(recursive=True)]  # the name server too
        assert {member.pid for member in family} >= set(pids)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        _gone, alive = psutil.wait_procs(family, timeout=GONE_TIMEOUT_S)
        assert not alive, f"still running {GONE_TIMEOUT_S} s after the bench died: {alive}"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        if child.stdout is not None:
            child.stdout.close()
        for member in family:  # psutil checks the start time: a reused PID is left alone
            with contextlib.suppress(psutil.Error):
                member.kill()
        psutil.wait_procs(family, timeout=10)
        if home is not None:  # the killed bench could not remove its temporary home
            shutil.rmtree(home, ignore_errors=True)

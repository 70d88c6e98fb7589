"""A stand-in for a pytest process, for tests/integration/test_session_reaper.py: it runs the
session's reaper (tests/support/reaper.py) as conftest.py does, starts servers the way the tests
and benches do, prints one JSON line naming them, and waits to be killed.

`python -m tests.support.reaped_child KIND HOME`, KIND one of:
- `appliance`: running_appliance (tests/support/appliance.py): a supervisor in a session of
  its own, its roles and its name server;
- `daemon`: `mqbox start --daemon` through the console script, which detaches the supervisor and
  exits, so nothing of this process is its parent;
- `peers`: bench/_peers.py's nats-server and redis-server, each in a session of its own.

The line: {"pids": [...], "instances": [...]} (the mqbox instances whose shared memory exists).
Never: stopping what it started; that is the reaper's job once this process is killed.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from mqbox.server.home import read_state, recorded_processes
from tests.support.appliance import running_appliance
from tests.support.cli import REPO_ROOT, run_mqbox
from tests.support.reaper import session_reaper

sys.path.append(str(REPO_ROOT / "bench"))  # bench/ is not a package

from _peers import nats_server_path, redis_server_path, started

KINDS = ("appliance", "daemon", "peers")
DAEMON_START_TIMEOUT_S = 600.0


def start(kind: str, home: Path, stack: contextlib.ExitStack) -> dict[str, Any]:
    """Start `kind` in `home`; what the JSON line says of it."""
    if kind == "appliance":
        pids: list[int] = []
        appliance = stack.enter_context(running_appliance(home, pids))
        return {"pids": sorted(set(pids)), "instances": [appliance.instance]}
    if kind == "daemon":
        started_daemon = run_mqbox(
            *("start", "--daemon", "--home", str(home), "--broker-port", "0"),
            *("--namesrv-port", "0"),
            timeout_s=DAEMON_START_TIMEOUT_S,
        )
        assert started_daemon.returncode == 0, started_daemon.stderr
        state = read_state(home) or {}
        return {
            "pids": [pid for _, pid, _ in recorded_processes(state)],
            "instances": [state["instance"]],
        }
    assert kind == "peers", kind
    servers = []
    for system, path in (("nats", nats_server_path()), ("redis", redis_server_path())):
        assert path is not None, f"{system}-server is not installed (bin/test installs it)"
        servers.append(stack.enter_context(started(system, "async", path)))
    return {"pids": [server.pid for server in servers], "instances": []}


def main(argv: list[str]) -> int:
    kind, home = argv
    assert kind in KINDS, kind
    with session_reaper(), contextlib.ExitStack() as stack:
        sys.stdout.write(json.dumps(start(kind, Path(home), stack)) + "\n")
        sys.stdout.flush()
        while True:
            time.sleep(60)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

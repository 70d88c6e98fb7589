"""Fixtures shared by every test: xdist-safe names and ports, and no orphan children.

Everything here must work under `pytest -n auto`: names carry the xdist worker id and the pid,
ports come from the kernel (port 0), and every process a test starts is killed by its PID: by
the test's own fixtures, and in any case by the session's reaper (tests/support/reaper.py) when
the session ends or the pytest process running it dies.
"""

from __future__ import annotations

import contextlib
import faulthandler
import itertools
import os
import signal
import socket
from collections.abc import Iterator

import hypothesis
import psutil
import pytest

from tests.support.appliance import Appliance, module_appliance
from tests.support.reaper import session_reaper

# The first example of a kernel test measures JIT compilation, so deadlines would only flake.
hypothesis.settings.register_profile("mqbox", deadline=None, print_blob=True)
hypothesis.settings.load_profile("mqbox")

# --dist loadgroup keeps each xdist_group on one worker under pytest 9.2 too (the module says why).
pytest_plugins = ["tests.support.xdist_groups"]

_counter = itertools.count()


@pytest.fixture(scope="session", autouse=True)
def _session_reaper() -> Iterator[str]:
    """Mark every process the session's tests start, and kill what is left of them by PID at
    its end, or from a watchdog once this pytest process dies without an end (SIGKILL, a
    timeout, a crashed xdist worker). Autouse and session-wide, so it is set up before any
    other fixture starts a process and torn down after all of them."""
    with session_reaper() as mark:
        yield mark


def unique_name(kind: str) -> str:
    """A name unique across xdist workers, processes and calls: `<kind>-<worker>-<pid>-<n>`."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    return f"{kind}-{worker}-{os.getpid()}-{next(_counter)}"


@pytest.fixture
def shm_instance() -> str:
    """An instance name for shared-memory objects (`/mqbox.<instance>.<role>.<n>`)."""
    return unique_name("t")


@pytest.fixture
def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (prefer passing port 0 to servers)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture
def reap_pids() -> Iterator[list[int]]:
    """Append the PID of every process a test starts; they are SIGKILLed (with their children)."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            parent = psutil.Process(pid)
            family = [*parent.children(recursive=True), parent]
        except psutil.NoSuchProcess:
            continue
        for process in family:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGKILL)
        psutil.wait_procs(family, timeout=10)


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    """A running appliance shared by the tests of one module (integration and interop tests
    that need nothing special: each uses topics and groups of its own, from `unique_name`).
    Starting one costs seconds; a module may define its own `appliance`, which takes
    precedence, and a test that stops or restarts its broker starts its own with
    `running_appliance`. Every process it started is SIGKILLed by PID at the end
    (`module_appliance`)."""
    with module_appliance(tmp_path_factory.mktemp("appliance")) as running:
        yield running


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    """A `slow` tier test runs for many minutes by design: pytest's faulthandler_timeout (which
    catches a hung test in the default run) would fire in the middle of it, and its dump of every
    thread's stack, taken while those threads run, crashed the interpreter with SIGSEGV twice
    (Python 3.11). Slow tests therefore run without the watchdog; they bound themselves."""
    if item.get_closest_marker("slow") is not None:
        faulthandler.cancel_dump_traceback_later()

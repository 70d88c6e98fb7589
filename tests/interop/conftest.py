"""Fixtures of the interop tests: one real appliance per module.

Starting the appliance costs seconds and the C++ clients are slow to join, so the tests of a
module share one (each test uses topics and groups of its own, from `unique_name`). A test that
stops or restarts its broker starts its own with `cpp_client.running_appliance` instead.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

import psutil
import pytest

from tests.support.appliance import Appliance, running_appliance


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    """A running appliance for the module; every process it started is SIGKILLed by PID at the
    end (the function-scoped `reap_pids` cannot outlive one test)."""
    pids: list[int] = []
    try:
        with running_appliance(tmp_path_factory.mktemp("appliance"), pids) as running:
            yield running
    finally:
        for pid in pids:
            with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
                psutil.Process(pid).send_signal(signal.SIGKILL)

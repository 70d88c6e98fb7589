"""Fixtures of the integration tests: one real appliance per module, for modules that share one.

Starting the appliance costs seconds, so the tests of a module that need nothing special share
one (each uses topics and groups of its own, from `unique_name`); a module may still define its
own `appliance` fixture, which takes precedence, and a test that stops or restarts its broker
starts its own with `running_appliance`.
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

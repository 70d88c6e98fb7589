"""Waiting for a condition in a test: poll it, bounded, and say what never happened.

Owns: `wait_until`. Never: sleeps that guess how long something takes.
"""

from __future__ import annotations

import time
from collections.abc import Callable

POLL_INTERVAL_S = 0.02


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    """Poll `condition` until it holds; AssertionError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:g} s waiting for {what}"
        time.sleep(POLL_INTERVAL_S)

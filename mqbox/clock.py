"""The wall clock, read one way everywhere.

Owns: `wall_clock_ms`, milliseconds since the epoch as RocketMQ stamps stores, events and files.
Monotonic time (time.monotonic_ns) measures intervals; this is for stamps only. Code that must be
tested at chosen times takes a `clock_ms` callable defaulting to it. Never: anything else (a
leaf: imports nothing of mqbox).
"""

from __future__ import annotations

import time


def wall_clock_ms() -> int:
    """Wall-clock milliseconds since the epoch."""
    return time.time_ns() // 1_000_000

"""Scheduler: one daemon thread that runs a client's periodic and one-off tasks in time order.

Owns: the thread, a heap of (due time, sequence, task), and each task's counters. Never: the
tasks' meaning (instance.py and the consumers register them), and no task runs on another thread.
Tasks run one at a time, so they need no lock among themselves; they may block on the network
(each call has its own timeout), which delays the tasks behind them, never loses them.

Rules:

1. `schedule_every(period_ms)` runs a task first after `initial_delay_ms`, then `period_ms` after
   each run started (Java's scheduleAtFixedRate, without catching up on missed runs); `call_soon`
   and `call_later` run one once. Due times come from time.monotonic_ns(), so wall-clock steps
   move nothing.
2. A task raising an operating error (MqboxError) is logged and keeps its schedule: the next
   heartbeat retries what this one could not. Anything else is a bug: the thread records it and
   stops running tasks, and `shutdown()` raises it again in the caller (as registration.py does).
3. `shutdown(timeout_s)` stops taking tasks, lets a running one finish within the time, and
   returns whether the thread ended; it never waits longer. Tasks still queued are dropped.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from mqbox.errors import MqboxError

log = logging.getLogger("mqbox.client.scheduler")

Task = Callable[[], None]
_IDLE_WAIT_S: Final = 3600.0  # with nothing queued; any new task wakes the thread


@dataclass(frozen=True, slots=True)
class SchedulerStatistics:
    """What one scheduler ran: per task name, how many runs and how many operating errors."""

    name: str
    runs: dict[str, int]
    errors: dict[str, int]
    queued: int
    bug: str | None  # the exception that stopped the thread (rule 2), if one did


class Scheduler:
    """One thread running tasks at their due times (module docstring)."""

    def __init__(self, name: str) -> None:
        self.name: Final = name
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._heap: list[tuple[int, int, str, Task, int]] = []  # due_ns, seq, name, task, period
        self._sequence = itertools.count()
        self._stopping = False
        self._bug: BaseException | None = None
        self._runs: dict[str, int] = {}
        self._errors: dict[str, int] = {}
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._started = False

    def start(self) -> None:
        with self._lock:
            assert not self._started
            self._started = True
        self._thread.start()

    @property
    def on_thread(self) -> bool:
        """True when called from the scheduler's own thread."""
        return threading.current_thread() is self._thread

    def schedule_every(
        self, name: str, period_ms: int, task: Task, initial_delay_ms: int = 0
    ) -> None:
        """Run `task` after `initial_delay_ms`, then every `period_ms` (rule 1)."""
        assert period_ms > 0
        assert initial_delay_ms >= 0
        self._push(name, task, initial_delay_ms, period_ms)

    def call_soon(self, name: str, task: Task) -> None:
        """Run `task` once, as soon as the thread is free."""
        self._push(name, task, 0, 0)

    def call_later(self, name: str, delay_ms: int, task: Task) -> None:
        """Run `task` once, after `delay_ms`."""
        assert delay_ms >= 0
        self._push(name, task, delay_ms, 0)

    def cancel(self, name: str) -> int:
        """Drop every queued run of the tasks named `name` (rule 1); how many were dropped."""
        with self._lock:
            kept = [entry for entry in self._heap if entry[2] != name]
            dropped = len(self._heap) - len(kept)
            if dropped:
                heapq.heapify(kept)
                self._heap = kept
            return dropped

    def _push(self, name: str, task: Task, delay_ms: int, period_ms: int) -> None:
        due_ns = time.monotonic_ns() + delay_ms * 1_000_000
        with self._lock:
            if self._stopping:
                return
            sequence = next(self._sequence)
            heapq.heappush(self._heap, (due_ns, sequence, name, task, period_ms))
            if self._heap[0][1] == sequence:  # the new first task: the thread waits too long
                self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._lock:
                while True:
                    if self._stopping:
                        return
                    if self._heap:
                        wait_s = (self._heap[0][0] - time.monotonic_ns()) / 1e9
                        if wait_s <= 0:
                            due_ns, _, name, task, period_ms = heapq.heappop(self._heap)
                            break
                    else:
                        wait_s = _IDLE_WAIT_S
                    self._wake.wait(wait_s)
                if period_ms:
                    next_ns = max(due_ns + period_ms * 1_000_000, time.monotonic_ns())
                    heapq.heappush(
                        self._heap, (next_ns, next(self._sequence), name, task, period_ms)
                    )
            self._runs[name] = self._runs.get(name, 0) + 1
            try:
                task()
            except MqboxError as error:
                self._errors[name] = self._errors.get(name, 0) + 1
                log.warning("%s: task %s failed: %s", self.name, name, error)
            except BaseException as bug:
                log.exception("%s: task %s hit a bug; the scheduler stops", self.name, name)
                with self._lock:
                    self._bug = bug
                    self._stopping = True
                    self._heap.clear()
                return

    def shutdown(self, timeout_s: float) -> bool:
        """Rule 3: True when the thread ended within `timeout_s`. Raises the bug that stopped
        the thread, if one did."""
        with self._lock:
            self._stopping = True
            self._heap.clear()
            self._wake.notify_all()
        ended = True
        if self._started and not self.on_thread:
            self._thread.join(timeout_s)
            ended = not self._thread.is_alive()
        if self._bug is not None:
            raise self._bug
        return ended

    def statistics(self) -> SchedulerStatistics:
        with self._lock:
            return SchedulerStatistics(
                self.name,
                dict(self._runs),
                dict(self._errors),
                len(self._heap),
                None if self._bug is None else repr(self._bug),
            )

"""The client's scheduler thread: tasks in time order, periods, errors, a bounded shutdown.

Goal: scheduler.py's three rules: one-off and periodic tasks run on the scheduler's own thread in
due order, a periodic task runs again after its period; an operating error (MqboxError) is
counted and the task keeps its schedule, while any other exception stops the thread and is raised
again by shutdown(); shutdown() returns within its bound even when a task is still running.

Method: real threads and short real delays (tens of ms); every wait in the test is bounded.
"""

from __future__ import annotations

import threading
import time

import pytest

from mqbox.client.scheduler import Scheduler
from mqbox.errors import MqboxError

WAIT_S = 5.0


def test_tasks_run_in_due_order_on_the_scheduler_thread() -> None:
    scheduler = Scheduler("test-order")
    ran: list[str] = []
    threads: set[str] = set()
    done = threading.Event()

    def task(name: str) -> None:
        ran.append(name)
        threads.add(threading.current_thread().name)
        if len(ran) == 3:
            done.set()

    scheduler.call_later("late", 60, lambda: task("late"))
    scheduler.call_later("middle", 30, lambda: task("middle"))
    scheduler.call_soon("soon", lambda: task("soon"))
    scheduler.start()
    assert done.wait(WAIT_S)
    assert ran == ["soon", "middle", "late"]
    assert threads == {"test-order"}
    assert scheduler.shutdown(WAIT_S)


def test_a_periodic_task_runs_again_and_errors_keep_it_scheduled() -> None:
    scheduler = Scheduler("test-period")
    runs: list[float] = []
    done = threading.Event()

    def flaky() -> None:
        runs.append(time.monotonic())
        if len(runs) == 4:
            done.set()
        raise MqboxError("the broker is away")

    scheduled = time.monotonic()
    scheduler.schedule_every("flaky", 20, flaky)
    scheduler.start()
    assert done.wait(WAIT_S)
    assert scheduler.shutdown(WAIT_S)
    stats = scheduler.statistics()
    assert stats.runs["flaky"] >= 4
    assert stats.errors["flaky"] == stats.runs["flaky"]
    assert stats.bug is None
    # At a fixed rate: run n is due n periods after the first (at once), never earlier; a late
    # run makes the gap to the next one shorter, so only the sum is bounded.
    assert all(at - scheduled >= n * 0.020 - 0.0001 for n, at in enumerate(runs))


def test_a_bug_stops_the_thread_and_shutdown_raises_it() -> None:
    scheduler = Scheduler("test-bug")
    after = threading.Event()
    scheduler.call_soon("bug", lambda: [][1])  # IndexError: a bug
    scheduler.call_later("after", 50, after.set)
    scheduler.start()
    deadline = time.monotonic() + WAIT_S
    while scheduler.statistics().bug is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert not after.wait(0.2)
    with pytest.raises(IndexError):
        scheduler.shutdown(WAIT_S)


def test_shutdown_is_bounded_while_a_task_runs() -> None:
    scheduler = Scheduler("test-bounded")
    release = threading.Event()
    started = threading.Event()

    def stuck() -> None:
        started.set()
        release.wait(WAIT_S)

    scheduler.call_soon("stuck", stuck)
    scheduler.start()
    assert started.wait(WAIT_S)
    began = time.monotonic()
    assert not scheduler.shutdown(0.1)
    assert time.monotonic() - began < 1.0
    release.set()
    scheduler.call_soon("ignored", release.set)  # refused quietly after shutdown
    assert scheduler.statistics().queued == 0

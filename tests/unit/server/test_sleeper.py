"""Goal: a role's Sleeper never sleeps through a parcel (no lost wake-up, whether it spun first or
not), spins only while the roles on a core leave it one (SpinGate over the control block's
activity words), and adapts its two spin budgets separately.

Method: the ping-pong test runs two real processes (this file is also the child program, as in
tests/unit/ipc/test_ring_processes.py), each waiting in its own Sleeper on its own ring and
answering every parcel on the other: each side waits for the other's answer before it sends, so
one lost wake-up leaves both asleep and that wait runs into its timeout, which fails the test.
The gate and budget tests use a ControlBlock in this process and rings it reads itself.
"""

from __future__ import annotations

import random
import select
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from mqbox.ipc import names
from mqbox.ipc.ring import Ring
from mqbox.server import control_block
from mqbox.server.transport import Inbox, Sleeper, SpinGate

PING_COUNT = 10_000
WAIT_TIMEOUT_MS = 20_000  # a lost wake-up hangs for ever; a loaded box stalls for seconds
ROLE_IDS = ("reactor.0", "codec.0", "worker.0", "send.0")


@pytest.fixture
def rings(shm_instance: str) -> Iterator[tuple[Ring, Ring]]:
    ping = Ring.create(names.shm_name(shm_instance, "ping", 0), 1 << 16)
    pong = Ring.create(names.shm_name(shm_instance, "pong", 0), 1 << 16)
    yield ping, pong
    for ring in (ping, pong):
        ring.close()
        ring.unlink()


def answer_all(
    inbound: Ring, outbound: Ring, spin_ns_max: int, count: int, first: int | None
) -> int:
    """Wait in a Sleeper for each number on `inbound` and send it plus one on `outbound`
    (`first`: send that before the first wait); returns how many waits slept. A wait that
    outlasts WAIT_TIMEOUT_MS with nothing readable is a lost wake-up: AssertionError."""
    epoll = select.epoll()
    inboxes = [Inbox(inbound, "peer", marks=None)]
    sleeper = Sleeper(epoll, inboxes, spin_ns_max, gate=SpinGate(None, 0, 1))
    chooser = random.Random(spin_ns_max + count)
    if first is not None:
        assert outbound.try_write_nowait(0, first.to_bytes(8, "little"))
    expected = 0 if first is None else first + 1
    for _ in range(count):
        started_ns = time.monotonic_ns()
        while (parcel := inbound.read_nowait()) is None:
            sleeper.wait(WAIT_TIMEOUT_MS, awaiting=chooser.random() < 0.5)
            waited_ms = (time.monotonic_ns() - started_ns) / 1e6
            assert waited_ms < WAIT_TIMEOUT_MS, f"lost wake-up at {expected}"
        number = int.from_bytes(parcel[1], "little")
        assert number == expected
        if chooser.random() < 0.2:
            time.sleep(chooser.random() * 0.0002)  # let the other side's spin run out now and then
        assert outbound.try_write_nowait(0, (number + 1).to_bytes(8, "little"))
        expected = number + 2
    epoll.close()
    return sleeper.sleep_count


def child_answer(names_joined: str, spin_ns_max: int, count: int) -> None:
    ping_name, pong_name = names_joined.split(",")
    ping, pong = Ring.attach(ping_name), Ring.attach(pong_name)
    sys.stdout.write("attached\n")
    sys.stdout.flush()
    answer_all(ping, pong, spin_ns_max, count, None)
    ping.close()
    pong.close()


@pytest.mark.parametrize("spin_ns_max", [0, 30_000], ids=["sleep-always", "spin-then-sleep"])
def test_ping_pong_between_two_processes_loses_no_wake_up(
    rings: tuple[Ring, Ring], spin_ns_max: int, reap_pids: list[int]
) -> None:
    ping, pong = rings
    child = subprocess.Popen(
        [sys.executable, __file__, f"{ping.name},{pong.name}", str(spin_ns_max), str(PING_COUNT)],
        stdout=subprocess.PIPE,
        text=True,
    )
    reap_pids.append(child.pid)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "attached"
        sleep_count = answer_all(pong, ping, spin_ns_max, PING_COUNT, first=0)
        assert child.wait(timeout=30) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()
    assert pong.read_nowait() is None
    if spin_ns_max == 0:
        # Every wait found nothing readable at first and slept: the wake-ups were all real.
        assert sleep_count > PING_COUNT // 2


def test_the_gate_opens_while_the_roles_on_a_core_leave_it_one() -> None:
    control = control_block.ControlBlock.create(ROLE_IDS)
    gates = [SpinGate(*control.activity_words(role_id), 2) for role_id in ROLE_IDS]
    assert control.active_count() == 4  # every role is on a core from the start
    assert not gates[0].open()
    gates[2].active(False)
    gates[3].active(False)
    assert control.active_count() == 2
    assert gates[0].open()  # itself and one other on 2 cores
    gates[1].active(False)
    assert gates[0].open()


def test_a_dead_role_holds_no_core() -> None:
    control = control_block.ControlBlock.create(ROLE_IDS)
    control.role_started("codec.0", 4242)
    SpinGate(*control.activity_words("codec.0"), 2)  # its process says it is on a core
    assert control.active_count() == 1
    control.role_exited("codec.0")  # then it is killed while busy
    assert control.active_count() == 0


def sleeper_with_the_cores_taken(
    ping: Ring, spin_ns_max: int
) -> tuple[Sleeper, control_block.ControlBlock]:
    """A Sleeper on `ping` for the first of ROLE_IDS, on 2 cores, while the three others say
    they hold a core."""
    control = control_block.ControlBlock.create(ROLE_IDS)
    for role_id in ROLE_IDS[1:]:
        SpinGate(*control.activity_words(role_id), 2)
    gate = SpinGate(*control.activity_words(ROLE_IDS[0]), 2)
    inboxes = [Inbox(ping, "peer", marks=None)]
    return Sleeper(select.epoll(), inboxes, spin_ns_max, gate=gate), control


def test_a_sleeper_does_not_spin_while_the_cores_are_taken(rings: tuple[Ring, Ring]) -> None:
    ping, _pong = rings
    sleeper, control = sleeper_with_the_cores_taken(ping, 1_000_000)
    started = time.process_time_ns()
    sleeper.wait(30)
    statistics = sleeper.statistics()
    assert (statistics.spin_yield_count, statistics.spin_miss_count) == (1, 0)
    assert statistics.sleep_count == 1
    assert statistics.spin_budget_ns == 1_000_000  # giving way says nothing about the budget
    assert time.process_time_ns() - started < 10_000_000  # it slept rather than spun
    assert control.active_count() == 4  # back on its core after the sleep


def test_a_sleeper_awaiting_answers_spins_while_the_cores_are_taken(
    rings: tuple[Ring, Ring],
) -> None:
    ping, _pong = rings
    sleeper, _control = sleeper_with_the_cores_taken(ping, 2_000_000)
    sleeper.wait(30, awaiting=True)
    statistics = sleeper.statistics()
    assert (statistics.spin_yield_count, statistics.spin_miss_count) == (0, 1)
    assert statistics.awaiting_spin_budget_ns == 1_000_000  # the miss halved it
    assert statistics.spin_budget_ns == 2_000_000  # the other kind of wait is untouched
    sleeper.wait(30)
    assert sleeper.statistics().spin_yield_count == 1  # a wait for new work still gives way


def test_the_budget_for_answers_survives_idle_waits(rings: tuple[Ring, Ring]) -> None:
    ping, _pong = rings
    sleeper = Sleeper(
        select.epoll(), [Inbox(ping, "peer", marks=None)], 200_000, gate=SpinGate(None, 0, 1)
    )
    for _ in range(3):
        sleeper.wait(5)  # each spin misses, and the 5 ms sleep after it is too long to raise it
    statistics = sleeper.statistics()
    assert statistics.spin_miss_count == 3
    assert statistics.spin_budget_ns == 200_000 // 8
    assert statistics.awaiting_spin_budget_ns == 200_000
    assert ping.try_write_nowait(0, b"answer")
    assert sleeper.wait(5, awaiting=True) == []  # readable: back at once
    assert ping.read_nowait() is not None
    sleeper.wait(5, awaiting=True)
    assert sleeper.statistics().awaiting_spin_budget_ns == 100_000
    assert sleeper.statistics().spin_budget_ns == 200_000 // 8


if __name__ == "__main__":
    child_answer(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
    sys.exit(0)

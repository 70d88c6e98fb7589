"""Goal (issue 9, part 4): under load, SIGKILL of any single role and of the whole appliance loses
no acknowledged message: after every kill the broker comes back by itself (or, for the whole
appliance, by a restart on the same home), producers go on, and in the end every acknowledged
send is stored exactly once, in the order its producer sent it, and nothing is stored twice.

Method: the real appliance (tests/support/appliance.py) with its restart limits raised so the
kills themselves never exhaust them. Two producer threads send SEND_MESSAGE_V2 with mqbox's
blocking RemotingClient, round-robin over a 4-queue topic, each message carrying its producer
and a sequence number; a failed call is never retried with the same body, so "exactly once" is
exact. A puller thread reads the queues the whole time, so the pull path is under load too.
Each round waits for more acknowledged sends, then kills its victim: one role of run/state.json
(reactor, codec, worker, send, pull, admin, store writer, dispatcher, schedule, services), or
every process of the appliance, which the test then starts again on the same home (its ports
change; the threads follow). A round ends when state.json says every role is ready again.
Finally, once the dispatcher has caught up with the commit log (read_back.wait_dispatched_at),
every queue is pulled and the stored bodies are checked. The default run kills six times by a
fixed schedule (the dispatcher, a codec, the whole appliance, the store writer, a send processor,
a reactor); the `slow` tier kills MQBOX_CHAOS_KILLS times (100 by default) at random,
MQBOX_CHAOS_SEED choosing, and is run before a submission. Every process is killed by PID at the
end.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import psutil
import pytest

from mqbox.client.remoting import RemotingClient, RemotingError
from mqbox.message import decode_record
from mqbox.protocol.codes import RequestCode, ResponseCode
from mqbox.protocol.headers import SendMessageRequestHeader, UpdateAndCreateTopicRequestHeader
from mqbox.server.home import read_state
from tests.support.appliance import BROKER_CONF, Appliance, running_appliance
from tests.support.pull_requests import pull_everything_header
from tests.support.read_back import wait_dispatched_at

pytestmark = [pytest.mark.integration, pytest.mark.crash]

TOPIC: Final = "ChaosTopic"
QUEUE_COUNT: Final = 4
PRODUCER_COUNT: Final = 2
WHOLE_APPLIANCE_EVERY: Final = 5  # about one random kill in five takes every process
APPLIANCE: Final = "appliance"
ANY_ROLE: Final = "any role "
SENDS_PER_ROUND: Final = 40
ROUND_WAIT_S: Final = 120.0
CHAOS_CONF: Final = (
    BROKER_CONF
    + "flushIntervalCommitLog=100\n"
    + "mqboxRestartWindowMs=1000\n"  # kills come seconds apart: never count against the limits
    + "mqboxRoleRestartCountMax=1000\n"
    + "mqboxBrokerRestartCountMax=1000\n"
    + "mqboxRestartBackoffMs=10\n"
)


class Target:
    """The broker address the load threads use; it changes when the whole appliance restarts."""

    def __init__(self, address: str) -> None:
        self._lock = threading.Lock()
        self._address = address

    @property
    def address(self) -> str:
        with self._lock:
            return self._address

    @address.setter
    def address(self, address: str) -> None:
        with self._lock:
            self._address = address


class Producer(threading.Thread):
    """Sends `p<id>-<sequence>` bodies until stopped; `acknowledged` keeps those answered 0."""

    def __init__(self, producer_id: int, target: Target) -> None:
        super().__init__(name=f"producer-{producer_id}", daemon=True)
        self.producer_id = producer_id
        self.target = target
        self.acknowledged: list[str] = []
        self.failed_count = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        sequence = 0
        address = self.target.address
        client = RemotingClient(address, timeout_ms=3000)
        try:
            while not self.stopping.is_set():
                if self.target.address != address:
                    client.close()
                    address = self.target.address
                    client = RemotingClient(address, timeout_ms=3000)
                body = f"p{self.producer_id}-{sequence:08d}"
                queue_id = sequence % QUEUE_COUNT
                header = SendMessageRequestHeader("ChaosPG", TOPIC, "TBW102", 4, queue_id, 0, 1, 0)
                try:
                    response = client.invoke(
                        RequestCode.SEND_MESSAGE_V2, header.to_ext_v2(), body.encode()
                    )
                except RemotingError:
                    response = None
                if response is not None and response.code == ResponseCode.SUCCESS:
                    self.acknowledged.append(body)
                else:
                    self.failed_count += 1
                    time.sleep(0.05)
                sequence += 1
        finally:
            client.close()


class Puller(threading.Thread):
    """Pulls every queue over and over, so kills also land in the middle of pulls."""

    def __init__(self, target: Target) -> None:
        super().__init__(name="puller", daemon=True)
        self.target = target
        self.stopping = threading.Event()

    def run(self) -> None:
        next_indexes = [0] * QUEUE_COUNT
        address = ""
        client: RemotingClient | None = None
        while not self.stopping.is_set():
            if self.target.address != address or client is None:
                if client is not None:
                    client.close()
                address = self.target.address
                client = RemotingClient(address, timeout_ms=3000)
            for queue_id in range(QUEUE_COUNT):
                # No suspend flag: the puller wants answers, not long polls.
                header = pull_everything_header(TOPIC, next_indexes[queue_id], queue_id=queue_id)
                try:
                    response = client.invoke(RequestCode.PULL_MESSAGE, header.to_ext())
                except RemotingError:
                    time.sleep(0.05)
                    continue
                if response.code == ResponseCode.SUCCESS:
                    next_indexes[queue_id] = int(response.ext_fields["nextBeginOffset"])
        if client is not None:
            client.close()


def state_of(home: Path) -> dict[str, Any]:
    return read_state(home) or {"roles": [], "status": "down"}


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + ROUND_WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def all_ready(home: Path, dead_pid: int) -> bool:
    state = state_of(home)
    roles = state["roles"]
    return (
        state.get("status") == "running"
        and bool(roles)
        and all(role["state"] == "ready" and role["pid"] != dead_pid for role in roles)
    )


def acknowledged_count(producers: list[Producer]) -> int:
    return sum(len(producer.acknowledged) for producer in producers)


def wait_for_more_sends(producers: list[Producer], when: str) -> None:
    goal = acknowledged_count(producers) + SENDS_PER_ROUND
    wait_until(lambda: acknowledged_count(producers) >= goal, f"{SENDS_PER_ROUND} sends, {when}")


def kill_everything(appliance: Appliance) -> None:
    family = {appliance.process.pid, *appliance.role_pids}
    with contextlib.suppress(psutil.NoSuchProcess):
        family |= {child.pid for child in psutil.Process(appliance.process.pid).children(True)}
    for pid in family:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    appliance.process.wait(30)


def stored_bodies(address: str) -> dict[int, list[str]]:
    """The bodies of every queue of TOPIC, in queue order."""
    bodies: dict[int, list[str]] = {}
    with RemotingClient(address) as broker:
        for queue_id in range(QUEUE_COUNT):
            bodies[queue_id] = []
            queue_index = 0
            while True:
                header = pull_everything_header(TOPIC, queue_index, queue_id=queue_id)
                response = broker.invoke(RequestCode.PULL_MESSAGE, header.to_ext())
                if response.code != ResponseCode.SUCCESS:
                    assert response.code == ResponseCode.PULL_NOT_FOUND, response.remark
                    break
                position = 0
                while position < len(response.body):
                    message = decode_record(response.body, position)
                    assert message.queue_index == len(bodies[queue_id])
                    bodies[queue_id].append(message.body.decode())
                    position += message.size_bytes
                queue_index = int(response.ext_fields["nextBeginOffset"])
    return bodies


def indexed_bodies(address: str) -> dict[int, list[str]]:
    """stored_bodies once the dispatcher has every record of the commit log in the consume
    queues: it indexes the last ones a moment after the store writer answered them. Waiting for
    all of them, not only until the acknowledged ones are there, lets a copy stored after the
    last acknowledged send show as stored twice too."""
    wait_dispatched_at(address)
    return stored_bodies(address)


def check_stored(bodies: dict[int, list[str]], producers: list[Producer]) -> None:
    everything = [body for queue in bodies.values() for body in queue]
    counts = collections.Counter(everything)
    duplicated = [body for body, count in counts.items() if count > 1]
    assert not duplicated, f"stored twice: {duplicated[:5]}"
    for producer in producers:
        missing = [body for body in producer.acknowledged if counts[body] != 1]
        assert not missing, f"acknowledged but not stored: {missing[:5]} of {len(missing)}"
    for queue in bodies.values():  # per queue, each producer's bodies in the order it sent them
        for producer in producers:
            prefix = f"p{producer.producer_id}-"
            sequences = [int(body[len(prefix) :]) for body in queue if body.startswith(prefix)]
            assert sequences == sorted(sequences)


def random_victims(kill_count: int, seed: int) -> Iterator[str]:
    """APPLIANCE (one round in WHOLE_APPLIANCE_EVERY) or ANY_ROLE: a role chosen at the kill."""
    rng = random.Random(seed)
    for _ in range(kill_count):
        yield (
            APPLIANCE if rng.randrange(WHOLE_APPLIANCE_EVERY) == 0 else ANY_ROLE + str(rng.random())
        )


def run_chaos(home: Path, reap_pids: list[int], schedule: list[str]) -> None:
    """Kill by `schedule`: a role id, APPLIANCE, or ANY_ROLE + a number in [0, 1) choosing one
    of the roles state.json lists at that moment."""
    victims: list[str] = []
    with contextlib.ExitStack() as stack:
        appliance = stack.enter_context(running_appliance(home, reap_pids, CHAOS_CONF))
        with RemotingClient(appliance.broker_address) as broker:
            header = UpdateAndCreateTopicRequestHeader(TOPIC, "TBW102", QUEUE_COUNT, QUEUE_COUNT, 6)
            created = broker.invoke(RequestCode.UPDATE_AND_CREATE_TOPIC, header.to_ext())
            assert created.code == ResponseCode.SUCCESS, created.remark
        target = Target(appliance.broker_address)
        producers = [Producer(number, target) for number in range(PRODUCER_COUNT)]
        threads: list[Producer | Puller] = [*producers, Puller(target)]
        for thread in threads:
            thread.start()
        try:
            for round_number, planned in enumerate(schedule):
                wait_for_more_sends(producers, f"round {round_number}")
                if planned == APPLIANCE:
                    victims.append(APPLIANCE)
                    kill_everything(appliance)
                    stack.close()  # the orderly exit of a dead appliance: reap, sweep
                    appliance = stack.enter_context(running_appliance(home, reap_pids, CHAOS_CONF))
                    target.address = appliance.broker_address
                    continue
                roles = {str(role["role_id"]): int(role["pid"]) for role in state_of(home)["roles"]}
                if planned.startswith(ANY_ROLE):
                    choice = float(planned[len(ANY_ROLE) :])
                    planned = sorted(roles)[int(choice * len(roles))]
                victims.append(planned)
                dead_pid = roles[planned]
                with contextlib.suppress(ProcessLookupError):
                    os.kill(dead_pid, signal.SIGKILL)
                wait_until(
                    functools.partial(all_ready, home, dead_pid), f"recovery after {victims}"
                )
            wait_for_more_sends(producers, f"after {victims}")
        finally:
            for thread in threads:
                thread.stopping.set()
            for thread in threads:
                thread.join(30)
        assert appliance.process.poll() is None, f"the broker stopped after {victims}"
        assert sum(producer.failed_count for producer in producers) > 0, "no kill was felt"
        check_stored(indexed_bodies(appliance.broker_address), producers)


def test_chaos_kills_lose_no_acknowledged_message(tmp_path: Path, reap_pids: list[int]) -> None:
    """The default run: each kind of death once, the critical roles and the whole appliance."""
    schedule = ["dispatcher.0", "codec.0", APPLIANCE, "store_writer.0", "send.0", "reactor.0"]
    run_chaos(tmp_path / "home", reap_pids, schedule)


@pytest.mark.slow
def test_chaos_many_kills_lose_no_acknowledged_message(
    tmp_path: Path, reap_pids: list[int]
) -> None:
    seed = int(os.environ.get("MQBOX_CHAOS_SEED", "2026"))
    kill_count = int(os.environ.get("MQBOX_CHAOS_KILLS", "100"))
    run_chaos(tmp_path / "home", reap_pids, list(random_victims(kill_count, seed)))

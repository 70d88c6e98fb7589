"""Goal (issue 9, part 1): when a critical role dies, the appliance recovers by itself. A SIGKILLed
store writer, and then a SIGKILLed dispatcher, under a light load: the supervisor restarts every
role of the broker (recovery runs in the store writer's open), producers reconnect and go on, and
every send that was acknowledged is in the store exactly once. A store writer that dies again on
every try stops the broker after mqboxBrokerRestartCountMax restarts, and `mqbox status` says
why.

Method: the real appliance (tests/support/appliance.py) on 127.0.0.1 port 0. A producer thread
sends SEND_MESSAGE_V2 with mqbox's blocking RemotingClient (which connects again on the call
after a failure), each message with a key of its own, and notes the keys answered SUCCESS; a
failed call is retried with a new key, never the same one, so "exactly once" is exact. The test
SIGKILLs the role by the PID run/state.json gives, waits until state.json reports the broker
restarted and every role ready, and in the end, once the dispatcher caught up, pulls every
queue and counts the keys. The second test starts the appliance with the test hook
MQBOX_TEST_DIE_ON_PARCEL (runtime.py) on the store writer and a poisoned body, and reads `mqbox
status` with typer's CliRunner.
"""

from __future__ import annotations

import collections
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Final

import pytest
from typer.testing import CliRunner

from mqbox.admin import cli
from mqbox.client.remoting import RemotingClient, RemotingError
from mqbox.message import decode_record
from mqbox.protocol.codes import RequestCode, ResponseCode
from mqbox.protocol.headers import SendMessageRequestHeader, UpdateAndCreateTopicRequestHeader
from mqbox.server import supervisor
from mqbox.server.home import read_state
from mqbox.server.runtime import TEST_DIE_ON_PARCEL_ENV
from tests.support.appliance import BROKER_CONF, Appliance, running_appliance
from tests.support.pull_requests import pull_everything_header
from tests.support.read_back import wait_dispatched

pytestmark = [pytest.mark.integration, pytest.mark.crash]

TOPIC: Final = "RestartTopic"
QUEUE_COUNT: Final = 4
RESTART_WAIT_S: Final = 120.0
LOAD_INTERVAL_S: Final = 0.005  # a light load: at most 200 sends a second
POISON: Final = "POISON-FOR-THE-STORE-WRITER"


class Producer(threading.Thread):
    """Sends keyed messages until stopped; `acknowledged` holds the keys answered SUCCESS."""

    def __init__(self, broker_address: str) -> None:
        super().__init__(name="producer", daemon=True)
        self.client = RemotingClient(broker_address, timeout_ms=3000)
        self.acknowledged: list[str] = []
        self.failed_count = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        number = 0
        while not self.stopping.is_set():
            key = f"key-{number:08d}"
            header = SendMessageRequestHeader("RestartPG", TOPIC, "TBW102", 4, number % 4, 0, 1, 0)
            try:
                response = self.client.invoke(
                    RequestCode.SEND_MESSAGE_V2, header.to_ext_v2(), key.encode()
                )
            except RemotingError:
                response = None
            if response is not None and response.code == ResponseCode.SUCCESS:
                self.acknowledged.append(key)
            else:
                self.failed_count += 1
                time.sleep(0.05)  # the broker restarts: try again soon, with the next key
            number += 1
            time.sleep(LOAD_INTERVAL_S)
        self.client.close()


def state_of(appliance: Appliance) -> dict[str, Any]:
    return read_state(appliance.home) or {"roles": []}


def pid_of(appliance: Appliance, role_id: str) -> int:
    return int(next(r["pid"] for r in state_of(appliance)["roles"] if r["role_id"] == role_id))


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def wait_restarted(appliance: Appliance, restart_count: int) -> None:
    def restarted() -> bool:
        state = state_of(appliance)
        ready = all(role["state"] == "ready" for role in state["roles"])
        return (
            state.get("broker_restarts") == restart_count and state["status"] == "running" and ready
        )

    wait_until(restarted, f"broker restart {restart_count}", RESTART_WAIT_S)


def wait_for_more_sends(producer: Producer, what: str, count: int = 50) -> None:
    """Until `count` more sends than now are acknowledged."""
    target = len(producer.acknowledged) + count
    wait_until(lambda: len(producer.acknowledged) >= target, f"{count} sends {what}", 30)


def stored_keys(broker: RemotingClient) -> list[str]:
    """The body of every message of every queue of TOPIC."""
    keys: list[str] = []
    for queue_id in range(QUEUE_COUNT):
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
                keys.append(message.body.decode())
                position += message.size_bytes
            queue_index = int(response.ext_fields["nextBeginOffset"])
    return keys


@pytest.fixture
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    pids: list[int] = []
    with running_appliance(tmp_path_factory.mktemp("restart"), pids) as running:
        yield running


def test_killed_store_writer_and_dispatcher_come_back_and_keep_every_acknowledged_send(
    appliance: Appliance,
) -> None:
    with RemotingClient(appliance.broker_address) as broker:
        header = UpdateAndCreateTopicRequestHeader(TOPIC, "TBW102", QUEUE_COUNT, QUEUE_COUNT, 6)
        created = broker.invoke(RequestCode.UPDATE_AND_CREATE_TOPIC, header.to_ext())
        assert created.code == ResponseCode.SUCCESS, created.remark
    producer = Producer(appliance.broker_address)
    producer.start()
    try:
        for restart_count, role_id in enumerate(("store_writer.0", "dispatcher.0"), start=1):
            wait_for_more_sends(producer, "before the kill")
            os.kill(pid_of(appliance, role_id), signal.SIGKILL)
            wait_restarted(appliance, restart_count)
        wait_for_more_sends(producer, "after the restarts")
    finally:
        producer.stopping.set()
        producer.join(30)
    assert appliance.process.poll() is None
    assert "critical role dispatcher.0" in state_of(appliance)["last_failure"]["reason"]
    with RemotingClient(appliance.broker_address) as broker:
        # The last sends were answered a moment before the dispatcher made them pullable; once
        # it caught up, a key stored twice is seen twice too.
        wait_dispatched(broker)
        counts = collections.Counter(stored_keys(broker))
    assert producer.failed_count > 0, "the kills were felt by the producer"
    assert not [key for key in producer.acknowledged if counts[key] != 1]
    assert max(counts.values()) == 1  # nothing stored twice, acknowledged or not


def test_store_writer_that_dies_on_every_try_stops_the_broker_with_the_reason_in_status(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    pids: list[int] = []
    conf = BROKER_CONF + "mqboxBrokerRestartCountMax=1\nmqboxRestartBackoffMs=10\n"
    hook = {TEST_DIE_ON_PARCEL_ENV: f"store_writer.0:{POISON}"}
    home = tmp_path_factory.mktemp("restart-loop")
    with running_appliance(home, pids, conf, environment=hook) as appliance:
        client = RemotingClient(appliance.broker_address, timeout_ms=2000)
        header = SendMessageRequestHeader("RestartPG", TOPIC, "TBW102", 4, 0, 0, 1, 0)
        deadline = time.monotonic() + RESTART_WAIT_S
        try:
            while appliance.process.poll() is None:  # each try kills the store writer again
                assert time.monotonic() < deadline, "the broker did not stop"
                try:
                    client.invoke(RequestCode.SEND_MESSAGE_V2, header.to_ext_v2(), POISON.encode())
                except RemotingError:
                    time.sleep(0.1)
        finally:
            client.close()
        assert appliance.process.wait(30) == supervisor.EXIT_ROLE_FAILED
    reason = "the broker restarted once within 60 s"
    assert reason in (home / "logs" / "supervisor.log").read_text()
    shown = CliRunner().invoke(cli.app, ["status", "--home", str(home)])
    assert shown.exit_code == 1
    assert "critical role store_writer.0" in shown.output
    assert reason in shown.output

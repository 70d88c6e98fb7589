"""Goal: in the real appliance the checkpoint has one writer, the store writer, and what it writes
is what recovery needs after the whole broker is SIGKILLed: while the broker runs, the file
carries the commit log's flushed store time and the dispatcher's consume-queue and index flush
times (none newer than the newest message), and after a SIGKILL of every process the next start
takes the unclean path from that checkpoint and finds every acknowledged message, once, in order,
with its body and its key.

Method: `python -m mqbox.server.supervisor` with the broker's real topology (tests/support/
appliance.py) in a fresh home. Messages with keys are sent; the test waits until the checkpoint
holds all three times (the store writer writes it every flushIntervalConsumeQueue ms, 200 here),
then SIGKILLs the supervisor, its name server and every role by PID, and starts the appliance
again on the same home. The store writer's log says how recovery went; pulls and a key query
(QUERY_MESSAGE through the admin) show what survived. Every process is killed by PID at the end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Final

import psutil
import pytest

from mqbox.message import decode_record, encode_properties_str
from mqbox.protocol import RemotingCommand
from mqbox.protocol.codes import RequestCode, ResponseCode
from mqbox.protocol.headers import SendMessageRequestHeader
from mqbox.store.checkpoint import CheckpointTimestamps, read_checkpoint
from mqbox.store.layout import abort_path, checkpoint_path
from tests.support.appliance import running_appliance
from tests.support.front_client import FrontClient
from tests.support.pull_requests import pull_everything_header

pytestmark = pytest.mark.integration

BROKER_CONF: Final = (
    "brokerIP1=127.0.0.1\n"
    "mapedFileSizeCommitLog=16777216\n"
    "mapedFileSizeConsumeQueue=6000\n"
    "flushIntervalCommitLog=100\n"
    "flushIntervalConsumeQueue=200\n"
    "mqboxSendProcessorCount=1\n"
    "mqboxPullProcessorCount=1\n"
)
TOPIC: Final = "CheckpointTopic"
MESSAGE_COUNT: Final = 300
WAIT_S: Final = 30.0


def send(client: FrontClient, number: int) -> int:
    """Send message `number` to queue 0 with key k<number>; its store time comes back later."""
    header = SendMessageRequestHeader(
        producer_group="PG",
        topic=TOPIC,
        default_topic="TBW102",
        default_topic_queue_nums=1,
        queue_id=0,
        sys_flag=0,
        born_timestamp_ms=int(time.time() * 1000),
        flag=0,
        properties=encode_properties_str({"KEYS": f"k{number}"}).decode(),
    )
    response = client.call(RequestCode.SEND_MESSAGE, header.to_ext(), f"body {number}".encode())
    assert response.code == ResponseCode.SUCCESS, response.remark
    return int(response.ext_fields["queueOffset"])


def pull(client: FrontClient, queue_index: int) -> RemotingCommand:
    header = pull_everything_header(TOPIC, queue_index)
    return client.call(RequestCode.PULL_MESSAGE, header.to_ext())


def pull_everything(client: FrontClient, end: int) -> list[tuple[int, bytes, int]]:
    """(queue index, body, store time) of every message below `end`."""
    found: list[tuple[int, bytes, int]] = []
    queue_index = 0
    deadline = time.monotonic() + WAIT_S
    while queue_index < end:
        assert time.monotonic() < deadline, f"only {queue_index} of {end} messages"
        response = pull(client, queue_index)
        if response.code == ResponseCode.PULL_NOT_FOUND:
            time.sleep(0.05)  # the dispatcher has not caught up yet
            continue
        assert response.code == ResponseCode.SUCCESS, (response.code, response.ext_fields)
        position = 0
        while position < len(response.body):
            message = decode_record(response.body, position)
            found.append((message.queue_index, message.body, message.store_timestamp_ms))
            position += message.size_bytes
        queue_index = int(response.ext_fields["nextBeginOffset"])
    return found


def wait_checkpoint(path: Path, newest_ms: int) -> CheckpointTimestamps:
    """The checkpoint once all three of its times reached `newest_ms`."""
    deadline = time.monotonic() + WAIT_S
    while True:
        stored = read_checkpoint(path)
        if (
            stored is not None
            and min(
                stored.physic_msg_timestamp_ms,
                stored.logics_msg_timestamp_ms,
                stored.index_msg_timestamp_ms,
            )
            >= newest_ms
        ):
            return stored
        assert time.monotonic() < deadline, f"checkpoint {stored}, newest message {newest_ms}"
        time.sleep(0.05)


def last_recovery_line(home: Path) -> str:
    lines = (home / "logs" / "store_writer.0.log").read_text(encoding="utf-8").splitlines()
    return [line for line in lines if "store open: RecoveryReport" in line][-1]


def test_the_store_writer_checkpoints_what_an_unclean_restart_needs(
    tmp_path: Path, reap_pids: list[int]
) -> None:
    home = tmp_path / "home"
    store_root = home / "store" / "broker-a"
    with running_appliance(home, reap_pids, BROKER_CONF) as appliance:
        client = appliance.client()
        try:
            assert [send(client, number) for number in range(MESSAGE_COUNT)] == list(
                range(MESSAGE_COUNT)
            )
            stored = pull_everything(client, MESSAGE_COUNT)
        finally:
            client.close()
        newest_ms = max(store_ms for _index, _body, store_ms in stored)
        checkpoint = wait_checkpoint(checkpoint_path(store_root), newest_ms)
        assert checkpoint.physic_msg_timestamp_ms == newest_ms
        assert checkpoint.logics_msg_timestamp_ms == newest_ms
        assert checkpoint.index_msg_timestamp_ms == newest_ms
        # SIGKILL the whole broker: the supervisor, its name server and every role.
        family = {appliance.process.pid, *appliance.role_pids}
        with contextlib.suppress(psutil.NoSuchProcess):
            family |= {child.pid for child in psutil.Process(appliance.process.pid).children(True)}
        for pid in family:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        appliance.process.wait(WAIT_S)
        assert abort_path(store_root).exists()

    with running_appliance(home, reap_pids, BROKER_CONF) as appliance:
        recovery = last_recovery_line(home)
        assert "was_clean=False" in recovery
        assert "flushed_damage=False" in recovery
        client = appliance.client()
        try:
            assert pull_everything(client, MESSAGE_COUNT) == stored
            assert pull(client, MESSAGE_COUNT).code == ResponseCode.PULL_NOT_FOUND
            for number in (0, MESSAGE_COUNT // 2, MESSAGE_COUNT - 1):
                response = client.call(
                    RequestCode.QUERY_MESSAGE,
                    {
                        "topic": TOPIC,
                        "key": f"k{number}",
                        "maxNum": "32",
                        "beginTimestamp": "0",
                        "endTimestamp": str(2**62),
                    },
                )
                assert response.code == ResponseCode.SUCCESS, response.remark
                assert decode_record(response.body).body == f"body {number}".encode()
            assert send(client, MESSAGE_COUNT) == MESSAGE_COUNT
        finally:
            client.close()
        assert appliance.stop() == 0
    assert not abort_path(store_root).exists()

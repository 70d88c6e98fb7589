"""Goal: in the real appliance the checkpoint has one writer, the store writer, and what it writes
is what recovery needs after the whole broker is SIGKILLed: while the broker runs, the file
carries the commit log's flushed store time and the dispatcher's consume-queue and index flush
times (none newer than the newest message), and after a SIGKILL of every process the next start
takes the unclean path from that checkpoint and finds every acknowledged message, once, in order,
with its body and its key.

Method: `python -m mqbox.server.supervisor` with the broker's real topology (tests/support/
appliance.py) in a fresh home. Messages with keys are sent; the test waits until the checkpoint
holds all three times (the store writer writes it every flushIntervalConsumeQueue ms, 200 here,
and the index is flushed as often: mqboxFlushIntervalIndexMs=200, where tests/crash/
test_index_sigkill.py keeps a long interval), then SIGKILLs the supervisor, its name server and
every role by PID, and starts the appliance again on the same home. The store writer's log
says how recovery went; pulls and a key query (QUERY_MESSAGE through the admin) show what
survived. Every process is killed by PID at the end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

import psutil
import pytest

from mqbox.message import decode_record, encode_properties_str
from mqbox.protocol import RemotingCommand
from mqbox.protocol.codes import RequestCode, ResponseCode
from mqbox.store.checkpoint import CheckpointState, read_checkpoint
from mqbox.store.layout import abort_path, checkpoint_path
from tests.support.appliance import Appliance, running_appliance
from tests.support.front_client import FrontClient
from tests.support.pull_requests import pull_everything_header
from tests.support.send_requests import send_to_queue_header

pytestmark = pytest.mark.integration

BROKER_CONF: Final = (
    "brokerIP1=127.0.0.1\n"
    "mapedFileSizeCommitLog=16777216\n"
    "mapedFileSizeConsumeQueue=6000\n"
    "flushIntervalCommitLog=100\n"
    "flushIntervalConsumeQueue=200\n"
    "mqboxFlushIntervalIndexMs=200\n"
    "mqboxSendProcessorCount=1\n"
    "mqboxPullProcessorCount=1\n"
)
TOPIC: Final = "CheckpointTopic"
MESSAGE_COUNT: Final = 300
WAIT_S: Final = 30.0


def send(client: FrontClient, number: int, extra_properties: dict[str, str] | None = None) -> int:
    """Send message `number` to queue 0 with key k<number>; its store time comes back later."""
    header = send_to_queue_header(
        TOPIC, properties={"KEYS": f"k{number}", **(extra_properties or {})}
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


def wait_checkpoint_state(path: Path, done: Callable[[CheckpointState], bool]) -> CheckpointState:
    """The checkpoint once `done` says it is what the test waits for."""
    deadline = time.monotonic() + WAIT_S
    while True:
        stored = read_checkpoint(path)
        if stored is not None and done(stored):
            return stored
        assert time.monotonic() < deadline, f"checkpoint {stored}"
        time.sleep(0.05)


def wait_checkpoint(path: Path, newest_ms: int) -> CheckpointState:
    """The checkpoint once all three of its times reached `newest_ms`."""
    return wait_checkpoint_state(
        path,
        lambda state: (
            min(
                state.physic_msg_timestamp_ms,
                state.logics_msg_timestamp_ms,
                state.index_msg_timestamp_ms,
            )
            >= newest_ms
        ),
    )


def wait_checkpoint_offsets(path: Path) -> int:
    """The checkpoint's flushed log offset once all three offsets are equal and not zero: the
    commit log, the consume queues and the index all flushed up to the same record."""

    def offsets(state: CheckpointState) -> set[int | None]:
        return {
            state.physic_log_offset_bytes,
            state.logics_log_offset_bytes,
            state.index_log_offset_bytes,
        }

    state = wait_checkpoint_state(
        path, lambda state: len(offsets(state)) == 1 and bool(state.physic_log_offset_bytes)
    )
    assert state.physic_log_offset_bytes is not None
    return state.physic_log_offset_bytes


def kill_whole_broker(appliance: Appliance) -> None:
    """SIGKILL the supervisor, its name server and every role, by PID."""
    family = {appliance.process.pid, *appliance.role_pids}
    with contextlib.suppress(psutil.NoSuchProcess):
        family |= {child.pid for child in psutil.Process(appliance.process.pid).children(True)}
    for pid in family:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    appliance.process.wait(WAIT_S)


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
        end_bytes = wait_checkpoint_offsets(checkpoint_path(store_root))
        assert end_bytes == sum(len(body) for _index, body, _ms in stored) + MESSAGE_COUNT * (
            91 + len(TOPIC)
        ) + sum(len(encode_properties_str({"KEYS": f"k{n}"})) for n in range(MESSAGE_COUNT))
        kill_whole_broker(appliance)
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


@pytest.mark.parametrize("wait_for_flush", [True, False])
def test_a_nul_byte_in_a_property_loses_nothing_across_a_sigkill(
    tmp_path: Path, reap_pids: list[int], wait_for_flush: bool
) -> None:
    """The issue's reproduction: a message whose property holds NUL (Java strings may), then
    more, all acknowledged; SIGKILL of the whole broker, flushed or not yet (a process kill
    keeps the page cache); after the restart all of them are there, in order, once."""
    home = tmp_path / "home"
    count = 26
    with running_appliance(home, reap_pids, BROKER_CONF) as appliance:
        client = appliance.client()
        try:
            for number in range(count):
                extra = {"note": "a\0b"} if number == 4 else None
                assert send(client, number, extra) == number
            stored = pull_everything(client, count)
        finally:
            client.close()
        if wait_for_flush:
            wait_checkpoint_offsets(checkpoint_path(home / "store" / "broker-a"))
        kill_whole_broker(appliance)

    with running_appliance(home, reap_pids, BROKER_CONF) as appliance:
        recovery = last_recovery_line(home)
        assert "was_clean=False" in recovery
        assert "truncated_at_log_offset_bytes=None" in recovery
        client = appliance.client()
        try:
            assert pull_everything(client, count) == stored
            assert pull(client, count).code == ResponseCode.PULL_NOT_FOUND
        finally:
            client.close()
        assert appliance.stop() == 0

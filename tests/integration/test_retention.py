"""Goal: retention runs in the real appliance. With tiny commit-log segments and RocketMQ's keys
set to delete a segment as soon as the writer rolled past it (fileReservedTime=0, every hour in
deleteWhen, cleanResourceInterval=300 ms), messages produced across many segments make the store
writer delete the old segments and the dispatcher the consume-queue segments below them; the
admin's GET_MIN_OFFSET moves to the first message left; a pull below it is told to go there
(21, OFFSET_ILLEGAL for clients, nextBeginOffset = minOffset = the new minimum); pulls from it
get every message left, unchanged, in order; the broker keeps serving (no role died or was
re-forked, new messages go in and come out), stops cleanly, and a restart on the same home
recovers the same minimum.

Method: `python -m mqbox.server.supervisor` with the broker's real topology (tests/support/
appliance.py) in a fresh home: 64 KiB commit-log segments, 64-entry consume-queue segments. The
client is a plain socket with the protocol's client codec. Where each message went comes from its
send response (queueOffset, and the commit-log offset inside its offset msgId), so the expected
minimum is the first queue index whose record lies in a segment still on disk. Waits poll with
deadlines. Every process is killed by PID at the end and the shared memory swept.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Final, TypeVar

import psutil
import pytest

from mqbox.message import decode_offset_msg_id, decode_record
from mqbox.protocol import RemotingCommand
from mqbox.protocol.codes import RequestCode, ResponseCode
from mqbox.store.layout import abort_path, commit_log_dir, consume_queue_dir, parse_segment_name
from tests.support.appliance import (
    RETENTION_BROKER_CONF,
    RETENTION_CQ_SEGMENT_ENTRY_COUNT,
    RETENTION_SEGMENT_SIZE_BYTES,
    Appliance,
    running_appliance,
)
from tests.support.front_client import FrontClient
from tests.support.pull_requests import pull_everything_header
from tests.support.read_back import wait_dispatched_at
from tests.support.send_requests import send_to_queue_header

pytestmark = pytest.mark.integration

SEGMENT_SIZE_BYTES: Final = RETENTION_SEGMENT_SIZE_BYTES
CQ_SEGMENT_ENTRY_COUNT: Final = RETENTION_CQ_SEGMENT_ENTRY_COUNT
BROKER_CONF: Final = RETENTION_BROKER_CONF
TOPIC: Final = "RetentionTopic"
MESSAGE_COUNT: Final = 400  # about 1.1 KB each: seven segments
TOTAL_COUNT: Final = 405
WAIT_S: Final = 30.0

T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float = WAIT_S) -> T:
    """Poll `probe` until it returns something other than None; fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = probe()
        if found is not None:
            return found
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(0.05)


def body_of(number: int) -> bytes:
    return f"message {number:06d} ".encode() * 50


def send(client: FrontClient, number: int) -> tuple[int, int]:
    """Send message `number` to queue 0; (its queue index, its commit-log offset)."""
    header = send_to_queue_header(TOPIC, properties={"KEYS": f"key{number}"})
    response = client.call(RequestCode.SEND_MESSAGE, header.to_ext(), body_of(number))
    assert response.code == ResponseCode.SUCCESS, response.remark
    _host, log_offset_bytes = decode_offset_msg_id(response.ext_fields["msgId"])
    return int(response.ext_fields["queueOffset"]), log_offset_bytes


def pull(client: FrontClient, queue_index: int) -> RemotingCommand:
    header = pull_everything_header(TOPIC, queue_index)
    return client.call(RequestCode.PULL_MESSAGE, header.to_ext())


def min_offset(client: FrontClient) -> int:
    response = client.call(RequestCode.GET_MIN_OFFSET, {"topic": TOPIC, "queueId": "0"})
    assert response.code == ResponseCode.SUCCESS, response.remark
    return int(response.ext_fields["offset"])


def segment_starts(directory: Path) -> list[int]:
    starts = [parse_segment_name(path.name) for path in directory.iterdir()]
    return sorted(start for start in starts if start is not None)


def pull_all_from(client: FrontClient, first: int, end: int) -> list[tuple[int, bytes]]:
    """(queue index, body) of every message in [first, end), pulled 32 at a time."""
    found: list[tuple[int, bytes]] = []
    queue_index = first
    while queue_index < end:
        response = pull(client, queue_index)
        assert response.code == ResponseCode.SUCCESS, (response.code, response.ext_fields)
        position = 0
        while position < len(response.body):
            message = decode_record(response.body, position)
            found.append((message.queue_index, message.body))
            position += message.size_bytes
        queue_index = int(response.ext_fields["nextBeginOffset"])
    return found


def roles_alive(appliance: Appliance) -> bool:
    return appliance.process.poll() is None and all(
        psutil.pid_exists(pid) for pid in appliance.role_pids
    )


def test_retention_deletes_old_segments_and_readers_follow(
    tmp_path: Path, reap_pids: list[int]
) -> None:
    home = tmp_path / "home"
    store_root = home / "store" / "broker-a"
    sent: list[tuple[int, int]] = []
    with running_appliance(home, reap_pids, BROKER_CONF) as appliance:
        client = appliance.client()
        try:
            sent = [send(client, number) for number in range(MESSAGE_COUNT)]
            assert [queue_index for queue_index, _offset in sent] == list(range(MESSAGE_COUNT))
            last_segment = sent[-1][1] - sent[-1][1] % SEGMENT_SIZE_BYTES
            assert last_segment >= 5 * SEGMENT_SIZE_BYTES
            # The answers below name the queue's end (maxOffset): the dispatcher counts the last
            # sends a moment after they were answered.
            wait_dispatched_at(appliance.broker_address)

            # Every segment the writer rolled past goes; the one it writes stays.
            wait_for(
                "old commit-log segments deleted",
                lambda: segment_starts(commit_log_dir(store_root)) == [last_segment] or None,
            )
            expected_min = next(index for index, offset in sent if offset >= last_segment)
            assert expected_min > 0
            wait_for("GET_MIN_OFFSET moved", lambda: min_offset(client) == expected_min or None)
            wait_for(
                "consume-queue segments below the minimum deleted",
                lambda: (
                    segment_starts(consume_queue_dir(store_root, TOPIC, 0))[0]
                    == expected_min // CQ_SEGMENT_ENTRY_COUNT * CQ_SEGMENT_ENTRY_COUNT * 20
                    or None
                ),
            )

            # Below the minimum: told where to go. From it: every message left, unchanged.
            for asked in (0, expected_min // 2, expected_min - 1):
                response = pull(client, asked)
                assert response.code == ResponseCode.PULL_OFFSET_MOVED
                ext = response.ext_fields
                assert (ext["nextBeginOffset"], ext["minOffset"], ext["maxOffset"]) == (
                    str(expected_min),
                    str(expected_min),
                    str(MESSAGE_COUNT),
                )
            assert pull_all_from(client, expected_min, MESSAGE_COUNT) == [
                (number, body_of(number)) for number in range(expected_min, MESSAGE_COUNT)
            ]

            # The broker goes on: nothing died, new messages go in and come out.
            assert roles_alive(appliance)
            sent += [send(client, number) for number in range(MESSAGE_COUNT, TOTAL_COUNT)]
            assert [index for index, _offset in sent] == list(range(TOTAL_COUNT))
            wait_for("new messages", lambda: pull(client, TOTAL_COUNT - 1).code == 0 or None)
            assert pull_all_from(client, MESSAGE_COUNT, TOTAL_COUNT) == [
                (number, body_of(number)) for number in range(MESSAGE_COUNT, TOTAL_COUNT)
            ]
            assert roles_alive(appliance)
            assert "Traceback" not in appliance.output()
            # If they rolled into a new segment, the one before goes too: settle before the stop.
            last_segment = sent[-1][1] - sent[-1][1] % SEGMENT_SIZE_BYTES
            wait_for(
                "the last segment alone",
                lambda: segment_starts(commit_log_dir(store_root)) == [last_segment] or None,
            )
        finally:
            client.close()
        assert appliance.stop() == 0
    assert not abort_path(store_root).exists()

    # A restart on the same home recovers the same minimum (the clean path with segments gone).
    expected_min = next(index for index, offset in sent if offset >= last_segment)
    with running_appliance(home, reap_pids, BROKER_CONF) as appliance:
        client = appliance.client()
        try:
            assert min_offset(client) == expected_min
            response = pull(client, 0)
            assert response.code == ResponseCode.PULL_OFFSET_MOVED
            assert response.ext_fields["nextBeginOffset"] == str(expected_min)
            assert pull_all_from(client, expected_min, TOTAL_COUNT) == [
                (number, body_of(number)) for number in range(expected_min, TOTAL_COUNT)
            ]
        finally:
            client.close()
        assert appliance.stop() == 0

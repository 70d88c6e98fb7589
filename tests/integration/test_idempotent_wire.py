"""Goal: the idempotent produce window on the real appliance, over the raw protocol. With two send
processors, the same UNIQ_KEYs sent with `mqboxIdempotent=true` over two connections (so through
both processors), interleaved and pipelined, are stored once each, and every answer names the
first record; the queue holds each message once. The window survives an orderly restart and a
SIGKILL of the whole broker (rebuilt from the commit log at the next start): repeats are still
answered with the first result and stored nothing. A send without the field is stored again.

Method: `python -m mqbox.server.supervisor` (tests/support/appliance.py) with
mqboxSendProcessorCount=2; FrontClient sockets speak the protocol's client codec; SEND_MESSAGE_V2
headers are built by hand with the extra field; the queue is read back with PULL. Every process
is killed by PID at the end and the shared memory swept.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Final

import pytest

from mqbox.message import decode_offset_msg_id, decode_record
from mqbox.protocol import RemotingCommand
from mqbox.protocol.codes import RequestCode, ResponseCode
from mqbox.protocol.headers import SEND_DUPLICATES_KEY, SEND_IDEMPOTENT_KEY
from tests.support.appliance import running_appliance
from tests.support.front_client import FrontClient
from tests.support.pull_requests import pull_everything_header
from tests.support.read_back import wait_dispatched_at
from tests.support.send_requests import send_to_queue_header

pytestmark = pytest.mark.integration

BROKER_CONF: Final = (
    "brokerIP1=127.0.0.1\n"
    "mapedFileSizeCommitLog=16777216\n"
    "mapedFileSizeConsumeQueue=60000\n"
    "mqboxSendProcessorCount=2\n"
    "mqboxPullProcessorCount=1\n"
)
TOPIC: Final = "IdempotentWire"
KEY_COUNT: Final = 40
READABLE_WAIT_S: Final = 10.0


def send_ext(uniq_key: str, *, idempotent: bool = True) -> dict[str, str]:
    header = send_to_queue_header(TOPIC, properties={"UNIQ_KEY": uniq_key})
    ext = header.to_ext_v2()
    if idempotent:
        ext[SEND_IDEMPOTENT_KEY] = "true"
    return ext


def key(number: int) -> str:
    return f"IDEMPOTENT-KEY-{number:04d}"


def send_all(client: FrontClient, numbers: list[int]) -> list[RemotingCommand]:
    """Pipeline one idempotent send per number, then read every answer (in order)."""
    opaques = [
        client.request(RequestCode.SEND_MESSAGE_V2, send_ext(key(n)), f"body {n}".encode())
        for n in numbers
    ]
    answers = client.responses(len(numbers))
    assert [response.opaque for response in answers] == opaques
    for response in answers:
        assert response.code == ResponseCode.SUCCESS, response.remark
    return answers


def answer(response: RemotingCommand) -> tuple[list[int], str, str]:
    """Where the answer says the message is: commit-log offsets (the store host in the msgId
    changes with the port a restarted broker gets), queue id, queue offset."""
    ext = response.ext_fields
    offsets = [decode_offset_msg_id(msg_id)[1] for msg_id in ext["msgId"].split(",")]
    return offsets, ext["queueId"], ext["queueOffset"]


def stored_keys(client: FrontClient, count: int = 0) -> list[str]:
    """UNIQ_KEY of every message of queue 0, in order; waits (a bounded poll) until at least
    `count` are readable, since the dispatcher may lag a send's answer a moment."""
    found: list[str] = []
    queue_index = 0
    deadline = time.monotonic() + READABLE_WAIT_S
    while True:
        header = pull_everything_header(TOPIC, queue_index, count_max=256)
        response = client.call(RequestCode.PULL_MESSAGE, header.to_ext())
        if response.code != ResponseCode.SUCCESS:
            assert response.code == ResponseCode.PULL_NOT_FOUND, response.code
            if len(found) < count and time.monotonic() < deadline:
                time.sleep(0.05)
                continue
            return found
        position = 0
        while position < len(response.body):
            message = decode_record(response.body, position)
            properties = message.properties.decode()
            found.append(properties.split("UNIQ_KEY\x01", 1)[1].split("\x02", 1)[0])
            position += message.size_bytes
        queue_index = int(response.ext_fields["nextBeginOffset"])


def test_idempotent_sends_through_two_processors_survive_restarts_and_kills(
    tmp_path: Path, reap_pids: list[int]
) -> None:
    home = tmp_path / "home"
    numbers = list(range(KEY_COUNT))
    with running_appliance(home, reap_pids, BROKER_CONF) as appliance:
        left, right = appliance.client(), appliance.client()
        try:
            # The reactor numbers connections in turn, so conn % 2 differs: one send processor
            # each. Both send every key; the first of each pair stores it.
            first = send_all(left, numbers[::2]) + send_all(right, numbers[1::2])
            first_by_number = dict(zip(numbers[::2] + numbers[1::2], first, strict=True))
            repeats = send_all(right, numbers) + send_all(left, numbers)
            for index, response in enumerate(repeats):
                number = numbers[index % KEY_COUNT]
                assert answer(response) == answer(first_by_number[number])
                assert response.ext_fields[SEND_DUPLICATES_KEY] == "1"
            # Every repeat was answered: were one stored, the dispatcher has it once this returns,
            # and the queue holds more than the keys.
            wait_dispatched_at(appliance.broker_address)
            assert sorted(stored_keys(left, len(numbers))) == sorted(key(n) for n in numbers)
        finally:
            left.close()
            right.close()
        assert appliance.stop() == 0

    with running_appliance(home, reap_pids, BROKER_CONF) as appliance:
        client = appliance.client()
        try:
            for number, response in zip(numbers, send_all(client, numbers), strict=True):
                assert answer(response) == answer(first_by_number[number])
            # Something new, then every process of the broker SIGKILLed.
            late = send_all(client, [KEY_COUNT])[0]
        finally:
            client.close()
        appliance.kill()

    with running_appliance(home, reap_pids, BROKER_CONF) as appliance:
        client = appliance.client()
        try:
            again = send_all(client, [*numbers, KEY_COUNT])
            assert answer(again[-1]) == answer(late)
            assert all(SEND_DUPLICATES_KEY in response.ext_fields for response in again)
            plain = client.call(
                RequestCode.SEND_MESSAGE_V2, send_ext(key(0), idempotent=False), b"plain"
            )
            assert plain.code == ResponseCode.SUCCESS
            assert plain.ext_fields["queueOffset"] == str(KEY_COUNT + 1)
            assert stored_keys(client, KEY_COUNT + 2) == [
                *sorted((key(n) for n in numbers), key=lambda k: answer_index(first_by_number, k)),
                key(KEY_COUNT),
                key(0),
            ]
        finally:
            client.close()


def answer_index(first_by_number: dict[int, RemotingCommand], uniq_key: str) -> int:
    return int(first_by_number[int(uniq_key.rsplit("-", 1)[1])].ext_fields["queueOffset"])

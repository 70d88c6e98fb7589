"""Goal (issue 9, part 1): a ring parcel that kills its consumer is delivered once more, and when
it kills that process too it is quarantined: the next process skips it, answers it SYSTEM_ERROR
when it is a request, and serves on; the broker keeps running, nothing else is lost, and the
quarantined request is not stored. Shown for a processor (send.0, on a COMMAND from the worker)
and for the codec (codec.0, on a FRAME from the reactor).

Method: one real appliance (tests/support/appliance.py) started with the test hook
MQBOX_TEST_DIE_ON_PARCEL (runtime.py): send.0 SIGKILLs itself on a parcel holding one marker,
codec.0 on a parcel holding another. A raw client sends a request carrying the marker; the test
waits for the answer, then reads run/state.json (start count and quarantined count of the role)
and the supervisor's log, and checks that ordinary requests on a new connection are served and
that the poisoned message is not in the queue.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, Final

import pytest

from mqbox.message import decode_record
from mqbox.protocol.codes import FLAG_RESPONSE, RequestCode, ResponseCode
from mqbox.protocol.headers import SendMessageRequestHeader
from mqbox.protocol.mqbox_codes import MQBOX_NOOP
from mqbox.server.home import read_state
from mqbox.server.runtime import TEST_DIE_ON_PARCEL_ENV
from tests.support.appliance import Appliance, running_appliance
from tests.support.front_client import FrontClient
from tests.support.pull_requests import pull_everything_header

pytestmark = [pytest.mark.integration, pytest.mark.crash]

SEND_MARKER: Final = "POISON-FOR-SEND"
FRAME_MARKER: Final = "POISON-FOR-CODEC"
TOPIC: Final = "QuarantineTopic"
WAIT_S: Final = 60.0


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    pids: list[int] = []
    hook = f"send.0:{SEND_MARKER},codec.0:{FRAME_MARKER}"
    home = tmp_path_factory.mktemp("quarantine")
    with running_appliance(home, pids, environment={TEST_DIE_ON_PARCEL_ENV: hook}) as running:
        yield running


def role_state(appliance: Appliance, role_id: str) -> dict[str, Any]:
    state = read_state(appliance.home) or {"roles": []}
    found: dict[str, Any] = next(
        (role for role in state["roles"] if role["role_id"] == role_id), {}
    )
    return found


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def send(client: FrontClient, body: bytes) -> int:
    header = SendMessageRequestHeader("QuarantinePG", TOPIC, "TBW102", 1, 0, 0, 1, 0)
    return client.request(RequestCode.SEND_MESSAGE_V2, header.to_ext_v2(), body)


def test_send_that_kills_its_processor_twice_is_quarantined_and_answered(
    appliance: Appliance,
) -> None:
    first_pid = appliance.roles["send.0"]
    client = appliance.client()
    try:
        opaque = send(client, f"before {SEND_MARKER} after".encode())
        (answer,) = client.responses(1)  # the worker's, for the process that died first
    finally:
        client.close()
    assert (answer.opaque, answer.code) == (opaque, ResponseCode.SYSTEM_ERROR)
    assert answer.flag & FLAG_RESPONSE

    def quarantined_and_ready() -> bool:
        state = role_state(appliance, "send.0")
        return state.get("quarantined") == 1 and state.get("state") == "ready"

    wait_until(quarantined_and_ready, "send.0 to quarantine the parcel and serve again")
    state = role_state(appliance, "send.0")
    assert state["start_count"] == 3  # died on the parcel twice, the third process skipped it
    assert state["pid"] != first_pid
    assert appliance.process.poll() is None
    assert "quarantined" in (appliance.home / "logs" / "supervisor.log").read_text()
    assert "quarantined parcel" in (appliance.home / "logs" / "send.0.log").read_text()

    client = appliance.client()
    try:
        opaque = send(client, b"an ordinary message")
        (stored,) = client.responses(1)
        assert (stored.opaque, stored.code) == (opaque, ResponseCode.SUCCESS), stored.remark
        header = pull_everything_header(TOPIC, 0)
        deadline = time.monotonic() + WAIT_S
        while True:  # the dispatcher makes an acknowledged send pullable a moment later
            pulled = client.call(RequestCode.PULL_MESSAGE, header.to_ext())
            if pulled.code != ResponseCode.PULL_NOT_FOUND or time.monotonic() > deadline:
                break
            time.sleep(0.02)
    finally:
        client.close()
    assert pulled.code == ResponseCode.SUCCESS, pulled.remark
    message = decode_record(pulled.body)
    assert message.body == b"an ordinary message"  # the queue's first message
    assert message.size_bytes == len(pulled.body)  # and its only one


def test_frame_that_kills_the_codec_twice_is_quarantined_and_answered(
    appliance: Appliance,
) -> None:
    client = appliance.client()
    try:
        opaque = client.request(MQBOX_NOOP, {"note": FRAME_MARKER})
        (answer,) = client.responses(1)  # the third codec process's, from the quarantine
        assert (answer.opaque, answer.code) == (opaque, ResponseCode.SYSTEM_ERROR)
        assert answer.remark == "mqbox: quarantined: this request stopped codec.0 twice"
        assert client.call(MQBOX_NOOP).code == ResponseCode.SUCCESS  # the same connection
    finally:
        client.close()
    wait_until(  # the supervisor's state file follows the role's report a moment later
        lambda: (
            (
                role_state(appliance, "codec.0").get("start_count"),
                role_state(appliance, "codec.0").get("quarantined"),
            )
            == (3, 1)
        ),
        "codec.0's state to show three starts and one quarantine",
    )
    assert appliance.process.poll() is None

"""Goal (issue 9, part 1): one request never stops the broker. A SEND whose properties hold a
lone surrogate (the JSON escape \\ud800) or a byte that is not UTF-8, and a HEART_BEAT whose
subscription holds either, are answered SUCCESS, and every role keeps its PID. Their text is
stored as the Java broker stores it: invalid UTF-8 becomes U+FFFD (Java's decoder replaces it)
and a lone surrogate becomes '?' (Java's UTF-8 encoder replaces it), so a consumer of either
broker reads the same bytes.

Method: one real appliance (tests/support/appliance.py: supervisor, every role, the name server;
port 0). The requests are written as raw frames, because the escape and the byte must reach the
broker exactly as a hostile client would send them (mqbox's own encoder would already have
replaced them). Afterwards the stored message is pulled and decoded with message.decode_record,
the group-subscriptions file admin.0 writes is read back, and the PIDs under the supervisor are
compared with the ones before.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Final

import orjson
import psutil
import pytest

from mqbox.config import BrokerConfig
from mqbox.message import decode_properties, decode_record
from mqbox.protocol import RemotingCommand
from mqbox.protocol.codes import FLAG_RESPONSE, RequestCode, ResponseCode
from mqbox.protocol.frame import FRAME_SIZE_BYTES_MAX_DEFAULT, encode_frame_prefix
from mqbox.protocol.headers import SendMessageRequestHeader
from mqbox.server.admin_parcels import subscriptions_path
from mqbox.server.home import store_root_of
from tests.support.appliance import Appliance, running_appliance
from tests.support.front_client import FrontClient
from tests.support.pull_requests import pull_everything_header

pytestmark = pytest.mark.integration

TOPIC: Final = "IsolationTopic"
GROUP: Final = "IsolationGroup"
PLACEHOLDER: Final = "@@TEXT@@"
LONE_SURROGATE_ESCAPE: Final = b"\\ud800"
NOT_UTF8: Final = b"\xff"
WAIT_S: Final = 15.0


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    pids: list[int] = []
    with running_appliance(tmp_path_factory.mktemp("isolation"), pids) as running:
        yield running


def role_pids(appliance: Appliance) -> frozenset[int]:
    supervisor = psutil.Process(appliance.process.pid)
    return frozenset(child.pid for child in supervisor.children(recursive=True))


def raw_frame(
    code: int, opaque: int, ext: dict[str, str], body: bytes, raw: Mapping[str, bytes]
) -> bytes:
    """A JSON-header frame in which each placeholder of `raw` (in ext or body) is replaced by its
    bytes as they are: an escape sequence or bytes no encoder of mqbox would write."""
    header = orjson.dumps(
        {"code": code, "language": "JAVA", "version": 0, "opaque": opaque, "flag": 0,
         "extFields": ext}
    )  # fmt: skip
    for placeholder, raw_text in raw.items():
        header = header.replace(placeholder.encode(), raw_text)
        body = body.replace(placeholder.encode(), raw_text)
    prefix = encode_frame_prefix(0, len(header), len(body), FRAME_SIZE_BYTES_MAX_DEFAULT)
    return prefix + header + body


def call_raw(client: FrontClient, frame_of: Callable[[int], bytes]) -> RemotingCommand:
    """Send the frame `frame_of(opaque)` and wait for its response."""
    opaque = client.connection.next_opaque()
    client.send_raw(frame_of(opaque))
    return response_to(client, opaque)


def response_to(client: FrontClient, opaque: int) -> RemotingCommand:
    """The response with `opaque`; the broker's own requests (40 after a heartbeat) are skipped."""
    while True:
        (command,) = client.responses(1)
        if command.flag & FLAG_RESPONSE:
            assert command.opaque == opaque
            return command


def pull_one(client: FrontClient, queue_index: int) -> bytes:
    """The properties of the message at `queue_index` of TOPIC's queue 0."""
    deadline = time.monotonic() + WAIT_S
    while True:
        header = pull_everything_header(TOPIC, queue_index, count_max=1)
        response = client.call(RequestCode.PULL_MESSAGE, header.to_ext())
        if response.code == ResponseCode.SUCCESS:
            return bytes(decode_record(response.body).properties)
        assert response.code == ResponseCode.PULL_NOT_FOUND, response.remark
        assert time.monotonic() < deadline, f"message {queue_index} never came"
        time.sleep(0.02)


@pytest.mark.parametrize(
    ("raw_text", "stored"),
    [
        (LONE_SURROGATE_ESCAPE, b"?"),  # Java's UTF-8 encoder: an unpaired surrogate is '?'
        (NOT_UTF8, "\ufffd".encode()),  # Java's UTF-8 decoder: a malformed byte is U+FFFD
    ],
)
def test_send_whose_properties_java_cannot_encode_is_stored_as_java_stores_it(
    appliance: Appliance, raw_text: bytes, stored: bytes
) -> None:
    before = role_pids(appliance)
    header = SendMessageRequestHeader("IsolationPG", TOPIC, "TBW102", 1, 0, 0, 1, 0)
    ext = header.to_ext_v2()
    ext["i"] = f"KEY\x01a{PLACEHOLDER}b\x02"
    client = appliance.client()
    try:
        response = call_raw(
            client,
            lambda opaque: raw_frame(
                RequestCode.SEND_MESSAGE_V2, opaque, ext, b"x", {PLACEHOLDER: raw_text}
            ),
        )
        assert response.code == ResponseCode.SUCCESS, response.remark
        properties = pull_one(client, int(response.ext_fields["queueOffset"]))
    finally:
        client.close()
    assert decode_properties(properties)[b"KEY"] == b"a" + stored + b"b"
    assert role_pids(appliance) == before
    assert appliance.process.poll() is None


def test_heartbeat_whose_subscription_java_cannot_encode_is_kept_as_java_keeps_it(
    appliance: Appliance,
) -> None:
    before = role_pids(appliance)
    raw = {"@@SURROGATE@@": LONE_SURROGATE_ESCAPE, "@@BYTE@@": NOT_UTF8}
    subscriptions = [
        {"topic": f"{TOPIC}{number}", "subString": f"t{placeholder}{number}",
         "tagsSet": [f"t{placeholder}{number}"], "subVersion": 1}
        for number, placeholder in enumerate(raw)
    ]  # fmt: skip
    consumer = {
        "groupName": GROUP,
        "consumeType": "CONSUME_PASSIVELY",
        "messageModel": "CLUSTERING",
        "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
        "subscriptionDataSet": subscriptions,
    }
    client = appliance.client()
    try:
        body = orjson.dumps({"clientID": "isolation", "consumerDataSet": [consumer]})
        response = call_raw(
            client, lambda opaque: raw_frame(RequestCode.HEART_BEAT, opaque, {}, body, raw)
        )
        assert response.code == ResponseCode.SUCCESS, response.remark
        opaque = client.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": GROUP})
        listed = response_to(client, opaque)
        assert listed.code == ResponseCode.SUCCESS, listed.remark
        # admin.0 wrote the file before it answered; the clients leave it when they disconnect.
        path = subscriptions_path(store_root_of(appliance.home.resolve(), BrokerConfig()))
        group = json.loads(path.read_bytes())["groups"][GROUP]
    finally:
        client.close()
    assert group[f"{TOPIC}0"]["subString"] == "t?0"
    assert group[f"{TOPIC}1"]["subString"] == "t\ufffd1"
    assert role_pids(appliance) == before

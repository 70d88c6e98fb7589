"""Goal (issue 5, point 7): for every request code the broker serves, a request with missing or
malformed fields gets a RocketMQ error code with a remark over the wire, the broker's process
tree keeps its PIDs, and nothing is stored: no message, no topic, no offset, no client.

"Malformed" per field kind: a required field missing; numbers that are not decimal integers or
do not fit their 32 or 64 bits; queue ids that are negative or beyond the topic's queues; offsets
that are negative where an offset is stored; topic names that are empty, over 127 characters, or
hold characters outside [A-Za-z0-9%|_-] (invalid UTF-8 included); group names likewise; bodies
that are not the JSON (or batch) the code expects; and codes nobody serves. Every such request
must get a code outside 0/19/20/21 and a non-empty remark. Not malformed, so not swept: queue
offsets of a PULL beyond the queue's bounds, which RocketMQ answers 21 with the offset to use
(checked on its own below), and a negative queueId of a SEND, which means "broker, pick one".

Method: one real appliance (tests/support/appliance.py: supervisor, every role, the name server;
port 0). A deterministic sweep sends every single-field corruption of every code's valid
request, pipelined on one connection (PULL errors wait out the pull processor's 1 s error delay
together); then hypothesis draws requests with several fields corrupted at once, with values it
makes up (text that is no integer, integers past their bounds, illegal names, random bodies),
a bounded number of batches so the test runs in seconds. Afterwards: the same PIDs under the
supervisor, the store writer's appended-record total and the topic table unchanged, and the
sweep's group unknown to the broker (no client, offset or configuration).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

import hypothesis
import psutil
import pytest
from hypothesis import strategies as st

from mqbox.client.remoting import RemotingClient
from mqbox.config import parse_properties
from mqbox.message import BatchElement, encode_batch
from mqbox.protocol import RemotingCommand, make_request
from mqbox.protocol.codes import (
    FLAG_RESPONSE,
    PULL_FLAG_SUBSCRIPTION,
    ConsumeFromWhere,
    ConsumeType,
    MessageModel,
    RequestCode,
    ResponseCode,
)
from mqbox.protocol.headers import (
    ConsumerData,
    HeartbeatData,
    PullMessageRequestHeader,
    SendMessageRequestHeader,
    UpdateAndCreateTopicRequestHeader,
    validate_topic,
)
from mqbox.protocol.mqbox_codes import (
    INVOKE_BROKER_TO_RESET_OFFSET,
    MQBOX_RESET_CONSUMER_OFFSET,
)
from mqbox.server.queue_counters import StorePositions, store_positions_name
from mqbox.server.roles.processors.client_manager import group_name_problem
from tests.support.appliance import Appliance, running_appliance
from tests.support.front_client import FrontClient

pytestmark = pytest.mark.integration

TOPIC: Final = "SweepTopic"
QUEUE_COUNT: Final = 4
NEW_TOPIC: Final = "SweepNewTopic"  # what the valid UPDATE_AND_CREATE_TOPIC would make
GROUP: Final = "SweepGroup"
CLIENT_ID: Final = "1-127.0.0.1@SWEEP"
INT32_MAX: Final = (1 << 31) - 1
INT64_MAX: Final = (1 << 63) - 1
NOT_SERVED: Final = (0, 1, 999, 103, 105, 9999, 10_099, INT32_MAX, -1)
ANSWERED_OK: Final = frozenset({0, 19, 20, 21})  # SUCCESS and the PULL answers
WAIT_S: Final = 30.0


class Missing:
    """A field left out of the request."""

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Final = Missing()
Value = str | Missing

# -- corruptions by field kind -------------------------------------------------------------------

NOT_INT: Final[tuple[Value, ...]] = (MISSING, "", "abc", "1.5", "0x10", "1e3", "NaN", "\udcff")
INT32_BAD: Final = (*NOT_INT, str(INT32_MAX + 1), str(-INT32_MAX - 2))
INT64_BAD: Final = (*NOT_INT, str(INT64_MAX + 1), str(-INT64_MAX - 2), "9" * 40)
QUEUE_ID_BAD: Final = (*INT32_BAD, "-1", str(-INT32_MAX - 1), str(QUEUE_COUNT), "100000")
OFFSET_BAD: Final = (*INT64_BAD, "-1", str(-INT64_MAX - 1))
NAME_BAD: Final[tuple[Value, ...]] = (  # topic and group names alike
    MISSING,
    "",
    "x" * 100_000,
    "bad name",
    "a@b",
    "t\u00e9t\u00e9",
    "bad\udcffname",  # invalid UTF-8 on the wire (surrogate escape)
)
TOPIC_BAD: Final = (*NAME_BAD, "T" * 128)
GROUP_BAD: Final = (*NAME_BAD, "G" * 256)
JSON_BODY_BAD: Final = (
    b"",
    b"x",
    b"{",
    b"null",
    b"[1, 2]",
    b'"text"',
    b"\xff\xfe\xfd",
    b"[" * 10_000,
    b'{"a": 1}',
)


@dataclasses.dataclass(frozen=True)
class Spec:
    """One request code: a valid ext and body, and the corruptions of each field and body."""

    code: int
    ext: Mapping[str, str]
    fields: Mapping[str, tuple[Value, ...]]
    body: bytes = b""
    bodies: tuple[bytes, ...] = ()  # bad bodies (the ext stays valid)

    def request(self, changes: Mapping[str, Value], body: bytes | None = None) -> tuple[Any, ...]:
        ext = dict(self.ext)
        for key, value in changes.items():
            if isinstance(value, Missing):
                ext.pop(key, None)
            else:
                ext[key] = value
        return (self.code, ext, self.body if body is None else body)


def send_ext(code: int) -> dict[str, str]:
    header = SendMessageRequestHeader("SweepPG", TOPIC, "TBW102", 4, 0, 0, 1_700_000_000_000, 0)
    return header.to_ext() if code == RequestCode.SEND_MESSAGE else header.to_ext_v2()


def send_fields(code: int) -> dict[str, tuple[Value, ...]]:
    keys = ["producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums", "queueId"]
    keys += ["sysFlag", "bornTimestamp", "flag", "properties", "batch"]
    if code != RequestCode.SEND_MESSAGE:
        keys = list("abcdefghim")
    bad: list[tuple[Value, ...]] = [
        (MISSING,),
        TOPIC_BAD,
        (MISSING,),
        INT32_BAD,
        (*INT32_BAD, str(QUEUE_COUNT), "100000", str(INT32_MAX)),  # -1: "broker, pick one"
        INT32_BAD,
        INT64_BAD,
        INT32_BAD,
        ("p" * 40_000,),  # over the 32767 bytes of a stored record's properties
        ("true",),  # a plain body read as a batch
    ]
    if code == RequestCode.SEND_BATCH_MESSAGE:
        bad[-2] = ()  # a batch's properties are its elements'; the header's are not stored
        bad[-1] = ()  # 320 is a batch whatever this says
    return dict(zip(keys, bad, strict=True))


def pull_ext() -> dict[str, str]:
    header = PullMessageRequestHeader(
        GROUP, TOPIC, 0, 0, 32, PULL_FLAG_SUBSCRIPTION, 0, 1000, 0, "*"
    )
    return header.to_ext()


def heartbeat_bodies() -> tuple[bytes, ...]:
    consumer = ConsumerData(
        GROUP + " bad",
        ConsumeType.CONSUME_PASSIVELY,
        MessageModel.CLUSTERING,
        ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
        (),
    )
    bad_group = HeartbeatData(CLIENT_ID, (), (consumer,))
    return (*JSON_BODY_BAD, bad_group.to_json(), b'{"clientID": 5}')


SPECS: Final[tuple[Spec, ...]] = (
    *(
        Spec(code, send_ext(code), send_fields(code), b"sweep body")
        for code in (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2)
    ),
    Spec(
        RequestCode.SEND_BATCH_MESSAGE,
        send_ext(RequestCode.SEND_BATCH_MESSAGE),
        send_fields(RequestCode.SEND_BATCH_MESSAGE),
        encode_batch([BatchElement(b"one", 0, b""), BatchElement(b"two", 0, b"")]),
        (b"", b"xx", b"\x00\x00\x00\x40" + b"\x00" * 8),
    ),
    Spec(
        RequestCode.PULL_MESSAGE,
        pull_ext(),
        {
            "consumerGroup": (MISSING,),
            "topic": TOPIC_BAD,
            "queueId": QUEUE_ID_BAD,
            "queueOffset": INT64_BAD,
            "maxMsgNums": INT32_BAD,
            "sysFlag": INT32_BAD,
            "commitOffset": INT64_BAD,
            "suspendTimeoutMillis": INT64_BAD,
            "subVersion": INT64_BAD,
            "expressionType": ("SQL92", "BOGUS"),
        },
    ),
    Spec(
        RequestCode.CONSUMER_SEND_MSG_BACK,
        {"group": GROUP, "offset": "123456789", "delayLevel": "0"},
        {"group": (MISSING,), "offset": (*INT64_BAD, "-1"), "delayLevel": INT32_BAD},
    ),
    Spec(
        RequestCode.QUERY_MESSAGE,
        {"topic": TOPIC, "key": "k", "maxNum": "32", "beginTimestamp": "0", "endTimestamp": "1"},
        {
            "topic": TOPIC_BAD,
            "key": (MISSING,),
            "maxNum": INT32_BAD,
            "beginTimestamp": INT64_BAD,
            "endTimestamp": INT64_BAD,
        },
    ),
    Spec(
        RequestCode.QUERY_CONSUMER_OFFSET,
        {"consumerGroup": GROUP, "topic": TOPIC, "queueId": "0"},
        {"consumerGroup": GROUP_BAD, "topic": TOPIC_BAD, "queueId": QUEUE_ID_BAD},
    ),
    Spec(
        RequestCode.UPDATE_CONSUMER_OFFSET,
        {"consumerGroup": GROUP, "topic": TOPIC, "queueId": "0", "commitOffset": "0"},
        {
            "consumerGroup": GROUP_BAD,
            "topic": TOPIC_BAD,
            "queueId": QUEUE_ID_BAD,
            "commitOffset": OFFSET_BAD,
        },
    ),
    Spec(
        RequestCode.UPDATE_AND_CREATE_TOPIC,
        UpdateAndCreateTopicRequestHeader(NEW_TOPIC, "TBW102", 2, 2, 6).to_ext(),
        {
            "topic": TOPIC_BAD,
            "defaultTopic": (MISSING,),
            "readQueueNums": (*INT32_BAD, "0", "-1", "1025"),
            "writeQueueNums": (*INT32_BAD, "0", "-1", "1025"),
            "perm": (*INT32_BAD, "-1", "16"),
            "topicFilterType": (MISSING, "BOGUS", "single_tag", "SINGLE_TAG\ud800"),
            "topicSysFlag": INT32_BAD[1:],  # optional: absent is fine
        },
    ),
    Spec(
        RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
        {"topic": TOPIC, "queueId": "0", "timestamp": "0"},
        {"topic": TOPIC_BAD, "queueId": QUEUE_ID_BAD, "timestamp": INT64_BAD},
    ),
    *(
        Spec(code, {"topic": TOPIC, "queueId": "0"}, {"topic": TOPIC_BAD, "queueId": QUEUE_ID_BAD})
        for code in (
            RequestCode.GET_MAX_OFFSET,
            RequestCode.GET_MIN_OFFSET,
            RequestCode.GET_EARLIEST_MSG_STORETIME,
        )
    ),
    Spec(
        RequestCode.VIEW_MESSAGE_BY_ID,
        {"offset": "0"},
        {"offset": (*INT64_BAD, "-1", "123456789", str(INT64_MAX))},
    ),
    Spec(RequestCode.HEART_BEAT, {}, {}, bodies=heartbeat_bodies()),
    Spec(
        RequestCode.UNREGISTER_CLIENT,
        {"clientID": CLIENT_ID, "producerGroup": "", "consumerGroup": GROUP},
        {"clientID": (MISSING,)},
    ),
    Spec(
        RequestCode.GET_CONSUMER_LIST_BY_GROUP,
        {"consumerGroup": GROUP},
        {"consumerGroup": GROUP_BAD},
    ),
    *(
        Spec(code, {}, {}, bodies=(*JSON_BODY_BAD, b'{"consumerGroup": 1, "mqSet": 2}'))
        for code in (RequestCode.LOCK_BATCH_MQ, RequestCode.UNLOCK_BATCH_MQ)
    ),
    Spec(
        RequestCode.CHECK_CLIENT_CONFIG,
        {},
        {},
        bodies=(
            *(body for body in JSON_BODY_BAD if body != b'{"a": 1}'),
            b'{"subscriptionData": 5}',
            b'{"subscriptionData": {"topic": 1}}',
            b'{"subscriptionData": {"topic": "T", "subString": "a > 1", '
            b'"expressionType": "SQL92"}}',
        ),
    ),
    Spec(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": NEW_TOPIC}, {"topic": TOPIC_BAD}),
    Spec(
        INVOKE_BROKER_TO_RESET_OFFSET,
        {"topic": TOPIC, "group": GROUP, "timestamp": "-1", "isForce": "true"},
        {"topic": TOPIC_BAD, "group": GROUP_BAD, "timestamp": INT64_BAD},
    ),
    Spec(
        RequestCode.GET_CONSUMER_RUNNING_INFO,
        {"consumerGroup": GROUP, "clientId": CLIENT_ID},
        {"consumerGroup": GROUP_BAD, "clientId": (MISSING,)},
    ),
    Spec(RequestCode.GET_TOPIC_STATS_INFO, {"topic": TOPIC}, {"topic": TOPIC_BAD}),
    Spec(RequestCode.GET_CONSUME_STATS, {"consumerGroup": GROUP}, {"consumerGroup": GROUP_BAD}),
    Spec(
        RequestCode.GET_CONSUMER_CONNECTION_LIST,
        {"consumerGroup": GROUP},
        {"consumerGroup": GROUP_BAD},
    ),
    Spec(
        RequestCode.GET_PRODUCER_CONNECTION_LIST,
        {"producerGroup": "SweepPG"},
        {"producerGroup": NAME_BAD},
    ),
    Spec(RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": TOPIC}, {"topic": (MISSING, "")}),
    Spec(RequestCode.GET_BROKER_CONSUME_STATS, {"isOrder": "false"}, {"isOrder": (MISSING, "")}),
    Spec(
        RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS,
        {"topic": TOPIC, "group": GROUP},
        {"topic": (MISSING, ""), "group": GROUP_BAD},
    ),
    Spec(
        RequestCode.CONSUME_MESSAGE_DIRECTLY,
        {
            "consumerGroup": GROUP,
            "clientId": CLIENT_ID,
            "msgId": "7F000001000027430000000000000000",
        },
        {
            "consumerGroup": GROUP_BAD,
            "clientId": (MISSING, ""),
            "msgId": (MISSING, "", "XYZ", "G" * 32, "7F00000100002743FFFFFFFFFFFFFFFF"),
        },
    ),
    Spec(
        RequestCode.UPDATE_BROKER_CONFIG,
        {},
        {},
        bodies=(b"listenPort=1\n", b"no separator\n", b"autoCreateTopicEnable=maybe\n", b"x=1"),
    ),
    Spec(
        MQBOX_RESET_CONSUMER_OFFSET,
        {"consumerGroup": GROUP, "topic": TOPIC, "to": "timestamp", "timestamp": "0"},
        {
            "consumerGroup": GROUP_BAD,
            "topic": TOPIC_BAD,
            "to": (MISSING, "", "yesterday", "EARLIEST"),
            "timestamp": INT64_BAD,
        },
    ),
)


def single_corruptions() -> list[tuple[Any, ...]]:
    """Every request with exactly one field (or the body) corrupted, and every unserved code."""
    requests: list[tuple[Any, ...]] = []
    for spec in SPECS:
        for key, values in spec.fields.items():
            requests.extend(spec.request({key: value}) for value in values)
        requests.extend(spec.request({}, body) for body in spec.bodies)
    requests.extend((code, {"topic": TOPIC}, b"") for code in NOT_SERVED)
    return requests


# -- the appliance and its checks ----------------------------------------------------------------


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    pids: list[int] = []
    with running_appliance(tmp_path_factory.mktemp("bad-input"), pids) as running:
        # A send-back (36) makes its group's retry topic before it looks the message up, as
        # Java's createTopicInSendMessageBackMethod does, so even a refused one leaves
        # %RETRY%<group> behind: it is made here first, and the topic table check stays strict.
        headers = (
            UpdateAndCreateTopicRequestHeader(TOPIC, "TBW102", QUEUE_COUNT, QUEUE_COUNT, 6),
            UpdateAndCreateTopicRequestHeader(f"%RETRY%{GROUP}", "TBW102", 1, 1, 6),
        )
        with RemotingClient(running.broker_address) as broker:
            for header in headers:
                created = broker.invoke(RequestCode.UPDATE_AND_CREATE_TOPIC, header.to_ext())
                assert created.code == ResponseCode.SUCCESS, created.remark
        yield running


@dataclasses.dataclass(frozen=True)
class BrokerState:
    pids: frozenset[int]
    appended_record_total: int
    write_log_offset_bytes: int
    topics: frozenset[str]


def broker_state(appliance: Appliance) -> BrokerState:
    supervisor = psutil.Process(appliance.process.pid)
    pids = frozenset(child.pid for child in supervisor.children(recursive=True))
    positions = StorePositions.attach(store_positions_name(appliance.instance))
    try:
        appended = positions.appended_record_total
        written = positions.write_log_offset_bytes
    finally:
        positions.close()
    with RemotingClient(appliance.broker_address) as broker:
        listed = broker.invoke(RequestCode.GET_ALL_TOPIC_CONFIG)
        assert listed.code == ResponseCode.SUCCESS
        members = broker.invoke(RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": GROUP})
    assert members.code == ResponseCode.CONSUMER_NOT_ONLINE, members.body[:200]
    topics = frozenset(json.loads(listed.body)["topicConfigTable"])
    return BrokerState(pids, appended, written, topics)


def assert_unharmed(appliance: Appliance, before: BrokerState) -> None:
    after = broker_state(appliance)
    assert after == before
    assert set(appliance.roles.values()) <= after.pids
    assert NEW_TOPIC not in after.topics
    assert appliance.process.poll() is None


def ask_all(appliance: Appliance, requests: Sequence[tuple[Any, ...]]) -> list[RemotingCommand]:
    """Send every (code, ext, body) pipelined on one connection; the responses in that order."""
    client = FrontClient("127.0.0.1", appliance.broker_port)
    try:
        opaques = []
        for code, ext, body in requests:
            opaque = client.connection.next_opaque()
            client.send(make_request(code, opaque, ext, body=body))
            opaques.append(opaque)
        by_opaque: dict[int, RemotingCommand] = {}
        deadline = time.monotonic() + WAIT_S
        while len(by_opaque) < len(opaques):
            assert time.monotonic() < deadline, f"{len(by_opaque)} of {len(opaques)} answered"
            (command,) = client.responses(1)
            assert command.flag & FLAG_RESPONSE, command
            by_opaque[command.opaque] = command
        return [by_opaque[opaque] for opaque in opaques]
    finally:
        client.close()


def assert_refused(
    requests: Sequence[tuple[Any, ...]], responses: Sequence[RemotingCommand]
) -> None:
    wrong = [
        (code, _short(ext), body[:40], response.code, response.remark)
        for (code, ext, body), response in zip(requests, responses, strict=True)
        if response.code in ANSWERED_OK or not response.remark
    ]
    assert not wrong, f"{len(wrong)} bad requests were not refused with a remark: {wrong[:10]}"


def _short(ext: Mapping[str, str]) -> dict[str, str]:
    return {key: value if len(value) <= 40 else value[:37] + "..." for key, value in ext.items()}


# -- tests ---------------------------------------------------------------------------------------


def test_every_single_bad_field_of_every_code_is_refused_and_harms_nothing(
    appliance: Appliance,
) -> None:
    before = broker_state(appliance)
    requests = single_corruptions()
    assert len({request[0] for request in requests}) >= len(SPECS)
    assert_refused(requests, ask_all(appliance, requests))
    assert_unharmed(appliance, before)


def test_pull_offsets_out_of_bounds_are_answered_with_the_offset_to_use(
    appliance: Appliance,
) -> None:
    spec = next(spec for spec in SPECS if spec.code == RequestCode.PULL_MESSAGE)
    requests = [spec.request({"queueOffset": value}) for value in ("-5", str(1 << 62))]
    for response in ask_all(appliance, requests):
        assert response.code == ResponseCode.PULL_OFFSET_MOVED
        assert response.ext_fields["nextBeginOffset"] == "0"
        assert not response.body


# -- hypothesis: several fields at once, values it makes up --------------------------------------


def _parses_as_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def _kind_of(values: tuple[Value, ...]) -> str:
    if values in (INT32_BAD, INT64_BAD, QUEUE_ID_BAD, OFFSET_BAD) or "abc" in values:
        return "int"
    if values in (TOPIC_BAD, GROUP_BAD):
        return "name"
    return "listed"


_TEXT: Final = st.text(st.characters(codec="utf-8"), max_size=200)
_NOT_INT: Final = _TEXT.filter(lambda text: not _parses_as_int(text))
_INT_OUT_OF_RANGE: Final = st.one_of(
    st.integers(min_value=INT64_MAX + 1), st.integers(max_value=-INT64_MAX - 2)
).map(str)
_BAD_NAME: Final = _TEXT.filter(
    lambda text: validate_topic(text) is not None and group_name_problem(text) is not None
)


@st.composite
def corrupted_request(draw: st.DrawFn) -> tuple[Any, ...]:
    spec = draw(st.sampled_from(SPECS))
    if not spec.fields or (spec.bodies and draw(st.booleans())):
        random_body = st.binary(max_size=300).filter(_not_object)
        if spec.code == RequestCode.UPDATE_BROKER_CONFIG:
            random_body = random_body.filter(_not_empty_properties)
        body = draw(st.sampled_from(spec.bodies) | random_body)
        return spec.request({}, body)
    keys = draw(st.lists(st.sampled_from(sorted(spec.fields)), min_size=1, unique=True))
    changes: dict[str, Value] = {}
    for key in keys:
        values = spec.fields[key]
        choices = [st.sampled_from(values)] if values else []
        kind = _kind_of(values)
        if kind == "int":
            choices += [_NOT_INT, _INT_OUT_OF_RANGE]
        elif kind == "name":
            choices.append(_BAD_NAME)
        if not choices:
            continue
        changes[key] = draw(st.one_of(choices))
    hypothesis.assume(changes)
    return spec.request(changes)


def _not_empty_properties(body: bytes) -> bool:
    """Random bytes that are not a properties text without keys (blank, comments): for
    UPDATE_BROKER_CONFIG that body changes nothing and is answered SUCCESS, as Java does."""
    try:
        return bool(parse_properties(body.decode("utf-8", errors="replace")))
    except ValueError:
        return True


def _not_object(body: bytes) -> bool:
    """Random bytes that a body parser could not take for a JSON object (CHECK_CLIENT_CONFIG
    accepts any object) nor for a batch."""
    try:
        return not isinstance(json.loads(body), dict)
    except ValueError:
        return True


@hypothesis.settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[
        hypothesis.HealthCheck.function_scoped_fixture,
        hypothesis.HealthCheck.too_slow,
        hypothesis.HealthCheck.filter_too_much,
    ],
)
@hypothesis.given(st.lists(corrupted_request(), min_size=1, max_size=40))
def test_requests_with_made_up_bad_fields_are_refused_and_harm_nothing(
    appliance: Appliance, requests: list[tuple[Any, ...]]
) -> None:
    before = broker_state(appliance)
    assert_refused(requests, ask_all(appliance, requests))
    assert_unharmed(appliance, before)

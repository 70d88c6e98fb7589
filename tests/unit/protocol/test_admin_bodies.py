"""The statistics codes' headers and fastjson bodies (protocol/admin_bodies.py).

Goal: `dumps_fastjson` writes maps keyed by MessageQueue as Java's fastjson does (the queue
object as the key, fields in alphabetical order), `loads_fastjson` reads that text back (and any
JSON) to the same value, refuses text that is neither, and stays bounded on deep nesting; the
headers name a missing field. Method: a hand-written golden text in fastjson's form, hypothesis
round trips over nested values with queue-keyed maps, and broken inputs.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqbox.protocol import admin_bodies
from mqbox.protocol.admin_bodies import (
    FASTJSON_DEPTH_MAX,
    ConsumeMessageDirectlyResultRequestHeader,
    GetConsumerStatusRequestHeader,
    GetConsumeStatsInBrokerHeader,
    GetConsumeStatsRequestHeader,
    dumps_fastjson,
    loads_fastjson,
)
from mqbox.protocol.errors import RemoteProtocolError
from mqbox.protocol.headers import MessageQueue

QUEUE = MessageQueue("T", "broker-a", 1)


def test_a_queue_keyed_map_is_written_as_fastjson_writes_it() -> None:
    offsets = {QUEUE: admin_bodies.topic_offset(0, 5, 1700)}
    text = dumps_fastjson(admin_bodies.topic_stats_table(offsets))
    assert text == (
        b'{"offsetTable":{{"brokerName":"broker-a","queueId":1,"topic":"T"}:'
        b'{"lastUpdateTimestamp":1700,"maxOffset":5,"minOffset":0}}}'
    )
    assert loads_fastjson(text) == {
        "offsetTable": {QUEUE: {"lastUpdateTimestamp": 1700, "maxOffset": 5, "minOffset": 0}}
    }


def test_a_double_keeps_its_fraction_and_strings_are_escaped() -> None:
    text = dumps_fastjson(admin_bodies.consume_stats({}, 0))
    assert text == b'{"consumeTps":0.0,"offsetTable":{}}'
    quoted = dumps_fastjson({"k": 'a"b\\c\u00e9'})
    assert json.loads(quoted) == {"k": 'a"b\\c\u00e9'}


scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8)
queues = st.builds(
    MessageQueue, st.text(max_size=5), st.text(max_size=5), st.integers(0, 2**31 - 1)
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=5), inner, max_size=3)
        | st.dictionaries(queues, inner, max_size=3)
    ),
    max_leaves=12,
)


@given(values)
def test_what_is_written_reads_back_the_same(value: Any) -> None:
    assert loads_fastjson(dumps_fastjson(value)) == value


@given(values.filter(lambda v: not _has_queue_keys(v)))
def test_plain_json_reads_as_json_does(value: Any) -> None:
    text = json.dumps(value, indent=1).encode()
    assert loads_fastjson(text) == json.loads(text)


def _has_queue_keys(value: Any) -> bool:
    if isinstance(value, dict):
        return any(isinstance(k, MessageQueue) or _has_queue_keys(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_queue_keys(item) for item in value)
    return False


@pytest.mark.parametrize(
    "text",
    [
        b"",
        b"{",
        b'{"a":1,}',
        b'{"a" 1}',
        b"[1 2]",
        b"{1:2}",
        b'{{"topic":"T"}:1}',  # a queue key without brokerName and queueId
        b"nul",
        b'{"a":1} x',
        b"[" * (FASTJSON_DEPTH_MAX + 2) + b"]" * (FASTJSON_DEPTH_MAX + 2),
    ],
)
def test_text_that_is_not_fastjson_is_refused(text: bytes) -> None:
    with pytest.raises(RemoteProtocolError):
        loads_fastjson(text)


def test_headers_name_a_missing_field_and_round_trip() -> None:
    with pytest.raises(RemoteProtocolError, match="'consumerGroup'"):
        GetConsumeStatsRequestHeader.from_ext({"topic": "T"})
    assert GetConsumeStatsRequestHeader.from_ext({"consumerGroup": "G", "topic": " "}).topic is None
    with pytest.raises(RemoteProtocolError, match="'isOrder'"):
        GetConsumeStatsInBrokerHeader.from_ext({})
    assert GetConsumeStatsInBrokerHeader.from_ext({"isOrder": "true"}).is_order
    status = GetConsumerStatusRequestHeader("T", "G", "c1")
    assert GetConsumerStatusRequestHeader.from_ext(status.to_ext()) == status
    direct = ConsumeMessageDirectlyResultRequestHeader("G", "c1", "AB" * 16, "broker-a")
    assert ConsumeMessageDirectlyResultRequestHeader.from_ext(direct.to_ext()) == direct
    with pytest.raises(RemoteProtocolError, match="'msgId'"):
        ConsumeMessageDirectlyResultRequestHeader.from_ext({"consumerGroup": "G", "clientId": "c"})

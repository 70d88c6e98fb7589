"""The broker filters pulls by tag: a PULL with subscription "TagA" carries only TagA records.

Goal: on the real appliance, a raw PULL_MESSAGE whose subscription is "TagA" (or "TagA || TagB")
returns in its body only records whose TAGS is one of the subscribed tags: no other tag, no
untagged record, no tag that differs only in case; every matching record comes back once and in
queue order while the reader follows nextBeginOffset to the end of the queue; and "*" returns
everything (so the filter is not an empty queue in disguise). The C++ client filters again on its
side, so a broker that did not filter would pass every interop test while sending consumers
everything; only a raw read shows it (docs/protocol.md section 12, rule 11).
Method: the real appliance (tests/interop/cpp_client.running_appliance: supervisor with every
broker role and the name server, port 0, a home of its own) shared by the module; a one-queue
topic created over the wire; SEND_MESSAGE (10) with TAGS in the properties, as the C++ client
sends them; once the dispatcher caught up (read_back.wait_dispatched), PULL from index 0 with a
few messages per pull (so that windows without a match occur), following nextBeginOffset; every
body decoded with mqbox.message.decode_record.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from mqbox.client.remoting import RemotingClient
from mqbox.message import StoredMessage, decode_properties_str, encode_properties_str
from mqbox.protocol.codes import PULL_FLAG_SUBSCRIPTION, RequestCode, ResponseCode
from mqbox.protocol.headers import PullMessageRequestHeader, SendMessageRequestHeader
from tests.conftest import unique_name
from tests.interop.cpp_client import (
    create_topic,
    decode_records,
)
from tests.support.appliance import Appliance, module_appliance
from tests.support.read_back import wait_dispatched

pytestmark = pytest.mark.integration

TAG_CYCLE = ("TagA", "TagB", "", "TagC", "taga", "TagC", "TagB")
MESSAGE_COUNT = 70
PULL_MESSAGE_COUNT_MAX = 4
PULL_TIMEOUT_S = 20.0


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    with module_appliance(tmp_path_factory.mktemp("tag-filter")) as running:
        yield running


@pytest.fixture(scope="module")
def topic(appliance: Appliance) -> str:
    """A one-queue topic holding MESSAGE_COUNT messages tagged in TAG_CYCLE order."""
    name = unique_name("TagFilter")
    create_topic(appliance, name, 1)
    with RemotingClient(appliance.broker_address, 5000) as broker:
        for number in range(MESSAGE_COUNT):
            tag = TAG_CYCLE[number % len(TAG_CYCLE)]
            properties = {"WAIT": "true", "seq": str(number)}
            if tag:
                properties["TAGS"] = tag
            header = SendMessageRequestHeader(
                producer_group="PG-tag-filter",
                topic=name,
                default_topic="TBW102",
                default_topic_queue_nums=4,
                queue_id=0,
                sys_flag=0,
                born_timestamp_ms=int(time.time() * 1000),
                flag=0,
                properties=encode_properties_str(properties).decode("utf-8"),
            )
            response = broker.invoke(
                RequestCode.SEND_MESSAGE, header.to_ext(), f"message {number}".encode()
            )
            assert response.code == ResponseCode.SUCCESS, (response.code, response.remark)
        # Each pull below must find the queue's end at MESSAGE_COUNT: the last answers may come
        # a moment before the dispatcher made their records pullable.
        wait_dispatched(broker)
    return name


def tags_of(record: StoredMessage) -> str:
    return decode_properties_str(record.properties).get("TAGS", "")


def seq_of(record: StoredMessage) -> int:
    return int(decode_properties_str(record.properties)["seq"])


def pull_filtered(appliance: Appliance, topic: str, subscription: str) -> list[StoredMessage]:
    """Follow nextBeginOffset from index 0 to the end of queue 0 with `subscription`; every
    record of every body. Asserts the codes a C++ consumer can read (0, 19, 20) and progress."""
    found: list[StoredMessage] = []
    queue_index = 0
    deadline = time.monotonic() + PULL_TIMEOUT_S
    with RemotingClient(appliance.broker_address, 5000) as broker:
        while True:
            assert time.monotonic() < deadline, f"the queue did not end after {queue_index}"
            header = PullMessageRequestHeader(
                "CG-tag-filter",
                topic,
                0,
                queue_index,
                PULL_MESSAGE_COUNT_MAX,
                PULL_FLAG_SUBSCRIPTION,
                0,
                0,
                0,
                subscription,
            )
            response = broker.invoke(RequestCode.PULL_MESSAGE, header.to_ext())
            if response.code == ResponseCode.PULL_NOT_FOUND:
                # Nothing (more) to match: the answer must point at the end of the queue.
                end = int(response.ext_fields.get("nextBeginOffset", "-1"))
                assert end == MESSAGE_COUNT, (queue_index, response.ext_fields)
                return found
            assert response.code in (ResponseCode.SUCCESS, ResponseCode.PULL_RETRY_IMMEDIATELY), (
                response.code,
                response.remark,
            )
            next_index = int(response.ext_fields["nextBeginOffset"])
            assert queue_index < next_index <= MESSAGE_COUNT, (queue_index, response.ext_fields)
            if response.code == ResponseCode.SUCCESS:
                records = decode_records(response.body)
                assert records, "a SUCCESS pull with an empty body"
                assert all(queue_index <= r.queue_index < next_index for r in records)
                found.extend(records)
            queue_index = next_index


def expected_seqs(tags: set[str]) -> list[int]:
    return [n for n in range(MESSAGE_COUNT) if TAG_CYCLE[n % len(TAG_CYCLE)] in tags]


def test_a_pull_for_one_tag_carries_only_that_tags_records(
    appliance: Appliance, topic: str
) -> None:
    records = pull_filtered(appliance, topic, "TagA")
    assert {tags_of(r) for r in records} == {"TagA"}, [tags_of(r) for r in records]
    assert [seq_of(r) for r in records] == expected_seqs({"TagA"})
    assert [r.queue_index for r in records] == expected_seqs({"TagA"})


def test_a_pull_for_two_tags_carries_only_their_records(appliance: Appliance, topic: str) -> None:
    records = pull_filtered(appliance, topic, "TagA || TagB")
    assert {tags_of(r) for r in records} == {"TagA", "TagB"}, [tags_of(r) for r in records]
    assert [seq_of(r) for r in records] == expected_seqs({"TagA", "TagB"})


def test_a_pull_for_every_tag_carries_every_record(appliance: Appliance, topic: str) -> None:
    records = pull_filtered(appliance, topic, "*")
    assert [seq_of(r) for r in records] == list(range(MESSAGE_COUNT))
    assert {tags_of(r) for r in records} == set(TAG_CYCLE)


def test_the_filter_compares_tags_exactly(appliance: Appliance, topic: str) -> None:
    records = pull_filtered(appliance, topic, "taga")
    assert {tags_of(r) for r in records} == {"taga"}
    assert [seq_of(r) for r in records] == expected_seqs({"taga"})

"""The pull API's request and answer, and the lazy message views consumers receive.

Goal: pull_request_ext sets exactly the sysflag bits its arguments ask for (COMMIT_OFFSET,
SUSPEND, SUBSCRIPTION, LITE_PULL) with the header fields Java sends; read_pull_response maps
codes 0/19/20/21 to the four statuses with the four offsets, applies the client's exact tag
check after the broker's hash filter, says where to pull again after a damaged record, and
raises BrokerError (the broker's code and remark) for anything else; MessageBatch makes no
object per message until one is asked for, cuts into chunks, and gives columns; a retry
topic's message shows its RETRY_TOPIC.

Method: answers built as the broker builds them (RemotingCommand with the response header's
to_ext() and stored records from message.encode_record); no sockets.
"""

from __future__ import annotations

import numpy as np
import pytest

from mqbox import message as m
from mqbox.client.errors import BrokerError
from mqbox.client.messages import MessageBatch, ReceivedMessage
from mqbox.client.pull import PullStatus, pull_request_ext, read_pull_response
from mqbox.client.subscription import build_subscription
from mqbox.protocol.codes import (
    PULL_FLAG_COMMIT_OFFSET,
    PULL_FLAG_LITE_PULL,
    PULL_FLAG_SUBSCRIPTION,
    PULL_FLAG_SUSPEND,
)
from mqbox.protocol.command import RemotingCommand
from mqbox.protocol.headers import MessageQueue, PullMessageRequestHeader, PullMessageResponseHeader

STORE_HOST = m.pack_host("127.0.0.1", 10911)
BORN_HOST = m.pack_host("10.1.2.3", 50123)


def record(
    queue_index: int,
    tags: str | None = "A",
    *,
    topic: str = "Orders",
    properties: dict[str, str] | None = None,
    body: bytes | None = None,
) -> bytes:
    fields = dict(properties or {})
    if tags is not None:
        fields["TAGS"] = tags
    return bytes(
        m.encode_record(
            m.MessageToStore(
                topic,
                2,
                body if body is not None else f"body {queue_index}".encode(),
                m.encode_properties_str(fields),
                flag=0,
                sysflag=0,
                born_timestamp_ms=1_700_000_000_000,
                born_host=BORN_HOST,
                reconsume_times=1,
            ),
            queue_index=queue_index,
            log_offset_bytes=1000 + queue_index,
            store_timestamp_ms=1_700_000_000_500,
            store_host=STORE_HOST,
        )
    )


def answer(code: int, body: bytes = b"", next_offset: int = 5) -> RemotingCommand:
    header = PullMessageResponseHeader(next_offset, 0, 9, 1)
    return RemotingCommand(code, flag=1, ext_fields=header.to_ext(), body=body, remark="why")


def test_the_sysflag_says_what_the_arguments_ask_for() -> None:
    subscription = build_subscription("Orders", "A || B", 77)
    ext = pull_request_ext(
        "CG",
        "Orders",
        3,
        40,
        32,
        subscription=subscription,
        suspend_timeout_ms=15_000,
        commit_offset=39,
        lite=False,
    )
    header = PullMessageRequestHeader.from_ext(ext)
    assert header.sys_flag == PULL_FLAG_COMMIT_OFFSET | PULL_FLAG_SUSPEND | PULL_FLAG_SUBSCRIPTION
    assert (header.consumer_group, header.topic, header.queue_id) == ("CG", "Orders", 3)
    assert (header.queue_index, header.message_count_max) == (40, 32)
    assert (header.commit_queue_index, header.suspend_timeout_ms) == (39, 15_000)
    assert (header.subscription, header.sub_version) == ("A || B", 77)
    plain = PullMessageRequestHeader.from_ext(
        pull_request_ext(
            "CG", "T", 0, 0, 1, subscription=None, suspend_timeout_ms=0, commit_offset=None
        )
    )
    assert plain.sys_flag == 0
    assert plain.subscription is None
    lite = PullMessageRequestHeader.from_ext(
        pull_request_ext(
            "CG",
            "T",
            0,
            0,
            10,
            subscription=subscription,
            suspend_timeout_ms=20_000,
            commit_offset=None,
            lite=True,
        )
    )
    assert lite.sys_flag == PULL_FLAG_SUSPEND | PULL_FLAG_SUBSCRIPTION | PULL_FLAG_LITE_PULL == 0x16


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (19, PullStatus.NO_NEW_MSG),
        (20, PullStatus.NO_MATCHED_MSG),
        (21, PullStatus.OFFSET_ILLEGAL),
    ],
)
def test_empty_answers_carry_their_offsets(code: int, status: PullStatus) -> None:
    result = read_pull_response(answer(code), "broker-a", "127.0.0.1:1", None)
    assert result.status is status
    assert (result.next_begin_offset, result.min_offset, result.max_offset) == (5, 0, 9)
    assert result.suggest_which_broker_id == 1
    assert len(result.batch) == len(result.messages) == 0


def test_found_keeps_only_exact_tags_after_the_hash_filter() -> None:
    body = record(0, "A") + record(1, "B") + record(2, None) + record(3, "A")
    subscription = build_subscription("Orders", "A", 0)
    result = read_pull_response(answer(0, body, 4), "broker-a", "127.0.0.1:1", subscription)
    assert result.status is PullStatus.FOUND
    assert len(result.batch) == 4
    assert [message.queue_offset for message in result.messages] == [0, 3]
    everything = read_pull_response(answer(0, body, 4), "broker-a", "127.0.0.1:1", None)
    assert len(everything.messages) == 4
    assert everything.damaged_next_offset is None


def test_a_damaged_body_says_where_to_pull_again() -> None:
    body = record(7) + record(8)
    result = read_pull_response(answer(0, body[:-3], 9), "broker-a", "127.0.0.1:1", None)
    assert not result.batch.complete
    assert [message.queue_offset for message in result.messages] == [7]
    assert result.damaged_next_offset == 8
    nothing = read_pull_response(answer(0, body[:10], 9), "broker-a", "127.0.0.1:1", None)
    assert nothing.damaged_next_offset is None


def test_any_other_code_raises_the_brokers_code_and_remark() -> None:
    with pytest.raises(BrokerError) as raised:
        read_pull_response(answer(17), "broker-a", "127.0.0.1:1", None)
    assert (raised.value.code, raised.value.remark, raised.value.broker_name) == (
        17,
        "why",
        "broker-a",
    )


def test_received_messages_are_lazy_views_with_the_consumers_names() -> None:
    body = record(4) + record(5, properties={"KEYS": "k1 k2", "x": "y"}) + record(6)
    result = read_pull_response(answer(0, body, 7), "broker-a", "127.0.0.1:1", None)
    batch = result.messages
    assert isinstance(batch, MessageBatch)
    assert len(batch) == 3
    message = batch[1]
    assert isinstance(message, ReceivedMessage)
    assert message.queue == MessageQueue("Orders", "broker-a", 2)
    assert (message.queue_offset, message.commit_log_offset) == (5, 1005)
    assert (message.keys, message.properties["x"], message.body) == (["k1", "k2"], "y", b"body 5")
    assert message.born_host == ("10.1.2.3", 50123)
    assert message.store_host == ("127.0.0.1", 10911)
    assert (message.born_timestamp_ms, message.store_timestamp_ms) == (
        1_700_000_000_000,
        1_700_000_000_500,
    )
    assert message.reconsume_times == 1
    assert message.msg_id == message.offset_msg_id  # no UNIQ_KEY in these records
    assert message.position == 1
    np.testing.assert_array_equal(batch.queue_offsets(), [4, 5, 6])
    assert batch.body_size_bytes() == sum(len(f"body {index}") for index in (4, 5, 6))
    assert (batch.first_offset, batch.last_offset) == (4, 6)
    chunks = batch.chunks(2)
    assert [[m.queue_offset for m in chunk] for chunk in chunks] == [[4, 5], [6]]
    filtered = MessageBatch(result.batch, [0, 2])
    np.testing.assert_array_equal(filtered.queue_offsets(), [4, 6])
    assert filtered.body_size_bytes() == 12
    assert [m.queue_offset for m in filtered[1:]] == [6]


def test_a_retry_message_shows_the_topic_it_was_sent_to() -> None:
    body = record(0, topic="%RETRY%CG", properties={"RETRY_TOPIC": "Orders"})
    result = read_pull_response(answer(0, body, 1), "broker-a", "127.0.0.1:1", None)
    message = result.messages[0]
    assert message.topic == "Orders"
    assert message.pulled_topic == "%RETRY%CG"
    assert message.queue.topic == "%RETRY%CG"
